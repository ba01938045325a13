"""Where a chaingate process spends its CPU: py-spy samples, split into the parts of a request.

``Sampler`` runs ``py-spy record`` against a pid (every thread, idle samples excluded, the
process not paused: ``--nonblocking``) into a collapsed-stack file; ``parse_collapsed`` reads
that file into a ``Profile`` of the event loop's thread (the main thread, which every request
needs and which bounds the request rate): samples per part of the request path (the innermost
frame that belongs to a part decides; C code such as msgspec shows in its Python caller), the
hottest functions by own time, and chaingate's functions by inclusive time.  Worker threads'
samples are only counted: a worker thread waiting for the GIL looks busy to a sampler (the
SQLite store's query drops and retakes the GIL for every row), so their CPU is better read
from /proc (``threads.split_cpu``).  ``render`` makes the markdown section.  py-spy is not a
dependency of chaingate: ``find`` looks for it beside the interpreter and on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

# (part, substrings of a frame's file with a leading "/"); checked in this order for each
# frame from the innermost out, so checksums count as such wherever they are called from.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("EIP-55 checksums (keccak), wherever called",
     ("chaingate/evm/addresses", "chaingate/evm/keccak", "/Crypto/")),
    ("Quart/ASGI (quart, hypercorn, werkzeug, the ASGI bridge)",
     ("/quart", "/hypercorn/", "/werkzeug/", "/flask/", "chaingate/edge/asgi")),
    ("store query (SQL, in a worker thread)", ("chaingate/store/", "chaingate/data/")),
    ("metadata lookups (tokens, prices, formatting)", ("chaingate/metadata/",)),
    ("REST handler, typed input, encoding", ("chaingate/api/",)),
    ("key gate and metering", ("chaingate/auth/",)),
    ("logs and metrics", ("chaingate/obs/", "/logging/")),
    ("edge (HTTP framing, routing, sockets)",
     ("chaingate/edge/", "chaingate/_pure/", "chaingate/netio")),
    ("upstream/RPC (head polling, feeds)",
     ("chaingate/rpc/", "chaingate/chain/", "chaingate/gas/")),
    ("trio runtime (scheduling, thread hand-offs, I/O)",
     ("/trio/", "/outcome/", "/threading.py")),
)  # fmt: skip
OTHER = "other"
# chaingate's own code below the entry point (cli.py's frames would hold every sample).
OWN_CODE = tuple(
    f"chaingate/{part}"
    for part in ("api/", "auth/", "data/", "edge/", "evm/", "metadata/", "obs/", "store/",
                 "netio", "_pure/", "rpc/", "chain/", "gas/", "gateway")
)  # fmt: skip
MAIN_THREAD_MARK = "chaingate/cli.py"  # only the event loop's thread runs under the CLI


def file_of(frame: str) -> str:
    """The file of a py-spy frame, ``function (path/to/file.py:line)``; relative paths."""
    start = frame.rfind(" (")
    return frame[start + 2 : frame.rfind(":")] if start >= 0 else frame


def function_of(frame: str) -> str:
    """``function (file)``: the line dropped, so that a function's lines add up."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})"


def categorise(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        path = "/" + file_of(frame)
        for name, parts in CATEGORIES:
            if any(part in path for part in parts):
                return name
    return OTHER


@dataclass
class Profile:
    """The event loop's thread: every counter but ``samples`` is over its samples only."""

    label: str = ""
    samples: int = 0  # every thread's
    main_thread: int = 0  # the event loop's thread's
    by_category: Counter[str] = field(default_factory=Counter)
    self_time: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)  # chaingate's functions only
    rate: int = 0  # samples per second
    requests: int = 0  # answered while sampling
    main_cpu_us: float | None = None  # CPU per request while sampling (from /proc)
    others_cpu_us: float | None = None
    raw_path: Path | None = None
    note: str = ""  # why there is no profile


