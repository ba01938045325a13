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


class AccessLog:
    """Buffered JSON lines, one per request; ``run()`` flushes them in the background."""

    def __init__(self, stream: IO[bytes] | None = None, enabled: bool = True) -> None:
        self.enabled = enabled
        self._stream = stream
        self._lines: list[bytes] = []

    def write(self, entry: dict[str, Any]) -> None:
        if self.enabled:
            entry["ts"] = _timestamp(time.time())
            self._lines.append(_encoder.encode(entry))
            if len(self._lines) >= 4096:
                self.flush()

    def flush(self) -> None:
        if not self._lines:
            return
        data = b"\n".join(self._lines) + b"\n"
        self._lines.clear()
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
