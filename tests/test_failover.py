"""Failover with real anvil nodes: killed nodes, dying connections, timeouts, throttling."""

from __future__ import annotations

import random
from typing import Any

import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from tests.conftest import StartGateway
from tests.helpers import FaultyRelay, GatewayHandle

RPC = "/v1/rpc/ethereum/devnet"
ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"


def signed_transfer(node: AnvilProcess, nonce: int = 0) -> str:
    tx = {
        "from": ACCOUNT,
        "to": "0x" + "22" * 20,
        "value": "0x1",
        "nonce": hex(nonce),
        "gas": "0x5208",
        "gasPrice": "0x3b9aca00",
    }
    raw = rpc_call(node.url, "eth_signTransaction", [tx])
    assert isinstance(raw, str)
    return raw


def nonce(node: AnvilProcess) -> int:
    return int(str(rpc_call(node.url, "eth_getTransactionCount", [ACCOUNT, "latest"])), 16)


class RelayedPair:
    """Two anvils, each behind its own relay, as the two upstreams of one gateway."""

    def __init__(
        self, gw: GatewayHandle, relays: list[FaultyRelay], nodes: list[AnvilProcess]
    ) -> None:
        self.gw = gw
        self.relays = relays
        self.nodes = nodes

    def ranked(self) -> list[tuple[FaultyRelay, AnvilProcess]]:
        """(relay, node) pairs in the order the pool will try them now."""
        order = [
            int(u.name[2:]) for u in self.gw.gateway.chain.services["ethereum/devnet"].pool.ranked()
        ]
        return [(self.relays[i], self.nodes[i]) for i in order]


async def relayed_pair(
    nursery: trio.Nursery, anvil_factory: Any, start_gateway: StartGateway, **upstream: Any
) -> RelayedPair:
    nodes = [anvil_factory(), anvil_factory()]
    relays = [FaultyRelay(node.port) for node in nodes]
    for relay in relays:
        await nursery.start(relay.serve)
    gw = await start_gateway(
        [
            {"url": f"http://127.0.0.1:{r.port}", "name": f"up{i}", **upstream}
            for i, r in enumerate(relays)
        ],
        rpc={"probe_interval": 60},
    )
    await trio.sleep(0.2)  # first probe done: ranking reflects measured latency
    return RelayedPair(gw, relays, nodes)