def parse_collapsed(text: str) -> Profile:
    """The event loop thread's profile from py-spy's raw output: one ``frame;frame;...;
    innermost count`` a line."""
    profile = Profile()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        profile.samples += count
        if not any(file_of(f) == MAIN_THREAD_MARK for f in frames):
            continue  # a worker thread
        profile.main_thread += count
        profile.by_category[categorise(frames)] += count
        profile.self_time[function_of(frames[-1])] += count
        for function in {function_of(f) for f in frames if file_of(f).startswith(OWN_CODE)}:
            profile.inclusive[function] += count
    return profile


def find(given: str | None = None) -> str | None:
    """The py-spy binary: ``given``, else beside this interpreter, else on PATH."""
    if given:
        return given if Path(given).is_file() else None
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


class Sampler:
    """``with Sampler(...)``: py-spy records ``pid`` for ``seconds`` while the body runs (it is
    attached before the body starts); afterwards ``failure`` says why there is no output."""

    ATTACH_SECONDS = 0.5

    def __init__(self, binary: str, pid: int, seconds: int, out: Path, *, rate: int) -> None:
        self.argv = [
            binary, "record",
            "--pid", str(pid),
            "--rate", str(rate),
            "--duration", str(seconds),
            "--format", "raw",
            "--nonblocking",
            "--output", str(out),
        ]  # fmt: skip
        self.seconds = seconds
        self.out = out
        self.failure = ""
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Sampler:
        self.out.unlink(missing_ok=True)
        self._process = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        time.sleep(self.ATTACH_SECONDS)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        output = ""
        try:
            if kind is None:
                output, _ = process.communicate(timeout=self.seconds + 60)
        except subprocess.TimeoutExpired:
            output = "py-spy did not finish"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode != 0 or not self.out.is_file():
            self.failure = f"py-spy failed ({process.returncode}): {output.strip()[-300:]}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def render(p: Profile, top: int = 15) -> list[str]:
    """The markdown section of one profile."""
    lines = [f"## Where the time goes: {p.label} (py-spy)", ""]
    if p.note or not p.main_thread:
        return [*lines, p.note or "py-spy recorded no samples of the event loop's thread."]
    per_req = p.main_cpu_us
    lines += [
        f"{p.samples} samples at {p.rate} Hz (idle excluded) while wrk ran the same load "
        f"again ({p.requests} requests), {p.main_thread} of them on the event loop's thread "
        "(the main thread: every request needs it, so its CPU per request bounds the rate).  "
        "Its samples by part of the request path (the innermost frame that belongs to a "
        "part decides), scaled to its CPU per request measured in /proc during the same run:",
        "",
        "| part | share of the event loop's samples | ≈ CPU µs/request |",
        "|---|---:|---:|",
    ]
    for name, count in p.by_category.most_common():
        share = count / p.main_thread
        lines.append(f"| {name} | {share:.1%} | {_num(per_req * share if per_req else None)} |")
    lines += [
        f"| **event loop's thread, total** | 100% | **{_num(per_req)}** |",
        f"| other threads (the store's SQL, the log writer), from /proc | | "
        f"{_num(p.others_cpu_us)} |",
    ]
    lines += [
        "",
        "Hottest functions on the event loop's thread (own time):",
        "",
        "| function | share |",
        "|---|---:|",
    ]
    lines += [
        f"| `{name}` | {count / p.main_thread:.1%} |"
        for name, count in p.self_time.most_common(top)
    ]
    lines += [
        "",
        "chaingate's functions on the event loop's thread, inclusive (time in them and in "
        "what they call):",
        "",
        "| function | share |",
        "|---|---:|",
    ]
    lines += [
        f"| `{name}` | {count / p.main_thread:.1%} |"
        for name, count in p.inclusive.most_common(top + 5)
    ]
    if p.raw_path is not None:
        lines += ["", f"Collapsed stacks of every thread (flame graph input): `{p.raw_path}`"]
    return lines
