"""API keys: format, generation and the keyed hash that is all the store ever sees.

A key is ``svc_live_`` or ``svc_test_`` followed by 43 base62 characters: 32 bytes from the
operating system's CSPRNG.  At rest there is only HMAC-SHA256(pepper, key) and a short display
prefix; the pepper lives in configuration (or the environment), never beside the hashes, so a
stolen database alone cannot be used to test guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

LIVE_PREFIX = "svc_live_"
TEST_PREFIX = "svc_test_"
_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ALPHABET_BYTES = frozenset(_ALPHABET.encode())
SECRET_BYTES = 32
SECRET_CHARS = 43  # ceil(256 bits / log2(62) bits per character)
KEY_LENGTH = len(LIVE_PREFIX) + SECRET_CHARS
DISPLAY_CHARS = 4  # characters of the secret kept for display ("svc_live_Ab3x…")


def _base62(data: bytes, width: int) -> str:
    number = int.from_bytes(data, "big")
    chars = []
    for _ in range(width):
        number, digit = divmod(number, 62)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def generate(environment: str) -> str:
    """A new key for ``environment`` ("live" or "test")."""
    if environment not in ("live", "test"):
        raise ValueError("environment must be 'live' or 'test'")
    prefix = LIVE_PREFIX if environment == "live" else TEST_PREFIX
    return prefix + _base62(secrets.token_bytes(SECRET_BYTES), SECRET_CHARS)


def environment_of(key: bytes) -> str | None:
    """ "live" or "test" for a well-formed key, None for anything else (checked before hashing)."""
    if len(key) != KEY_LENGTH:
        return None
    if key.startswith(b"svc_live_"):
        environment = "live"
    elif key.startswith(b"svc_test_"):
        environment = "test"
    else:
        return None
    if not all(c in _ALPHABET_BYTES for c in key[len(LIVE_PREFIX) :]):
        return None
    return environment


def display_prefix(key: str) -> str:
    """What may be shown and stored to recognise a key: its type and first characters."""
    return key[: len(LIVE_PREFIX) + DISPLAY_CHARS]


def hash_key(pepper: bytes, key: bytes) -> str:
    return hmac.new(pepper, key, hashlib.sha256).hexdigest()
