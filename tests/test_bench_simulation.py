"""The simulation benchmark runs end to end (``bench/simulation.py --smoke``).

1 s runs at 1 connection: proves the harness (the devnet, a real chaingate process with the
follower and indexer, a checked simulation carrying the token's facts, wrk's two loads, the
report and its ratios).  Figures are checked for form (numbers, no errors), never against the
target: the real ones come from a full run, reported by hand.  Needs wrk; without it the test
is skipped loudly, except under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bench_data import report_table

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "simulation.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 240  # the smoke run takes ~25 s; this only catches a hang
NUMBER = re.compile(r"\d+(\.\d+)?")


@pytest.mark.bench
def test_simulation_bench_smoke(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        reason = "!!! BENCH NOT RUN: wrk missing; install with `apt-get install -y wrk` !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)
    out = tmp_path / "simulation.md"
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench/simulation.py --smoke did not finish in {TIMEOUT}s: {exc}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = out.read_text()
    assert text in done.stdout  # printed as written
    assert "answered by **simulate_v1**" in text  # anvil has eth_simulateV1: auto picks it
    runs = report_table(text, "## A token transfer's simulation")
    assert [(row["request"], row["connections"]) for row in runs] == [
        ("eth_call", "1"),
        ("simulate", "1"),
    ]
    for row in runs:
        assert float(row["req/s"]) > 0, row
        assert 0 < float(row["p50 ms"]) <= float(row["p90 ms"]) <= float(row["p99 ms"]), row
        assert float(row["chaingate CPU µs/req"]) > 0, row
        assert row["errors"] == "0", row
    (ratios,) = report_table(text, "## Ratios simulate/eth_call")
    for column in ("p99", "req/s", "CPU per request"):
        assert NUMBER.fullmatch(ratios[column]), ratios
    assert NUMBER.fullmatch(ratios["p50"].removeprefix("⚠ ")), ratios
