"""JSON logs: one object per line, on stderr (or a file).

Two writers share the format:

* application events go through the standard ``logging`` module with ``JsonFormatter``
  (structured fields are passed as ``extra={"fields": {...}}``);
* the access log, one line per request, bypasses ``logging`` — at tens of thousands of
  requests a second its per-record cost matters — and is buffered by ``AccessLog``, flushed a
  few times a second and at shutdown.

Both end in a ``LogSink`` (``chaingate.obs.sink``): bytes are written by a thread of their
own, so a log stream that stops taking them never stops the event loop; when its bounded
buffer is full, lines are dropped and counted (``chaingate_log_dropped_lines_total``).

Neither ever receives headers, query strings or bodies: API keys travel in those, and nothing
that could hold a secret is passed to a log call in the first place.
"""

from __future__ import annotations

import logging
import time
from typing import IO, Any

import msgspec
import trio

from chaingate.obs.sink import LogSink, stderr_sink

_encoder = msgspec.json.Encoder()
# ".000Z" ... ".999Z": the millisecond tails of access-log timestamps, formatted once.
_MILLIS = [f".{ms:03d}Z" for ms in range(1000)]


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


class SinkHandler(logging.Handler):
    """Formats on the caller's thread, writes through a LogSink (never blocks on the stream)."""

    def __init__(self, sink: LogSink) -> None:
        super().__init__()
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record).encode("utf-8", "replace") + b"\n"
        except Exception:
            self.handleError(record)
            return
        self.sink.write(line)


def setup_logging(level: str = "info", stream: IO[str] | None = None) -> None:
    """JSON lines on ``stream`` (a text stream, written directly: tests and tools), else on
    stderr through the process's log sink."""
    handler: logging.Handler
    handler = logging.StreamHandler(stream) if stream is not None else SinkHandler(stderr_sink())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("chaingate")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class AccessEntry(msgspec.Struct, omit_defaults=True):
    """One access-log line."""

    ts: str
    level: str
    msg: str
    request_id: str
    peer: str
    method: str
    path: str
    status: int
    duration_us: int
    bytes: int
    rpc: str = ""
    cache: str = ""


class AccessLog:
    """JSON lines, one per request, encoded as they come and written in small slices.

    Each line is encoded straight into a shared buffer, which is written out once it holds
    ``FLUSH_BYTES`` or every ``interval`` seconds.  Spreading the work this way matters: a
    flush of thousands of buffered entries at once stalls the event loop for milliseconds,
    which every request in flight pays in latency.  The compiled fast lane's ``Ledger`` writes
    its lines into the same ``buffer`` (never replaced, only cleared) and flushes it likewise.
    """

    FLUSH_BYTES = 16 * 1024

    def __init__(
        self, stream: IO[bytes] | None = None, enabled: bool = True, sink: LogSink | None = None
    ) -> None:
        self.enabled = enabled
        # Lines go to ``sink``, else a sink of their own on ``stream``, else stderr's.
        if sink is None:
            sink = LogSink(stream) if stream is not None else stderr_sink()
        self.sink = sink
        self.buffer = bytearray()
        self._second = -1
        self._second_text = ""

    def timestamp(self, epoch: float) -> str:
        """ISO 8601 with milliseconds; the seconds part is formatted once per second."""
        second = int(epoch)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._second_text + _MILLIS[int((epoch - second) * 1000)]

    def write(self, entry: AccessEntry) -> None:
        if self.enabled:
            buffer = self.buffer
            _encoder.encode_into(entry, buffer, -1)
            buffer.extend(b"\n")
            if len(buffer) >= self.FLUSH_BYTES:
                self.flush()

    def write_request(
        self,
        request_id: str,
        peer: str,
        method: str,
        path: str,
        status: int,
        duration_us: int,
        size: int,
        rpc: str = "",
        cache: str = "",
    ) -> None:
        """The line of one answered request."""
        self.write(
            AccessEntry(
                self.timestamp(time.time()),
                "info",
                "request",
                request_id,
                peer,
                method,
                path,
                status,
                duration_us,
                size,
                rpc,
                cache,
            )
        )

    def flush(self) -> None:
        """Hand the buffered lines to the sink (which writes them off the event loop)."""
        if not self.buffer:
            return
        data = bytes(self.buffer)
        self.buffer.clear()
        # One line each, newline-terminated (JSON escapes any newline inside a line): the
        # sink counts them only if it must drop them.
        self.sink.write(data, None)

    def sync(self, timeout: float = 5.0) -> bool:
        """Flush and wait until the lines reached the stream (tests read it back)."""
        self.flush()
        return self.sink.wait_written(timeout)

    async def run(self, interval: float = 0.1) -> None:
        try:
            while True:
                await trio.sleep(interval)
                self.flush()
        finally:
            self.flush()
