"""Solana PubSub through chaingate (``/v1/ws/solana/{network}``) against the devnet's real
Solana node (LiteSVM behind JSON-RPC and PubSub), with real clients: ``websockets`` and
solana-py's ``SolanaWsClient``.

The node runs in the test's own trio loop (its slot clock at 100 ms); its PubSub hub is read
to check what chaingate asked of it (one upstream subscription, however many clients)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from solana.rpc.websocket_api import SolanaWsClient
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.rpc.responses import SlotNotification
from solders.system_program import TransferParams, transfer
from solders.transaction import Transaction

from chaingate.auth.store import AuthRows
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.pubsub import Hub as NodeHub
from chaingate.devnet.solana.server import Endpoints, serve
from chaingate.twins import Impl
from chaingate.ws import solana_hub
from chaingate.ws.solana_hub import SolanaHub
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle
from tests.test_auth import AuthStack, keyed_settings, start_auth
from tests.ws_clients import Client, RawClient

SOL = 10**9
PATH = "/v1/ws/solana/devnet"
SLOT_SECONDS = 0.1


class Node:
    """One devnet Solana node in the test's loop, which the test may kill."""

    def __init__(self, ledger: Ledger, urls: Endpoints, scope: trio.CancelScope) -> None:
        self.ledger = ledger
        self.urls = urls
        self.scope = scope
        hubs = [getattr(o, "__self__", None) for o in ledger.observers]
        self.pubsub: NodeHub = next(h for h in hubs if isinstance(h, NodeHub))

    def subscriptions(self, method: str | None = None) -> int:
        return sum(
            1
            for sub in self.pubsub.subscriptions.values()
            if method is None or sub.method == method
        )

    def kill(self) -> None:
        self.scope.cancel()

    async def rpc(self, method: str, *params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        async with httpx.AsyncClient() as client:
            reply = (await client.post(self.urls.http, json=body)).json()
        assert "result" in reply, reply
        return reply["result"]


async def start_node(nursery: trio.Nursery) -> Node:
    ledger = Ledger(genesis_time=time.time(), confirmed_depth=1, finalized_depth=3)
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[Endpoints] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await serve(ledger, slot_seconds=SLOT_SECONDS, task_status=task_status)

    urls: Endpoints = await nursery.start(run)
    return Node(ledger, urls, scope)


def solana_network(*nodes: Node) -> dict[str, Any]:
    upstreams = [
        {"url": n.urls.http, "ws_url": n.urls.ws, "name": f"node{i}"} for i, n in enumerate(nodes)
    ]
    return {
        "solana": {
            "devnet": {
                "family": "solana",
                "testnet": True,
                "finality_depth": 32,
                "upstreams": upstreams,
            }
        }
    }


async def gateway(start_gateway: StartGateway, *nodes: Node, **sections: Any) -> GatewayHandle:
    return await start_gateway(["http://127.0.0.1:1"], chains=solana_network(*nodes), **sections)


def url(handle: GatewayHandle, query: str = "") -> str:
    return f"ws://127.0.0.1:{handle.port}{PATH}{query}"


def hub_of(handle: GatewayHandle) -> SolanaHub:
    return next(iter(handle.gateway.front.ws.solana_hubs.values()))


async def next_of(client: Client, method: str, seconds: float = 10.0) -> Any:
    """The next message that is a ``method`` notification (others skipped)."""
    with trio.fail_after(seconds):
        while True:
            message = await client.recv(seconds)
            if message.get("method") == method:
                return message


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not condition():
            await trio.sleep(0.02)


async def signed_transfer(node: Node, payer: Keypair, to: Pubkey, lamports: int) -> Transaction:
    latest = await node.rpc("getLatestBlockhash", {"commitment": "processed"})
    blockhash = Hash.from_string(latest["value"]["blockhash"])
    ix = transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=to, lamports=lamports))
    return Transaction([payer], Message([ix], payer.pubkey()), blockhash)


# --- sharing, ids, unsubscribe -------------------------------------------------------------


