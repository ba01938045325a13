"""CPU of one process split between its main thread and the rest, and waiting until it is idle.

chaingate's event loop runs on the process's main thread: every request needs it, so its CPU
per request bounds the request rate.  Worker threads (the SQLite store's queries, the log
writer) run beside it.  ``split_cpu`` reads both from /proc: the main thread from
``/proc/<pid>/task/<pid>/stat``, the rest as the process's total (which keeps the time of
threads that have exited) minus the main thread.

A closed connection does not stop a request chaingate is already computing, so after a load
at many connections the process may stay busy for seconds with answers nobody reads;
``settle`` waits for that to end, so that it is charged to no other measurement, and says how
long it took.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


def _ticks(stat_path: Path) -> int:
    fields = stat_path.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@dataclass(frozen=True)
class CpuSplit:
    main: float  # seconds on the main thread
    others: float  # seconds on every other thread, living or exited

    def __sub__(self, before: CpuSplit) -> CpuSplit:
        # The two counters are read one after the other, in clock ticks (10 ms): the others'
        # share can come out a tick below zero, which is no CPU at all.
        return CpuSplit(self.main - before.main, max(0.0, self.others - before.others))


def split_cpu(pid: int) -> CpuSplit:
    """CPU seconds used so far by ``pid``'s main thread and by its other threads."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        main = _ticks(Path(f"/proc/{pid}/task/{pid}/stat"))  # first: total then covers it
        total = _ticks(Path(f"/proc/{pid}/stat"))
    except (OSError, IndexError, ValueError):
        return CpuSplit(0.0, 0.0)
    return CpuSplit(main / hz, max(0, total - main) / hz)


def settle(
    pid: int, *, busy_share: float = 0.1, interval: float = 0.25, timeout: float = 120.0
) -> float:
    """Wait until ``pid`` uses less than ``busy_share`` of one core over ``interval`` (its own
    background work stays below that); returns the seconds waited."""
    started = time.monotonic()
    last = split_cpu(pid)
    while time.monotonic() - started < timeout:
        time.sleep(interval)
        now = split_cpu(pid)
        used = (now.main - last.main) + (now.others - last.others)
        if used < busy_share * interval:
            break
        last = now
    return time.monotonic() - started - interval
