"""The load machine in a report's header: cores, CPU, how busy it was before the run."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

BUSY_WARNING = 0.10  # share of CPU busy before start above which the report warns


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(seconds: float = 1.0) -> float | None:
    """Share of the machine's CPU busy over ``seconds`` (0..1); None where /proc is absent."""
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / (total1 - total0) if total1 > total0 else None


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def describe(busy_before: float | None) -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cores": os.cpu_count() or 0,
        "cpu": cpu_model(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average_before": load_average(),
        "busy_before": busy_before,
        "busy_warning": busy_before is not None and busy_before > BUSY_WARNING,
    }
