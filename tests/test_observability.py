"""/metrics, request ids and JSON logs — and no secret in any of them."""

from __future__ import annotations

import io
import json
import logging
import re

from chaingate.devnet.anvil import AnvilProcess
from chaingate.obs.logs import JsonFormatter
from tests.conftest import StartGateway

RPC = "/v1/rpc/ethereum/devnet"
API_KEY = "svc_test_" + "Zz9" * 12  # a key-shaped secret a client sends


async def test_metrics_require_the_admin_token(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    async with gw.client() as client:
        missing = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        right = await client.get("/metrics", headers={"Authorization": "Bearer test-admin-token"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    assert wrong.status_code == 401
    assert right.status_code == 200
    assert right.headers["content-type"].startswith("text/plain")


async def test_metrics_are_disabled_without_a_token(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], observability={"admin_token": ""})
    async with gw.client() as client:
        response = await client.get("/metrics", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403


def _sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels}")


async def test_metrics_count_requests_errors_cache_latency_and_upstreams(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    for _ in range(3):
        await gw.rpc("eth_chainId")
    await gw.rpc("eth_nope")
    async with gw.client() as client:
        text = (
            await client.get("/metrics", headers={"Authorization": "Bearer test-admin-token"})
        ).text
    assert _sample(text, "chaingate_http_requests_total", route="rpc", status="200") == 4
    assert _sample(text, "chaingate_rpc_calls_total", method="eth_chainId", outcome="ok") == 3
    assert _sample(text, "chaingate_rpc_calls_total", method="unknown", outcome="error") == 1
    assert _sample(text, "chaingate_rpc_cache_hits_total", method="eth_chainId") == 2
    assert _sample(text, "chaingate_rpc_cache_lookups_total", result="miss") >= 1
    assert _sample(text, "chaingate_upstream_up", upstream="up0") == 1
    assert _sample(text, "chaingate_request_duration_seconds_count", route="rpc") == 4
    assert _sample(text, "chaingate_request_duration_seconds_bucket", route="rpc", le="+Inf") == 4
    # Every line is a comment or "name{labels} value".
    for line in text.strip().splitlines():
        assert line.startswith("# ") or re.fullmatch(
            r"[a-z_][a-z0-9_]*(\{[^}]*\})? -?[0-9.e+-]+", line
        ), line


async def test_request_id_is_returned_and_logged(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    async with gw.client() as client:
        own = await client.post(
            RPC,
            json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"},
            headers={"X-Request-Id": "client-abc.123"},
        )
        generated = await client.get("/v1/health")
        bogus = await client.get("/v1/health", headers={"X-Request-Id": "has spaces and <tags>"})
    assert own.headers["x-request-id"] == "client-abc.123"
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]+", generated.headers["x-request-id"])
    assert bogus.headers["x-request-id"] != "has spaces and <tags>"
    lines = gw.log_lines()
    by_id = {line["request_id"]: line for line in lines}
    assert by_id["client-abc.123"]["rpc"] == "eth_chainId"
    assert by_id["client-abc.123"]["status"] == 200
    assert by_id[generated.headers["x-request-id"]]["path"] == "/v1/health"
    for line in lines:
        assert {"ts", "level", "msg", "request_id", "status", "duration_us"} <= set(line)


async def test_no_api_key_or_admin_token_reaches_the_logs(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    app_log = io.StringIO()
    handler = logging.StreamHandler(app_log)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("chaingate")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        gw = await start_gateway([anvil.url])
        async with gw.client() as client:
            await client.post(
                RPC,
                json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"},
                headers={"X-API-Key": API_KEY},
            )
            await client.post(
                RPC,
                json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"},
                headers={"Authorization": f"Bearer {API_KEY}"},
            )
            await client.get(f"/v1/health?apiKey={API_KEY}")
            await client.post(f"{RPC}?apiKey={API_KEY}", content=b"{broken")
            await client.get("/metrics", headers={"Authorization": "Bearer test-admin-token"})
            await client.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
        gw.gateway.shutdown()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    everything = gw.raw_logs().decode() + app_log.getvalue()
    assert len(gw.log_lines()) >= 6
    assert API_KEY not in everything
    assert API_KEY[9:30] not in everything
    assert "test-admin-token" not in everything
    for line in everything.splitlines():
        json.loads(line)
