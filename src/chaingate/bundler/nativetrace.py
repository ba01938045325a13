"""A fast, sound shortcut for safe-mode validation: the JS collector's ``Trace`` rebuilt from
anvil's native tracers, or a reason to run the exact (JS) path instead.

Why: a JS tracer with a ``step`` hook costs ~13 us per opcode on anvil (boa), ~130 ms for one
SimpleAccount validation; the native tracers together cost ~10 ms.  What they give:

* ``callTracer`` — every frame (type, from, to, input, value, output, error) in DFS preorder,
  and the simulation's return or revert data in the top frame;
* ``prestateTracer`` — every account the call loaded, its code and the storage slots it read
  or wrote (also in frames that reverted);
* the struct logger without stack, memory or storage — each step's opcode name and depth.

``build_trace`` walks the steps, entering the next callTracer frame at each *CALL/CREATE step
(a frame without code has no deeper steps), so every step knows its frame and storage context
(DELEGATECALL/CALLCODE run in the caller's).  From that it fills H4's ``Trace`` so
``rules.check_trace`` judges it unchanged: phases (the EntryPoint's depth-1 calls), noteworthy
opcodes by context, GAS not followed by a call, calls, code size of each call target at that
moment, out-of-gas.  Where it cannot know what the JS collector knew it is *stricter*, never
laxer, so a fast acceptance implies an exact one:

* storage: in each phase, every context that ran SLOAD/SSTORE gets **all** the slots the whole
  call touched there (prestate), all of them written if an SSTORE ran there in that phase;
* KECCAK preimages: none (the memory is not read), so only a slot equal to an address counts as
  associated; an entity using ``mapping(address => ...)`` storage that needs the association
  falls back to the exact path.  (Synthesising ``keccak(A || n)`` preimages would not be
  sound: a contract may use such a slot without hashing it in the trace.)

It gives up (``Fallback``) when a judged phase needs what only the stack or memory shows:
EXTCODESIZE/EXTCODEHASH/EXTCODECOPY (the target and whether it is the EntryPoint), TLOAD/
TSTORE (transient storage is not in the prestate), SELFDESTRUCT, a LOG1 at depth 1 (the
collector stops at v0.7's ``BeforeExecution``), a frame error other than a revert, an opcode
it does not know, frames and steps that do not line up, a trace past the collector's caps, a
validation using more than ``MAX_GAS`` (the struct log grows with it), or a node without these
tracers.  The caller also falls back when ``check_trace`` refuses the fast trace: refusals
always come from the exact path, with its message.

Most validations need no struct log at all (``build_static``, H11): the EVM can only run the
opcodes ``opcodes.reachable`` finds in the code of each frame for the frame's selector, so
when no frame of a judged phase can run anything the collector would record or needs the stack
for, and the EntryPoint cannot emit a LOG1 at depth 1, the trace is rebuilt from callTracer and
prestateTracer alone (~1.5 ms instead of ~8 ms on anvil); otherwise the struct log is fetched.
Deploying operations too (issue 34): CREATE/CREATE2 are counted from their frames (anvil gives
every one a frame), and the factory phase's EXTCODE* targets are vouched for by the phase
replayed alone, run beside the two traces (``replay_call``, ``factory_oracle``).

Most need no prestateTracer either (the lean path, issue 34): its codes are ``eth_getCode`` at
the same block, asked for in callTracer's batch, and its slots matter to the rules only
outside the sender's and the EntryPoint's contexts — ``build_static(storage_known=False)``
says when (``fast_trace``).
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from chaingate.aa.userop import UserOperation, Version, require_version
from chaingate.bundler import jscollector, opcodes, rules
from chaingate.bundler.simulation import (
    NodeClient,
    node_batch,
    simulations_for,
    validation_call,
    wire_override,
)
from chaingate.bundler.tracecall import Call, CodeAccess, Phase, SlotAccess, Trace
from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import create_address
from chaingate.evm.keccak import keccak256

__all__ = [
    "MAX_GAS",
    "PLANS",
    "PRESTATE",
    "PROFILES",
    "STRUCT_LOG",
    "Fallback",
    "FastTrace",
    "build_static",
    "build_trace",
    "fast_trace",
]

# Above this much gas the struct log is not asked for: it grows with every step (~75 bytes
# each, at worst one step per gas).  A SimpleAccount deployment sponsored by a paymaster uses
# ~400k on v0.6.
MAX_GAS = 500_000

# Precompiles of every fork since Istanbul (ecrecover .. blake2f).  The collector asks the
# node (``isPrecompiled``); a newer precompile here would be treated as code-less (OP-062 ->
# fall back), never the other way round.
PRECOMPILES = frozenset("0x" + f"{n:040x}" for n in range(1, 10))

_CALLISH = frozenset({"CALL", "CALLCODE", "DELEGATECALL", "STATICCALL"})
_CREATES = frozenset({"CREATE", "CREATE2"})
_EXTCODE = frozenset({"EXTCODESIZE", "EXTCODECOPY", "EXTCODEHASH"})
_TRANSIENT = frozenset({"TLOAD", "TSTORE"})
# The opcodes the collector records by name (jscollector._NAMED), by the struct logger's names.
_NAMED = frozenset(
    {
        "BALANCE", "ORIGIN", "GASPRICE", "BLOCKHASH", "COINBASE", "TIMESTAMP", "NUMBER",
        "DIFFICULTY", "PREVRANDAO", "GASLIMIT", "SELFBALANCE", "BASEFEE", "BLOBHASH",
        "BLOBBASEFEE", "CREATE", "CREATE2", "INVALID", "SELFDESTRUCT",
    }
)  # fmt: skip
# Every other assigned (Cancun) opcode: nothing for a rule unless handled below.  A name in
# neither set (an unassigned opcode, a newer fork's) falls back.
_PLAIN = frozenset(
    {
        "STOP", "ADD", "MUL", "SUB", "DIV", "SDIV", "MOD", "SMOD", "ADDMOD", "MULMOD", "EXP",
        "SIGNEXTEND", "LT", "GT", "SLT", "SGT", "EQ", "ISZERO", "AND", "OR", "XOR", "NOT",
        "BYTE", "SHL", "SHR", "SAR", "KECCAK256", "SHA3", "ADDRESS", "CALLER", "CALLVALUE",
        "CALLDATALOAD", "CALLDATASIZE", "CALLDATACOPY", "CODESIZE", "CODECOPY",
        "RETURNDATASIZE", "RETURNDATACOPY", "CHAINID", "POP", "MLOAD", "MSTORE", "MSTORE8",
        "SLOAD", "SSTORE", "JUMP", "JUMPI", "PC", "MSIZE", "GAS", "JUMPDEST", "TLOAD",
        "TSTORE", "MCOPY", "PUSH0", "LOG0", "LOG1", "LOG2", "LOG3", "LOG4", "RETURN",
        "REVERT", "EXTCODESIZE", "EXTCODECOPY", "EXTCODEHASH",
        *_CALLISH,
        *(f"PUSH{n}" for n in range(1, 33)),
        *(f"DUP{n}" for n in range(1, 17)),
        *(f"SWAP{n}" for n in range(1, 17)),
    }
)  # fmt: skip
_OOG = re.compile(r"out ?of ?gas|oog", re.IGNORECASE)
_REVERT = frozenset({"execution reverted", "Reverted", "revert"})


class Fallback(msgspec.Struct, frozen=True):
    """The fast path cannot decide: run the exact (JS tracer) path.  ``reason`` says why."""

    reason: str


class FastTrace(msgspec.Struct, frozen=True):
    """What ``trace_validation`` returns, from the native tracers."""

    data: bytes  # the simulation's return or revert data
    reverted: bool
    trace: Trace


class _Step(msgspec.Struct, gc=False):
    op: str
    depth: int


class _StructLog(msgspec.Struct):
    failed: bool
    structLogs: list[_Step]
    returnValue: str = ""


class _Frame(msgspec.Struct, rename={"from_": "from"}):
    type: str
    from_: str
    to: str | None = None
    input: str = "0x"
    output: str | None = None
    error: str | None = None
    value: str | None = None
    gas: str = "0x0"
    gasUsed: str = "0x0"
    calls: list[_Frame] = []


class _Account(msgspec.Struct):
    code: str | None = None
    storage: dict[str, str] = {}


class _Unsure(Exception):
    """Raised inside ``build_trace``: becomes a Fallback."""


class _PhaseBuild:
    __slots__ = (
        "calls", "code", "extcode", "index", "method", "oog", "opcodes", "stored", "target",
        "touched_storage", "unsure",
    )  # fmt: skip

    def __init__(self, index: int, target: str, method: str) -> None:
        self.index = index
        self.target = target
        self.method = method
        self.opcodes: dict[str, dict[str, int]] = {}
        self.code: dict[str, CodeAccess] = {}
        self.calls: list[Call] = []
        self.oog = False
        self.touched_storage: set[str] = set()  # contexts that ran SLOAD/SSTORE
        self.stored: set[str] = set()  # contexts that ran SSTORE
        self.extcode: str | None = None  # the first EXTCODE* it ran (targets: the stack)
        self.unsure: str | None = None  # why this phase cannot be judged here

    def doubt(self, why: str) -> None:
        if self.unsure is None:
            self.unsure = why

    def count(self, opcode: str, where: str) -> None:
        m = self.opcodes.setdefault(opcode, {})
        m[where] = m.get(where, 0) + 1


class _Open:
    """A frame being executed: its callTracer node, storage context, next child to enter."""

    __slots__ = ("context", "frame", "next_child")

    def __init__(self, frame: _Frame, context: str) -> None:
        self.frame = frame
        self.context = context
        self.next_child = 0


def _hex_bytes(text: str | None) -> bytes:
    if not text:
        return b""
    if text[:2] not in ("0x", "0X"):
        raise _Unsure("non-hex data from the node")
    try:
        return bytes.fromhex(text[2:])
    except ValueError:
        raise _Unsure("non-hex data from the node") from None


def _code(text: str | None) -> tuple[bytes, bytes]:
    try:
        return opcodes.CODES.get(text or "0x")
    except ValueError:
        raise _Unsure("non-hex data from the node") from None


def _ran_out_of_gas(frame: _Frame) -> bool:
    """Out of gas in the frame's code: a precompile refusing too little gas is not (OP-062
    allows precompiles; the collector skips their frames too)."""
    return (
        frame.error is not None
        and _OOG.search(frame.error) is not None
        and (frame.to or "").lower() not in PRECOMPILES
    )


def _method(frame: _Frame) -> str:
    data = frame.input[2:10] if frame.input[:2] in ("0x", "0X") else ""
    return "0x" + data.lower()


def _call(frame: _Frame) -> Call:
    value = frame.value or "0x0"
    return Call(
        type=frame.type,
        from_=frame.from_.lower(),
        to=(frame.to or "0x" + "00" * 20).lower(),
        method=_method(frame),
        value="0x" + format(int(value, 16), "x") if value[:2] in ("0x", "0X") else "0x0",
    )


def build_trace(
    steps: list[_Step],
    root: _Frame,
    prestate: Mapping[str, _Account],
    op: UserOperation,
    *,
    entry_point: str,
    version: Version,
    factory_extcode_harmless: bool = False,
) -> FastTrace | Fallback:
    """The collector's Trace from the three native traces, or why it cannot be built soundly.
    ``factory_extcode_harmless``: ``factory_oracle`` found every EXTCODE* target of the
    factory phase harmless (else a judged phase running EXTCODE* falls back).
    Sans-IO: ``fast_trace`` fetches the inputs."""
    try:
        return _build(
            steps,
            root,
            prestate,
            op,
            entry_point.lower(),
            require_version(version),
            factory_extcode_harmless,
        )
    except _Unsure as why:
        return Fallback(str(why))


def _build(
    steps: list[_Step],
    root: _Frame,
    prestate: Mapping[str, _Account],
    op: UserOperation,
    entry_point: str,
    version: Version,
    factory_extcode_harmless: bool,
) -> FastTrace | Fallback:
    if root.to is None or root.to.lower() != entry_point:
        raise _Unsure("the traced call is not to the EntryPoint")
    walk = _StepWalk(root, entry_point, prestate)
    for step in steps:
        walk.step(step)
    walk.end()
    # The oracle replayed the first createSender phase (the one the rules judge as the
    # factory's); EXTCODE* anywhere else cannot be judged here.
    vouched = next((p for p in walk.phases if p.method == rules._CREATE_SENDER), None)
    for phase in walk.phases:
        if phase.extcode and not (factory_extcode_harmless and phase is vouched):
            phase.doubt(f"{phase.extcode} (its target is on the stack)")
    return _assemble(walk.phases, prestate, root, op, entry_point, version)


class _StepWalk:
    """The struct log's steps walked in order beside the callTracer frames (``build_trace``):
    each step's frame and storage context, what it counts for its phase.  Raises _Unsure."""

    def __init__(self, root: _Frame, entry_point: str, prestate: Mapping[str, _Account]) -> None:
        self.code_len = {a.lower(): len(_code(acc.code)[0]) for a, acc in prestate.items()}
        self.phases: list[_PhaseBuild] = []
        self.cur: _PhaseBuild | None = None
        self.frames = [_Open(root, entry_point)]
        self.entered: _Frame | None = None  # consumed by the previous step's *CALL/CREATE
        self.gas_at: tuple[_PhaseBuild, str] | None = None
        self.keccaks = 0
        self.calls = 0

    def step(self, step: _Step) -> None:
        depth = step.depth
        if self.entered is not None:
            self._enter(depth)
        while depth < len(self.frames):
            self._close()
        if depth != len(self.frames):
            raise _Unsure("call frames and steps do not line up (depth jump)")
        name = step.op
        if self.gas_at is not None:
            # GAS counts unless a *CALL follows (OP-012), as the collector's settle().
            if name not in _CALLISH:
                self.gas_at[0].count("GAS", self.gas_at[1])
            self.gas_at = None
        if name not in _PLAIN and name not in _NAMED:
            raise _Unsure(f"opcode {name} is not known to the fast path")
        if name in _CALLISH or name in _CREATES:
            self._call(name, depth)
        elif depth == 1:
            if name == "LOG1":
                raise _Unsure("a LOG1 at depth 1 (BeforeExecution?) needs the stack")
            if name == "SELFDESTRUCT":
                raise _Unsure("SELFDESTRUCT")
        elif self.cur is not None:
            self._opcode(self.cur, name, self.frames[-1].context)

    def end(self) -> None:
        if self.entered is not None:
            self._finish(self.entered)
        while self.frames:
            self._close()
        if self.keccaks > jscollector.MAX_KECCAK:
            raise _Unsure("more KECCAK256 than the collector keeps")
        if self.gas_at is not None:
            self.gas_at[0].count("GAS", self.gas_at[1])

    def _enter(self, depth: int) -> None:
        """The frame the previous *CALL/CREATE step made: entered if this step is in it."""
        entered, parent = self.entered, self.frames[-1]
        assert entered is not None
        if depth == len(self.frames) + 1:
            if entered.type in ("DELEGATECALL", "CALLCODE"):
                context = parent.context
            elif entered.to:
                context = entered.to.lower()
            else:
                raise _Unsure("a frame with steps has no address")
            self.frames.append(_Open(entered, context))
        elif depth == len(self.frames):
            self._finish(entered)  # no code ran (a precompile, no code, failed early)
        else:
            raise _Unsure("call frames and steps do not line up (depth)")
        self.entered = None

    def _finish(self, frame: _Frame) -> None:
        if frame.type in _CREATES and frame.error is None and frame.to:
            self.code_len[frame.to.lower()] = len(_hex_bytes(frame.output))

    def _close(self) -> None:
        done = self.frames.pop()
        if done.next_child != len(done.frame.calls):
            raise _Unsure("call frames and steps do not line up (frames left over)")
        self._finish(done.frame)

    def _call(self, name: str, depth: int) -> None:
        """A *CALL/CREATE step: its frame is the next child of the current one."""
        top = self.frames[-1]
        children = top.frame.calls
        if top.next_child >= len(children):
            raise _Unsure("call frames and steps do not line up (missing frame)")
        child = children[top.next_child]
        top.next_child += 1
        if child.type != name:
            raise _Unsure(f"step {name} met a {child.type} frame")
        self.entered = child
        failed = child.error
        if failed is not None and failed not in _REVERT and not _OOG.search(failed):
            raise _Unsure(f"a frame failed with {child.error!r}")
        cur = self.cur
        if depth == 1:
            if name not in ("CALL", "STATICCALL"):
                raise _Unsure(f"the EntryPoint used {name}")
            if len(self.phases) >= jscollector.MAX_PHASES:
                raise _Unsure("more top-level calls than the collector keeps")
            cur = self.cur = _PhaseBuild(len(self.phases), (child.to or "").lower(), _method(child))
            self.phases.append(cur)
        elif cur is not None and name in _CALLISH:
            target = (child.to or "").lower()
            if target not in cur.code:
                size = -1 if target in PRECOMPILES else self.code_len.get(target, 0)
                cur.code[target] = CodeAccess(size=size, op=name)
        if cur is not None:
            self.calls += 1
            if self.calls > jscollector.MAX_CALLS:
                raise _Unsure("more calls than the collector keeps")
            cur.calls.append(_call(child))
            if _ran_out_of_gas(child):
                cur.oog = True
            if name in _CREATES and depth > 1:
                cur.count(name, top.context)

    def _opcode(self, cur: _PhaseBuild, name: str, context: str) -> None:
        """Any other step below the EntryPoint, in a phase."""
        if name in _NAMED:
            if name == "SELFDESTRUCT":
                raise _Unsure("SELFDESTRUCT changes code during the call")
            cur.count(name, context)
        elif name == "GAS":
            self.gas_at = (cur, context)
        elif name == "SLOAD":
            cur.touched_storage.add(context)
        elif name == "SSTORE":
            cur.touched_storage.add(context)
            cur.stored.add(context)
        elif name in _TRANSIENT:
            cur.doubt("transient storage (not in the prestate)")
        elif name in _EXTCODE:
            cur.extcode = cur.extcode or name
        elif name in ("KECCAK256", "SHA3"):
            self.keccaks += 1


