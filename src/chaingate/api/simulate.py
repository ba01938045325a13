"""``POST /v1/simulate/{chain}`` — what transactions or a UserOperation would do, before signing.

The body names a ``kind`` and its inputs, the same values the JSON-RPC methods take
(``chaingate.simulation.methods``) under names of their own; the answer holds the JSON-RPC
method's result(s) unchanged.  ``asset_changes`` takes one or more ``transactions`` (a bundle:
each sees the previous ones' effects), ``execution`` exactly one, ``user_operation`` a
``user_operation`` and its ``entry_point``.  Scope ``rpc:read``, like the methods.

Errors: 400 for what the request got wrong; 404 for a chain not served (none configured by
that name, or no simulation on it); 422 when the simulation passes a bound (its size),
504 when it passes its time; 501 when no upstream of the network can run it (no
``eth_simulateV1`` nor ``debug_traceCall``); 502 when the node refused it; 503 when no
upstream answered.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import ChainName
from chaingate.rpc.errors import UpstreamError
from chaingate.simulation.service import SimulationFault

Kind = Literal["asset_changes", "execution", "user_operation"]


class SimulatePath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName


class SimulateBody(msgspec.Struct, forbid_unknown_fields=True):
    """One simulation; values as eth_call and eth_sendUserOperation take them (0x-hex)."""

    kind: Kind
    transactions: list[dict[str, Any]] | None = None
    user_operation: dict[str, Any] | None = None
    entry_point: str | None = None
    # A tag, a number, a 32-byte hash or {blockHash}/{blockNumber}; latest when absent.
    block: str | int | dict[str, Any] | None = None
    # geth's state override set: {address: {balance, nonce, code, state | stateDiff}}.
    state_overrides: dict[str, Any] | None = None
    # execution only: the call tree flat (depth-first) or nested.
    format: Literal["FLAT", "NESTED"] = "FLAT"


class SimulateResponse(msgspec.Struct):
    network: str
    kind: Kind
    # asset_changes: one result per transaction ({changes, gasUsed, error}); execution:
    # one ({calls, logs}); user_operation: one ({changes, error, gas, validation, ...}).
    results: list[dict[str, Any]]


_STATUS = {-32602: 400, -32002: 403, -32601: 404, -32005: 422, -32004: 501, -32000: 502}


def _params(body: SimulateBody) -> tuple[str, list[Any]]:
    """The JSON-RPC method and params the body stands for."""
    tail = [body.block, body.state_overrides]
    if body.kind == "user_operation":
        if body.user_operation is None or body.entry_point is None or body.transactions:
            raise ApiError(400, "a user_operation simulation takes user_operation and entry_point")
        params = [body.user_operation, body.entry_point, *tail]
        return "chaingate_simulateUserOperationAssetChanges", params
    if not body.transactions or body.user_operation is not None or body.entry_point is not None:
        raise ApiError(400, f"an {body.kind} simulation takes transactions")
    if body.kind == "execution":
        if len(body.transactions) != 1:
            raise ApiError(400, "an execution simulation takes exactly one transaction")
        return "chaingate_simulateExecution", [body.format, body.transactions[0], *tail]
    return "chaingate_simulateAssetChangesBundle", [body.transactions, *tail]


def register(api: RestApi, deps: ApiDeps) -> None:
    chains = ChainResolver(deps.evm_networks, "simulations")

    @api.route(
        "POST",
        "/v1/simulate/{chain}",
        name="simulate",
        summary="Simulate transactions or a UserOperation: asset changes or the execution trace",
        access="rpc:read",
        path_params=SimulatePath,
        body=SimulateBody,
        response=SimulateResponse,
        errors=(400, 403, 404, 422, 501, 502, 503, 504),
        tags=("simulation",),
        description="The JSON-RPC methods `chaingate_simulateAssetChanges(Bundle)`, "
        "`chaingate_simulateExecution` and `chaingate_simulateUserOperationAssetChanges` "
        "(Alchemy's names are aliases) over REST: every change of native currency, ERC-20, "
        "ERC-721 and ERC-1155 balances and approvals with the tokens' metadata, or the call "
        "tree and logs decoded where the ABI is known. Nothing is sent to the chain.",
    )
    async def simulate(call: Call[SimulatePath, NoInput, SimulateBody]) -> object:
        service = deps.simulation
        key = chains.resolve(call.path.chain, call.principal)
        if service is None:
            raise ApiError(503, "simulation is off on this deployment ([simulation] enabled)")
        assert call.body is not None
        method, params = _params(call.body)
        try:
            answer = await service.simulate(key, method, params, call.principal)
        except SimulationFault as fault:
            reason = fault.data.get("reason") if isinstance(fault.data, dict) else None
            if reason == "simulation_timeout":
                raise ApiError(504, fault.message, code="simulation_timeout") from None
            status = _STATUS.get(fault.code, 502)
            raise ApiError(status, fault.message, code=reason) from None
        except UpstreamError as exc:
            raise ApiError(503, f"upstream unavailable: {exc.message}") from None
        results = answer if isinstance(answer, list) else [answer]
        return SimulateResponse(str(key), call.body.kind, results)
