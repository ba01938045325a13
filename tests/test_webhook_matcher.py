"""The webhook matcher (chaingate.webhooks.matchindex): hand-built blocks shaped like anvil's
answers for every kind; the index against a naive reference (hypothesis); the work a block
costs, counted, with 100,000 subscriptions; and call traces from a real anvil."""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate.chain.events import Block, BlockHeader, Log
from chaingate.data.transfers import Transfer, decode_block
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.abi import encode, encode_call, event_topic
from chaingate.evm.keccak import keccak256
from chaingate.webhooks.filters import Filter, FilterError, parse_config
from chaingate.webhooks.matchindex import (
    BlockData,
    MatchIndex,
    Needs,
    Subscription,
    parse_call_traces,
)
from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    InternalTransferFact,
    LogFact,
    Match,
    TransactionFact,
    TransferFact,
)

TRANSFER = event_topic("Transfer(address,address,uint256)")
SINGLE = event_topic("TransferSingle(address,address,address,uint256,uint256)")
BATCH = event_topic("TransferBatch(address,address,address,uint256[],uint256[])")
APPROVAL = event_topic("Approval(address,address,uint256)")
ZERO = "0x" + "00" * 20
A = "0x" + "aa" * 20
B = "0x" + "bb" * 20
C = "0x" + "cc" * 20
D = "0x" + "dd" * 20
TOKEN = "0x" + "70" * 20
OTHER_TOKEN = "0x" + "71" * 20
NFT = "0x" + "72" * 20
ITEMS = "0x" + "73" * 20
TRANSFER_CALL = "0x" + encode_call("transfer(address,uint256)", B, 100).hex()
APPROVE_CALL = "0x" + encode_call("approve(address,uint256)", B, 100).hex()
REF = BlockRef(number=1000, hash="0x" + "b0" * 32, timestamp=1_700_000_000)


def word(value: int | str) -> str:
    """A 32-byte topic: an address or a number."""
    number = int(value, 16) if isinstance(value, str) else value
    return "0x" + number.to_bytes(32, "big").hex()


def data_words(*values: int) -> str:
    return "0x" + b"".join(v.to_bytes(32, "big") for v in values).hex()


def erc20(contract: str, sender: str, receiver: str, amount: int) -> tuple[str, list[str], str]:
    return contract, [TRANSFER, word(sender), word(receiver)], data_words(amount)


def erc721(contract: str, sender: str, receiver: str, token_id: int) -> tuple[str, list[str], str]:
    return contract, [TRANSFER, word(sender), word(receiver), word(token_id)], "0x"


def single(
    contract: str, sender: str, receiver: str, token_id: int, amount: int
) -> tuple[str, list[str], str]:
    topics = [SINGLE, word(sender), word(sender), word(receiver)]
    return contract, topics, data_words(token_id, amount)


def batch(
    contract: str, sender: str, receiver: str, ids: list[int], amounts: list[int]
) -> tuple[str, list[str], str]:
    topics = [BATCH, word(sender), word(sender), word(receiver)]
    return contract, topics, "0x" + encode(["uint256[]", "uint256[]"], [ids, amounts]).hex()


class BlockBuilder:
    """A block as the matcher is handed it: logs as ``eth_getLogs`` gives them, transactions
    and receipts as anvil's ``eth_getBlockByHash(h, true)`` and ``eth_getBlockReceipts``."""

    def __init__(self, ref: BlockRef = REF) -> None:
        self.ref = ref
        self.logs: list[Log] = []
        self.transactions: list[dict[str, Any]] = []
        self.receipts: dict[str, dict[str, Any]] = {}
        self.internal: list[InternalTransferFact] = []

    def tx(
        self,
        sender: str,
        to: str | None,
        value: int = 0,
        *,
        input: str = "0x",
        status: int = 1,
        logs: Sequence[tuple[str, list[str], str]] = (),
        created: str | None = None,
        gas_used: int = 21_000,
    ) -> str:
        index = len(self.transactions)
        tx_hash = "0x" + keccak256(f"{self.ref.hash}/{index}".encode()).hex()
        number = hex(self.ref.number)
        self.transactions.append(
            {
                "type": "0x2",
                "chainId": "0x7a69",
                "nonce": hex(index),
                "gas": "0x30d40",
                "maxFeePerGas": "0x6fca4526",
                "maxPriorityFeePerGas": "0x3b9aca00",
                "to": to,
                "value": hex(value),
                "accessList": [],
                "input": input,
                "r": "0x" + "01" * 32,
                "s": "0x" + "02" * 32,
                "yParity": "0x1",
                "v": "0x1",
                "hash": tx_hash,
                "blockHash": self.ref.hash,
                "blockNumber": number,
                "transactionIndex": hex(index),
                "from": sender,
                "gasPrice": "0x6fca4526",
            }
        )
        entries: list[Log] = []
        for address, topics, data in logs if status == 1 else ():
            entries.append(
                Log(
                    address=address,
                    topics=topics,
                    data=data,
                    block_number=number,
                    block_hash=self.ref.hash,
                    transaction_hash=tx_hash,
                    transaction_index=hex(index),
                    log_index=hex(len(self.logs) + len(entries)),
                )
            )
        self.logs += entries
        self.receipts[tx_hash] = {
            "type": "0x2",
            "status": hex(status),
            "cumulativeGasUsed": hex(gas_used * (index + 1)),
            "logs": msgspec.to_builtins(entries),
            "logsBloom": "0x" + "00" * 256,
            "transactionHash": tx_hash,
            "transactionIndex": hex(index),
            "blockHash": self.ref.hash,
            "blockNumber": number,
            "gasUsed": hex(gas_used),
            "effectiveGasPrice": "0x6fca4526",
            "from": sender,
            "to": to,
            "contractAddress": created,
        }
        return tx_hash

    def internal_transfer(
        self, tx_hash: str, sender: str, receiver: str, value: int, path: tuple[int, ...]
    ) -> None:
        self.internal.append(
            InternalTransferFact(self.ref, tx_hash, sender, receiver, value, "CALL", path)
        )

    @property
    def fact(self) -> BlockFact:
        return BlockFact(
            block=self.ref,
            parent_hash="0x" + "af" * 32,
            gas_used=21_000 * len(self.transactions),
            gas_limit=30_000_000,
            base_fee_per_gas=1_000_000_000,
            transaction_count=len(self.transactions),
        )

    def data(self) -> BlockData:
        return BlockData(
            block=self.fact,
            logs=list(self.logs),
            transactions=list(self.transactions),
            receipts=dict(self.receipts),
            internal=list(self.internal),
        )