def _assemble(
    phases: list[_PhaseBuild],
    prestate: Mapping[str, _Account],
    root: _Frame,
    op: UserOperation,
    entry_point: str,
    version: Version,
    hashes: dict[str, str] | None = None,
) -> FastTrace | Fallback:
    """The Trace from the phases found (by the steps or statically): storage from the
    prestate, code hashes, and a Fallback if a judged phase is unsure."""

    # The exact path's sanity check: a validation that made no call and returned.
    reverted = root.error is not None
    if not phases and not reverted:
        raise _Unsure("the simulation made no call from the EntryPoint")

    slots = 0
    built: list[Phase] = []
    for phase in phases:
        storage: dict[str, SlotAccess] = {}
        for context in sorted(phase.touched_storage):
            account = prestate.get(context)
            keys = sorted(k.lower() for k in (account.storage if account else {}))
            slots += len(keys) * (2 if context in phase.stored else 1)
            read = dict.fromkeys(keys, 1)
            storage[context] = SlotAccess(r=read, w=dict(read) if context in phase.stored else {})
        built.append(
            Phase(
                target=phase.target,
                method=phase.method,
                opcodes=phase.opcodes,
                storage=storage,
                code=phase.code,
                calls=phase.calls,
                oog=phase.oog,
            )
        )
    if slots > jscollector.MAX_SLOTS:
        raise _Unsure("more storage slots than the collector keeps")
    output = _hex_bytes(root.output)
    if hashes is None:
        hashes = {
            address.lower(): "0x" + _code(account.code)[1].hex()
            for address, account in prestate.items()
            if address.lower() != entry_point and address.lower() not in PRECOMPILES
        }
    trace = Trace(
        phases=built,
        keccak=[],
        entry_point=entry_point,
        overflow=False,
        output="0x" + output.hex(),
        error=root.error,
        code_hashes=hashes,
    )
    judged = rules._phases(trace, op, version)  # the same mapping the rules use
    for role, phase_obj in judged.items():
        index = next(i for i, p in enumerate(built) if p is phase_obj)
        why = phases[index].unsure
        if why is not None:
            return Fallback(f"{role} phase: {why}")
    return FastTrace(data=output, reverted=reverted, trace=trace)


