"""The indexer backfill benchmark runs end to end (``bench/indexer_backfill.py --smoke``).

The smoke size only proves the harness works (devnet, history, the reference, both stores,
the report and its cross-checks of logs, transfer rows and holders); the real figures come
from a full run, reported by hand in docs/decisions/chain.md ("Backfill").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import PG_URL, _require_pg

ROOT = Path(__file__).resolve().parents[1]


def test_indexer_backfill_bench_smoke() -> None:
    _require_pg()  # the bench measures PostgreSQL too (skipped loudly when absent, not in CI)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "indexer_backfill.py"),
            "--smoke",
            "--pg-url",
            PG_URL,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| reference (raw fetch) |" in result.stdout
    assert "| chaingate → PostgreSQL |" in result.stdout
    assert "| chaingate → SQLite |" in result.stdout
    assert "MISMATCH" not in result.stderr
