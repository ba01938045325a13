"""A JSON-RPC 2.0 endpoint answered in process: the methods of ``/v1/bundler/{chain}/{network}``.

The proxy forwards calls to nodes; these are answered by chaingate itself — the ERC-7677
paymaster methods now, the bundler's ``eth_*UserOperation*`` methods when the bundler
registers them.  Each subsystem registers its handlers on its network's ``LocalRpc``; the
edge parses the body here (sans-IO: ``parse``), admits the calls at their compute units, runs
them (``run``) and sends what ``encode`` made — never through the REST app.

A handler takes the call's params and the caller's principal and returns a JSON-able result,
or raises ``RpcFault`` (its code, message and data are the client's to read).  A notification
(no ``id``) is run and never answered, as on the proxy.
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from chaingate.framing_constants import MAX_JSON_DEPTH
from chaingate.jsondepth import too_deep

MAX_BATCH = 100
# Calls of one batch run at once: a batch of user operations validates concurrently, as the
# same calls sent on parallel requests would, no more at a time than a WebSocket connection's
# calls (ws.max_inflight's default).
MAX_CONCURRENT = 16

Handler = Callable[[Any, Any], Awaitable[Any]]

# JSON-RPC 2.0's own codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class RpcFault(Exception):
    """A JSON-RPC error answer: its code, message and optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        """The reply's ``error`` member."""
        error: dict[str, Any] = {"code": int(self.code), "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class Call(msgspec.Struct, frozen=True):
    id: Any
    method: str
    params: Any
    error: RpcFault | None = None  # set when the call itself is malformed
    notification: bool = False  # no "id": run, never answered


class Parsed(msgspec.Struct, frozen=True):
    calls: list[Call]
    batch: bool


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _reply(
    call_id: object, *, result: object = None, fault: RpcFault | None = None
) -> dict[str, Any]:
    if fault is None:
        return {"jsonrpc": "2.0", "id": call_id, "result": result}
    return {"jsonrpc": "2.0", "id": call_id, "error": fault.error()}


def _call(item: object) -> Call:
    if not isinstance(item, dict):
        return Call(None, "", None, RpcFault(INVALID_REQUEST, "a call must be an object"))
    call_id = item.get("id")
    if not (call_id is None or isinstance(call_id, (str, int))) or isinstance(call_id, bool):
        return Call(None, "", None, RpcFault(INVALID_REQUEST, "id must be a string or a number"))
    method = item.get("method")
    if item.get("jsonrpc") != "2.0" or not isinstance(method, str):
        return Call(
            call_id, "", None, RpcFault(INVALID_REQUEST, 'expected {"jsonrpc": "2.0", "method"}')
        )
    params = item.get("params", [])
    if not isinstance(params, (list, dict)):
        return Call(call_id, method, None, RpcFault(INVALID_PARAMS, "params must be an array"))
    return Call(call_id, method, params, notification="id" not in item)


def parse(body: bytes) -> Parsed | bytes:
    """The calls of a request body, or the whole answer when there is nothing to run."""
    if too_deep(body):
        fault = RpcFault(PARSE_ERROR, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return _encoder.encode(_reply(None, fault=fault))
    try:
        document = _decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return _encoder.encode(_reply(None, fault=RpcFault(PARSE_ERROR, "not JSON")))
    if isinstance(document, list):
        if not document:
            return _encoder.encode(_reply(None, fault=RpcFault(INVALID_REQUEST, "empty batch")))
        if len(document) > MAX_BATCH:
            fault = RpcFault(INVALID_REQUEST, f"at most {MAX_BATCH} calls per batch")
            return _encoder.encode(_reply(None, fault=fault))
        return Parsed([_call(item) for item in document], True)
    return Parsed([_call(document)], False)


def encode(parsed: Parsed, replies: list[dict[str, Any] | None]) -> bytes | None:
    """The answer to send; None when every call was a notification (nothing to send)."""
    sent = [reply for reply in replies if reply is not None]
    if not sent:
        return None
    return _encoder.encode(sent if parsed.batch else sent[0])


class LocalRpc:
    """The methods one network's endpoint answers, with their compute units."""

    def __init__(self, label: str) -> None:
        self.label = label  # "chain/network", for messages
        self._methods: dict[str, tuple[Handler, int]] = {}

    def register(self, method: str, handler: Handler, cu: int) -> None:
        if method in self._methods:
            raise ValueError(f"{self.label}: {method} registered twice")
        self._methods[method] = (handler, cu)

    @property
    def methods(self) -> Mapping[str, tuple[Handler, int]]:
        return self._methods

    def cost(self, calls: list[Call]) -> int:
        """Compute units of the calls (an unknown or malformed call costs 1)."""
        return sum(self._methods.get(c.method, (None, 1))[1] for c in calls)

    async def run(
        self, parsed: Parsed, principal: object
    ) -> tuple[list[dict[str, Any] | None], int]:
        """Each call's reply in order (None for a notification), and how many were errors.
        A batch's calls run concurrently, MAX_CONCURRENT at a time."""
        calls = parsed.calls
        outcomes: list[tuple[dict[str, Any] | None, bool]] = [(None, False)] * len(calls)

        async def one(index: int, limiter: trio.CapacityLimiter) -> None:
            async with limiter:
                outcomes[index] = await self._run_one(calls[index], principal)

        if len(calls) == 1:
            outcomes[0] = await self._run_one(calls[0], principal)
        else:
            limiter = trio.CapacityLimiter(MAX_CONCURRENT)
            async with trio.open_nursery() as nursery:
                for index in range(len(calls)):
                    nursery.start_soon(one, index, limiter)
        return [reply for reply, _ in outcomes], sum(failed for _, failed in outcomes)

    async def _run_one(self, call: Call, principal: object) -> tuple[dict[str, Any] | None, bool]:
        """(the reply, None for a notification; whether it failed)."""
        fault = call.error
        result: Any = None
        if fault is None:
            entry = self._methods.get(call.method)
            if entry is None:
                known = ", ".join(sorted(self._methods)) or "none yet"
                fault = RpcFault(
                    METHOD_NOT_FOUND,
                    f"{call.method[:64]} is not served on {self.label} (served: {known})",
                )
            else:
                try:
                    result = await entry[0](call.params, principal)
                except RpcFault as exc:
                    fault = exc
        if call.notification:
            return None, fault is not None
        if fault is not None:
            return _reply(call.id, fault=fault), True
        return _reply(call.id, result=result), False


def load_costs(path: Path) -> dict[str, int]:
    """config/bundler.toml: ``method = compute units``."""
    costs: dict[str, int] = {}
    for method, cu in tomllib.loads(path.read_text()).items():
        if isinstance(cu, bool) or not isinstance(cu, int) or cu < 0:
            raise ValueError(f"{path}: {method} needs a whole number of compute units >= 0")
        costs[method] = cu
    return costs
