"""The references of what a server publishes about itself: the REST API (the document
``GET /v1/openapi.json`` serves, rendered to Markdown here — no OpenAPI viewer, nothing from a
CDN) and the metrics (the families ``GET /metrics`` renders).  ``server`` builds the server they
are read from."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.docsgen.markdown import GENERATED, cell, code, table

TAG_TITLES = {
    "service": "Service",
    "account": "Account and usage",
    "gas": "Gas prices, policies and sponsorship",
    "wallets": "Smart wallets",
    "webhooks": "Webhooks",
    "tokens": "Tokens",
    "nfts": "NFTs",
    "transfers": "Transfers",
}
REF = "#/components/schemas/"


def _schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def _operation_anchor(operation: dict[str, Any]) -> str:
    return "op-" + re.sub(r"[^a-z0-9]+", "-", str(operation["operationId"]).lower()).strip("-")


def _type(schema: dict[str, Any] | bool) -> str:
    """A JSON schema in words, with links to the named schemas."""
    if isinstance(schema, bool):
        return "any" if schema else "nothing"
    if "prefixItems" in schema:
        return "[" + ", ".join(_type(item) for item in schema["prefixItems"]) + "]"
    if "$ref" in schema:
        name = schema["$ref"].removeprefix(REF)
        return f"[{name}](#{_schema_anchor(name)})"
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o != {"type": "null"}]
        shown = " or ".join(_type(o) for o in options)
        return shown + (" or null" if len(options) < len(schema["anyOf"]) else "")
    if "enum" in schema:
        return " | ".join(code(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return "array of " + _type(schema.get("items", {}))
    if (
        kind == "object"
        and "additionalProperties" in schema
        and isinstance(schema["additionalProperties"], dict)
    ):
        return "object of " + _type(schema["additionalProperties"])
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind or "any")


def _constraints(schema: dict[str, Any]) -> str:
    parts = []
    for key, words in (
        ("minimum", "≥ {}"),
        ("maximum", "≤ {}"),
        ("minLength", "length ≥ {}"),
        ("maxLength", "length ≤ {}"),
        ("maxItems", "at most {} items"),
        ("pattern", "matches `{}`"),
    ):
        if key in schema:
            parts.append(words.format(schema[key]))
    if "default" in schema and schema["default"] is not None:
        parts.append("default " + code(json.dumps(schema["default"])))
    return ", ".join(parts)


def _description(schema: dict[str, Any]) -> str:
    text = schema.get("description", "")
    examples = schema.get("examples")
    if examples:
        text += (" " if text else "") + "Example: " + code(json.dumps(examples[0])) + "."
    return text


def _access(operation: dict[str, Any]) -> str:
    if not operation.get("security"):
        return "public (no key)"
    scope = operation.get("x-scope")
    return f"key with {code(scope)}" if scope else "any valid key"


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    out = [f"### {method.upper()} `{path}` {{#{_operation_anchor(operation)}}}\n\n"]
    out.append(operation.get("summary", "") + ".\n\n" if operation.get("summary") else "")
    if operation.get("description"):
        out.append(operation["description"] + "\n\n")
    facts = [
        f"**Access:** {_access(operation)}",
        f"**Compute units:** {operation.get('x-compute-units', 0)}",
    ]
    if operation.get("x-cache-seconds"):
        facts.append(f"**Cached:** up to {operation['x-cache-seconds']:g} s (`X-Cache`)")
    out.append(" · ".join(facts) + "\n\n")
    parameters = operation.get("parameters", [])
    if parameters:
        out.append(
            table(
                ["Parameter", "In", "Type", "Required", "Description"],
                (
                    [
                        code(p["name"]),
                        p["in"],
                        " ".join(filter(None, [_type(p["schema"]), _constraints(p["schema"])])),
                        "yes" if p.get("required") else "",
                        _description({**p["schema"], **p}),
                    ]
                    for p in parameters
                ),
            )
            + "\n"
        )
    body = operation.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        out.append(f"**Body** (JSON): {_type(schema)}\n\n")
    rows = []
    for status, response in operation["responses"].items():
        schema = response.get("content", {}).get("application/json", {}).get("schema", {})
        headers = ", ".join(code(h) for h in response.get("headers", {}))
        rows.append([status, response.get("description", ""), _type(schema), headers])
    out.append(table(["Status", "Meaning", "Body", "Headers"], rows) + "\n")
    return out


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name} {{#{_schema_anchor(name)}}}\n\n"]
    if schema.get("description"):
        out.append(schema["description"] + "\n\n")
    properties = schema.get("properties")
    if not properties:
        out.append(f"{_type(schema)}.\n\n")
        return out
    required = set(schema.get("required", ()))
    out.append(
        table(
            ["Field", "Type", "Required", "Description"],
            (
                [
                    code(field),
                    " ".join(filter(None, [_type(s), _constraints(s)])),
                    "yes" if field in required else "",
                    _description(s),
                ]
                for field, s in properties.items()
            ),
        )
        + "\n"
    )
    return out


REST_INTRO = """\
# REST API

