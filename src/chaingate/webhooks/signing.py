"""Webhook secrets and the HMACs made with them (sans-IO).

A secret is ``whsec_`` + base64 of 32 random bytes: the Standard Webhooks form, so any of its
verifiers accepts it.  Two keys come from one secret:

* the variants' own signatures key HMAC-SHA256 with the whole secret string as UTF-8 (what the
  spec's receivers are told: "HMAC-SHA256 with key ``signing_secret``");
* the Standard Webhooks signature keys it with the bytes the base64 part decodes to (what that
  spec's verifiers do).

The Standard Webhooks key is decoded once per secret and kept in a small LRU: a delivery
worker signs with the same few secrets over and over.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SECRET_BYTES = 32
# A webhook signs with its current secret and, while a rotation's overlap lasts, the previous.
MAX_SECRETS = 2


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def is_valid_secret(secret: str) -> bool:
    """Whether ``secret`` is ``whsec_`` + base64 of at least one byte (so both kinds of
    signature can be made with it)."""
    try:
        standard_key(secret)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def standard_key(secret: str) -> bytes:
    """The Standard Webhooks key: the base64 after ``whsec_``, decoded."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with whsec_")
    text = secret[len(SECRET_PREFIX) :]
    try:
        # Verifiers pad unpadded base64 themselves; so do we.
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error:
        raise ValueError("a signing secret is whsec_ + base64") from None
    if not key:
        raise ValueError("a signing secret may not be empty")
    return key


def hmac_hex(secret: str, message: bytes) -> str:
    """Lowercase hex HMAC-SHA256 keyed with the secret string itself (the variants' own)."""
    return hmac.digest(secret.encode(), message, "sha256").hex()


def standard_signature(secrets_: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64>`` per secret, space-separated."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(standard_key(s), signed, "sha256")).decode()
        for s in secrets_
    )


def signing_secrets(secrets_: Sequence[str]) -> tuple[str, ...]:
    """The secrets to sign with, current first, once each; refuses none and too many."""
    unique = tuple(dict.fromkeys(secrets_))
    if not unique:
        raise ValueError("a delivery is signed with at least one secret")
    if len(unique) > MAX_SECRETS:
        raise ValueError(f"a delivery is signed with at most {MAX_SECRETS} secrets")
    return unique


def matches_any(expected: bytes, candidates: Sequence[bytes]) -> bool:
    """Constant-time per candidate, and every candidate compared (no early exit that would
    tell which position matched)."""
    found = False
    for candidate in candidates:
        found |= hmac.compare_digest(expected, candidate)
    return found
