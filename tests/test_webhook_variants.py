"""Webhook variants A and B: rendered bodies, removals, and signatures checked by code we did
not write (``standardwebhooks``, ``eth_utils``) and by hand with hashlib/hmac."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime
from decimal import Context, Decimal
from typing import Any, Literal

import msgspec
import pytest
from eth_utils.address import to_checksum_address
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    Fact,
    InternalTransferFact,
    Kind,
    LogFact,
    Match,
    NftInfo,
    Token,
    TransactionFact,
    TransferFact,
)
from chaingate.webhooks.variants import (
    VARIANT_A,
    VARIANT_B,
    Variant,
    is_valid_secret,
    new_secret,
    variant,
    verify_a,
    verify_b,
)

WEBHOOK = "wh_01hx"
EVENT = "evt_abcdefghijklmnopqrstuvwxyz"
CREATED_MS = 1_714_564_800_123  # 2024-05-01T12:00:00.123Z
BLOCK = BlockRef(19_800_000, "0x" + "ab" * 32, 1_714_564_799)
TX = "0x" + "cd" * 32
WATCHED = "0x" + "5a" * 20
OTHER = "0xd8da6bf26964af9d7eed9e10c0c2d7b1cd7f0a6e"
USDC = "0xa0b86991c6218b36c1d19d4a2e9eb0ce3606eb48"
BAYC = "0xbc4ca0eda7647a8ab7c2061c2e118a18a936f13d"
ZERO = "0x" + "00" * 20

NATIVE = TransferFact(BLOCK, TX, 4, None, "native", None, OTHER, WATCHED, None, 10**18 + 5)
USD_COIN = Token("USDC", 6, "USD Coin")
ERC20 = TransferFact(BLOCK, TX, 4, 9, "ERC20", USDC, WATCHED, OTHER, None, 1_500_000, USD_COIN)
ERC20_UNKNOWN = TransferFact(BLOCK, TX, 4, 9, "ERC20", USDC, WATCHED, OTHER, None, 123)
APE = NftInfo("Ape #1", "an ape", "https://img/1.png", "ipfs://Qm/1", "ok")
APES = Token("BAYC", None, "BoredApeYachtClub")
ERC721 = TransferFact(BLOCK, TX, 4, 10, "ERC721", BAYC, OTHER, WATCHED, 2**70, 1, APES, APE)
ERC1155_MINT = TransferFact(BLOCK, TX, 4, 11, "ERC1155", BAYC, ZERO, WATCHED, 7, 25)
CALL = TransactionFact(BLOCK, TX, 4, WATCHED, USDC, 0, 12, "0xa9059cbb" + "00" * 64, 1, 51_234)
CREATION = TransactionFact(BLOCK, TX, 4, WATCHED, None, 0, 13, "0x6080", 0, 90_000, OTHER)
PENDING = TransactionFact(None, TX, None, WATCHED, OTHER, 3 * 10**17, 14, "0x")
LOG = LogFact(BLOCK, TX, 4, 12, USDC, ("0x" + "dd" * 32, "0x" + "00" * 12 + "5a" * 20), "0x01")
INTERNAL = InternalTransferFact(BLOCK, TX, USDC, WATCHED, 25 * 10**16, "CALL", (0, 2))
NEW_BLOCK = BlockFact(BLOCK, "0x" + "aa" * 32, 12_000_000, 30_000_000, 7_000_000_000, 140)


def match(kind: Kind, fact: Fact, *, watched: bool = False) -> Match:
    if watched:
        sender = getattr(fact, "sender", None)
        direction: Literal["incoming", "outgoing"] = "outgoing" if sender == WATCHED else "incoming"
        return Match(WEBHOOK, kind, fact, WATCHED, direction)
    return Match(WEBHOOK, kind, fact)


def render(v: Variant, m: Match | None, *, sequence: int = 7, chain_id: int | None = 1) -> str:
    return v.render(
        m,
        event_id=EVENT,
        webhook_id=WEBHOOK,
        event_type=v.type_name(m.kind if m is not None else "test"),
        chain_label="eth-mainnet",
        chain_id=chain_id,
        sequence=sequence,
        created_at_ms=CREATED_MS,
    )


def decode(body: str) -> Any:
    return msgspec.json.decode(body)


def cs(address: str) -> str:
    return str(to_checksum_address(address))


# The names, schedules and what happens after the last retry.


def test_variant_a_names_and_schedule() -> None:
    assert VARIANT_A.name == "a"
    assert dict(VARIANT_A.event_types) == {
        "address_activity": "address_activity",
        "token_transfer": "token_transfer",
        "nft_transfer": "nft_transfer",
        "mined_transaction": "mined_transaction",
        "log": "log",
    }
    assert VARIANT_A.retry_delays == (10, 60, 600, 3600, 21600)
    assert VARIANT_A.exhausted == "pause"
    assert VARIANT_A.type_name("test") == "webhook_test"
    with pytest.raises(ValueError, match="new_block"):
        VARIANT_A.type_name("new_block")


def test_variant_b_names_and_schedule() -> None:
    assert VARIANT_B.name == "b"
    assert dict(VARIANT_B.event_types) == {
        "ADDRESS_ACTIVITY": "address_activity",
        "MINED_TRANSACTION": "mined_transaction",
        "NFT_ACTIVITY": "nft_transfer",
        "TOKEN_TRANSFER": "token_transfer",
        "INTERNAL_TRANSFER": "internal_transfer",
        "NEW_BLOCK": "new_block",
        "PENDING_TRANSACTION": "pending_transaction",
    }
    assert VARIANT_B.retry_delays == (1, 5, 30, 300, 1800, 7200, 28800)
    assert sum(VARIANT_B.retry_delays) / 3600 == pytest.approx(10.6, abs=0.1)  # "about 10 hours"
    assert VARIANT_B.exhausted == "fail"
    assert VARIANT_B.type_name("test") == "WEBHOOK_TEST"
    assert VARIANT_B.type_name("nft_transfer") == "NFT_ACTIVITY"
    with pytest.raises(ValueError, match="log"):
        VARIANT_B.type_name("log")


def test_variant_lookup() -> None:
    assert variant("a") is VARIANT_A
    assert variant("B") is VARIANT_B
    for v in (VARIANT_A, VARIANT_B):
        assert "test" not in v.event_types.values()
        for name, kind in v.event_types.items():
            assert v.type_name(kind) == name
    with pytest.raises(ValueError, match="variant"):
        variant("c")


# Variant A: the envelope and the spec's payloads, field by field.


def test_a_envelope() -> None:
    body = decode(render(VARIANT_A, match("token_transfer", ERC20)))
    envelope = ["id", "event_type", "webhook_id", "created_at", "sequence", "removed", "data"]
    assert list(body) == envelope
    assert body["id"] == EVENT
    assert body["event_type"] == "token_transfer"
    assert body["webhook_id"] == WEBHOOK
    assert body["created_at"] == "2024-05-01T12:00:00.123Z"
    parsed = datetime.fromisoformat(body["created_at"])
    assert parsed == datetime.fromtimestamp(CREATED_MS / 1000, UTC)
    assert body["sequence"] == 7
    assert body["removed"] is False


def test_a_address_activity_native_incoming() -> None:
    data = decode(render(VARIANT_A, match("address_activity", NATIVE, watched=True)))["data"]
    assert data["chain"] == "eth-mainnet"
    assert data["block_number"] == BLOCK.number
    assert data["tx_hash"] == TX
    assert data["from"] == cs(OTHER)
    assert data["to"] == cs(WATCHED)
    assert data["value"] == str(10**18 + 5)
    assert data["asset"] == "ETH"
    assert data["contract"] is None
    assert data["direction"] == "incoming"
    # Beyond the spec:
    assert data["block_hash"] == BLOCK.hash
    assert data["block_timestamp"] == BLOCK.timestamp
    assert data["log_index"] is None
    assert data["address"] == cs(WATCHED)
    assert data["category"] == "native"
    assert data["decimals"] == 18
    assert data["token_id"] is None


def test_a_address_activity_token_outgoing() -> None:
    data = decode(render(VARIANT_A, match("address_activity", ERC20, watched=True)))["data"]
    assert data["from"] == cs(WATCHED)
    assert data["to"] == cs(OTHER)
    assert data["value"] == "1500000"
    assert data["asset"] == "USDC"
    assert data["contract"] == cs(USDC)
    assert data["direction"] == "outgoing"
    assert data["log_index"] == 9
    assert data["category"] == "erc20"
    assert data["decimals"] == 6


def test_a_address_activity_contract_call_and_creation() -> None:
    call = decode(render(VARIANT_A, match("address_activity", CALL, watched=True)))["data"]
    assert call["category"] == "contract_call"
    assert call["to"] == cs(USDC)
    assert call["asset"] == "ETH"
    assert call["contract"] is None  # the value moved (none here) is native
    assert call["value"] == "0"
    created = decode(render(VARIANT_A, match("address_activity", CREATION, watched=True)))
    assert created["data"]["category"] == "contract_creation"
    assert created["data"]["to"] == cs(OTHER)  # the new contract


def test_a_token_transfer() -> None:
    data = decode(render(VARIANT_A, match("token_transfer", ERC20)))["data"]
    assert data["chain"] == "eth-mainnet"
    assert data["block_number"] == BLOCK.number
    assert data["tx_hash"] == TX
    assert data["contract"] == cs(USDC)
    assert data["from"] == cs(WATCHED)
    assert data["to"] == cs(OTHER)
    assert data["value"] == "1500000"
    assert data["symbol"] == "USDC"
    assert data["decimals"] == 6
    assert data["block_hash"] == BLOCK.hash
    assert data["log_index"] == 9


def test_a_token_transfer_of_an_unknown_token() -> None:
    data = decode(render(VARIANT_A, match("token_transfer", ERC20_UNKNOWN)))["data"]
    assert data["symbol"] is None
    assert data["decimals"] is None
    assert data["value"] == "123"
    activity = decode(render(VARIANT_A, match("address_activity", ERC20_UNKNOWN, watched=True)))
    assert activity["data"]["asset"] is None
    assert activity["data"]["decimals"] is None


def test_a_nft_transfer() -> None:
    data = decode(render(VARIANT_A, match("nft_transfer", ERC721)))["data"]
    assert data["chain"] == "eth-mainnet"
    assert data["block_number"] == BLOCK.number
    assert data["tx_hash"] == TX
    assert data["contract"] == cs(BAYC)
    assert data["from"] == cs(OTHER)
    assert data["to"] == cs(WATCHED)
    assert data["token_id"] == str(2**70)  # a string: ids exceed every JSON number type
    assert data["standard"] == "ERC721"
    assert data["quantity"] == 1
    assert data["block_hash"] == BLOCK.hash
    assert data["log_index"] == 10
    batch = decode(render(VARIANT_A, match("nft_transfer", ERC1155_MINT)))["data"]
    assert batch["standard"] == "ERC1155"
    assert batch["quantity"] == 25
    assert batch["token_id"] == "7"
    assert batch["from"] == cs(ZERO)


def test_a_mined_transaction_and_log() -> None:
    tx = decode(render(VARIANT_A, match("mined_transaction", CALL)))["data"]
    assert tx == {
        "chain": "eth-mainnet",
        "block_number": BLOCK.number,
        "block_hash": BLOCK.hash,
        "block_timestamp": BLOCK.timestamp,
        "tx_hash": TX,
        "tx_index": 4,
        "from": cs(WATCHED),
        "to": cs(USDC),
        "contract_address": None,
        "value": "0",
        "nonce": 12,
        "status": "success",
        "gas_used": 51_234,
        "input": CALL.input,
    }
    reverted = decode(render(VARIANT_A, match("mined_transaction", CREATION)))["data"]
    assert reverted["status"] == "reverted"
    assert reverted["to"] is None
    assert reverted["contract_address"] == cs(OTHER)
    log = decode(render(VARIANT_A, match("log", LOG)))["data"]
    assert log == {
        "chain": "eth-mainnet",
        "block_number": BLOCK.number,
        "block_hash": BLOCK.hash,
        "block_timestamp": BLOCK.timestamp,
        "tx_hash": TX,
        "tx_index": 4,
        "log_index": 12,
        "address": cs(USDC),
        "topics": list(LOG.topics),  # hashes and topics stay lowercase: they are not addresses
        "data": "0x01",
    }


# Variant B: the envelope, TOKEN_TRANSFER field by field, and the payloads we chose.


def test_b_envelope() -> None:
    body = decode(render(VARIANT_B, match("token_transfer", ERC20), chain_id=137))
    envelope = ["id", "type", "createdAt", "chain", "chainId", "webhookId", "sequence"]
    assert list(body) == [*envelope, "removed", "data"]
    assert body["id"] == EVENT
    assert body["type"] == "TOKEN_TRANSFER"
    assert body["createdAt"] == "2024-05-01T12:00:00.123Z"
    assert body["chain"] == "eth-mainnet"
    assert body["chainId"] == 137
    assert body["webhookId"] == WEBHOOK
    assert body["sequence"] == 7
    assert body["removed"] is False
    unknown_chain = decode(render(VARIANT_B, match("new_block", NEW_BLOCK), chain_id=None))
    assert unknown_chain["chainId"] is None


def test_b_token_transfer() -> None:
    data = decode(render(VARIANT_B, match("token_transfer", ERC20)))["data"]
    assert data["blockNumber"] == BLOCK.number
    assert data["transactionHash"] == TX
    assert data["logIndex"] == 9
    assert data["from"] == cs(WATCHED)
    assert data["to"] == cs(OTHER)
    assert data["token"] == {"address": cs(USDC), "symbol": "USDC", "decimals": 6}
    assert data["value"] == "1500000"
    assert data["valueFormatted"] == "1.5"
    assert data["blockHash"] == BLOCK.hash
    unknown = decode(render(VARIANT_B, match("token_transfer", ERC20_UNKNOWN)))["data"]
    assert unknown["token"] == {"address": cs(USDC), "symbol": None, "decimals": None}
    assert unknown["value"] == "123"
    assert unknown["valueFormatted"] is None  # never a raw amount passed off as a scaled one


def test_b_address_activity() -> None:
    native = decode(render(VARIANT_B, match("address_activity", NATIVE, watched=True)))["data"]
    assert native["address"] == cs(WATCHED)
    assert native["direction"] == "incoming"
    assert native["category"] == "native"
    assert native["value"] == str(10**18 + 5)
    assert native["valueFormatted"] == "1.000000000000000005"
    assert native["asset"] == "ETH"
    assert native["token"] is None
    assert native["blockHash"] == BLOCK.hash
    token = decode(render(VARIANT_B, match("address_activity", ERC20, watched=True)))["data"]
    assert token["direction"] == "outgoing"
    assert token["token"] == {"address": cs(USDC), "symbol": "USDC", "decimals": 6}
    assert token["logIndex"] == 9
    nft = decode(render(VARIANT_B, match("address_activity", ERC721, watched=True)))["data"]
    assert nft["category"] == "erc721"
    assert nft["tokenId"] == str(2**70)
    internal = match("address_activity", INTERNAL, watched=True)
    assert decode(render(VARIANT_B, internal))["data"]["category"] == "internal"


def test_b_nft_activity_carries_metadata() -> None:
    data = decode(render(VARIANT_B, match("nft_transfer", ERC721)))["data"]
    assert data["activity"] == "transfer"
    assert data["contract"] == {"address": cs(BAYC), "name": "BoredApeYachtClub", "symbol": "BAYC"}
    assert data["tokenId"] == str(2**70)
    assert data["standard"] == "ERC721"
    assert data["quantity"] == 1
    assert data["metadata"] == {
        "name": "Ape #1",
        "description": "an ape",
        "imageUrl": "https://img/1.png",
        "tokenUri": "ipfs://Qm/1",
        "status": "ok",
    }
    mint = decode(render(VARIANT_B, match("nft_transfer", ERC1155_MINT)))["data"]
    assert mint["activity"] == "mint"
    assert mint["quantity"] == 25
    assert mint["contract"] == {"address": cs(BAYC), "name": None, "symbol": None}
    assert mint["metadata"]["status"] == "pending"  # the index has not fetched it yet
    assert mint["metadata"]["name"] is None
    burn = TransferFact(BLOCK, TX, 4, 11, "ERC721", BAYC, WATCHED, ZERO, 5, 1)
    assert decode(render(VARIANT_B, match("nft_transfer", burn)))["data"]["activity"] == "burn"


def test_b_new_block_internal_pending_mined() -> None:
    block = decode(render(VARIANT_B, match("new_block", NEW_BLOCK)))["data"]
    assert block == {
        "blockNumber": BLOCK.number,
        "blockHash": BLOCK.hash,
        "parentHash": NEW_BLOCK.parent_hash,
        "timestamp": BLOCK.timestamp,
        "gasUsed": 12_000_000,
        "gasLimit": 30_000_000,
        "baseFeePerGas": "7000000000",
        "transactionCount": 140,
    }
    internal = decode(render(VARIANT_B, match("internal_transfer", INTERNAL)))["data"]
    assert internal["traceAddress"] == [0, 2]
    assert internal["callType"] == "CALL"
    assert internal["from"] == cs(USDC)
    assert internal["valueFormatted"] == "0.25"
    assert internal["blockHash"] == BLOCK.hash
    pending = decode(render(VARIANT_B, match("pending_transaction", PENDING, watched=True)))
    assert "blockHash" not in pending["data"]
    assert pending["data"]["transactionHash"] == TX
    assert pending["data"]["valueFormatted"] == "0.3"
    assert pending["data"]["direction"] == "outgoing"
    mined = decode(render(VARIANT_B, match("mined_transaction", CALL)))["data"]
    assert mined["status"] == "success"
    assert mined["gasUsed"] == 51_234
    assert mined["transactionIndex"] == 4
    assert mined["blockHash"] == BLOCK.hash


def test_native_symbol_follows_the_chain() -> None:
    m = match("address_activity", NATIVE, watched=True)
    assert decode(render(VARIANT_A, m, chain_id=137))["data"]["asset"] == "POL"
    assert decode(render(VARIANT_B, m, chain_id=56))["data"]["asset"] == "BNB"
    assert decode(render(VARIANT_B, m, chain_id=8453))["data"]["asset"] == "ETH"
    assert decode(render(VARIANT_B, m, chain_id=None))["data"]["asset"] == "ETH"


# Every kind, both variants: the documented fields, EIP-55 addresses, the block hash.

FACTS: dict[Kind, list[Fact]] = {
    "address_activity": [NATIVE, ERC20, ERC20_UNKNOWN, ERC721, CALL, CREATION, INTERNAL],
    "token_transfer": [ERC20, ERC20_UNKNOWN],
    "nft_transfer": [ERC721, ERC1155_MINT],
    "mined_transaction": [CALL, CREATION],
    "log": [LOG],
    "internal_transfer": [INTERNAL],
    "new_block": [NEW_BLOCK],
    "pending_transaction": [PENDING],
}

FIELDS: dict[tuple[str, Kind], set[str]] = {
    ("a", "address_activity"): {
        "chain", "block_number", "block_hash", "block_timestamp", "tx_hash", "log_index",
        "from", "to", "value", "asset", "contract", "direction", "address", "category",
        "decimals", "token_id",
    },
    ("a", "token_transfer"): {
        "chain", "block_number", "block_hash", "block_timestamp", "tx_hash", "log_index",
        "contract", "from", "to", "value", "symbol", "decimals",
    },
    ("a", "nft_transfer"): {
        "chain", "block_number", "block_hash", "block_timestamp", "tx_hash", "log_index",
        "contract", "from", "to", "token_id", "standard", "quantity",
    },
    ("a", "mined_transaction"): {
        "chain", "block_number", "block_hash", "block_timestamp", "tx_hash", "tx_index",
        "from", "to", "contract_address", "value", "nonce", "status", "gas_used", "input",
    },
    ("a", "log"): {
        "chain", "block_number", "block_hash", "block_timestamp", "tx_hash", "tx_index",
        "log_index", "address", "topics", "data",
    },
    ("b", "address_activity"): {
        "blockNumber", "blockHash", "blockTimestamp", "transactionHash", "logIndex", "address",
        "direction", "category", "from", "to", "value", "valueFormatted", "asset", "token",
        "tokenId",
    },
    ("b", "token_transfer"): {
        "blockNumber", "blockHash", "blockTimestamp", "transactionHash", "logIndex", "from",
        "to", "token", "value", "valueFormatted",
    },
    ("b", "nft_transfer"): {
        "blockNumber", "blockHash", "blockTimestamp", "transactionHash", "logIndex", "activity",
        "from", "to", "contract", "tokenId", "standard", "quantity", "metadata",
    },
    ("b", "mined_transaction"): {
        "blockNumber", "blockHash", "blockTimestamp", "transactionHash", "transactionIndex",
        "from", "to", "contractAddress", "value", "nonce", "status", "gasUsed", "input",
    },
    ("b", "internal_transfer"): {
        "blockNumber", "blockHash", "blockTimestamp", "transactionHash", "traceAddress",
        "callType", "from", "to", "value", "valueFormatted", "asset", "address", "direction",
    },
    ("b", "new_block"): {
        "blockNumber", "blockHash", "parentHash", "timestamp", "gasUsed", "gasLimit",
        "baseFeePerGas", "transactionCount",
    },
    ("b", "pending_transaction"): {
        "transactionHash", "from", "to", "value", "valueFormatted", "asset", "nonce", "input",
        "address", "direction",
    },
}  # fmt: skip

ADDRESS_FIELDS = {"from", "to", "contract", "address", "contract_address", "contractAddress"}
CASES = [
    (v, kind, fact)
    for v in (VARIANT_A, VARIANT_B)
    for kind in v.event_types.values()
    for fact in FACTS[kind]
]


@pytest.mark.parametrize(
    ("v", "kind", "fact"),
    CASES,
    ids=[f"{v.name}-{k}-{type(f).__name__}-{i}" for i, (v, k, f) in enumerate(CASES)],
)
def test_every_kind_renders_its_documented_fields(v: Variant, kind: Kind, fact: Fact) -> None:
    body = decode(render(v, match(kind, fact, watched=kind in ("address_activity",))))
    assert body["id"] == EVENT
    assert body["sequence"] == 7
    assert body["removed"] is False
    assert body["event_type" if v is VARIANT_A else "type"] == v.type_name(kind)
    data = body["data"]
    assert set(data) == FIELDS[(v.name, kind)]
    if fact.block is not None:
        assert data["block_hash" if v is VARIANT_A else "blockHash"] == fact.block.hash
    for name in ADDRESS_FIELDS & set(data):
        value = data[name]
        if isinstance(value, dict):
            value = value["address"]
        if value is not None:
            assert value == cs(value), name
    for token in (data.get("token"), data.get("contract")):
        if isinstance(token, dict) and token["address"] is not None:
            assert token["address"] == cs(token["address"])


def test_a_fact_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="token_transfer"):
        render(VARIANT_A, match("token_transfer", LOG))
    with pytest.raises(ValueError, match="new_block"):
        render(VARIANT_A, match("new_block", NEW_BLOCK))


def test_ping() -> None:
    for v, type_name in ((VARIANT_A, "webhook_test"), (VARIANT_B, "WEBHOOK_TEST")):
        for given_type in (type_name, next(iter(v.event_types))):
            body = decode(
                v.render(
                    None,
                    event_id=EVENT,
                    webhook_id=WEBHOOK,
                    event_type=given_type,
                    chain_label="base-sepolia",
                    chain_id=84532,
                    sequence=1,
                    created_at_ms=CREATED_MS,
                )
            )
            assert body["event_type" if v is VARIANT_A else "type"] == type_name
            assert body["id"] == EVENT
            assert body["removed"] is False
            assert body["data"]["message"]
    a = decode(render(VARIANT_A, None))
    assert a["data"]["chain"] == "eth-mainnet"


def test_rendering_is_deterministic() -> None:
    for v, kind, fact in CASES:
        m = match(kind, fact, watched=True)
        first = render(v, m)
        assert render(v, m) == first
        assert render(v, Match(WEBHOOK, kind, fact, WATCHED, m.direction)) == first
        later = decode(render(v, m, sequence=8))
        assert later["sequence"] == 8
        assert later["data"] == decode(first)["data"]


# Removals after a reorg.


@pytest.mark.parametrize(("v", "kind", "fact"), [c for c in CASES if c[2].block is not None])
def test_removal_keeps_type_and_data(v: Variant, kind: Kind, fact: Fact) -> None:
    original = render(v, match(kind, fact, watched=True))
    removal = v.render_removal(original, "evt_removal", 42, CREATED_MS + 60_000)
    before, after = decode(original), decode(removal)
    assert fact.block is not None
    assert after["id"] == "evt_removal"
    assert after["sequence"] == 42
    assert after["removed"] is True
    assert after["data"] == before["data"]
    # The data is re-sent as stored, byte for byte.
    raw_data = original[original.index('"data":') :]
    assert removal.endswith(raw_data)
    if v is VARIANT_A:
        assert after["original_id"] == EVENT
        assert after["event_type"] == before["event_type"]
        assert after["webhook_id"] == WEBHOOK
        assert after["created_at"] == "2024-05-01T12:01:00.123Z"
        assert after["data"]["block_hash"] == fact.block.hash
    else:
        assert after["originalId"] == EVENT
        assert after["type"] == before["type"]
        assert (after["chain"], after["chainId"], after["webhookId"]) == ("eth-mainnet", 1, WEBHOOK)
        assert after["createdAt"] == "2024-05-01T12:01:00.123Z"
        assert after["data"]["blockHash"] == fact.block.hash
    assert v.render_removal(original, "evt_removal", 42, CREATED_MS + 60_000) == removal


# Signatures, verified independently.


def now() -> int:
    return int(time.time())


def sign(v: Variant, body: str, secrets: list[str], ts: int) -> dict[str, str]:
    pairs = v.headers(
        event_id=EVENT,
        event_type=decode(body)["event_type" if v is VARIANT_A else "type"],
        body=body.encode(),
        timestamp=ts,
        secrets=secrets,
    )
    names = [name.lower() for name, _ in pairs]
    assert len(names) == len(set(names))  # no header twice
    return dict(pairs)


def hand_a(secret: str, ts: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()


def hand_b(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_a_headers() -> None:
    secret, ts = new_secret(), now()
    body = render(VARIANT_A, match("token_transfer", ERC20))
    headers = sign(VARIANT_A, body, [secret], ts)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Service-Timestamp"] == str(ts)
    assert headers["X-Service-Signature"] == hand_a(secret, ts, body.encode())
    assert headers["webhook-id"] == EVENT
    assert headers["webhook-timestamp"] == str(ts)
    assert Webhook(secret).verify(body, headers) == decode(body)
    assert verify_a(body.encode(), headers, secret)


def test_b_headers() -> None:
    secret, ts = new_secret(), now()
    body = render(VARIANT_B, match("token_transfer", ERC20))
    headers = sign(VARIANT_B, body, [secret], ts)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Cloud-Signature"] == hand_b(secret, body.encode())
    assert headers["X-Webhook-Event"] == "TOKEN_TRANSFER"
    assert headers["X-Webhook-Idempotency-Key"] == EVENT == decode(body)["id"]
    assert headers["webhook-id"] == EVENT
    assert Webhook(secret).verify(body, headers) == decode(body)
    assert verify_b(body.encode(), headers, secret)


def test_standard_signature_by_hand() -> None:
    secret, ts = new_secret(), now()
    body = render(VARIANT_B, match("new_block", NEW_BLOCK))
    headers = sign(VARIANT_B, body, [secret], ts)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{EVENT}.{ts}.{body}".encode(), hashlib.sha256).digest()
    assert headers["webhook-signature"] == "v1," + base64.b64encode(digest).decode()


@pytest.mark.parametrize("v", [VARIANT_A, VARIANT_B])
def test_rotation_overlap_both_secrets_verify(v: Variant) -> None:
    old, new, stranger = new_secret(), new_secret(), new_secret()
    ts = now()
    body = render(v, match("nft_transfer", ERC721))
    headers = sign(v, body, [new, old], ts)
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == decode(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(stranger).verify(body, headers)
    standard = headers["webhook-signature"].split(" ")
    assert len(standard) == 2
    if v is VARIANT_A:
        own = headers["X-Service-Signature"].split(",")
        assert own == [hand_a(new, ts, body.encode()), hand_a(old, ts, body.encode())]
        assert verify_a(body.encode(), headers, old)
        assert verify_a(body.encode(), headers, new)
        assert not verify_a(body.encode(), headers, stranger)
    else:
        own = headers["X-Cloud-Signature"].split(",")
        assert own == [hand_b(new, body.encode()), hand_b(old, body.encode())]
        assert verify_b(body.encode(), headers, old)
        assert verify_b(body.encode(), headers, new)
        assert not verify_b(body.encode(), headers, stranger)
    # Once the overlap ends only the new secret signs.
    after = sign(v, body, [new], ts)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body, after)
    assert Webhook(new).verify(body, after) == decode(body)


@pytest.mark.parametrize("v", [VARIANT_A, VARIANT_B])
def test_tampering_is_detected(v: Variant) -> None:
    secret, ts = new_secret(), now()
    body = render(v, match("token_transfer", ERC20))
    headers = sign(v, body, [secret], ts)
    tampered = body.replace('"1500000"', '"9500000"')
    assert tampered != body
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, headers)
    verify = verify_a if v is VARIANT_A else verify_b
    assert verify(body.encode(), headers, secret)
    assert not verify(tampered.encode(), headers, secret)
    replayed_id = {**headers, "webhook-id": "evt_other"}
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, replayed_id)


def test_a_receiver_rejects_stale_timestamps() -> None:
    secret, ts = new_secret(), now()
    body = render(VARIANT_A, match("log", LOG)).encode()
    old = sign(VARIANT_A, body.decode(), [secret], ts - 301)
    assert not verify_a(body, old, secret, now=ts)
    assert verify_a(body, old, secret, now=ts - 1)
    # The timestamp is signed: moving it forward breaks the signature.
    moved = {**old, "X-Service-Timestamp": str(ts)}
    assert not verify_a(body, moved, secret, now=ts)
    assert not verify_a(body, {**old, "X-Service-Timestamp": "soon"}, secret, now=ts)
    assert not verify_a(body, {**old, "X-Service-Timestamp": "\u0661" * 10}, secret, now=ts)
    assert not verify_a(body, {"X-Service-Timestamp": str(ts)}, secret, now=ts)


def test_signing_inputs_are_bounded() -> None:
    body = b"{}"
    with pytest.raises(ValueError, match="at least one"):
        VARIANT_A.headers(event_id=EVENT, event_type="log", body=body, timestamp=1, secrets=[])
    three = [new_secret() for _ in range(3)]
    with pytest.raises(ValueError, match="at most"):
        VARIANT_B.headers(event_id=EVENT, event_type="X", body=body, timestamp=1, secrets=three)
    for bad in ("plain-secret", "whsec_", "whsec_not*base64"):
        assert not is_valid_secret(bad)
        with pytest.raises(ValueError, match="secret"):
            VARIANT_A.headers(
                event_id=EVENT, event_type="log", body=body, timestamp=1, secrets=[bad]
            )
    # The same secret twice (a rotation to itself) signs once.
    one = new_secret()
    pairs = VARIANT_B.headers(
        event_id=EVENT, event_type="X", body=body, timestamp=1, secrets=[one, one]
    )
    headers = dict(pairs)
    assert headers["X-Cloud-Signature"] == hand_b(one, body)


def test_new_secret() -> None:
    secrets = {new_secret() for _ in range(50)}
    assert len(secrets) == 50
    for secret in secrets:
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret[6:], validate=True)) == 32
        assert is_valid_secret(secret)
        Webhook(secret)  # accepted by a Standard Webhooks verifier


# Properties: any body, any secret pair, any variant: what is sent verifies, only with them.

secret_bytes = st.binary(min_size=1, max_size=64)


def as_secret(raw: bytes) -> str:
    return "whsec_" + base64.b64encode(raw).decode()


@settings(max_examples=150)
@given(
    body=st.text(max_size=2000),
    new=secret_bytes,
    old=st.one_of(st.none(), secret_bytes),
    event_id=st.text("abcdefghijklmnopqrstuvwxyz234567", min_size=1, max_size=26),
    skew=st.integers(-200, 200),
    which=st.sampled_from([VARIANT_A, VARIANT_B]),
)
def test_property_signatures_verify(
    body: str, new: bytes, old: bytes | None, event_id: str, skew: int, which: Variant
) -> None:
    secrets = [as_secret(new)] + ([as_secret(old)] if old is not None else [])
    ts = now() + skew
    raw = body.encode()
    pairs = which.headers(
        event_id="evt_" + event_id, event_type="T", body=raw, timestamp=ts, secrets=secrets
    )
    headers = dict(pairs)
    for secret in secrets:
        assert Webhook(secret).verify(raw, headers, json_parse=False) is None
        if which is VARIANT_A:
            assert hand_a(secret, ts, raw) in headers["X-Service-Signature"].split(",")
            assert verify_a(raw, headers, secret, now=ts)
        else:
            assert hand_b(secret, raw) in headers["X-Cloud-Signature"].split(",")
            assert verify_b(raw, headers, secret)
    if as_secret(b"\x00" + new) not in secrets:
        assert not (verify_a if which is VARIANT_A else verify_b)(
            raw, headers, as_secret(b"\x00" + new)
        )


@settings(max_examples=200)
@given(amount=st.integers(0, 2**256 - 1), decimals=st.integers(0, 40))
def test_property_value_formatted_is_exact(amount: int, decimals: int) -> None:
    token = Token("TKN", decimals)
    fact = TransferFact(BLOCK, TX, 0, 0, "ERC20", USDC, WATCHED, OTHER, None, amount, token)
    data = decode(render(VARIANT_B, match("token_transfer", fact)))["data"]
    assert data["value"] == str(amount)
    formatted = data["valueFormatted"]
    assert Decimal(formatted) == Decimal(amount).scaleb(-decimals, Context(prec=200))
    assert not formatted.endswith(".") and ("." not in formatted or not formatted.endswith("0"))
