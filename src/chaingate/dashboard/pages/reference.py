"""The API reference: the OpenAPI document (``GET /v1/openapi.json``, generated from the
route definitions) rendered here as HTML — no viewer script, nothing fetched — and the
JSON-RPC methods chaingate answers itself (the simulations) beside the proxied ones."""

from __future__ import annotations

from typing import Any

from quart import Blueprint
from quart.typing import ResponseReturnValue

from chaingate.dashboard.web import Dashboard, page, signed_in

METHODS = ("get", "post", "put", "patch", "delete")


def register(bp: Blueprint, dash: Dashboard) -> None:
    cached: list[list[dict[str, Any]]] = []

    @bp.route("/reference", methods=["GET"])
    @signed_in
    async def reference() -> ResponseReturnValue:
        if not cached:
            document = await dash.rest("getOpenApi", "")
            operations = []
            for path, item in document["paths"].items():
                for method in METHODS:
                    operation = item.get(method)
                    if operation is None:
                        continue
                    parameters = [
                        f"{p.get('name')} ({p.get('in')}"
                        + (", required)" if p.get("required") else ")")
                        for p in operation.get("parameters", [])
                    ]
                    body = operation.get("requestBody", {}).get("content", {})
                    schema = body.get("application/json", {}).get("schema", {})
                    operations.append(
                        {
                            "method": method.upper(),
                            "path": path,
                            "summary": operation.get("summary", ""),
                            "description": operation.get("description", ""),
                            "tag": (operation.get("tags") or ["other"])[0],
                            "parameters": parameters,
                            "body": schema.get("$ref", "").rsplit("/", 1)[-1],
                            "responses": sorted(operation.get("responses", {})),
                            "id": operation.get("operationId", ""),
                        }
                    )
            cached.append(operations)
        simulation = dash.api.simulation
        methods = simulation.reference() if simulation is not None else []
        return await page(
            "reference.html", title="API reference", operations=cached[0], methods=methods
        )
