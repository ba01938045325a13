"""secp256k1 private keys: address derivation and signing (libsecp256k1 via coincurve).

A ``PrivateKey`` never shows its secret in ``repr``/``str``, so one that reaches a log line or
a traceback leaks only its address; ``hex()`` is the one explicit way to get the secret out.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import coincurve

from chaingate.evm.addresses import checksum_address
from chaingate.evm.keccak import keccak256


def address_of_public_key(public_key: bytes) -> str:
    """The address of an uncompressed (65-byte) or compressed (33-byte) public key."""
    point = coincurve.PublicKey(public_key).format(compressed=False)
    return checksum_address(keccak256(point[1:])[12:])


class PrivateKey:
    __slots__ = ("_key", "address")

    def __init__(self, secret: bytes) -> None:
        if len(secret) != 32:
            raise ValueError("a private key is 32 bytes")
        try:
            self._key = coincurve.PrivateKey(secret)  # rejects 0 and values >= the curve order
        except ValueError:
            raise ValueError("not a valid secp256k1 private key") from None
        self.address = address_of_public_key(self._key.public_key.format(compressed=False))

    @classmethod
    def generate(cls) -> PrivateKey:
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_hex(cls, text: str) -> PrivateKey:
        text = text.strip()
        try:
            return cls(bytes.fromhex(text[2:] if text[:2] in ("0x", "0X") else text))
        except ValueError:
            raise ValueError("not a hex private key") from None

    def hex(self) -> str:
        """The secret as 0x-hex: only for writing it to its key file."""
        return "0x" + self._key.secret.hex()

    def sign_digest(self, digest: bytes) -> bytes:
        """65-byte r ++ s ++ v (v = 27/28) signature of a 32-byte digest, as ecrecover takes it."""
        if len(digest) != 32:
            raise ValueError("sign a 32-byte digest")
        signature = self._key.sign_recoverable(digest, hasher=None)
        return signature[:64] + bytes([27 + signature[64]])

    def __repr__(self) -> str:
        return f"PrivateKey(address={self.address})"

    __str__ = __repr__


def recover_address(digest: bytes, signature: bytes) -> str:
    """The signer's address of a 65-byte r ++ s ++ v signature (v 0/1 or 27/28)."""
    if len(digest) != 32 or len(signature) != 65:
        raise ValueError("need a 32-byte digest and a 65-byte signature")
    v = signature[64] - 27 if signature[64] >= 27 else signature[64]
    public = coincurve.PublicKey.from_signature_and_message(
        signature[:64] + bytes([v]), digest, hasher=None
    )
    return address_of_public_key(public.format(compressed=False))


def load_or_create_key(path: Path) -> PrivateKey:
    """The key stored at ``path`` (0x-hex), generating it on first use (mode 0600)."""
    try:
        return PrivateKey.from_hex(path.read_text())
    except FileNotFoundError:
        pass
    key = PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside, then linked into place: a concurrent first run either wins the link or
    # reads the complete file the other one linked — never a half-written or second key.
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:  # mkstemp creates it 0600
            handle.write(key.hex() + "\n")
        try:
            os.link(staging, path)
        except FileExistsError:
            return PrivateKey.from_hex(path.read_text())
    finally:
        os.unlink(staging)
    return key
