"""The edge server over real sockets: keep-alive, limits, timeouts, graceful shutdown."""

from __future__ import annotations

import json
from typing import Any

import trio

from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import StartGateway
from tests.helpers import FaultyRelay, exchange, parse_responses, post_bytes, rpc_body

RPC = "/v1/rpc/ethereum/devnet"


async def test_keep_alive_serves_many_requests_on_one_connection(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        for i in range(5):
            await stream.send_all(post_bytes(RPC, rpc_body("eth_chainId", id=i)))
            data = b""
            while not data.endswith(b"}"):
                data += await stream.receive_some(65536)
            assert parse_responses(data, ["POST"])[0].json()["id"] == i
    assert gw.gateway.front.edge.accepted == 1


async def test_http10_closes_unless_asked_to_keep_alive(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    body = rpc_body("eth_chainId")
    request = b"POST %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (RPC.encode(), len(body), body)
    raw = await exchange(gw.port, request)
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in raw
    keep = b"POST %s HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n%s" % (
        RPC.encode(),
        len(body),
        body,
    )
    raw = await exchange(gw.port, keep + request)
    assert raw.count(b"HTTP/1.1 200 OK") == 2 and b"Connection: keep-alive\r\n" in raw


async def test_body_over_the_limit_is_413_without_reading_it(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    body = b"[" + b" " * (2 * 1024 * 1024) + b"]"
    raw = await exchange(gw.port, post_bytes(RPC, body))
    (response,) = parse_responses(raw, ["POST"])
    assert response.status == 413
    assert response.headers["connection"] == "close"
    assert response.json() == {
        "error": {"code": "payload_too_large", "message": "request body too large", "status": 413}
    }
    # Chunked: refused as soon as the running total passes the limit.
    chunk = b" " * 65536
    chunked = b"POST %s HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" % RPC.encode()
    chunked += b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(40)) + b"0\r\n\r\n"
    (response,) = parse_responses(await exchange(gw.port, chunked), ["POST"])
    assert response.status == 413


async def test_configured_body_limit_is_honoured(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], server={"max_body_bytes": 100})
    (ok,) = parse_responses(
        await exchange(gw.port, post_bytes(RPC, rpc_body("eth_chainId"), b"Connection: close\r\n")),
        ["POST"],
    )
    assert ok.status == 200
    (too_big,) = parse_responses(await exchange(gw.port, post_bytes(RPC, b" " * 101)), ["POST"])
    assert too_big.status == 413


async def test_oversized_heads_are_414_and_431(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    long_target = b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n"
    (response,) = parse_responses(await exchange(gw.port, long_target), ["GET"])
    assert response.status == 414 and response.json()["error"]["code"] == "uri_too_long"
    big_header = b"GET /v1/health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * 20000 + b"\r\n\r\n"
    (response,) = parse_responses(await exchange(gw.port, big_header), ["GET"])
    assert response.status == 431
    many = (
        b"GET /v1/health HTTP/1.1\r\nHost: t\r\n"
        + b"".join(b"X-%d: v\r\n" % i for i in range(150))
        + b"\r\n"
    )
    (response,) = parse_responses(await exchange(gw.port, many), ["GET"])
    assert response.status == 431


async def test_malformed_requests_get_400_in_the_envelope(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    for raw_request in [
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /v1/health HTTP/1.1\r\n\r\n",  # no Host
        b"GET http://example.com/ HTTP/1.1\r\nHost: t\r\n\r\n",
        b"NOT A REQUEST\r\n\r\n",
    ]:
        (response,) = parse_responses(await exchange(gw.port, raw_request), ["GET"])
        assert response.status == 400, raw_request
        assert response.json()["error"]["code"] == "invalid_request"
    (response,) = parse_responses(
        await exchange(gw.port, b"GET / HTTP/2.0\r\nHost: t\r\n\r\n"), ["GET"]
    )
    assert response.status == 505


async def test_request_cut_in_the_middle_harms_nothing(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    full = post_bytes(RPC, rpc_body("eth_chainId"))
    for cut in (5, len(full) // 2, len(full) - 3):
        assert await exchange(gw.port, full[:cut], half_close=True) == b""
    assert gw.gateway.front.edge.open_connections == 0 or await _settles(gw)
    # The server is fine: a whole request still works.
    reply = await gw.rpc("eth_chainId")
    assert reply["result"] == "0x7a69"


async def _settles(gw: Any) -> bool:
    for _ in range(50):
        if gw.gateway.front.edge.open_connections <= 1:
            return True
        await trio.sleep(0.01)
    return False


async def test_expect_100_continue(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    gw = await start_gateway([anvil.url])
    body = rpc_body("eth_chainId")
    head = (
        b"POST %s HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (RPC.encode(), len(body))
    )
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(head)
        with trio.fail_after(5):
            interim = await stream.receive_some(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await stream.send_all(body)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    (response,) = parse_responses(data, ["POST"])
    assert response.json()["result"] == "0x7a69"


async def test_idle_keep_alive_connections_are_closed(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], server={"idle_timeout": 0.3})
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(post_bytes(RPC, rpc_body("eth_chainId")))
        await stream.receive_some(65536)
        with trio.fail_after(3):
            assert await stream.receive_some(65536) == b""  # closed by the server


async def test_slow_client_gets_408_and_is_cut_off(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], server={"client_read_timeout": 0.3})
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(
            b"POST /v1/rpc/ethereum/devnet HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"
        )
        data = b""
        with trio.fail_after(3):
            while chunk := await stream.receive_some(65536):
                data += chunk
    (response,) = parse_responses(data, ["POST"])
    assert response.status == 408
    assert response.json()["error"]["code"] == "request_timeout"


async def test_rest_paths_go_to_the_app_and_unknown_paths_are_404(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    async with gw.client() as client:
        health = await client.get("/v1/health")
        missing_rest = await client.get("/v1/no/such/thing")
        missing_root = await client.get("/favicon.ico")
        wrong_method = await client.delete("/v1/health")
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["networks"][0]["chain"] == "ethereum"
    for response, status in [(missing_rest, 404), (missing_root, 404), (wrong_method, 405)]:
        assert response.status_code == status
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["error"]["status"] == status
        assert set(response.json()["error"]) == {"code", "message", "status"}


async def test_graceful_shutdown_finishes_in_flight_requests(
    start_gateway: StartGateway, anvil: AnvilProcess, nursery: trio.Nursery
) -> None:
    relay = FaultyRelay(anvil.port)
    await nursery.start(relay.serve)
    gw = await start_gateway([f"http://127.0.0.1:{relay.port}"], rpc={"probe_interval": 60})
    idle = await trio.open_tcp_stream("127.0.0.1", gw.port)
    relay.mode = "delay"
    relay.delay_seconds = 0.5
    result: dict[str, Any] = {}

    async def slow_call() -> None:
        raw = await exchange(
            gw.port, post_bytes(RPC, rpc_body("eth_getBalance", ["0x" + "11" * 20, "latest"]))
        )
        result["responses"] = parse_responses(raw, ["POST"])

    async with trio.open_nursery() as inner:
        inner.start_soon(slow_call)
        await trio.sleep(0.2)  # the call is now waiting on the node
        gw.gateway.shutdown()
        await trio.sleep(0.1)
        # New connections are refused once shutdown began; the idle one is closed.
        try:
            refused = await trio.open_tcp_stream("127.0.0.1", gw.port)
        except OSError:
            refused = None
        assert refused is None
        with trio.fail_after(2):
            assert await idle.receive_some(100) == b""
    (response,) = result["responses"]
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert json.loads(response.body)["result"] == "0x0"


async def test_a_bug_in_a_handler_is_a_500_not_a_dead_server(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    service = gw.gateway.chain.services["ethereum/devnet"]

    async def broken(body: bytes, principal: Any) -> Any:
        raise RuntimeError("simulated bug")

    original = service.handle
    service.handle = broken  # type: ignore[method-assign]
    # eth_getLogs by block hash is answered by the Python handler, not the fast lane.
    raw = await exchange(
        gw.port, post_bytes(RPC, rpc_body("eth_getLogs", [{"blockHash": "0x" + "ab" * 32}]))
    )
    (response,) = parse_responses(raw, ["POST"])
    assert response.status == 500
    assert response.json()["error"] == {
        "code": "internal_error",
        "message": "internal error; retry with exponential backoff",
        "status": 500,
    }
    assert b"Traceback" not in raw and b"simulated" not in raw
    service.handle = original  # type: ignore[method-assign]
    assert (await gw.rpc("eth_chainId"))["result"] == "0x7a69"


async def test_a_bug_in_the_fast_lane_is_a_500_not_a_dead_server(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    lane = gw.gateway.front.lane
    original = lane.admission

    class Broken(gw.gateway.impl.fastlane.OpenAdmission):  # type: ignore[misc,name-defined]
        def principal(self, request: Any, group: str, testnet: bool) -> Any:
            raise RuntimeError("simulated bug")

    lane.admission = Broken(original.anonymous)
    raw = await exchange(gw.port, post_bytes(RPC, rpc_body("eth_chainId")))
    (response,) = parse_responses(raw, ["POST"])
    assert response.status == 500
    assert response.headers["connection"] == "close"
    assert b"Traceback" not in raw and b"simulated" not in raw
    lane.admission = original
    assert (await gw.rpc("eth_chainId"))["result"] == "0x7a69"