async def test_clients_share_one_upstream_subscription_with_their_own_ids(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    handle = await gateway(start_gateway, node)
    clients = [await Client.open(url(handle)) for _ in range(4)]
    ids = []
    for client in clients:
        reply = await client.call("slotSubscribe")
        assert isinstance(reply["result"], int), reply
        ids.append(reply["result"])
    assert len(set(ids)) == 4
    await until(lambda: node.subscriptions("slotNotification") == 1)
    # Every client hears the same slots, each under its own id, in Solana's shape.
    firsts = [await next_of(client, "slotNotification") for client in clients]
    for client, sub, push in zip(clients, ids, firsts, strict=True):
        assert push["params"]["subscription"] == sub
        assert set(push["params"]["result"]) == {"parent", "root", "slot"}
        following = await next_of(client, "slotNotification")
        assert following["params"]["result"]["slot"] > push["params"]["result"]["slot"]
    # Same account, config members in another order: still one upstream subscription.
    who = str(Keypair().pubkey())
    a = await clients[0].call(
        "accountSubscribe", [who, {"encoding": "base64", "commitment": "confirmed"}]
    )
    b = await clients[1].call(
        "accountSubscribe", [who, {"commitment": "confirmed", "encoding": "base64"}]
    )
    assert a["result"] != b["result"]
    await until(lambda: node.subscriptions("accountNotification") == 1)
    await node.rpc("requestAirdrop", who, SOL)
    for client, reply in ((clients[0], a), (clients[1], b)):
        push = await next_of(client, "accountNotification")
        assert push["params"]["subscription"] == reply["result"]
        assert push["params"]["result"]["value"]["lamports"] == SOL
    # Unsubscribe: true once, then Solana's error; the upstream's goes with the last one.
    for client, sub in zip(clients[:3], ids[:3], strict=True):
        assert (await client.call("slotUnsubscribe", [sub]))["result"] is True
        again = await client.call("slotUnsubscribe", [sub])
        assert again["error"] == {"code": -32602, "message": "Invalid subscription id."}
    other = await clients[0].call("slotUnsubscribe", [ids[3]])  # not its own
    assert other["error"]["code"] == -32602
    assert node.subscriptions("slotNotification") == 1
    await clients[3].close()  # the last one goes by closing its connection
    await until(lambda: node.subscriptions("slotNotification") == 0)
    assert node.subscriptions("accountNotification") == 1
    for client in clients[:3]:
        await client.close()
    await until(lambda: node.subscriptions() == 0)
    hub = hub_of(handle)
    assert hub.router.channels == {} and hub.connects == 1


async def test_upstream_errors_pass_through_and_calls_are_answered(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    handle = await gateway(start_gateway, node)
    client = await Client.open(url(handle))
    bad = await client.call("accountSubscribe", ["not a pubkey"])
    assert bad["error"]["code"] == -32602  # the node's own error, unchanged
    await client.send({"jsonrpc": "2.0", "id": "p", "method": "accountSubscribe", "params": "x"})
    assert (await client.recv())["error"]["code"] == -32602
    huge = await client.call("programSubscribe", [str(Keypair().pubkey()), {"x": "y" * 5000}])
    assert huge["error"]["code"] == -32602 and "4096" in huge["error"]["message"]
    # Other calls go through the request pipeline, as over HTTP.
    slot = (await client.call("getSlot", [{"commitment": "processed"}]))["result"]
    assert isinstance(slot, int) and slot >= 0
    assert (await client.call("eth_blockNumber"))["error"]["code"] == -32601
    assert (await client.call("blockSubscribe", ["all"]))["error"]["code"] == -32601
    assert hub_of(handle).router.channels == {}
    await client.close()


async def test_a_network_without_a_pubsub_url_refuses_subscriptions_only(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    chains = solana_network(node)
    del chains["solana"]["devnet"]["upstreams"][0]["ws_url"]
    handle = await start_gateway(["http://127.0.0.1:1"], chains=chains)
    client = await Client.open(url(handle))
    refused = await client.call("slotSubscribe")
    assert refused["error"]["code"] == -32002 and "ws_url" in refused["error"]["message"]
    assert isinstance((await client.call("getSlot"))["result"], int)
    await client.close()


async def test_signature_subscription_ends_with_its_notification(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    handle = await gateway(start_gateway, node)
    payer = Keypair()
    await node.rpc("requestAirdrop", str(payer.pubkey()), 2 * SOL)
    await trio.sleep(3 * SLOT_SECONDS)
    clients = [await Client.open(url(handle)) for _ in range(2)]
    tx = await signed_transfer(node, payer, Keypair().pubkey(), SOL)
    signature = str(tx.signatures[0])
    subs = [
        (await client.call("signatureSubscribe", [signature, {"commitment": "confirmed"}]))[
            "result"
        ]
        for client in clients
    ]
    assert node.subscriptions("signatureNotification") == 1
    encoded = base64.b64encode(bytes(tx)).decode()
    assert await node.rpc("sendTransaction", encoded, {"encoding": "base64"}) == signature
    for client, sub in zip(clients, subs, strict=True):
        push = await next_of(client, "signatureNotification")
        assert push["params"] == {
            "result": {"context": push["params"]["result"]["context"], "value": {"err": None}},
            "subscription": sub,
        }
        gone = await client.call("signatureUnsubscribe", [sub])
        assert gone["error"]["code"] == -32602  # over already, as on Solana
    assert node.subscriptions() == 0
    assert hub_of(handle).router.channels == {}
    assert all(not session.subscriptions for session in handle.gateway.front.ws.sessions)
    for client in clients:
        await client.close()


def _solana_py_slots(target: str) -> tuple[int, int, bool]:
    async def main() -> tuple[int, int, bool]:
        async with SolanaWsClient(target) as ws:
            sub = await ws.slot_subscribe()
            slots: list[int] = []
            while len(slots) < 2:
                message = await ws.recv()
                if isinstance(message, SlotNotification):
                    slots.append(message.result.slot)
            await ws.unsubscribe(sub)
            return slots[0], slots[1], True

    return asyncio.run(main())


async def test_solana_py_websocket_client(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    handle = await gateway(start_gateway, node)
    first, second, unsubscribed = await trio.to_thread.run_sync(_solana_py_slots, url(handle))
    assert second > first and unsubscribed
    await until(lambda: node.subscriptions() == 0)


# --- failover ------------------------------------------------------------------------------


async def test_upstream_lost_resubscribes_on_the_other_and_tells_the_client(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    first, second = await start_node(nursery), await start_node(nursery)
    handle = await gateway(start_gateway, first, second)
    # Three clients take gap notices; one (the default) is told by its connection's close.
    clients = [await Client.open(url(handle, "?gaps=notify")) for _ in range(3)]
    plain = await Client.open(url(handle))
    subs = [(await client.call("slotSubscribe"))["result"] for client in clients]
    await plain.call("slotSubscribe")
    for client in [*clients, plain]:
        await next_of(client, "slotNotification")
    assert (first.subscriptions(), second.subscriptions()) == (1, 0)
    hub = hub_of(handle)
    assert hub.upstream == "node0"
    killed_at = time.time()
    first.kill()
    assert await plain.closed() == 1012
    for client, sub in zip(clients, subs, strict=True):
        # The gap is told first, under the client's own id, then the slots resume.
        while True:
            message = await client.recv()
            if message["method"] == "subscriptionGap":
                break
            assert message["method"] == "slotNotification"  # sent before the loss
        gap = message["params"]
        assert gap["subscription"] == sub
        assert gap["result"]["reason"] == "upstream lost"
        assert gap["result"]["upstream"] == "node1"
        assert killed_at - 1 <= gap["result"]["lostAt"] <= gap["result"]["resumedAt"]
        resumed = await next_of(client, "slotNotification")
        assert resumed["params"]["subscription"] == sub
    assert second.subscriptions() == 1 and hub.upstream == "node1" and hub.gaps == 3
    # A new client joins the channel on the new upstream at once.
    late = await Client.open(url(handle))
    assert isinstance((await late.call("slotSubscribe"))["result"], int)
    await next_of(late, "slotNotification")
    assert second.subscriptions() == 1
    ws = handle.gateway.front.ws
    await until(lambda: ws.disconnects["upstream_lost"] == 1)
    for client in [*clients, late]:
        await client.close()
    status = await trio.to_thread.run_sync(_refused_status, url(handle, "?gaps=sometimes"))
    assert status == 400


def _solana_py_across_a_loss(target: str, kill: Callable[[], None]) -> str:
    """solana-py subscribed when its upstream dies: what its next ``recv`` raises."""

    async def main() -> str:
        async with SolanaWsClient(target) as ws:
            await ws.slot_subscribe()
            while not isinstance(await ws.recv(), SlotNotification):
                pass
            kill()
            try:
                async with asyncio.timeout(10):
                    while True:
                        await ws.recv()
            except Exception as exc:  # what a solana-py user sees
                return repr(exc)
        return "nothing"

    return asyncio.run(main())


async def test_solana_py_is_told_of_a_loss_by_the_close(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    first, second = await start_node(nursery), await start_node(nursery)
    handle = await gateway(start_gateway, first, second)

    def kill() -> None:
        trio.from_thread.run_sync(first.kill)

    raised = await trio.to_thread.run_sync(_solana_py_across_a_loss, url(handle), kill)
    assert "ConnectionClosed" in raised and "1012" in raised, raised
    # Its next connection subscribes on the other upstream.
    slots = await trio.to_thread.run_sync(_solana_py_slots, url(handle))
    assert slots[1] > slots[0] and hub_of(handle).upstream == "node1"


async def test_an_unreachable_first_upstream_is_skipped(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    chains = solana_network(node)
    dead = {"url": "http://127.0.0.1:1", "ws_url": "ws://127.0.0.1:1", "name": "dead"}
    chains["solana"]["devnet"]["upstreams"].insert(0, dead)
    handle = await start_gateway(["http://127.0.0.1:1"], chains=chains)
    client = await Client.open(url(handle))
    sub = (await client.call("slotSubscribe"))["result"]
    push = await next_of(client, "slotNotification")
    assert push["params"]["subscription"] == sub
    hub = hub_of(handle)
    assert hub.upstream == "node0" and hub.gaps == 0  # nothing was live on the dead one
    await client.close()


# --- bounds: slow readers, caps, metering ----------------------------------------------------


async def test_slow_reader_is_dropped_and_the_others_keep_hearing(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = await start_node(nursery)
    handle = await gateway(
        start_gateway,
        node,
        ws={"send_queue_bytes": 8192, "socket_send_buffer": 4096, "close_timeout": 10},
    )
    fast = await Client.open(url(handle))
    await fast.call("slotSubscribe")
    slow = await RawClient.open(handle.port, PATH, rcvbuf=4096)
    for i in range(300):  # 300 members of the same channel: ~27 KB a slot it never reads
        await slow.send_json({"jsonrpc": "2.0", "id": i, "method": "slotSubscribe"})
    ws = handle.gateway.front.ws
    await until(lambda: any(session.dropped for session in ws.sessions))
    # The fast client keeps hearing every slot in order; the upstream still has its one.
    slots = [(await next_of(fast, "slotNotification"))["params"]["result"]["slot"]]
    for _ in range(5):
        slots.append((await next_of(fast, "slotNotification"))["params"]["result"]["slot"])
    assert slots == list(range(slots[0], slots[0] + 6))
    assert node.subscriptions("slotNotification") == 1
    slow.close()
    await until(lambda: ws.disconnects["slow_consumer"] == 1)
    assert len(ws.sessions) == 1
    await fast.close()


async def test_a_new_upstream_connection_takes_every_channel_at_once(
    start_gateway: StartGateway, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a loss, the next upstream connection asks for every channel at once: that burst
    # (one request per channel, however many) is not an upstream leaving requests unanswered.
    # (It was once checked against a fixed outbox of 10,000 requests: a hub with more
    # channels than that could never connect again.)
    monkeypatch.setattr(solana_hub, "UNANSWERED", 0)
    first, second = await start_node(nursery), await start_node(nursery)
    handle = await gateway(start_gateway, first, second)
    client = await Client.open(url(handle, "?gaps=notify"))
    for _ in range(6):
        reply = await client.call("accountSubscribe", [str(Keypair().pubkey())])
        assert isinstance(reply["result"], int), reply
    assert first.subscriptions("accountNotification") == 6
    hub = hub_of(handle)
    first.kill()
    await until(lambda: second.subscriptions("accountNotification") == 6)
    assert hub.upstream == "node1" and hub.connects == 2
    gaps = [await client.recv() for _ in range(6)]
    assert {gap["method"] for gap in gaps} == {"subscriptionGap"}
    await client.close()


@pytest.fixture
async def stack(nursery: trio.Nursery, impl: Impl, tmp_path: Path) -> tuple[AuthStack, Node]:
    node = await start_node(nursery)
    settings = keyed_settings(
        ["http://127.0.0.1:1"],
        f"sqlite://{tmp_path}/store.db",
        tmp_path,
        chains=solana_network(node),
    )
    return await start_auth(nursery, impl, settings), node


async def test_metering_scopes_and_plan_caps(stack: tuple[AuthStack, Node]) -> None:
    auth, node = stack
    key, _ = await auth.key(plan="free", email="sol@t")
    account = await AuthRows(auth.store).find_account_by_email("sol@t")
    assert account is not None
    await AuthRows(auth.store).set_plan(
        account.id, "free", json.dumps({"ws_connections": 1, "ws_subscriptions": 2})
    )
    await auth.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    target = url(auth.handle, f"?apiKey={key}")
    client = await Client.open(target)
    status = await trio.to_thread.run_sync(_refused_status, target)
    assert status == 429  # one connection for this plan
    sub = (await client.call("slotSubscribe"))["result"]
    assert isinstance((await client.call("rootSubscribe"))["result"], int)
    third = await client.call("slotSubscribe")
    assert third["error"]["code"] == -32005  # two subscriptions per connection
    pushes = [await next_of(client, "slotNotification") for _ in range(3)]
    assert all(p["params"]["subscription"] == sub for p in pushes)
    await client.close()
    # slotSubscribe costs 10 CU; each push its bytes x 0.04, rounded up, as on EVM.
    with trio.fail_after(10):
        while True:
            await trio.sleep(0.3)
            async with auth.client(key) as http:
                usage = (await http.get("/v1/usage?granularity=day")).json()["usage"]
            methods = {row["method"]: row for row in usage}
            if "solana_subscription" in methods and "slotSubscribe" in methods:
                break
    assert methods["slotSubscribe"]["compute_units"] == 10  # the second is over the plan cap
    assert methods["rootSubscribe"]["compute_units"] == 10
    pushed = methods["solana_subscription"]
    assert pushed["requests"] == 0
    size = len(json.dumps(pushes[0], separators=(",", ":")))
    assert pushed["compute_units"] >= 3 * -(-size * 4 // 100)
    await until(lambda: node.subscriptions() == 0)


def _refused_status(target: str) -> int:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    try:
        with connect(target, open_timeout=10):
            pass
    except InvalidStatus as exc:
        return exc.response.status_code
    return 101


# --- chaingate bench ws --subscribe slotSubscribe ---------------------------------------------


async def test_bench_ws_slot_subscribers_through_chaingate_and_on_the_node(
    start_gateway: StartGateway, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from tests.test_bench_suite import bench

    node = await start_node(nursery)
    handle = await gateway(start_gateway, node)
    args = [
        "ws", "--subscribe", "slotSubscribe", "--users", "3", "--duration", "4",
        "--target", f"chaingate={url(handle)}",
        "--target", f"node={node.urls.ws}",
        "--out", str(tmp_path),
    ]  # fmt: skip
    done = await trio.to_thread.run_sync(lambda: bench(*args))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    for target in ("chaingate", "node"):
        slots = data["by_name"][target]["slotSubscribe"]
        assert slots["outcomes"]["dropped"] == slots["outcomes"]["wrong"] == 0, (target, slots)
        assert slots["answered"] >= 3 * 10, (target, slots)  # 3 connections, 100 ms slots
        assert data["by_name"][target]["subscribe"]["answered"] == 3
    assert hub_of(handle).pushes >= data["by_name"]["chaingate"]["slotSubscribe"]["answered"]
