"""Keccak-256 as Ethereum uses it (the pre-standard padding, not NIST SHA3-256)."""

from __future__ import annotations

from Crypto.Hash import keccak


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()