# --- deploying operations: the factory phase replayed on its own -----------------------------

# Gas the replay gets beyond the phase's own and its calldata's: an execution that ran out of
# gas nowhere (the rules refuse any that did) takes the same path with more.
REPLAY_GAS = 100_000


def factory_phase(root: _Frame) -> _Frame | None:
    """The EntryPoint's first call of ``SenderCreator.createSender``: the factory phase."""
    return next((c for c in root.calls if _method(c) == rules._CREATE_SENDER), None)


@functools.lru_cache(maxsize=64)
def sender_creator(entry_point: str) -> str:
    """The EntryPoint's SenderCreator: the first contract its constructor creates (every
    version's ``new SenderCreator()``, CREATE at nonce 1).  ``fast_trace`` checks the factory
    phase called exactly this address."""
    return create_address(entry_point, 1)


def replay_call(
    op: UserOperation, entry_point: str, version: Version, sender: str
) -> dict[str, Any]:
    """The factory phase as a transaction of its own, known before the validation is traced
    (it runs beside it), with more gas than the phase gets (verificationGasLimit, and its
    calldata's cost on top).  v0.6/v0.7: ``createSender(initCode)`` from ``sender`` (random:
    no code can name it).  v0.8's SenderCreator takes calls from its EntryPoint alone: the
    factory's own call, from the SenderCreator, as it makes it."""
    creator = sender_creator(entry_point)
    if version == "0.8":
        caller, target, data = creator, str(op.factory), op.factory_data
    else:
        caller, target = sender, creator
        data = abi.encode_call("createSender(bytes)", op.init_code)
    gas = op.verification_gas_limit + REPLAY_GAS + 16 * len(data)
    return {"from": caller, "to": target, "input": "0x" + data.hex(), "gas": hex(gas)}


