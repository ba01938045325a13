"""The REST plane's answers to what a careless or hostile client sends (issue 39, items 5 and
6), against real gateways: a body not labelled JSON is 415 on every route that takes one (and
nothing is created); every answer on the API's paths says ``X-Content-Type-Options: nosniff``,
whichever part wrote it — the REST app, the edge's refusals and preflights, the framing's
limits, the JSON-RPC fast lane (both twins); and no error echoes a key pasted into a path.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.api.build import build_api
from chaingate.api.openapi import document
from chaingate.api.routing import Route
from chaingate.devnet.anvil import AnvilProcess
from chaingate.redaction import redact_key_shaped
from chaingate.twins import pure
from tests.conftest import _compiled_or_skip
from tests.test_auth import AuthStack, auth_settings, start_auth
from tests.test_dashboard_forms import impl, site

# The dashboard's fixtures: a gateway following the devnet, with webhooks; one framing twin
# (the nosniff test below runs both).
__all__ = ["impl", "site"]

BODY_ROUTES = [route for route in build_api().routes if route.body_type is not None]
PATH_ROUTES = [route for route in build_api().routes if "{" in route.path]
POLICY = {"name": "p", "chain": "ethereum", "rules": {"max_gas_usd": "5"}}


def target(route: Route, **values: str) -> str:
    """The route's path, each parameter ``values`` names filled in, the others ``x1``."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: values.get(m[1], "x1"), route.path)


