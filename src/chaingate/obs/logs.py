"""JSON logs: one object per line, on stderr (or a file).

Two writers share the format:

* application events go through the standard ``logging`` module with ``JsonFormatter``
  (structured fields are passed as ``extra={"fields": {...}}``);
* the access log, one line per request, bypasses ``logging`` — at tens of thousands of
  requests a second its per-record cost matters — and is buffered by ``AccessLog``, flushed a
  few times a second and at shutdown.

Neither ever receives headers, query strings or bodies: API keys travel in those, and nothing
that could hold a secret is passed to a log call in the first place.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import msgspec
import trio

_encoder = msgspec.json.Encoder()


def _timestamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return _encoder.encode(entry).decode()


def setup_logging(level: str = "info", stream: IO[str] | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("chaingate")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class AccessEntry(msgspec.Struct, omit_defaults=True):
    """One access-log line.  ``ts`` is epoch seconds until flushed, then an ISO string."""

    ts: float | str
    level: str
    msg: str
    request_id: str
    peer: str
    method: str
    path: str
    status: int
    ms: float
    bytes: int
    rpc: str = ""
    cache: str = ""


class AccessLog:
    """Buffered JSON lines, one per request; ``run()`` flushes them in the background.

    A request only appends a small Struct; timestamps are formatted and lines encoded in one
    ``encode_lines`` call per flush, which is what keeps logging every request affordable.
    """

    def __init__(self, stream: IO[bytes] | None = None, enabled: bool = True) -> None:
        self.enabled = enabled
        self._stream = stream
        self._entries: list[AccessEntry] = []
        self._second = -1
        self._second_text = ""

    def write(self, entry: AccessEntry) -> None:
        if self.enabled:
            self._entries.append(entry)
            if len(self._entries) >= 8192:
                self.flush()

    def _iso(self, epoch: float) -> str:
        second = int(epoch)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((epoch - second) * 1000):03d}Z"

    def flush(self) -> None:
        entries, self._entries = self._entries, []
        if not entries:
            return
        for entry in entries:
            if isinstance(entry.ts, float):
                entry.ts = self._iso(entry.ts)
        data = _encoder.encode_lines(entries)
        stream = self._stream or sys.stderr.buffer
        try:
            stream.write(data)
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken log stream must not take requests down

    async def run(self, interval: float = 0.25) -> None:
        try:
            while True:
                await trio.sleep(interval)
                self.flush()
        finally:
            self.flush()
