"""The benchmark suite runs end to end: ``python bench/run.py --smoke`` against real servers.

Needs nginx and wrk (``apt-get install -y nginx wrk``).  Without them the test is skipped
with a loud reason, except under ``CI=true``, where a missing tool is a broken CI image and
the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "bench" / "run.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 150  # the smoke run takes ~50 s; this only catches a hang
# Every identical-request scenario and one of real traffic (distinct-batch: all four kinds of
# distinct request, on the bootstrapped devnet), also paced at half its peak; the other distinct
# ones would only add minutes.
SCENARIOS = "block,block-nocoalesce,chainid,batch,call,paced,distinct-batch,paced-distinct-batch"

# (scenario label prefix, target) of every row the smoke report must hold.
EXPECTED_ROWS = {
    ("(a)", "chaingate"), ("(a)", "nginx"), ("(a)", "direct"),
    ("(a')", "chaingate"),
    ("(b)", "chaingate"), ("(b)", "nginx"), ("(b)", "direct"),
    ("(c)", "chaingate"), ("(c)", "nginx"), ("(c)", "direct"),
    ("(d)", "chaingate"), ("(d)", "nginx"), ("(d)", "direct"),
    ("(e)", "chaingate"), ("(e)", "nginx"), ("(e)", "direct"),
    ("(f6)", "chaingate"), ("(f6)", "nginx"), ("(f6)", "direct"),
    ("(e-f6)", "chaingate"), ("(e-f6)", "nginx"), ("(e-f6)", "direct"),
}  # fmt: skip
# The latency section's subsections: each paced scenario against its own peak.
PACED_PEAKS = {"(e)": "(a)", "(e-f6)": "(f6)"}


def _missing_tools() -> list[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return [tool for tool in ("nginx", "wrk") if shutil.which(tool, path=path) is None]


def _run_smoke(out: Path, scenarios: str = SCENARIOS) -> tuple[int, str, float]:
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, str(RUN), "--smoke", "--scenarios", scenarios, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # the bench stops its servers on SIGINT
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        pytest.fail(f"bench/run.py --smoke did not finish in {TIMEOUT}s:\n{output[-4000:]}")
    return process.returncode, output, time.monotonic() - started


def _result_rows(report: str) -> dict[tuple[str, str], dict[str, str]]:
    """{(scenario prefix, target): {column: cell}} from the report's Results table."""
    section = report.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = {}
    columns: list[str] = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not columns:
            columns = cells  # the header row names the columns
            continue
        if not cells[0].startswith("("):
            continue
        row = dict(zip(columns, cells, strict=True))
        rows[(row["scenario"].split(" ", 1)[0], row["target"])] = row
    return rows


def _need_tools() -> None:
    missing = _missing_tools()
    if missing:
        reason = (
            f"!!! BENCH NOT RUN: {' and '.join(missing)} missing; "
            "install with `apt-get install -y nginx wrk` !!!"
        )
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)


@pytest.mark.bench
def test_bench_smoke_run(tmp_path: Path) -> None:
    _need_tools()
    out = tmp_path / "r.md"
    code, output, elapsed = _run_smoke(out)
    assert code == 0, f"bench/run.py --smoke exited {code}:\n{output[-4000:]}"
    assert elapsed < TIMEOUT
    text = out.read_text()
    # The default is chaingate's production default: API keys on, wrk sending one.
    assert "| auth | **on**" in text, "the report does not record auth on (the default)"
    rows = _result_rows(text)
    missing_rows = EXPECTED_ROWS - rows.keys()
    assert not missing_rows, f"rows missing from the report: {sorted(missing_rows)}"
    for key in sorted(EXPECTED_ROWS):
        row = rows[key]
        assert float(row["req/s"]) > 0, f"{key}: zero req/s"
        assert row["errors"] == "0", f"{key}: errors {row['errors']}"
        assert float(row["server CPU µs/req"]) > 0, f"{key}: no CPU figure"
    _check_paced(text, rows)


def _check_paced(text: str, rows: dict[tuple[str, str], dict[str, str]]) -> None:
    """Each paced scenario has its subsection: a target of half its own peak's chaingate req/s
    (as printed, rounded), every target's achieved rate and p99, the p99 chaingate adds and, for
    reference, the p99 nginx adds at the same rate."""
    section = text.split("## Latency target", 1)[1].split("\n## ", 1)[0]
    parts = {part.split(" ", 1)[0]: part for part in section.split("\n### ")[1:]}
    assert parts.keys() == PACED_PEAKS.keys(), f"paced subsections: {sorted(parts)}"
    for prefix, peak in PACED_PEAKS.items():
        part = parts[prefix]
        target = float(part.split("Target rate: ", 1)[1].split(" ", 1)[0])
        assert f"of chaingate's {peak} " in part, part
        assert abs(target - float(rows[(peak, "chaingate")]["req/s"]) / 2) <= 1, part
        for who in ("chaingate", "nginx", "direct"):
            line = next(ln for ln in part.splitlines() if ln.startswith(f"| {who} |"))
            assert line.split("|")[6].strip() == rows[(prefix, who)]["p99 ms"], line
        assert "**p99 added latency: " in part, part
        printed = float(part.split("p99 added at the same rate by nginx ", 1)[1].split(" ")[0])
        nginx = float(rows[(prefix, "nginx")]["p99 ms"]) - float(rows[(prefix, "direct")]["p99 ms"])
        assert abs(printed - nginx) < 0.0015, part  # each p99 printed rounded


SOLANA_ROWS = {
    (scenario, target)
    for scenario in ("(s1)", "(s2)", "(s3)")
    for target in ("chaingate", "nginx", "direct")
}


@pytest.mark.bench
def test_bench_smoke_solana_scenarios(tmp_path: Path) -> None:
    """The Solana scenarios alone: their own node, chaingate and nginx; the finalized getBlock
    answered from chaingate's cache, getSlot coalesced."""
    _need_tools()
    out = tmp_path / "r.md"
    code, output, elapsed = _run_smoke(out, "solana-slot,solana-balance,solana-block")
    assert code == 0, f"bench/run.py --smoke exited {code}:\n{output[-4000:]}"
    text = out.read_text()
    rows = _result_rows(text)
    assert rows.keys() >= SOLANA_ROWS, f"rows missing: {sorted(SOLANA_ROWS - rows.keys())}"
    assert not any(key[0].startswith("(a") for key in rows)  # no EVM scenario was asked for
    for key in sorted(SOLANA_ROWS):
        assert float(rows[key]["req/s"]) > 0 and rows[key]["errors"] == "0", (key, rows[key])
    assert "| solana | the devnet's Solana node" in text
    traffic = text.split("per measured run", 1)[1].split("\n## ", 1)[0]
    block = next(line for line in traffic.splitlines() if line.startswith("| (s3)"))
    requests, cache_hits = block.split("|")[2], block.split("|")[-2]
    assert int(cache_hits) > 0 and int(cache_hits) >= int(requests) - 1, block