def refusal(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, (answer.status_code, answer.text)
    error = answer.json()["error"]
    assert error["status"] == status, error
    message: str = error["message"]
    return message


# --- item 6: a body is labelled JSON ------------------------------------------------------------

WRONG_LABELS: list[str | None] = [
    "text/plain",
    "application/xml",
    "multipart/form-data; boundary=xyz",
    "image/png",
    "application/x-www-form-urlencoded",  # what curl -d sends
    "application/jsonp",
    "application/json; charset=iso-8859-1",  # JSON between systems is UTF-8 (RFC 8259)
    None,  # no label at all
]
JSON_LABELS = [
    "application/json",
    "application/json; charset=utf-8",
    "Application/JSON;Charset=UTF-8",
    "application/vnd.example+json",
]


async def test_a_body_labelled_other_than_json_is_415_and_creates_nothing(site: AuthStack) -> None:
    key, _ = await site.key(plan="enterprise", email="labels@example.com")
    body = json.dumps(POLICY).encode()
    async with site.client(key) as client:  # every answer checked against the OpenAPI document
        for label in WRONG_LABELS:
            headers = {"Content-Type": label} if label is not None else {}
            answer = await client.post("/v1/gas/policies", content=body, headers=headers)
            message = refusal(answer, 415)
            assert answer.json()["error"]["code"] == "unsupported_media_type"
            assert "Content-Type: application/json" in message, message
        listed = await client.get("/v1/gas/policies")
        assert listed.status_code == 200 and listed.json()["total"] == 0  # nothing created
        for route in BODY_ROUTES:  # every route that takes a body, before it reads anything
            answer = await client.request(
                route.method, target(route), content=b"{}", headers={"Content-Type": "text/plain"}
            )
            refusal(answer, 415)
        # Labelled JSON as clients write it: accepted.
        for label in JSON_LABELS:
            created = await client.post(
                "/v1/gas/policies", content=body, headers={"Content-Type": label}
            )
            assert created.status_code == 201, (label, created.text)
        created = await client.post("/v1/gas/policies", json=POLICY)  # httpx's own label
        assert created.status_code == 201, created.text
        changed = await client.patch(
            f"/v1/gas/policies/{created.json()['id']}",
            content=b'{"status": "paused"}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert changed.status_code == 200 and changed.json()["status"] == "paused"
        # A body sent where none is taken is ignored, whatever its label.
        path = f"/v1/gas/policies/{created.json()['id']}"
        assert (await client.get(path, headers={"Content-Type": "image/png"})).status_code == 200


def test_the_document_says_which_routes_answer_415() -> None:
    api = build_api()
    doc = document(api)
    for route in api.routes:
        responses = doc["paths"][route.path][route.method.lower()]["responses"]
        assert ("415" in responses) == (route.body_type is not None), route.key
        if route.body_type is not None:
            assert list(
                doc["paths"][route.path][route.method.lower()]["requestBody"]["content"]
            ) == ["application/json"]


# --- nosniff on every answer, whoever writes it --------------------------------------------------


@pytest.mark.parametrize("twin", ["compiled", "pure"])
async def test_every_answer_on_the_api_paths_says_nosniff(
    nursery: trio.Nursery, anvil: AnvilProcess, tmp_path: Path, twin: str
) -> None:
    implementation = _compiled_or_skip() if twin == "compiled" else pure()
    settings = auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    stack = await start_auth(nursery, implementation, settings)
    key, _ = await stack.key(plan="enterprise")
    reader, _ = await stack.key(plan="enterprise", scopes="data:read")
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
    keyed = {"X-API-Key": key}
    origin = {"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
    huge = b"{" + b" " * (2 << 20) + b"}"  # past the edge's bound on a body
    bundler = {"jsonrpc": "2.0", "id": 1, "method": "eth_supportedEntryPoints", "params": []}
    async with httpx.AsyncClient(base_url=stack.handle.base, timeout=10) as client:
        answers = [
            ("app, public", 200, await client.get("/v1/health")),
            ("app, keyed", 200, await client.get("/v1/usage", headers=keyed)),
            (
                "app, created",
                201,
                await client.post(
                    "/v1/gas/policies", json=POLICY | {"chain": "ethereum-devnet"}, headers=keyed
                ),
            ),
            ("app, bad query", 400, await client.get("/v1/usage?limt=5", headers=keyed)),
            ("app, no route", 404, await client.get("/v1/no-such-thing", headers=keyed)),
            ("app, method", 405, await client.put("/v1/health")),
            (
                "app, label",
                415,
                await client.post("/v1/gas/policies", content=b"{}", headers=keyed),
            ),
            ("edge, no key", 401, await client.get("/v1/usage")),
            ("edge, scope", 403, await client.get("/v1/webhooks", headers={"X-API-Key": reader})),
            ("edge, path", 400, await client.get("/v1/%2e%2e/usage", headers=keyed)),
            ("edge, elsewhere", 404, await client.get("/nowhere")),
            ("edge, websocket", 426, await client.get("/v1/ws/ethereum/devnet", headers=keyed)),
            ("edge, preflight", 204, await client.options("/v1/usage", headers=origin)),
            ("framing, too big", 413, await client.post("/v1/usage", content=huge, headers=keyed)),
            ("rpc", 200, await client.post("/v1/rpc/ethereum/devnet", json=rpc, headers=keyed)),
            ("rpc, no key", 401, await client.post("/v1/rpc/ethereum/devnet", json=rpc)),
            (
                "bundler",
                200,
                await client.post("/v1/bundler/ethereum/devnet", json=bundler, headers=keyed),
            ),
        ]
    for what, status, answer in answers:
        assert answer.status_code == status, (what, answer.status_code, answer.text[:500])
        nosniff = answer.headers.get_list("x-content-type-options")
        assert nosniff == ["nosniff"], (what, dict(answer.headers))


# --- no key comes back ------------------------------------------------------------------------


async def test_no_error_echoes_a_key_pasted_into_a_path(site: AuthStack) -> None:
    key, _ = await site.key(plan="enterprise", email="echo@example.com")
    foreign = "ak" + secrets.token_hex(19)  # another provider's key: 40 token characters
    whsec = "whsec_" + secrets.token_urlsafe(24)
    # What each pasted value must never bring back: its secret part.
    secret_of = {key: key[len("svc_test_") :], foreign: foreign, whsec: whsec[len("whsec_") :]}
    seen: list[tuple[str, int]] = []
    async with site.client(key) as client:
        for pasted, secret in secret_of.items():
            for route in PATH_ROUTES:
                for name in re.findall(r"\{([a-z_]+)\}", route.path):
                    path = target(route, **{name: pasted})
                    body: dict[str, Any] | None = {} if route.body_type is not None else None
                    answer = await client.request(route.method, path, json=body)
                    assert secret not in answer.text, (route.key, name, answer.text)
                    assert answer.status_code < 500, (route.key, answer.text)
                    seen.append((route.key, answer.status_code))
    # It reached the handlers that name what they did not find (they echoed it before).
    assert ("GET /v1/webhooks/{id}", 404) in seen and ("GET /v1/gas/policies/{id}", 404) in seen
    async with site.client(key) as client:
        answer = await client.get(f"/v1/webhooks/{key}")
        assert refusal(answer, 404) == "no webhook [redacted] in this account"
        answer = await client.get(f"/v1/gas/{foreign}/prices")
        assert "[redacted]" in refusal(answer, 404)
        # Our own ids are not key-shaped: they still come back.
        answer = await client.get("/v1/webhooks/wh_0123456789abcdefghij")
        assert refusal(answer, 404) == "no webhook wh_0123456789abcdefghij in this account"


async def test_identifiers_in_an_error_come_back_and_secrets_do_not(site: AuthStack) -> None:
    """Only key-shaped text is redacted: a long field or method name (letters and underscores,
    snake_case or camelCase) is what the client must read to fix its request."""
    key, _ = await site.key(plan="enterprise", email="names@example.com")
    field = "paymaster_verification_gas_limit"
    method = "chaingate_simulateUserOperationAssetChanges"
    async with site.client(key) as client:
        answer = await client.post("/v1/gas/policies", json={**POLICY, field: 1})
        assert field in refusal(answer, 400)
        answer = await client.get(f"/v1/webhooks/{method}")
        assert refusal(answer, 404) == f"no webhook {method} in this account"
    for name in (
        field,
        method,
        "PAYMASTER_VERIFICATION_GAS_LIMIT",
        "a-very-long-kebab-cased-option-name",
    ):
        assert redact_key_shaped(f"invalid field {name}") == f"invalid field {name}"
    # Secrets: ours (prefixed), and another provider's: long, with digits among the letters.
    secrets_ = [
        key,
        "whsec_" + secrets.token_urlsafe(24),
        secrets.token_hex(20),
        "AIzaSyD4xQ9kT2mN7pL0vR8sW3yZ6bC1eF5gH2j",  # shaped as a Google API key
        "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc" + "Xy12" * 3,
    ]
    for secret in secrets_:
        assert secret not in redact_key_shaped(f"no key {secret}."), secret
