"""WebSocket subscriptions end to end: real clients (websockets, web3.py) against real anvil.

Pushes come from the chain follower polling anvil every 50 ms; blocks are mined on demand
(``evm_mine`` or a transaction, anvil automines).  Every test runs on both framing twins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from websockets.exceptions import InvalidStatus

from chaingate.auth.store import AuthRows
from chaingate.config import FollowerSettings
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.twins import Impl
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle, exchange, parse_responses, post_bytes
from tests.test_auth import AuthStack, auth_settings, start_auth
from tests.test_upstream_faults import Records
from tests.ws_clients import (
    Client,
    RawClient,
    client_frame,
    deploy_logger,
    emit,
    handshake_bytes,
    topic,
)

FOLLOW = {"follower": {"enabled": True, "poll_interval": 0.05}}
HEX_FIELDS = ("number", "hash", "parentHash", "timestamp", "gasUsed", "gasLimit", "baseFeePerGas")
WS_PATH = "/v1/ws/ethereum/devnet"


def ws_url(handle: GatewayHandle, network: str = "devnet", query: str = "") -> str:
    return f"ws://127.0.0.1:{handle.port}/v1/ws/ethereum/{network}{query}"


async def call_node(url: str, method: str, params: list[Any] | None = None) -> Any:
    return await trio.to_thread.run_sync(rpc_call, url, method, params)


async def mine(url: str, blocks: int = 1) -> None:
    for _ in range(blocks):
        await call_node(url, "evm_mine")


async def following(handle: GatewayHandle, node: str) -> None:
    """Wait until the follower is live at the node's head: pushes are about what comes next."""
    follower = handle.gateway.chain.followers["ethereum/devnet"]
    head = int(await call_node(node, "eth_blockNumber"), 16)
    with trio.fail_after(10):
        while follower.head is None or not follower.live or follower.head.number < head:
            await trio.sleep(0.02)
    await trio.sleep(0.05)  # the hub has taken the event too


async def collect(client: Client, count: int, seconds: float = 10.0) -> list[Any]:
    with trio.fail_after(seconds):
        return [await client.recv() for _ in range(count)]


async def nothing_more(client: Client, seconds: float = 0.5) -> None:
    try:
        message = await client.recv(seconds)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected message {message}")


def refused(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """Try to connect with websockets; the HTTP status and JSON body of the refusal."""
    from websockets.sync.client import connect

    try:
        with connect(url, open_timeout=10, **kwargs):
            pass
    except InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body or b"{}")
    raise AssertionError("the upgrade was accepted")


# --- subscriptions ---------------------------------------------------------------------------


