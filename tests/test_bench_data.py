"""The REST data-plane benchmark runs end to end (``bench/data_plane.py --smoke``).

50 token contracts, 1 s runs at 1 and 10 connections: proves the harness (devnet, the tokens,
a real chaingate process with follower, indexer and metadata, the key, wrk's GET and POST
loads, the report).  Figures are checked for form (numbers, no errors), never against the
target: the real ones come from a full run, reported by hand.  Needs wrk; without it the
test is skipped loudly, except under ``CI=true``.  The py-spy profile is not run here (py-spy
is no dependency); its parser is checked on a recorded sample instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "data_plane.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 240  # the smoke run takes ~25 s; this only catches a hang

sys.path.insert(0, str(ROOT / "bench"))
from benchkit import pyspy  # noqa: E402


def report_table(report: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first table after ``heading``, as {column: cell}."""
    section = report.split(heading, 1)[1].split("\n## ", 1)[0]
    rows: list[dict[str, str]] = []
    columns: list[str] = []
    for line in section.splitlines():
        if not line.startswith("|"):
            if columns and rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not columns:
            columns = cells
        elif not set(line) <= set("|-: "):
            rows.append(dict(zip(columns, cells, strict=True)))
    return rows


@pytest.mark.bench
def test_data_plane_bench_smoke(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        reason = "!!! BENCH NOT RUN: wrk missing; install with `apt-get install -y wrk` !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)
    out = tmp_path / "data.md"
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH), "--smoke", "--profile", "off", "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench/data_plane.py --smoke did not finish in {TIMEOUT}s: {exc}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = out.read_text()
    assert text in done.stdout  # printed as written

    balances = report_table(text, "## Token balances")
    assert [row["connections"] for row in balances] == ["1", "10"]
    for row in balances:
        assert float(row["req/s"]) > 0, row
        assert 0 < float(row["p50 ms"]) <= float(row["p99 ms"]), row
        assert float(row["KiB/response"]) > 1, row  # 55 balances with their metadata
        assert float(row["event loop CPU µs/req"]) > 0, row
        assert float(row["other threads CPU µs/req"]) >= 0, row
        assert float(row["busy after stop s"]) >= 0, row
        assert row["errors"] == "0", row
    assert re.search(
        r"\*\*p99 at 10 connections: [\d.]+ ms; target <= 20 ms: (MET|NOT MET)\*\*", text
    )

    planes = report_table(text, "## The REST plane's cost")
    assert [row["request"].split()[0] for row in planes] == ["metadata", "eth_chainId"]
    for row in planes:
        assert float(row["req/s"]) > 0, row
        assert float(row["event loop CPU µs/req"]) > 0, row
        assert row["errors"] == "0", row
    ratio = re.search(r"\*\*req/s REST/RPC: ([\d.]+)\*\*", text)
    assert ratio is not None and float(ratio.group(1)) > 0
    assert re.search(r"holder 0x[0-9a-fA-F]{40}: \d+ balances in the index \(50 bench", text)


# Three samples as py-spy's raw format writes them (paths relative to sys.path entries).
RAW = """\
<module> (chaingate:6);main (chaingate/cli.py:538);cmd_serve (chaingate/cli.py:376);\
run (trio/_core/_run.py:2532);view (chaingate/api/app.py:71);\
get_balances (chaingate/api/tokens.py:111);of (chaingate/api/types.py:49);\
checksum_address (chaingate/evm/addresses.py:27);new (Crypto/Hash/keccak.py:81) 6
<module> (chaingate:6);main (chaingate/cli.py:538);cmd_serve (chaingate/cli.py:376);\
run (trio/_core/_run.py:2532);handle_request (quart_trio/asgi.py:45);\
match (werkzeug/routing/map.py:605) 3
Thread._bootstrap (threading.py:1002);WorkerThread._work (trio/_core/_thread_cache.py:213);\
_run_sync (chaingate/store/sqlite.py:114);query (chaingate/store/sqlite.py:57) 1
"""


def test_pyspy_profile_parts() -> None:
    profile = pyspy.parse_collapsed(RAW)
    assert profile.samples == 10
    assert profile.main_thread == 9  # the worker thread's sample is only counted
    assert profile.by_category == {
        "EIP-55 checksums (keccak), wherever called": 6,
        "Quart/ASGI (quart, hypercorn, werkzeug, the ASGI bridge)": 3,
    }
    assert profile.self_time["new (Crypto/Hash/keccak.py)"] == 6
    assert profile.inclusive["get_balances (chaingate/api/tokens.py)"] == 6
    assert not any("cli.py" in name or "sqlite" in name for name in profile.inclusive)
    profile.label, profile.rate = "balances", 200
    profile.main_cpu_us, profile.others_cpu_us = 900.0, 50.0
    section = "\n".join(pyspy.render(profile))
    assert "| EIP-55 checksums (keccak), wherever called | 66.7% | 600 |" in section
    assert "| **event loop's thread, total** | 100% | **900** |" in section
    assert "from /proc | | 50 |" in section
