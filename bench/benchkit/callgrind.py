"""Reading callgrind's counts: instructions per function, per library, net of an idle window.

A server under callgrind runs ~50x slower, while its timers (key refresh, health probes, usage
flushes) still fire by the wall clock: at a few dozen requests a second they would weigh far
more per request than at full speed.  So two windows are dumped: one idle, one under load; each
function's idle count, scaled to the load window's length, is taken off its loaded count, and
what is left is divided by the requests answered.  Callgrind counts user-space instructions
only: the kernel's share (syscalls) is in /proc's system time, reported beside.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.+)$")
_OBJECT = re.compile(r"\[([^\]]+)\]\s*$")

# (part, substrings of the function's object file), the first that matches names the part.
LIBRARIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compiled lane (chaingate/_native: fastlane, edgeloop, http1, jsonrpc, limiter)",
     ("chaingate/_native/",)),
    ("SQLite (libsqlite3 and Python's _sqlite3)", ("libsqlite3", "_sqlite3")),
    ("msgspec", ("msgspec",)),
    ("CPython (the interpreter running chaingate's, trio's and the stdlib's Python code)",
     ("libpython", "/python3")),
    ("libc (memcpy, malloc, locks, the user side of syscalls)", ("libc.so", "ld-linux")),
)  # fmt: skip


def counts(dump: Path, *, inclusive: bool = False) -> tuple[int, Counter[str]]:
    """(total, instructions by function) of one callgrind dump, from callgrind_annotate."""
    argv = ["callgrind_annotate", "--threshold=100", str(dump)]
    if inclusive:
        argv.insert(1, "--inclusive=yes")
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    total, found = 0, Counter[str]()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        count, name = int(match.group(1).replace(",", "")), match.group(2).strip()
        if "PROGRAM TOTALS" in name:
            total = count
        elif total:
            found[name] += count
    return total, found


def net(loaded: Counter[str], idle: Counter[str], scale: float) -> Counter[str]:
    """What the load added: each function's loaded count less its idle count times ``scale``."""
    return Counter(
        {name: left for name, count in loaded.items() if (left := count - idle[name] * scale) > 0}
    )


def library(name: str) -> str:
    match = _OBJECT.search(name)
    obj = match.group(1) if match else ""
    return next((part for part, keys in LIBRARIES if any(k in obj for k in keys)), "other")


def short(name: str) -> str:
    """``file.c:function [object]`` with directories dropped."""
    match = _OBJECT.search(name)
    head = name[: match.start()].strip() if match else name
    source, _, function = head.rpartition(":")
    obj = Path(match.group(1)).name if match else "?"
    return f"{Path(source).name or '?'}:{function} [{obj}]"


def by_library(found: Counter[str]) -> Counter[str]:
    parts = Counter[str]()
    for name, count in found.items():
        parts[library(name)] += count
    return parts


def render(
    own: Counter[str], inclusive: Counter[str], requests: int, top: int
) -> list[str]:  # fmt: skip
    """Markdown: instructions per request by library, the top functions own and inclusive
    (inclusive: the compiled lane's and the C libraries', as the interpreter's frames hold all)."""
    total = sum(own.values())
    per = max(requests, 1)
    lines = [
        f"{total / per:,.0f} user-space instructions per request, net of the idle window.",
        "",
        "| part | share | instructions/request |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {part} | {count / total:.1%} | {count / per:,.0f} |"
        for part, count in by_library(own).most_common()
    ]
    lines += ["", "Functions by own instructions:", "", "| share | instr/request | function |"]
    lines += ["|---:|---:|---|"]
    lines += [
        f"| {count / total:.1%} | {count / per:,.0f} | `{short(name)}` |"
        for name, count in own.most_common(top)
    ]
    outside = Counter(
        {
            n: c
            for n, c in inclusive.items()
            if not library(n).startswith("CPython") and "'" not in n
        }
    )
    lines += ["", "Outside the interpreter, inclusive (with what they call):", ""]
    lines += ["| share | instr/request | function |", "|---:|---:|---|"]
    lines += [
        f"| {count / total:.1%} | {count / per:,.0f} | `{short(name)}` |"
        for name, count in outside.most_common(top)
    ]
    return lines