async def test_new_heads(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    await following(handle, anvil.url)
    client = await Client.open(ws_url(handle))
    sub = await client.subscribe("newHeads")
    assert sub.startswith("0x") and len(sub) == 34
    await mine(anvil.url, 2)
    heads = await collect(client, 2)
    for push in heads:
        assert push["jsonrpc"] == "2.0" and push["method"] == "eth_subscription"
        assert push["params"]["subscription"] == sub
        assert "transactions" not in push["params"]["result"]
        for field in HEX_FIELDS:
            assert push["params"]["result"][field].startswith("0x"), field
    first, second = (int(p["params"]["result"]["number"], 16) for p in heads)
    assert second == first + 1
    assert heads[1]["params"]["result"]["parentHash"] == heads[0]["params"]["result"]["hash"]
    await client.close()


async def test_logs_with_address_and_topic_filters(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    a, b = [await trio.to_thread.run_sync(deploy_logger, anvil.url) for _ in range(2)]
    await following(handle, anvil.url)
    client = await Client.open(ws_url(handle))
    subs = {
        "all": await client.subscribe("logs"),
        "a": await client.subscribe("logs", {"address": a}),
        "a_or_b": await client.subscribe("logs", {"address": [a.upper().replace("0X", "0x"), b]}),
        "topic0_is_1": await client.subscribe("logs", {"topics": [topic(1)]}),
        "b_topic1_7_or_8": await client.subscribe(
            "logs", {"address": b, "topics": [None, [topic(7), topic(8)]]}
        ),
        "null_in_or_list": await client.subscribe("logs", {"topics": [[topic(99), None]]}),
        "three_positions": await client.subscribe("logs", {"topics": [None, None, None]}),
    }
    names = {sub: name for name, sub in subs.items()}
    for contract, t0, t1 in ((a, 1, 7), (b, 2, 8), (b, 1, 9)):
        await trio.to_thread.run_sync(emit, anvil.url, contract, t0, t1, b"\x01\x02")
    expected = {
        "all": [(a, 1, 7), (b, 2, 8), (b, 1, 9)],
        "a": [(a, 1, 7)],
        "a_or_b": [(a, 1, 7), (b, 2, 8), (b, 1, 9)],
        "topic0_is_1": [(a, 1, 7), (b, 1, 9)],
        "b_topic1_7_or_8": [(b, 2, 8)],
        "null_in_or_list": [(a, 1, 7), (b, 2, 8), (b, 1, 9)],
        "three_positions": [],
    }
    total = sum(len(v) for v in expected.values())
    got: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for push in await collect(client, total):
        log = push["params"]["result"]
        assert log["removed"] is False and log["data"] == "0x0102"
        assert set(log) >= {"blockNumber", "blockHash", "transactionHash", "logIndex"}
        got[names[push["params"]["subscription"]]].append(
            (log["address"].lower(), int(log["topics"][0], 16), int(log["topics"][1], 16))
        )
    await nothing_more(client)
    assert {k: v for k, v in got.items()} == {k: v for k, v in expected.items() if v}
    await client.close()


async def test_invalid_subscriptions_are_json_rpc_errors(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    client = await Client.open(ws_url(handle))
    for params, code in (
        (["logs", {"address": "0x1234"}], -32602),
        (["logs", {"topics": [None] * 5}], -32602),
        (["logs", {"topics": ["0xnothex"]}], -32602),
        (["newPendingTransactions", "yes"], -32602),
        (["bogus"], -32602),
        ([], -32602),
    ):
        reply = await client.call("eth_subscribe", params)
        assert reply["error"]["code"] == code, (params, reply)
    await client.close()


async def test_reorg_sends_removed_logs_then_the_new_branch(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    handle = await start_gateway([node.url], network=FOLLOW)
    contract = await trio.to_thread.run_sync(deploy_logger, node.url)
    await following(handle, node.url)
    client = await Client.open(ws_url(handle))
    logs = await client.subscribe("logs", {"address": contract})
    heads = await client.subscribe("newHeads")
    snapshot = await call_node(node.url, "evm_snapshot")
    # The branch that will be orphaned: two blocks, two logs.
    await trio.to_thread.run_sync(emit, node.url, contract, 1, 1)
    await trio.to_thread.run_sync(emit, node.url, contract, 1, 2)
    old = await collect(client, 4)
    old_logs = [m["params"]["result"] for m in old if m["params"]["subscription"] == logs]
    old_heads = [m["params"]["result"] for m in old if m["params"]["subscription"] == heads]
    assert [int(entry["topics"][1], 16) for entry in old_logs] == [1, 2]
    # Back to before them, then a longer branch with other logs.
    assert await call_node(node.url, "evm_revert", [snapshot]) is True
    await trio.to_thread.run_sync(emit, node.url, contract, 2, 3)
    await trio.to_thread.run_sync(emit, node.url, contract, 2, 4)
    await mine(node.url)
    new = await collect(client, 2 + 2 + 3)
    stream = [(m["params"]["subscription"], m["params"]["result"]) for m in new]
    log_stream = [result for sub, result in stream if sub == logs]
    # Every orphaned log again with removed: true (oldest first, as geth does), then the new.
    assert [(e["removed"], int(e["topics"][1], 16)) for e in log_stream] == [
        (True, 1),
        (True, 2),
        (False, 3),
        (False, 4),
    ]
    assert [e["blockHash"] for e in log_stream[:2]] == [e["blockHash"] for e in old_logs]
    # No new log before the last removed one, on the wire.
    first_new = next(i for i, (s, r) in enumerate(stream) if s == logs and not r["removed"])
    last_removed = max(i for i, (s, r) in enumerate(stream) if s == logs and r["removed"])
    assert last_removed < first_new
    new_heads = [result for sub, result in stream if sub == heads]
    assert len(new_heads) == 3
    assert new_heads[0]["number"] == old_heads[0]["number"]
    assert new_heads[0]["hash"] != old_heads[0]["hash"]
    await nothing_more(client)
    await client.close()


async def test_unsubscribe_stops_pushes(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    await following(handle, anvil.url)
    client = await Client.open(ws_url(handle))
    sub = await client.subscribe("newHeads")
    assert (await client.call("eth_unsubscribe", [sub]))["result"] is True
    assert (await client.call("eth_unsubscribe", [sub]))["result"] is False
    assert (await client.call("eth_unsubscribe", ["0x" + "00" * 16]))["result"] is False
    await mine(anvil.url)
    await nothing_more(client, 0.5)
    hub = handle.gateway.front.ws.hubs["ethereum/devnet"]
    assert hub.registry.count() == 0
    await client.close()


async def test_pending_transactions_deduplicated_across_upstreams(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory(extra=["--no-mining"])
    # Two upstreams with the same mempool: every hash is reported by both.
    handle = await start_gateway(
        [{"url": node.url, "name": "a"}, {"url": node.url, "name": "b"}],
        ws={"pending_poll_interval": 0.05},
    )
    client = await Client.open(ws_url(handle))
    hashes_sub = await client.subscribe("newPendingTransactions")
    full_sub = await client.subscribe("newPendingTransactions", True)
    await trio.sleep(0.3)  # both upstreams' filters installed
    sender = (await call_node(node.url, "eth_accounts"))[0]
    sent = [
        await call_node(
            node.url, "eth_sendTransaction", [{"from": sender, "to": sender, "value": hex(i + 1)}]
        )
        for i in range(3)
    ]
    got: dict[str, list[Any]] = defaultdict(list)
    for push in await collect(client, 6):
        got[push["params"]["subscription"]].append(push["params"]["result"])
    await nothing_more(client, 0.5)
    assert sorted(got[hashes_sub]) == sorted(sent)
    assert sorted(tx["hash"] for tx in got[full_sub]) == sorted(sent)
    assert all(tx["from"].lower() == sender.lower() for tx in got[full_sub])
    await client.close()


async def test_syncing(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url], ws={"syncing_poll_interval": 0.1})
    client = await Client.open(ws_url(handle))
    sub = await client.subscribe("syncing")
    (push,) = await collect(client, 1, 5)
    assert push["params"] == {"subscription": sub, "result": False}
    # A second subscriber learns the current state at once, right after its acknowledgement.
    other = await client.subscribe("syncing")
    (push,) = await collect(client, 1, 1)
    assert push["params"] == {"subscription": other, "result": False}
    await client.close()


async def test_json_rpc_calls_over_the_socket(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    client = await Client.open(ws_url(handle))
    assert (await client.call("eth_chainId"))["result"] == "0x7a69"
    over_ws = int((await client.call("eth_blockNumber"))["result"], 16)
    over_http = int((await handle.rpc("eth_blockNumber"))["result"], 16)
    assert abs(over_ws - over_http) <= 1
    unknown = await client.call("eth_nope")
    assert unknown["error"]["code"] == -32601
    await client.send(
        [
            {"jsonrpc": "2.0", "id": "a", "method": "eth_chainId", "params": []},
            {"jsonrpc": "2.0", "id": "b", "method": "net_version", "params": []},
        ]
    )
    batch = await client.recv()
    assert sorted(item["id"] for item in batch) == ["a", "b"]
    await client.send("{not json")
    assert (await client.recv())["error"]["code"] == -32700
    # Ids come back byte for byte, like over HTTP.
    await client.send('{"jsonrpc":"2.0","id":1.50,"method":"eth_chainId","params":[]}')
    assert await trio.to_thread.run_sync(lambda: client.conn.recv(timeout=5)) == (
        '{"jsonrpc":"2.0","id":1.50,"result":"0x7a69"}'
    )
    await client.close()


def _web3_session(url: str, node: str, contract: str) -> dict[str, Any]:
    from web3 import AsyncWeb3, WebSocketProvider

    async def main() -> dict[str, Any]:
        async with AsyncWeb3(WebSocketProvider(url)) as w3:
            out: dict[str, Any] = {"chain_id": await w3.eth.chain_id}
            heads = await w3.eth.subscribe("newHeads")
            logs = await w3.eth.subscribe("logs", {"address": contract})
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, emit, node, contract, 5, 6)
            seen: dict[str, Any] = {}
            async for message in w3.socket.process_subscriptions():
                seen.setdefault(message["subscription"], message["result"])
                if heads in seen and logs in seen:
                    break
            out["head"] = seen[heads]
            out["log"] = seen[logs]
            out["unsubscribed"] = await w3.eth.unsubscribe(heads)
            return out

    return asyncio.run(asyncio.wait_for(main(), 30))


async def test_web3_websocket_provider(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    contract = await trio.to_thread.run_sync(deploy_logger, anvil.url)
    await following(handle, anvil.url)
    out = await trio.to_thread.run_sync(_web3_session, ws_url(handle), anvil.url, contract)
    assert out["chain_id"] == 31337
    assert out["head"]["number"] > 0 and out["head"]["hash"]
    assert out["log"]["address"].lower() == contract
    assert out["unsubscribed"] is True


# --- fan-out -----------------------------------------------------------------------------


class CountingRelay:
    """Forwards TCP to the node and counts the connections chaingate opens to it."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.connections = 0
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self._relay, listeners, handler_nursery=nursery)

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        async with client, await trio.open_tcp_stream("127.0.0.1", self.target) as node:

            async def pump(a: trio.SocketStream, b: trio.SocketStream) -> None:
                try:
                    while data := await a.receive_some(65536):
                        await b.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, client, node)
                nursery.start_soon(pump, node, client)


async def test_thousandth_subscriber_opens_no_upstream_connection(
    start_gateway: StartGateway, anvil: AnvilProcess, nursery: trio.Nursery
) -> None:
    relay = CountingRelay(anvil.port)
    await nursery.start(relay.serve)
    handle = await start_gateway(
        [f"http://127.0.0.1:{relay.port}"],
        network=FOLLOW,
        ws={"pending_poll_interval": 0.05, "syncing_poll_interval": 0.1},
    )
    await following(handle, anvil.url)
    kinds = (["newHeads"], ["logs"], ["newPendingTransactions"], ["syncing"])
    # max_queue=None: the client keeps reading pushes nobody looks at (else it stops reading,
    # and its closing handshake waits for its timeout).
    clients = [await Client.open(ws_url(handle), max_queue=None) for _ in range(10)]
    for n, client in enumerate(clients):  # 999 subscriptions, kinds in turn, on 10 sockets
        await client.subscribe_many([kinds[i % 4] for i in range(n, 999, 10)])
    await trio.sleep(0.5)  # every source is running now
    hub = handle.gateway.front.ws.hubs["ethereum/devnet"]
    assert hub.registry.count() == 999
    pool = handle.gateway.chain.services["ethereum/devnet"].pool
    before = (relay.connections, sum(len(u.connections) for u in pool.upstreams))
    follower = handle.gateway.chain.followers["ethereum/devnet"]
    consumers = [name for name, _ in follower._consumers]
    await clients[0].subscribe("newHeads")  # the 1,000th
    await trio.sleep(0.5)
    assert hub.registry.count() == 1000
    assert (relay.connections, sum(len(u.connections) for u in pool.upstreams)) == before
    # One stream from the follower for the whole hub, then as now.
    assert [name for name, _ in follower._consumers] == consumers
    assert consumers.count("ws") == 1
    # One head reaches all 250 newHeads subscribers, from one follower stream.
    await mine(anvil.url)
    await trio.sleep(0.5)
    assert hub.pushes["newHeads"] >= 250
    for client in clients:
        await client.close()


async def test_slow_reader_is_cut_off_and_fast_readers_keep_up(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway(
        [anvil.url], network=FOLLOW, ws={"send_queue_bytes": 65536, "close_timeout": 10}
    )
    contract = await trio.to_thread.run_sync(deploy_logger, anvil.url)
    await following(handle, anvil.url)
    fast = [await Client.open(ws_url(handle)) for _ in range(3)]
    for client in fast:
        await client.subscribe("logs", {"address": contract})
    # The slow reader: a tiny receive buffer and it never reads after subscribing.
    slow = await RawClient.open(handle.port, WS_PATH, rcvbuf=4096)
    await slow.send_json({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["logs"]})
    assert (await slow.message())["id"] == 1
    payload = b"\xab" * 24_000  # ~48 KB of hex per pushed log
    delays: list[float] = []
    for i in range(40):
        started = trio.current_time()
        await trio.to_thread.run_sync(emit, anvil.url, contract, 1, i, payload)
        for client in fast:
            (push,) = await collect(client, 1, 5)
            assert int(push["params"]["result"]["topics"][1], 16) == i
        delays.append(trio.current_time() - started)
    ws = handle.gateway.front.ws
    assert [session.dropped for session in ws.sessions].count(True) == 1
    # The slow reader's close frame (1008) follows whatever it had already been sent.
    with trio.fail_after(10):
        while True:
            try:
                opcode, body = await slow.frame()
            except (EOFError, ConnectionResetError):
                raise AssertionError("no close frame") from None
            if opcode == 0x8:
                assert int.from_bytes(body[:2], "big") == 1008
                assert b"send queue full" in body
                break
    slow.close()
    with trio.fail_after(5):
        while len(ws.sessions) > 3:
            await trio.sleep(0.02)
    assert ws.disconnects["slow_consumer"] == 1, ws.disconnects
    # Fast readers got every log, each within a second of its transaction being mined.
    assert max(delays) < 1.0, delays
    for client in fast:
        await client.close()


# --- limits, keep-alive, shutdown ------------------------------------------------------------


async def test_message_size_cap_closes_with_1009(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], ws={"max_message_bytes": 1024})
    client = await Client.open(ws_url(handle))
    assert (await client.call("eth_chainId"))["result"] == "0x7a69"
    await client.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "x" * 2000}))
    assert await client.closed() == 1009


async def test_deeply_nested_messages_are_parse_errors_and_the_socket_stays(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    client = await Client.open(ws_url(handle))

    def call(method: str, params: str) -> str:
        return f'{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}'

    deep = "[" * 5000 + "]" * 5000
    messages = [
        call("eth_chainId", deep),
        call("eth_subscribe", deep),
        call("eth_subscribe", '["logs",' + deep + "]"),
        call("eth_unsubscribe", "[" + deep + "]"),
        # Deep enough for the framing (128 levels), not for the decoder: the same answer.
        call("eth_subscribe", '["logs",{"topics":' + "[" * 200 + "]" * 200 + "}]"),
        call("eth_chainId", "[" * 200 + "]" * 200),
    ]
    for message in messages:
        await client.send(message)
        reply = await client.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32700, (message[:60], reply)
        assert "nested deeper than 128 levels" in reply["error"]["message"]
        # The HTTP proxy answers the same body the same way.
        (http,) = parse_responses(
            await exchange(
                handle.port,
                post_bytes("/v1/rpc/ethereum/devnet", message.encode()),
                half_close=True,
            ),
            ["POST"],
        )
        assert http.json()["error"] == reply["error"]
    # 128 levels are still a call like any other (here: a filter that is not one).
    await client.send(call("eth_subscribe", '["logs",{"topics":' + "[" * 125 + "]" * 125 + "}]"))
    shallow = await client.recv()
    assert shallow["id"] == 7 and shallow["error"]["code"] == -32602, shallow
    # The socket is open and serves calls and subscriptions as before.
    assert (await client.call("eth_chainId"))["result"] == "0x7a69"
    sub = await client.subscribe("newHeads")
    await mine(anvil.url)
    (head,) = await collect(client, 1)
    assert head["params"]["subscription"] == sub
    await client.close()


async def test_binary_messages_that_are_not_utf8_are_parse_errors_and_the_socket_stays(
    start_gateway: StartGateway, anvil: AnvilProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # A binary frame is not checked for UTF-8 by the WebSocket layer (issue 25: every decode
    # failure of client input is answered, never a traceback).
    handle = await start_gateway([anvil.url], network=FOLLOW)
    client = await Client.open(ws_url(handle))
    for message in (
        b'{"jsonrpc":"2.0","id":7,"method":"eth_chainId\xff"}',
        b'{"jsonrpc":"2.0","id":7,"method":"eth_subscribe","params":["\xc0\xaf"]}',
        b'[{"jsonrpc":"2.0","id":7,"method":"eth_subscribe","params":["newHeads\xed\xa0\x80"]}]',
    ):
        await client.send(message)
        reply = await client.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32700, (message, reply)
        assert reply["error"]["message"] == "parse error: body is not valid UTF-8", reply
    assert (await client.call("eth_chainId"))["result"] == "0x7a69"
    await client.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_logs_filter_caps_over_the_socket(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway(
        [anvil.url],
        network=FOLLOW,
        ws={
            "max_filter_addresses": 3,
            "max_filter_topics": 2,
            "max_filter_bytes_per_connection": 100,
        },
    )
    client = await Client.open(ws_url(handle))
    addresses = ["0x" + f"{n:040x}" for n in range(1, 5)]
    too_many = await client.call("eth_subscribe", ["logs", {"address": addresses}])
    assert too_many["error"]["code"] == -32602
    assert "limit [ws] max_filter_addresses = 3" in too_many["error"]["message"]
    assert too_many["error"]["data"] == {"limit": "[ws] max_filter_addresses", "value": 3}
    topics = await client.call(
        "eth_subscribe", ["logs", {"topics": [[topic(1), topic(2)], topic(3)]}]
    )
    assert topics["error"]["code"] == -32602
    assert "limit [ws] max_filter_topics = 2" in topics["error"]["message"]
    # 3 addresses: 60 filter bytes of the connection's 100.
    first = await client.subscribe("logs", {"address": addresses[:3]})
    over = await client.call(
        "eth_subscribe", ["logs", {"address": addresses[0], "topics": [topic(1)]}]
    )
    assert over["error"]["code"] == -32005
    assert over["error"]["data"] == {"limit": "[ws] max_filter_bytes_per_connection", "value": 100}
    assert "52 filter bytes" in over["error"]["message"]
    await client.subscribe("logs")  # a filter of no values costs nothing
    await client.subscribe("newHeads")
    # Another connection has its own budget; unsubscribing gives the bytes back.
    other = await Client.open(ws_url(handle))
    await other.subscribe("logs", {"address": addresses[:3]})
    assert (await client.call("eth_unsubscribe", [first]))["result"] is True
    await client.subscribe("logs", {"address": addresses[0], "topics": [topic(1)]})
    await other.close()
    await client.close()


async def test_plan_logs_filter_caps_per_connection_and_per_key(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    settings = auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    settings.chains["ethereum"]["devnet"].follower = FollowerSettings(poll_interval=0.05)
    stack = await start_auth(nursery, impl, settings)
    key, _ = await stack.key(plan="free", email="filters@t")
    account = await AuthRows(stack.store).find_account_by_email("filters@t")
    limits = {
        "ws_filter_addresses": 2,
        "ws_filter_topics": 1,
        "ws_filter_bytes_per_connection": 80,
        "ws_filter_bytes_per_key": 100,
    }
    await AuthRows(stack.store).set_plan(account.id, "free", json.dumps(limits))
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    url = ws_url(stack.handle, query=f"?apiKey={key}")
    first, second = await Client.open(url), await Client.open(url)
    a, b, c = ("0x" + f"{n:040x}" for n in range(1, 4))

    async def refused(client: Client, criteria: Any, code: int, limit: str) -> None:
        reply = await client.call("eth_subscribe", ["logs", criteria])
        assert reply["error"]["code"] == code, reply
        assert reply["error"]["data"] == {"limit": limit, "value": limits[limit]}
        assert f"limit {limit} = {limits[limit]}" in reply["error"]["message"]

    await refused(first, {"address": [a, b, c]}, -32602, "ws_filter_addresses")
    await refused(first, {"topics": [[topic(1), topic(2)]]}, -32602, "ws_filter_topics")
    await first.subscribe("logs", {"address": [a, b], "topics": [topic(1)]})  # 72 bytes
    await refused(first, {"address": c}, -32005, "ws_filter_bytes_per_connection")
    await refused(second, {"address": [a, b]}, -32005, "ws_filter_bytes_per_key")
    await second.subscribe("logs", {"address": c})  # 92 of the key's 100
    await first.close()  # its 72 bytes come back to the key
    with trio.fail_after(5):
        while len(stack.handle.gateway.front.ws.sessions) > 1:
            await trio.sleep(0.02)
    await second.subscribe("logs", {"address": [a, b]})
    await second.close()


async def test_fragmented_message_and_bytes_read_with_the_upgrade(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", handle.port))
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "eth_chainId", "params": []}).encode()
    # The first message travels in the same segment as the upgrade request, in two fragments.
    await sock.send(
        handshake_bytes(WS_PATH)
        + client_frame(body[:10], opcode=1, fin=False)
        + client_frame(body[10:], opcode=0, fin=True)
    )
    client = RawClient(sock)
    head = await client.read_until(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    assert await client.message() == {"jsonrpc": "2.0", "id": 7, "result": "0x7a69"}
    client.close()


async def _frames_until_closed(client: RawClient) -> None:
    while True:
        await client.frame()


async def test_keepalive_pings_and_drops_silent_peers(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], ws={"ping_interval": 0.2, "pong_timeout": 0.3})
    live = await Client.open(ws_url(handle))  # websockets answers pings by itself
    mute = await RawClient.open(handle.port, WS_PATH)  # never answers
    with trio.fail_after(5):
        opcode, payload = await mute.frame()
        assert opcode == 0x9  # a ping
        with pytest.raises((EOFError, ConnectionResetError)):
            await _frames_until_closed(mute)
    assert (await live.call("eth_chainId"))["result"] == "0x7a69"
    assert handle.gateway.front.ws.disconnects["keepalive_timeout"] == 1
    mute.close()
    await live.close()


async def test_graceful_shutdown_closes_with_1001(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    client = await Client.open(ws_url(handle))
    await client.subscribe("syncing")
    handle.gateway.shutdown()
    assert await client.closed() == 1001
    with trio.fail_after(10):
        await handle.gateway.front.edge.wait_closed()


async def test_upgrade_refusals_at_the_http_level(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    port = handle.port

    async def answer(data: bytes) -> Any:
        (response,) = parse_responses(await exchange(port, data, half_close=True), ["GET"])
        return response

    plain = await answer(b"GET " + WS_PATH.encode() + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    assert plain.status == 426 and plain.json()["error"]["code"] == "upgrade_required"
    post = await answer(handshake_bytes(WS_PATH).replace(b"GET ", b"POST ", 1))
    assert post.status == 405
    unknown = await answer(handshake_bytes("/v1/ws/ethereum/nowhere"))
    assert unknown.status == 404 and unknown.json()["error"]["status"] == 404
    version = await answer(handshake_bytes(WS_PATH).replace(b"Version: 13", b"Version: 8"))
    assert version.status == 426 and version.headers["sec-websocket-version"] == "13"
    bad_key = await answer(handshake_bytes(WS_PATH, key=b"short"))
    assert bad_key.status == 400
    # An Upgrade header elsewhere changes nothing (h2c is not offered).
    rpc = await answer(
        b"GET /v1/health HTTP/1.1\r\nHost: t\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    )
    assert rpc.status == 200


# --- API keys --------------------------------------------------------------------------------


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> AuthStack:
    settings = auth_settings(
        anvil, f"sqlite://{tmp_path}/store.db", tmp_path, ws={"syncing_poll_interval": 0.1}
    )
    return await start_auth(nursery, impl, settings)


async def test_upgrade_needs_a_valid_key(stack: AuthStack) -> None:
    handle = stack.handle
    test_key, _ = await stack.key(env="test")
    live_key, _ = await stack.key(env="live")
    data_only, _ = await stack.key(scopes="data:read")
    url = ws_url(handle)
    cases = [
        (url, 401, "missing"),
        (url + "?apiKey=svc_test_" + "x" * 43, 401, "invalid"),
        (url + "?apiKey=nonsense", 401, "malformed"),
        (ws_url(handle, "mainnet", f"?apiKey={test_key}"), 403, "not a testnet"),
        (url + f"?apiKey={data_only}", 403, "rpc:read"),
    ]
    for target, status, words in cases:
        got, body = await trio.to_thread.run_sync(refused, target)
        assert got == status, (target, body)
        assert body["error"]["status"] == status and words in body["error"]["message"]
        assert body["error"]["code"] == ("unauthorized" if status == 401 else "forbidden")
    for target in (url + f"?apiKey={test_key}", ws_url(handle, "mainnet", f"?apiKey={live_key}")):
        client = await Client.open(target)
        assert (await client.call("eth_chainId"))["result"] == "0x7a69"
        await client.close()
    header = await Client.open(url, additional_headers={"X-API-Key": test_key})
    await header.close()
    # The key never reaches the access log (the query string is not logged).
    raw = handle.raw_logs()
    assert test_key.encode() not in raw and live_key.encode() not in raw
    assert b"apiKey" not in raw
    upgrades = [line for line in handle.log_lines() if line["msg"] == "websocket upgrade"]
    assert {line["path"] for line in upgrades} >= {WS_PATH, "/v1/ws/ethereum/mainnet"}


async def test_scopes_and_metering_over_the_socket(stack: AuthStack) -> None:
    key, _ = await stack.key(scopes="rpc:read")
    client = await Client.open(ws_url(stack.handle, query=f"?apiKey={key}"))
    write = await client.call("eth_sendRawTransaction", ["0x00"])
    assert write["error"]["code"] == -32002
    assert write["error"]["data"] == {"status": 403, "code": "forbidden"}
    sub = await client.subscribe("syncing")
    (push,) = await collect(client, 1, 5)
    assert push["params"]["subscription"] == sub
    await client.close()
    # eth_subscribe costs 10 CU; each push its bytes x 0.04, rounded up (the sweeper bills).
    with trio.fail_after(10):
        while True:
            await trio.sleep(0.3)
            async with stack.client(key) as http:
                usage = (await http.get("/v1/usage?granularity=day")).json()["usage"]
            methods = {row["method"]: row for row in usage}
            if "eth_subscription" in methods:
                break
    assert methods["eth_subscribe"]["compute_units"] == 10
    size = len(json.dumps(push, separators=(",", ":")))
    assert methods["eth_subscription"]["compute_units"] == -(-size * 4 // 100)
    assert methods["eth_subscription"]["requests"] == 0


async def test_revoked_key_socket_closed_within_seconds(stack: AuthStack) -> None:
    key, key_id = await stack.key()
    client = await Client.open(ws_url(stack.handle, query=f"?apiKey={key}"))
    await client.subscribe("syncing")
    await AuthRows(stack.store).revoke_key(key_id)  # through the store, as another process would
    started = trio.current_time()
    assert await client.closed() == 1008
    assert trio.current_time() - started < 3.0
    assert stack.handle.gateway.front.ws.disconnects["revoked"] == 1


async def test_plan_caps_connections_and_subscriptions(stack: AuthStack) -> None:
    key, _ = await stack.key(plan="free", email="caps@t")
    account = await AuthRows(stack.store).find_account_by_email("caps@t")
    await AuthRows(stack.store).set_plan(
        account.id, "free", json.dumps({"ws_connections": 2, "ws_subscriptions": 2})
    )
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    url = ws_url(stack.handle, query=f"?apiKey={key}")
    first, second = await Client.open(url), await Client.open(url)
    status, body = await trio.to_thread.run_sync(refused, url)
    assert status == 429 and body["error"]["code"] == "rate_limited"
    await first.subscribe("syncing")
    await first.subscribe("newPendingTransactions")
    third = await first.call("eth_subscribe", ["syncing"])
    assert third["error"]["code"] == -32005
    await second.close()
    with trio.fail_after(5):
        while len(stack.handle.gateway.front.ws.sessions) > 1:
            await trio.sleep(0.02)
    again = await Client.open(url)  # a slot is free again
    await again.close()
    await first.close()


async def test_raw_socket_close_is_clean(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url])
    client = await RawClient.open(handle.port, WS_PATH)
    await client.sock.send(client_frame(b"\x03\xe8bye", opcode=0x8))
    opcode, payload = await client.frame()
    assert opcode == 0x8 and payload[:2] == b"\x03\xe8"
    with trio.fail_after(5):
        assert await client.sock.recv(10) == b""  # the server closes the TCP connection
    client.sock.close()
    with trio.fail_after(5):
        while handle.gateway.front.ws.sessions:
            await trio.sleep(0.02)


async def test_a_client_resetting_the_connection_is_logged_at_debug(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """A reset (RST, no closing handshake) is a normal end of a client: one debug line, no
    error and no traceback."""
    handle = await start_gateway([anvil.url])
    records = Records()
    logger = logging.getLogger("chaingate")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        client = await RawClient.open(handle.port, WS_PATH)
        await client.send_json({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
        opcode, _ = await client.frame()
        assert opcode == 0x1
        # SO_LINGER 0: close() sends RST instead of FIN.
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.sock.close()
        with trio.fail_after(5):
            while handle.gateway.front.ws.sessions:
                await trio.sleep(0.02)
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    errors = [r for r in records.records if r.levelno >= logging.WARNING]
    assert errors == [], [(r.getMessage(), r.exc_info) for r in errors]
    lost = [r for r in records.records if r.getMessage() == "websocket connection lost"]
    assert len(lost) == 1 and lost[0].levelno == logging.DEBUG


async def test_rate_limits_over_the_socket_are_json_rpc_errors(stack: AuthStack) -> None:
    key, _ = await stack.key(plan="free", email="rate@t")
    account = await AuthRows(stack.store).find_account_by_email("rate@t")
    await AuthRows(stack.store).set_plan(account.id, "free", json.dumps({"requests_per_second": 3}))
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    client = await Client.open(ws_url(stack.handle, query=f"?apiKey={key}"))
    calls = [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId", "params": []} for i in range(10)]
    for call in calls:
        await client.send(call)
    replies = {reply["id"]: reply for reply in await collect(client, 10)}
    limited = [r for r in replies.values() if "error" in r]
    assert 0 < len(limited) <= 7
    assert all(r["error"]["code"] == -32005 for r in limited)
    assert sorted(replies) == list(range(10))  # each refusal carries its call's id
    await client.close()
