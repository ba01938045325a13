"""Where log bytes go: a bounded buffer that a thread of its own writes out.

The event loop only ever appends to the buffer.  A stream that stops taking bytes (stderr a
pipe nobody reads, a full disk, a terminal scrolled back and paused) stalls the writer thread,
never the loop: while it is stalled the buffer fills up to ``max_bytes``, and then new lines
are dropped and counted — logs are lost before requests are.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections import deque
from typing import IO

DEFAULT_MAX_BYTES = 4 << 20
# After each write the thread lets lines gather this long before waking for more: a wake-up
# per access-log flush (hundreds a second under load) costs the event loop GIL hand-offs on
# every socket call it makes, measured at several µs per request.
GATHER_SECONDS = 0.05
# At exit, what is still buffered gets this long to reach its stream.
EXIT_FLUSH_SECONDS = 2.0


class LogSink:
    """A bounded, thread-written byte stream; ``write`` never blocks the caller."""

    def __init__(self, stream: IO[bytes] | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._stream = stream  # None: this process's stderr, looked up when writing
        self.max_bytes = max_bytes
        self._chunks: deque[bytes] = deque()
        self._held = 0  # bytes queued or being written
        self._queued = 0  # chunks accepted so far
        self._written = 0  # chunks handed to the stream so far
        self._closed = False
        self._waiting = False  # the writer thread is asleep for lack of data
        self._hurry = False  # someone waits for the bytes to be written: skip the gathering
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self.write_errors = 0

    @property
    def held(self) -> int:
        return self._held

    def write(self, data: bytes, lines: int | None = 1) -> bool:
        """Queue ``data`` (``lines`` log lines; None: one per newline, counted only if they
        are dropped); False when it was dropped for lack of room."""
        if not data:
            return True
        with self._cond:
            if self._closed or self._held + len(data) > self.max_bytes:
                self.dropped_lines += data.count(b"\n") if lines is None else lines
                self.dropped_bytes += len(data)
                return False
            self._chunks.append(data)
            self._held += len(data)
            self._queued += 1
            if self._waiting:
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="chaingate-log-writer", daemon=True
                )
                self._thread.start()
        return True

    def wait_written(self, timeout: float = 5.0) -> bool:
        """Block until everything queued before this call reached the stream (tests, exit)."""
        with self._cond:
            target = self._queued
            self._hurry = True
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: self._written >= target, timeout)
            finally:
                self._hurry = False

    def close(self, timeout: float = EXIT_FLUSH_SECONDS) -> None:
        """Write what is queued (for at most ``timeout``), then accept nothing more."""
        self.wait_written(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks and not self._closed:
                    self._waiting = True
                    self._cond.wait()
                    self._waiting = False
                if not self._chunks:
                    return
                count = len(self._chunks)
                data = b"".join(self._chunks)
                self._chunks.clear()
            try:
                stream = self._stream or sys.stderr.buffer
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):
                # A closed or broken stream: the lines are gone, the process carries on.
                self.write_errors += 1
            with self._cond:
                self._held -= len(data)
                self._written += count
                self._cond.notify_all()
                if not (self._closed or self._hurry):
                    self._cond.wait(GATHER_SECONDS)  # woken early only by close or a waiter


_stderr: LogSink | None = None


def stderr_sink() -> LogSink:
    """The process's one sink for stderr, shared by the application log and the access log."""
    global _stderr
    if _stderr is None:
        _stderr = LogSink()
        atexit.register(_stderr.close)
    return _stderr
