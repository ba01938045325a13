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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import distinct, procs, pyspy, scenarios, threads, tools  # noqa: E402
from benchkit.wrkload import Wrk  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

PAYMASTER_SIGNER = "0x" + "11" * 20  # as bench/run.py: the same cached devnet state
TRANSFERS = 2_000
RATE = 250  # py-spy samples per second
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


def _measured(wrk: Wrk, server: procs.ChaingateServer, path: Path, seconds: int) -> str:
    """One plain run (no profiler attached): req/s and chaingate's CPU per request."""
    before = _cpu(server)
    result = wrk.run(server.rpc_url, b"", seconds, requests=path)
    used = _cpu(server) - before
    per = used / result.requests * 1e6 if result.requests else 0.0
    return (
        f"unprofiled: {result.rps:.0f} req/s, chaingate CPU {per:.1f} µs per request, "
        f"p99 {result.p99_ms:.2f} ms, {result.errors} errors ({seconds} s)"
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


def _annotate(out: Path, requests: int, top: int, inclusive: bool) -> list[str]:
    argv = ["callgrind_annotate", "--threshold=99", str(out)]
    if inclusive:
        argv.insert(1, "--inclusive=yes")
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rows: list[tuple[int, str]] = []
    total = 0
    for line in text.splitlines():
        found = re.match(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.+)$", line)
        if found is None:
            continue
        count = int(found.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in found.group(2):
            total = count
        elif total and len(rows) < top:
            rows.append((count, found.group(2).strip()))
    kind = "inclusive" if inclusive else "own"
    lines = [
        f"### Instructions, {kind} (callgrind_annotate{' --inclusive=yes' if inclusive else ''})",
        "",
        f"{total / max(requests, 1):,.0f} instructions per request in all "
        f"({total:,} for {requests:,} requests).",
        "",
        "| share | instr/request | function |",
        "|---:|---:|---|",
    ]
    lines += [
        f"| {count / total:.1%} | {count / max(requests, 1):,.0f} | `{name[:140]}` |"
        for count, name in rows
    ]
    return lines


def profile_callgrind(
    opts: Options, wrk: Wrk, server: procs.ChaingateServer, path: Path, out: Path
) -> str:
    pid = server.process.pid
    assert pid is not None
    wrk.run(server.rpc_url, b"", 5, requests=path)  # warm-up, not instrumented
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
    result = wrk.run(server.rpc_url, b"", opts.seconds, requests=path)
    subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    time.sleep(1.0)
    dumps = sorted(out.parent.glob(out.name + "*"), key=lambda p: p.stat().st_mtime)
    if not dumps:
        raise SystemExit("callgrind wrote no profile")
    lines = [
        f"## Where the instructions go: {opts.scenario}, {result.requests:,} requests "
        f"under callgrind ({result.rps:.0f} req/s)",
        "",
    ]
    lines += _annotate(dumps[-1], result.requests, opts.top, inclusive=False)
    lines += ["", *_annotate(dumps[-1], result.requests, opts.top, inclusive=True)]
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
        report.append(_measured(wrk, server, path, 10))
        report += ["", profile_pyspy(opts, wrk, server, path)]
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
