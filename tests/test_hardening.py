"""What an adversarial run found at the edge, each fixed at its mechanism and proven here
(issue 14): the path authorised is the path served, a stalled log stream never stops the
server, key guessing is slowed per address and per connection, connections fit the file
descriptors, slow readers cannot pile up answer bytes, and the smaller cases."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from chaingate.auth import keygate
from chaingate.auth.keygate import ANONYMOUS_RPS
from chaingate.devnet.anvil import AnvilProcess
from chaingate.peers import peer_group
from chaingate.twins import Impl
from tests.conftest import StartGateway, make_settings
from tests.helpers import exchange, parse_responses, post_bytes, rpc_body
from tests.serve_process import ServeProcess
from tests.test_auth import PEPPER, AuthStack, auth_settings, start_auth

RPC = "/v1/rpc/ethereum/devnet"


def followed_devnet(anvil: AnvilProcess) -> dict[str, Any]:
    """ethereum/devnet followed (so gas prices exist), ethereum/mainnet configured but not."""
    return {
        "ethereum": {
            "devnet": {
                "chain_id": 31337,
                "testnet": True,
                "finality_depth": 2,
                "block_time": 1.0,
                "upstreams": [{"url": anvil.url, "name": "up0"}],
                "follower": {"enabled": True, "poll_interval": 0.05},
            },
            "mainnet": {
                "chain_id": 31337,
                "testnet": False,
                "upstreams": [{"url": anvil.url, "name": "m"}],
                "follower": {"enabled": False},
            },
        }
    }


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> AuthStack:
    """Keys on (SQLite: the store is not what these tests are about), both framing twins."""
    settings = auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    return await start_auth(nursery, impl, settings)


async def gas_stack(nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp: Path) -> AuthStack:
    settings = make_settings(
        [anvil.url],
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": f"sqlite://{tmp}/store.db"},
        data_dir=str(tmp),
        chains=followed_devnet(anvil),
    )
    stack = await start_auth(nursery, impl, settings)
    oracle = stack.handle.gateway.gas.oracles["ethereum/devnet"]
    with trio.fail_after(20):
        while oracle.body is None:
            await trio.sleep(0.05)
    return stack


async def raw_get(port: int, target: bytes, headers: bytes = b"", host: bytes = b"t") -> Any:
    request = b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s\r\n" % (
        target,
        host,
        headers,
    )
    (response,) = parse_responses(await exchange(port, request), ["GET"])
    return response


# --- 1. one path, authorised, routed and logged ---------------------------------------------


async def test_a_percent_encoded_path_is_authorised_as_the_path_it_names(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await gas_stack(nursery, impl, anvil, tmp_path)
    reader, _ = await stack.key(scopes="rpc:read")
    full, _ = await stack.key()
    port = stack.handle.port
    for target in (b"/v1/gas/ethereum-devnet/prices", b"/v1/%67as/ethereum-devnet/prices"):
        allowed = await raw_get(port, target, b"X-API-Key: %s\r\n" % full.encode())
        assert allowed.status == 200, (target, allowed.body)
        assert allowed.json()["network"] == "devnet"
        refused = await raw_get(port, target, b"X-API-Key: %s\r\n" % reader.encode())
        assert refused.status == 403, (target, refused.body)
        assert refused.json()["error"]["message"] == "this API key lacks the data:read scope"
    logged = [line["path"] for line in stack.handle.log_lines() if line.get("status") == 403]
    assert logged == ["/v1/gas/ethereum-devnet/prices"] * 2  # the path decided on, not the raw


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (b"/v1/gas%2Fethereum-devnet/prices", "encoded %2F"),
        (b"/v1/gas%2fethereum-devnet/prices", "encoded %2F"),
        (b"/v1/gas/%2e%2e/usage", "'.' or '..' segments"),
        (b"/v1/tokens/../gas/ethereum-devnet/prices", "'.' or '..' segments"),
        (b"/v1//usage", "empty segments"),
        (b"/v1/usage%00", "encoded %00"),
        (b"/v1/usage%zz", "malformed percent-encoding"),
        (b"/v1/%ff%fe", "not UTF-8"),
    ],
)
async def test_ambiguous_paths_are_refused_not_repaired(
    stack: AuthStack, target: bytes, message: str
) -> None:
    key, _ = await stack.key()
    response = await raw_get(
        stack.handle.port, target, b"X-API-Key: %s\r\n" % key.encode(), host=b"evil.example"
    )
    assert response.status == 400, response.body
    assert message in response.json()["error"]["message"]
    assert "location" not in response.headers


async def test_no_redirect_is_ever_built_from_the_host_header(stack: AuthStack) -> None:
    key, _ = await stack.key()
    for target in (b"/v1/usage/", b"/v1/health/"):
        response = await raw_get(
            stack.handle.port, target, b"X-API-Key: %s\r\n" % key.encode(), host=b"evil.example"
        )
        assert response.status == 404, (target, response.status)
        assert "location" not in response.headers
        assert response.json()["error"]["code"] == "not_found"


# --- 2. a log stream nobody reads ------------------------------------------------------------


@pytest.mark.slow
def test_a_stalled_log_stream_drops_lines_never_the_server(
    anvil: AnvilProcess, tmp_path: Path
) -> None:
    # stderr is a pipe this test never reads: it fills after ~64 KiB (~285 access-log lines).
    serve = ServeProcess(tmp_path, anvil.url, observability="log_buffer_bytes = 65536\n")
    with serve.start(stderr=subprocess.PIPE):
        slowest = 0.0
        with httpx.Client(base_url=serve.base, timeout=5) as client:
            for i in range(3000):
                started = time.monotonic()
                if i % 2:
                    response = client.get("/v1/health")
                else:
                    response = client.post(
                        RPC, json={"jsonrpc": "2.0", "id": i, "method": "eth_chainId"}
                    )
                slowest = max(slowest, time.monotonic() - started)
                assert response.status_code == 200, (i, response.text)
        assert slowest < 1.0
        dropped = serve.metric("chaingate_log_dropped_lines_total")
        assert dropped > 1000  # what did not fit was dropped and counted
        assert serve.metric("chaingate_log_buffered_bytes") <= 65536


# --- 7. key guessing -------------------------------------------------------------------------


async def test_pipelined_key_guesses_never_reach_the_right_key(
    stack: AuthStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 failures a second per address (10 in production), on a clock that stands still while
    # the guesses are answered: however slowly a busy machine answers them, no allowance flows
    # back in before the right key is sent.
    monkeypatch.setattr(keygate, "ANONYMOUS_RPS", 3)
    key, _ = await stack.key()
    frozen = time.monotonic()
    monkeypatch.setattr(keygate, "time", SimpleNamespace(monotonic=lambda: frozen, time=time.time))
    guesses = [f"svc_test_{'x' * 43}"] * 500
    guesses[250] = key
    body = rpc_body("eth_chainId")
    data = b"".join(post_bytes(RPC, body, b"X-API-Key: %s\r\n" % g.encode()) for g in guesses)
    raw = await exchange(stack.handle.port, data, half_close=True)
    responses = parse_responses(raw, ["POST"] * len(guesses))
    statuses = [r.status for r in responses]
    # Over the allowance the address is refused and the connection closed: the guesser gets a
    # handful of answers, none of them for the key at position 250.
    assert statuses == [401, 401, 401, 429]
    assert responses[-1].headers["connection"] == "close"
    # Over the per-address limit, the right key is refused like a wrong one, on any connection.
    async with stack.client(key) as client:
        limited = await client.post(RPC, json=json.loads(body))
    assert limited.status_code == 429
    assert limited.headers["connection"] == "close"
    assert int(limited.headers["retry-after"]) >= 1
    monkeypatch.setattr(keygate, "time", time)  # the clock runs again: the allowance refills
    await trio.sleep(1.1)
    async with stack.client(key) as client:
        assert (await client.post(RPC, json=json.loads(body))).status_code == 200


async def test_a_connection_is_closed_after_max_auth_failures(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    settings = auth_settings(
        anvil, f"sqlite://{tmp_path}/s.db", tmp_path, server={"max_auth_failures": 3}
    )
    stack = await start_auth(nursery, impl, settings)
    bad = b"X-API-Key: svc_test_%s\r\n" % (b"y" * 43)
    data = b"".join(post_bytes(RPC, rpc_body("eth_chainId"), bad) for _ in range(6))
    responses = parse_responses(await exchange(stack.handle.port, data), ["POST"] * 6)
    assert [r.status for r in responses] == [401, 401, 401]
    assert responses[-1].headers["connection"] == "close"


def test_ipv6_clients_are_limited_per_64() -> None:
    assert (
        peer_group("2001:db8:1:2::1") == peer_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    )
    assert peer_group("2001:db8:1:3::1") != peer_group("2001:db8:1:2::1")
    assert peer_group("::ffff:192.0.2.7") == "192.0.2.7"
    assert peer_group("192.0.2.7") == "192.0.2.7"


async def test_rotating_ipv6_addresses_share_one_failure_allowance(stack: AuthStack) -> None:
    gate: Any = stack.handle.gateway.gate

    class Guess:
        api_key = b"svc_test_" + b"z" * 43
        authorization = None

    statuses = [
        gate.authenticate(Guess(), f"2001:db8:aa:bb::{i:x}", None, None).status
        for i in range(1, 40)
    ]
    assert statuses[:ANONYMOUS_RPS] == [401] * ANONYMOUS_RPS
    assert set(statuses[ANONYMOUS_RPS:]) == {429}
    # Another /64 is another client.
    assert gate.authenticate(Guess(), "2001:db8:aa:cc::1", None, None).status == 401


# --- 8. file descriptors ---------------------------------------------------------------------


@pytest.mark.slow
def test_connections_fit_the_file_descriptors(anvil: AnvilProcess, tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, anvil.url, server="pressure_idle_timeout = 1.0\n")
    with serve.start(fd_limit=256):
        limit_total = serve.metric("chaingate_connections_max", 'scope="total"')
        limit_ip = serve.metric("chaingate_connections_max", 'scope="per_ip"')
        assert 16 <= limit_total < 256
        assert limit_ip == limit_total // 2
        idle = []
        try:
            for _ in range(300):  # more idle clients than there are descriptors
                idle.append(socket.create_connection(("127.0.0.1", serve.port), timeout=5))
            started = time.monotonic()
            with httpx.Client(base_url=serve.base, timeout=5) as client:
                response = client.post(
                    RPC, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}
                )
            assert response.status_code == 200
            assert time.monotonic() - started < 2.0  # served, not left in the backlog
            assert serve.metric("chaingate_connections_evicted_total") > 0
            assert serve.metric("chaingate_accept_errors_total") == 0
            # Under pressure idle connections are closed after pressure_idle_timeout.
            time.sleep(2.5)
            open_now = serve.metric("chaingate_connections_open")
            assert open_now < limit_total * 3 / 4, open_now
        finally:
            for sock in idle:
                sock.close()


# --- 5. answer bytes held for clients that do not read --------------------------------------


async def test_unread_answers_are_bounded_and_shed_with_503(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], server={"max_unsent_bytes": 2 << 20})
    big = "0x" + "60" * 200_000 + "00"  # runtime code of 200 KB: 400 KB of hex per answer
    target = "0x00000000000000000000000000000000000c0ffe"
    async with httpx.AsyncClient() as node:
        call = {"jsonrpc": "2.0", "id": 1, "method": "anvil_setCode", "params": [target, big]}
        assert "error" not in (await node.post(anvil.url, json=call)).json()
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getCode", "params": [target, "latest"]}
        for i in range(60)
    ]
    body = json.dumps(batch).encode()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", gw.port))
    try:
        slow.sendall(post_bytes(RPC, body))  # ~24 MB of answer that nobody reads
        with trio.fail_after(10):
            while gw.gateway.front.edge.unsent_bytes <= 2 << 20:
                await trio.sleep(0.02)
        async with gw.client() as client:
            shed = await client.post(RPC, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
        assert shed.status_code == 503
        assert shed.headers["retry-after"] == "1"
        assert shed.json()["error"]["code"] == "unavailable"
    finally:
        slow.close()
    with trio.fail_after(5):
        while gw.gateway.front.edge.unsent_bytes:
            await trio.sleep(0.02)
    async with gw.client() as client:
        ok = await client.post(RPC, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
    assert ok.status_code == 200


async def test_a_large_answer_is_valid_http_and_keeps_the_connection(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBlockByNumber", "params": ["0x0", False]}
        for i in range(1000)
    ]
    big = post_bytes(RPC, json.dumps(batch).encode())
    small = post_bytes(RPC, rpc_body("eth_chainId", id=7), b"Connection: close\r\n")
    head = (
        b"HEAD %s HTTP/1.1\r\nHost: t\r\n\r\n" % b"/v1/health"
    )  # a HEAD between them: headers only
    raw = await exchange(gw.port, big + head + small)
    first, second, third = parse_responses(raw, ["POST", "HEAD", "POST"])
    answers = first.json()
    assert len(first.body) > 64 << 10 and len(answers) == 1000
    assert [a["id"] for a in answers] == list(range(1000))
    assert all(a["result"]["number"] == "0x0" for a in answers)
    assert second.status in (200, 503) and second.body == b""
    assert third.json()["id"] == 7


# --- 9. the smaller things -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-5", "99999-01-01"])
async def test_usage_refuses_out_of_range_times_naming_the_parameter(
    stack: AuthStack, value: str
) -> None:
    key, _ = await stack.key()
    async with stack.client(key) as client:
        response = await client.get("/v1/usage", params={"from": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith("invalid query parameter 'from'")


async def test_rest_405_names_the_allowed_methods(stack: AuthStack) -> None:
    key, _ = await stack.key()
    async with stack.client(key) as client:
        response = await client.post("/v1/usage", json={})
    assert response.status_code == 405
    assert "GET" in [m.strip() for m in response.headers["allow"].split(",")]
    assert response.json()["error"]["code"] == "method_not_allowed"


async def test_bare_lf_requests_are_answered_400_at_once(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    started = trio.current_time()
    raw = await exchange(gw.port, b"GET /v1/health HTTP/1.1\nHost: t\n\n", limit=5)
    assert trio.current_time() - started < 2  # not the 20 s read timeout and a 408
    (response,) = parse_responses(raw, ["GET"])
    assert response.status == 400
    assert response.json()["error"]["message"] == "bare CR or LF in the message head"


async def test_a_key_in_the_url_path_is_redacted_in_the_access_log(stack: AuthStack) -> None:
    key, _ = await stack.key()
    nowhere = "/v1/rpc/ethereum/nowhere"
    async with stack.client(key) as client:
        served = await client.post(f"{RPC}/{key}", json={"jsonrpc": "2.0", "id": 1})
        missing = await client.post(f"{nowhere}/{key}", json={"jsonrpc": "2.0", "id": 1})
    assert served.status_code == 200 and missing.status_code == 404
    logs = stack.handle.raw_logs()
    assert key.encode() not in logs
    assert key[:13].encode() not in logs  # not even the display prefix of the key
    paths = {entry.get("status"): entry["path"] for entry in stack.handle.log_lines()}
    assert paths[200] == f"{RPC}/[redacted]" and paths[404] == f"{nowhere}/[redacted]"


async def test_two_api_key_headers_are_refused(stack: AuthStack) -> None:
    key, _ = await stack.key()
    other, _ = await stack.key()
    headers = b"X-API-Key: %s\r\nX-API-Key: %s\r\n" % (key.encode(), other.encode())
    raw = await exchange(stack.handle.port, post_bytes(RPC, rpc_body("eth_chainId"), headers))
    (response,) = parse_responses(raw, ["POST"])
    assert response.status == 400
    assert response.json()["error"]["message"] == "more than one X-API-Key header"


async def test_gas_prices_of_an_unfollowed_mainnet_are_not_another_networks(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await gas_stack(nursery, impl, anvil, tmp_path)
    live, _ = await stack.key(env="live")
    async with stack.client(live) as client:
        mainnet = await client.get("/v1/gas/ethereum/prices")
        devnet = await client.get("/v1/gas/ethereum-devnet/prices")
    assert mainnet.status_code == 404, mainnet.text
    assert "ethereum/mainnet" in mainnet.json()["error"]["message"]
    assert devnet.status_code == 200 and devnet.json()["network"] == "devnet"
