"""Addresses: EIP-55 checksums and where CREATE / CREATE2 put a contract."""

from __future__ import annotations

import functools

from chaingate.evm.keccak import keccak256


def address_bytes(address: str | bytes) -> bytes:
    """The 20 bytes of an address given as bytes or as 0x-hex (any case)."""
    if isinstance(address, bytes):
        raw = address
    else:
        text = address[2:] if address[:2] in ("0x", "0X") else address
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"not a hex address: {address!r}") from None
    if len(raw) != 20:
        raise ValueError(f"an address is 20 bytes, got {len(raw)}")
    return raw


def checksum_address(address: str | bytes) -> str:
    """EIP-55 mixed-case form."""
    if isinstance(address, str):
        return _checksum_text(address)
    return _checksum(address_bytes(address))


@functools.lru_cache(maxsize=65_536)
def _checksum_text(address: str) -> str:
    return _checksum(address_bytes(address))


# A keccak and a character loop cost ~25 µs; an API page of 100 tokens names each contract
# several times, and the same few thousand addresses come back all day.
@functools.lru_cache(maxsize=65_536)
def _checksum(raw: bytes) -> str:
    hex_lower = raw.hex()
    digest = keccak256(hex_lower.encode()).hex()
    # A letter whose digest nibble is 8 or more is upper case (a digit's upper() is itself).
    return "0x" + "".join(
        [c.upper() if d in "89abcdef" else c for c, d in zip(hex_lower, digest[:40], strict=True)]
    )


def same_address(a: str | bytes, b: str | bytes) -> bool:
    return address_bytes(a) == address_bytes(b)


def create2_address(deployer: str | bytes, salt: bytes, init_code: bytes) -> str:
    """EIP-1014: keccak256(0xff ++ deployer ++ salt ++ keccak256(init_code))[12:]."""
    if len(salt) != 32:
        raise ValueError("a CREATE2 salt is 32 bytes")
    digest = keccak256(b"\xff" + address_bytes(deployer) + salt + keccak256(init_code))
    return checksum_address(digest[12:])


def _rlp_uint(value: int) -> bytes:
    if value == 0:
        return b"\x80"
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return raw if len(raw) == 1 and raw[0] < 0x80 else bytes([0x80 + len(raw)]) + raw


def create_address(sender: str | bytes, nonce: int) -> str:
    """CREATE: keccak256(rlp([sender, nonce]))[12:]."""
    payload = b"\x94" + address_bytes(sender) + _rlp_uint(nonce)
    return checksum_address(keccak256(bytes([0xC0 + len(payload)]) + payload)[12:])
