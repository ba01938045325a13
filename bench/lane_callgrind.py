"""Instructions per distinct request in chaingate's compiled path, counted by callgrind.

    python bench/lane_callgrind.py [--kinds balance,receipt,batch] [--requests 1000]
                                   [--compare OTHER_TREE]

The devnet of ``bench/run.py``'s ``distinct-...`` scenarios (anvil bootstrapped, the holders and
1,000 CGT transfers, ``benchkit/distinct.py``); then, per kind, a keyed gateway on the compiled
twins runs in a process of its own under ``valgrind --tool=callgrind --instr-atstart=no``
(everything on a timer slowed to an hour, the follower off, the receipts' network's
``finality_depth`` 64 as the bench's), warmed, and instructions are counted only while the
kind's requests are served on ten connections (``tests/hot_path_probe.py``'s client), then in
an idle window as long (taken off: timers fire by the wall clock).  Reported per request (a
batch: per batch of 20): the whole process, and the lane's compiled entry points' inclusive
instructions (the edge's read and ``Lane.serve``, the upstream body, the reply parse, the
landing and answer), which do not depend on timers.  ``--compare`` runs the same in another
checkout (its ``src`` built) first.  Needs valgrind, its headers and a C compiler (the counting
window is opened and closed with callgrind's client requests, from a tiny shared library).

Unlike bench/distinct_profile.py this counts in-process, so its numbers are the same on a
loaded machine: choose changes by them while wall-clock timings are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import distinct  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

TRANSFERS = 1000
PER = {"batch": distinct.BATCH_SIZE}
TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(const char* name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""
# The gateway under callgrind: counts only while the requests are served, then while idle.
INNER = r"""
import ctypes, sys
from pathlib import Path
import trio
from chaingate import twins
from tests.hot_path_probe import _client, _started_client
from tests.test_auth import keyed_settings, start_auth

cg = ctypes.CDLL(sys.argv[1])

async def main(url, bodies, workdir, count):
    workdir = Path(workdir)
    settings = keyed_settings(
        [url], f"sqlite:///{workdir / 'keys.db'}", workdir, network={"finality_depth": 64},
        auth={"refresh_interval": 3600, "usage_flush_interval": 3600},
        rpc={"probe_interval": 3600}, bundler={"enabled": False}, webhooks={"enabled": False},
    )
    body = Path(bodies).read_bytes().rstrip(b"\n")
    async with trio.open_nursery() as nursery:
        stack = await start_auth(nursery, twins.compiled(), settings)
        key, _ = await stack.key(plan="enterprise")
        port = stack.handle.gateway.port
        await _client(port, key, body, 60)
        tasks = stack.handle.gateway.front.dashboard_tasks
        if tasks is not None:
            await tasks.sampler.pruned.wait()
        client = await _started_client(port, key, count, 1, 10)
        await trio.sleep(0.5)
        started = trio.current_time()
        cg.cg_start()
        await client.stdin.send_all(body)
        await client.stdin.aclose()
        assert await client.wait() == 0
        cg.cg_stop(b"loaded")
        seconds = trio.current_time() - started
        cg.cg_start()
        await trio.sleep(seconds)
        cg.cg_stop(b"idle")
        nursery.cancel_scope.cancel()

trio.run(main, sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
"""
# The lane's compiled entry points (none calls another): name -> callgrind function.
ENTRIES = {
    "edge read + Lane.serve": "edgeloop_4Loop__poll",
    "upstream body": "fastlane_4Lane_release",
    "reply parse": "jsonrpc_3parse_response",
    "landing and answer": "fastlane_5Route_land_replies",
}


def say(text: str) -> None:
    print(text, flush=True)


def _annotate(path: Path) -> str:
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def _inclusive(text: str, function: str) -> int:
    for line in text.splitlines():
        if re.search(function + r" \[", line) and "=>" not in line:
            return int(line.split()[0].replace(",", ""))
    return 0


def _total(text: str) -> int:
    found = re.search(r"([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", text)
    return int(found.group(1).replace(",", "")) if found else 0


def measure(
    tree: Path, kind: str, bodies: Path, url: str, count: int, work: Path
) -> dict[str, float]:
    """One kind in one checkout: instructions per request (per batch), by part."""
    out = Path(tempfile.mkdtemp(prefix=f"cg-{kind}-", dir=work))  # one per tree (--compare)
    inner = out / "inner.py"
    inner.write_text(INNER)
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}:{tree}")
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={out / 'cg.%p'}", sys.executable, str(inner),
         str(work / "cgtoggle.so"), url, str(bodies), str(out), str(count)],
        cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    dumps = {}
    for path in out.glob("cg.*.*"):
        name = re.search(r"Trigger: Client Request: (\S+)", path.read_text(errors="replace"))
        if name:
            dumps[name.group(1)] = _annotate(path)
    loaded, idle = dumps["loaded"], dumps["idle"]
    parts = {name: _inclusive(loaded, fn) / count for name, fn in ENTRIES.items()}
    parts["lane"] = sum(parts.values())
    parts["process (loaded - idle)"] = (_total(loaded) - _total(idle)) / count
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kinds", default="balance,receipt,batch")
    parser.add_argument("--requests", type=int, default=1000, help="per kind (batches: /5)")
    parser.add_argument("--compare", type=Path, help="another checkout, measured first")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_annotate", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found")
    work = Path(tempfile.mkdtemp(prefix="chaingate-callgrind-"))
    subprocess.run(
        ["cc", "-O2", "-shared", "-fPIC", "-x", "c", "-", "-o", str(work / "cgtoggle.so")],
        input=TOGGLE_C.encode(), check=True,
    )  # fmt: skip
    anvil = AnvilProcess()
    anvil.start()
    try:
        manifest = bootstrap_devnet(anvil.url, paymaster_signer="0x" + "11" * 20, announce=say)
        chain = distinct.prepare(anvil.url, manifest, TRANSFERS, say)
        trees = ([args.compare] if args.compare else []) + [ROOT]
        report: dict[str, dict[str, dict[str, float]]] = {}
        for kind in args.kinds.split(","):
            bodies = work / f"{kind}.txt"
            lines = distinct.templates(chain, kind)
            rendered = [distinct.render(t, 1 + 100 * i).decode() for i, t in enumerate(lines)]
            bodies.write_text("\n".join(rendered) + "\n")
            count = args.requests // 5 if kind == "batch" else args.requests
            for tree in trees:
                parts = measure(tree, kind, bodies, anvil.url, count, work)
                report.setdefault(kind, {})[str(tree)] = parts
                per = "per batch of 20" if kind in PER else "per request"
                say(f"distinct-{kind} in {tree} ({per}): " + ", ".join(
                    f"{name} {value / 1000:.1f}k" for name, value in parts.items()))  # fmt: skip
        say(json.dumps(report))
    finally:
        anvil.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
