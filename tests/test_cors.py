"""CORS: preflights answered without a key, CORS headers on answers, per-key origin lists.

Against a real gateway on real anvil, both framing twins; preflight bytes are checked by h11.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.edge import cors
from chaingate.twins import Impl
from tests.conftest import StartGateway
from tests.helpers import exchange, parse_responses
from tests.test_auth import RPC, auth_settings, start_auth

ORIGIN = "http://localhost:5173"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type,x-api-key",
}
CALL = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
EXPOSED = {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"}


def plain(port: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)


def assert_grant(response: httpx.Response, origin: str = ORIGIN) -> None:
    assert response.headers["access-control-allow-origin"] == origin
    assert "Origin" in response.headers.get_list("vary")


# --- units -------------------------------------------------------------------------------------


def test_only_well_formed_origins_are_echoed() -> None:
    for good in (
        b"https://app.example.com",
        b"http://localhost:5173",
        b"http://[::1]:8080",
        b"null",
    ):
        assert cors.answer_headers(good).startswith(b"Access-Control-Allow-Origin: " + good), good
    for bad in (
        b"javascript:alert(1)",
        b"https://a.com/path",
        b"*",
        b"https://a.com, https://b.com",
        b"",
    ):
        assert cors.answer_headers(bad) == b"", bad
        status, headers, _ = cors.preflight(bad, cors.RPC_METHODS)
        assert status == 204 and b"Access-Control" not in headers
    assert cors.answer_headers(None) == b""


# --- preflights (auth on: a preflight carries no key) ---------------------------------------


async def test_preflights_need_no_key(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/s.db", tmp_path)
    )
    port = stack.handle.port
    async with plain(port) as client:
        for path, methods in (
            (RPC, "POST, OPTIONS"),
            (RPC + "/", "POST, OPTIONS"),
            ("/v1/rpc/ethereum/nowhere", "POST, OPTIONS"),  # the real request will say 404
            ("/v1/bundler/ethereum/devnet", "POST, OPTIONS"),
            ("/v1/tokens/ethereum/devnet/balances/0x" + "00" * 20, cors.REST_METHODS.decode()),
            ("/v1/webhooks", cors.REST_METHODS.decode()),
        ):
            response = await client.options(path, headers=PREFLIGHT)
            assert response.status_code == 204, (path, response.text)
            assert response.content == b""
            assert_grant(response)
            assert response.headers["access-control-allow-methods"] == methods
            allowed = {
                h.strip().lower()
                for h in response.headers["access-control-allow-headers"].split(",")
            }
            assert {"content-type", "x-api-key", "authorization", "x-request-id"} <= allowed
            assert response.headers["access-control-max-age"] == "7200"
        # A plain OPTIONS (no Origin) learns the methods, nothing more.
        bare = await client.options(RPC)
        assert bare.status_code == 204 and bare.headers["allow"] == "POST, OPTIONS"
        assert "access-control-allow-origin" not in bare.headers
    # The preflight on the wire, judged by h11 (a 204 has no body, keep-alive holds).
    request = (
        b"OPTIONS %s HTTP/1.1\r\nHost: t\r\nOrigin: %s\r\nAccess-Control-Request-Method: POST\r\n"
        b"\r\n" % (RPC.encode(), ORIGIN.encode())
    )
    raw = await exchange(
        port, request * 2 + b"GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    first, second, last = parse_responses(raw, ["OPTIONS", "OPTIONS", "GET"])
    assert first.status == second.status == 204 and last.status == 404
    assert first.headers["access-control-allow-origin"] == ORIGIN


async def test_answers_carry_cors_headers_for_a_browser_only(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/s.db", tmp_path)
    )
    key, _ = await stack.key()
    async with plain(stack.handle.port) as client:
        ok = await client.post(RPC, json=CALL, headers={"X-API-Key": key, "Origin": ORIGIN})
        assert ok.status_code == 200 and ok.json()["result"].startswith("0x")
        assert_grant(ok)
        exposed = {
            h.strip().lower() for h in ok.headers["access-control-expose-headers"].split(",")
        }
        assert EXPOSED | {"x-request-id"} <= exposed
        assert "access-control-allow-credentials" not in ok.headers  # keys never ride cookies
        # Errors are readable by the page too: a missing key, an unknown network.
        missing = await client.post(RPC, json=CALL, headers={"Origin": ORIGIN})
        assert missing.status_code == 401
        assert_grant(missing)
        unknown = await client.post(
            "/v1/rpc/ethereum/nowhere", json=CALL, headers={"X-API-Key": key, "Origin": ORIGIN}
        )
        assert unknown.status_code == 404
        assert_grant(unknown)
        rest = await client.get("/v1/webhooks", headers={"X-API-Key": key, "Origin": ORIGIN})
        assert rest.status_code == 200
        assert_grant(rest)
        # No Origin (a server, curl): no CORS headers at all.
        server = await client.post(RPC, json=CALL, headers={"X-API-Key": key})
        assert server.status_code == 200
        assert not [h for h in server.headers if h.startswith("access-control-")]
        # The admin-only metrics never invite a browser.
        metrics = await client.get("/metrics", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in metrics.headers


async def test_origin_list_governs_cors(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/s.db", tmp_path)
    )
    key, key_id = await stack.key()
    await admin.update_allowlists(
        AuthRows(stack.store), key_id, {"origins": ["https://*.example.com"]}, set()
    )
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    async with plain(stack.handle.port) as client:
        # The preflight cannot know the key: it grants any origin...
        pre = await client.options(RPC, headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert pre.status_code == 204
        # ...and the request with the key is where the list holds.
        refused = await client.post(
            RPC, json=CALL, headers={"X-API-Key": key, "Origin": "https://evil.example"}
        )
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers
        assert "https://*.example.com" in refused.json()["error"]["message"]
        ok = await client.post(
            RPC, json=CALL, headers={"X-API-Key": key, "Origin": "https://app.example.com"}
        )
        assert ok.status_code == 200
        assert_grant(ok, "https://app.example.com")


async def test_cors_with_auth_off(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url])
    async with plain(handle.port) as client:
        ok = await client.post(RPC, json=CALL, headers={"Origin": ORIGIN})
        assert ok.status_code == 200
        assert_grant(ok)
        pre = await client.options(RPC, headers=PREFLIGHT)
        assert pre.status_code == 204
        assert_grant(pre)
        # Only POST is JSON-RPC; the 405 still lets the page read why.
        wrong = await client.get(RPC, headers={"Origin": ORIGIN})
        assert wrong.status_code == 405
        assert_grant(wrong)