async def test_killing_an_upstream_during_a_read_load_costs_no_client_error(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    nodes = [anvil_factory(), anvil_factory()]
    gw = await start_gateway([node.url for node in nodes], rpc={"probe_interval": 0.2})
    pool = gw.gateway.chain.services["ethereum/devnet"].pool
    await trio.sleep(0.3)
    primary = nodes[int(pool.ranked()[0].name[2:])]
    outcomes = {"ok": 0, "error": 0}
    failures: list[Any] = []
    stop = trio.Event()

    async def reader(client: Any, worker: int) -> None:
        rng = random.Random(worker)
        while not stop.is_set():
            roll = rng.random()
            if roll < 0.4:
                body: Any = {
                    "jsonrpc": "2.0",
                    "id": worker,
                    "method": "eth_getBalance",
                    "params": [f"0x{rng.getrandbits(160):040x}", "latest"],
                }
            elif roll < 0.8:
                body = {"jsonrpc": "2.0", "id": worker, "method": "eth_blockNumber"}
            else:
                body = [
                    {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "eth_getBalance",
                        "params": [f"0x{rng.getrandbits(160):040x}", "latest"],
                    }
                    for i in range(5)
                ]
            response = await client.post(RPC, json=body)
            replies = response.json() if isinstance(response.json(), list) else [response.json()]
            if response.status_code == 200 and all("result" in r for r in replies):
                outcomes["ok"] += 1
            else:
                outcomes["error"] += 1
                failures.append((response.status_code, replies))

    async with gw.client() as client, trio.open_nursery() as nursery:
        for worker in range(16):
            nursery.start_soon(reader, client, worker)
        await trio.sleep(0.8)
        primary.kill()
        await trio.sleep(1.5)
        stop.set()
    assert outcomes["error"] == 0, failures[:3]
    assert outcomes["ok"] > 200
    killed = next(u for u in pool.upstreams if nodes[int(u.name[2:])] is primary)
    assert killed.health.state_down


async def test_a_write_whose_node_dies_after_receiving_it_is_not_sent_again(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil_factory: Any
) -> None:
    pair = await relayed_pair(nursery, anvil_factory, start_gateway)
    (relay, chosen), (_, other) = pair.ranked()
    relay.mode = "swallow_response"
    raw = signed_transfer(chosen)
    reply = await pair.gw.rpc("eth_sendRawTransaction", [raw])
    assert reply["error"]["code"] == -32603
    assert reply["error"]["data"]["reason"] == "outcome_unknown"
    assert relay.responses_swallowed == 1
    # Executed exactly once, on the node that received it; the other never saw it.  (anvil
    # may mine the transaction a moment after accepting it.)
    with trio.fail_after(5):
        while nonce(chosen) == 0:
            await trio.sleep(0.02)
    assert nonce(chosen) == 1
    assert nonce(other) == 0


async def test_a_throttled_node_sends_reads_and_writes_elsewhere(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil_factory: Any
) -> None:
    pair = await relayed_pair(nursery, anvil_factory, start_gateway)
    (relay, throttled), (_, other) = pair.ranked()
    relay.mode = "stub_429"  # a stub of a provider's rate limiter: nothing is forwarded
    reply = await pair.gw.rpc("eth_sendRawTransaction", [signed_transfer(other)])
    assert "result" in reply, reply
    assert relay.requests_seen >= 1
    with trio.fail_after(5):
        while nonce(other) == 0:
            await trio.sleep(0.02)
    assert (nonce(throttled), nonce(other)) == (0, 1)
    reply = await pair.gw.rpc("eth_getBalance", [ACCOUNT, "latest"])
    assert "result" in reply


async def test_timeouts_fail_reads_over_and_make_writes_outcome_unknown(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil_factory: Any
) -> None:
    pair = await relayed_pair(nursery, anvil_factory, start_gateway, timeout=0.3)
    (relay, slow), (_, other) = pair.ranked()
    relay.mode = "delay"
    relay.delay_seconds = 2.0
    started = trio.current_time()
    reply = await pair.gw.rpc("eth_getBalance", [ACCOUNT, "latest"])
    assert "result" in reply
    assert trio.current_time() - started < 1.5
    (relay, slow), (_, other) = pair.ranked()
    relay.mode = "delay"
    reply = await pair.gw.rpc("eth_sendRawTransaction", [signed_transfer(slow)])
    assert reply["error"]["data"]["reason"] == "outcome_unknown"
    await trio.sleep(2.2)  # the slow node answers late; it did execute the write
    assert (nonce(slow), nonce(other)) == (1, 0)


async def test_a_recovered_upstream_is_probed_back_into_rotation(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    first, second = anvil_factory(), anvil_factory()
    gw = await start_gateway([first.url, second.url], rpc={"probe_interval": 0.1})
    pool = gw.gateway.chain.services["ethereum/devnet"].pool
    port = first.port
    first.kill()
    with trio.fail_after(5):
        while not pool.upstreams[0].health.state_down:
            await trio.sleep(0.05)
    assert (await gw.rpc("eth_chainId"))["result"] == "0x7a69"
    revived = anvil_factory(port=port)
    assert revived.port == port
    with trio.fail_after(5):
        while pool.upstreams[0].health.state_down:
            await trio.sleep(0.05)


async def test_all_upstreams_down_is_a_json_rpc_error_never_a_500(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url], rpc={"request_timeout": 2.0})
    node.kill()
    async with gw.client() as client:
        response = await client.post(
            RPC, json={"jsonrpc": "2.0", "id": 9, "method": "eth_blockNumber"}
        )
        batch = await client.post(
            RPC,
            json=[
                {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"},
                {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId"},
            ],
        )
        health = await client.get("/v1/health")
    assert response.status_code == 200
    reply = response.json()
    assert reply["id"] == 9 and reply["error"]["code"] == -32603
    assert reply["error"]["data"]["reason"] in {"connect", "connection_lost", "unavailable"}
    assert [r["id"] for r in batch.json()] == [1, 2]
    assert all(r["error"]["code"] == -32603 for r in batch.json())
    assert health.status_code == 503 and health.json()["status"] == "degraded"
