"""Where a distinct proxied request's CPU goes in chaingate: py-spy or callgrind under wrk.

    python bench/distinct_profile.py [--scenario distinct-balance] [--seconds 20]
                                     [--tool py-spy|callgrind] [--py-spy PATH] [--native]
                                     [--connections 32] [--top 25] [--out PATH]

The devnet and chaingate of ``bench/run.py``'s ``distinct-...`` scenarios (anvil bootstrapped,
10,000 holders, the transfers; one ``chaingate serve`` with the production defaults: API keys
on, access log on), one scenario's load from wrk, and one of:

* ``py-spy`` (``pip install --target /tmp/pyspy py-spy``; ``--py-spy /tmp/pyspy/bin/py-spy``):
  samples the event loop's thread while wrk drives the load; the report gives the request's
  parts, the hottest functions by own time and chaingate's by inclusive time
  (``benchkit/pyspy.py``), with ``--native`` the compiled lane's C functions too.
* ``callgrind`` (valgrind): chaingate runs under callgrind, instrumentation off until the load
  has warmed up, then on for ``--seconds`` of load (a slower one: ``--connections 4``); the
  report gives instructions per request and the functions with the most instructions, own
  and inclusive (``callgrind_annotate``), which is where the compiled lane and the interpreter
  spend them.

CPU time per request (from /proc) is measured in the same run, outside the profiler's window
for callgrind.  Absolute numbers depend on the machine and its load; the shares are the point.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import callgrind, distinct, procs, pyspy, scenarios, threads, tools  # noqa: E402
from benchkit.wrkload import Wrk  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

PAYMASTER_SIGNER = "0x" + "11" * 20  # as bench/run.py: the same cached devnet state
TRANSFERS = 2_000
RATE = 250  # py-spy samples per second
TICKS = os.sysconf("SC_CLK_TCK")
CALLGRIND_START_TIMEOUT = 600.0  # imports under callgrind are ~50x slower


@dataclass(frozen=True)
class Options:
    scenario: str
    seconds: int
    tool: str
    py_spy: str | None
    native: bool
    connections: int
    top: int
    out: Path | None


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    kinds = [f"distinct-{kind}" for kind in scenarios.DISTINCT_NOTES]
    parser.add_argument("--scenario", choices=kinds, default="distinct-balance")
    parser.add_argument("--seconds", type=int, default=20, help="of profiled load")
    parser.add_argument("--tool", choices=("py-spy", "callgrind"), default="py-spy")
    parser.add_argument("--py-spy", help="the py-spy binary (default: beside python, on PATH)")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    parser.add_argument("--connections", type=int, help="wrk connections (32; callgrind 4)")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--out", type=Path, help="write the report here too")
    args = parser.parse_args(argv)
    connections = args.connections or (4 if args.tool == "callgrind" else 32)
    return Options(
        args.scenario, args.seconds, args.tool, args.py_spy, args.native, connections,
        args.top, args.out,
    )  # fmt: skip


def say(text: str) -> None:
    print(text, flush=True)


def _cpu(server: procs.ChaingateServer) -> float:
    pid = server.process.pid
    return tools.process_cpu_seconds(tools.process_tree(pid)) if pid else 0.0


def _user_system(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` (every thread) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def _measured(wrk: Wrk, server: procs.ChaingateServer, path: Path, seconds: int) -> str:
    """One plain run (no profiler attached): req/s and chaingate's CPU per request, in user
    space and in the kernel (callgrind sees the first only)."""
    pid = server.process.pid
    assert pid is not None
    user, system = _user_system(pid)
    result = wrk.run(server.rpc_url, b"", seconds, requests=path)
    user_after, system_after = _user_system(pid)
    per = 1e6 / result.requests if result.requests else 0.0
    return (
        f"Unprofiled ({seconds} s, wrk -c{wrk.connections}): {result.rps:.0f} req/s, chaingate "
        f"CPU {(user_after - user + system_after - system) * per:.1f} µs per request = user "
        f"{(user_after - user) * per:.1f} + system (kernel: sockets, epoll) "
        f"{(system_after - system) * per:.1f}; p99 {result.p99_ms:.2f} ms, {result.errors} errors."
    )


def profile_pyspy(opts: Options, wrk: Wrk, server: procs.ChaingateServer, path: Path) -> str:
    binary = pyspy.find(opts.py_spy)
    if binary is None:
        raise SystemExit("py-spy not found: pip install --target /tmp/pyspy py-spy")
    pid = server.process.pid
    assert pid is not None
    out = path.with_suffix(".pyspy.txt")
    sampler = pyspy.Sampler(binary, pid, opts.seconds, out, rate=RATE)
    if opts.native:  # native stacks need the process paused at each sample
        sampler.argv.remove("--nonblocking")
        sampler.argv.append("--native")
    before = threads.split_cpu(pid)
    with sampler:
        result = wrk.run(server.rpc_url, b"", opts.seconds + 1, requests=path)
    used = threads.split_cpu(pid) - before
    if sampler.failure:
        raise SystemExit(sampler.failure)
    profile = pyspy.parse_collapsed(out.read_text())
    profile.label = f"{opts.scenario}, {result.rps:.0f} req/s under py-spy"
    profile.rate, profile.requests = RATE, result.requests
    if result.requests:
        profile.main_cpu_us = used.main / result.requests * 1e6
        profile.others_cpu_us = used.others / result.requests * 1e6
    return "\n".join(pyspy.render(profile, top=opts.top))


def _dump(pid: int, out: Path, before: set[Path]) -> Path:
    """Dump callgrind's counts (zeroed after) and return the new file."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out.parent.glob(out.name + "*")) - before
        if new:
            time.sleep(1.0)  # let it finish writing
            return new.pop()
        time.sleep(0.2)
    raise SystemExit("callgrind wrote no dump")


