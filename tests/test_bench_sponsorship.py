"""The gas sponsorship benchmark runs end to end (``bench/sponsorship.py --smoke``).

1 s runs at 1 and 10 connections: proves the harness (the devnet with a run's own paymaster
signer, a real chaingate process with the follower and the paymaster key, a wallet, a policy,
one sponsorship whose signature is recovered, wrk's POST and GET loads, the report).  Figures
are checked for form (numbers, no errors), never against a target: the real ones come from a
full run, reported by hand.  Needs wrk; without it the test is skipped loudly, except under
``CI=true``.
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
BENCH = ROOT / "bench" / "sponsorship.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 240  # the smoke run takes ~15 s; this only catches a hang
NUMBER = re.compile(r"\d+(\.\d+)?")


@pytest.mark.bench
def test_sponsorship_bench_smoke(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        reason = "!!! BENCH NOT RUN: wrk missing; install with `apt-get install -y wrk` !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)
    out = tmp_path / "sponsorship.md"
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
        pytest.fail(f"bench/sponsorship.py --smoke did not finish in {TIMEOUT}s: {exc}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = out.read_text()
    assert text in done.stdout  # printed as written
    assert "signature recovered to the signer" in done.stdout

    runs = report_table(text, "## Sponsorship beside a cached GET")
    assert [(row["request"], row["connections"]) for row in runs] == [
        ("sponsor", "1"),
        ("cached GET", "1"),
        ("sponsor", "10"),
        ("cached GET", "10"),
    ]
    for row in runs:
        assert float(row["req/s"]) > 0, row
        assert 0 < float(row["p50 ms"]) <= float(row["p90 ms"]) <= float(row["p99 ms"]), row
        assert float(row["p99 ms"]) <= float(row["max ms"]), row
        assert float(row["event loop CPU µs/req"]) > 0, row
        assert float(row["other threads CPU µs/req"]) >= 0, row
        assert float(row["CPU µs/req"]) >= float(row["event loop CPU µs/req"]), row
        assert float(row["busy after stop s"]) >= 0, row
        assert int(row["upstream requests"]) >= 0, row
        assert row["errors"] == "0", row
        if row["request"] == "sponsor":
            # Every answered sponsorship reserved its row (and the checked one came first).
            assert int(row["store rows before"]) >= 1, row
            assert int(row["rows added"]) >= 1, row
        else:
            assert (row["store rows before"], row["rows added"]) == ("-", "-"), row

    ratios = report_table(text, "## Ratios sponsor/GET")
    assert [row["connections"] for row in ratios] == ["1", "10"]
    for row in ratios:
        for column in (
            "req/s sponsor/GET",
            "CPU per request sponsor/GET",
            "event loop CPU per request sponsor/GET",
        ):
            assert NUMBER.fullmatch(row[column]) and float(row[column]) > 0, row
    assert re.search(
        r"\*\*sponsor at 10 connections: \d+ req/s, p99 [\d.]+ ms, \d+ µs of chaingate CPU "
        r"per request\*\*",
        text,
    )
    assert re.search(r"\| how measured \| wrk -t1 at 1, 10 connection\(s\)", text)
