"""The dashboard's way to the REST API's rules: the same route handlers, called in process.

A page that creates a webhook calls the handler of ``POST /v1/webhooks`` with a Call decoded
exactly as the REST app decodes one (``chaingate.api.inputs``): the same validation, the same
messages, the same service — never a second copy of a rule.  The caller is the signed-in
account, as a principal holding every scope (the account owns what it reaches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from chaingate.api.inputs import decode_body, decode_path, decode_query
from chaingate.api.responses import encode
from chaingate.api.routing import Call, RestApi, Route
from chaingate.auth.gate import SCOPES, Principal


def principal_for(account_id: str) -> Principal:
    return Principal(key_id="", account_id=account_id, environment="live", scopes=frozenset(SCOPES))


class RestCalls:
    def __init__(self, api: RestApi) -> None:
        self._routes: dict[str, Route] = {route.name: route for route in api.routes}

    async def __call__(
        self,
        name: str,
        account_id: str,
        *,
        path: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        body: object = None,
    ) -> Any:
        """The handler's answer as plain data (dicts, lists); ApiError as the REST API
        raises it."""
        route = self._routes[name]
        call: Call[Any, Any, Any] = Call(
            path=decode_path(route.path_type, dict(path or {})),
            query=decode_query(
                route.query_type, [(k, [v]) for k, v in (query or {}).items() if v != ""]
            ),
            body=(
                decode_body(route.body_type, msgspec.json.encode(body))
                if route.body_type is not None
                else None
            ),
            principal=principal_for(account_id),
        )
        result = await route.handler(call)
        return msgspec.json.decode(encode(result))  # exactly what the REST answer holds
