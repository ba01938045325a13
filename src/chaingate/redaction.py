"""Key-shaped text, redacted wherever a client's input is echoed or logged: the access log's
paths (``loggable_path``) and what an error message says (``redact_key_shaped``).  One rule
below every layer that answers or logs, so the edge and the REST plane redact alike."""

from __future__ import annotations

import re


def _key_shaped(before: str, after: str) -> str:
    """Key-shaped text: our API keys and webhook secrets, and any long token-like run with
    digits among its letters (another provider's key pasted into a URL: 32 random characters
    hold digits) — but not names made of letters and ``_``/``-`` (a field or a method,
    snake_case or camelCase: what a client reads to fix its request), hex hashes and addresses
    (0x...) or decimal token ids, which are what a path is for.  ``before`` and ``after``
    bound a run: path separators in a path, any character a token does not hold in a
    message."""
    return (
        r"svc_(?:live|test)_[A-Za-z0-9]*"
        r"|whsec_[A-Za-z0-9+/=_-]*"
        rf"|{before}(?!0x)(?![0-9]+{after})(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{{32,}}{after}"
    )


# Redacted in the access log (``loggable_path``) ...
_KEY_SHAPED = re.compile(_key_shaped(r"(?<=/)", r"(?=/|$)").encode())
# ... and in what an answer says (``redact_key_shaped``).
_KEY_SHAPED_TEXT = re.compile(_key_shaped(r"(?<![A-Za-z0-9_-])", r"(?![A-Za-z0-9_-])"))
REDACTED = b"[redacted]"


def redact_key_shaped(text: str) -> str:
    """``text`` with key-shaped runs replaced by ``[redacted]``: what an error message may
    echo of a client's input (a key pasted into a path must not come back in the answer, nor
    go on to whatever logs or shows it)."""
    if "svc_" not in text and "whsec_" not in text and len(text) < 32:
        return text
    return _KEY_SHAPED_TEXT.sub(REDACTED.decode(), text)


def loggable_path(path: bytes, limit: int = 256) -> str:
    """``path`` for the access log: key-shaped text redacted, length bounded."""
    if b"svc_" in path or b"whsec_" in path or len(path) >= 40:
        path = _KEY_SHAPED.sub(REDACTED, path)
    return path[:limit].decode("latin-1")
