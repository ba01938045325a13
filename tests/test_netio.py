"""netio's clock: trio's own clock read as ``offset + perf_counter()`` (no Python frame), and
any other clock left to ``trio.current_time()``."""

from __future__ import annotations

from time import perf_counter

import trio
import trio.testing

from chaingate import netio


def test_the_system_clock_is_read_as_an_offset_from_perf_counter() -> None:
    async def main() -> None:
        offset = netio.clock_offset()
        assert offset is not None
        before = trio.current_time()
        read = offset + perf_counter()
        after = trio.current_time()
        assert before <= read <= after

    trio.run(main)


def test_any_other_clock_is_asked() -> None:
    async def main() -> None:
        assert netio.clock_offset() is None

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
