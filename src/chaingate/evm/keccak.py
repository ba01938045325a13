"""Keccak-256 as Ethereum uses it (the pre-standard padding, not NIST SHA3-256)."""

from __future__ import annotations

from Crypto.Hash import keccak

# Empty input is common (a deployed account's initCode, no paymaster: two of a userOpHash's
# five hashes) and a hash through pycryptodome costs ~15-25 us of object setup alone.
_EMPTY = keccak.new(digest_bits=256).digest()


def keccak256(data: bytes) -> bytes:
    if not data:
        return _EMPTY
    return keccak.new(digest_bits=256, data=data).digest()
