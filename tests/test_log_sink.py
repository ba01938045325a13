"""The log sink (``chaingate.obs.sink``): a writer thread that gathers, never blocks the caller."""

from __future__ import annotations

import io
import time

from chaingate.obs.logs import AccessEntry, AccessLog
from chaingate.obs.sink import GATHER_SECONDS, LogSink


class CountingStream(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.writes += 1
        return super().write(data)


def test_many_small_writes_reach_the_stream_in_few_gathered_writes() -> None:
    stream = CountingStream()
    sink = LogSink(stream)
    started = time.monotonic()
    for i in range(2000):  # an access log flushing hundreds of times a second
        assert sink.write(b"line %d\n" % i)
        if i % 100 == 0:
            time.sleep(0.005)
    assert sink.wait_written(5.0)
    elapsed = time.monotonic() - started
    assert stream.getvalue() == b"".join(b"line %d\n" % i for i in range(2000))
    # One write per gathering period at most (plus the first and the one wait_written hurried).
    assert stream.writes <= elapsed / GATHER_SECONDS + 3, (stream.writes, elapsed)
    sink.close()


def test_wait_written_and_close_do_not_wait_for_the_gathering_period() -> None:
    stream = CountingStream()
    sink = LogSink(stream)
    sink.write(b"first\n")
    assert sink.wait_written(5.0)
    sink.write(b"second\n")  # the thread is now gathering
    started = time.monotonic()
    assert sink.wait_written(5.0)
    assert time.monotonic() - started < GATHER_SECONDS
    sink.close()
    assert stream.getvalue() == b"first\nsecond\n"
    assert not sink.write(b"after close\n") and sink.dropped_lines == 1


def test_access_lines_the_sink_drops_are_counted_one_per_line() -> None:
    """The access log hands its buffer over without counting its lines (the compiled lane
    writes into it directly); the sink counts them only when it must drop them."""
    sink = LogSink(io.BytesIO(), max_bytes=10)
    log = AccessLog(sink=sink)
    for i in range(3):
        log.write(AccessEntry("t", "info", "request", f"r{i}", "p", "GET", "/", 200, 1, 2))
    log.buffer += b'{"msg":"request","note":"a\\nb"}\n'  # as the lane writes: escapes only
    log.flush()
    assert sink.dropped_lines == 4 and sink.dropped_bytes > 10
    sink.close()
