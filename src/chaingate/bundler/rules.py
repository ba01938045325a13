"""ERC-7562 validation rules, judged on a collected trace (sans-IO).

``check_rules(trace, op, entry_point=..., version=..., staked=...)`` is a pure function of the
parsed trace, the operation and which entities are staked; it raises the first broken rule as
a ``BundlerFault`` and returns what the bundler keeps with the operation (the code hashes it
re-checks before bundling, the contracts whose storage validation read or wrote).
``check_trace`` is the same with the stakes read from the simulation's ValidationResult.

Messages start with the reference bundler's wording (eth-infinitism/bundler: "account uses
banned opcode: TIMESTAMP", "unstaked paymaster accessed ... slot ...") — the tools and the
compliance suite written against it match on that — then the rule id and the entity's address:
``account uses banned opcode: TIMESTAMP [OP-011] (account 0x...)``.

Code: every rule here is -32502 (BANNED_OPCODE), storage accesses an unstaked entity may not
make included (as the reference answers); -32505 stays for stake checks outside the trace.

Rule ids are ERC-7562's: OP-011 (blocked opcodes), OP-012 (GAS not followed by a call),
OP-013 (unassigned opcodes), OP-020 (out of gas), OP-031 (CREATE2: once, by the factory, for
the sender), OP-032 (CREATE only by the sender being deployed), OP-041/042 (addresses without
code), OP-051..054 (the EntryPoint: depositTo, the sender's fallback, EXTCODESIZE ISZERO,
nothing else), OP-061 (calls with value), OP-062 (precompiles), OP-070 (transient storage is
storage: the tracer records TLOAD/TSTORE as slots), OP-080 (BALANCE/SELFBALANCE only when
staked), STO-010 (the account's own storage), STO-021 (the account's associated storage while
it is being deployed: staked factory) and STO-031/032/033 (what a staked entity may touch).
A paymaster's context is not judged: EREP-050 as the reference bundler and the compliance
suite apply it accept an unstaked paymaster returning one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import msgspec

from chaingate.aa.userop import OP_TUPLE_TYPE, UserOperation, Version, require_version
from chaingate.bundler.errors import BANNED_OPCODE, BundlerFault
from chaingate.bundler.simulation import StakeInfo, ValidationResult
from chaingate.bundler.tracecall import Phase, Trace
from chaingate.evm import abi
from chaingate.evm.keccak import keccak256

__all__ = [
    "MIN_STAKE",
    "MIN_UNSTAKE_DELAY",
    "ROLES",
    "Outcome",
    "Role",
    "check_rules",
    "check_trace",
    "stake_rule",
]

Role = Literal["factory", "account", "paymaster"]
ROLES: tuple[Role, ...] = ("factory", "account", "paymaster")

MIN_STAKE = 10**18  # wei: the reference bundler's default on a test chain
MIN_UNSTAKE_DELAY = 86_400  # seconds

# OP-011 (and BLOBHASH/BLOBBASEFEE, which read the environment the same way).
BANNED = frozenset(
    {
        "GASPRICE",
        "GASLIMIT",
        "DIFFICULTY",
        "PREVRANDAO",
        "RANDOM",
        "TIMESTAMP",
        "BASEFEE",
        "BLOCKHASH",
        "NUMBER",
        "ORIGIN",
        "COINBASE",
        "SELFDESTRUCT",
        "INVALID",
        "BLOBHASH",
        "BLOBBASEFEE",
    }
)
STAKED_ONLY = frozenset({"BALANCE", "SELFBALANCE"})  # OP-080
# The tracer names only the opcodes some rule is about (tracer.KINDS); a name outside this set
# is an unassigned opcode (OP-013).
_KNOWN = BANNED | STAKED_ONLY | {"CREATE", "CREATE2", "GAS"}

_ASSOCIATED_SPAN = 128  # keccak(A||x)+n, n < 128: a struct at a mapping entry
_DEPOSIT_TO = "0x" + abi.selector("depositTo(address)").hex()
_CREATE_SENDER = "0x" + abi.selector("createSender(bytes)").hex()
_VALIDATE_USER_OP = {
    v: "0x" + abi.selector(f"validateUserOp({t},bytes32,uint256)").hex()
    for v, t in OP_TUPLE_TYPE.items()
}
_VALIDATE_PAYMASTER = {
    v: "0x" + abi.selector(f"validatePaymasterUserOp({t},bytes32,uint256)").hex()
    for v, t in OP_TUPLE_TYPE.items()
}


class Outcome(msgspec.Struct, frozen=True):
    """What a passed check hands on: the code hash of every contract validation touched, and
    the contracts whose storage it read or wrote (a bundle keeps apart an operation that
    touched another of its senders' storage: STO-041)."""

    code_hashes: dict[str, str]
    storage: tuple[str, ...] = ()


def stake_rule(
    min_stake: int = MIN_STAKE, min_unstake_delay: int = MIN_UNSTAKE_DELAY
) -> Callable[[StakeInfo], bool]:
    """An entity counts as staked with at least this stake locked for at least this delay."""

    def staked(info: StakeInfo) -> bool:
        return info.stake >= min_stake and info.unstake_delay_sec >= min_unstake_delay

    return staked


def check_trace(
    trace: Trace,
    result: ValidationResult,
    op: UserOperation,
    *,
    entry_point: str,
    version: Version,
    is_staked: Callable[[StakeInfo], bool] | None = None,
) -> Outcome:
    """``check_rules`` with the stakes the EntryPoint reported."""
    rule = is_staked or stake_rule()
    staked: dict[Role, bool] = {
        "account": rule(result.sender),
        "factory": rule(result.factory),
        "paymaster": rule(result.paymaster),
    }
    return check_rules(trace, op, entry_point=entry_point, version=version, staked=staked)


def check_rules(
    trace: Trace,
    op: UserOperation,
    *,
    entry_point: str,
    version: Version,
    staked: Mapping[Role, bool],
) -> Outcome:
    """Judge ``trace`` (the validation of ``op``) by ERC-7562; raise the first broken rule."""
    version = require_version(version)
    if trace.overflow:
        raise BundlerFault(
            BANNED_OPCODE, "validation is too large to check (the tracer's limits were hit)"
        )
    if trace.failed is not None:
        raise BundlerFault(BANNED_OPCODE, f"validation could not be traced: {trace.failed}")
    entities = _entities(op)
    phases = _phases(trace, op, version)
    if "account" not in phases:
        raise BundlerFault(BANNED_OPCODE, "the trace shows no call of the account's validateUserOp")
    ep = entry_point.lower()
    sender = op.sender.lower()
    slots = _associated_slots(trace.keccak, [a for a in entities.values() if a])
    for role in ROLES:
        phase = phases.get(role)
        address = entities[role]
        if phase is None or address is None:
            continue
        judge = _Judge(role, address, phase, sender, ep, op, staked, slots)
        judge.gas()
        judge.opcodes()
        judge.creates()
        judge.calls()
        judge.code()
        judge.storage()
    touched = {c for p in trace.phases for c in p.storage if c not in (ep, sender)}
    return Outcome(code_hashes=dict(trace.code_hashes), storage=tuple(sorted(touched)))


def _entities(op: UserOperation) -> dict[Role, str | None]:
    return {
        "factory": op.factory.lower() if op.factory and op.deploys else None,
        "account": op.sender.lower(),
        "paymaster": op.paymaster.lower() if op.paymaster else None,
    }


def _phases(trace: Trace, op: UserOperation, version: Version) -> dict[Role, Phase]:
    """Which top-level call is which entity's: by the method the EntryPoint called."""
    found: dict[Role, Phase] = {}
    for phase in trace.phases:
        if phase.method == _CREATE_SENDER and op.deploys:
            found.setdefault("factory", phase)
        elif phase.method == _VALIDATE_USER_OP[version] and phase.target == op.sender.lower():
            found.setdefault("account", phase)
        elif (
            phase.method == _VALIDATE_PAYMASTER[version]
            and op.paymaster
            and phase.target == op.paymaster.lower()
        ):
            found.setdefault("paymaster", phase)
    return found


def _associated_slots(preimages: Iterable[str], addresses: Iterable[str]) -> dict[str, list[int]]:
    """address -> the slots keccak(A || x) seen in the trace (mapping entries keyed by A)."""
    padded = {"0x" + "0" * 24 + a[2:].lower(): a for a in addresses}
    found: dict[str, list[int]] = {a: [] for a in padded.values()}
    for pre in preimages:
        owner = padded.get(pre[:66].lower())
        if owner is not None:
            found[owner].append(int.from_bytes(keccak256(bytes.fromhex(pre[2:])), "big"))
    return found


def _fault(role: Role, address: str, rule: str, what: str, detail: str = "") -> BundlerFault:
    """``what`` in the reference bundler's words, then the rule and who broke it."""
    return BundlerFault(
        BANNED_OPCODE,
        f"{what} [{rule}] ({role} {address}{detail})",
        {role: address, "rule": rule},
    )


class _Judge:
    """The rules for one entity's phase."""

    def __init__(
        self,
        role: Role,
        address: str,
        phase: Phase,
        sender: str,
        entry_point: str,
        op: UserOperation,
        staked: Mapping[Role, bool],
        slots: Mapping[str, list[int]],
    ) -> None:
        self.role = role
        self.address = address
        self.phase = phase
        self.sender = sender
        self.entry_point = entry_point
        self.op = op
        self.staked = staked
        self.is_staked = bool(staked.get(role, False))
        self.slots = slots

    def fail(self, rule: str, what: str, detail: str = "") -> BundlerFault:
        return _fault(self.role, self.address, rule, what, detail)

    def _where(self, contract: str) -> str:
        return "" if contract == self.address else f", in contract {contract}"

    def _banned(self, rule: str, opcode: str, contract: str, why: str = "") -> BundlerFault:
        prefix = "unstaked " if rule == "OP-080" else ""
        return self.fail(
            rule, f"{prefix}{self.role} uses banned opcode: {opcode}", self._where(contract) + why
        )

    def gas(self) -> None:
        if self.phase.oog:
            raise self.fail(
                "OP-020", f"{self.role} internally reverts on oog", ": an inner call hit its limit"
            )

    def opcodes(self) -> None:
        for opcode, where in sorted(self.phase.opcodes.items()):
            contract = min(where)
            if opcode in BANNED:
                raise self._banned("OP-011", opcode, contract)
            if opcode == "GAS":
                raise self._banned("OP-012", "GAS", contract, ": not followed by a *CALL")
            if opcode in STAKED_ONLY and not self.is_staked:
                raise self._banned("OP-080", opcode, contract, ": allowed only when staked")
            if opcode not in _KNOWN:
                raise self._banned("OP-013", opcode, contract, ": unassigned")

    def creates(self) -> None:
        created = [c for c in self.phase.calls if c.type == "CREATE2"]
        count = sum(self.phase.opcodes.get("CREATE2", {}).values())
        if self.role != "factory" and (created or count):
            raise self._banned(
                "OP-031", "CREATE2", self.address, ": only the factory may, to deploy the sender"
            )
        if len(created) > 1 or count > 1:
            times = max(count, len(created))
            raise self._banned("OP-031", "CREATE2", self.address, f": {times} times, one allowed")
        for call in created:
            if call.to != self.sender:
                raise self._banned(
                    "OP-031", "CREATE2", self.address, f": made {call.to}, not the sender"
                )
        creators = self.phase.opcodes.get("CREATE", {})
        for contract in sorted(creators):
            # OP-032: only the sender itself, and only when this op deploys it.
            if not (self.op.deploys and contract == self.sender):
                raise self._banned("OP-032", "CREATE", contract)

    def calls(self) -> None:
        for call in self.phase.calls:
            if call.type in ("CREATE", "CREATE2"):
                continue
            if call.to == self.entry_point and call.from_ != self.entry_point:
                if call.method == _DEPOSIT_TO:
                    continue  # OP-052
                if call.method == "0x" and call.from_ == self.sender:
                    continue  # OP-053: the sender pays its prefund through the fallback
                raise self.fail(
                    "OP-054",
                    f"illegal call into EntryPoint during validation {call.method}",
                    f", from {call.from_}: only depositTo and the sender's fallback are allowed",
                )
            if call.type in ("CALL", "CALLCODE") and int(call.value, 16) != 0:
                raise self.fail(
                    "OP-061",
                    "May not make a CALL with value",
                    f": {call.from_} sent {int(call.value, 16)} wei to {call.to}",
                )

    def code(self) -> None:
        for address, access in sorted(self.phase.code.items()):
            if access.size < 0:
                continue  # a precompile of the node's fork: pure functions (OP-062)
            if access.size == 0 and address != self.sender:
                if int(address, 16) < 0x10000:
                    raise self.fail(
                        "OP-062",
                        f"Illegal call to forbidden precompile {address}",
                        ": not a precompile this chain knows",
                    )
                raise self.fail(
                    "OP-041",
                    f"{self.role} accesses un-deployed contract address {address} with opcode "
                    f"{access.op}",
                )
        for opcode, where in sorted(self.phase.ext.items()):
            contract = min(where)
            raise self.fail(
                "OP-054",
                f"{self.role} accesses EntryPoint contract address {self.entry_point} with "
                "EXTCODE* opcode",
                f"{self._where(contract)}: {opcode}, only EXTCODESIZE ISZERO is allowed",
            )

    def _associated(self, slot: int, owner: str) -> bool:
        if slot == int(owner, 16):
            return True
        return any(base <= slot < base + _ASSOCIATED_SPAN for base in self.slots.get(owner, ()))

    def storage(self) -> None:
        needs_stake: tuple[str, str, str] | None = None  # (rule, contract, slot)
        deploying = self.op.deploys
        factory_staked = bool(self.staked.get("factory", False))
        for contract, access in sorted(self.phase.storage.items()):
            if contract == self.sender:
                continue  # STO-010: the account's own storage
            if contract == self.entry_point:
                continue  # deposits; who may call the EntryPoint is OP-052..054's
            for slot_hex in sorted({*access.w, *access.r}):
                slot = int(slot_hex, 16)
                written = slot_hex in access.w
                if self._associated(slot, self.sender):
                    if deploying and not (self.role == "account" and factory_staked):
                        needs_stake = needs_stake or ("STO-021", contract, slot_hex)
                elif self.address != self.sender and self._associated(slot, self.address):
                    needs_stake = needs_stake or ("STO-032", contract, slot_hex)
                elif contract == self.address:
                    needs_stake = needs_stake or ("STO-031", contract, slot_hex)
                elif not written:
                    needs_stake = needs_stake or ("STO-033", contract, slot_hex)
                else:
                    raise self.fail(
                        "STO-033",
                        f"{self.role} has forbidden write to {self._name(contract)} slot "
                        f"{slot_hex}",
                        ": not associated with the sender or the entity, no stake allows it",
                    )
        if needs_stake is not None and not self.is_staked:
            rule, contract, slot_hex = needs_stake
            kind = {
                "STO-021": "the sender's associated storage while the sender is deployed by "
                "an unstaked factory",
                "STO-031": "its own storage",
                "STO-032": "storage associated with itself",
                "STO-033": "storage of another contract",
            }[rule]
            # -32502 as the reference answers: the trace broke a rule (staking would lift it).
            raise self.fail(
                rule,
                f"unstaked {self.role} accessed {self._name(contract)} slot {slot_hex}",
                f": {kind} needs stake",
            )

    def _name(self, contract: str) -> str:
        """The reference bundler's name of a contract in storage messages."""
        for role, address in (
            ("account", self.sender),
            ("factory", (self.op.factory or "").lower() if self.op.deploys else ""),
            ("paymaster", (self.op.paymaster or "").lower()),
            ("entryPoint", self.entry_point),
        ):
            if contract == address:
                return role
        return contract
