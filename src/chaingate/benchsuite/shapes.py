"""Load shapes over a run: steady, step and spike (locust ``LoadTestShape``s).

Users are given per target; every target gets the same number at every moment (the user
classes have equal weights and the total is always a multiple of the number of targets).
"""

from __future__ import annotations

from locust import LoadTestShape

from chaingate.benchsuite.plan import SHAPES, users_at


def shape_class(shape: str, duration: float, users: int, steps: int, targets: int) -> type:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")

    class Shape(LoadTestShape):
        def tick(self) -> tuple[int, float] | None:
            elapsed = self.get_run_time()
            if elapsed >= duration:
                return None
            total = users_at(shape, elapsed, duration, users, steps) * targets
            # Spawn within ~0.1 s, at most 100 users a second (locust's own advice).
            return total, float(min(max(total, 1) * 10, 100))

    Shape.__name__ = f"{shape.title()}Shape"
    return Shape
