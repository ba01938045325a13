"""The numeric options' value types: argparse refuses a bad value naming its option, before
anything runs.

``float()`` takes ``nan`` and ``inf``: a run of ``--duration nan`` would never end (no
comparison with NaN is true) and ``--timeout nan`` would fail only at the first request.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, not {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, not {text!r}")
    return value


def positive_float(text: str) -> float:
    value = float(_number(text, float))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = float(_number(text, float))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text!r}")
    return value


def port(text: str) -> int:
    value = int(_number(text, int))
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1 to 65535, not {text!r}")
    return value
