"""The follower backfill benchmark runs end to end (``bench/follower_backfill.py --smoke``).

The smoke size only proves the harness works (devnet, history, both readers, the report and
its block/log cross-check); the real figures come from a full run, reported by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_follower_backfill_bench_smoke() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "follower_backfill.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| chaingate follower |" in result.stdout
    assert "| reference (raw fetch) |" in result.stdout
    assert "chaingate / reference throughput:" in result.stdout
