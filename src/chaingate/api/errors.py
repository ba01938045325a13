"""Errors of the REST plane: one exception for handlers, one envelope for every answer.

A handler raises ``ApiError``; the app turns it into the spec's envelope
``{"error": {"code", "message", "status"}}`` with the status as HTTP status.  The envelope's
Structs are here too, so the OpenAPI document describes exactly what is sent.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from quart import Response

from chaingate.envelope import ERROR_CODES, error_body
from chaingate.redaction import redact_key_shaped


class ErrorDetail(msgspec.Struct, frozen=True):
    code: str
    message: str
    status: int


class ErrorBody(msgspec.Struct, frozen=True):
    """Every REST error: ``error.status`` equals the HTTP status."""

    error: ErrorDetail


class ApiError(Exception):
    """A refusal with its HTTP status; ``message`` is what the client reads (never a secret,
    never a traceback) and names the offending parameter where there is one.  What it echoes
    of the client's input is never key-shaped: a key pasted into a path or a field comes back
    as ``[redacted]`` (one rule here, for every message of every route and page)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        message = redact_key_shaped(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or ERROR_CODES.get(status, "error")
        self.headers = dict(headers or {})


def invalid(message: str) -> ApiError:
    return ApiError(400, message)


def not_found(message: str) -> ApiError:
    return ApiError(404, message)


def error_response(
    status: int, message: str, code: str | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    response = Response(
        error_body(status, message, code), status=status, mimetype="application/json"
    )
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response