def replayed_frame(phase: _Frame, version: Version) -> _Frame | None:
    """The part of the factory phase ``replay_call`` runs again: all of it, or (v0.8) the
    SenderCreator's one call to the factory."""
    if version != "0.8":
        return phase
    return phase.calls[0] if len(phase.calls) == 1 else None


def _shape(frame: _Frame, *, top: bool = False) -> tuple[Any, ...]:
    """A frame tree without gas (access costs differ between the two runs) and, at the top,
    without the caller (the EntryPoint there, the replay's own sender here)."""
    return (
        frame.type,
        None if top else frame.from_.lower(),
        (frame.to or "").lower(),
        frame.input.lower(),
        int(frame.value or "0x0", 16),
        (frame.output or "").lower(),
        frame.error,
        tuple(_shape(c) for c in frame.calls),
    )


def factory_oracle(
    phase: _Frame,
    replay: _Frame,
    replay_prestate: Mapping[str, _Account],
    op: UserOperation,
    *,
    entry_point: str,
    unknowable: Iterable[str],
) -> str | None:
    """None when every EXTCODE* target of the factory phase is harmless to the rules (has
    code, or is the sender: OP-041/042; is not the EntryPoint: OP-054); else why not.

    The struct log here has no stack, so the targets are not seen.  The factory phase run
    alone (``replay_call``: the same SenderCreator call, state and callee chain; its own
    random sender and coinbase, ``unknowable``) loads every account it touches into its
    prestate, EXTCODE* targets included.  It took the same path as in the validation when
    its frame tree is the same (the code cannot read gas, origin or coinbase there without a
    rule refusing it; the SenderCreator changes nothing before it).  Then: the EntryPoint is
    not in that prestate (nothing touched it), and every account there has code — but the
    sender, the precompiles and the two unknowable addresses; an account with code keeps it
    (SELFDESTRUCT falls back).  Sans-IO."""
    if _shape(replay, top=True) != _shape(phase, top=True):
        return "the factory phase took another path when replayed alone"
    allowed = {a.lower() for a in unknowable} | PRECOMPILES | {op.sender.lower()}
    for address, account in replay_prestate.items():
        key = address.lower()
        if key == entry_point.lower():
            return "the factory phase touched the EntryPoint"
        if key not in allowed and not _code(account.code)[0]:
            return f"the factory phase touched {key}, which has no code"
    return None


# --- without the struct log: static analysis of the code that ran ---------------------------

# What the collector records by name in a judged phase (OP-011/013/080, CREATE*, INVALID,
# SELFDESTRUCT, any unassigned opcode) or judges by its stack (EXTCODE*; TLOAD/TSTORE, whose
# slots the prestate does not show).  GAS is judged by ``CodeProfile.lone_gas``.
_CREATE_OPS = frozenset({0xF0, 0xF5})
_EXTCODE_OPS = frozenset({0x3B, 0x3C, 0x3F})
_JUDGED_BAD = (
    frozenset(
        n
        for n, kind in enumerate(jscollector.KINDS)
        if kind in (jscollector.NAMED, jscollector.EXTCODE)
    )
    | {0x5C, 0x5D}
) - _CREATE_OPS
# Anywhere else too (an unjudged phase, the EntryPoint at depth 1): what the step walk above
# falls back on, SELFDESTRUCT and an opcode outside the Cancun table.
_ANYWHERE_BAD = frozenset(n for n in range(256) if n not in opcodes.EFFECTS) | {0xFF}
_SLOAD, _SSTORE, _KECCAK, _LOG1 = 0x54, 0x55, 0x20, 0xA1
# A KECCAK256 of >= 32 bytes costs >= 36 gas: phases using less gas than this cannot fill the
# collector's preimage list (jscollector.MAX_KECCAK), so its overflow needs no counting.
KECCAK_GAS = 36 * jscollector.MAX_KECCAK
# The least an SLOAD or SSTORE costs (warm, EIP-2929): a bound on the slots a call records.
STORAGE_ACCESS_GAS = 100
_OPNAMES = {0x5A: "GAS", 0x5C: "TLOAD", 0x5D: "TSTORE", 0xA1: "LOG1", 0x3B: "EXTCODESIZE",
            0x3C: "EXTCODECOPY", 0x3F: "EXTCODEHASH", 0xFF: "SELFDESTRUCT", 0xFE: "INVALID",
            0xF0: "CREATE", 0xF5: "CREATE2"}  # fmt: skip
# Code profiles by (code hash, selector); a validation touches ~5 codes, so this holds the
# codes of a few hundred distinct accounts/paymasters/factories.
PROFILES = opcodes.ProfileCache(2048)
# How often fast_trace skipped the struct log: {"skipped": n, "fetched": n}; read by tests
# and benches.
STRUCT_LOG: dict[str, int] = {"skipped": 0, "fetched": 0}


class _NeedSteps(Exception):
    """Raised inside ``build_static``: the struct log is needed (not a Fallback)."""


