"""Transaction simulation for every EVM network: the service object the gateway starts.

It answers the simulation methods (``methods.py``) on each network's ``/v1/rpc`` endpoint —
registered with the proxy as local methods (``RpcService.answer_locally``), so the fast lane
hands only them to Python — and the UserOperation one on ``/v1/bundler`` too, and serves
``POST /v1/simulate/{chain}`` through ``simulate``.

Bounds: at most ``max_concurrent`` simulations run at once (the rest wait within their time),
each within ``timeout`` seconds whole — past it the simulation is abandoned and answered
-32005, never left to hold a worker — and ``max_bundle`` transactions, ``max_frames``,
``max_logs`` and ``max_answer_bytes`` bound what one may ask and read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import msgspec
import trio

from chaingate.aa.userop import VERSIONS, UserOperation, Version, entry_point_address
from chaingate.auth.allowlists import RESOURCE_UNAVAILABLE, Policy
from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.rpcform import parse_user_operation
from chaingate.config import NetworkSettings, SimulationSettings
from chaingate.config.manifest import load_manifest
from chaingate.config.network import Network
from chaingate.evm.native import native_currency
from chaingate.obs.metrics import Registry, Sample
from chaingate.rpc.errors import UpstreamError, client_error
from chaingate.rpc.local import Handler, LocalRpc, RpcFault
from chaingate.rpc.pool import UpstreamPool
from chaingate.rpc.reply import LocalAnswer, Outcome
from chaingate.rpc.service import RpcService
from chaingate.simulation import params as p
from chaingate.simulation.assets import Native, TokenFacts
from chaingate.simulation.execution import Bounds, TooLarge
from chaingate.simulation.methods import ALIASES, BUNDLER_METHODS, METHODS, REFERENCE, Kind
from chaingate.simulation.nodes import Capabilities, Node, TooLargeAnswer
from chaingate.simulation.simulator import (
    INVALID_PARAMS,
    LIMIT_EXCEEDED,
    NOT_SERVED,
    SimulationFault,
    Simulator,
)

__all__ = ["SimulationFault", "SimulationService"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder()
_FORMATS = ("FLAT", "NESTED")
# The request's fault, not the node's: bad params, over a bound, a network not served, or a
# contract the key's allowlist does not name (RESOURCE_UNAVAILABLE, as for an eth_call).
_REFUSALS = (INVALID_PARAMS, LIMIT_EXCEEDED, NOT_SERVED, RESOURCE_UNAVAILABLE)


class SimulationService:
    def __init__(
        self,
        settings: SimulationSettings,
        networks: Mapping[Network, NetworkSettings],
        pools: Mapping[Network, UpstreamPool],
        metadata: Mapping[Network, TokenFacts],
    ) -> None:
        """``networks``/``pools``: every EVM network's settings and upstreams by
        network; ``metadata``: the metadata service of those that have one."""
        self.settings = settings
        self.simulators: dict[Network, Simulator] = {}
        self.entry_points: dict[Network, dict[str, Version]] = {}
        bounds = Bounds(frames=settings.max_frames, logs=settings.max_logs)
        for key, net in networks.items():
            if net.family != "evm" or key not in pools:
                continue
            manifest = load_manifest(net.manifest) if net.manifest else None
            chain_id = net.chain_id or (manifest.chain_id if manifest is not None else None)
            symbol, name = native_currency(chain_id)
            self.simulators[key] = Simulator(
                key,
                Node(pools[key], settings.max_answer_bytes),
                Capabilities(),
                engine=settings.engine,
                bounds=bounds,
                native=Native(symbol, name),
                facts=metadata.get(key),
            )
            self.entry_points[key] = {
                entry_point_address(net.wallets.entry_points, manifest, v).lower(): v
                for v in VERSIONS
            }
        self._limiter = trio.CapacityLimiter(settings.max_concurrent)
        # Simulations by (network, method, outcome): ok, reverted, refused, failed.
        self.counts: defaultdict[tuple[Network, str, str], int] = defaultdict(int)

    # --- the service protocol --------------------------------------------------------------

    async def run(self, nursery: trio.Nursery) -> None:
        """Nothing runs in the background: upstreams are probed on the first simulation."""

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """No rows of its own."""

    def shutdown(self) -> None:
        pass

    def register_metrics(self, registry: Registry) -> None:
        def simulations() -> list[Sample]:
            samples: list[Sample] = []
            for (key, method, outcome), n in sorted(self.counts.items()):
                labels = {"chain": key.chain, "network": key.network, "method": method}
                samples.append(({**labels, "outcome": outcome}, n))
            return samples

        def engines() -> list[Sample]:
            samples: list[Sample] = []
            for key, simulator in sorted(self.simulators.items()):
                for engine, n in simulator.answered.items():
                    labels = {"chain": key.chain, "network": key.network, "engine": engine}
                    samples.append((labels, n))
            return samples

        registry.family(
            "chaingate_simulations_total",
            "counter",
            "Simulations answered, by method and outcome (ok: ran; reverted: the transaction "
            "would revert; refused: the request was wrong or over a bound; failed: the node).",
            simulations,
        )
        registry.family(
            "chaingate_simulation_engine_total",
            "counter",
            "Simulations by the node call that answered them (eth_simulateV1 or debug_traceCall).",
            engines,
        )

    def reference(self) -> list[dict[str, str]]:
        """The methods as the dashboard's API reference lists them."""
        aliases = {own: alias for alias, own in ALIASES.items()}
        return [
            {
                "method": method,
                "alias": aliases[method],
                "params": params,
                "summary": summary,
                "paths": "/v1/rpc/{chain}/{network}"
                + (", /v1/bundler/{chain}/{network}" if method in BUNDLER_METHODS else ""),
            }
            for method, (params, summary) in REFERENCE.items()
        ]

    def register_proxy(self, services: Mapping[Network, RpcService]) -> None:
        """Every simulation method on each simulated network's ``/v1/rpc`` endpoint."""
        for key, service in services.items():
            if key not in self.simulators:
                continue
            for method in METHODS:
                service.answer_locally(method, self._proxied(key, method))

    def register_rpc(self, endpoints: Mapping[Network, LocalRpc], costs: dict[str, int]) -> None:
        """The UserOperation method on each network's ``/v1/bundler`` endpoint."""
        for key, endpoint in endpoints.items():
            if key not in self.simulators:
                continue
            for method in BUNDLER_METHODS:
                endpoint.register(method, self._bundler(key, method), costs[method])

    def _proxied(self, key: Network, method: str) -> LocalAnswer:
        async def answer(params: bytes | None, principal: object) -> Outcome:
            try:
                decoded = _decode.decode(params) if params else []
            except msgspec.DecodeError:
                return None, _error(INVALID_PARAMS, "params are not JSON")
            try:
                return _encode(await self.simulate(key, method, decoded, principal)), None
            except SimulationFault as fault:
                return None, _error(fault.code, fault.message, fault.data)
            except UpstreamError as exc:
                return None, client_error(exc, write=False)

        return answer

    def _bundler(self, key: Network, method: str) -> Handler:
        async def answer(params: Any, principal: object) -> object:
            try:
                return await self.simulate(key, method, params, principal)
            except SimulationFault as fault:
                raise RpcFault(fault.code, fault.message, fault.data) from None
            except UpstreamError as exc:
                error = _decode.decode(client_error(exc, write=False))
                raise RpcFault(error["code"], error["message"], error.get("data")) from None

        return answer

    # --- simulating ------------------------------------------------------------------------

    async def simulate(
        self, key: Network, method: str, params: Any, principal: object = None
    ) -> Any:
        """``method``'s answer (an alias answers as its ``chaingate_`` method) for positional
        ``params`` on network ``key``; SimulationFault or UpstreamError.  The caller's key's
        contract allowlist, if it has one, holds for every transaction as for an eth_call, and
        for a UserOperation's sender, factory and paymaster."""
        kind = METHODS[method]
        outcome = "failed"
        try:
            simulator = self.simulators.get(key)
            if simulator is None:
                served = ", ".join(sorted(self.simulators)) or "none"
                raise SimulationFault(
                    NOT_SERVED, f"simulations are not served for {key} (served: {served})"
                )
            if not isinstance(params, list):
                raise p.BadParams("params must be an array")
            allow = getattr(principal, "allow", None)
            result = await self._run(simulator, kind, params, allow)
            outcome = "reverted" if _reverted(result) else "ok"
            return result
        except p.BadParams as exc:
            outcome = "refused"
            raise SimulationFault(INVALID_PARAMS, f"invalid params: {exc}") from None
        except BundlerFault as exc:
            outcome = "refused"
            raise SimulationFault(INVALID_PARAMS, exc.message, exc.data) from None
        except (TooLarge, TooLargeAnswer) as exc:
            outcome = "refused"
            limit = exc.limit
            raise SimulationFault(
                LIMIT_EXCEEDED,
                f"simulation too large: {exc} (simulation.max_frames, max_logs, max_answer_bytes)",
                {"reason": "simulation_too_large", "limit": limit},
            ) from None
        except SimulationFault as fault:
            outcome = "refused" if fault.code in _REFUSALS else "failed"
            raise
        finally:
            self.counts[(key, ALIASES.get(method, method), outcome)] += 1

    async def _run(
        self, simulator: Simulator, kind: Kind, params: list[Any], allow: Policy | None
    ) -> Any:
        timeout = self.settings.timeout
        deadline = trio.current_time() + timeout
        with trio.move_on_at(deadline) as scope:
            try:  # a free slot is taken without a trip through the scheduler
                self._limiter.acquire_nowait()
            except trio.WouldBlock:
                await self._limiter.acquire()
            try:
                return await self._dispatch(simulator, kind, params, deadline, allow)
            finally:
                self._limiter.release()
        assert scope.cancelled_caught
        raise SimulationFault(
            LIMIT_EXCEEDED,
            f"simulation too slow: not done in {timeout:g} s (simulation.timeout)",
            {"reason": "simulation_timeout", "limit": timeout},
        )

    async def _dispatch(
        self,
        simulator: Simulator,
        kind: Kind,
        params: list[Any],
        deadline: float,
        allow: Policy | None,
    ) -> Any:
        if kind == "assets":
            tx, block, overrides = _positional(params, 3)
            txs = _allowed([p.transaction(tx)], allow)
            return (await simulator.asset_changes(txs, block, overrides, deadline))[0]
        if kind == "bundle":
            txs_raw, block, overrides = _positional(params, 3)
            txs = _allowed(self._bundle(txs_raw), allow)
            return await simulator.asset_changes(txs, block, overrides, deadline)
        if kind == "execution":
            fmt = "FLAT"
            if params and isinstance(params[0], str):
                fmt = params[0].upper()
                if fmt not in _FORMATS:
                    raise p.BadParams("format: expected FLAT or NESTED")
                params = params[1:]
            tx, block, overrides = _positional(params, 3)
            (checked,) = _allowed([p.transaction(tx)], allow)
            return await simulator.execution(
                checked,
                block,
                overrides,
                "NESTED" if fmt == "NESTED" else "FLAT",
                deadline,
            )
        op_raw, entry_raw, block, overrides = _positional(params, 4)
        entry_point = p.address("entryPoint", entry_raw)
        version = self.entry_points[simulator.network].get(entry_point)
        if version is None:
            served = ", ".join(
                f"v{v} at {a}" for a, v in self.entry_points[simulator.network].items()
            )
            raise p.BadParams(f"entryPoint: not an EntryPoint of {simulator.label} ({served})")
        op = parse_user_operation(op_raw, version)
        _allowed([{"to": contract} for contract in _contracts_of(op)], allow)
        return await simulator.user_operation(op, entry_point, version, block, overrides, deadline)

    def _bundle(self, value: object) -> list[dict[str, Any]]:
        limit = self.settings.max_bundle
        if not isinstance(value, list) or not value:
            raise p.BadParams("transactions: expected a non-empty array")
        if len(value) > limit:
            raise p.BadParams(f"transactions: at most {limit} per bundle (simulation.max_bundle)")
        return [p.transaction(tx, f"transactions[{i}]") for i, tx in enumerate(value)]


