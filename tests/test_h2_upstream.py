"""HTTP/2 upstreams: nginx terminating TLS with ``http2`` (a trustme certificate) in front of a
real anvil, as a hosted node provider's edge looks to chaingate.

Calls, batches and many concurrent streams on one connection; ALPN's choice and the
``http_version`` knob; flow control both ways with bodies larger than every window; nginx's
REFUSED_STREAM and graceful GOAWAY (a write is sent again only on that proof); failover when
the h2 upstream dies; a write whose connection dies mid-request is never sent elsewhere.

Needs nginx (``apt-get install -y nginx``): skipped with a loud reason without it, except
under ``CI=true``, where a missing nginx is a broken CI image and the tests fail.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.evm.keccak import keccak256
from chaingate.rpc.connection import UpstreamConnection
from chaingate.rpc.h2connection import Http2Connection
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle
from tests.http_relay import HttpRelay

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from benchkit.tlsnginx import TlsNginx  # noqa: E402
from benchkit.tools import find_tool  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"
RPC = "/v1/rpc/ethereum/devnet"
ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
ADMIN = {"Authorization": "Bearer test-admin-token"}

StartNginx = Callable[..., Awaitable[TlsNginx]]


@pytest.fixture
def start_nginx(tmp_path: Path) -> Iterator[StartNginx]:
    """nginx (TLS, HTTP/2 and HTTP/1.1 by ALPN) in front of a node port; stopped after."""
    binary = find_tool("nginx")
    if binary is None:
        reason = "!!! HTTP/2 UPSTREAM TESTS NOT RUN: nginx missing; `apt-get install -y nginx` !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)
    started: list[TlsNginx] = []

    async def start(node_port: int, **options: Any) -> TlsNginx:
        server = TlsNginx(binary, tmp_path / f"nginx-{len(started)}", node_port, **options)
        started.append(server)
        # In a thread: its readiness check may go through a relay served by this test's loop.
        return await trio.to_thread.run_sync(server.start)

    yield start
    for server in started:
        server.stop()


def h2_upstream(server: TlsNginx, name: str = "h2", **settings: Any) -> dict[str, Any]:
    return {"url": server.url, "name": name, "ca_file": str(server.ca_file), **settings}


def pool_of(gw: GatewayHandle) -> Any:
    return gw.gateway.chain.services["ethereum/devnet"].pool


def upstream_named(gw: GatewayHandle, name: str) -> Any:
    return next(u for u in pool_of(gw).upstreams if u.name == name)


def call(method: str, params: list[Any] | None = None, call_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params or []}


def signed_transfers(node: AnvilProcess, count: int) -> list[str]:
    """``count`` transfers from ACCOUNT with nonces 0..count-1, signed by the node."""
    raws = []
    for nonce in range(count):
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
        raws.append(raw)
    return raws


def tx_hash(raw: str) -> str:
    return "0x" + keccak256(bytes.fromhex(raw.removeprefix("0x"))).hex()


def nonce(node: AnvilProcess) -> int:
    return int(str(rpc_call(node.url, "eth_getTransactionCount", [ACCOUNT, "latest"])), 16)


async def wait_for_nonce(node: AnvilProcess, expected: int) -> None:
    with trio.move_on_after(5):
        while nonce(node) < expected:
            await trio.sleep(0.02)


async def test_calls_batches_and_200_concurrent_calls_share_one_http2_connection(
    start_gateway: StartGateway, start_nginx: StartNginx, anvil: AnvilProcess
) -> None:
    nginx = await start_nginx(anvil.port)
    gw = await start_gateway([h2_upstream(nginx)])
    assert (await gw.rpc("eth_chainId"))["result"] == "0x7a69"
    async with gw.client() as client:
        response = await client.post(RPC, json=[call("eth_blockNumber", [], i) for i in range(30)])
        assert [reply["id"] for reply in response.json()] == list(range(30))
        assert all("result" in reply for reply in response.json())

        accounts = [f"0x{random.getrandbits(160):040x}" for _ in range(200)]
        answers: dict[int, Any] = {}

        async def balance(index: int) -> None:
            body = call("eth_getBalance", [accounts[index], "latest"], index)
            answers[index] = (await client.post(RPC, json=body)).json()

        async with trio.open_nursery() as nursery:  # (httpx sends up to 100 at once)
            for index in range(200):
                nursery.start_soon(balance, index)
    assert sorted(answers) == list(range(200))
    for index, reply in answers.items():
        assert reply == {"jsonrpc": "2.0", "id": index, "result": "0x0"}, reply
    (conn,) = upstream_named(gw, "h2").connections
    assert isinstance(conn, Http2Connection)
    assert not conn.pending and not conn.waiting
    # The 30-call batch and the 200 calls, on streams of this one connection: concurrent
    # streams, though fewer than one per call, since single calls read in one go travel
    # upstream together (one batch on one stream: docs/decisions/edge.md).
    streams = (conn._h2.highest_outbound_stream_id + 1) // 2
    assert streams >= 3  # eth_chainId, the batch, at least one group of the 200
    assert upstream_named(gw, "h2").health.errors == {}


async def test_alpn_decides_and_http_version_forces(
    start_gateway: StartGateway, start_nginx: StartNginx, anvil: AnvilProcess
) -> None:
    both = await start_nginx(anvil.port)
    http1_only = await start_nginx(anvil.port, http2=False)
    gw = await start_gateway(
        [
            h2_upstream(both, "auto"),
            h2_upstream(both, "forced-http1", http_version="http1"),
            h2_upstream(http1_only, "fallback"),
            h2_upstream(http1_only, "forced-h2", http_version="h2"),
        ],
        rpc={"probe_interval": 0.1},
    )
    await trio.sleep(0.5)  # a few probe rounds: every upstream has tried to connect
    kinds = {
        name: {type(conn) for conn in upstream_named(gw, name).connections}
        for name in ("auto", "forced-http1", "fallback")
    }
    assert kinds == {
        "auto": {Http2Connection},
        "forced-http1": {UpstreamConnection},
        "fallback": {UpstreamConnection},
    }
    refusing = upstream_named(gw, "forced-h2")
    assert refusing.connections == []
    assert refusing.health.state_down and refusing.health.errors.get("connect", 0) >= 1
    async with gw.client() as client:
        metrics = (await client.get("/metrics", headers=ADMIN)).text
    http2 = {
        line.split('upstream="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("chaingate_upstream_http2_connections{")
    }
    assert http2 == {"auto": 1, "forced-http1": 0, "fallback": 0, "forced-h2": 0}


async def test_bodies_larger_than_every_window_cross_flow_control(
    start_gateway: StartGateway, start_nginx: StartNginx, anvil: AnvilProcess
) -> None:
    """A 200 kB request (nginx's window for a request body is 64 kB) and a 3 MB answer (ours
    is 1 MiB per stream): both need WINDOW_UPDATEs, and arrive intact."""
    nginx = await start_nginx(anvil.port)
    gw = await start_gateway([h2_upstream(nginx)])
    size = 1_500_000
    target = "0x" + "ab" * 20
    params = [
        {"to": target, "data": "0x" + "cd" * 200_000, "gas": hex(25_000_000)},
        "latest",
        {target: {"code": f"0x62{size:06x}6000f3"}},  # RETURN(0, size): `size` zero bytes
    ]
    async with gw.client() as client:
        reply = (await client.post(RPC, json=call("eth_call", params))).json()
    assert reply.get("result") == "0x" + "00" * size, str(reply)[:300]
    (conn,) = upstream_named(gw, "h2").connections
    assert isinstance(conn, Http2Connection)


async def test_streams_nginx_refuses_are_sent_again_and_a_write_runs_once(
    start_gateway: StartGateway,
    start_nginx: StartNginx,
    anvil_factory: Callable[..., AnvilProcess],
) -> None:
    """With a body preread below 64k nginx refuses (REFUSED_STREAM) every stream with a body
    that arrives before the client acknowledged its SETTINGS — the first streams of each new
    connection.  Refused means not processed: the write goes again, and runs exactly once."""
    node = anvil_factory()
    nginx = await start_nginx(node.port, body_preread="1k")
    (raw,) = signed_transfers(node, 1)
    gw = await start_gateway([h2_upstream(nginx)], rpc={"probe_interval": 60})
    await trio.sleep(0.1)
    for conn in list(upstream_named(gw, "h2").connections):
        conn.abort("timeout", "test: a fresh connection for the write")
    await trio.sleep(0.05)
    reply = await gw.rpc("eth_sendRawTransaction", [raw])
    assert "result" in reply, reply
    await wait_for_nonce(node, 1)
    assert nonce(node) == 1
    health = upstream_named(gw, "h2").health
    assert health.errors.get("refused", 0) >= 1  # the proof that a refusal happened
    assert not health.state_down and health.consecutive_failures == 0


async def test_a_graceful_goaway_mid_burst_loses_and_duplicates_no_write(
    start_gateway: StartGateway,
    start_nginx: StartNginx,
    anvil_factory: Callable[..., AnvilProcess],
) -> None:
    """nginx ends a connection with GOAWAY after 10 streams (``keepalive_requests``): the
    streams at or below its last-stream-id are answered on the closing connection; those above
    were not processed and go again on a new one.  25 writes at once: 25 transactions."""
    # The node mines only when told, after the burst.  anvil's automine can strand one sender's
    # concurrent transactions: one that arrives while the block before it is being mined is
    # queued as if that block's nonce were still missing, and it and every later one stay
    # queued for good: no block, evm_mine, resend or next nonce moves them
    # (foundry-rs/foundry#10122; 3 of ~6,000 bursts of 25 straight to anvil, under load).
    # That is anvil's, not a lost write.
    node = anvil_factory(extra=["--no-mining"])
    nginx = await start_nginx(node.port, keepalive_requests=10)
    raws = signed_transfers(node, 25)
    # One upstream request per call: the client's batch becomes 25 streams sent together.
    gw = await start_gateway([h2_upstream(nginx, max_batch=1)], rpc={"probe_interval": 60})
    await trio.sleep(0.1)  # the first probe: the connection is open before the burst
    batch = [call("eth_sendRawTransaction", [raw], i) for i, raw in enumerate(raws)]
    async with gw.client() as client:
        replies = {reply["id"]: reply for reply in (await client.post(RPC, json=batch)).json()}
    failed = {i: r for i, r in replies.items() if "result" not in r}
    assert not failed, failed
    # Each reply is its own transaction's hash: no answer went to another call.
    assert [replies[i]["result"] for i in range(25)] == [tx_hash(raw) for raw in raws]
    assert nonce(node) == 0
    rpc_call(node.url, "evm_mine")
    # All 25 reached the node: a lost one would leave a nonce gap, and every later one unmined.
    for raw in raws:
        receipt = rpc_call(node.url, "eth_getTransactionReceipt", [tx_hash(raw)])
        assert isinstance(receipt, dict) and receipt["status"] == "0x1", receipt
    assert nonce(node) == 25
    upstream = upstream_named(gw, "h2")
    assert upstream.health.errors.get("refused", 0) >= 1
    assert not upstream.health.state_down
    # Sequential calls across several GOAWAYs: each closing connection finishes its streams.
    for index in range(35):
        assert "result" in await gw.rpc("eth_blockNumber", [], index)


async def test_reads_fail_over_when_the_h2_upstream_dies_under_load(
    start_gateway: StartGateway, start_nginx: StartNginx, anvil: AnvilProcess
) -> None:
    edges = {"edge-a": await start_nginx(anvil.port), "edge-b": await start_nginx(anvil.port)}
    gw = await start_gateway(
        [h2_upstream(edge, name) for name, edge in edges.items()], rpc={"probe_interval": 0.2}
    )
    await trio.sleep(0.3)
    victim = pool_of(gw).ranked()[0].name
    outcomes = {"ok": 0, "error": 0}
    failures: list[Any] = []
    stop = trio.Event()

    async def reader(client: Any, worker: int) -> None:
        rng = random.Random(worker)
        while not stop.is_set():
            if rng.random() < 0.7:
                account = f"0x{rng.getrandbits(160):040x}"
                body: Any = call("eth_getBalance", [account, "latest"], worker)
            else:
                body = [call("eth_blockNumber", [], i) for i in range(5)]
            response = await client.post(RPC, json=body)
            replies = response.json() if isinstance(response.json(), list) else [response.json()]
            if response.status_code == 200 and all("result" in r for r in replies):
                outcomes["ok"] += 1
            else:
                outcomes["error"] += 1
                failures.append(replies)

    async with gw.client() as client, trio.open_nursery() as nursery:
        for worker in range(16):
            nursery.start_soon(reader, client, worker)
        await trio.sleep(0.6)
        edges[victim].kill()
        await trio.sleep(1.0)
        stop.set()
    assert outcomes["error"] == 0, failures[:3]
    assert outcomes["ok"] > 100
    assert upstream_named(gw, victim).health.state_down


async def test_a_write_whose_h2_connection_dies_mid_request_is_never_sent_elsewhere(
    start_gateway: StartGateway,
    start_nginx: StartNginx,
    anvil_factory: Callable[..., AnvilProcess],
) -> None:
    """The write's stream reached nginx (its node is stopped, so no answer comes), then the
    edge dies: the outcome is unknown, and the other upstream never sees the transaction."""
    nodes = {"edge-a": anvil_factory(), "edge-b": anvil_factory()}
    edges = {name: await start_nginx(node.port) for name, node in nodes.items()}
    gw = await start_gateway(
        [h2_upstream(edge, name) for name, edge in edges.items()], rpc={"probe_interval": 60}
    )
    await trio.sleep(0.2)  # the first probe round: both connected, ranked by latency
    chosen = pool_of(gw).ranked()[0].name
    other = next(name for name in nodes if name != chosen)
    (raw,) = signed_transfers(nodes[chosen], 1)
    stopped = nodes[chosen].pid
    assert stopped is not None
    os.kill(stopped, signal.SIGSTOP)
    try:
        reply: dict[str, Any] = {}

        async def write() -> None:
            reply.update(await gw.rpc("eth_sendRawTransaction", [raw]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.sleep(0.5)  # the stream is at nginx, waiting for the stopped node
            (conn,) = upstream_named(gw, chosen).connections
            assert isinstance(conn, Http2Connection) and len(conn.pending) == 1
            edges[chosen].kill()
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert reply["error"]["data"]["reason"] == "outcome_unknown", reply
    await trio.sleep(0.3)
    assert nonce(nodes[other]) == 0
    assert nonce(nodes[chosen]) in (0, 1)  # whatever the node made of the bytes it had


async def test_a_hedged_read_leaves_the_slow_h2_connection_serving(
    start_gateway: StartGateway, start_nginx: StartNginx, anvil: AnvilProcess, nursery: Any
) -> None:
    """A read held behind one edge is raced on the other and won there.  Over HTTP/1.1 the
    slow connection would be set aside (answers come in order); over HTTP/2 the held answer
    blocks only its own stream, so the connection keeps serving and is never stalled."""
    slow: dict[str, bool] = {}

    def holder(name: str) -> Callable[[bytes], float]:
        return lambda body: 0.8 if slow.get(name) and b"eth_getBalance" in body else 0.0

    relays = {name: HttpRelay(anvil.port, delay=holder(name)) for name in ("edge-a", "edge-b")}
    for relay in relays.values():
        await nursery.start(relay.serve)
    gw = await start_gateway(
        [h2_upstream(await start_nginx(relay.port), name) for name, relay in relays.items()],
        rpc={"probe_interval": 60},
        network={
            "hedging": {
                "enabled": True,
                "budget": 0.5,
                "burst": 5,
                "min_delay": 0.02,
                "max_delay": 0.1,
            }
        },
    )
    await trio.sleep(0.2)  # the first probe round: both connected
    first = pool_of(gw).ranked()[0]
    (conn,) = first.connections
    slow[first.name] = True
    started = trio.current_time()
    reply = await gw.rpc("eth_getBalance", [ACCOUNT, "latest"])
    assert "result" in reply and trio.current_time() - started < 0.6
    assert pool_of(gw).hedger.won == 1
    assert first.stalled == set()
    assert len(conn.pending) == 1  # the held stream, still open beside the others
    slow[first.name] = False
    with trio.fail_after(5):
        while conn.pending:  # the held answer arrives on its own stream
            await trio.sleep(0.05)
    assert first.connections == [conn] and not conn.closed
    assert first.health.errors == {}
