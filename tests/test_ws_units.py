"""The WebSocket layer's pure parts and the hub/session logic without a gateway.

* log filters against geth's rules;
* server frames checked by wsproto (an independent implementation) as the client;
* the handshake's accept value from RFC 6455's own example;
* the hub fed through a memory channel, as the follower feeds it: reorg order, history not
  announced, removed logs only for what was pushed;
* a session over a socketpair whose peer stops reading: dropped with 1008, and the byte stream
  stays valid (a frame already begun is finished before the close frame).
"""

from __future__ import annotations

import json
import socket
from typing import Any

import msgspec
import pytest
import trio
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, TextMessage

from chaingate.auth.gate import ANONYMOUS, OpenGate
from chaingate.chain.events import Apply, Block, BlockHeader, ChainEvent, Log, Revert
from chaingate.config import WebSocketSettings
from chaingate.ws.caps import KeyBudgets, caps_for
from chaingate.ws.filters import FilterError, parse_log_filter
from chaingate.ws.handshake import accept_value, query_api_key
from chaingate.ws.hub import Hub, SubscribeError
from chaingate.ws.protocol import PUSH_PREFIX_LEN, Push, frame_header, push_cost, push_prefix
from chaingate.ws.registry import Subscription
from chaingate.ws.session import Session

A = "0x" + "aa" * 20
B = "0x" + "bb" * 20


def t(n: int) -> str:
    return "0x" + n.to_bytes(32, "big").hex()


def make_log(address: str, *topics: int, block: int = 1, index: int = 0) -> Log:
    return Log(
        address=address,
        topics=[t(x) for x in topics],
        data="0x",
        block_number=hex(block),
        block_hash="0x" + f"{block:064x}",
        transaction_hash="0x" + "11" * 32,
        transaction_index="0x0",
        log_index=hex(index),
    )


# --- filters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("criteria", "log", "matches"),
    [
        (None, make_log(A), True),
        ({}, make_log(A, 1), True),
        ({"address": A}, make_log(A), True),
        ({"address": A.upper().replace("0X", "0x")}, make_log(A), True),
        ({"address": B}, make_log(A), False),
        ({"address": [A, B]}, make_log(B), True),
        ({"address": []}, make_log(B), True),
        ({"topics": []}, make_log(A), True),
        ({"topics": [t(1)]}, make_log(A, 1, 2), True),
        ({"topics": [t(2)]}, make_log(A, 1, 2), False),
        ({"topics": [None, t(2)]}, make_log(A, 1, 2), True),
        ({"topics": [[t(5), t(1)]]}, make_log(A, 1), True),
        ({"topics": [[t(5), t(6)]]}, make_log(A, 1), False),
        ({"topics": [[t(5), None]]}, make_log(A, 1), True),  # null in an OR-list: any
        ({"topics": [[]]}, make_log(A, 1), True),  # empty OR-list: any
        ({"topics": [None]}, make_log(A), False),  # a position needs a topic there
        ({"topics": [t(1), None, None]}, make_log(A, 1, 2), False),
        ({"address": A, "topics": [None, [t(2), t(3)]]}, make_log(A, 9, 3), True),
        ({"address": A, "topics": [None, [t(2), t(3)]]}, make_log(B, 9, 3), False),
        ({"fromBlock": "0x1", "toBlock": "latest"}, make_log(A), True),
    ],
)
def test_log_filter_semantics(criteria: Any, log: Log, matches: bool) -> None:
    assert parse_log_filter(criteria).matches(log) is matches


def test_topic_comparison_ignores_case() -> None:
    upper = make_log(A, 0xAB)
    log = msgspec.structs.replace(upper, topics=[upper.topics[0].upper().replace("0X", "0x")])
    assert parse_log_filter({"topics": [t(0xAB)]}).matches(log)


@pytest.mark.parametrize(
    "criteria",
    [
        "not an object",
        {"address": "0x1234"},
        {"address": 5},
        {"address": ["0x" + "zz" * 20]},
        {"address": [A] * 1001},
        {"topics": "0x00"},
        {"topics": [None] * 5},
        {"topics": ["0x12"]},
        {"topics": [[t(1), 7]]},
        {"topics": [[t(1)] * 1001]},
    ],
)
def test_log_filter_refusals(criteria: Any) -> None:
    with pytest.raises(FilterError):
        parse_log_filter(criteria)


