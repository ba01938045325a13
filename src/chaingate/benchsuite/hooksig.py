"""Standard Webhooks signatures checked on arrival (sans-IO): ``webhook-signature`` holds one
or more ``v1,<base64 HMAC-SHA256>`` of ``{id}.{timestamp}.{body}``, keyed with the base64 after
the secret's ``whsec_``."""

from __future__ import annotations

import base64
import binascii
import hmac

PREFIX = "whsec_"


def key_of(secret: str) -> bytes:
    if not secret.startswith(PREFIX):
        raise ValueError("a signing secret starts with whsec_")
    text = secret[len(PREFIX) :]
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error:
        raise ValueError("a signing secret is whsec_ + base64") from None


def verify(secret: str, msg_id: str, timestamp: str, body: bytes, header: str) -> bool:
    """Whether any of ``header``'s v1 signatures is the body's (compared in constant time)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.digest(key_of(secret), signed, "sha256"))
    for part in header.split():
        version, _, signature = part.partition(",")
        if version == "v1" and hmac.compare_digest(signature.encode(), expected):
            return True
    return False
