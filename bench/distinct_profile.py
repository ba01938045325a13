"""Where a distinct proxied request's CPU goes in chaingate: py-spy or perf under wrk.

    python bench/distinct_profile.py [--scenario distinct-balance] [--seconds 20]
                                     [--tool py-spy|perf|strace] [--py-spy PATH] [--native]
                                     [--connections 32] [--top 25] [--out PATH]

The devnet and chaingate of ``bench/run.py``'s ``distinct-...`` scenarios (anvil bootstrapped,
10,000 holders, the transfers; one ``chaingate serve`` with the production defaults: API keys
on, access log on), one scenario's load from wrk: first a plain run (req/s, chaingate's CPU per
request in user space and in the kernel), then the same load again under one of:

* ``py-spy`` (``pip install --target /tmp/pyspy py-spy``; ``--py-spy /tmp/pyspy/bin/py-spy``):
  samples the event loop's thread; the report gives the request's parts, the hottest Python
  functions by own time (C code, the compiled lane's included, counts in its Python caller) and
  chaingate's by inclusive time (``benchkit/pyspy.py``).  ``--native`` adds C frames, but must
  pause the process at each sample, and counts a thread waiting in epoll_wait as busy.
* ``perf`` (``perf record -e cpu-clock``, a software clock: it works where the hardware
  counters do not, as on this VM): every thread's CPU by library (kernel, interpreter, compiled
  lane, libc...) and by C function (``benchkit/perfprof.py``).
* ``strace``: syscalls per request, every thread (``strace -c -f``, which slows them).

callgrind is no use here: under it chaingate answers a few dozen requests a second, while its
timers fire by the wall clock, so their instructions swamp the requests'.  Absolute numbers
depend on the machine and its load; the shares are the point.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import distinct, perfprof, procs, pyspy, scenarios, threads, tools  # noqa: E402
from benchkit.wrkload import Wrk  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

PAYMASTER_SIGNER = "0x" + "11" * 20  # as bench/run.py: the same cached devnet state
TRANSFERS = 2_000
RATE = 250  # py-spy samples per second
TICKS = os.sysconf("SC_CLK_TCK")


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
    parser.add_argument("--tool", choices=("py-spy", "perf", "strace"), default="py-spy")
    parser.add_argument("--py-spy", help="the py-spy binary (default: beside python, on PATH)")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--out", type=Path, help="write the report here too")
    args = parser.parse_args(argv)
    return Options(
        args.scenario, args.seconds, args.tool, args.py_spy, args.native, args.connections,
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
    space and in the kernel."""
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


def profile_perf(opts: Options, wrk: Wrk, server: procs.ChaingateServer, path: Path) -> str:
    pid = server.process.pid
    assert pid is not None
    data = path.with_suffix(".perf.data")
    user, system = _user_system(pid)
    recorder = perfprof.record(pid, opts.seconds, data)
    result = wrk.run(server.rpc_url, b"", opts.seconds + 1, requests=path)
    recorder.wait(timeout=60)
    user_after, system_after = _user_system(pid)
    cpu_us = (
        (user_after - user + system_after - system) / result.requests * 1e6
        if result.requests
        else None
    )
    lines = [
        f"## Where the CPU goes: {opts.scenario} under perf (cpu-clock, {perfprof.FREQUENCY} Hz, "
        "every thread of chaingate)",
        "",
        f"{result.rps:.0f} req/s, {result.errors} errors; chaingate CPU "
        f"{cpu_us or 0:.1f} µs per request (user {user_after - user:.2f} s, system "
        f"{system_after - system:.2f} s in all).",
        "",
        *perfprof.render(data, cpu_us, opts.top),
    ]
    return "\n".join(lines)


def profile_strace(opts: Options, wrk: Wrk, server: procs.ChaingateServer, path: Path) -> str:
    """Syscalls per request: ``strace -c -f`` attached for the load (which it slows)."""
    pid = server.process.pid
    assert pid is not None
    out = path.with_suffix(".strace.txt")
    tracer = subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached to every thread
    result = wrk.run(server.rpc_url, b"", opts.seconds, requests=path)
    tracer.send_signal(signal.SIGINT)  # strace prints its summary on detaching
    tracer.wait(timeout=60)
    per = max(result.requests, 1)
    rows = []
    for line in out.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
            calls = int(fields[3])
            rows.append((calls, fields[-1]))
    rows.sort(reverse=True)
    lines = [
        f"## Syscalls per request: {opts.scenario} under strace -c -f",
        "",
        f"{result.requests:,} requests ({result.rps:.0f} req/s under strace, which slows every "
        f"syscall: the counts are the point); {sum(c for c, _ in rows) / per:.2f} syscalls per "
        "request in all, every thread (timers' included).",
        "",
        "| syscall | per request |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {calls / per:.2f} |" for calls, name in rows[: opts.top]]
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
    stack.callback(server.stop)
    server.start(timeout=30.0)
    say(f"chaingate on :{server.port} (impl {server.impl()}) under {opts.tool}")
    wrk = Wrk(
        tools.require_tools(("wrk",))["wrk"],
        workdir,
        connections=opts.connections,
        headers=tuple(server.headers.items()),
    )
    report = [f"# {opts.scenario}: {scenarios.DISTINCT_NOTES[opts.scenario[9:]]}", ""]
    report += [_measured(wrk, server, path, 10), ""]
    tool = {"py-spy": profile_pyspy, "perf": profile_perf, "strace": profile_strace}[opts.tool]
    report.append(tool(opts, wrk, server, path))
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