def sub(webhook_id: str, kind: str, **config: Any) -> Subscription:
    raw = {("from" if k == "from_" else k): v for k, v in config.items()}
    f = parse_config(kind, raw, max_values=100_000)  # type: ignore[arg-type]
    return Subscription(webhook_id, kind, f)  # type: ignore[arg-type]


def summary(matches: Iterable[Match]) -> list[tuple[Any, ...]]:
    """What tells matches apart, readably."""
    out: list[tuple[Any, ...]] = []
    for m in matches:
        fact = m.fact
        if isinstance(fact, TransferFact):
            item: tuple[Any, ...] = (
                fact.standard,
                fact.tx_index,
                fact.sender,
                fact.receiver,
                fact.token_id,
                fact.amount,
            )
        elif isinstance(fact, TransactionFact):
            item = ("tx", fact.tx_index, fact.sender, fact.receiver, fact.status)
        elif isinstance(fact, LogFact):
            item = ("log", fact.tx_index, fact.log_index)
        elif isinstance(fact, InternalTransferFact):
            item = ("internal", fact.tx_hash, fact.trace_address, fact.value)
        else:
            item = ("block", fact.block.number)
        out.append((m.webhook_id, *item, m.watched, m.direction))
    return out


# --- address activity ------------------------------------------------------------------------


def activity_block() -> BlockBuilder:
    b = BlockBuilder()
    b.tx(A, B, 5)  # 0: a native send
    b.tx(A, TOKEN, input=TRANSFER_CALL, logs=[erc20(TOKEN, A, B, 100)])  # 1: ERC-20 transfer
    b.tx(B, A, 7, status=0)  # 2: reverted: no value moved, still B's transaction
    b.tx(A, A, 1)  # 3: to oneself
    b.tx(C, ITEMS, logs=[batch(ITEMS, C, A, [1, 2], [10, 20])])  # 4: ERC-1155 batch to A
    b.tx(C, D, 9)  # 5: not A's
    b.tx(D, None, 0, input="0x6000", created=C)  # 6: a creation
    return b


def test_address_activity_matches_each_item_and_side_of_a_watched_address() -> None:
    b = activity_block()
    index = MatchIndex([sub("wh_a", "address_activity", addresses=[A])])
    assert index.needs == Needs(transactions=True, receipts=True, traces=False)
    matches = index.match_block(b.data())
    assert summary(matches) == [
        ("wh_a", "native", 0, A, B, None, 5, A, "outgoing"),
        ("wh_a", "tx", 1, A, TOKEN, 1, A, "outgoing"),
        ("wh_a", "ERC20", 1, A, B, None, 100, A, "outgoing"),
        ("wh_a", "tx", 2, B, A, 0, A, "incoming"),
        ("wh_a", "native", 3, A, A, None, 1, A, "outgoing"),
        ("wh_a", "native", 3, A, A, None, 1, A, "incoming"),
        ("wh_a", "ERC1155", 4, C, A, 1, 10, A, "incoming"),
        ("wh_a", "ERC1155", 4, C, A, 2, 20, A, "incoming"),
    ]
    # Facts carry the block, hashes and the receipt's word.
    failed = matches[3].fact
    assert isinstance(failed, TransactionFact)
    assert (failed.block, failed.value, failed.status, failed.gas_used) == (REF, 7, 0, 21_000)
    assert failed.tx_hash == b.transactions[2]["hash"]
    token = matches[2].fact
    assert isinstance(token, TransferFact)
    assert (token.contract, token.log_index, token.block) == (TOKEN, 0, REF)
    # Every match has its own event key (a self-transfer's two sides too).
    assert len({m.key for m in matches}) == len(matches)


def test_address_activity_with_both_parties_watched_reports_each_side() -> None:
    b = activity_block()
    index = MatchIndex([sub("wh_ab", "address_activity", addresses=[B, A])])
    sides = [(s[2], s[-2], s[-1]) for s in summary(index.match_block(b.data())) if s[2] == 0]
    assert sides == [(0, A, "outgoing"), (0, B, "incoming")]


def test_a_reverted_value_transfer_moves_nothing() -> None:
    b = BlockBuilder()
    b.tx(B, A, 7, status=0)
    index = MatchIndex([sub("wh", "address_activity", addresses=[A])])
    [match] = index.match_block(b.data())
    assert isinstance(match.fact, TransactionFact)  # an interaction, not a TransferFact
    assert match.fact.status == 0


def test_a_contract_creation_is_incoming_for_the_new_contract() -> None:
    b = activity_block()
    index = MatchIndex([sub("wh_c", "address_activity", addresses=[C])])
    found = summary(index.match_block(b.data()))
    assert found == [
        ("wh_c", "tx", 4, C, ITEMS, 1, C, "outgoing"),
        ("wh_c", "ERC1155", 4, C, A, 1, 10, C, "outgoing"),
        ("wh_c", "ERC1155", 4, C, A, 2, 20, C, "outgoing"),
        ("wh_c", "native", 5, C, D, None, 9, C, "outgoing"),
        ("wh_c", "tx", 6, D, None, 1, C, "incoming"),
    ]


def test_selectors_keep_only_items_of_transactions_calling_them() -> None:
    b = activity_block()
    index = MatchIndex(
        [
            sub("wh_t", "address_activity", addresses=[A], selectors=["transfer(address,uint256)"]),
            sub("wh_x", "address_activity", addresses=[A], selectors=[APPROVE_CALL[:10]]),
        ]
    )
    assert summary(index.match_block(b.data())) == [
        ("wh_t", "tx", 1, A, TOKEN, 1, A, "outgoing"),
        ("wh_t", "ERC20", 1, A, B, None, 100, A, "outgoing"),
    ]


# --- token and NFT transfers -----------------------------------------------------------------


