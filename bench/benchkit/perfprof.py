"""Where a process's CPU time goes, by ``perf record -e cpu-clock`` (a software clock: no
hardware counters needed, which some virtual machines lack): its samples' shares by library
(the kernel, the interpreter, chaingate's compiled lane, libc, ...) and by function.

Python functions all show as the interpreter's (``_PyEval_EvalFrameDefault``: Python 3.11 has
no perf trampoline); py-spy (``benchkit/pyspy.py``) tells them apart.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

FREQUENCY = 999  # samples per second
_ROW = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s*$")

# (part, substrings of a sample's library), the first that matches names the part.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel (sockets, epoll, scheduling)", ("[kernel", "kallsyms", "[vdso]")),
    ("compiled lane (chaingate/_native: edgeloop, fastlane, http1, jsonrpc, limiter)",
     ("edgeloop.", "fastlane.", "http1.", "jsonrpc.", "limiter.")),
    ("CPython (interpreting chaingate's, trio's and the stdlib's Python)",
     ("libpython", "python3")),
    ("msgspec", ("msgspec",)),
    ("SQLite", ("sqlite",)),
    ("libc (malloc, memcpy, locks, syscall stubs)", ("libc.so", "libc-", "ld-linux")),
)  # fmt: skip


def record(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """``perf record`` of ``pid`` (every thread) for ``seconds``, started; wait on it."""
    argv = [
        "perf", "record", "-e", "cpu-clock", "-F", str(FREQUENCY), "-p", str(pid),
        "-o", str(out), "--", "sleep", str(seconds),
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def shares(data: Path, sort: str) -> list[tuple[float, str]]:
    """(percent, key) rows of ``perf report --sort SORT``, self time, highest first."""
    argv = [
        "perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", sort,
        "-g", "none", "--percent-limit", "0.1",
    ]  # fmt: skip
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        match = _ROW.match(line)
        if match is not None and not line.startswith("#"):
            rows.append((float(match.group(1)), " ".join(match.group(2).split())))
    return rows


def part(dso: str) -> str:
    return next((name for name, keys in PARTS if any(k in dso for k in keys)), f"other ({dso})")


def render(data: Path, cpu_us: float | None, top: int) -> list[str]:
    """Markdown: shares by part and by function, in µs of ``cpu_us`` per request when given."""

    def us(percent: float) -> str:
        return "n/a" if cpu_us is None else f"{cpu_us * percent / 100:.1f}"

    by_part: dict[str, float] = {}
    for percent, dso in shares(data, "dso"):
        by_part[part(dso)] = by_part.get(part(dso), 0.0) + percent
    ranked = sorted(by_part.items(), key=lambda item: -item[1])
    lines = ["| part | share of samples | ≈ CPU µs/request |", "|---|---:|---:|"]
    lines += [f"| {name} | {p:.1f}% | {us(p)} |" for name, p in ranked]
    lines += [
        "",
        "By thread (its name):",
        "",
        "| share | ≈ µs/request | thread |",
        "|---:|---:|---|",
    ]
    lines += [f"| {p:.1f}% | {us(p)} | `{key}` |" for p, key in shares(data, "comm")]
    lines += ["", "Functions by own samples:", "", "| share | ≈ µs/request | library, function |"]
    lines += ["|---:|---:|---|"]
    lines += [f"| {p:.1f}% | {us(p)} | `{key}` |" for p, key in shares(data, "dso,sym")[:top]]
    return lines
