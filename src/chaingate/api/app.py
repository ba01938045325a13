"""The REST data plane: a quart-trio app behind the edge (never on the RPC hot path).

Each route of the ``RestApi`` becomes one Quart rule whose view decodes the typed inputs
(``chaingate.api.inputs``), calls the handler and encodes its answer with msgspec.  Every
error, including the framework's own 404 and 405, is the spec's envelope
``{"error": {"code", "message", "status"}}``; nothing a client sends can produce a 500 or a
traceback in a response.
"""

from __future__ import annotations

import logging
import re
from typing import Any, cast

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import BaseConverter, Map

from chaingate.api.errors import ApiError, error_response
from chaingate.api.inputs import check_media_type, decode_body, decode_path, decode_query
from chaingate.api.responses import json_response
from chaingate.api.routing import Call, RestApi, Route
from chaingate.auth.gate import Principal

log = logging.getLogger("chaingate.api")


def create_app(api: RestApi) -> QuartTrio:
    app = QuartTrio("chaingate")
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    # Never redirect: werkzeug builds a redirect from the client's Host header (an open
    # redirect).  The edge already refused the paths it would "fix" ('//', dot segments), no
    # rule ends in '/', and any redirect routing still raises is answered 404 below.
    app.url_map.redirect_defaults = False
    app.url_map.converters["not"] = _NotConverter
    for route in api.routes:
        app.add_url_rule(
            api.quart_rule(route),
            endpoint=route.name,
            view_func=_view(route),
            methods=[route.method],
        )

    @app.after_request
    async def no_sniffing(response: Response) -> Response:
        # Every answer of the app, its own 404/405/500 included (the edge's carry it too).
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if 300 <= status < 400:
            status = 404  # a routing redirect would name the client's Host: never sent
        messages = {404: "no such endpoint", 405: "method not allowed on this endpoint"}
        response = error_response(status, messages.get(status, exc.description or exc.name))
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        log.error("unhandled error in a REST handler", exc_info=exc)
        return error_response(500, "internal error; retry with exponential backoff")

    return app


class _NotConverter(BaseConverter):
    """One path segment, but none of the given literals (they belong to other routes)."""

    def __init__(self, url_map: Map, *excluded: str) -> None:
        super().__init__(url_map)
        words = "|".join(re.escape(word) for word in excluded)
        self.regex = f"(?!(?:{words})(?:/|$))[^/]+"


def _view(route: Route) -> Any:
    async def view(**params: str) -> Response:
        try:
            body = None
            if route.body_type is not None:
                check_media_type(request.headers.getlist("Content-Type"))
                data = await request.get_data(as_text=False)
                body = decode_body(route.body_type, data if isinstance(data, bytes) else b"")
            call: Call[Any, Any, Any] = Call(
                path=decode_path(route.path_type, params),
                query=decode_query(route.query_type, request.args.lists()),
                body=body,
                # Set by the edge (edge/asgi.py) from the key gate: a Principal or None.
                principal=cast("Principal | None", request.scope.get("chaingate.principal")),
            )
            result = await route.handler(call)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.code, exc.headers)
        if isinstance(result, Response):
            return result
        return json_response(result, route.status)

    view.__name__ = route.name
    return view
