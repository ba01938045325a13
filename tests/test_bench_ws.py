"""The WebSocket fan-out benchmark runs end to end (``bench/ws_fanout.py --smoke``).

50 subscribers and 3 blocks only prove the harness (a real chaingate process, the upgrade with
an API key, delivery of every head, the RSS and /metrics readings); the figures for 1,000
subscribers come from a full run, reported by hand (docs/decisions/ws.md, WebSocket).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ws_fanout_bench_smoke() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ws_fanout.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| delivery delay p99 |" in result.stdout
    assert "| pushes lost | 0 | 0 |" in result.stdout


def test_ws_solana_fanout_bench_smoke() -> None:
    """``bench/ws_solana_fanout.py --smoke``: 50 slotSubscribe clients through chaingate on one
    upstream subscription, every slot the node-direct reference heard delivered; with HTTP
    clients loading the same process meanwhile (the bench fails if none was answered)."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ws_solana_fanout.py"),
            "--smoke",
            "--http-load",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| push delay p99 |" in result.stdout
    assert "| notifications lost | 0 | 0 |" in result.stdout
    assert "| upstream subscriptions for 50 clients | 1 | 1 |" in result.stdout
    assert "2 HTTP clients loading it meanwhile" in result.stdout
