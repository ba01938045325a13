"""What counts as printable text, one rule for every place that shows or stores a name.

Unprintable: Unicode's "other" characters (category C) — controls (NUL, ESC, line breaks),
format characters (bidirectional overrides that reorder what a reader sees), surrogates,
private-use and unassigned code points.  Text from a chain (token names, NFT documents) has
them removed (``chaingate.metadata``); a name a client sends with one is refused
(``chaingate.api``): a client's mistake is answered, never repaired behind its back.
"""

from __future__ import annotations

import unicodedata


def unprintable(char: str) -> bool:
    return unicodedata.category(char)[0] == "C"


def first_unprintable(text: str) -> str | None:
    """The first unprintable character of ``text``, or None."""
    return next((c for c in text if unprintable(c)), None)