def transfers_block() -> BlockBuilder:
    b = BlockBuilder()
    b.tx(
        A,
        TOKEN,
        logs=[
            erc20(TOKEN, A, B, 100),
            erc20(TOKEN, B, C, 99),
            erc20(OTHER_TOKEN, A, C, 1000),
            erc721(NFT, ZERO, A, 7),  # a mint: same topic0, four topics
            (TOKEN, [APPROVAL, word(A), word(B)], data_words(5)),
        ],
    )
    b.tx(
        C,
        ITEMS,
        logs=[single(ITEMS, C, A, 3, 2), batch(ITEMS, A, ZERO, [4, 5, 6], [1, 1, 1])],
    )
    b.tx(A, NFT, logs=[erc721(NFT, A, D, 8)])
    return b


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"contracts": [TOKEN]}, [(A, B, 100), (B, C, 99)]),
        ({"addresses": [B]}, [(A, B, 100), (B, C, 99)]),
        ({"from": [A]}, [(A, B, 100), (A, C, 1000)]),
        ({"to": [C]}, [(B, C, 99), (A, C, 1000)]),
        ({"from": [A], "to": [C]}, [(A, C, 1000)]),
        ({"contracts": [TOKEN], "addresses": [C]}, [(B, C, 99)]),
        ({"addresses": [A, B]}, [(A, B, 100), (B, C, 99), (A, C, 1000)]),  # A->B once
        ({"addresses": [A], "min_value": 1000}, [(A, C, 1000)]),
        ({"addresses": [A], "min_value": "1001"}, []),
        ({"addresses": [A], "min_value": 100}, [(A, B, 100), (A, C, 1000)]),
        ({"contracts": [NFT]}, []),  # ERC-721 is not a token transfer
    ],
)
def test_token_transfer_filters(config: dict[str, Any], expected: list[tuple[Any, ...]]) -> None:
    index = MatchIndex([sub("wh", "token_transfer", **config)])
    assert index.needs == Needs()
    matches = index.match_block(transfers_block().data())
    assert [(s[3], s[4], s[6]) for s in summary(matches)] == expected
    assert all(s[1] == "ERC20" for s in summary(matches))


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"contracts": [NFT]}, [("ERC721", ZERO, A, 7), ("ERC721", A, D, 8)]),
        (
            {"contracts": [ITEMS]},
            [("ERC1155", C, A, 3), *[("ERC1155", A, ZERO, i) for i in (4, 5, 6)]],
        ),
        (
            {"contracts": [ITEMS], "token_ids": [5, 3]},
            [("ERC1155", C, A, 3), ("ERC1155", A, ZERO, 5)],
        ),
        ({"to": [ZERO]}, [("ERC1155", A, ZERO, i) for i in (4, 5, 6)]),  # burns
        ({"from": [ZERO]}, [("ERC721", ZERO, A, 7)]),  # mints
        (
            {"addresses": [A]},
            [
                ("ERC721", ZERO, A, 7),
                ("ERC1155", C, A, 3),
                *[("ERC1155", A, ZERO, i) for i in (4, 5, 6)],
                ("ERC721", A, D, 8),
            ],
        ),
        ({"contracts": [TOKEN]}, []),  # ERC-20 is not an NFT transfer
    ],
)
def test_nft_transfer_filters(config: dict[str, Any], expected: list[tuple[Any, ...]]) -> None:
    index = MatchIndex([sub("wh", "nft_transfer", **config)])
    matches = index.match_block(transfers_block().data())
    assert [(s[1], s[3], s[4], s[5]) for s in summary(matches)] == expected


def test_a_batch_gives_one_event_per_token_id() -> None:
    index = MatchIndex([sub("wh", "nft_transfer", contracts=[ITEMS], to=[ZERO])])
    matches = index.match_block(transfers_block().data())
    assert len({m.key for m in matches}) == 3
    assert {m.fact.log_index for m in matches if isinstance(m.fact, TransferFact)} == {6}


# --- mined transactions ----------------------------------------------------------------------


def test_mined_transaction_reports_status_and_gas_used() -> None:
    b = BlockBuilder()
    ok = b.tx(A, B, 1, gas_used=21_000)
    failed = b.tx(A, TOKEN, input=TRANSFER_CALL, status=0, gas_used=30_123)
    index = MatchIndex(
        [
            sub("wh_1", "mined_transaction", transaction_hashes=[failed, "0x" + "ee" * 32]),
            sub("wh_2", "mined_transaction", transaction_hashes=[ok.upper().replace("0X", "0x")]),
        ]
    )
    assert index.needs == Needs(transactions=True, receipts=True)
    first, second = index.match_block(b.data())
    assert first.webhook_id == "wh_2"
    assert isinstance(first.fact, TransactionFact) and isinstance(second.fact, TransactionFact)
    assert (first.fact.tx_hash, first.fact.status, first.fact.gas_used) == (ok, 1, 21_000)
    assert (second.fact.tx_hash, second.fact.status, second.fact.gas_used) == (failed, 0, 30_123)
    assert second.fact.input == TRANSFER_CALL
    assert (second.fact.tx_index, second.fact.nonce, second.fact.block) == (1, 1, REF)


def test_missing_block_data_the_subscriptions_need_is_an_error() -> None:
    b = BlockBuilder()
    b.tx(A, B, 1)
    index = MatchIndex([sub("wh", "mined_transaction", transaction_hashes=["0x" + "ee" * 32])])
    with pytest.raises(ValueError, match="transactions"):
        index.match_block(msgspec.structs.replace(b.data(), transactions=None))
    with pytest.raises(ValueError, match="receipts"):
        index.match_block(msgspec.structs.replace(b.data(), receipts=None))
    with pytest.raises(ValueError, match="no receipt"):
        index.match_block(msgspec.structs.replace(b.data(), receipts={}))
    internal = MatchIndex([sub("wh", "internal_transfer", addresses=[A])])
    with pytest.raises(ValueError, match="traces"):
        internal.match_block(msgspec.structs.replace(b.data(), internal=None))


