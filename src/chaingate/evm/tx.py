"""Typed transactions: EIP-1559 and EIP-7702 built and signed here (the bundler's own), any
kind decoded.

``Eip1559`` signs to the raw bytes ``eth_sendRawTransaction`` takes; its hash is the transaction
hash the node will report. ``Eip7702`` is the same with an authorization list (type 4): the
bundle of an operation whose EOA sender delegates to its account code. ``decode_raw`` reads back
what a client sent — the sender (recovered from the signature), the nonce and the target — for
legacy (EIP-155 or not), EIP-2930, EIP-1559, EIP-4844 and EIP-7702 transactions.
"""

from __future__ import annotations

from typing import TypeGuard

import msgspec

from chaingate.evm import rlp
from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.evm.eip7702 import Authorization
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey, recover_address

EIP1559 = 2
EIP7702 = 4


class Eip1559(msgspec.Struct, frozen=True, kw_only=True):
    chain_id: int
    nonce: int
    max_priority_fee_per_gas: int
    max_fee_per_gas: int
    gas: int
    to: str | None
    value: int = 0
    data: bytes = b""

    def _fields(self) -> list[rlp.Item]:
        return [
            rlp.int_bytes(self.chain_id),
            rlp.int_bytes(self.nonce),
            rlp.int_bytes(self.max_priority_fee_per_gas),
            rlp.int_bytes(self.max_fee_per_gas),
            rlp.int_bytes(self.gas),
            address_bytes(self.to) if self.to else b"",
            rlp.int_bytes(self.value),
            self.data,
            [],  # access list
        ]

    def signing_hash(self) -> bytes:
        return keccak256(bytes([EIP1559]) + rlp.encode(self._fields()))

    def sign(self, key: PrivateKey) -> bytes:
        """The raw signed transaction (type byte ++ RLP)."""
        return _signed(EIP1559, self._fields(), key)


class Eip7702(Eip1559, frozen=True, kw_only=True):
    """EIP-1559's fields and an authorization list (type 4; ``to`` is required)."""

    authorizations: tuple[Authorization, ...] = ()

    def _fields(self) -> list[rlp.Item]:
        if not self.to or not self.authorizations:
            raise ValueError("a type-4 transaction has a target and at least one authorization")
        return [*super()._fields(), [a.rlp_item() for a in self.authorizations]]

    def signing_hash(self) -> bytes:
        return keccak256(bytes([EIP7702]) + rlp.encode(self._fields()))

    def sign(self, key: PrivateKey) -> bytes:
        return _signed(EIP7702, self._fields(), key)


def _signed(kind: int, unsigned: list[rlp.Item], key: PrivateKey) -> bytes:
    signature = key.sign_digest(keccak256(bytes([kind]) + rlp.encode(unsigned)))
    r, s, v = signature[:32], signature[32:64], signature[64] - 27
    fields = [
        *unsigned,
        rlp.int_bytes(v),
        rlp.int_bytes(int.from_bytes(r, "big")),
        rlp.int_bytes(int.from_bytes(s, "big")),
    ]
    return bytes([kind]) + rlp.encode(fields)


def tx_hash(raw: bytes) -> str:
    return "0x" + keccak256(raw).hex()


class DecodedTx(msgspec.Struct, frozen=True):
    kind: int  # 0 legacy, 1 EIP-2930, 2 EIP-1559, 3 EIP-4844, 4 EIP-7702
    sender: str
    nonce: int
    to: str | None
    hash: str


# Per typed kind: how many fields precede the signature (y_parity, r, s) and where "to" is.
_TYPED = {1: (8, 4), 2: (9, 5), 3: (11, 5), 4: (10, 5)}
_SECP256K1_HALF = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


def _signature(v: int, r: bytes, s: bytes) -> bytes:
    r_int, s_int = rlp.bytes_int(r), rlp.bytes_int(s)
    if not (r_int > 0 and 0 < s_int <= _SECP256K1_HALF) or v not in (0, 1):
        raise ValueError("invalid transaction signature")
    return r_int.to_bytes(32, "big") + s_int.to_bytes(32, "big") + bytes([v])


