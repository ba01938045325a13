"""Finding the external tools (nginx, wrk, anvil) and reading their versions."""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import FrameType

INSTALL_HINT = "install them with: sudo apt-get install -y nginx wrk  (Debian/Ubuntu)"
# nginx lives in /usr/sbin, which is not on every user's PATH.
EXTRA_DIRS = ("/usr/sbin", "/usr/local/sbin", "/usr/local/bin")


class MissingTool(Exception):
    """A required external tool is not installed; the message says how to install it."""


def find_tool(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *EXTRA_DIRS])
    return shutil.which(name, path=path)


def require_tools(names: tuple[str, ...] = ("nginx", "wrk")) -> dict[str, str]:
    found = {name: find_tool(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise MissingTool(f"{' and '.join(missing)} not found; {INSTALL_HINT}")
    return {name: path for name, path in found.items() if path is not None}


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def nginx_version(binary: str) -> str:
    line = _first_line([binary, "-v"])  # "nginx version: nginx/1.22.1" on stderr
    return line.split("nginx/", 1)[-1]


def wrk_version(binary: str) -> str:
    match = re.search(r"wrk (\S+)", _first_line([binary, "-v"]))
    return match.group(1) if match else "unknown"


def anvil_version(binary: Path) -> str:
    line = _first_line([str(binary), "--version"])  # "anvil Version: 1.7.1"
    return line.split(":", 1)[-1].strip()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_summary() -> str:
    cores = os.cpu_count() or 0
    return f"{cores} cores, {cpu_model()}, Linux {platform.release()}"


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def background_busy(seconds: float = 1.0) -> float | None:
    """Share of the machine's CPU busy while nothing of the bench runs (0..1)."""
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / (total1 - total0) if total1 > total0 else None


def process_tree(pid: int) -> list[int]:
    """``pid`` and its direct children (nginx: the master and its worker; ``chaingate serve
    --workers N``: the supervisor and its workers).  Every thread's children: trio starts a
    process from a worker thread, and ``/proc`` lists a child under the thread that forked it."""
    pids = [pid]
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return pids
    for thread in threads:
        try:
            pids += [int(child) for child in (thread / "children").read_text().split()]
        except OSError:
            continue  # the thread ended meanwhile
    return pids


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by these processes (all their threads)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process is gone: it adds nothing
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


class CpuAccount:
    """CPU used on the machine by processes outside the bench, between start() and share().

    Machine-wide busy time comes from /proc/stat; the bench's own share is this process plus
    every child it has reaped (wrk, chaingate, nginx and its worker, anvil), from os.times().
    Call share() after every server has been stopped and waited for.
    """

    def __init__(self) -> None:
        self._start: tuple[float, float, float] | None = None

    @staticmethod
    def _now() -> tuple[float, float, float]:
        busy, _ = _cpu_times()
        own = os.times()
        mine = own.user + own.system + own.children_user + own.children_system
        return busy / os.sysconf("SC_CLK_TCK"), mine, time.monotonic()

    def start(self) -> None:
        try:
            self._start = self._now()
        except (OSError, ValueError, IndexError):
            self._start = None

    def share(self) -> float | None:
        """Other processes' CPU as a share of the whole machine over the interval (0..1)."""
        if self._start is None:
            return None
        try:
            busy, mine, now = self._now()
        except (OSError, ValueError, IndexError):
            return None
        busy0, mine0, then = self._start
        capacity = (now - then) * (os.cpu_count() or 1)
        if capacity <= 0:
            return None
        return max(0.0, (busy - busy0) - (mine - mine0)) / capacity


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler making SIGTERM unwind like Ctrl-C (every server gets stopped)."""
    raise KeyboardInterrupt(f"signal {signum}")


def connection_levels(text: str) -> tuple[int, ...]:
    """``--connections 1,8,50``: the levels, sorted (an argparse ``type``)."""
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("connection counts must be at least 1")
    return levels