# --- logs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"addresses": [TOKEN]}, [0, 1, 4]),
        ({"addresses": [TOKEN], "topics": [APPROVAL]}, [4]),
        ({"topics": [TRANSFER]}, [0, 1, 2, 3, 7]),
        ({"topics": [TRANSFER, None, None]}, [0, 1, 2, 3, 7]),
        ({"topics": [TRANSFER, None, None, None]}, [3, 7]),  # four topics: ERC-721 only
        ({"topics": [None, word(A)]}, [0, 2, 4, 6, 7]),  # topic0 a wildcard
        ({"topics": [None, None, word(C)]}, [1, 2, 5]),
        ({"topics": [[APPROVAL, TRANSFER], [word(B), word(ZERO)]]}, [1, 3]),
        ({"topics": [SINGLE, None, word(C), word(A)]}, [5]),
        ({"addresses": [ITEMS, NFT], "topics": [[SINGLE, BATCH]]}, [5, 6]),
        ({"addresses": [D]}, []),
    ],
)
def test_log_filters_follow_eth_get_logs_rules(config: dict[str, Any], expected: list[int]) -> None:
    index = MatchIndex([sub("wh", "log", **config)])
    assert index.needs == Needs()
    matches = index.match_block(transfers_block().data())
    assert [s[3] for s in summary(matches)] == expected
    for m in matches:
        assert isinstance(m.fact, LogFact)
        assert m.fact.block == REF and len(m.fact.topics) >= 1


def test_a_log_fact_carries_the_log() -> None:
    b = transfers_block()
    [match] = MatchIndex([sub("wh", "log", addresses=[TOKEN], topics=[APPROVAL])]).match_block(
        b.data()
    )
    assert match.fact == LogFact(
        block=REF,
        tx_hash=b.transactions[0]["hash"],
        tx_index=0,
        log_index=4,
        address=TOKEN,
        topics=(APPROVAL, word(A), word(B)),
        data=data_words(5),
    )


def test_removed_logs_are_not_matched() -> None:
    b = transfers_block()
    data = b.data()
    removed = [msgspec.structs.replace(entry, removed=True) for entry in data.logs]
    data = msgspec.structs.replace(data, logs=removed)
    index = MatchIndex(
        [sub("wh_log", "log", addresses=[TOKEN]), sub("wh_t", "token_transfer", contracts=[TOKEN])]
    )
    assert index.match_block(data) == []


# --- internal transfers, new blocks, pending -------------------------------------------------


def test_internal_transfers_match_either_party_and_min_value() -> None:
    b = BlockBuilder()
    first = b.tx(A, TOKEN, 10, logs=[erc20(TOKEN, A, B, 1)])
    second = b.tx(B, TOKEN, 0)
    b.internal_transfer(first, TOKEN, B, 4, (0,))
    b.internal_transfer(first, TOKEN, C, 6, (0, 1))
    b.internal_transfer(second, C, B, 100, (2,))
    index = MatchIndex(
        [
            sub("wh_b", "internal_transfer", addresses=[B]),
            sub("wh_c", "internal_transfer", addresses=[C, B], min_value=6),
            sub("wh_log", "log", addresses=[TOKEN]),
        ]
    )
    assert index.needs == Needs(transactions=True, receipts=False, traces=True)
    found = summary(index.match_block(b.data()))
    assert found == [
        ("wh_log", "log", 0, 0, None, None),  # a transaction's logs come before its traces
        ("wh_b", "internal", first, (0,), 4, None, None),
        ("wh_c", "internal", first, (0, 1), 6, None, None),
        ("wh_b", "internal", second, (2,), 100, None, None),
        ("wh_c", "internal", second, (2,), 100, None, None),  # C->B: once, though both watched
    ]


def test_new_block_matches_every_block_first() -> None:
    b = transfers_block()
    index = MatchIndex([sub("wh_z", "new_block"), sub("wh_log", "log", addresses=[TOKEN])])
    assert index.needs == Needs()
    matches = index.match_block(b.data())
    assert matches[0] == Match("wh_z", "new_block", b.fact)
    assert len(matches) == 4
    assert MatchIndex([sub("wh", "new_block")]).match_block(BlockBuilder().data()) == [
        Match("wh", "new_block", BlockBuilder().fact)
    ]


def test_pending_transactions_match_by_either_party_and_selector() -> None:
    b = BlockBuilder()
    b.tx(A, TOKEN, input=TRANSFER_CALL)
    b.tx(C, A, 5)
    b.tx(A, B, 1)
    b.tx(C, D, 1)
    pending = [
        dict(tx, blockHash=None, blockNumber=None, transactionIndex=None) for tx in b.transactions
    ]
    pending.insert(1, {"hash": "0x12", "from": A})  # malformed: skipped, not fatal
    pending.insert(1, {"from": None, "to": A})
    index = MatchIndex(
        [
            sub("wh_p", "pending_transaction", addresses=[A, B]),
            sub("wh_s", "pending_transaction", addresses=[A], selectors=[TRANSFER_CALL[:10]]),
            sub("wh_a", "address_activity", addresses=[A]),
        ]
    )
    assert index.wants_pending
    assert not MatchIndex([sub("wh", "address_activity", addresses=[A])]).wants_pending
    matches = index.match_pending(pending)
    found = [(m.webhook_id, m.fact.sender, m.fact.receiver) for m in matches]  # type: ignore[union-attr]
    assert found == [
        ("wh_p", A, TOKEN),
        ("wh_s", A, TOKEN),
        ("wh_p", C, A),
        ("wh_p", A, B),  # both parties watched: once
    ]
    for m in matches:
        assert m.kind == "pending_transaction"
        assert isinstance(m.fact, TransactionFact)
        assert (m.fact.block, m.fact.tx_index, m.fact.status) == (None, None, None)
        assert m.key.split("|")[1] == "pending"


def test_pending_transactions_do_not_match_blocks() -> None:
    index = MatchIndex([sub("wh_p", "pending_transaction", addresses=[A])])
    assert index.needs == Needs()
    assert index.match_block(activity_block().data()) == []


# --- order -----------------------------------------------------------------------------------


