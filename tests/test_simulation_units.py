"""The simulation's sans-IO rules, case by case: the token standards' event shapes, a trace's
effective events (reverted frames undo theirs), eth_simulateV1's answer, a prestate diff folded
into state overrides, params, signatures, reverts, and changes from events.  (Against the real
chain: tests/test_simulation_oracle.py.)"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from chaingate.evm import abi
from chaingate.evm.reverts import decode_revert, describe_revert
from chaingate.evm.signatures import parse
from chaingate.evm.tokenlogs import (
    APPROVAL,
    APPROVAL_FOR_ALL,
    TRANSFER,
    TRANSFER_BATCH,
    TRANSFER_SINGLE,
    TokenEvent,
    approval_events,
    transfer_events,
)
from chaingate.simulation import params as p
from chaingate.simulation.assets import Native, changes_of, describe
from chaingate.simulation.execution import (
    MAX_DEPTH,
    NATIVE_TOKEN,
    Bounds,
    EventLog,
    Frame,
    NativeMove,
    SimulatedCall,
    TooLarge,
    from_simulate_v1,
    from_trace,
)
from chaingate.simulation.known import decode_call, revert_of
from chaingate.simulation.nodes import NodeError
from chaingate.simulation.overrides import fold_diff
from chaingate.simulation.simulator import execution_result

A, B, C = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "cc" * 20
TOKEN = "0x" + "70" * 20
BOUNDS = Bounds(frames=100, logs=100)


def word(value: int | str) -> str:
    if isinstance(value, str):
        return "0x" + value[2:].rjust(64, "0")
    return "0x" + value.to_bytes(32, "big").hex()


def log(topics: list[str], data: str = "0x", position: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"address": TOKEN, "topics": topics, "data": data}
    if position is not None:
        entry["position"] = hex(position)
    return entry


def frame(**fields: Any) -> Frame:
    return msgspec.convert({"type": "CALL", "from": A, "to": B, **fields}, Frame)


# --- the token standards' shapes -----------------------------------------------------------


def test_transfers_of_each_standard_and_look_alikes() -> None:
    assert transfer_events([TRANSFER, word(A), word(B)], word(5)) == [
        TokenEvent("ERC20", A, B, None, 5)
    ]
    assert transfer_events([TRANSFER, word(A), word(B), word(7)], "0x") == [
        TokenEvent("ERC721", A, B, 7, 1)
    ]
    single = word(3) + word(40)[2:]
    assert transfer_events([TRANSFER_SINGLE, word(C), word(A), word(B)], single) == [
        TokenEvent("ERC1155", A, B, 3, 40)
    ]
    batch = "0x" + abi.encode(["uint256[]", "uint256[]"], [[1, 2], [10, 20]]).hex()
    assert transfer_events([TRANSFER_BATCH, word(C), word(A), word(B)], batch) == [
        TokenEvent("ERC1155", A, B, 1, 10),
        TokenEvent("ERC1155", A, B, 2, 20),
    ]
    uneven = "0x" + abi.encode(["uint256[]", "uint256[]"], [[1, 2], [10]]).hex()
    not_address = "0x" + "11" * 32
    for topics, data in [
        ([TRANSFER, word(A)], word(5)),  # too few topics
        ([TRANSFER, word(A), word(B)], "0x"),  # ERC-20 without its amount
        ([TRANSFER, not_address, word(B)], word(5)),  # upper bytes set: not an address
        ([TRANSFER_SINGLE, word(C), word(A), word(B)], word(3)),  # one word
        ([TRANSFER_BATCH, word(C), word(A), word(B)], uneven),
        ([TRANSFER_BATCH, word(C), word(A), word(B)], "0xabc"),
    ]:
        assert transfer_events(topics, data) is None, (topics, data)


def test_approvals_of_each_standard() -> None:
    assert approval_events([APPROVAL, word(A), word(B)], word(9)) == [
        TokenEvent("ERC20", A, B, None, 9)
    ]
    assert approval_events([APPROVAL, word(A), word(B), word(4)], "0x") == [
        TokenEvent("ERC721", A, B, 4, 1)
    ]
    assert approval_events([APPROVAL_FOR_ALL, word(A), word(B)], word(1)) == [
        TokenEvent(None, A, B, None, 1)
    ]
    assert approval_events([APPROVAL_FOR_ALL, word(A), word(B)], word(2)) is None  # no bool
    assert approval_events([APPROVAL_FOR_ALL, word(A), word(B), word(1)], word(1)) is None


# --- a trace's effective events ------------------------------------------------------------


def test_a_reverted_frame_undoes_its_transfers_and_logs_but_not_its_callers() -> None:
    transfer = [TRANSFER, word(A), word(B)]
    root = frame(
        value="0x10",
        logs=[log(transfer, word(1), 0), log(transfer, word(3), 2)],
        calls=[
            {"type": "CALL", "from": B, "to": C, "value": "0x2"},
            {
                "type": "CALL",
                "from": B,
                "to": C,
                "value": "0x5",
                "error": "execution reverted",
                "calls": [{"type": "CALL", "from": C, "to": A, "value": "0x1"}],
            },
            {"type": "STATICCALL", "from": B, "to": C, "value": "0x9"},  # no value moves
        ],
    )
    outcome = from_trace(root, BOUNDS)
    assert outcome.ok and outcome.root is root
    assert outcome.events == [
        NativeMove(A, B, 16),  # the call's own value, at its start
        EventLog(TOKEN, transfer, word(1)),  # position 0: before the first sub-call
        NativeMove(B, C, 2),
        EventLog(TOKEN, transfer, word(3)),  # position 2: after the reverted one
    ]


def test_a_reverted_transaction_moves_nothing() -> None:
    root = frame(
        value="0x10",
        error="execution reverted",
        output="0x08c379a0",
        calls=[{"type": "CALL", "from": B, "to": C, "value": "0x2"}],
    )
    outcome = from_trace(root, BOUNDS)
    assert not outcome.ok and outcome.events == [] and outcome.output == bytes.fromhex("08c379a0")
    assert outcome.failure == "execution reverted"


def test_a_trace_past_its_bounds_is_refused_whole() -> None:
    root = frame(calls=[{"type": "CALL", "from": B, "to": C}] * 3)
    with pytest.raises(TooLarge) as frames:
        from_trace(root, Bounds(frames=3, logs=100))
    assert frames.value.what == "frames" and frames.value.limit == 3
    noisy = frame(logs=[log([TRANSFER], "0x")] * 5)
    with pytest.raises(TooLarge):
        from_trace(noisy, Bounds(frames=10, logs=4))


def test_simulate_v1_native_logs_and_failures() -> None:
    native = {"address": NATIVE_TOKEN, "topics": [TRANSFER, word(A), word(B)], "data": word(7)}
    zero = {**native, "data": word(0)}
    token = {"address": TOKEN.upper().replace("0X", "0x"), "topics": [TRANSFER], "data": "0x"}
    ok = msgspec.convert(
        {"status": "0x1", "gasUsed": "0x5208", "logs": [native, zero, token]}, SimulatedCall
    )
    outcome = from_simulate_v1(ok, BOUNDS)
    assert outcome.events == [NativeMove(A, B, 7), EventLog(TOKEN, [TRANSFER], "0x")]
    assert outcome.gas_used == 21000
    # A failed call: whatever it logged (some nodes list its value's transfer) moved nothing.
    failed = msgspec.convert(
        {
            "status": "0x0",
            "returnData": "0xdead",
            "logs": [native],
            "error": {"code": -32000, "message": "execution reverted"},
        },
        SimulatedCall,
    )
    outcome = from_simulate_v1(failed, BOUNDS)
    assert not outcome.ok and outcome.events == [] and outcome.output == b"\xde\xad"
    with pytest.raises(TooLarge):
        from_simulate_v1(ok, Bounds(frames=1, logs=2))


# --- state carried through a bundle --------------------------------------------------------


def test_a_prestate_diff_folds_into_the_next_calls_overrides() -> None:
    slot1, slot2, slot3 = word(1), word(2), word(3)
    diff = {
        "pre": {
            A: {"balance": "0x10", "nonce": 1, "storage": {slot1: word(5), slot2: word(6)}},
            B: {"balance": "0x1", "code": "0x60"},  # deleted: in pre, not in post
        },
        "post": {A: {"balance": "0x8", "nonce": 2, "storage": {slot1: word(9), slot3: word(1)}}},
    }
    folded = fold_diff({C: {"balance": "0x1"}}, diff)
    assert folded == {
        C: {"balance": "0x1"},
        A: {
            "balance": "0x8",
            "nonce": "0x2",
            # slot2 was in pre and is not in post: set to zero (post leaves zeros out)
            "stateDiff": {slot1: word(9), slot3: word(1), slot2: word(0)},
        },
        B: {"balance": "0x0", "nonce": "0x0", "code": "0x", "state": {}},
    }
    # An account whose storage the caller replaced keeps a full replacement, updated.
    replaced = fold_diff({A: {"state": {slot3: word(4)}}}, {"pre": {}, "post": diff["post"]})
    assert replaced[A]["state"] == {slot3: word(1), slot1: word(9)}
    with pytest.raises(ValueError, match="pre and post"):
        fold_diff({}, {"pre": [], "post": {}})


# --- params --------------------------------------------------------------------------------


def test_transactions_blocks_and_overrides_as_the_node_takes_them() -> None:
    tx = p.transaction(
        {
            "from": A.upper().replace("0X", "0x"),
            "to": B,
            "value": 5,
            "input": "0xABCD",
            "gas": "0x5208",
            "type": "0x2",
            "chainId": "0x1",
            "maxFeePerGas": None,
        }
    )
    assert tx == {"from": A, "to": B, "value": "0x5", "data": "0xabcd", "gas": "0x5208"}
    assert p.transaction({"to": B})["from"] == "0x" + "00" * 20
    assert p.block_param(None) == "latest" and p.block_param(10) == "0xa"
    assert p.block_param("0x" + "AB" * 32) == "0x" + "ab" * 32
    assert p.block_param({"blockNumber": "0x10"}) == {"blockNumber": "0x10"}
    assert p.state_overrides({A: {"balance": "0x1", "stateDiff": {"0x1": "0x2"}}}) == {
        A: {"balance": "0x1", "stateDiff": {word(1): word(2)}}
    }
    refused = [
        (p.transaction, {"from": A, "data": "0x12", "input": "0x34"}, "differ"),
        (p.transaction, {"gasPrice": "0x1", "maxFeePerGas": "0x1"}, "not both"),
        (p.transaction, {"value": "0x" + "f" * 65}, "64 hex digits"),
        (p.transaction, {"gas": hex(1 << 64)}, "uint64"),
        (p.transaction, {"data": "0x" + "00" * (p.MAX_CALL_DATA + 1)}, "longer than"),
        (p.block_param, True, "block"),
        (p.block_param, {"blockHash": "0x1", "extra": 1}, "block"),
        (p.state_overrides, {f"0x{i:040x}": {} for i in range(65)}, "at most 64"),
        (p.state_overrides, {A: {"state": {word(i): word(0) for i in range(1025)}}}, "1024"),
    ]
    for reader, value, words in refused:
        with pytest.raises(p.BadParams, match=words):
            reader(value)


# --- signatures, calls and reverts ---------------------------------------------------------


def test_signatures_and_named_values() -> None:
    signature = parse("function swap((address,uint256)[] legs, bytes data) returns (bool ok)")
    assert signature.canonical == "swap((address,uint256)[],bytes)"
    assert [o.name for o in signature.outputs] == ["ok"]
    data = abi.encode(["(address,uint256)[]", "bytes"], [[(A, 1)], b"\x01"])
    assert signature.decode_args(data) == [
        {
            "name": "legs",
            "type": "(address,uint256)[]",
            "value": [["0xaAaAaAaaAaAaAaaAaAAAAAAAAaaaAaAaAaaAaaAa", "1"]],
        },
        {"name": "data", "type": "bytes", "value": "0x01"},
    ]
    event = parse("event Named(string indexed label, address indexed who, uint8 n)")
    topics = [event.topic, word("0x" + "12" * 32), word(B)]
    assert event.decode_log(topics, abi.encode(["uint8"], [3])) == [
        {"name": "label", "type": "string", "value": word("0x" + "12" * 32), "indexed": True},
        {
            "name": "who",
            "type": "address",
            "value": "0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB",
            "indexed": True,
        },
        {"name": "n", "type": "uint8", "value": "3", "indexed": False},
    ]
    for bad in ("transfer", "(uint256)", "f(uint7)", "f(uint256 a b)", "f() yields (bool)"):
        with pytest.raises(ValueError, match=r"signature|parameter|integer size"):
            parse(bad)


def test_known_calls_decode_and_big_ones_do_not() -> None:
    call = abi.encode_call("approve(address,uint256)", B, 3)
    decoded = decode_call(call, abi.encode(["bool"], [True]))
    assert decoded is not None and decoded["methodName"] == "approve"
    assert decoded["outputs"] == [{"name": "", "type": "bool", "value": True}]
    assert decode_call(call[:10], None) is None  # does not fit its signature
    assert decode_call(b"\x12\x34\x56\x78", None) is None  # unknown selector
    big = abi.encode_call("airdrop(address[],uint256)", [A] * 300, 1)
    assert decode_call(big, None) is None  # past MAX_DECODE


def test_reverts_of_each_kind() -> None:
    error = abi.selector("Error(string)") + abi.encode(["string"], ["no"])
    panic = abi.selector("Panic(uint256)") + abi.encode(["uint256"], [0x99])
    assert decode_revert(error).kind == "Error" and describe_revert(error) == "no"
    assert decode_revert(panic).message == "panic 0x99 (unknown panic code)"
    assert decode_revert(b"").message == "reverted without data"
    assert decode_revert(b"\x01\x02").selector == "0x0102"
    broken = abi.selector("Error(string)") + b"\x00" * 5  # its string does not decode
    assert decode_revert(broken).kind == "custom" and decode_revert(broken).selector == "0x08c379a0"
    known = abi.selector("FailedOp(uint256,string)") + abi.encode(
        ["uint256", "string"], [0, "AA21"]
    )
    revert = revert_of(known)
    assert revert.name == "FailedOp" and revert.message == "FailedOp(opIndex=0, reason=AA21)"
    assert revert_of(abi.selector("FailedOp(uint256,string)")).name is None  # no args to read
    wrapped = abi.selector("FailedOpWithRevert(uint256,string,bytes)") + abi.encode(
        ["uint256", "string", "bytes"], [0, "AA23 reverted", error]
    )
    unwrapped = revert_of(wrapped)
    assert unwrapped.name == "FailedOpWithRevert" and unwrapped.inner is not None
    assert unwrapped.inner.reason == "no" and unwrapped.message == "FailedOpWithRevert: no"


# --- changes -------------------------------------------------------------------------------


async def test_changes_from_events_in_order() -> None:
    batch = "0x" + abi.encode(["uint256[]", "uint256[]"], [[1, 2], [10, 20]]).hex()
    events = [
        NativeMove(A, B, 5),
        EventLog(TOKEN, [TRANSFER, word(A), word(B)], word(7)),
        EventLog(TOKEN, [TRANSFER_BATCH, word(C), word(A), word(B)], batch),
        EventLog(TOKEN, [APPROVAL_FOR_ALL, word(A), word(C)], word(1)),
        EventLog(TOKEN, [TRANSFER, word(A)], word(7)),  # a look-alike: nothing
        EventLog(TOKEN, ["0x" + "12" * 32], "0x"),  # another event: nothing
    ]
    raw = changes_of(events)
    assert [(c.asset, c.change, c.token_id, c.raw_amount) for c in raw] == [
        ("NATIVE", "TRANSFER", None, 5),
        ("ERC20", "TRANSFER", None, 7),
        ("ERC1155", "TRANSFER", 1, 10),
        ("ERC1155", "TRANSFER", 2, 20),
        (None, "APPROVE", None, 1),
    ]
    shown = await describe(raw, Native("ETH", "Ether"), None, 0.0)
    assert msgspec.to_builtins(shown[0]) == {
        "assetType": "NATIVE",
        "changeType": "TRANSFER",
        "from": A,
        "to": B,
        "rawAmount": "5",
        "amount": "0.000000000000000005",
        "contractAddress": None,
        "tokenId": None,
        "decimals": 18,
        "symbol": "ETH",
        "name": "Ether",
        "logo": None,
    }
    assert shown[1].amount is None and shown[1].decimals is None  # decimals unknown: no amount
    assert shown[2].tokenId == "0x1" and shown[2].amount == "10" and shown[2].decimals == 0
    assert shown[4].assetType == "ERC721"  # ApprovalForAll with no metadata to say otherwise


def test_a_deep_call_tree_is_read_and_written_and_a_deeper_one_refused() -> None:
    transfer = [TRANSFER, word(A), word(B)]

    def tree(depth: int) -> Frame:
        node: dict[str, Any] = {
            "type": "CALL",
            "from": A,
            "to": B,
            "logs": [log(transfer, word(1))],
        }
        for _ in range(depth - 1):
            node = {"type": "CALL", "from": A, "to": B, "calls": [node]}
        return msgspec.json.decode(msgspec.json.encode(node), type=Frame)

    deep = from_trace(tree(MAX_DEPTH), Bounds(frames=1000, logs=10))
    nested, flat = execution_result(deep, "NESTED"), execution_result(deep, "FLAT")
    assert len(flat["calls"]) == MAX_DEPTH and flat["logs"] == nested["logs"]
    innermost = nested["calls"][0]
    for _ in range(MAX_DEPTH - 1):
        (innermost,) = innermost["calls"]
    assert innermost["logs"][0]["decoded"]["eventName"] == "Transfer"
    assert msgspec.json.decode(msgspec.json.encode(nested)) == nested  # writable as JSON
    with pytest.raises(TooLarge, match="nested calls"):
        from_trace(tree(MAX_DEPTH + 1), Bounds(frames=1000, logs=10))


@pytest.mark.parametrize(
    ("code", "message", "missing"),
    [
        (-32601, "the method debug_traceCall does not exist/is not available", True),
        (-32004, "method not supported", True),
        (-32602, "unsupported tracer type", True),
        (-32000, "Method not found", True),
        # What a node says of a block nobody has: any client can name one, and it must not
        # switch the feature off for everyone (ten minutes per upstream).
        (-32000, "header not found", False),
        (-32001, "Resource not found", False),
        (3, "execution reverted", False),
    ],
)
def test_only_a_missing_method_reads_as_missing(code: int, message: str, missing: bool) -> None:
    assert NodeError(code, message).missing is missing
