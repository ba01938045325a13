"""The REST plane every endpoint stands on: admission like JSON-RPC (buckets, compute units,
day quota, usage, rate-limit headers), typed input with errors that name the parameter, and
an OpenAPI 3.1 document generated from the route definitions — valid, served, and obeyed
(schemathesis fuzzes the running server; every answer the tests receive is checked against
it by ``tests/openapi_check.py``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio
from openapi_spec_validator import validate

from chaingate.api.build import build_api, load_costs
from chaingate.api.openapi import document
from chaingate.api.routing import PricingError
from chaingate.auth.store import AuthRows
from chaingate.config import default_config_dir
from chaingate.devnet.anvil import AnvilProcess
from chaingate.twins import Impl
from tests.serve_process import ServeProcess
from tests.test_auth import AuthStack
from tests.test_hardening import gas_stack

GAS = "/v1/gas/ethereum-devnet/prices"


def test_the_openapi_document_is_valid_and_every_route_is_priced() -> None:
    costs = load_costs(default_config_dir() / "rest.toml")
    api = build_api(None, costs)
    doc = document(api)
    validate(doc)  # openapi-spec-validator: OpenAPI 3.1 and JSON Schema 2020-12
    operations = [op for item in doc["paths"].values() for op in item.values()]
    assert len(operations) == len(api.routes)
    assert len({op["operationId"] for op in operations}) == len(operations)
    for route in api.routes:
        operation = doc["paths"][route.path][route.method.lower()]
        assert operation["x-compute-units"] == costs[route.key]
        if not route.public:
            assert {"401", "403", "429"} <= set(operation["responses"])
    with pytest.raises(PricingError, match="missing: GET /v1/usage"):
        build_api(None, {k: v for k, v in costs.items() if k != "GET /v1/usage"})
    with pytest.raises(PricingError, match="unknown: GET /v1/nothing"):
        build_api(None, {**costs, "GET /v1/nothing": 1})


async def test_the_document_is_served_without_a_key(stack: AuthStack) -> None:
    async with stack.client() as client:
        response = await client.get("/v1/openapi.json")
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(document(stack.handle.gateway.front.rest)))


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> AuthStack:
    return await gas_stack(nursery, impl, anvil, tmp_path)


async def test_rest_requests_are_admitted_like_json_rpc(stack: AuthStack) -> None:
    # The case: 1,000 GETs with a 100 req/s key took 0.74 s, all 200, with
    # X-RateLimit-Remaining: 100 on every one.  Here with a 10 req/s key (Free), so that the
    # limit binds however slowly this machine answers.
    key, _ = await stack.key(plan="free")
    statuses: dict[int, int] = {}
    remaining: list[int] = []
    started = time.monotonic()
    async with stack.client(key) as client:
        for _ in range(300):
            response = await client.get(GAS)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert response.json()["error"]["code"] == "rate_limited"
                assert response.headers["x-ratelimit-remaining"] == "0"
            else:
                remaining.append(int(response.headers["x-ratelimit-remaining"]))
    elapsed = time.monotonic() - started
    assert set(statuses) == {200, 429}, statuses
    # The bucket holds one second's worth and refills at 10/s.
    assert statuses[200] <= 10 + 10 * elapsed + 2, (statuses, elapsed)
    assert min(remaining) == 0 and remaining[0] == 9  # honest: it counts down
    # Usage is recorded per route: every admitted call, none of the refused ones.
    await stack.handle.gateway.usage_writer.flush()  # type: ignore[union-attr]
    await trio.sleep(1.1)  # a request for the usage itself must be admitted
    async with stack.client(key) as client:
        usage = (await client.get("/v1/usage", params={"granularity": "day"})).json()
    rows = [row for row in usage["usage"] if row["method"] == "GET /v1/gas/{chain}/prices"]
    assert sum(row["requests"] for row in rows) == statuses[200]
    assert sum(row["compute_units"] for row in rows) == 5 * statuses[200]  # config/rest.toml


async def test_rest_compute_units_bind_like_json_rpc(stack: AuthStack) -> None:
    # 1,000 requests a second but 50 compute units: GET /v1/usage costs 10 (config/rest.toml),
    # so about 5 a second pass, whatever the request bucket says.
    key, _ = await stack.key(plan="free", email="cu-rest@t")
    account = await AuthRows(stack.store).find_account_by_email("cu-rest@t")
    limits = {"requests_per_second": 1000, "compute_units_per_second": 50}
    await AuthRows(stack.store).set_plan(account.id, "free", json.dumps(limits))
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    started = time.monotonic()
    async with stack.client(key) as client:
        statuses = [(await client.get("/v1/usage")).status_code for _ in range(40)]
    elapsed = time.monotonic() - started
    assert statuses.count(200) <= 5 + 5 * elapsed + 1, (statuses, elapsed)
    assert 429 in statuses


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("granularity=week", "invalid query parameter 'granularity'"),
        ("limt=5", "unknown query parameter 'limt'"),
        ("granularity=day&granularity=hour", "query parameter 'granularity' is given more"),
        ("to=soon", "invalid query parameter 'to'"),
    ],
)
async def test_bad_input_is_400_naming_the_parameter(
    stack: AuthStack, query: str, message: str
) -> None:
    key, _ = await stack.key()
    async with stack.client(key) as client:
        response = await client.get(f"/v1/usage?{query}")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["status"] == 400
    assert error["message"].startswith(message), error["message"]


async def test_refusals_keep_the_envelope_and_headers(stack: AuthStack) -> None:
    key, _ = await stack.key(scopes="rpc:read")
    async with stack.client() as client:
        anonymous = await client.get(GAS)
    async with stack.client(key) as client:
        forbidden = await client.get(GAS)
        unknown = await client.get("/v1/gas/ethereum-devnet/nothing")
    assert anonymous.status_code == 401 and forbidden.status_code == 403
    assert unknown.status_code == 403  # the area's scope, even where no route is
    for response in (anonymous, forbidden, unknown):
        assert response.headers["x-ratelimit-limit"].isdigit()
        assert response.json()["error"]["status"] == response.status_code


@pytest.mark.slow
def test_schemathesis_finds_no_500_and_no_answer_outside_the_schema(
    anvil: AnvilProcess, tmp_path: Path
) -> None:
    serve = ServeProcess(tmp_path, anvil.url, keys=True, follow=True)
    with serve.start():
        key = serve.create_key(plan="enterprise")
        with httpx.Client(base_url=serve.base, timeout=10) as client:
            deadline = time.monotonic() + 20
            while client.get(GAS, headers={"X-API-Key": key}).status_code != 200:
                assert time.monotonic() < deadline, "no gas estimate"
                time.sleep(0.1)
        result = subprocess.run(
            [
                os.path.join(os.path.dirname(sys.executable), "st"),
                "run",
                f"{serve.base}/v1/openapi.json",
                "--header",
                f"X-API-Key: {key}",
                "--checks",
                "all",
                # A request the schema allows may still be refused for what a schema cannot
                # say (from after to): that check asks the impossible of any real API.
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "60",
                "--seed",
                "1",
                "--generation-database",
                "none",
                "--no-color",
                "--request-timeout",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        # It did test every operation (a run that reached nothing would pass too).
        found = re.search(r"Operations:\s+(\d+) selected / (\d+) total", result.stdout)
        assert found is not None and found[1] == found[2], result.stdout
        assert int(found[1]) >= len(build_api().routes) - 1, result.stdout  # bar this document
        assert "❌" not in result.stdout, result.stdout[-3000:]
