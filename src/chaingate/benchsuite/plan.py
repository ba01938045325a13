"""What one ``chaingate bench`` process is asked to do (plain data, no locust)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaingate.benchsuite.targets import Target, mask

SHAPES = ("steady", "step", "spike")


class BenchError(Exception):
    """A run that cannot start: bad arguments, a target that cannot be asked (exit 2)."""


MODES = ("local", "master", "worker")


@dataclass
class Plan:
    scenario: str
    targets: list[Target]
    users: int  # per target (the peak, for step and spike)
    duration: float
    shape: str = "steady"
    steps: int = 4
    key: str | None = None
    timeout: float = 10.0  # per request
    out: Path = Path("bench-results")
    mode: str = "local"
    workers: int = 0  # local worker processes (mode local with workers > 0 runs a master)
    expect_workers: int = 0  # --master: workers to wait for
    master_host: str = "127.0.0.1"
    master_port: int = 5557
    bind_host: str = "*"
    argv: list[str] = field(default_factory=list)  # this command's own arguments
    options: dict[str, Any] = field(default_factory=dict)  # the scenario's own

    def key_headers(self) -> dict[str, str]:
        return {"X-API-Key": self.key} if self.key else {}

    def settings(self) -> dict[str, Any]:
        """The run's settings as the report's header shows them (no key)."""
        shown: dict[str, Any] = {
            "users per target": self.users,
            "duration": f"{self.duration:g} s",
            "shape": self.shape + (f" ({self.steps} steps)" if self.shape == "step" else ""),
            "API key": "X-API-Key header" if self.key else "none (or in the URL)",
            "request timeout": f"{self.timeout:g} s",
            "load processes": (
                f"master + {self.workers or self.expect_workers} workers"
                if self.workers or self.mode == "master"
                else "1"
            ),
        }
        # A URL among the options may carry a key: shown masked, as targets are.
        shown.update({k: mask(v) if "://" in str(v) else v for k, v in self.options.items()})
        return shown


def users_at(shape: str, elapsed: float, duration: float, users: int, steps: int) -> int:
    """Users per target ``elapsed`` seconds into a run of ``duration`` seconds."""
    if shape == "step":
        step = min(int(elapsed / (duration / steps)), steps - 1)
        return max(1, math.ceil(users * (step + 1) / steps))
    if shape == "spike":  # a base load, five times more in the middle fifth, the base again
        base = max(1, users // 5)
        return users if 0.4 * duration <= elapsed < 0.6 * duration else base
    return users
