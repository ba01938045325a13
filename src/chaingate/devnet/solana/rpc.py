"""JSON-RPC 2.0 over a ledger: one request or a batch in, the reply's bytes out (no I/O)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from chaingate.devnet.solana import accounts, chain, transactions
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.params import (
    Code,
)
from chaingate.rpc.local import RpcFault

MAX_BATCH = 100
log = logging.getLogger("chaingate.devnet.solana")
Handler = Callable[[Ledger, list[Any]], object]
METHODS: dict[str, Handler] = {**chain.METHODS, **accounts.METHODS, **transactions.METHODS}

_encode = msgspec.json.Encoder().encode


def _error(fault: RpcFault, request_id: object = None) -> dict[str, Any]:
    return {"error": fault.error(), "id": request_id, "jsonrpc": "2.0"}


def answer_one(ledger: Ledger, request: object) -> dict[str, Any] | None:
    """One request's reply; None for a notification (no id)."""
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0":
        return _error(RpcFault(Code.INVALID_REQUEST, "Invalid request"))
    request_id = request.get("id")
    method = request.get("method")
    params = request.get("params", [])
    handler = METHODS.get(method) if isinstance(method, str) else None
    try:
        if handler is None:
            raise RpcFault(Code.METHOD_NOT_FOUND, "Method not found")
        if not isinstance(params, list):
            raise RpcFault(Code.INVALID_PARAMS, "Invalid params: expected an array")
        result = handler(ledger, params)
    except RpcFault as fault:
        return _error(fault, request_id)
    except Exception as exc:  # a bug answers as one, and never takes the node down
        log.exception("solana node: %s failed", method)
        return _error(RpcFault(Code.INTERNAL_ERROR, f"Internal error: {exc!r}"), request_id)
    if "id" not in request:
        return None
    return {"id": request_id, "jsonrpc": "2.0", "result": result}


def answer(ledger: Ledger, body: bytes) -> bytes:
    """The reply to an HTTP body: a single request or a JSON-RPC batch."""
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return _encode(_error(RpcFault(Code.PARSE_ERROR, "Parse error")))
    if isinstance(payload, list):
        if not payload or len(payload) > MAX_BATCH:
            return _encode(_error(RpcFault(Code.INVALID_REQUEST, "Invalid request")))
        replies = [answer_one(ledger, request) for request in payload]
        return _encode([reply for reply in replies if reply is not None])
    return _encode(answer_one(ledger, payload))
