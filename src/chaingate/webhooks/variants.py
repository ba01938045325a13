"""The two ways the spec describes webhook deliveries: bodies, names, signatures, retries.

A variant turns a ``Match`` into the exact JSON its receivers get (rendered once, when the
event is written to the outbox, so every attempt sends the same bytes) and signs a body for
one attempt.  Variant A spells everything ``snake_case`` under ``event_type``; variant B
``camelCase`` under an upper-case ``type``.  Both also carry the Standard Webhooks headers,
so a receiver can verify either with an off-the-shelf library.

Beyond the spec, both envelopes carry ``sequence`` (the webhook's own event counter, to order
deliveries that retries have shuffled) and ``removed`` (true on the compensating event sent
when a reorg takes a block back; that event also names the original's id).  Addresses are
EIP-55; amounts are decimal strings; block-bound events always carry the block hash, the
thing a receiver needs to match a removal against what it stored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import msgspec

from chaingate.evm.addresses import checksum_address
from chaingate.evm.native import native_symbol
from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    Fact,
    InternalTransferFact,
    Kind,
    LogFact,
    Match,
    NftInfo,
    TransactionFact,
    TransferFact,
)
from chaingate.webhooks.signing import (
    hmac_hex,
    is_valid_secret,
    matches_any,
    new_secret,
    signing_secrets,
    standard_signature,
)

__all__ = [
    "VARIANT_A",
    "VARIANT_B",
    "Variant",
    "is_valid_secret",
    "new_secret",
    "variant",
    "verify_a",
    "verify_b",
]

NATIVE_DECIMALS = 18
ZERO_ADDRESS = "0x" + "0" * 40
# The spec's receivers reject a timestamp further than this from their clock (variant A).
TIMESTAMP_TOLERANCE = 300
# A verifier looks at no more signatures than this in one header: a delivery has at most two.
MAX_CANDIDATES = 8

_encoder = msgspec.json.Encoder()
F = TypeVar("F")


class Variant:
    """What differs between the variants.  Treat as immutable; the two instances are
    ``VARIANT_A`` and ``VARIANT_B``."""

    __slots__ = ("_type_names", "event_types", "exhausted", "name", "retry_delays")

    name: str
    event_types: Mapping[str, Kind]  # every accepted event_type -> neutral kind (not "test")
    retry_delays: tuple[float, ...]  # seconds before each retry
    exhausted: Literal["pause", "fail"]  # after the last retry: pause the webhook / fail the event

    def __init__(
        self,
        name: str,
        event_types: Mapping[str, Kind],
        test_type: str,
        retry_delays: tuple[float, ...],
        exhausted: Literal["pause", "fail"],
    ) -> None:
        self.name = name
        self.event_types = MappingProxyType(dict(event_types))
        self.retry_delays = retry_delays
        self.exhausted = exhausted
        names: dict[Kind, str] = {kind: type_ for type_, kind in event_types.items()}
        names["test"] = test_type
        self._type_names: Mapping[Kind, str] = MappingProxyType(names)

    def __repr__(self) -> str:
        return f"<Variant {self.name}>"

    def type_name(self, kind: Kind) -> str:
        try:
            return self._type_names[kind]
        except KeyError:
            raise ValueError(f"variant {self.name} has no {kind} events") from None

    def render(
        self,
        match: Match | None,
        *,
        event_id: str,
        webhook_id: str,
        event_type: str,
        chain_label: str,
        chain_id: int | None,
        sequence: int,
        created_at_ms: int,
    ) -> str:
        """The body of one event (``match`` None: a test ping, whose type is always this
        variant's test type, whatever ``event_type`` says)."""
        if match is None:
            event_type = self.type_name("test")
            data = self._ping_data(chain_label)
        else:
            data = self._data(match, chain_label, chain_id)
        envelope = self._envelope(
            event_id, event_type, webhook_id, chain_label, chain_id, sequence, created_at_ms
        )
        envelope["removed"] = False
        envelope["data"] = data
        return _encoder.encode(envelope).decode()

    def render_removal(self, original_body: str, new_id: str, sequence: int, now_ms: int) -> str:
        """The compensating event after a reorg: the original's type and data, byte for byte,
        under a new id, sequence and time, with ``removed`` true and the original's id."""
        raise NotImplementedError

    def headers(
        self,
        *,
        event_id: str,
        event_type: str,
        body: bytes,
        timestamp: int,
        secrets: Sequence[str],
    ) -> list[tuple[str, str]]:
        """The headers of one attempt, signed with each of ``secrets`` (current first)."""
        keys = signing_secrets(secrets)
        return [
            ("Content-Type", "application/json"),
            *self._own_headers(event_id, event_type, body, timestamp, keys),
            ("webhook-id", event_id),
            ("webhook-timestamp", str(timestamp)),
            ("webhook-signature", standard_signature(keys, event_id, timestamp, body)),
        ]

    # What each variant spells its own way.

    def _envelope(
        self,
        event_id: str,
        event_type: str,
        webhook_id: str,
        chain_label: str,
        chain_id: int | None,
        sequence: int,
        created_at_ms: int,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _data(self, match: Match, chain_label: str, chain_id: int | None) -> dict[str, Any]:
        raise NotImplementedError

    def _ping_data(self, chain_label: str) -> dict[str, Any]:
        raise NotImplementedError

    def _own_headers(
        self, event_id: str, event_type: str, body: bytes, timestamp: int, keys: Sequence[str]
    ) -> list[tuple[str, str]]:
        raise NotImplementedError


PING_MESSAGE = "Test event from chaingate: this endpoint receives the webhook's deliveries."


class _RemovalSourceA(msgspec.Struct):
    id: str
    event_type: str
    webhook_id: str
    data: msgspec.Raw  # re-sent as stored, not re-encoded


class _VariantA(Variant):
    __slots__ = ()

    def _envelope(
        self,
        event_id: str,
        event_type: str,
        webhook_id: str,
        chain_label: str,
        chain_id: int | None,
        sequence: int,
        created_at_ms: int,
    ) -> dict[str, Any]:
        return {
            "id": event_id,
            "event_type": event_type,
            "webhook_id": webhook_id,
            "created_at": iso_ms(created_at_ms),
            "sequence": sequence,
        }

    def render_removal(self, original_body: str, new_id: str, sequence: int, now_ms: int) -> str:
        original = msgspec.json.decode(original_body, type=_RemovalSourceA)
        return _encoder.encode(
            {
                "id": new_id,
                "event_type": original.event_type,
                "webhook_id": original.webhook_id,
                "created_at": iso_ms(now_ms),
                "sequence": sequence,
                "removed": True,
                "original_id": original.id,
                "data": original.data,
            }
        ).decode()

    def _ping_data(self, chain_label: str) -> dict[str, Any]:
        return {"chain": chain_label, "message": PING_MESSAGE}

    def _data(self, match: Match, chain_label: str, chain_id: int | None) -> dict[str, Any]:
        kind = match.kind
        if kind == "address_activity":
            return _a_activity(match, chain_label, chain_id)
        if kind == "token_transfer":
            t = _fact(match, TransferFact)
            token = t.token
            return {
                "chain": chain_label,
                **_a_block(t.block),
                "tx_hash": t.tx_hash,
                "log_index": t.log_index,
                "contract": _address(t.contract),
                "from": checksum_address(t.sender),
                "to": checksum_address(t.receiver),
                "value": str(t.amount),
                "symbol": token.symbol if token is not None else None,
                "decimals": token.decimals if token is not None else None,
            }
        if kind == "nft_transfer":
            t = _fact(match, TransferFact)
            return {
                "chain": chain_label,
                **_a_block(t.block),
                "tx_hash": t.tx_hash,
                "log_index": t.log_index,
                "contract": _address(t.contract),
                "from": checksum_address(t.sender),
                "to": checksum_address(t.receiver),
                "token_id": _token_id(t.token_id),
                "standard": t.standard,
                "quantity": t.amount,
            }
        if kind == "mined_transaction":
            tx = _fact(match, TransactionFact)
            return {
                "chain": chain_label,
                **_a_block(tx.block),
                "tx_hash": tx.tx_hash,
                "tx_index": tx.tx_index,
                "from": checksum_address(tx.sender),
                "to": _address(tx.receiver),
                "contract_address": _address(tx.contract_address),
                "value": str(tx.value),
                "nonce": tx.nonce,
                "status": _status(tx.status),
                "gas_used": tx.gas_used,
                "input": tx.input,
            }
        if kind == "log":
            log = _fact(match, LogFact)
            return {
                "chain": chain_label,
                **_a_block(log.block),
                "tx_hash": log.tx_hash,
                "tx_index": log.tx_index,
                "log_index": log.log_index,
                "address": checksum_address(log.address),
                "topics": list(log.topics),
                "data": log.data,
            }
        raise ValueError(f"variant a has no {kind} events")

    def _own_headers(
        self, event_id: str, event_type: str, body: bytes, timestamp: int, keys: Sequence[str]
    ) -> list[tuple[str, str]]:
        signed = f"{timestamp}.".encode() + body
        return [
            ("X-Service-Signature", ",".join(hmac_hex(key, signed) for key in keys)),
            ("X-Service-Timestamp", str(timestamp)),
        ]


def _a_block(block: BlockRef | None) -> dict[str, Any]:
    if block is None:
        return {"block_number": None, "block_hash": None, "block_timestamp": None}
    return {
        "block_number": block.number,
        "block_hash": block.hash,
        "block_timestamp": block.timestamp,
    }


def _a_activity(match: Match, chain_label: str, chain_id: int | None) -> dict[str, Any]:
    """An address's activity, whatever moved: the spec's fields, then what kind of movement
    (``category``), the watched ``address`` and what formatting the value needs."""
    fact = match.fact
    moved = _movement(fact, chain_id)
    return {
        "chain": chain_label,
        **_a_block(fact.block),
        "tx_hash": moved.tx_hash,
        "log_index": moved.log_index,
        "from": checksum_address(moved.sender),
        "to": _address(moved.receiver),
        "value": str(moved.amount),
        "asset": moved.asset,
        "contract": _address(moved.contract),
        "direction": match.direction,
        "address": _address(match.watched),
        "category": moved.category,
        "decimals": moved.decimals,
        "token_id": _token_id(moved.token_id),
    }


class _RemovalSourceB(msgspec.Struct, rename="camel"):
    id: str
    type: str
    chain: str
    chain_id: int | None
    webhook_id: str
    data: msgspec.Raw


class _VariantB(Variant):
    __slots__ = ()

    def _envelope(
        self,
        event_id: str,
        event_type: str,
        webhook_id: str,
        chain_label: str,
        chain_id: int | None,
        sequence: int,
        created_at_ms: int,
    ) -> dict[str, Any]:
        return {
            "id": event_id,
            "type": event_type,
            "createdAt": iso_ms(created_at_ms),
            "chain": chain_label,
            "chainId": chain_id,
            "webhookId": webhook_id,
            "sequence": sequence,
        }

    def render_removal(self, original_body: str, new_id: str, sequence: int, now_ms: int) -> str:
        original = msgspec.json.decode(original_body, type=_RemovalSourceB)
        return _encoder.encode(
            {
                "id": new_id,
                "type": original.type,
                "createdAt": iso_ms(now_ms),
                "chain": original.chain,
                "chainId": original.chain_id,
                "webhookId": original.webhook_id,
                "sequence": sequence,
                "removed": True,
                "originalId": original.id,
                "data": original.data,
            }
        ).decode()

    def _ping_data(self, chain_label: str) -> dict[str, Any]:
        return {"message": PING_MESSAGE}

    def _data(self, match: Match, chain_label: str, chain_id: int | None) -> dict[str, Any]:
        kind = match.kind
        if kind == "address_activity":
            return _b_activity(match, chain_id)
        if kind == "token_transfer":
            t = _fact(match, TransferFact)
            decimals = t.token.decimals if t.token is not None else None
            return {
                **_b_block(t.block),
                "transactionHash": t.tx_hash,
                "logIndex": t.log_index,
                "from": checksum_address(t.sender),
                "to": checksum_address(t.receiver),
                "token": {
                    "address": _address(t.contract),
                    "symbol": t.token.symbol if t.token is not None else None,
                    "decimals": decimals,
                },
                "value": str(t.amount),
                "valueFormatted": format_units(t.amount, decimals),
            }
        if kind == "nft_transfer":
            return _b_nft(match)
        if kind == "mined_transaction":
            tx = _fact(match, TransactionFact)
            return {
                **_b_block(tx.block),
                "transactionHash": tx.tx_hash,
                "transactionIndex": tx.tx_index,
                "from": checksum_address(tx.sender),
                "to": _address(tx.receiver),
                "contractAddress": _address(tx.contract_address),
                "value": str(tx.value),
                "nonce": tx.nonce,
                "status": _status(tx.status),
                "gasUsed": tx.gas_used,
                "input": tx.input,
            }
        if kind == "internal_transfer":
            it = _fact(match, InternalTransferFact)
            return {
                **_b_block(it.block),
                "transactionHash": it.tx_hash,
                "traceAddress": list(it.trace_address),
                "callType": it.call_type,
                "from": checksum_address(it.sender),
                "to": checksum_address(it.receiver),
                "value": str(it.value),
                "valueFormatted": format_units(it.value, NATIVE_DECIMALS),
                "asset": native_symbol(chain_id),
                "address": _address(match.watched),
                "direction": match.direction,
            }
        if kind == "new_block":
            b = _fact(match, BlockFact)
            return {
                "blockNumber": b.block.number,
                "blockHash": b.block.hash,
                "parentHash": b.parent_hash,
                "timestamp": b.block.timestamp,
                "gasUsed": b.gas_used,
                "gasLimit": b.gas_limit,
                "baseFeePerGas": _decimal(b.base_fee_per_gas),
                "transactionCount": b.transaction_count,
            }
        if kind == "pending_transaction":
            tx = _fact(match, TransactionFact)
            return {
                "transactionHash": tx.tx_hash,
                "from": checksum_address(tx.sender),
                "to": _address(tx.receiver),
                "value": str(tx.value),
                "valueFormatted": format_units(tx.value, NATIVE_DECIMALS),
                "asset": native_symbol(chain_id),
                "nonce": tx.nonce,
                "input": tx.input,
                "address": _address(match.watched),
                "direction": match.direction,
            }
        raise ValueError(f"variant b has no {kind} events")

    def _own_headers(
        self, event_id: str, event_type: str, body: bytes, timestamp: int, keys: Sequence[str]
    ) -> list[tuple[str, str]]:
        return [
            ("X-Cloud-Signature", ",".join("sha256=" + hmac_hex(key, body) for key in keys)),
            ("X-Webhook-Event", event_type),
            ("X-Webhook-Idempotency-Key", event_id),
        ]


def _b_block(block: BlockRef | None) -> dict[str, Any]:
    if block is None:
        return {"blockNumber": None, "blockHash": None, "blockTimestamp": None}
    return {
        "blockNumber": block.number,
        "blockHash": block.hash,
        "blockTimestamp": block.timestamp,
    }


_B_CATEGORIES = {
    "native": "native",
    "erc20": "erc20",
    "erc721": "erc721",
    "erc1155": "erc1155",
    "internal": "internal",
    "contract_call": "contractCall",
    "contract_creation": "contractCreation",
}


def _b_activity(match: Match, chain_id: int | None) -> dict[str, Any]:
    fact = match.fact
    moved = _movement(fact, chain_id)
    token = None
    if moved.contract is not None:
        token = {
            "address": checksum_address(moved.contract),
            "symbol": moved.asset,
            "decimals": moved.decimals,
        }
    return {
        **_b_block(fact.block),
        "transactionHash": moved.tx_hash,
        "logIndex": moved.log_index,
        "address": _address(match.watched),
        "direction": match.direction,
        "category": _B_CATEGORIES[moved.category],
        "from": checksum_address(moved.sender),
        "to": _address(moved.receiver),
        "value": str(moved.amount),
        "valueFormatted": format_units(moved.amount, moved.decimals),
        "asset": moved.asset,
        "token": token,
        "tokenId": _token_id(moved.token_id),
    }


def _b_nft(match: Match) -> dict[str, Any]:
    t = _fact(match, TransferFact)
    nft = t.nft if t.nft is not None else NftInfo()
    if t.sender == ZERO_ADDRESS:
        activity = "mint"
    elif t.receiver == ZERO_ADDRESS:
        activity = "burn"
    else:
        activity = "transfer"
    return {
        **_b_block(t.block),
        "transactionHash": t.tx_hash,
        "logIndex": t.log_index,
        "activity": activity,
        "from": checksum_address(t.sender),
        "to": checksum_address(t.receiver),
        "contract": {
            "address": _address(t.contract),
            "name": t.token.name if t.token is not None else None,
            "symbol": t.token.symbol if t.token is not None else None,
        },
        "tokenId": _token_id(t.token_id),
        "standard": t.standard,
        "quantity": t.amount,
        "metadata": {
            "name": nft.name,
            "description": nft.description,
            "imageUrl": nft.image_url,
            "tokenUri": nft.token_uri,
            "status": nft.status,
        },
    }


class _Movement(msgspec.Struct, frozen=True):
    """An address activity's fact, in the terms both variants describe it in."""

    tx_hash: str
    log_index: int | None
    sender: str
    receiver: str | None
    amount: int
    asset: str | None  # the native symbol, or the token's (None: not known yet)
    contract: str | None  # None: native currency moved
    decimals: int | None
    token_id: int | None
    category: str  # native erc20 erc721 erc1155 internal contract_call contract_creation


def _movement(fact: Fact, chain_id: int | None) -> _Movement:
    if isinstance(fact, TransferFact):
        if fact.standard == "native":
            return _Movement(
                fact.tx_hash,
                fact.log_index,
                fact.sender,
                fact.receiver,
                fact.amount,
                native_symbol(chain_id),
                None,
                NATIVE_DECIMALS,
                None,
                "native",
            )
        token = fact.token
        erc20 = fact.standard == "ERC20"
        return _Movement(
            fact.tx_hash,
            fact.log_index,
            fact.sender,
            fact.receiver,
            fact.amount,
            token.symbol if token is not None else None,
            fact.contract,
            # An NFT's amount is a count, never scaled.
            (token.decimals if token is not None else None) if erc20 else 0,
            fact.token_id,
            fact.standard.lower(),
        )
    if isinstance(fact, TransactionFact):
        # A call (or a creation) that moved no token the address is party to: the value is
        # the transaction's own, and ``to`` is the new contract for a creation.
        return _Movement(
            fact.tx_hash,
            None,
            fact.sender,
            fact.receiver if fact.receiver is not None else fact.contract_address,
            fact.value,
            native_symbol(chain_id),
            None,
            NATIVE_DECIMALS,
            None,
            "contract_call" if fact.receiver is not None else "contract_creation",
        )
    if isinstance(fact, InternalTransferFact):
        return _Movement(
            fact.tx_hash,
            None,
            fact.sender,
            fact.receiver,
            fact.value,
            native_symbol(chain_id),
            None,
            NATIVE_DECIMALS,
            None,
            "internal",
        )
    raise TypeError(f"an address_activity event has no {type(fact).__name__}")


# Shared spellings.


def _fact(match: Match, cls: type[F]) -> F:
    fact = match.fact
    if not isinstance(fact, cls):
        raise TypeError(f"a {match.kind} event has no {type(fact).__name__}")
    return fact


def _address(address: str | None) -> str | None:
    return checksum_address(address) if address is not None else None


def _token_id(token_id: int | None) -> str | None:
    return str(token_id) if token_id is not None else None


def _decimal(value: int | None) -> str | None:
    return str(value) if value is not None else None


def _status(status: int | None) -> str | None:
    if status is None:
        return None
    return "success" if status == 1 else "reverted"


def format_units(amount: int, decimals: int | None) -> str | None:
    """``amount`` raw units as a decimal string scaled by ``decimals``, without trailing
    zeros (1500000 with 6 decimals: "1.5").  None when the decimals are not known: a raw
    amount passed off as a scaled one would be wrong by a factor nobody could see."""
    if decimals is None or not 0 <= decimals <= 255:  # ERC-20 decimals is a uint8
        return None
    if decimals == 0:
        return str(amount)
    sign = "-" if amount < 0 else ""
    whole, fraction = divmod(abs(amount), 10**decimals)
    digits = str(fraction).rjust(decimals, "0").rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``), from integers only."""
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


VARIANT_A: Variant = _VariantA(
    "a",
    {
        "address_activity": "address_activity",
        "token_transfer": "token_transfer",
        "nft_transfer": "nft_transfer",
        "mined_transaction": "mined_transaction",
        "log": "log",
    },
    test_type="webhook_test",
    retry_delays=(10, 60, 600, 3600, 21600),
    exhausted="pause",
)

VARIANT_B: Variant = _VariantB(
    "b",
    {
        "ADDRESS_ACTIVITY": "address_activity",
        "MINED_TRANSACTION": "mined_transaction",
        "NFT_ACTIVITY": "nft_transfer",
        "TOKEN_TRANSFER": "token_transfer",
        "INTERNAL_TRANSFER": "internal_transfer",
        "NEW_BLOCK": "new_block",
        "PENDING_TRANSACTION": "pending_transaction",
    },
    test_type="WEBHOOK_TEST",
    retry_delays=(1, 5, 30, 300, 1800, 7200, 28800),
    exhausted="fail",
)

_VARIANTS = {"a": VARIANT_A, "b": VARIANT_B}


def variant(name: str) -> Variant:
    """The variant named ``a`` or ``b`` (either case)."""
    try:
        return _VARIANTS[name.lower()]
    except KeyError:
        raise ValueError(f"no webhook variant {name!r} (a or b)") from None


# Receivers' side: what the docs tell them to do, as code (tests and examples use it).


def verify_a(
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    *,
    now: float | None = None,
    tolerance: int = TIMESTAMP_TOLERANCE,
) -> bool:
    """Whether ``X-Service-Signature`` holds the HMAC of ``<timestamp>.<body>`` under
    ``secret``, with ``X-Service-Timestamp`` within ``tolerance`` seconds of ``now``."""
    signature = _header(headers, "x-service-signature")
    stamp = _header(headers, "x-service-timestamp")
    if signature is None or stamp is None or not (stamp.isascii() and stamp.isdigit()):
        return False
    clock = time.time() if now is None else now
    if len(stamp) > 12 or abs(clock - int(stamp)) > tolerance:
        return False
    expected = hmac_hex(secret, stamp.encode() + b"." + body)
    return _any_candidate(expected, signature, "")


def verify_b(body: bytes, headers: Mapping[str, str], secret: str) -> bool:
    """Whether ``X-Cloud-Signature`` holds ``sha256=`` + the HMAC of ``body`` under
    ``secret``."""
    signature = _header(headers, "x-cloud-signature")
    if signature is None:
        return False
    return _any_candidate(hmac_hex(secret, body), signature, "sha256=")


def _any_candidate(expected: str, header: str, prefix: str) -> bool:
    candidates = header.split(",")
    if len(candidates) > MAX_CANDIDATES:
        return False
    given = []
    for candidate in candidates:
        candidate = candidate.strip()
        if not candidate.startswith(prefix):
            continue
        given.append(candidate[len(prefix) :].encode())
    return matches_any(expected.encode(), given)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
