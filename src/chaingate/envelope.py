"""The spec's error envelope, ``{"error": {"code", "message", "status"}}``: the codes by status
and the body.  Every layer that answers an error writes it — the edge, the REST plane, the
WebSocket endpoint and the twins (handed ``error_body``) — so it lives below all of them."""

from __future__ import annotations

import msgspec

# The spec names codes for 400/401/403/404/429/500; other statuses get a code of their own
# (docs/decisions/edge.md lists them).
ERROR_CODES: dict[int, str] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    417: "expectation_failed",
    426: "upgrade_required",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "unavailable",
    505: "http_version_not_supported",
}

_encoder = msgspec.json.Encoder()


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    """``{"error": {"code", "message", "status"}}`` as the spec's Errors section defines it."""
    return _encoder.encode(
        {
            "error": {
                "code": code or ERROR_CODES.get(status, "error"),
                "message": message,
                "status": status,
            }
        }
    )
