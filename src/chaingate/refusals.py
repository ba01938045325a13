"""Refusals: why a request is refused (``Rejection``), and how a JSON-RPC path says it.

Every layer that refuses — the key gate, the proxy's allowlist check, the edge — speaks
``Rejection``; it lives here, below all of them, so that the proxy need not know the gate.

On JSON-RPC paths a refusal is JSON-RPC, as HTTP says it with a status, the body says it too.

A 401, 403 or 429 on ``/v1/rpc/…`` or ``/v1/bundler/…`` keeps its HTTP status (for HTTP-level
retry logic) and carries a JSON-RPC error with the request's id (for JSON-RPC libraries, which
otherwise report "invalid response" instead of the reason): over a limit EIP-1474's -32005
"limit exceeded", as the proxy always answered; otherwise -32002 "resource unavailable" with
the HTTP status and the spec's error code in ``data`` — what a WebSocket call, a contract the
key's list refuses and ERC-7677 without its scope already answer (docs/decisions/edge.md).
"""

from __future__ import annotations

import msgspec

from chaingate.framing_constants import LIMIT_EXCEEDED, RESOURCE_UNAVAILABLE

_encode = msgspec.json.Encoder().encode


class Rejection(msgspec.Struct, frozen=True):
    """Why a request is refused: HTTP status, spec error code, message, extra header lines,
    and whether the connection is closed after the answer (a client guessing keys)."""

    status: int
    code: str
    message: str
    headers: bytes = b""
    close: bool = False
    # False for a request whose Origin the key's allowlist refuses: its answer carries no
    # CORS headers, so the page that sent it reads nothing (chaingate.edge.cors).
    cors: bool = True


def refusal_error(status: int, code: str, message: str) -> bytes:
    """The JSON-RPC error object of a refusal (raw JSON, for ``raw_error_reply``)."""
    if status == 429:
        return _encode({"code": LIMIT_EXCEEDED, "message": message})
    return _encode(
        {"code": RESOURCE_UNAVAILABLE, "message": message, "data": {"status": status, "code": code}}
    )