def _all_bytes(fields: list[rlp.Item]) -> TypeGuard[list[bytes]]:
    return all(isinstance(f, bytes) for f in fields)


def _to(field: rlp.Item) -> str | None:
    if not isinstance(field, bytes):
        raise ValueError("transaction 'to' is not a string")
    if not field:
        return None
    if len(field) != 20:
        raise ValueError("transaction 'to' is not 20 bytes")
    return checksum_address(field)


def _typed_fields(raw: bytes) -> list[rlp.Item]:
    """The RLP fields of a typed transaction (after its type byte); EIP-4844's network form
    ``[transaction, blobs, commitments, proofs]`` is unwrapped to the transaction."""
    fields = rlp.decode(raw[1:])
    if raw[0] == 3 and isinstance(fields, list) and fields and isinstance(fields[0], list):
        fields = fields[0]
    if not isinstance(fields, list):
        raise ValueError(f"a type-{raw[0]} transaction is an RLP list")
    return fields


def tx_target(raw: bytes) -> bytes | None:
    """The 20-byte ``to`` of a signed transaction (None: it creates a contract), without
    recovering the sender — the cheap read an allowlist needs.  ValueError if not one."""
    if not raw:
        raise ValueError("empty transaction")
    if raw[0] >= 0xC0:
        fields, at = rlp.decode(raw), 3
    elif raw[0] in _TYPED:
        fields, at = _typed_fields(raw), _TYPED[raw[0]][1]
    else:
        raise ValueError(f"unknown transaction type {raw[0]}")
    if not isinstance(fields, list) or len(fields) <= at:
        raise ValueError("not a transaction: too few fields")
    to = fields[at]
    if not isinstance(to, bytes) or len(to) not in (0, 20):
        raise ValueError("not a transaction: 'to' is not an address")
    return to or None


def decode_raw(raw: bytes) -> DecodedTx:
    """The sender, nonce and target of a signed transaction; ValueError if it is not one."""
    if not raw:
        raise ValueError("empty transaction")
    if raw[0] >= 0xC0:
        fields = rlp.decode(raw)
        if not isinstance(fields, list) or len(fields) != 9:
            raise ValueError("a legacy transaction has 9 fields")
        if not _all_bytes(fields):
            raise ValueError("malformed legacy transaction")
        v = rlp.bytes_int(fields[6])
        unsigned: list[rlp.Item] = list(fields[:6])
        if v in (27, 28):
            parity = v - 27
        elif v >= 35:
            chain_id = (v - 35) // 2
            parity = (v - 35) % 2
            unsigned += [rlp.int_bytes(chain_id), b"", b""]
        else:
            raise ValueError("invalid legacy transaction v")
        digest = keccak256(rlp.encode(unsigned))
        signature = _signature(parity, fields[7], fields[8])
        return DecodedTx(
            0,
            recover_address(digest, signature),
            rlp.bytes_int(fields[0]),
            _to(fields[3]),
            tx_hash(raw),
        )
    kind = raw[0]
    if kind not in _TYPED:
        raise ValueError(f"unknown transaction type {kind}")
    count, to_at = _TYPED[kind]
    typed = _typed_fields(raw)
    if len(typed) != count + 3:
        raise ValueError(f"a type-{kind} transaction has {count + 3} fields")
    y_parity, r, s = typed[count:]
    nonce = typed[1]
    if not (isinstance(y_parity, bytes) and isinstance(r, bytes) and isinstance(s, bytes)):
        raise ValueError("malformed transaction signature")
    if not isinstance(nonce, bytes):
        raise ValueError("malformed transaction nonce")
    digest = keccak256(bytes([kind]) + rlp.encode(typed[:count]))
    signature = _signature(rlp.bytes_int(y_parity) if y_parity else 0, r, s)
    return DecodedTx(
        kind,
        recover_address(digest, signature),
        rlp.bytes_int(nonce),
        _to(typed[to_at]),
        tx_hash(raw),
    )
