"""Misbehaving upstreams beside an honest anvil: HTML answers, lying heads, huge answers.

Each faulty node is ``FaultyNodeStub`` (tests/provider_stub.py): a stub that forwards to a
real anvil everything but its fault.  Every test runs on both framing twins (``impl``
through ``start_gateway``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle
from tests.provider_stub import FaultyNodeStub

RPC = "/v1/rpc/ethereum/devnet"
ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
ADMIN = {"Authorization": "Bearer test-admin-token"}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def rotation(self, upstream: str) -> list[tuple[str, str]]:
        """(message, reason) of every rotation line about ``upstream``, in order."""
        out = []
        for record in self.records:
            fields = getattr(record, "fields", {})
            if fields.get("upstream") == upstream:
                out.append((record.getMessage(), fields.get("reason", "")))
        return out


@pytest.fixture
def rotation_log() -> Iterator[Records]:
    """Lines of the "chaingate.upstream" logger, captured by a handler of our own."""
    logger = logging.getLogger("chaingate.upstream")
    handler = Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def start_stub(nursery: trio.Nursery, node: AnvilProcess, **kwargs: Any) -> FaultyNodeStub:
    stub = FaultyNodeStub(node.url, **kwargs)
    await nursery.start(stub.serve)
    return stub


def upstream(gw: GatewayHandle, name: str, network: str = "ethereum/devnet") -> Any:
    pool = gw.gateway.chain.services[network].pool
    return next(u for u in pool.upstreams if u.name == name)


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# --- item 4: an upstream answering 200 + HTML ----------------------------------------------


async def test_an_html_answering_upstream_goes_out_and_reads_fail_over_to_anvil(
    nursery: trio.Nursery,
    start_gateway: StartGateway,
    anvil: AnvilProcess,
    rotation_log: Records,
) -> None:
    stub = await start_stub(nursery, anvil, mode="html")
    # The stub is listed first and, having no latency sample, ranked first: before the fix
    # every "successful" HTML answer kept it there and every call failed with bad_response.
    gw = await start_gateway(
        [{"url": stub.url, "name": "html"}, {"url": anvil.url, "name": "anvil"}],
        rpc={"probe_interval": 60},
    )
    balance = rpc_call(anvil.url, "eth_getBalance", [ACCOUNT, "latest"])
    head = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    params = [ACCOUNT, "latest"]
    replies: list[Any] = []

    async def reader(client: httpx.AsyncClient, worker: int) -> None:
        for i in range(10):
            if i % 3 == 2:
                body: Any = [
                    {"jsonrpc": "2.0", "id": n, "method": "eth_getBalance", "params": params}
                    for n in range(3)
                ]
            else:
                body = {"jsonrpc": "2.0", "id": worker, "method": "eth_getBalance"}
                body["params"] = params
            response = await client.post(RPC, json=body)
            assert response.status_code == 200
            got = response.json()
            replies.extend(got if isinstance(got, list) else [got])

    async with gw.client() as client, trio.open_nursery() as readers:
        for worker in range(8):
            readers.start_soon(reader, client, worker)
    assert len(replies) == 8 * (7 + 3 * 3)
    assert [r for r in replies if r.get("result") != balance] == []
    assert stub.faked >= 1  # the stub was tried, and its answers did not reach clients
    html = upstream(gw, "html")
    assert html.health.state_down
    assert not upstream(gw, "anvil").health.state_down
    async with gw.client() as client:
        metrics = (await client.get("/metrics", headers=ADMIN)).text
    failures = sample(metrics, "chaingate_upstream_errors_total", upstream="html")
    assert failures is not None and failures >= 3
    assert sample(metrics, "chaingate_upstream_errors_total", kind="bad_response") == failures
    assert sample(metrics, "chaingate_upstream_up", upstream="html") == 0
    assert sample(metrics, "chaingate_upstream_up", upstream="anvil") == 1
    # Taken out once (not once per bad answer), by name and reason, never by URL.
    assert rotation_log.rotation("html") == [("upstream out of rotation", "bad_response")]
    lines = [r.getMessage() + str(getattr(r, "fields", "")) for r in rotation_log.records]
    assert not any(stub.url in line or str(stub.port) in line for line in lines)
    assert gw.gateway.chain.services["ethereum/devnet"].pool.head == head


async def test_a_write_to_an_html_answering_upstream_is_outcome_unknown_not_resent(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    stub = await start_stub(nursery, node, mode="html")
    other = anvil_factory()
    gw = await start_gateway(
        [{"url": stub.url, "name": "html"}, {"url": other.url, "name": "other"}],
        rpc={"probe_interval": 60},
    )
    tx = {"from": ACCOUNT, "to": ACCOUNT, "value": "0x1", "nonce": "0x0", "gas": "0x5208"}
    tx["gasPrice"] = "0x3b9aca00"
    raw = rpc_call(other.url, "eth_signTransaction", [tx])
    reply = await gw.rpc("eth_sendRawTransaction", [raw])
    # The HTML page may hide an executed write: the client is told to check, and the write
    # is not sent to the other upstream behind its back.
    assert reply["error"]["data"]["reason"] == "outcome_unknown"
    assert rpc_call(other.url, "eth_getTransactionCount", [ACCOUNT, "latest"]) == "0x0"


async def test_rotation_changes_are_logged_once_each_way(
    nursery: trio.Nursery,
    start_gateway: StartGateway,
    anvil: AnvilProcess,
    rotation_log: Records,
) -> None:
    stub = await start_stub(nursery, anvil, mode="html")
    gw = await start_gateway(
        [{"url": stub.url, "name": "flaky"}, {"url": anvil.url, "name": "anvil"}],
        rpc={"probe_interval": 0.05},
    )
    flaky = upstream(gw, "flaky")
    with trio.fail_after(5):
        while not flaky.health.state_down:
            await trio.sleep(0.02)
    await trio.sleep(0.3)  # more failed probes: no more lines
    stub.mode = "pass"
    with trio.fail_after(5):
        while flaky.health.state_down:
            await trio.sleep(0.02)
    await trio.sleep(0.3)
    assert rotation_log.rotation("flaky") == [
        ("upstream out of rotation", "bad_response"),
        ("upstream back in rotation", "probe_ok"),
    ]
    assert rotation_log.rotation("anvil") == []
    record = next(r for r in rotation_log.records if getattr(r, "fields", {}).get("upstream"))
    assert record.name == "chaingate.upstream"
    assert record.fields["pool"] == "ethereum/devnet"  # type: ignore[attr-defined]


# --- item 6: heads judged against each other ------------------------------------------------


async def test_a_liar_head_is_an_outlier_not_the_truth(
    nursery: trio.Nursery,
    start_gateway: StartGateway,
    anvil_factory: Any,
    rotation_log: Records,
) -> None:
    node = anvil_factory()
    liar = await start_stub(nursery, node, mode="head", head="0xffffffff")
    gw = await start_gateway(
        [{"url": liar.url, "name": "liar"}, {"url": node.url, "name": "honest"}],
        rpc={"probe_interval": 0.1},
    )  # finality_depth = 2
    await trio.sleep(0.4)
    pool = gw.gateway.chain.services["ethereum/devnet"].pool
    honest, lying = upstream(gw, "honest"), upstream(gw, "liar")
    head = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
    assert pool.head == head
    assert honest.health.lag == 0 and not honest.health.state_down
    assert pool.ranked()[0] is honest
    assert lying.health.state_down
    assert rotation_log.rotation("liar") == [("upstream out of rotation", "head_outlier")]
    # Traffic is not taken by the liar: it forwards nothing of what clients ask.
    before = liar.forwarded
    for _ in range(20):
        reply = await gw.rpc("eth_getBalance", [ACCOUNT, "latest"])
        assert "result" in reply
    assert (await gw.rpc("eth_blockNumber"))["result"] == hex(head)
    assert liar.forwarded == before
    # A block at the tip is not final: never cached (the liar's head would make it so).
    rpc_call(node.url, "evm_mine")
    await trio.sleep(0.3)
    tip = rpc_call(node.url, "eth_blockNumber")
    async with gw.client() as client:
        for _ in range(2):
            body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber"}
            body["params"] = [tip, False]
            response = await client.post(RPC, json=body)
            assert response.json()["result"]["number"] == tip
            assert response.headers["x-cache"] == "MISS"
        metrics = (await client.get("/metrics", headers=ADMIN)).text
    assert sample(metrics, "chaingate_upstream_head_lag_blocks", upstream="honest") == 0
    assert sample(metrics, "chaingate_upstream_head_block", upstream="liar") == 0xFFFFFFFF
    assert sample(metrics, "chaingate_rpc_head_block", network="devnet") == int(tip, 16)
    assert sample(metrics, "chaingate_upstream_errors_total", kind="head_outlier") is not None


async def test_a_head_of_5000_hex_digits_breaks_neither_health_nor_metrics(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    huge = "0x" + "f" * 5000
    stubs = [await start_stub(nursery, anvil, mode="head", head=huge) for _ in range(2)]
    other = {
        "chain_id": 31337,
        "finality_depth": 2,
        "follower": {"enabled": False},
        "upstreams": [{"url": stubs[1].url, "name": "huge"}, {"url": anvil.url, "name": "ok"}],
    }
    gw = await start_gateway(
        [{"url": stubs[0].url, "name": "huge"}, {"url": anvil.url, "name": "ok"}],
        rpc={"probe_interval": 0.05},
        chains={"other": {"devnet": other}},
    )
    await trio.sleep(0.5)
    async with gw.client() as client:
        health = await client.get("/v1/health")
        metrics = await client.get("/metrics", headers=ADMIN)
    assert health.status_code == 200, health.text
    networks = {(n["chain"], n["network"]): n for n in health.json()["networks"]}
    head = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    assert set(networks) == {("ethereum", "devnet"), ("other", "devnet")}
    assert all(n["head"] == head and n["upstreams_up"] == 1 for n in networks.values())
    assert metrics.status_code == 200
    for chain in ("ethereum", "other"):
        assert sample(metrics.text, "chaingate_upstream_up", chain=chain, upstream="huge") == 0
        assert sample(metrics.text, "chaingate_upstream_up", chain=chain, upstream="ok") == 1
        # A head of more than 64 bits is a malformed answer: a failure for health.
        bad = sample(
            metrics.text, "chaingate_upstream_errors_total", chain=chain, kind="bad_response"
        )
        assert bad is not None and bad >= 3


# --- item 5: the answer bound --------------------------------------------------------------

BIG = "0x" + "ab" * 20  # an address whose code (a state override) returns RESULT_BYTES zeros
RESULT_BYTES = 300_000  # 0.6 MB of hex in the result
RETURN_ZEROS = "0x62" + RESULT_BYTES.to_bytes(3, "big").hex() + "6000f3"  # RETURN(0, n)


def big_call(call_id: int) -> dict[str, Any]:
    params = [{"to": BIG, "data": "0x"}, "latest", {BIG: {"code": RETURN_ZEROS}}]
    return {"jsonrpc": "2.0", "id": call_id, "method": "eth_call", "params": params}


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_a_single_call_over_the_answer_bound_gets_one_error(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], rpc={"max_answer_bytes": 256 << 10})
    async with gw.client() as client:
        response = await client.post(RPC, json=big_call(7))
        small = await client.post(RPC, json=big_call(8) | {"method": "eth_chainId", "params": []})
    assert response.status_code == 200
    reply = response.json()
    assert reply["id"] == 7 and "result" not in reply
    assert reply["error"]["code"] == -32005
    assert reply["error"]["data"] == {"reason": "answer_too_large", "limit": 256 << 10}
    assert "262144 bytes" in reply["error"]["message"]
    assert small.json()["result"] == "0x7a69"


async def test_a_batch_past_the_answer_bound_gets_errors_and_memory_stays_bounded(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    limit = 4 << 20
    gw = await start_gateway(
        [{"url": anvil.url, "name": "anvil", "max_batch": 10}],
        rpc={"max_answer_bytes": limit, "request_timeout": 60},
    )
    calls = 200  # 120 MB of results, unbounded
    peak = baseline = rss_bytes()
    done = trio.Event()

    async def sample_rss() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            await trio.sleep(0.005)

    async with trio.open_nursery() as sampler:
        sampler.start_soon(sample_rss)
        async with httpx.AsyncClient(base_url=gw.base, timeout=60) as client:
            response = await client.post(RPC, json=[big_call(i) for i in range(calls)])
        done.set()
    assert response.status_code == 200
    replies = response.json()
    assert [r["id"] for r in replies] == list(range(calls))
    results = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert all(len(r["result"]) == 2 + 2 * RESULT_BYTES for r in results)
    assert 1 <= len(results) <= limit // (2 * RESULT_BYTES)
    assert len(results) + len(refused) == calls
    assert {r["error"]["code"] for r in refused} == {-32005}
    assert {r["error"]["data"]["reason"] for r in refused} == {"answer_too_large"}
    assert len(response.content) <= limit + calls * 512
    # Unbounded, this answer held ~120 MB several times over (upstream bodies, replies, the
    # joined answer, the client's copy); bounded, a few groups' worth at most.
    assert peak - baseline < 96 << 20, f"RSS grew by {(peak - baseline) >> 20} MiB"
    assert gw.gateway.front.answers.held == 0  # the process budget was given back
    service = gw.gateway.chain.services["ethereum/devnet"]
    assert service.refused["answer_too_large"] == len(refused)


async def test_the_process_budget_refuses_replies_as_overloaded_and_is_given_back(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway(
        [{"url": anvil.url, "name": "anvil", "max_batch": 5}],
        rpc={"max_assembling_bytes": 2 << 20},  # the answer bound stays at its 64 MiB default
    )
    async with gw.client() as client:
        replies = (await client.post(RPC, json=[big_call(i) for i in range(10)])).json()
        again = (await client.post(RPC, json=[big_call(i) for i in range(2)])).json()
    results = [r for r in replies if "result" in r]
    busy = [r for r in replies if "error" in r]
    assert len(results) == (2 << 20) // (2 * RESULT_BYTES + 40) and len(busy) == 10 - len(results)
    assert {r["error"]["data"]["reason"] for r in busy} == {"overloaded"}
    assert {r["error"]["code"] for r in busy} == {-32005}
    assert gw.gateway.front.answers.held == 0
    assert all("result" in r for r in again)  # given back: the next batch fits again


async def test_a_pool_that_has_shut_down_refuses_calls_instead_of_crashing(
    anvil: AnvilProcess, impl: Any
) -> None:
    # A consumer committing in a shielded shutdown path may still call out after the pools'
    # nursery closed: that must be an UpstreamError it handles, not "Nursery is closed".
    import msgspec

    from chaingate.config import NetworkSettings, RpcSettings
    from chaingate.rpc.errors import UNAVAILABLE, UpstreamError
    from chaingate.rpc.heads import parse_evm_head
    from chaingate.rpc.pool import UpstreamPool

    net = msgspec.convert({"upstreams": [{"url": anvil.url}]}, NetworkSettings)
    probe = b'{"jsonrpc":"2.0","id":0,"method":"eth_blockNumber","params":[]}'
    pool = UpstreamPool("x/y", net, RpcSettings(), impl, probe, parse_evm_head)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        _, ok = await pool.request(probe, retry_safe=True, deadline=trio.current_time() + 5)
        assert ok.status == 200
        nursery.cancel_scope.cancel()
    with pytest.raises(UpstreamError) as refused:
        await pool.request(probe, retry_safe=True, deadline=trio.current_time() + 5)
    assert refused.value.kind == UNAVAILABLE
