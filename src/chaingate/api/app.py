"""The REST data plane: a quart-trio app behind the edge (never on the RPC hot path).

Every response body is encoded with msgspec; every error, including the framework's own 404
and 405, is the spec's envelope ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from chaingate.config import NetworkSettings
from chaingate.edge.responses import error_body
from chaingate.gas.oracle import GasOracle

_encoder = msgspec.json.Encoder()


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(_encoder.encode(payload), status=status, mimetype="application/json")


def error_response(status: int, message: str, code: str | None = None) -> Response:
    return Response(error_body(status, message, code), status=status, mimetype="application/json")


def create_app(
    health: Callable[[], dict[str, Any]],
    store: Any = None,
    gas: Mapping[str, GasOracle] | None = None,
    evm_networks: Mapping[str, NetworkSettings] | None = None,
) -> QuartTrio:
    from chaingate.api import gas as gas_api  # the resources import this module's helpers
    from chaingate.api import usage

    app = QuartTrio("chaingate")
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    # Never redirect: werkzeug builds a redirect from the client's Host header (an open
    # redirect).  The edge already refused the paths it would "fix" ('//', dot segments), no
    # rule ends in '/', and any redirect routing still raises is answered 404 below.
    app.url_map.redirect_defaults = False
    usage.register(app, store)
    gas_api.register(app, gas or {}, evm_networks)

    @app.get("/v1/health")
    async def get_health() -> Response:
        report = health()
        return json_response(report, 200 if report["status"] == "ok" else 503)

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
        app.logger.exception("unhandled error")
        return error_response(500, "internal error; retry with exponential backoff")

    return app
