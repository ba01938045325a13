"""How a JSON text is built, read with bytes operations only: before any decoder recurses.

A decoder that recurses per nesting level (msgspec, the stdlib) fails with ``RecursionError``
on a document nested a few thousand deep, which a 1 MiB body can hold many times over.  The
JSON-RPC framing refuses nesting deeper than ``MAX_JSON_DEPTH`` (128) as it scans; here is the
same rule for the paths that hand a body to a decoder (the WebSocket's calls, REST bodies),
checked first.  Only C-level bytes operations: a hostile 1 MiB text costs tens of
milliseconds, an ordinary one nothing.
"""

from __future__ import annotations

from itertools import accumulate, chain, repeat
from operator import sub

from chaingate.framing_constants import MAX_JSON_DEPTH

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_PASSES = 3


def outside_strings(text: bytes) -> bytes:
    """The bytes of a JSON text that are not inside its strings (quotes dropped too).
    Exact for valid JSON; for invalid JSON, exact up to the first error a decoder reports."""
    # Escapes out (a backslash always starts one), then every quote delimits a string.
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2])


def too_deep(message: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Is ``message`` nested deeper than ``limit``?  The framing's rule: a decoder never
    recurses deeper than ``limit`` on a text this says False for (for a valid text the answer
    is exact; an invalid one may be called too deep where a decoder would stop earlier)."""
    if message.count(b"[") + message.count(b"{") <= limit:
        return False  # the usual case: too few brackets to be that deep
    brackets = outside_strings(message).translate(_ONE_KIND, _NOT_BRACKETS)
    # A few passes take the innermost pairs out, one level each: many short branches go.
    for _ in range(_PASSES):
        brackets = brackets.replace(b"[]", b"")
    if len(brackets) <= 2 * (limit - _PASSES):
        return False  # not even enough brackets left for one chain that deep
    # Then runs: each piece between two "][" is some "[" then some "]"; the nesting after a
    # piece's "[" is the "[" so far minus the "]" before it (the split's own brackets cancel).
    pieces = brackets.split(b"][")
    opens = list(map(bytes.count, pieces, repeat(b"[")))
    closes = chain((0,), accumulate(map(sub, map(len, pieces), opens)))
    deepest: int = max(map(sub, accumulate(opens), closes))
    return deepest + _PASSES > limit