def mixed_subscriptions() -> list[Subscription]:
    return [
        sub("wh_1", "address_activity", addresses=[A, C]),
        sub("wh_2", "token_transfer", addresses=[A]),
        sub("wh_3", "nft_transfer", contracts=[ITEMS, NFT]),
        sub("wh_4", "log", topics=[TRANSFER]),
        sub("wh_5", "new_block"),
        sub("wh_6", "mined_transaction", transaction_hashes=[BlockBuilder().tx(A, B)]),
        sub("wh_0", "address_activity", addresses=[B]),
    ]


def test_matches_come_in_block_order_whatever_the_subscription_order() -> None:
    b = transfers_block()
    subs = mixed_subscriptions()
    expected = MatchIndex(subs).match_block(b.data())
    positions = []
    for m in expected:
        fact = m.fact
        if isinstance(fact, BlockFact):
            positions.append((-1, -1))
        elif isinstance(fact, TransferFact | LogFact):
            positions.append((fact.tx_index, fact.log_index if fact.log_index is not None else -1))
        elif isinstance(fact, TransactionFact):
            assert fact.tx_index is not None
            positions.append((fact.tx_index, -1))
    assert positions == sorted(positions)
    assert len(expected) > 10
    shuffled = list(subs)
    for seed in range(5):
        random.Random(seed).shuffle(shuffled)
        assert MatchIndex(shuffled).match_block(b.data()) == expected


# --- the index against a naive reference -----------------------------------------------------


def reference(subscriptions: Sequence[Subscription], data: BlockData) -> list[Match]:
    """Every subscription against every item, straight from the definitions."""
    ref = data.block.block
    txs = data.transactions or []
    receipts = data.receipts or {}
    header = BlockHeader(ref.number, ref.hash, "0x", ref.timestamp, 0, 0, None, 0, {})
    logs: list[Transfer] = []
    for t in decode_block(Block(header, list(data.logs), [])).transfers:
        same = [
            i
            for i, seen in enumerate(logs)
            if t.standard == "ERC1155"
            and (seen.tx_hash, seen.log_index, seen.token_id)
            == (t.tx_hash, t.log_index, t.token_id)
        ]
        if same:  # an id named twice in one batch: one transfer of the sum
            logs[same[0]] = msgspec.structs.replace(
                logs[same[0]], amount=logs[same[0]].amount + t.amount
            )
        else:
            logs.append(t)
    out: list[Match] = []

    def tx_fact(tx: Mapping[str, Any]) -> TransactionFact:
        receipt = receipts[tx["hash"]]
        return TransactionFact(
            ref,
            tx["hash"],
            int(tx["transactionIndex"], 16),
            tx["from"],
            tx["to"],
            int(tx["value"], 16),
            int(tx["nonce"], 16),
            tx["input"],
            int(receipt["status"], 16),
            int(receipt["gasUsed"], 16),
            receipt["contractAddress"],
        )

    def fits(values: tuple[str, ...], value: str | None) -> bool:
        return not values or value in values

    def transfer_fits(f: Filter, t: TransferFact) -> bool:
        return (
            fits(f.contracts, t.contract)
            and (not f.addresses or t.sender in f.addresses or t.receiver in f.addresses)
            and fits(f.from_, t.sender)
            and fits(f.to, t.receiver)
            and t.amount >= int(f.min_value or 0)
            and (not f.token_ids or str(t.token_id) in f.token_ids)
        )

    selector = {tx["hash"]: tx["input"][:10] for tx in txs}
    for s in subscriptions:
        f = s.filter
        if s.kind == "new_block":
            out.append(Match(s.webhook_id, s.kind, data.block))
        for tx in txs:
            receipt = receipts[tx["hash"]]
            ok = receipt["status"] == "0x1"
            value = int(tx["value"], 16)
            receiver = tx["to"] or receipt["contractAddress"]
            if s.kind == "mined_transaction" and tx["hash"] in f.transaction_hashes:
                out.append(Match(s.webhook_id, s.kind, tx_fact(tx)))
            if s.kind != "address_activity" or not fits(f.selectors, tx["input"][:10]):
                continue
            fact: Any = tx_fact(tx)
            if ok and value:
                index = int(tx["transactionIndex"], 16)
                fact = TransferFact(
                    ref, tx["hash"], index, None, "native", None, tx["from"], receiver, None, value
                )
            for address, direction in ((tx["from"], "outgoing"), (receiver, "incoming")):
                if address in f.addresses:
                    out.append(Match(s.webhook_id, s.kind, fact, address, direction))  # type: ignore[arg-type]
        for t in logs:
            fact = TransferFact(
                ref,
                t.tx_hash,
                t.tx_index,
                t.log_index,
                t.standard,
                t.contract,
                t.sender,
                t.receiver,
                t.token_id,
                t.amount,
            )
            if s.kind == "address_activity" and fits(f.selectors, selector[t.tx_hash]):
                for address, direction in ((t.sender, "outgoing"), (t.receiver, "incoming")):
                    if address in f.addresses:
                        out.append(Match(s.webhook_id, s.kind, fact, address, direction))  # type: ignore[arg-type]
            standards = {"token_transfer": ("ERC20",), "nft_transfer": ("ERC721", "ERC1155")}
            if t.standard in standards.get(s.kind, ()) and transfer_fits(f, fact):
                out.append(Match(s.webhook_id, s.kind, fact))
        for entry in data.logs if s.kind == "log" else ():
            topics = tuple(entry.topics)
            if f.addresses and entry.address not in f.addresses:
                continue
            if len(topics) < len(f.topics) or any(
                want is not None and got not in want
                for want, got in zip(f.topics, topics, strict=False)
            ):
                continue
            fact = LogFact(
                ref,
                entry.transaction_hash,
                int(entry.transaction_index, 16),
                int(entry.log_index, 16),
                entry.address,
                topics,
                entry.data,
            )
            out.append(Match(s.webhook_id, s.kind, fact))
        for internal in data.internal or () if s.kind == "internal_transfer" else ():
            involved = internal.sender in f.addresses or internal.receiver in f.addresses
            if involved and internal.value >= int(f.min_value or 0):
                out.append(Match(s.webhook_id, s.kind, internal))
    return out


