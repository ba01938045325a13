"""EIP-7702 authorizations: an EOA's signed consent to run another contract's code as its own.

An authorization is the tuple ``(chain_id, address, nonce)`` signed by the EOA (the
*authority*) over ``keccak256(0x05 || rlp([chain_id, address, nonce]))``; a type-4 transaction
carries a list of them with ``y_parity, r, s``.  When the transaction runs, each valid one
sets the authority's code to the *delegation designator* ``0xef0100 || address`` (the zero
address clears it) and bumps the authority's nonce.  A chain id of 0 is valid on every chain.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from chaingate.evm import rlp
from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey, recover_address

MAGIC = b"\x05"
DESIGNATOR_PREFIX = bytes.fromhex("ef0100")
DESIGNATOR_LENGTH = 23
ZERO_ADDRESS = "0x" + "00" * 20
_SECP256K1_HALF = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0
_UINT64 = 1 << 64
_UINT256 = 1 << 256
_FIELDS = ("chainId", "address", "nonce", "yParity", "r", "s")
_HEX = frozenset("0123456789abcdefABCDEF")


class Authorization(msgspec.Struct, frozen=True, kw_only=True):
    """One signed authorization (EIP-7702's ``authorization_list`` item)."""

    chain_id: int
    address: str  # the delegate, EIP-55
    nonce: int
    y_parity: int
    r: int
    s: int

    def signing_hash(self) -> bytes:
        return authorization_hash(self.chain_id, self.address, self.nonce)

    def authority(self) -> str:
        """The EOA that signed it; ValueError when the signature is not one EIP-7702 accepts
        (s in the upper half of the curve, y_parity not 0/1, r or s out of range)."""
        if self.y_parity not in (0, 1):
            raise ValueError("eip7702Auth.yParity must be 0 or 1")
        if not 0 < self.r < _UINT256 or not 0 < self.s <= _SECP256K1_HALF:
            raise ValueError("eip7702Auth: r or s out of range (s must be in the lower half)")
        signature = self.r.to_bytes(32, "big") + self.s.to_bytes(32, "big") + bytes([self.y_parity])
        return recover_address(self.signing_hash(), signature)

    def json(self) -> dict[str, str]:
        """The JSON-RPC form (a transaction request's ``authorizationList`` item)."""
        return {
            "chainId": hex(self.chain_id),
            "address": self.address,
            "nonce": hex(self.nonce),
            "yParity": hex(self.y_parity),
            "r": hex(self.r),
            "s": hex(self.s),
        }

    def rlp_item(self) -> list[rlp.Item]:
        return [
            rlp.int_bytes(self.chain_id),
            address_bytes(self.address),
            rlp.int_bytes(self.nonce),
            rlp.int_bytes(self.y_parity),
            rlp.int_bytes(self.r),
            rlp.int_bytes(self.s),
        ]


def authorization_hash(chain_id: int, address: str, nonce: int) -> bytes:
    """What the authority signs: keccak256(0x05 || rlp([chain_id, address, nonce]))."""
    if not 0 <= chain_id < _UINT256 or not 0 <= nonce < _UINT64:
        raise ValueError("an authorization's chain id is a uint256 and its nonce a uint64")
    fields: list[rlp.Item] = [
        rlp.int_bytes(chain_id),
        address_bytes(address),
        rlp.int_bytes(nonce),
    ]
    return keccak256(MAGIC + rlp.encode(fields))


def sign_authorization(
    key: PrivateKey, *, chain_id: int, address: str, nonce: int
) -> Authorization:
    signature = key.sign_digest(authorization_hash(chain_id, address, nonce))
    return Authorization(
        chain_id=chain_id,
        address=checksum_address(address),
        nonce=nonce,
        y_parity=signature[64] - 27,
        r=int.from_bytes(signature[:32], "big"),
        s=int.from_bytes(signature[32:64], "big"),
    )


def designator(address: str) -> bytes:
    """The code an authority gets: 0xef0100 || address."""
    return DESIGNATOR_PREFIX + address_bytes(address)


def delegate_of(code: bytes) -> str | None:
    """The delegate of an account whose code is a delegation designator, else None."""
    if len(code) == DESIGNATOR_LENGTH and code[:3] == DESIGNATOR_PREFIX:
        return checksum_address(code[3:])
    return None


def parse_authorization(value: object, field: str = "eip7702Auth") -> Authorization:
    """An authorization in its JSON-RPC form (ERC-7769's ``eip7702Auth``: ``{chainId,
    address, nonce, yParity, r, s}``, 0x-hex), strictly; ValueError naming the field (its
    signature is not checked here: ``authority()`` does)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: expected an object {{{', '.join(_FIELDS)}}}")
    for name in value:
        if name not in _FIELDS:
            raise ValueError(f"{field}.{str(name)[:32]}: unknown field")
    for name in _FIELDS:
        if value.get(name) is None:
            raise ValueError(f"{field}.{name}: missing")

    def quantity(name: str, bits: int) -> int:
        text = value[name]
        if not isinstance(text, str) or text[:2] != "0x" or not 2 < len(text) <= 66:
            raise ValueError(f"{field}.{name}: expected a 0x-hex quantity")
        if not _HEX.issuperset(text[2:]):
            raise ValueError(f"{field}.{name}: {text[:24]!r} is not hex")
        number = int(text, 16)
        if number >= 1 << bits:
            raise ValueError(f"{field}.{name}: does not fit uint{bits}")
        return number

    address = value["address"]
    if (
        not isinstance(address, str)
        or address[:2] != "0x"
        or len(address) != 42
        or not _HEX.issuperset(address[2:])
    ):
        raise ValueError(f"{field}.address: expected an address")
    y_parity = quantity("yParity", 8)
    if y_parity > 1:
        raise ValueError(f"{field}.yParity: must be 0x0 or 0x1")
    return Authorization(
        chain_id=quantity("chainId", 256),
        address=checksum_address(bytes.fromhex(address[2:])),
        nonce=quantity("nonce", 64),
        y_parity=y_parity,
        r=quantity("r", 256),
        s=quantity("s", 256),
    )
