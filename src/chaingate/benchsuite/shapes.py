"""Load shapes over a run: steady, step and spike (locust ``LoadTestShape``s).

Users are given per user class (one class per target); every class gets the same number at
every moment (equal weights, and the total is always a multiple of the number of classes).
"""

from __future__ import annotations

from locust import LoadTestShape

from chaingate.benchsuite.plan import SHAPES, users_at


def shape_class(shape: str, duration: float, users: int, steps: int, classes: int) -> type:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")

    class Shape(LoadTestShape):
        def tick(self) -> tuple[int, float] | None:
            elapsed = self.get_run_time()
            if elapsed >= duration:
                return None
            total = users_at(shape, elapsed, duration, users, steps) * classes
            # Spawn within ~0.1 s, at most 100 users a second (locust's own advice).
            return total, float(min(max(total, 1) * 10, 100))

    Shape.__name__ = f"{shape.title()}Shape"
    return Shape
