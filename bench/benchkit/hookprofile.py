"""Where chaingate spends its CPU while it matches and delivers webhooks: py-spy samples by part.

``benchkit.pyspy`` records (``Sampler``) and reads frames; this module sorts the samples into
the parts of the webhook path instead of a request's: following blocks, matching, rendering
payloads (which the store runs in its worker thread, inside the outbox's transaction), the
store, the dispatcher, signing, the outbound HTTP exchange, logs.  The innermost frame that
belongs to a part decides (C code shows in its Python caller); trio's, the socket module's and
contextlib's frames count for the part that called them, so a cancel scope or a ``connect``
made for a delivery is the delivery's.  Only samples with no part's frame at all — trio's
scheduler between tasks, waiting for I/O events — are the trio runtime's.  The event loop's thread
and the other threads are kept apart, each scaled to its own CPU per delivery from /proc: a
worker thread waiting for the GIL still looks busy to a sampler, so /proc says how much CPU
the worker threads really had, and the samples only how it divides.

A sample is a worker thread's when its stack starts in ``threading`` (trio's thread cache, the
log writer); every other one is the event loop's.  Asking for the CLI's frame instead (as
``benchkit.pyspy`` does for request loads) misfiles a third of the loop's samples here: py-spy
often reads a trio task's coroutine chain without the frames below it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from benchkit.pyspy import file_of, function_of

# (part, substrings of a frame's file with a leading "/"), checked in this order for each
# frame from the innermost out.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("signing (HMAC-SHA256, both signature headers)",
     ("chaingate/webhooks/signing", "/hmac.py")),
    ("EIP-55 checksums (keccak), wherever called",
     ("chaingate/evm/addresses", "chaingate/evm/keccak", "/Crypto/")),
    ("rendering payloads (variants, JSON)", ("chaingate/webhooks/variants",)),
    ("matching (index, filters, log decoding)",
     ("chaingate/webhooks/matchindex", "chaingate/webhooks/blockmatcher",
      "chaingate/webhooks/filters", "chaingate/data/transfers", "chaingate/data/nativetransfers")),
    ("store (SQL and rows: outbox, claims, outcomes)", ("chaingate/store/",)),
    ("dispatcher (admission, workers, judging)", ("chaingate/webhooks/",)),
    ("outbound HTTP (pool, h11, sockets)", ("chaingate/outbound/", "/h11/")),
    ("follower and upstream RPC (blocks, logs)",
     ("chaingate/chain/", "chaingate/rpc/", "chaingate/data/")),
    ("logs and metrics", ("chaingate/obs/", "/logging/")),
    ("edge (the HTTP server)", ("chaingate/edge/", "chaingate/_pure/", "chaingate/netio")),
)  # fmt: skip
RUNTIME = "trio runtime (the scheduler between tasks, I/O events, thread hand-offs)"
RUNTIME_FILES = (
    "/trio/", "/outcome/", "/threading.py", "/selectors.py", "/socket.py", "/contextlib.py",
)  # fmt: skip
OTHER = "other"
OWN = "chaingate/"
WORKER_MARKS = ("threading.py", "trio/_core/_thread_cache.py")


class PhaseCpu(Protocol):
    """CPU seconds of a measured run (``bench/webhooks.py``'s ``Cpu``)."""

    @property
    def loop(self) -> float: ...

    @property
    def others(self) -> float: ...


def categorise(frames: list[str]) -> str:
    runtime = False
    for frame in reversed(frames):  # innermost first
        path = "/" + file_of(frame)
        for name, parts in CATEGORIES:
            if any(part in path for part in parts):
                return name
        runtime = runtime or any(part in path for part in RUNTIME_FILES)
    return RUNTIME if runtime else OTHER


@dataclass
class Profile:
    label: str = ""
    rate: int = 0  # samples per second
    main: Counter[str] = field(default_factory=Counter)  # event loop's samples by part
    others: Counter[str] = field(default_factory=Counter)  # other threads' samples by part
    main_self: Counter[str] = field(default_factory=Counter)  # own time, event loop
    others_self: Counter[str] = field(default_factory=Counter)  # own time, other threads
    inclusive: Counter[str] = field(default_factory=Counter)  # chaingate functions, all threads
    delivered: int = 0
    loop_us: float = math.nan  # event loop CPU per delivery (from /proc)
    others_us: float = math.nan  # other threads' CPU per delivery (from /proc)
    raw_path: Path | None = None
    note: str = ""  # why there is no profile

    @property
    def samples(self) -> int:
        return sum(self.main.values()) + sum(self.others.values())


def parse_text(text: str) -> Profile:
    """Samples of py-spy's raw output (``frame;frame;...;innermost count`` a line)."""
    profile = Profile()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        on_loop = not any(file_of(f) in WORKER_MARKS for f in frames)
        (profile.main if on_loop else profile.others)[categorise(frames)] += count
        (profile.main_self if on_loop else profile.others_self)[function_of(frames[-1])] += count
        for function in {function_of(f) for f in frames if file_of(f).startswith(OWN)}:
            if "chaingate/cli.py" not in function:
                profile.inclusive[function] += count
    return profile


def parse(raw: Path, label: str, rate: int, cpu: PhaseCpu, delivered: int) -> Profile:
    profile = parse_text(raw.read_text())
    profile.label, profile.rate, profile.raw_path = label, rate, raw
    profile.delivered = delivered
    if delivered:
        profile.loop_us = cpu.loop / delivered * 1e6
        profile.others_us = cpu.others / delivered * 1e6
    return profile


def _us(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"


def _parts(samples: Counter[str], per_delivery: float) -> list[str]:
    total = sum(samples.values())
    lines = ["| part | share of the thread's samples | ≈ CPU µs per delivery |", "|---|---:|---:|"]
    for name, count in samples.most_common():
        lines.append(f"| {name} | {count / total:.1%} | {_us(per_delivery * count / total)} |")
    lines.append(f"| **total (from /proc)** | 100% | **{_us(per_delivery)}** |")
    return lines


def _top(samples: Counter[str], total: int, top: int) -> list[str]:
    lines = ["| function | share |", "|---|---:|"]
    lines += [f"| `{name}` | {n / total:.1%} |" for name, n in samples.most_common(top)]
    return lines


def render(p: Profile, top: int = 12) -> list[str]:
    lines = [f"## Where chaingate's time goes: {p.label} (py-spy)", ""]
    if p.note or not p.samples:
        return [*lines, p.note or "py-spy recorded no samples."]
    loop_samples = sum(p.main.values())
    other_samples = sum(p.others.values())
    lines += [
        f"{p.samples} samples at {p.rate} Hz (idle excluded) while the throughput load ran "
        f"again ({p.delivered} events delivered): {loop_samples} on the event loop's thread, "
        f"{other_samples} on the others.  By part of the webhook path (the innermost frame "
        "that belongs to a part decides; trio's and the socket module's frames count for "
        "the part that called them), scaled to each thread group's CPU per delivery "
        "measured in /proc over the same run.",
        "",
        "### Event loop thread (follower, matcher, dispatcher, HTTP)",
        "",
        *_parts(p.main, p.loop_us),
        "",
        "### Other threads (the store's transactions, which render payloads; the log writer)",
        "",
        *_parts(p.others, p.others_us),
        "",
        "Hottest functions, own time — event loop thread:",
        "",
        *_top(p.main_self, loop_samples, top),
        "",
        "— other threads:",
        "",
        *_top(p.others_self, other_samples, top),
        "",
        "chaingate's functions, inclusive (all threads):",
        "",
        *_top(p.inclusive, p.samples, top + 8),
    ]
    if p.raw_path is not None:
        lines += ["", f"Collapsed stacks of every thread (flame graph input): `{p.raw_path}`"]
    return lines
