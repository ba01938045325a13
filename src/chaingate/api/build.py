"""Every REST resource, assembled: the one place that lists them (and the OpenAPI route)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from chaingate.api import (
    gas,
    health,
    nfts,
    policies,
    simulate,
    sponsor,
    tokens,
    transfers,
    usage,
    wallets,
    webhooks,
)
from chaingate.api.deps import ApiDeps
from chaingate.api.openapi import document
from chaingate.api.routing import PUBLIC, Call, NoInput, RestApi

RESOURCES = (
    health,
    usage,
    gas,
    policies,
    sponsor,
    wallets,
    webhooks,
    tokens,
    nfts,
    transfers,
    simulate,
)


class OpenApiDocument(msgspec.Struct):
    """The OpenAPI 3.1 document of this API (see https://spec.openapis.org/oas/v3.1.0)."""

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]


def build_api(deps: ApiDeps | None = None, costs: dict[str, int] | None = None) -> RestApi:
    """The routes of every resource, priced by ``costs`` (route key -> compute units) when
    given; the OpenAPI document is served at ``GET /v1/openapi.json``."""
    deps = deps or ApiDeps()
    api = RestApi()
    for resource in RESOURCES:
        resource.register(api, deps)
    cached: list[bytes] = []

    @api.route(
        "GET",
        "/v1/openapi.json",
        name="getOpenApi",
        summary="This document",
        access=PUBLIC,
        response=OpenApiDocument,
        tags=("service",),
    )
    async def get_openapi(call: Call[NoInput, NoInput, None]) -> object:
        if not cached:
            cached.append(msgspec.json.encode(document(api)))
        return msgspec.Raw(cached[0])

    if costs is not None:
        api.price(costs)
    return api


def load_costs(path: Path) -> dict[str, int]:
    """config/rest.toml: ``["GET /v1/..."] cu = N`` per route."""
    data = tomllib.loads(path.read_text())
    costs: dict[str, int] = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("cu"), int):
            raise ValueError(f"{path}: [{key!r}] needs an integer cu")
        costs[key] = entry["cu"]
    return costs
