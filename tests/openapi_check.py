"""Every REST answer a test receives, checked against chaingate's own OpenAPI document.

``GatewayHandle.client()`` installs ``check_response`` as an httpx response hook, so a test
that talks to the REST plane cannot receive an answer the document does not describe: a
status the operation does not list, a body its schema refuses, rate-limit headers that are
not integers, an answer without ``X-Content-Type-Options: nosniff``.  The document is
generated from the same route definitions the server runs — this checks that what the server
*does* matches what it *says*.
"""

from __future__ import annotations

import functools
import json
from typing import Any
from urllib.parse import unquote

import httpx
import jsonschema

from chaingate.api.build import build_api
from chaingate.api.openapi import document
from chaingate.api.routing import RestApi

# Paths outside the REST plane: their own protocols, documented elsewhere.
NOT_REST = ("/v1/rpc/", "/v1/ws/", "/v1/bundler/", "/metrics")
ERROR_STATUSES_ANYWHERE = {400, 401, 403, 404, 405, 413, 414, 429, 431, 503}


@functools.cache
def _api() -> tuple[RestApi, dict[str, Any]]:
    api = build_api()
    return api, document(api)


def _validate(schema: dict[str, Any], value: Any, where: str) -> None:
    # The document's "#/components/..." references resolve inside the schema itself.
    _, doc = _api()
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    if errors:
        raise AssertionError(f"{where}: answer breaks the OpenAPI document: {errors[0].message}")


def check(method: str, path: str, status: int, headers: httpx.Headers, body: bytes) -> None:
    """Raise AssertionError if this answer is not what the OpenAPI document describes."""
    if not path.startswith("/v1") or path.startswith(NOT_REST):
        return
    api, doc = _api()
    where = f"{method} {path} -> {status}"
    # Whoever wrote it (the app, the edge, the framing), no REST answer is left to sniffing.
    assert headers.get("x-content-type-options") == "nosniff", f"{where}: no nosniff"
    match = api.match(method, unquote(path))
    if match is None:
        # No operation: it must be a refusal in the error envelope.
        assert status in ERROR_STATUSES_ANYWHERE, where
        _validate({"$ref": "#/components/schemas/ErrorBody"}, json.loads(body), where)
        return
    operation = doc["paths"][match.route.path][match.route.method.lower()]
    described = operation["responses"].get(str(status))
    if described is None:
        # The edge's own refusals (framing limits, overload) apply to every route.
        assert status in (413, 414, 431, 503), f"{where}: status not in the document"
        return
    if method == "HEAD":
        return
    schema = described["content"]["application/json"]["schema"]
    assert headers.get("content-type", "").startswith("application/json"), where
    _validate(schema, json.loads(body), where)
    for name, header in described.get("headers", {}).items():
        value = headers.get(name)
        if value is None:
            continue
        schema = header.get("schema") or doc["components"]["headers"][name]["schema"]
        if schema.get("type") == "integer":
            assert value.isdigit(), f"{where}: header {name}={value!r} is not an integer"
        elif "enum" in schema:
            assert value in schema["enum"], f"{where}: header {name}={value!r}"
    if not match.route.public and status != 401:
        for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"):
            assert name.lower() in headers or "x-ratelimit-limit" not in headers, where


async def check_response(response: httpx.Response) -> None:
    """httpx response hook (async clients)."""
    await response.aread()
    check(
        response.request.method,
        response.request.url.raw_path.split(b"?", 1)[0].decode("latin-1"),
        response.status_code,
        response.headers,
        response.content,
    )
