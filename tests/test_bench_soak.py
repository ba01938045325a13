"""The soak bench runs end to end for 40 seconds (``bench/soak.py``), so it cannot rot.

Only the harness is checked — every kind of traffic flowed, the samples and both verdicts are
in the report, the chart is drawn, and the server's descriptors came back to their baseline
once the traffic stopped.  Whether the RSS stays flat is the 30-minute run's question (40
seconds are all warm-up), reported by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("proxy", "batch", "rest", "ws", "webhooks", "refused", "malformed")


def test_soak_bench_runs_and_descriptors_come_back(tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    argv = [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "0.67"]
    result = subprocess.run(
        [*argv, "--sample-every", "4", "--settle", "150", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    phases = [sample["phase"] for sample in data["samples"]]
    assert phases[0] == "before" and phases[-1] == "settle"
    assert phases.count("traffic") >= 8
    assert all(sample["rss_mib"] > 0 and sample["fds"] > 0 for sample in data["samples"])
    for kind in KINDS:
        assert sum(data["traffic"][kind].values()) > 0, kind
    refused = data["traffic"]["refused"]
    assert refused.get("401", 0) > 0 and refused.get("429", 0) > 0
    assert data["traffic"]["rest"].get("unknown 404", 0) > 0
    assert data["traffic"]["ws"].get("dropped", 0) + data["traffic"]["ws"].get("unsubscribed", 0)
    assert data["deliveries"] > 0  # webhooks reached the receiver
    fds = data["verdicts"]["fds"]
    assert fds["ok"], fds  # back to the baseline once the traffic stopped
    assert set(data["verdicts"]["flat"]) >= {"ok"}
    report = out.read_text()
    assert "| flat after warm-up" in report and "| descriptors back to baseline" in report
    assert "<svg" in report and "## Traffic" in report