def _selector(frame: _Frame) -> int:
    # CALLDATALOAD(0)'s top 4 bytes: the input padded with zeros.
    return int.from_bytes(_hex_bytes(frame.input[:10]).ljust(4, b"\0"), "big")


def _names(numbers: Iterable[int]) -> str:
    return ", ".join(_OPNAMES.get(n, f"0x{n:02x}") for n in sorted(numbers))


def build_static(
    root: _Frame,
    prestate: Mapping[str, _Account],
    op: UserOperation,
    *,
    entry_point: str,
    version: Version,
    factory_extcode_harmless: bool = False,
    storage_known: bool = True,
    shipped_entry_point: bool = False,
) -> FastTrace | Fallback | str:
    """The collector's Trace from callTracer and prestateTracer alone, when static analysis of
    every code that ran proves the struct log would add nothing; else (a str) why it is needed.

    ``storage_known=False``: ``prestate`` holds only codes (``eth_getCode`` at the block, the
    override's codes applied: every frame's target, the lean path of ``fast_trace``), no
    storage.  Then no judged phase may run SLOAD/SSTORE in a context but the sender's and the
    EntryPoint's (the only storage the rules never judge slot by slot), and the gas spent must
    be too little for the collector's slot cap (every slot it records is one SLOAD/SSTORE,
    100 gas at least), and no phase may run EXTCODE* (the collector keeps its targets' code
    hashes) but the vouched factory phase and — ``shipped_entry_point``, the EntryPoint's code
    being the shipped EntryPointSimulations — its own ``validateSenderAndPaymaster``
    (``_sender_check``); else (a str) the prestate is needed.

    Every frame of a judged phase must run code (its own, or the target's for DELEGATECALL/
    CALLCODE; a CREATE's init code) whose ``opcodes.reachable`` set for the frame's selector
    has nothing in ``_JUDGED_BAD`` and no GAS that is not immediately followed by a *CALL; the
    collector would then record no opcode there, exactly as this trace says.  CREATE/CREATE2
    are counted from their frames: anvil gives every one a frame, one that fails its checks
    too (with an error, which falls back).  EXTCODE* may run in the factory phase only when
    ``factory_extcode_harmless`` (the factory phase replayed alone vouched for its targets).
    Other phases and the EntryPoint (depth 1, its own selector) must not reach SELFDESTRUCT or
    an unknown opcode, and the EntryPoint no LOG1 (the collector stops at v0.7's
    BeforeExecution).  Frames, calls, code sizes and out-of-gas come from callTracer as in
    ``build_trace`` (a contract created here has its code once its CREATE frame is done, as
    there); storage is the stricter prestate rule with "ran SLOAD/SSTORE" read from the static
    sets (a superset); no frame error but a revert or out-of-gas; caps as the collector's,
    KECCAK256's bounded by the gas the frames that can run it spent themselves.  Sans-IO.
    """
    try:
        return _build_static(
            root,
            prestate,
            op,
            entry_point.lower(),
            require_version(version),
            factory_extcode_harmless,
            storage_known,
            shipped_entry_point,
        )
    except (_NeedSteps, _Unsure) as why:
        return str(why)


def _self_gas(frame: _Frame) -> int:
    """Gas a frame spent itself (its children's excluded): a bound on its own KECCAK256s'."""
    return max(0, int(frame.gasUsed, 16) - sum(int(c.gasUsed, 16) for c in frame.calls))


