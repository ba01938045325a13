"""The hot path's budget, counted rather than timed (see tests/hot_path_probe.py, which counts
in a process of its own): Python-level calls and system calls per request through the compiled
edge, with API keys on, one request at a time on one connection — and ten pipelined; for
distinct requests (no two alike: balances, eth_getLogs ranges) also one at a time on each of
ten connections, and per call of distinct batches (one at a time, and one at a time on each of
ten connections).

A budget is raised only on purpose, with the reason in the commit that raises it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chaingate import twins as impl_module
from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import IN_CI

ROOT = Path(__file__).resolve().parents[1]
# Counted by itself: another test process's load moves the counts (tests/conftest.py).
pytestmark = pytest.mark.alone

# (Python calls, system calls) per request.  Measured when set (2026-11-26): chainid 56 / 5.1,
# chainid-pipelined 7 / 0.56, block 177 / 10.1, batch 264 / 10.0.  The edge before the native
# loop, measured the same way: 119 / 4.1, 64 / 1.4, 283 / 9.1, 751 / 9.1.  (One request at a
# time on one connection, the loop pays one more epoll_wait and trio's re-arming of it per
# turn; answers that wait together leave in one send.  An upstream read asks for a quick ACK,
# one setsockopt: see netio.quick_ack.)
# Distinct requests (issue 38: no two alike, so neither the cache nor a flight in the air can
# answer them; eth_getBalance of another address at "latest" each time), before and after
# issue 38's lane work (2026-12-07): distinct (one at a time) 170.7 / 10.05 -> 165-169 / 10.05
# per request; distinct-parallel (one request at a time on each of ten connections, sent
# together) 75.4 / 3.75 -> 19.8-23.2 / 3.0 (the lane sends a readiness's calls upstream
# together, Lane.hold); distinct-batch 12.6 / 0.51 -> 8.5 / 0.51 per call of a batch of 20
# (replies land in the lane, Route.land_replies).  Batches (issue 38, batch round, same day):
# distinct-batch 8.4 / 0.50 per call (one batch at a time: the same exchange per batch);
# distinct-batch-parallel (ten batches of 20 at once on ten connections) 3.3 / 0.20 -> 1.6-1.8
# / 0.17-0.19 per call (a readiness's batches share upstream batches, Lane.hold); 2.2 / 0.205
# once the read groups spread over the upstream's connections (smaller groups).  Lowered
# after the read groups spread over the upstream's connections (2026-12-07, four runs):
# distinct 161.8-169.6 / 9.86-10.05, distinct-parallel 20.1-21.0 / 3.01-3.06 (its syscalls
# stay at 3.3: how many requests one readiness holds depends on the machine's load, and a
# loaded run measured 3.17).  Lowered after the receipt round (2026-12-07, main and the branch
# in turn on the same loaded machine; the branch twice): distinct 170.3 -> 167.6 / 10.05-10.06,
# distinct-parallel 23.6 -> 18.5-19.7 / 3.15 -> 3.01-3.06, chainid 55.8 -> 54.3-55.4,
# chainid-pipelined 7.2 -> 5.2-6.3 (the access-log line no longer a Python call), and
# distinct-batch-parallel 1.8 -> 1.5-1.6 / 0.19 -> 0.18 (distinct-batch 8.6 -> 8.4-8.5: kept).
# eth_getLogs of a range the lane reads, no two alike (2026-12-07, the logs round, loaded
# machine): distinct-logs 167.0-173.7 / 10.0-10.04 (main 171.3 / 10.02), distinct-logs-parallel
# 18.6-25.0 / 3.01-3.26 (main 18.7-20.1 / 3.02-3.05): the logs round's cuts are in compiled
# code, which these do not count (bench/lane_callgrind.py does).
# Lowered after the upstream exchange round (2026-12-08, main and the branch in turn, twice, on
# a loaded machine): the first attempt of a group settled by the connection's reader (no
# Future, no callbacks), trio's clock read as offset + perf_counter, a shorter await chain
# under the upstream reader: distinct 166.7-173.1 -> 142.3-142.4, distinct-parallel 18.3-21.1
# -> 16.0-17.4, distinct-logs 173.5-174.4 -> 142.9-143.4, distinct-logs-parallel 20.1-22.3 ->
# 16.7-19.1, distinct-batch 8.32-8.78 -> 6.84-7.32 and distinct-batch-parallel 1.46-1.62 ->
# 1.09-1.41 (five runs each), block 182.6-183.9 -> 152.1-153.0, batch 182.6-182.9 ->
# 151.5-151.8 (both through the lane by now); system calls as before.
BUDGETS = {
    "chainid": (62, 5.6),
    "distinct": (148, 10.2),
    "distinct-parallel": (19, 3.3),
    "distinct-logs": (150, 10.3),
    "distinct-logs-parallel": (20, 3.3),
    "distinct-batch": (7.6, 0.53),
    "distinct-batch-parallel": (1.8, 0.22),
    "chainid-pipelined": (8, 0.7),
    "block": (165, 11.0),
    "batch": (165, 11.0),
}


@pytest.fixture
def strace() -> None:
    try:
        impl_module.compiled()
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("compiled modules not built (run `pip install -e .`)")
    if shutil.which("strace") is None:
        if IN_CI:
            pytest.fail("strace is missing (CI installs it: .ci/run)")
        pytest.skip("strace not installed (apt-get install strace)")


@pytest.mark.parametrize("kind", sorted(BUDGETS))
@pytest.mark.usefixtures("strace")
def test_the_hot_path_stays_within_its_budget(
    anvil: AnvilProcess, tmp_path: Path, kind: str
) -> None:
    calls, syscalls = BUDGETS[kind]
    # A busy machine adds work to a count, never takes it away: the parallel kinds count what
    # requests sent together cost when they arrive together, and how many one readiness holds
    # depends on the scheduler (a stall splits them: a loaded run measured 29.5 / 3.46 where a
    # quiet one measures 21-23 / 3.0), and one request at a time moves too (distinct measured
    # 172.1-172.4 on a machine at load 2-10, 161.8-169.6 on quieter ones, the same build).
    # Extra work per request raises every measurement, the machine only some: a kind is
    # judged by the lowest of up to three.
    attempts = 3
    for attempt in range(attempts):
        counts = _probe(anvil, tmp_path / str(attempt), kind)
        if counts["calls"] <= calls and counts["syscalls"] <= syscalls:
            break
    print(f"{kind}: {counts['calls']:.1f} Python calls, {counts['syscalls']:.2f} system calls")
    assert counts["calls"] <= calls, (kind, counts)
    assert counts["syscalls"] <= syscalls, (kind, counts)


def _probe(anvil: AnvilProcess, out: Path, kind: str) -> dict[str, float]:
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.hot_path_probe", anvil.url, kind, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return counts
