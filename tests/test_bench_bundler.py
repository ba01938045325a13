"""The bundler benchmark runs end to end against Alto (``bench/bundler.py --smoke``).

A few operations per EntryPoint version and target: proves the harness (anvil bootstrapped as
the devnet, Alto from npm in unsafe and safe mode on it, SimpleAccounts deployed and funded,
signed operations built in Python, concurrent eth_sendUserOperation, receipts polled, the
report).  Figures are checked for form, never against a target.  Alto's safe mode may refuse
its probe operation (it does on anvil 1.7.1: docs/decisions/bundler.md, "ERC-7562
tracing"); the report must then say so.  Needs Node and npm (Alto installs from npm on
first use): without them the test is skipped loudly, except under ``CI=true``.
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
BENCH = ROOT / "bench" / "bundler.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 600  # the smoke run takes ~10 s once Alto is installed; this only catches a hang
OPS = 4  # --smoke's throughput load per target and version
LATENCY_OPS = 2


def _alto_or_skip() -> None:
    """Alto installed (from npm on first use), or a loud skip when it cannot be."""
    reason = None
    if shutil.which("node") is None or shutil.which("npm") is None:
        reason = "Node.js/npm missing"
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        try:
            from benchkit import alto

            alto.install(announce=False)
        except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
            reason = f"Alto could not be installed from npm ({exc})"
        finally:
            sys.path.remove(str(ROOT / "bench"))
    if reason is None:
        return
    reason = f"!!! BUNDLER BENCH NOT RUN: {reason} !!!"
    if IN_CI:
        pytest.fail(reason + " (CI=true: the registry or Node missing is a broken CI image)")
    pytest.skip(reason)


@pytest.mark.bench
def test_bundler_bench_smoke_against_alto(tmp_path: Path) -> None:
    _alto_or_skip()
    out = tmp_path / "bundler.md"
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
        pytest.fail(f"bench/bundler.py --smoke did not finish in {TIMEOUT}s: {exc}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = out.read_text()
    assert text in done.stdout  # printed as written

    rows = report_table(text, "## Accepted operations per second")
    assert [(row["target"], row["EntryPoint"]) for row in rows] == [
        ("alto-unsafe", "v0.6"),
        ("alto-unsafe", "v0.7"),
        ("alto-unsafe", "v0.8"),
        ("alto-safe", "v0.6"),
        ("alto-safe", "v0.7"),
        ("alto-safe", "v0.8"),
    ]
    for row in rows:
        if row["refused"].startswith("probe refused"):
            # Only Alto's safe mode may refuse, and then nothing else is measured.
            assert row["target"] == "alto-safe", row
            assert (row["accepted"], row["accepted ops/s"]) == ("0", "n/a"), row
            continue
        assert (row["sent"], row["accepted"], row["refused"]) == (str(OPS), str(OPS), "-"), row
        assert float(row["accepted ops/s"]) > 0, row
        assert 0 < float(row["answer p50 ms"]) <= float(row["answer p99 ms"]), row
        assert float(row["server CPU ms/op"]) >= 0, row
        # Every accepted operation, the probe's too, reached a successful receipt.
        assert (row["included"], row["failed receipts"]) == (str(OPS + 1), "0"), row
        assert float(row["last receipt after s"]) >= 0, row
    assert any(row["target"] == "alto-unsafe" for row in rows)

    latency = report_table(text, "## Submit-to-receipt latency")
    measured = [(r["target"], r["EntryPoint"]) for r in rows if r["accepted"] != "0"]
    assert [(row["target"], row["EntryPoint"]) for row in latency] == measured
    for row in latency:
        assert row["samples"] == str(LATENCY_OPS), row
        assert 0 < float(row["p50 ms"]) <= float(row["p99 ms"]) <= float(row["max ms"]), row
        assert (row["refused"], row["no receipt"]) == ("0", "0"), row
    assert "## Ratios chaingate/Alto" in text
    assert re.search(r"\| Alto \| @pimlico/alto \d+\.\d+\.\d+ ", text)