def _gas_spent(root: _Frame) -> int:
    """A bound on the gas the call spent: callTracer's top gasUsed may be net of the refund
    (at most a fifth of the gas spent), its phases' frames are not."""
    top = int(root.gasUsed, 16)
    return max(top + top // 4 + 1, sum(int(c.gasUsed, 16) for c in root.calls))


def _build_static(
    root: _Frame,
    prestate: Mapping[str, _Account],
    op: UserOperation,
    entry_point: str,
    version: Version,
    factory_extcode_harmless: bool,
    storage_known: bool,
    shipped_entry_point: bool,
) -> FastTrace | Fallback:
    if root.to is None or root.to.lower() != entry_point:
        raise _NeedSteps("the traced call is not to the EntryPoint")
    free: frozenset[str] | None = None  # contexts whose slots need not be known
    extcode_anywhere = frozenset[int]()
    if not storage_known:
        # Codes only of the frames' targets: an EXTCODE* target (which the collector keeps for
        # bundling's code-hash check) would be missing, in any phase but the vouched one.
        extcode_anywhere = _EXTCODE_OPS
        free = frozenset({op.sender.lower(), entry_point})
        if _gas_spent(root) // STORAGE_ACCESS_GAS >= jscollector.MAX_SLOTS:
            raise _NeedSteps("enough gas to fill the collector's slots: the prestate counts them")
    codes = _StaticCodes(prestate)
    # What bundling compares again: the code before the validation (a sender it deploys has
    # none yet), as the exact path reads it at the block.
    hashes = {
        address: "0x" + digest.hex()
        for address, (_, digest) in codes.codes.items()
        if address != entry_point and address not in PRECOMPILES
    }
    phases, judged = _static_phases(root, op, entry_point, version, codes)
    vouched = next((p.index for p in phases if p.method == rules._CREATE_SENDER), None)
    calls = 0
    keccak_gas = 0
    for index, (phase, frame) in enumerate(zip(phases, root.calls, strict=True)):
        forbidden = (_JUDGED_BAD if index in judged else _ANYWHERE_BAD) | extcode_anywhere
        known_targets = (index == vouched and factory_extcode_harmless) or (
            index not in judged and shipped_entry_point and _sender_check(frame, op, entry_point)
        )
        if known_targets:
            forbidden = forbidden - _EXTCODE_OPS
        walk = _StaticPhase(
            phase, codes, forbidden, judged=index in judged, calls=calls, free_storage=free
        )
        walk.run(frame)
        calls, keccak_gas = walk.calls, keccak_gas + walk.keccak_gas
    if keccak_gas >= KECCAK_GAS:
        raise _NeedSteps("enough gas in hashing frames to overflow the KECCAK256 list")
    return _assemble(phases, prestate, root, op, entry_point, version, hashes)


# The shipped EntryPointSimulations' check before validation, called on itself (v0.7:
# ``_validateSenderAndPaymaster``, v0.8: ``validateSenderAndPaymaster``, same arguments): its
# only EXTCODESIZE targets are its ``sender`` argument and the first 20 bytes of its
# ``paymasterAndData`` (the source's ``sender.code.length``, ``paymaster.code.length``).
_SENDER_CHECKS = frozenset(
    "0x" + abi.selector(f"{name}(bytes,address,bytes)").hex()
    for name in ("_validateSenderAndPaymaster", "validateSenderAndPaymaster")
)


def _sender_check(frame: _Frame, op: UserOperation, entry_point: str) -> bool:
    """The phase is the EntryPoint's own sender-and-paymaster check for ``op``: its EXTCODE*
    read the code of ``op``'s sender and paymaster, no other account's."""
    if (
        (frame.to or "").lower() != entry_point
        or frame.from_.lower() != entry_point
        or frame.calls
        or _method(frame) not in _SENDER_CHECKS
    ):
        return False
    try:
        _, sender, paymaster_and_data = abi.decode(
            ["bytes", "address", "bytes"], _hex_bytes(frame.input)[4:]
        )
    except (ValueError, IndexError, TypeError, _Unsure):
        return False
    paymaster = "0x" + paymaster_and_data[:20].hex() if len(paymaster_and_data) >= 20 else None
    return str(sender).lower() == op.sender.lower() and paymaster == (
        op.paymaster.lower() if op.paymaster else None
    )


class _StaticCodes:
    """The code each address has at this point of the walk (the prestate's; a contract created
    here once its CREATE frame is done), and each frame's static profile."""

    def __init__(self, prestate: Mapping[str, _Account]) -> None:
        # address -> (code, keccak of it)
        self.codes = {a.lower(): _code(account.code) for a, account in prestate.items()}

    def created(self, frame: _Frame) -> None:
        if frame.error is None and frame.to:
            self.codes[frame.to.lower()] = _code(frame.output)

    def profile(self, frame: _Frame, target: str) -> opcodes.CodeProfile | None:
        if frame.type in _CREATES:  # its init code, run from the start (empty calldata)
            code = _hex_bytes(frame.input)
            return PROFILES.get(keccak256(code), code, 0) if code else None
        found = self.codes.get(target)
        if found is None:
            if target in PRECOMPILES:
                return None
            raise _NeedSteps(f"the code of {target} is not in the prestate")
        code, digest = found
        return PROFILES.get(digest, code, _selector(frame)) if code else None


def _static_phases(
    root: _Frame, op: UserOperation, entry_point: str, version: Version, codes: _StaticCodes
) -> tuple[list[_PhaseBuild], set[int]]:
    """The EntryPoint's top-level calls as phases (checked: its own code can run nothing the
    walk falls back on at depth 1), and the indexes of those the rules judge."""
    top = codes.profile(root, entry_point)
    if top is None:
        raise _NeedSteps("the EntryPoint has no code")
    bad = top.opcodes & (_ANYWHERE_BAD | {_LOG1})
    if bad:
        raise _NeedSteps(f"the EntryPoint may run {_names(bad)} at depth 1")
    if len(root.calls) > jscollector.MAX_PHASES:
        raise _NeedSteps("more top-level calls than the collector keeps")
    phases: list[_PhaseBuild] = []
    for index, child in enumerate(root.calls):
        if child.type not in ("CALL", "STATICCALL"):
            raise _NeedSteps(f"the EntryPoint used {child.type}")
        phases.append(_PhaseBuild(index, (child.to or "").lower(), _method(child)))
    skeleton = [Phase(target=p.target, method=p.method) for p in phases]
    mapped = rules._phases(
        Trace(skeleton, [], entry_point, overflow=False, output="0x", error=None), op, version
    )
    return phases, {i for i, p in enumerate(skeleton) if any(p is q for q in mapped.values())}


class _StaticPhase:
    """One phase's frames in DFS preorder, as the collector's enter() sees them, judged by the
    static profile of the code each runs.  Raises _NeedSteps."""

    def __init__(
        self,
        phase: _PhaseBuild,
        codes: _StaticCodes,
        forbidden: frozenset[int],
        *,
        judged: bool,
        calls: int,
        free_storage: frozenset[str] | None = None,
    ) -> None:
        self.phase = phase
        self.codes = codes
        self.forbidden = forbidden
        self.judged = judged
        # None: the slots are known (the prestate); else the only contexts a judged phase
        # may touch storage in (the rules skip their slots).
        self.free_storage = free_storage
        self.calls = calls  # the whole trace's so far: the collector's cap is on all of them
        self.keccak_gas = 0

    def run(self, frame: _Frame) -> None:
        target = self.phase.target
        # (frame, storage context, its caller's context, is the phase's own frame, finished):
        # a CREATE's code is the chain's once its whole subtree is done (its entry again).
        todo: list[tuple[_Frame, str, str, bool, bool]] = [(frame, target, target, True, False)]
        while todo:
            current, context, parent_context, is_phase, finished = todo.pop()
            if finished:
                self.codes.created(current)
                continue
            self._frame(current, context, parent_context, is_phase)
            if current.type in _CREATES:
                todo.append((current, context, parent_context, False, True))
            for inner in reversed(current.calls):
                own = inner.type in ("DELEGATECALL", "CALLCODE")
                inner_context = context if own else (inner.to or "").lower()
                todo.append((inner, inner_context, context, False, False))

    def _frame(self, current: _Frame, context: str, parent_context: str, is_phase: bool) -> None:
        phase = self.phase
        error = current.error
        if error is not None and error not in _REVERT and not _OOG.search(error):
            raise _NeedSteps(f"a frame failed with {error!r}")
        self.calls += 1
        if self.calls > jscollector.MAX_CALLS:
            raise _NeedSteps("more calls than the collector keeps")
        phase.calls.append(_call(current))
        if _ran_out_of_gas(current):
            phase.oog = True
        target = (current.to or "").lower()
        if current.type in _CREATES:
            phase.count(current.type, parent_context)  # the opcode, where it ran
        elif not is_phase and target not in phase.code:
            size = -1 if target in PRECOMPILES else len(self.codes.codes.get(target, (b"",))[0])
            phase.code[target] = CodeAccess(size=size, op=current.type)
        profile = self.codes.profile(current, target)
        if profile is None:
            return
        bad = profile.opcodes & self.forbidden
        if bad:
            raise _NeedSteps(f"{target} may run {_names(bad)}")
        if self.judged and profile.lone_gas:
            raise _NeedSteps(f"{target} may run GAS not followed by a *CALL")
        if _SLOAD in profile.opcodes or _SSTORE in profile.opcodes:
            free = self.free_storage
            if self.judged and free is not None and context not in free:
                raise _NeedSteps(f"the storage of {context} (its slots: the prestate)")
            phase.touched_storage.add(context)
        if _SSTORE in profile.opcodes:
            phase.stored.add(context)
        if _KECCAK in profile.opcodes:
            self.keccak_gas += _self_gas(current)


_STRUCT_CONFIG = {"disableStack": True, "disableStorage": True, "enableMemory": False}
_Prestate = dict[str, _Account]


async def _typed_call(client: NodeClient, method: str, params: list[Any], kind: Any) -> Any:
    """The result decoded into ``kind``: straight from the bytes with a ChainClient (a struct
    log is ~0.5 MB; generic objects first would cost more than the node's trace), else by
    conversion (test clients).  A missing result is a ValidationError like a wrong one."""
    call_as = getattr(client, "call_as", None)
    result = (
        await call_as(method, params, kind)
        if call_as is not None
        else msgspec.convert(await client.call(method, params), kind)
    )
    if result is None:
        raise msgspec.ValidationError(f"{method} answered no result")
    return result


async def fast_trace(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations_code: bytes | None,
    *,
    block: str | None = None,
) -> FastTrace | Fallback:
    """``op``'s validation traced by the native tracers (``build_static``, else
    ``build_trace``), or a Fallback.

    The block is pinned first (``block``, a recent one the caller read, else the node's
    latest).  One JSON-RPC batch then asks for callTracer — with, for a deploying operation,
    the factory phase's replay (two traces) — and, on the **lean path**, the codes of the
    accounts the validation is expected to call (``eth_getCode`` at the block, ~0.03 ms of
    node CPU each against ~0.4 ms for prestateTracer's run of the whole simulation); the
    codes of targets not expected are fetched after.  ``build_static`` on the codes alone
    (``storage_known=False``) gives the trace when no judged phase touches storage but the
    sender's and the EntryPoint's.  Otherwise — or at once, when the last validation naming
    the same EntryPoint, factory and paymaster needed it (``PLANS``) — prestateTracer runs,
    then, only when static analysis cannot do without it and the validation used at most
    ``MAX_GAS``, the struct log.  A node error is a Fallback too: the exact path then gives
    the node's own answer.
    """
    version = require_version(version)
    tx, override = validation_call(
        op, entry_point, version, simulations_code or simulations_for(version)
    )
    extra: dict[str, Any] = {"stateOverrides": wire_override(client, override)} if override else {}
    given = _override_codes(override)
    # The lean build needs the EntryPoint to be the shipped EntryPointSimulations (its own
    # sender check's EXTCODESIZE targets are known: ``_sender_check``), and is never worth
    # trying for an EIP-7702 sender (a designator is no code static analysis can read).
    shipped_entry_point = (
        given is not None
        and entry_point.lower() in given
        and (simulations_code is None or simulations_code == simulations_for(version))
    )
    possible = given is not None and shipped_entry_point and op.eip7702_auth is None
    key = (
        entry_point.lower(),
        (op.factory or "").lower() if op.deploys else "",
        (op.paymaster or "").lower(),
        op.eip7702_auth is not None,
    )
    plan = PLANS.get(key)
    lean = possible and (plan is None or plan.lean)
    failed = ""
    replay: dict[str, Any] = {}
    try:
        if block is None:
            block = await client.call("eth_blockNumber", [])
        if not isinstance(block, str):
            return Fallback("eth_blockNumber answered a non-string")
        prestate_call = ("debug_traceCall", [tx, block, {"tracer": "prestateTracer", **extra}])
        calls: list[tuple[str, list[Any]]] = [
            ("debug_traceCall", [tx, block, {"tracer": "callTracer", **extra}])
        ]
        wanted: list[str] = []
        if given is not None and lean:
            wanted = _expected_targets(op, entry_point, plan, given)
            calls += [("eth_getCode", [address, block]) for address in wanted]
        else:
            calls.append(prestate_call)
        if op.deploys:
            replay_calls, replay["unknowable"] = _replay_calls(op, entry_point, version, block)
            calls += replay_calls
        answers = _unwrap(await node_batch(client, calls))
        root = msgspec.convert(answers[0], _Frame)
        if op.deploys:
            replay["calls"] = msgspec.convert(answers[-2], _Frame)
            replay["prestate"] = msgspec.convert(answers[-1], _Prestate)
        harmless = op.deploys and _vouched(root, op, entry_point, version, replay) is None
        if given is not None and lean:
            fetched = dict(zip(wanted, answers[1 : 1 + len(wanted)], strict=True))
            built = await _lean_build(
                client,
                root,
                fetched,
                given,
                block,
                op,
                entry_point,
                version,
                harmless,
                replay,
                shipped_entry_point=shipped_entry_point,
            )
            _remember(key, root, op.sender, lean=isinstance(built, FastTrace))
            if isinstance(built, FastTrace):
                PRESTATE["skipped"] += 1
                STRUCT_LOG["skipped"] += 1
                return built
            prestate: _Prestate = await _typed_call(client, *prestate_call, _Prestate)
        else:
            prestate = msgspec.convert(answers[1], _Prestate)
            # Would the codes alone have done?  (The prestate's codes are the lean build's
            # and more.)  So one operation needing the prestate does not keep the next
            # ones of its EntryPoint, factory and paymaster from the lean path.
            probe = possible and isinstance(
                _codes_only_static(
                    root, prestate, op, entry_point, version, harmless, shipped_entry_point
                ),
                FastTrace,
            )
            _remember(key, root, op.sender, lean=probe)
        PRESTATE["fetched"] += 1
        static = build_static(
            root,
            prestate,
            op,
            entry_point=entry_point,
            version=version,
            factory_extcode_harmless=harmless,
        )
        if not isinstance(static, str):
            STRUCT_LOG["skipped"] += 1
            return static
        STRUCT_LOG["fetched"] += 1
        if int(root.gasUsed, 16) > MAX_GAS:
            return Fallback(f"validation used more than {MAX_GAS} gas")
        params = [tx, block, {**_STRUCT_CONFIG, **extra}]
        log: _StructLog = await _typed_call(client, "debug_traceCall", params, _StructLog)
    except* RpcCallError as group:  # alone or from a nursery: the traces run concurrently
        failed = f"the node refused a native trace: {_first(group)}"
    except* (msgspec.ValidationError, ValueError) as group:
        failed = f"unexpected native trace: {_first(group)}"
    if failed:
        return Fallback(failed)
    if log.failed != (root.error is not None):
        return Fallback("the struct log and the call trace disagree on the outcome")
    try:
        return build_trace(
            log.structLogs,
            root,
            prestate,
            op,
            entry_point=entry_point,
            version=version,
            factory_extcode_harmless=harmless,
        )
    except ValueError as error:  # a malformed number in the node's answer
        return Fallback(f"unexpected native trace: {error}")


# --- the lean path: callTracer and the called codes, without prestateTracer -----------------

# How often fast_trace did without prestateTracer: {"skipped": n, "fetched": n}; read by
# tests and benches.
PRESTATE: dict[str, int] = {"skipped": 0, "fetched": 0}


class _Plan:
    """What the last validation naming the same EntryPoint, factory and paymaster showed: the
    accounts its frames called (their codes are asked for with the trace) and whether the
    lean build sufficed (if not, the prestate is asked for with the trace instead)."""

    __slots__ = ("lean", "targets")

    def __init__(self, targets: tuple[str, ...], lean: bool) -> None:
        self.targets = targets
        self.lean = lean


# A hint, never a verdict: a wrong one costs a round trip or a trace, not a rule.
PLANS: dict[tuple[str, str, str, bool], _Plan] = {}
MAX_PLANS = 1024
MAX_EXPECTED = 16  # codes asked for ahead of the trace


def _override_codes(override: Mapping[str, Any] | None) -> dict[str, str] | None:
    """address -> the code the override puts there; None when it overrides more than code
    (balances, storage: the lean path reads the chain's codes only)."""
    codes: dict[str, str] = {}
    for address, fields in (override or {}).items():
        if not isinstance(fields, Mapping) or set(fields) != {"code"}:
            return None
        codes[address.lower()] = str(fields["code"])
    return codes


def _frame_targets(root: _Frame) -> list[str]:
    """Every frame's target below the top one, once, in order, precompiles left out."""
    found: dict[str, None] = {}
    todo = list(reversed(root.calls))
    while todo:
        frame = todo.pop()
        if frame.to:
            found.setdefault(frame.to.lower(), None)
        todo.extend(reversed(frame.calls))
    return [address for address in found if address not in PRECOMPILES]


def _expected_targets(
    op: UserOperation, entry_point: str, plan: _Plan | None, given: Mapping[str, str]
) -> list[str]:
    """The accounts whose code the validation will likely need, the override's left out."""
    named = [entry_point, op.sender, op.factory if op.deploys else None, op.paymaster]
    expected = [a.lower() for a in named if a] + list(plan.targets if plan else ())
    return [a for a in dict.fromkeys(expected) if a not in given][:MAX_EXPECTED]


def _remember(key: tuple[str, str, str, bool], root: _Frame, sender: str, *, lean: bool) -> None:
    """The plan for the next validation of ``key``: what this one called but its own sender
    (the next one's is another)."""
    if key not in PLANS and len(PLANS) >= MAX_PLANS:
        del PLANS[next(iter(PLANS))]
    targets = [a for a in _frame_targets(root) if a != sender.lower()]
    PLANS[key] = _Plan(tuple(targets[:MAX_EXPECTED]), lean)


async def _lean_build(
    client: NodeClient,
    root: _Frame,
    fetched: dict[str, Any],
    given: Mapping[str, str],
    block: str,
    op: UserOperation,
    entry_point: str,
    version: Version,
    harmless: bool,
    replay: Mapping[str, Any],
    *,
    shipped_entry_point: bool,
) -> FastTrace | Fallback | str:
    """``build_static`` on the codes of every frame's target at ``block`` (those not fetched
    yet, now), the override's codes over them, without storage.  The vouched factory phase's
    accounts (its EXTCODE* targets among them) come from its replay's prestate, so bundling
    compares their code hashes again as the exact path's."""
    # The sender's and paymaster's codes always (``_sender_check``'s targets).
    named = [op.sender.lower()] + ([op.paymaster.lower()] if op.paymaster else [])
    needed = dict.fromkeys([*named, *_frame_targets(root)])
    missing = [a for a in needed if a not in fetched and a not in given]
    if missing:
        codes = _unwrap(await node_batch(client, [("eth_getCode", [a, block]) for a in missing]))
        fetched.update(zip(missing, codes, strict=True))
    state: dict[str, _Account] = {}
    if harmless:
        unknowable = {a.lower() for a in replay["unknowable"]}
        prestate: Mapping[str, _Account] = replay["prestate"]
        for address, account in prestate.items():
            if address.lower() not in unknowable:
                state[address.lower()] = _Account(code=account.code)
    # Only what this validation called (its code hashes are compared again before bundling:
    # an expected account it did not call — another operation's sender — must not drop it).
    for address in needed:
        if address in given:
            continue
        code = fetched[address]
        if not isinstance(code, str):
            raise msgspec.ValidationError(f"eth_getCode answered {code!r}")
        state[address] = _Account(code=code)
    for address, code in given.items():
        state[address] = _Account(code=code)
    return _codes_only_static(root, state, op, entry_point, version, harmless, shipped_entry_point)


def _codes_only_static(
    root: _Frame,
    codes: Mapping[str, _Account],
    op: UserOperation,
    entry_point: str,
    version: Version,
    harmless: bool,
    shipped_entry_point: bool,
) -> FastTrace | Fallback | str:
    """``build_static`` on codes alone (the lean path's, and its probe of a prestate)."""
    return build_static(
        root,
        codes,
        op,
        entry_point=entry_point,
        version=version,
        factory_extcode_harmless=harmless,
        storage_known=False,
        shipped_entry_point=shipped_entry_point,
    )


def _unwrap(results: list[Any]) -> list[Any]:
    """A batch's results, or the first refusal raised."""
    for result in results:
        if isinstance(result, RpcCallError):
            raise result
    return results


def _vouched(
    root: _Frame, op: UserOperation, entry_point: str, version: Version, replay: dict[str, Any]
) -> str | None:
    """``factory_oracle``'s verdict on the replay against the validation's factory phase
    (None: its EXTCODE* targets are harmless), or why it cannot vouch."""
    phase = factory_phase(root)
    if phase is None:
        return "no factory phase"
    if (phase.to or "").lower() != sender_creator(entry_point).lower():
        return "the factory phase did not call the EntryPoint's SenderCreator"
    replayed = replayed_frame(phase, version)
    if replayed is None:
        return "the SenderCreator did not make one call"
    return factory_oracle(
        replayed,
        replay["calls"],
        replay["prestate"],
        op,
        entry_point=entry_point,
        unknowable=replay["unknowable"],
    )


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _replay_calls(
    op: UserOperation, entry_point: str, version: Version, block: str
) -> tuple[list[tuple[str, list[Any]]], tuple[str, str]]:
    """The factory phase replayed alone (``replay_call``) at the validation's block: its
    callTracer and prestateTracer calls, and the "unknowable" addresses (its random sender
    and coinbase)."""
    sender, coinbase = (
        "0x" + secrets.token_bytes(20).hex(),
        "0x" + secrets.token_bytes(20).hex(),
    )
    params = [replay_call(op, entry_point, version, sender), block]
    overrides = {"blockOverrides": {"coinbase": coinbase}}
    calls: list[tuple[str, list[Any]]] = [
        ("debug_traceCall", [*params, {"tracer": name, **overrides}])
        for name in ("callTracer", "prestateTracer")
    ]
    return calls, (sender, coinbase)


async def _replay_factory(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    block: str,
    found: dict[str, Any],
) -> None:
    """``_replay_calls`` run, into ``found``: "calls", "prestate" and "unknowable"."""
    calls, found["unknowable"] = _replay_calls(op, entry_point, version, block)
    answers = _unwrap(await node_batch(client, calls))
    found["calls"] = msgspec.convert(answers[0], _Frame)
    found["prestate"] = msgspec.convert(answers[1], _Prestate)
