"""One network's simulations: which node call answers each, and the results' shapes.

* Asset changes (one transaction or a bundle): ``eth_simulateV1`` where an upstream has it —
  one call, the bundle's transactions in one block, each seeing the previous one's effects —
  else ``debug_traceCall`` per transaction, the previous ones' effects carried as state
  overrides (``overrides.py``), on one block pinned by hash (``pending``, which has none,
  by name).
* Execution: ``debug_traceCall`` (only a trace has the call tree).
* A UserOperation: its asset changes as ``simulateHandleOp`` runs it (``userops.py``), by the
  same engines.

``engine`` (``simulation.engine``) forces one engine; ``auto`` picks as above.  Results are
built by ``assets.py`` and ``known.py``; errors are ``SimulationFault`` (a JSON-RPC code, a
message, data).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import trio

from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler.sanity import required_prefund
from chaingate.config.network import Network
from chaingate.simulation import known
from chaingate.simulation.assets import Native, RawChange, TokenFacts, changes_of, describe
from chaingate.simulation.execution import (
    MAX_DEPTH,
    Bounds,
    Frame,
    Outcome,
    SimulatedCall,
    TooLarge,
    from_simulate_v1,
    from_trace,
    in_order,
)
from chaingate.simulation.nodes import Capabilities, Feature, Node, NodeError, Unsupported
from chaingate.simulation.overrides import fold_diff
from chaingate.simulation.params import BlockParam
from chaingate.simulation.userops import decode_result, simulation_call, simulation_state

__all__ = ["Engine", "SimulationFault", "Simulator"]

Engine = Literal["auto", "simulate_v1", "trace_call"]
Format = Literal["FLAT", "NESTED"]

# JSON-RPC codes of the faults (REST maps them to statuses).
INVALID_PARAMS = -32602
NOT_SERVED = -32601  # no simulation on that network (REST 404, as an unknown network)
NOT_SUPPORTED = -32004  # EIP-1474: no upstream can run this simulation
LIMIT_EXCEEDED = -32005  # EIP-1474: too large or too slow
NODE_ERROR = -32000  # the node refused the simulation (its message is passed on)

# Seconds a simulation waits for the facts of a token the metadata service never saw (then
# its symbol, name and decimals are null: the changes themselves are never held back).
METADATA_WAIT = 5.0
_CALL_TRACER = {"tracer": "callTracer", "tracerConfig": {"withLog": True}}
_PRESTATE_DIFF = {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}}
# The tags a bundle's traces resolve to one block's hash first.  Not "pending": the pending
# block has no hash (geth answers null; anvil one it cannot trace on), so each trace asks for
# it by name.
_PINNED_TAGS = frozenset({"latest", "safe", "finalized", "earliest"})


class SimulationFault(Exception):
    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class _SimBlock(msgspec.Struct):
    calls: list[SimulatedCall] = []


class _Header(msgspec.Struct):
    hash: str


_blocks = msgspec.json.Decoder(list[_SimBlock])
_frame = msgspec.json.Decoder(Frame)
_header = msgspec.json.Decoder(_Header | None)
_any = msgspec.json.Decoder()


class Simulator:
    def __init__(
        self,
        network: Network,
        node: Node,
        capabilities: Capabilities,
        *,
        engine: Engine,
        bounds: Bounds,
        native: Native,
        facts: TokenFacts | None,
    ) -> None:
        self.network = network
        self.label = str(network)
        self.node = node
        self.capabilities = capabilities
        self.engine = engine
        self.bounds = bounds
        self.native = native
        self.facts = facts
        # Which engine answered, by name (the bench and /metrics read it).
        self.answered: dict[str, int] = {"simulate_v1": 0, "trace_call": 0}

    # --- picking an upstream -------------------------------------------------------------------

    async def _pick(self, needs: Sequence[Feature]) -> tuple[bool, str | None]:
        """(whether some upstream may run it, the one to ask first): the best-ranked upstream
        known to have every feature of ``needs``; else (True, None) while some upstream is not
        known to lack one (the pool picks; its answer teaches); else (False, None)."""
        await self.capabilities.ensure(self.node)
        known = self.capabilities.known
        ranked = self.node.ranked()
        for upstream in ranked:
            if all(known.get(upstream, {}).get(f) for f in needs):
                return True, upstream
        possible = any(all(known.get(u, {}).get(f) is not False for f in needs) for u in ranked)
        return possible, None

    async def _engine_for_assets(self, bundle: int) -> tuple[str, str | None]:
        """(engine, upstream to ask first) for asset changes; SimulationFault when none can."""
        trace_needs: list[Feature] = ["call_tracer"]
        if bundle > 1:
            trace_needs.append("prestate_diff")
        options: list[tuple[str, list[Feature]]] = []
        if self.engine in ("auto", "simulate_v1"):
            options.append(("simulate_v1", ["simulate_v1"]))
        if self.engine in ("auto", "trace_call"):
            options.append(("trace_call", trace_needs))
        fallback: str | None = None
        for engine, needs in options:
            possible, prefer = await self._pick(needs)
            if prefer is not None:
                return engine, prefer
            if possible and fallback is None:
                fallback = engine
        if fallback is None:
            raise self._unsupported([f for _, needs in options for f in needs])
        return fallback, None

    def _unsupported(self, features: Sequence[Feature]) -> SimulationFault:
        wanted = " or ".join(dict.fromkeys(features))
        return SimulationFault(
            NOT_SUPPORTED,
            f"no upstream of {self.label} can run this simulation (it needs {wanted}; "
            "see simulation.engine)",
            {"reason": "not_supported", "needs": list(dict.fromkeys(features))},
        )

    # --- the node calls ------------------------------------------------------------------------

    async def _calls(
        self,
        calls: Sequence[tuple[Feature, str, Sequence[Any]]],
        deadline: float,
        prefer: str | None,
    ) -> list[bytes]:
        """Each call's raw result, in one request; what each answer says of its feature on
        the upstream that gave it is noted."""
        upstream, outcomes = await self.node.batch(
            [(method, params) for _, method, params in calls], deadline, prefer
        )
        results: list[bytes] = []
        for (feature, _, _), outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, NodeError):
                if outcome.missing:
                    self.capabilities.note(upstream, feature, False)
                    raise Unsupported(upstream, feature)
                raise SimulationFault(
                    NODE_ERROR,
                    f"the node refused the simulation: {outcome.message}",
                    {"reason": "node_error", "code": outcome.code, "data": outcome.data},
                )
            self.capabilities.note(upstream, feature, True)
            results.append(outcome)
        return results

    async def _simulate_v1(
        self,
        txs: Sequence[dict[str, Any]],
        block: BlockParam,
        overrides: Mapping[str, Any],
        deadline: float,
        prefer: str | None,
    ) -> list[Outcome]:
        state_calls: dict[str, Any] = {"calls": list(txs)}
        if overrides:
            state_calls["stateOverrides"] = overrides
        payload = {"blockStateCalls": [state_calls], "traceTransfers": True, "validation": False}
        (raw,) = await self._calls(
            [("simulate_v1", "eth_simulateV1", [payload, block])], deadline, prefer
        )
        try:
            blocks = _blocks.decode(raw)
            calls = blocks[0].calls if blocks else []
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise SimulationFault(
                NODE_ERROR, "the node's eth_simulateV1 answer is unreadable"
            ) from None
        if len(calls) != len(txs):
            raise SimulationFault(NODE_ERROR, "the node's eth_simulateV1 answer lacks calls")
        self.answered["simulate_v1"] += 1
        return [from_simulate_v1(call, self.bounds) for call in calls]

    async def _trace(
        self,
        txs: Sequence[dict[str, Any]],
        block: BlockParam,
        overrides: Mapping[str, Any],
        deadline: float,
        prefer: str | None,
    ) -> list[Outcome]:
        if len(txs) > 1 and isinstance(block, str) and block in _PINNED_TAGS:
            block = await self._pin(block, deadline, prefer)
        state = {address: dict(entry) for address, entry in overrides.items()}
        outcomes: list[Outcome] = []
        for index, tx in enumerate(txs):
            config = dict(_CALL_TRACER, stateOverrides=state) if state else _CALL_TRACER
            calls: list[tuple[Feature, str, Sequence[Any]]] = [
                ("call_tracer", "debug_traceCall", [tx, block, config])
            ]
            last = index == len(txs) - 1
            if not last:
                diff = dict(_PRESTATE_DIFF, stateOverrides=state) if state else _PRESTATE_DIFF
                calls.append(("prestate_diff", "debug_traceCall", [tx, block, diff]))
            raws = await self._calls(calls, deadline, prefer)
            try:
                root = _frame.decode(raws[0])
                if not last:
                    state = fold_diff(state, _any.decode(raws[1]))
            except RecursionError:  # nested past what can be read: past MAX_DEPTH anyway
                raise TooLarge("levels of nested calls", MAX_DEPTH) from None
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError, AttributeError):
                raise SimulationFault(NODE_ERROR, "the node's trace is unreadable") from None
            outcomes.append(from_trace(root, self.bounds))
        self.answered["trace_call"] += 1
        return outcomes

    async def _pin(self, tag: str, deadline: float, prefer: str | None) -> str:
        """A named block as its hash: every transaction of a bundle runs on the same one."""
        _, (outcome,) = await self.node.batch(
            [("eth_getBlockByNumber", [tag, False])], deadline, prefer
        )
        if isinstance(outcome, NodeError):
            raise SimulationFault(NODE_ERROR, f"the node refused the block: {outcome.message}")
        try:
            header = _header.decode(outcome)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise SimulationFault(NODE_ERROR, f"the node's block {tag} is unreadable") from None
        if header is None:
            raise SimulationFault(INVALID_PARAMS, f"no block {tag} on {self.label}")
        return header.hash

    async def _outcomes(
        self,
        txs: Sequence[dict[str, Any]],
        block: BlockParam,
        overrides: Mapping[str, Any],
        deadline: float,
    ) -> list[Outcome]:
        for _ in range(3):  # a capability learnt the hard way: pick again
            engine, prefer = await self._engine_for_assets(len(txs))
            try:
                if engine == "simulate_v1":
                    return await self._simulate_v1(txs, block, overrides, deadline, prefer)
                return await self._trace(txs, block, overrides, deadline, prefer)
            except Unsupported:
                continue
        raise self._unsupported(["simulate_v1", "call_tracer"])

    # --- the three simulations -----------------------------------------------------------------

    async def asset_changes(
        self,
        txs: Sequence[dict[str, Any]],
        block: BlockParam,
        overrides: Mapping[str, Any],
        deadline: float,
    ) -> list[dict[str, Any]]:
        """One result per transaction: ``{changes, gasUsed, error}``."""
        outcomes = await self._outcomes(txs, block, overrides, deadline)
        raw = [changes_of(outcome.events) for outcome in outcomes]
        described = await self._describe([c for changes in raw for c in changes], deadline)
        results = []
        at = 0
        for outcome, changes in zip(outcomes, raw, strict=True):
            mine, at = described[at : at + len(changes)], at + len(changes)
            results.append(
                {"changes": mine, "gasUsed": hex(outcome.gas_used), "error": error_of(outcome)}
            )
        return results

    async def _describe(self, raw: Sequence[RawChange], deadline: float) -> list[Any]:
        wait = max(0.0, min(METADATA_WAIT, deadline - trio.current_time() - 0.5))
        return await describe(raw, self.native, self.facts, wait)

    async def execution(
        self,
        tx: dict[str, Any],
        block: BlockParam,
        overrides: Mapping[str, Any],
        fmt: Format,
        deadline: float,
    ) -> dict[str, Any]:
        """The call tree and logs, decoded where known (Alchemy's FLAT or NESTED shape)."""
        for _ in range(3):  # a capability learnt the hard way: pick again
            possible, prefer = await self._pick(["call_tracer"])
            if not possible:
                break
            try:
                (outcome,) = await self._trace([tx], block, overrides, deadline, prefer)
            except Unsupported:
                continue
            return execution_result(outcome, fmt)
        raise self._unsupported(["call_tracer"])

    async def user_operation(
        self,
        op: UserOperation,
        entry_point: str,
        version: Version,
        block: BlockParam,
        overrides: Mapping[str, Any],
        deadline: float,
    ) -> dict[str, Any]:
        """The operation's asset changes as simulateHandleOp runs it, with who pays its gas."""
        call = simulation_call(op, entry_point, version)
        state = {address: dict(entry) for address, entry in overrides.items()}
        for address, entry in simulation_state(op, entry_point, version).items():
            state.setdefault(address, {}).update(entry)  # ours win: the code must be ours
        (outcome,) = await self._outcomes([call], block, state, deadline)
        result = decode_result(outcome.output) if outcome.ok else None
        changes = changes_of(outcome.events)
        error = error_of(outcome)
        if outcome.ok and result is None:
            error = {"message": "simulateHandleOp answered no ExecutionResult"}
        if error is None:
            error = _execution_revert(outcome.events)
        payer = op.paymaster.lower() if op.paymaster else op.sender.lower()
        prefund = required_prefund(op, version)
        described = await self._describe(changes, deadline)
        answer: dict[str, Any] = {
            "changes": described,
            "error": error,
            "entryPoint": entry_point.lower(),
            "entryPointVersion": version,
            "sender": op.sender.lower(),
            "gas": {
                "payer": payer,
                "sponsored": op.paymaster is not None,
                "maxCost": str(prefund),
                "cost": str(result.paid) if result is not None else None,
            },
        }
        if result is not None:
            answer["validation"] = {
                "accountSignatureValid": not result.account_sig_failed,
                "paymasterSignatureValid": not result.paymaster_sig_failed,
                "validAfter": result.valid_after,
                "validUntil": result.valid_until,
            }
        return answer


# --- results --------------------------------------------------------------------------------


def error_of(outcome: Outcome) -> dict[str, Any] | None:
    """Alchemy's ``error`` (``{message}``), the revert decoded beside it."""
    if outcome.ok:
        return None
    if not outcome.output:
        return {"message": outcome.failure or "execution failed"}
    return revert_error("execution reverted", outcome.output)


def revert_error(what: str, data: bytes) -> dict[str, Any]:
    revert = known.revert_of(data)
    return {
        "message": f"{what}: {revert.message}",
        "revert": msgspec.to_builtins(revert),
        "data": "0x" + data.hex(),
    }


_REVERT_REASON = known.event("UserOperationRevertReason")


def _execution_revert(events: Sequence[Any]) -> dict[str, Any] | None:
    """The operation's own call reverted: the EntryPoint's UserOperationRevertReason."""
    for event in events:
        topics = getattr(event, "topics", None)
        if not topics or topics[0].lower() != _REVERT_REASON.topic:
            continue
        try:
            args = _REVERT_REASON.decode_log(topics, bytes.fromhex(event.data[2:]))
            data = bytes.fromhex(str(args[-1]["value"])[2:])
        except ValueError:
            continue
        return revert_error("the operation's call reverted", data)
    return None


def execution_result(outcome: Outcome, fmt: Format) -> dict[str, Any]:
    """Alchemy's simulateExecution answer from a trace: FLAT, every call depth first; NESTED,
    each call with its ``calls`` and ``logs``; ``logs``, those that took effect, in the order
    they were emitted.  Walked with a stack, not recursion: a call tree may be 1,024 deep."""
    root = outcome.root
    assert root is not None
    logs: list[dict[str, Any]] = []
    flat: list[dict[str, Any]] = []
    top = _call_entry(root)
    # A call (its frame, its entry, whether its logs took effect) or a log (and the same).
    stack: list[tuple[Frame | None, dict[str, Any], bool]] = [(root, top, root.error is None)]
    while stack:
        frame, entry, counted = stack.pop()
        if frame is None:
            if counted:
                logs.append(entry)
            continue
        flat.append(entry)
        calls: list[dict[str, Any]] = []
        emitted: list[dict[str, Any]] = []
        later: list[tuple[Frame | None, dict[str, Any], bool]] = []
        for item in in_order(frame):
            if isinstance(item, Frame):
                child = _call_entry(item)
                calls.append(child)
                later.append((item, child, counted and item.error is None))
            else:
                log = _log_entry(item.address, item.topics, item.data)
                emitted.append(log)
                later.append((None, log, counted))
        if fmt == "NESTED":
            entry["calls"], entry["logs"] = calls, emitted
        stack.extend(reversed(later))
    result: dict[str, Any] = {"calls": [top] if fmt == "NESTED" else flat, "logs": logs}
    error = error_of(outcome)
    if error is not None:
        result["error"] = error["message"]
        revert = error.get("revert")
        result["revertReason"] = revert["message"] if revert else error["message"]
    return result


def _call_entry(frame: Frame) -> dict[str, Any]:
    input_data = _hex_bytes(frame.input)
    output = _hex_bytes(frame.output)
    call: dict[str, Any] = {
        "type": frame.type,
        "from": frame.sender.lower(),
        "to": (frame.to or "").lower(),
        "value": frame.value or "0x0",
        "gas": frame.gas or "0x0",
        "gasUsed": frame.gasUsed or "0x0",
        "input": frame.input,
        "output": frame.output or "0x",
    }
    if frame.error is not None:
        call["error"] = frame.error
        if output:
            call["revertReason"] = known.revert_of(output).message
    decoded = known.decode_call(input_data, output if frame.error is None else None)
    if decoded is not None:
        call["decoded"] = decoded
    return call


def _log_entry(address: str, topics: list[str], data: str) -> dict[str, Any]:
    log: dict[str, Any] = {"address": address.lower(), "topics": topics, "data": data}
    decoded = known.decode_log(topics, _hex_bytes(data))
    if decoded is not None:
        log["decoded"] = decoded
    return log


def _hex_bytes(value: str | None) -> bytes:
    if not value or len(value) < 3:
        return b""
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        return b""
