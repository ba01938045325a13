"""Exact amounts as decimal strings: raw token units, USD values.  Never a float.

A token amount is an integer of raw units scaled by ``10**decimals``; a USD price is an exact
``Decimal`` read from a feed (integer answer scaled by the feed's decimals).  Their product
is formatted exactly (a finite decimal always), trailing zeros trimmed, no exponent.
"""

from __future__ import annotations

from decimal import Decimal, localcontext

# Enough digits for uint256 times int256 with room: products are exact, never rounded.
_PRECISION = 200


def format_units(raw: int, decimals: int) -> str:
    """``raw / 10**decimals`` exactly: ``format_units(1500000, 6) == "1.5"``."""
    if decimals < 0:
        raise ValueError("decimals cannot be negative")
    sign = "-" if raw < 0 else ""
    whole, fraction = divmod(abs(raw), 10**decimals)
    if not fraction:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{fraction:0{decimals}d}".rstrip("0")


def scaled(answer: int, decimals: int) -> Decimal:
    """A feed's integer answer as an exact Decimal."""
    with localcontext(prec=_PRECISION):
        return Decimal(answer).scaleb(-decimals)


def format_decimal(value: Decimal) -> str:
    """Plain notation, trailing zeros trimmed: ``Decimal("1.50E+3")`` → ``"1500"``."""
    if not value.is_finite():
        raise ValueError("not a finite amount")
    with localcontext(prec=_PRECISION):
        text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def usd_value(raw: int, decimals: int, price: Decimal) -> str:
    """``raw / 10**decimals * price``, exact."""
    with localcontext(prec=_PRECISION):
        return format_decimal(Decimal(raw).scaleb(-decimals) * price)
