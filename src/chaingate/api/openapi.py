"""The OpenAPI 3.1 document, generated from the route definitions and their Structs.

Nothing here is written by hand per endpoint: parameters come from the fields of each route's
path and query Structs, bodies and answers from msgspec's JSON Schema of the Structs (JSON
Schema 2020-12, which OpenAPI 3.1 uses as is), errors from the one envelope.  Served at
``GET /v1/openapi.json``; tests check every REST answer they receive against it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from chaingate import __version__
from chaingate.api.errors import ErrorBody
from chaingate.api.routing import NoInput, RestApi, Route
from chaingate.api.types import schema_hook

REF = "#/components/schemas/{name}"
_RATE_HEADERS = {
    "X-RateLimit-Limit": "Requests per second of the key's plan.",
    "X-RateLimit-Remaining": "Whole requests the key's bucket holds now.",
    "X-RateLimit-Reset": "Unix time (seconds) when the bucket is full again.",
}
_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    400: "Invalid request: the message names the parameter.",
    401: "Missing, malformed, unknown or revoked API key.",
    403: "The key lacks the scope, or a test key asked for a network that is not a testnet.",
    404: "Not found.",
    405: "Method not allowed (see `Allow`).",
    409: "Conflict.",
    413: "Body too large.",
    415: "The body is not labelled `Content-Type: application/json` (or a `+json` type).",
    422: "Understood, but over a bound of the server's (the message names it).",
    429: "Rate limited: retry after `Retry-After` seconds.",
    500: "Internal error: retry with exponential backoff.",
    501: "Not supported by this deployment's upstreams.",
    502: "The upstream node refused the request (its message is passed on).",
    503: "Temporarily unavailable: retry after `Retry-After` seconds.",
    504: "Not done within the server's time bound.",
}


def document(api: RestApi, server_url: str = "/") -> dict[str, Any]:
    types: list[Any] = [ErrorBody]
    for route in api.routes:
        # Parameters are described field by field (below); bodies and answers by reference.
        for kind in (route.body_type, route.response_type, *route.other_responses.values()):
            if kind is not None and kind not in types:
                types.append(kind)
    schemas, components = msgspec.json.schema_components(
        types, schema_hook=schema_hook, ref_template=REF
    )
    by_type: dict[Any, dict[str, Any]] = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in api.routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(
            route, by_type, components
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "chaingate",
            "version": __version__,
            "description": "Self-hostable blockchain infrastructure API: the REST plane. "
            "JSON-RPC (`POST /v1/rpc/{chain}/{network}`), the bundler and WebSocket "
            "subscriptions are described in the documentation (docs/reference/).",
        },
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
            "headers": {
                name: {"description": text, "schema": {"type": "integer"}}
                for name, text in _RATE_HEADERS.items()
            }
            | {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                }
            },
        },
    }


def _operation(
    route: Route, by_type: dict[Any, dict[str, Any]], components: dict[str, Any]
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": route.name,
        "summary": route.summary,
        "tags": list(route.tags),
        "x-compute-units": route.cu,
    }
    if route.description:
        operation["description"] = route.description
    if route.scope is not None:
        operation["x-scope"] = route.scope
    parameters = _parameters(route.path_type, "path", components) + _parameters(
        route.query_type, "query", components
    )
    if parameters:
        operation["parameters"] = parameters
    if route.body_type is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": by_type[route.body_type]}},
        }
    headers: dict[str, Any] = (
        {}
        if route.public
        else {name: {"$ref": f"#/components/headers/{name}"} for name in _RATE_HEADERS}
    )
    success_headers = dict(headers)
    if route.cache_seconds:
        operation["x-cache-seconds"] = route.cache_seconds
        success_headers["X-Cache"] = {
            "description": f"HIT: the same answer served again (for up to "
            f"{route.cache_seconds:g} s, never across an index commit); MISS: computed now.",
            "schema": {"type": "string", "enum": ["HIT", "MISS"]},
        }
    responses: dict[str, Any] = {
        str(route.status): _response(route.status, by_type[route.response_type], success_headers)
    }
    statuses = set(route.errors) | {500}
    if parameters or route.body_type is not None:
        statuses.add(400)
    if route.body_type is not None:
        statuses |= {413, 415}  # the edge's bound on a body; a body labelled other than JSON
    if not route.public:
        statuses |= {401, 403, 429}
        operation["security"] = [{"apiKey": []}, {"bearer": []}]
    else:
        operation["security"] = []
    error = by_type[ErrorBody]
    for status in sorted(statuses):
        schema = (
            by_type[route.other_responses[status]] if status in route.other_responses else error
        )
        response = _response(status, schema, headers)
        if status in (429, 503):
            response["headers"] = {
                **response.get("headers", {}),
                "Retry-After": {"$ref": "#/components/headers/Retry-After"},
            }
        responses[str(status)] = response
    for status, kind in route.other_responses.items():
        responses.setdefault(str(status), _response(status, by_type[kind], headers))
    operation["responses"] = responses
    return operation


def _response(status: int, schema: dict[str, Any], headers: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _STATUS_TEXT.get(status, "See the message."),
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = dict(headers)
    return response


def _parameters(kind: type[msgspec.Struct], where: str, components: dict[str, Any]) -> list[Any]:
    if kind is NoInput:
        return []
    (schema,), parts = msgspec.json.schema_components(
        [kind], schema_hook=schema_hook, ref_template=REF
    )
    components.update({k: v for k, v in parts.items() if k != kind.__name__})
    body = parts[kind.__name__]
    required = set(body.get("required", ()))
    out = []
    for name, field_schema in body.get("properties", {}).items():
        schema = {k: v for k, v in field_schema.items() if k != "description"}
        options = schema.get("anyOf")
        if options and len(options) == 2 and {"type": "null"} in options:
            # An optional parameter is absent, never null: describe the value it takes.
            schema = {
                **next(o for o in options if o != {"type": "null"}),
                **{k: v for k, v in schema.items() if k != "anyOf" and v is not None},
            }
        parameter: dict[str, Any] = {
            "name": name,
            "in": where,
            "required": where == "path" or name in required,
            "schema": schema,
        }
        if "description" in field_schema:
            parameter["description"] = field_schema["description"]
        out.append(parameter)
    return out