# --- frames and handshake --------------------------------------------------------------------


def _client_reads(data: bytes) -> list[Any]:
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(data)
    return list(client.events())


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_server_frames_parse_in_wsproto(size: int) -> None:
    payload = b"x" * size
    (event,) = _client_reads(frame_header(size) + payload)
    assert isinstance(event, TextMessage) and event.data == payload.decode()
    assert event.message_finished


def test_push_frame_is_a_json_rpc_notification() -> None:
    sub_id = "0x" + "ab" * 16
    prefix = push_prefix(sub_id)
    assert len(prefix) == PUSH_PREFIX_LEN
    push = Push(b'{"number":"0x1"}')
    (event,) = _client_reads(push.frame(prefix))
    assert json.loads(event.data) == {
        "jsonrpc": "2.0",
        "method": "eth_subscription",
        "params": {"subscription": sub_id, "result": {"number": "0x1"}},
    }
    assert push.cu == push_cost(len(event.data)) == -(-len(event.data) * 4 // 100)
    assert push_cost(1) == 1


def test_accept_value_matches_rfc_6455_example() -> None:
    assert accept_value(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_api_key_from_the_query_string() -> None:
    assert query_api_key(b"apiKey=svc_test_abc") == b"svc_test_abc"
    assert query_api_key(b"x=1&apiKey=k%2B1") == b"k+1"
    assert query_api_key(b"apikey=nope") is None
    assert query_api_key(b"") is None
    assert query_api_key(b"&".join([b"a=1"] * 100)) is None  # bounded parsing


# --- the hub -------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def push(self, frame: bytes, cu: int) -> None:
        (event,) = _client_reads(frame)
        self.messages.append(json.loads(event.data))

    def results(self) -> list[Any]:
        return [m["params"]["result"] for m in self.messages]


def block(number: int, fork: int = 0, logs: list[Log] | None = None) -> Block:
    hash_ = "0x" + f"{fork:02x}{number:062x}"
    parent = "0x" + f"{fork if number > 1 else 0:02x}{number - 1:062x}"
    header = BlockHeader(
        number=number,
        hash=hash_,
        parent_hash=parent,
        timestamp=number,
        gas_used=0,
        gas_limit=30_000_000,
        base_fee_per_gas=7,
        transaction_count=0,
        fields={"number": hex(number), "hash": hash_, "parentHash": parent},
    )
    fixed = [msgspec.structs.replace(entry, block_hash=hash_) for entry in logs or []]
    return Block(header, fixed, [])


async def run_hub(events: list[ChainEvent], *kinds: tuple[str, list[Any]]) -> list[Sink]:
    hub = Hub("ethereum/devnet", None, 1.0, 1.0)  # type: ignore[arg-type]
    send, receive = trio.open_memory_channel[ChainEvent](0)
    hub.attach(receive, None)  # type: ignore[arg-type]
    sinks = []
    for kind, args in kinds:
        sink = Sink()
        hub.add(hub.prepare(kind, args, sink))
        sinks.append(sink)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.follow, receive)
        async with send:
            for event in events:
                await send.send(event)
    return sinks


async def test_hub_reorg_order_and_history() -> None:
    log1 = make_log(A, 1, index=0)
    log1b = make_log(A, 1, 5, index=1)
    log2 = make_log(A, 2)
    log3 = make_log(B, 3)
    events: list[ChainEvent] = [
        Apply(block(1, logs=[make_log(A, 9)]), live=False),  # history: never pushed
        Apply(block(2, logs=[log1, log1b]), live=True),
        Apply(block(3, logs=[log2]), live=True),
        Revert(block(3, logs=[log2])),  # newest first, as the follower sends them
        Revert(block(2, logs=[log1, log1b])),
        Apply(block(2, fork=1, logs=[log3]), live=True),
        Apply(block(3, fork=1), live=True),
    ]
    heads, logs, only_a = await run_hub(
        events, ("newHeads", []), ("logs", []), ("logs", [{"address": A}])
    )
    assert [int(h["number"], 16) for h in heads.results()] == [2, 3, 2, 3]
    assert heads.results()[2]["hash"].startswith("0x01")
    shown = [(int(e["topics"][0], 16), e["removed"]) for e in logs.results()]
    # Removed logs oldest block first (and in log order), then the new branch.
    assert shown == [
        (1, False),
        (1, False),
        (2, False),
        (1, True),
        (1, True),
        (2, True),
        (3, False),
    ]
    assert [(int(e["topics"][0], 16), e["removed"]) for e in only_a.results()] == shown[:-1]


async def test_hub_only_retracts_announced_blocks_and_flushes_a_shorter_chain() -> None:
    events: list[ChainEvent] = [
        Apply(block(1, logs=[make_log(A, 1)]), live=False),
        Apply(block(2, logs=[make_log(A, 2)]), live=True),
        Revert(block(2, logs=[make_log(A, 2)])),
        Revert(block(1, logs=[make_log(A, 1)])),  # never announced: nothing to take back
    ]
    (logs,) = await run_hub(events, ("logs", []))
    assert [(int(e["topics"][0], 16), e["removed"]) for e in logs.results()] == [
        (2, False),
        (2, True),
    ]


async def test_hub_subscription_errors() -> None:
    hub = Hub("ethereum/devnet", None, 1.0, 1.0)  # type: ignore[arg-type]
    sink = Sink()
    with pytest.raises(SubscribeError) as no_follower:
        hub.prepare("newHeads", [], sink)
    assert no_follower.value.code == -32002
    with pytest.raises(SubscribeError):
        hub.prepare({"kind": 1}, [], sink)
    sub = hub.prepare("newPendingTransactions", [True], sink)
    assert isinstance(sub, Subscription) and sub.full
    hub.add(sub)
    assert hub.registry.count("newPendingTransactions") == 1
    assert hub.remove(sub) and not hub.remove(sub)


# --- a session whose client stops reading ---------------------------------------------------


class _Endpoint:
    def __init__(self, settings: WebSocketSettings) -> None:
        self.settings = settings
        self.gate = OpenGate()
        self.filter_budgets = KeyBudgets()


def anonymous_session(sock: socket.socket, settings: WebSocketSettings) -> Session:
    """An anonymous client's session on ``sock``, on a hub of its own."""
    return Session(
        _Endpoint(settings),  # type: ignore[arg-type]
        sock,
        "peer",
        "id",
        ANONYMOUS,
        Hub("ethereum/devnet", None, 1.0, 1.0),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        caps_for(None, settings),
    )


async def test_slow_peer_is_dropped_with_a_valid_stream() -> None:
    settings = WebSocketSettings(send_queue_bytes=32_768, close_timeout=5)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    session = anonymous_session(ours, settings)
    push = Push(b'"' + b"z" * 5000 + b'"')
    prefix = push_prefix("0x" + "cd" * 16)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run, b"")
        await trio.sleep(0.01)
        sent = 0
        while not session.dropped:
            session.push(push.frame(prefix), push.cu)
            sent += 1
            assert sent < 1000
        assert session.closing and session._queued <= settings.send_queue_bytes + 6000
        # The peer now reads everything: whole messages, then the close frame, nothing torn.
        client = Connection(ConnectionType.CLIENT)
        received: list[Any] = []
        theirs.setblocking(False)
        with trio.fail_after(5):
            while not any(isinstance(e, CloseConnection) for e in received):
                await trio.lowlevel.wait_readable(theirs)
                client.receive_data(theirs.recv(65536))
                received.extend(client.events())
        close = received[-1]
        assert isinstance(close, CloseConnection) and close.code == 1008
        messages = [e for e in received if isinstance(e, TextMessage)]
        assert messages and all(e.message_finished for e in messages)
        assert 0 < len(messages) < sent
        theirs.send(client.send(close.response()))
    theirs.close()
    ours.close()


async def test_a_session_cancelled_from_outside_writes_nothing_more() -> None:
    # The edge closes the socket after the session, and its descriptor number may then be
    # another connection's: a push still on its way must not be written by that number.
    settings = WebSocketSettings()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    session = anonymous_session(ours, settings)
    push = Push(b'"late"')
    prefix = push_prefix("0x" + "cd" * 16)
    with trio.move_on_after(0.05):
        await session.run(b"")  # no client bytes: runs until cancelled
    assert session.closing
    ours.close()
    other, peer = socket.socketpair()  # likely given the number just freed
    session.push(push.frame(prefix), push.cu)
    session._write(push.frame(prefix))  # even past the push's own check
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(1)
    assert session.pushes == 0
    for sock in (theirs, other, peer):
        sock.close()
