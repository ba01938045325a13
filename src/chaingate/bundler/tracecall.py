"""Running the validation simulation under ``debug_traceCall`` with the collector tracer.

The call and state override are ``simulation.validation_call``'s (v0.7 puts
EntryPointSimulations at the EntryPoint's address); the override goes in the trace config as
``stateOverrides`` (geth's place for it; anvil 1.7.1 reads it there and refuses a fourth
parameter).  The tracer's answer carries the simulation's own return or revert data, so one
round trip gives both the ValidationResult and what ``rules.check_rules`` judges.

After the trace, the code hash of every contract the validation touched is read at the same
block: the bundler compares them again before bundling (code changed -> drop).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from chaingate.aa.userop import UserOperation, Version, require_version
from chaingate.bundler import opcodes
from chaingate.bundler.errors import SIMULATION_REJECTED, BundlerFault
from chaingate.bundler.jscollector import COLLECTOR_JS
from chaingate.bundler.simulation import NodeClient, node_batch, simulations_for, validation_call
from chaingate.chain.client import RpcCallError

__all__ = [
    "Call",
    "CodeAccess",
    "Phase",
    "SlotAccess",
    "Trace",
    "code_hashes",
    "parse_trace",
    "trace_config",
    "trace_validation",
]

TRACE_TIMEOUT = "10s"  # geth's tracer timeout (its default is 5 s); anvil ignores it


class SlotAccess(msgspec.Struct, frozen=True):
    """Slots (0x-hex words) read and written in one contract, with how often."""

    r: dict[str, int] = {}
    w: dict[str, int] = {}


class CodeAccess(msgspec.Struct, frozen=True):
    """An address touched by EXTCODE* or *CALL: its code size then (-1: a precompile)."""

    size: int
    op: str


class Call(msgspec.Struct, frozen=True, rename={"from_": "from"}):
    type: str  # CALL, STATICCALL, DELEGATECALL, CALLCODE, CREATE, CREATE2
    from_: str
    to: str  # for CREATE/CREATE2 the new contract
    method: str  # the first 4 bytes of the input, "0x" when empty
    value: str  # 0x-hex wei


class Phase(msgspec.Struct, frozen=True):
    """One call the EntryPoint made (factory, account, paymaster...) and all it did."""

    target: str
    method: str
    opcodes: dict[str, dict[str, int]] = {}  # opcode -> contract -> count (noteworthy only)
    storage: dict[str, SlotAccess] = {}  # contract -> slots
    code: dict[str, CodeAccess] = {}  # address -> code size at first access
    calls: list[Call] = []
    ext: dict[str, dict[str, int]] = {}  # EXTCODE* of the EntryPoint -> contract -> count
    oog: bool = False


class Trace(msgspec.Struct, frozen=True, rename={"entry_point": "entryPoint"}):
    phases: list[Phase]
    keccak: list[str]  # KECCAK256 preimages whose first word may be an address
    entry_point: str | None
    overflow: bool  # a cap was hit: the trace is incomplete
    output: str  # the simulation's return or revert data
    error: str | None  # set when the simulation reverted
    code_hashes: dict[str, str] = {}  # address -> keccak(code), filled after the trace
    failed: str | None = None  # a tracer hook failed (caught): the trace cannot be judged

    @property
    def reverted(self) -> bool:
        return self.error is not None

    def touched(self) -> list[str]:
        """Every non-precompile address whose code the validation touched, sorted."""
        found = {addr for phase in self.phases for addr, c in phase.code.items() if c.size >= 0}
        found.update(phase.target for phase in self.phases)
        return sorted(found)


def trace_config(override: dict[str, Any] | None) -> dict[str, Any]:
    config: dict[str, Any] = {"tracer": COLLECTOR_JS, "timeout": TRACE_TIMEOUT}
    if override:
        config["stateOverrides"] = override
    return config


def parse_trace(raw: object) -> Trace:
    """The tracer's JSON answer, typed; a malformed one is the node's fault."""
    try:
        return msgspec.convert(raw, Trace)
    except msgspec.ValidationError as exc:
        raise RpcCallError("debug_traceCall", -32603, f"unexpected tracer output: {exc}") from None


async def code_hashes(
    client: NodeClient, addresses: Iterable[str], block: str = "latest"
) -> dict[str, str]:
    """address (lower-case) -> 0x-hex keccak of its code at ``block``: one JSON-RPC batch with
    a client that has them (a bundle's check names ~2 addresses per operation), else
    concurrent calls; the hashes through ``opcodes.CODES`` (the same few codes each time)."""
    wanted = list(dict.fromkeys(a.lower() for a in addresses))
    codes = await node_batch(client, [("eth_getCode", [address, block]) for address in wanted])
    found: dict[str, str] = {}
    for address, code in zip(wanted, codes, strict=True):
        if isinstance(code, RpcCallError):
            raise code
        if not isinstance(code, str) or code[:2] not in ("0x", "0X"):
            raise RpcCallError("eth_getCode", -32603, f"non-hex code {code!r}")
        try:
            found[address] = "0x" + opcodes.CODES.get(code)[1].hex()
        except ValueError:
            raise RpcCallError("eth_getCode", -32603, f"non-hex code {code[:80]!r}") from None
    return found


async def trace_validation(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations_code: bytes | None,
) -> tuple[bytes, bool, Trace]:
    """(simulation return/revert data, reverted, Trace with code hashes) of ``op``'s validation.

    The block is pinned first so the trace and the code hashes see the same state.  A node
    without ``debug_traceCall`` (or without JS tracers) raises RpcCallError: the caller
    decides whether to fall back to unsafe mode.
    """
    version = require_version(version)
    tx, override = validation_call(
        op, entry_point, version, simulations_code or simulations_for(version)
    )
    block = await client.call("eth_blockNumber", [])
    if not isinstance(block, str):
        raise RpcCallError("eth_blockNumber", -32603, f"non-hex block number {block!r}")
    raw = await client.call("debug_traceCall", [tx, block, trace_config(override)])
    trace = parse_trace(raw)
    if not trace.phases and not trace.reverted:
        raise BundlerFault(SIMULATION_REJECTED, "the simulation made no call from the EntryPoint")
    try:
        data = bytes.fromhex(trace.output[2:])
    except ValueError:
        raise RpcCallError("debug_traceCall", -32603, "tracer output is not hex") from None
    entry = entry_point.lower()
    hashes = await code_hashes(client, [a for a in trace.touched() if a != entry], block)
    return data, trace.reverted, msgspec.structs.replace(trace, code_hashes=hashes)