def _positional(params: list[Any], count: int) -> list[Any]:
    """``count`` positional values: the last two are always a block and state overrides."""
    if len(params) > count or len(params) < count - 2:
        raise p.BadParams(f"expected {count - 2} to {count} params, got {len(params)}")
    values = list(params) + [None] * (count - len(params))
    values[-2] = p.block_param(values[-2])
    values[-1] = p.state_overrides(values[-1])
    return values


def _allowed(txs: list[dict[str, Any]], allow: Policy | None) -> list[dict[str, Any]]:
    """``txs``, each one a call the key's contract allowlist lets it make (as an eth_call)."""
    if allow is not None:
        for tx in txs:
            refused = allow.contract_refusal("eth_call", _encode([tx]))
            if refused is not None:
                raise SimulationFault(*refused)
    return txs


def _contracts_of(op: UserOperation) -> list[str]:
    """The contracts an operation calls through the EntryPoint: its sender, the factory that
    deploys it (not v0.8's EIP-7702 marker) and its paymaster."""
    contracts = [op.sender]
    if op.deploys and op.factory is not None:
        contracts.append(op.factory)
    if op.paymaster is not None:
        contracts.append(op.paymaster)
    return contracts


def _reverted(result: object) -> bool:
    if isinstance(result, list):
        return any(_reverted(item) for item in result)
    return isinstance(result, dict) and bool(result.get("error"))


def _error(code: int, message: str, data: object = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encode(error)