def profile_callgrind(
    opts: Options, wrk: Wrk, server: procs.ChaingateServer, path: Path, out: Path
) -> str:
    pid = server.process.pid
    assert pid is not None
    wrk.run(server.rpc_url, b"", 5, requests=path)  # warm-up, not instrumented
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
    seen: set[Path] = set(out.parent.glob(out.name + "*"))
    _dump(pid, out, seen)  # zero the counters: the windows start now
    seen = set(out.parent.glob(out.name + "*"))
    started = time.monotonic()
    time.sleep(opts.seconds)  # the idle window: timers only
    idle_dump = _dump(pid, out, seen)
    idle_seconds = time.monotonic() - started
    seen.add(idle_dump)
    started = time.monotonic()
    result = wrk.run(server.rpc_url, b"", opts.seconds, requests=path)
    load_dump = _dump(pid, out, seen)
    load_seconds = time.monotonic() - started
    subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
    scale = load_seconds / idle_seconds
    idle_total, idle_own = callgrind.counts(idle_dump)
    load_total, load_own = callgrind.counts(load_dump)
    _, idle_incl = callgrind.counts(idle_dump, inclusive=True)
    _, load_incl = callgrind.counts(load_dump, inclusive=True)
    own = callgrind.net(load_own, idle_own, scale)
    inclusive = callgrind.net(load_incl, idle_incl, scale)
    lines = [
        f"## Where the instructions go: {opts.scenario} under callgrind",
        "",
        f"Idle window {idle_seconds:.1f} s: {idle_total:,} instructions (timers only).  Load "
        f"window {load_seconds:.1f} s: {load_total:,} instructions, {result.requests:,} "
        f"requests ({result.rps:.0f} req/s, {result.errors} errors).",
        "",
        *callgrind.render(own, inclusive, result.requests, opts.top),
    ]
    return "\n".join(lines)


def run(opts: Options, stack: contextlib.ExitStack) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-profile-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    anvil = AnvilProcess()
    stack.callback(anvil.stop)
    anvil.start()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=PAYMASTER_SIGNER, announce=say)
    chain = distinct.prepare(anvil.url, manifest, TRANSFERS, say)
    path = distinct.write(chain, opts.scenario.removeprefix("distinct-"), workdir)
    auth = procs.Auth.fresh(workdir / "chaingate.db")
    server = procs.ChaingateServer(
        workdir, "chaingate", anvil.url, access_log=True, coalesce=True, auth=auth
    )
    server.create_key()
    callgrind_out = workdir / "callgrind.out"
    if opts.tool == "callgrind":
        server.process.argv[:0] = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={callgrind_out}",
        ]  # fmt: skip
    stack.callback(server.stop)
    server.start(timeout=CALLGRIND_START_TIMEOUT if opts.tool == "callgrind" else 30.0)
    say(f"chaingate on :{server.port} (impl {server.impl()}) under {opts.tool}")
    wrk = Wrk(
        tools.require_tools(("wrk",))["wrk"],
        workdir,
        connections=opts.connections,
        headers=tuple(server.headers.items()),
    )
    report = [f"# {opts.scenario}: {scenarios.DISTINCT_NOTES[opts.scenario[9:]]}", ""]
    if opts.tool == "py-spy":
        report += [_measured(wrk, server, path, 10), "", profile_pyspy(opts, wrk, server, path)]
    else:
        report += ["", profile_callgrind(opts, wrk, server, path, callgrind_out)]
    return "\n".join(report) + "\n"


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    with contextlib.ExitStack() as stack:
        text = run(opts, stack)
    say(text)
    if opts.out is not None:
        opts.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