POOL = [A, B, C, D]
CONTRACTS = [TOKEN, NFT, ITEMS]
SELECTORS = [TRANSFER_CALL[:10], APPROVE_CALL[:10]]
TOPICS = [TRANSFER, APPROVAL, word(A), word(B)]
party = st.sampled_from(POOL)
contract = st.sampled_from(CONTRACTS)
some = st.lists  # readability below


@st.composite
def log_entries(draw: st.DrawFn) -> tuple[str, list[str], str]:
    shape = draw(st.sampled_from(["erc20", "erc721", "single", "batch", "other"]))
    token = draw(contract)
    sender, receiver = draw(party), draw(party)
    amount = draw(st.integers(0, 3))
    if shape == "erc20":
        return erc20(token, sender, receiver, amount)
    if shape == "erc721":
        return erc721(token, sender, receiver, amount)
    if shape == "single":
        return single(token, sender, receiver, amount, draw(st.integers(0, 3)))
    if shape == "batch":
        ids = draw(some(st.integers(0, 3), max_size=3))
        return batch(token, sender, receiver, ids, [1] * len(ids))
    topics = draw(some(st.sampled_from(TOPICS), max_size=4))
    return draw(st.sampled_from([*CONTRACTS, *POOL])), topics, "0x"


@st.composite
def blocks(draw: st.DrawFn) -> BlockData:
    b = BlockBuilder()
    for _ in range(draw(st.integers(0, 5))):
        creation = draw(st.booleans()) and draw(st.booleans())
        tx_hash = b.tx(
            draw(party),
            None if creation else draw(st.sampled_from(POOL + CONTRACTS)),
            draw(st.sampled_from([0, 0, 1, 3])),
            input=draw(st.sampled_from([*SELECTORS, "0x"])) + "00" * 4,
            status=draw(st.sampled_from([1, 1, 0])),
            logs=draw(some(log_entries(), max_size=3)),
            created=draw(party) if creation else None,
        )
        for path in range(draw(st.integers(0, 2))):
            b.internal_transfer(tx_hash, draw(party), draw(party), draw(st.integers(1, 3)), (path,))
    return b.data()


@st.composite
def subscriptions(draw: st.DrawFn, data: BlockData) -> list[Subscription]:
    hashes = [tx["hash"] for tx in data.transactions or ()] + ["0x" + "ee" * 32]
    values = {
        "addresses": some(st.sampled_from(POOL + CONTRACTS), min_size=1, max_size=2),
        "contracts": some(contract, min_size=1, max_size=2),
        "from": some(party, min_size=1, max_size=2),
        "to": some(party, min_size=1, max_size=2),
        "min_value": st.integers(0, 3),
        "token_ids": some(st.integers(0, 3), min_size=1, max_size=2),
        "selectors": some(st.sampled_from(SELECTORS), min_size=1, max_size=2),
        "transaction_hashes": some(st.sampled_from(hashes), min_size=1, max_size=2),
        "topics": some(
            st.one_of(
                st.none(), st.sampled_from(TOPICS), some(st.sampled_from(TOPICS), min_size=1)
            ),
            max_size=4,
        ),
    }
    keys = {
        "address_activity": ("addresses", "selectors"),
        "token_transfer": ("contracts", "addresses", "from", "to", "min_value"),
        "nft_transfer": ("contracts", "addresses", "from", "to", "token_ids"),
        "mined_transaction": ("transaction_hashes",),
        "log": ("addresses", "topics"),
        "internal_transfer": ("addresses", "min_value"),
        "new_block": (),
    }
    found = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(sorted(keys)))
        chosen = draw(st.sets(st.sampled_from(keys[kind]))) if keys[kind] else set()
        raw = {key: draw(values[key]) for key in chosen}
        try:
            f = parse_config(kind, raw, max_values=100)  # type: ignore[arg-type]
        except FilterError:
            continue
        found.append(Subscription(f"wh_{i}", kind, f))  # type: ignore[arg-type]
    return found


@settings(max_examples=400)
@given(st.data())
def test_the_index_matches_what_the_naive_reference_does(data: st.DataObject) -> None:
    block = data.draw(blocks())
    subs = data.draw(subscriptions(block))
    index = MatchIndex(subs)
    got = index.match_block(block)
    assert Counter(got) == Counter(reference(subs, block))
    assert len({(m.webhook_id, m.key) for m in got}) == len(got)  # no event twice


# --- what a block costs ----------------------------------------------------------------------


