"""What counts as printable text, one rule for every place that shows or stores a name.

Unprintable: Unicode's "other" characters (category C) — controls (NUL, ESC, line breaks),
format characters (bidirectional overrides that reorder what a reader sees), surrogates,
private-use and unassigned code points.  Text from a chain (token names, NFT documents) has
them removed (``chaingate.metadata``); a name a client sends with one is refused
(``chaingate.api``): a client's mistake is answered, never repaired behind its back.

A URL holds neither those nor a space of any kind (Unicode's "separator" characters, Z):
with them a URL can display as another (``/<U+202E>gnp.exe`` reads ``/exe.png``); webhook
URLs with one are refused, and one stored before that rule is shown with each marked.
"""

from __future__ import annotations

import unicodedata


def unprintable(char: str) -> bool:
    return unicodedata.category(char)[0] == "C"


def first_unprintable(text: str) -> str | None:
    """The first unprintable character of ``text``, or None."""
    return next((c for c in text if unprintable(c)), None)


def hidden_in_url(char: str) -> bool:
    """Unprintable, or a space: what a URL never holds (see above)."""
    return unicodedata.category(char)[0] in "CZ"


def first_hidden_in_url(url: str) -> str | None:
    return next((c for c in url if hidden_in_url(c)), None)


def code_point(char: str) -> str:
    """``U+202E (RIGHT-TO-LEFT OVERRIDE)``: a character named without showing it."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" ({name})" if name else "")


def url_shown(url: str) -> str:
    """``url`` as plain text with each hidden character named: ``/<U+202E (...)>gnp.exe``."""
    return "".join(f"<{code_point(c)}>" if hidden_in_url(c) else c for c in url)
