"""The numeric options' value types: argparse refuses a bad value naming its option, before
anything runs.

``float()`` takes ``nan`` and ``inf``: a run of ``--duration nan`` would never end (no
comparison with NaN is true) and ``--timeout nan`` would fail only at the first request.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _bounded(
    kind: type[N], low: N, high: N | None = None, *, above: bool = False
) -> Callable[[str], N]:
    """A finite ``kind`` from ``low`` (``above``: excluded) to ``high`` (included)."""
    noun = "a whole number" if kind is int else "a number"
    if high is not None:
        rule = f"from {low:g} to {high:g}"
    else:
        rule = f"above {low:g}" if above else f"{low:g} or more"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, not {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, not {text!r}")
        if value < low or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {rule}, not {text!r}")
        return value

    return parse


positive_float = _bounded(float, 0.0, above=True)
non_negative_float = _bounded(float, 0.0)
positive_int = _bounded(int, 1)
non_negative_int = _bounded(int, 0)
port = _bounded(int, 1, 65535)