Every REST endpoint, rendered from the OpenAPI 3.1 document the server itself publishes at
`GET /v1/openapi.json` ([a copy](openapi.json)).  Send the key as `X-API-Key: KEY` or
`Authorization: Bearer KEY`; bodies are JSON, labelled `Content-Type: application/json` (415
otherwise).  Every
answer to a keyed request carries `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
`X-RateLimit-Reset`; a `429` or `503` carries `Retry-After`.  Errors have one shape:
[Errors](errors.md#rest).  Lists take `limit` (at most 100) and `page` (from 1).

JSON-RPC (`POST /v1/rpc/{chain}/{network}`), the bundler (`POST /v1/bundler/{chain}/{network}`)
and WebSockets are not REST: see [JSON-RPC methods](methods.md) and
[WebSocket messages](websocket.md).

"""


def rest(document: dict[str, Any]) -> str:
    out = [GENERATED, REST_INTRO]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            tag = (operation.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method, path, operation))
    out.append("## Endpoints\n\n")
    for tag, operations in by_tag.items():
        title = TAG_TITLES.get(tag, tag.capitalize())
        out.append(f"* {title}: ")
        out.append(
            ", ".join(
                f"[{m.upper()} `{cell(p)}`](#{_operation_anchor(o)})" for m, p, o in operations
            )
            + "\n"
        )
    for tag, operations in by_tag.items():
        out.append(f"\n## {TAG_TITLES.get(tag, tag.capitalize())} {{#tag-{tag}}}\n\n")
        for method, path, operation in operations:
            out += _operation(method, path, operation)
    out.append("## Schemas {#schemas}\n\n")
    for name, schema in document["components"]["schemas"].items():
        out += _schema(name, schema)
    return "".join(out).rstrip() + "\n"


def openapi_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


METRICS_INTRO = """\
# Metrics

`GET /metrics` on the server's port, in the Prometheus text format, for a bearer of the admin
token (`[observability] admin_token`, best given as `CHAINGATE_OBSERVABILITY__ADMIN_TOKEN`;
without one, `/metrics` answers 403).  Each process of `serve --workers N` answers for itself:
scrape every process (or accept the sum of what one answers per scrape).  Every family the
server exports, as `/metrics` describes it:

"""


def families(exposition: str) -> list[tuple[str, str, str]]:
    """(name, type, help) of each family of a Prometheus text exposition, in its order."""
    helps: dict[str, str] = {}
    kinds: dict[str, str] = {}
    order: list[str] = []
    for line in exposition.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[len("# HELP ") :].partition(" ")
            helps[name] = text
            if name not in order:
                order.append(name)
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            kinds[name] = kind
    return [(name, kinds.get(name, ""), helps[name]) for name in order]


def metrics(exposition: str) -> str:
    found = sorted(families(exposition))
    out = [GENERATED, METRICS_INTRO]
    out.append(table(["Metric", "Type", "What it counts"], ([code(n), k, h] for n, k, h in found)))
    return "".join(out)