def addresses(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["0x" + rng.randbytes(20).hex() for _ in range(count)]


def busy_block(parties: Sequence[str]) -> BlockBuilder:
    """200 transactions, 600 logs: transfers among ``parties``, plus unrelated events."""
    b = BlockBuilder()
    rng = random.Random(7)
    for i in range(200):
        a, c = rng.choice(parties), rng.choice(parties)
        entries = [
            erc20(TOKEN, a, c, i),
            erc721(NFT, c, a, i),
            (ITEMS, [APPROVAL, word(a), word(c)], data_words(i)),
        ]
        b.tx(a, c, i % 3, input=TRANSFER_CALL, logs=entries, status=1 if i % 10 else 0)
    return b


@functools.cache
def hundred_thousand() -> tuple[Subscription, ...]:
    """100,000 webhooks, each watching an address no test block carries (built once)."""
    return tuple(watching(addresses(100_000, seed=3)))


def watching(watched: Sequence[str]) -> list[Subscription]:
    kinds: list[tuple[str, Callable[[str], dict[str, Any]]]] = [
        ("address_activity", lambda a: {"addresses": [a]}),
        ("token_transfer", lambda a: {"from": [a]}),
        ("nft_transfer", lambda a: {"addresses": [a]}),
        ("log", lambda a: {"topics": [None, word(a)]}),
        ("internal_transfer", lambda a: {"addresses": [a]}),
        ("mined_transaction", lambda a: {"transaction_hashes": [word(a)]}),
    ]
    return [
        sub(f"wh_{i}", kind, **make(address))
        for i, address in enumerate(watched)
        for kind, make in [kinds[i % len(kinds)]]
    ]


def test_a_block_costs_the_same_with_100_000_watched_addresses_as_with_10() -> None:
    parties = addresses(50, seed=1)
    block = busy_block(parties).data()
    few = MatchIndex(watching(addresses(10, seed=2)))
    many = MatchIndex(hundred_thousand())
    assert few.match_block(block) == many.match_block(block) == []
    # Not one subscription was looked at: each item costs its look-ups and nothing more.
    assert few.checked == many.checked == 0


def test_a_block_checks_only_subscriptions_filed_under_what_it_carries() -> None:
    parties = addresses(50, seed=1)
    block = busy_block(parties).data()
    watched = parties[:5]
    subs = [
        *hundred_thousand(),
        sub("wh_activity", "address_activity", addresses=watched),
        sub("wh_tokens", "token_transfer", from_=watched),
        sub("wh_nfts", "nft_transfer", contracts=[NFT], addresses=watched),
        sub("wh_logs", "log", topics=[APPROVAL, word(watched[0])]),
    ]
    index = MatchIndex(subs)
    matches = index.match_block(block)
    assert {m.webhook_id for m in matches} == {"wh_activity", "wh_tokens", "wh_nfts", "wh_logs"}
    # Each check was of a subscription filed under something the item carries; all but the
    # log subscription's matched.  It is filed under its second topic (an address: few logs
    # carry it), so it was checked on each log naming that address first, Approval or not.
    carrying = [entry for entry in block.logs if entry.topics[1] == word(watched[0])]
    approvals = [entry for entry in carrying if entry.topics[0] == APPROVAL]
    assert approvals and len(carrying) > len(approvals)
    assert index.checked == len(matches) + len(carrying) - len(approvals)


def test_checks_grow_with_the_subscriptions_that_share_a_key_not_with_all() -> None:
    parties = addresses(50, seed=1)
    block = busy_block(parties).data()
    # Many webhooks on one popular token, narrowed by a minimum almost none reach.
    popular = [
        sub(f"wh_{i}", "token_transfer", contracts=[TOKEN], min_value=10**6) for i in range(50)
    ]
    unrelated = watching(addresses(50_000, seed=4))
    index = MatchIndex(popular + unrelated)
    assert index.match_block(block) == []
    erc20_logs = sum(1 for entry in block.logs if entry.address == TOKEN)
    assert index.checked == 50 * erc20_logs  # the token's webhooks, never the 50,000 others


# --- call traces -----------------------------------------------------------------------------


def frame(
    kind: str,
    sender: str,
    receiver: str,
    value: int,
    calls: list[dict[str, Any]] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "from": sender,
        "gas": "0x2b9c8",
        "gasUsed": "0x7823",
        "to": receiver,
        "input": "0x",
        "value": hex(value),
        "type": kind,
    }
    if calls is not None:
        out["calls"] = calls
    if error is not None:
        out["error"] = error
    return out


H1, H2, H3 = ("0x" + c * 64 for c in "123")


def test_call_traces_yield_value_carrying_calls_below_the_top() -> None:
    traces = [
        {
            "txHash": H1,
            "result": frame(
                "CALL",
                A,
                TOKEN,
                10,
                [
                    frame("CALL", TOKEN, B, 3),
                    frame("STATICCALL", TOKEN, C, 0),
                    frame(
                        "CALL",
                        TOKEN,
                        NFT,
                        5,
                        [
                            frame("DELEGATECALL", NFT, ITEMS, 5),  # the caller's value: no move
                            frame("CALL", NFT, "0x" + "AB" * 20, 2),
                            frame("CREATE2", NFT, D, 1),
                            frame("SELFDESTRUCT", D, A, 1),
                            frame("CALL", NFT, C, 0),
                        ],
                    ),
                    frame(
                        "CALL", TOKEN, C, 4, [frame("CALL", C, D, 4)], error="execution reverted"
                    ),
                ],
            ),
        },
        {"txHash": H2, "result": frame("CALL", A, B, 1)},  # no calls below the top
        {"txHash": H3, "result": frame("CALL", A, TOKEN, 7, [frame("CALL", TOKEN, B, 7)], "x")},
    ]
    found = parse_call_traces(REF, traces)
    assert [
        (t.tx_hash, t.trace_address, t.sender, t.receiver, t.value, t.call_type) for t in found
    ] == [
        (H1, (0,), TOKEN, B, 3, "CALL"),
        (H1, (2,), TOKEN, NFT, 5, "CALL"),
        (H1, (2, 1), NFT, "0x" + "ab" * 20, 2, "CALL"),
        (H1, (2, 2), NFT, D, 1, "CREATE2"),
        (H1, (2, 3), D, A, 1, "SELFDESTRUCT"),
    ]
    assert all(t.block == REF for t in found)


def test_call_traces_take_hashes_from_the_block_when_the_node_leaves_them_out() -> None:
    traces = [{"result": frame("CALL", A, TOKEN, 1, [frame("CALL", TOKEN, B, 1)])}]
    with pytest.raises(ValueError, match="no transaction hash"):
        parse_call_traces(REF, traces)
    [found] = parse_call_traces(REF, traces, tx_hashes=[H2])
    assert found.tx_hash == H2


def test_a_trace_nested_to_the_evm_limit_is_walked_without_recursion() -> None:
    leaf = frame("CALL", A, B, 1)
    top = leaf
    for _ in range(1024):
        top = frame("CALL", A, B, 1, [top])
    found = parse_call_traces(REF, [{"txHash": H1, "result": top}])
    assert len(found) == 1024
    assert found[-1].trace_address == (0,) * 1024
    too_deep = frame("CALL", A, B, 1, [top])
    with pytest.raises(ValueError, match="deeper"):
        parse_call_traces(REF, [{"txHash": H1, "result": too_deep}])


@pytest.mark.parametrize(
    "traces",
    [
        None,
        {"txHash": H1},
        [None],
        [{"txHash": H1}],
        [{"txHash": H1, "error": "tracer failed"}],
        [{"txHash": "0x12", "result": frame("CALL", A, B, 1)}],
        [{"txHash": H1, "result": frame("CALL", A, B, 1, calls="nope")}],  # type: ignore[arg-type]
        [{"txHash": H1, "result": frame("CALL", A, B, 1, [["not a frame"]])}],  # type: ignore[list-item]
        [{"txHash": H1, "result": frame("CALL", A, B, 1, [{"type": "CALL", "value": "12"}])}],
        [{"txHash": H1, "result": frame("CALL", A, B, 1, [{"type": "CALL", "value": "0x1"}])}],
        [{"txHash": H1, "result": frame("CALL", A, B, 1, [{"type": "CALL", "value": 5}])}],
    ],
)
def test_malformed_call_traces_are_refused(traces: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the fault
        parse_call_traces(REF, traces)


# A forwarder, written as EVM bytecode (no compiler here).  Its calldata is a list of 32-byte
# words: the first names where to send the call's value (its low 20 bytes); the rest is sent
# along as that call's calldata.  A non-zero top byte in the first word makes it revert after
# forwarding; the forwarded call's failure is ignored.  No calldata: it keeps the value.
_BODY = bytes.fromhex(
    " ".join(
        [
            "5b",  # JUMPDEST
            "6020 36 03",  # len = CALLDATASIZE - 32
            "80 6020 6000 37",  # CALLDATACOPY(0, 32, len)
            "6000 6000 82 6000 34 6000 35 5a f1",  # CALL(gas, word0, value, 0, len, 0, 0)
            "50 50",  # POP success, POP len
            "6000 35 60f8 1c",  # word0 >> 248: the revert flag
        ]
    )
)
_BODY_AT = 5
_REVERT_AT = _BODY_AT + len(_BODY) + 4
FORWARDER = (
    bytes([0x36, 0x60, _BODY_AT, 0x57, 0x00])  # CALLDATASIZE; JUMPI body; STOP
    + _BODY
    + bytes([0x60, _REVERT_AT, 0x57, 0x00])  # JUMPI revert if flagged; STOP
    + bytes.fromhex("5b60006000fd")  # JUMPDEST; REVERT(0, 0)
)
# CODECOPY the runtime after these 12 bytes into memory and RETURN it.
DEPLOY = bytes([0x60, len(FORWARDER), 0x60, 12, 0x60, 0, 0x39, 0x60, len(FORWARDER), 0x60, 0, 0xF3])


def forward_to(address: str, *, revert: bool = False) -> str:
    return ("01" if revert else "00") + "00" * 11 + address[2:].lower()


def mined(rpc: DevnetRpc, tx_hash: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while (receipt := rpc.call("eth_getTransactionReceipt", tx_hash)) is None:
        assert time.monotonic() < deadline, "transaction not mined"
        time.sleep(0.02)  # automine mines just after answering
    result: dict[str, Any] = receipt
    return result


def test_call_traces_from_a_real_anvil_find_internal_transfers(
    anvil_factory: Callable[..., AnvilProcess],
) -> None:
    node = anvil_factory()
    with DevnetRpc(node.url) as rpc:
        sender, receiver = (a.lower() for a in rpc.call("eth_accounts")[:2])
        deploy = rpc.call(
            "eth_sendTransaction",
            {"from": sender, "input": "0x" + (DEPLOY + FORWARDER).hex(), "gas": hex(300_000)},
        )
        forwarder = mined(rpc, deploy)["contractAddress"].lower()
        assert rpc.call("eth_getCode", forwarder, "latest") == "0x" + FORWARDER.hex()
        # One block of five transactions: mine them together.
        rpc.call("evm_setAutomine", False)
        sends = [
            (10**18, forward_to(receiver)),  # forwarder -> receiver
            (3, forward_to(forwarder) + forward_to(receiver)),  # through itself, then on
            (5, forward_to(forwarder) + forward_to(receiver, revert=True)),  # the inner reverts
            (7, forward_to(receiver, revert=True)),  # the transaction reverts
            (0, ""),
        ]
        hashes = [
            rpc.call(
                "eth_sendTransaction",
                {
                    "from": sender,
                    "to": forwarder,
                    "value": hex(value),
                    "input": "0x" + calldata,
                    "gas": hex(200_000),
                },
            )
            for value, calldata in sends
        ]
        rpc.call("evm_mine")
        body = rpc.call("eth_getBlockByNumber", "latest", True)
        assert [tx["hash"] for tx in body["transactions"]] == hashes
        traces = rpc.call("debug_traceBlockByHash", body["hash"], {"tracer": "callTracer"})
        receipts = rpc.call("eth_getBlockReceipts", body["hash"])
    ref = BlockRef(int(body["number"], 16), body["hash"], int(body["timestamp"], 16))
    found = parse_call_traces(ref, traces)
    assert [(t.tx_hash, t.trace_address, t.sender, t.receiver, t.value) for t in found] == [
        (hashes[0], (0,), forwarder, receiver, 10**18),
        (hashes[1], (0,), forwarder, forwarder, 3),
        (hashes[1], (0, 0), forwarder, receiver, 3),
    ]
    assert [r["status"] for r in receipts] == ["0x1", "0x1", "0x1", "0x0", "0x1"]

    # The same block through the matcher, as the follower hands it over.
    data = BlockData(
        block=BlockFact(ref, body["parentHash"], int(body["gasUsed"], 16), 30_000_000, None, 5),
        logs=[],
        transactions=body["transactions"],
        receipts={r["transactionHash"]: r for r in receipts},
        internal=found,
    )
    index = MatchIndex(
        [
            sub("wh_internal", "internal_transfer", addresses=[receiver], min_value=4),
            sub("wh_mined", "mined_transaction", transaction_hashes=[hashes[3]]),
            sub("wh_sender", "address_activity", addresses=[sender]),
        ]
    )
    assert index.needs == Needs(transactions=True, receipts=True, traces=True)
    assert summary(index.match_block(data)) == [
        ("wh_sender", "native", 0, sender, forwarder, None, 10**18, sender, "outgoing"),
        ("wh_internal", "internal", hashes[0], (0,), 10**18, None, None),
        ("wh_sender", "native", 1, sender, forwarder, None, 3, sender, "outgoing"),
        ("wh_sender", "native", 2, sender, forwarder, None, 5, sender, "outgoing"),
        ("wh_sender", "tx", 3, sender, forwarder, 0, sender, "outgoing"),  # reverted
        ("wh_mined", "tx", 3, sender, forwarder, 0, None, None),
        ("wh_sender", "tx", 4, sender, forwarder, 1, sender, "outgoing"),  # no value
    ]
