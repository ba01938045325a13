"""The bundler's mempool of validated UserOperations (sans-IO: no node, no store, no clock read
except the injected one).

What it enforces when an operation arrives (``add``), after the validation that produced the
``Entry``:

- de-duplication by userOpHash ("already known");
- replacement of the same (sender, nonce) only with both ``maxFeePerGas`` and
  ``maxPriorityFeePerGas`` raised by at least ``replacement_bump_percent`` (the reference
  bundler's rule and code, -32602), and never of an operation already in a bundle;
- ERC-7562 STO-040: a sender may not be the factory/paymaster of another operation in the pool,
  nor the reverse (-32502, the reference bundler's messages);
- reputation: a banned entity is refused, a throttled one may hold THROTTLED_ENTITY_MEMPOOL_COUNT
  operations (-32504); an unstaked sender SAME_SENDER_MEMPOOL_COUNT (UREP-010), an unstaked
  factory/paymaster its UREP-020 allowance (-32505 "... is unstaked", as the bundler spec tests
  expect); staked ones are bounded too (``staked_entity_max``) — nothing here is unbounded;
- the time range: an operation whose ``valid_until`` falls within ``expiry_margin_s`` (-32503);
- EREP-010: a paymaster's deposit must cover the most its live operations can cost, this one
  included (-32508);
- the size bound: when full, the lowest-fee pending operation is evicted if the new one pays
  more, else the new one is refused; an operation in a bundle being submitted is never evicted.

Bundle selection (``select_bundle``) follows the reference bundler: highest effective tip at the
given base fee first, one operation per sender per bundle (the lowest nonce of its nonce key),
no sender with an operation already in flight, at most THROTTLED_ENTITY_BUNDLE_COUNT operations
of a throttled entity, a gas cap; an operation whose validation touched the storage of another
operation's sender in the bundle (or the reverse) waits for a later bundle (STO-041: the first
one's validation could change what the second one's read).

``precheck`` runs the refusals that need no validation (already known, replacement
underpriced, STO-040, banned or over-limit entities with the stakes the pool last saw) before
any node call.

Lifecycle: pending -> submitted (bundle tx) -> included | pending again (bundle dropped, or the
block reorged away) | failed | dropped.  Every transition returns the new ``Entry`` so the
caller persists exactly what changed (``chaingate.bundler.store``).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import msgspec

from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler.errors import (
    BANNED_OPCODE,
    INVALID_PARAMS,
    PAYMASTER_BALANCE,
    STAKE_TOO_LOW,
    THROTTLED,
    TIME_RANGE,
    BundlerFault,
)
from chaingate.bundler.reputation import (
    SAME_SENDER_MEMPOOL_COUNT,
    THROTTLED_ENTITY_BUNDLE_COUNT,
    THROTTLED_ENTITY_LIVE_BLOCKS,
    THROTTLED_ENTITY_MEMPOOL_COUNT,
    Reputation,
    Status,
    Title,
)

__all__ = [
    "FINAL",
    "LIVE",
    "Added",
    "Entry",
    "EntryStatus",
    "Mempool",
    "MempoolLimits",
    "Selection",
    "Stake",
    "effective_tip",
    "max_cost",
    "new_entry",
    "op_gas",
]

EntryStatus = Literal["pending", "submitted", "included", "failed", "dropped"]
LIVE: tuple[EntryStatus, ...] = ("pending", "submitted")
FINAL: tuple[EntryStatus, ...] = ("included", "failed", "dropped")

_NONCE_SEQ_MASK = (1 << 64) - 1


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Stake(msgspec.Struct, frozen=True):
    """An entity's stake in the EntryPoint, as validation reported it."""

    stake: int = 0
    unstake_delay_sec: int = 0


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One accepted operation and where it is in its lifecycle.  Addresses and hashes are
    0x + lowercase hex; ``op`` keeps the operation exactly as accepted."""

    hash: str
    op: UserOperation
    entry_point: str
    version: Version
    sender: str
    nonce: int
    max_fee_per_gas: int
    max_priority_fee_per_gas: int
    factory: str | None = None
    paymaster: str | None = None
    aggregator: str | None = None
    sender_stake: Stake = Stake()
    factory_stake: Stake = Stake()
    paymaster_stake: Stake = Stake()
    valid_after: int = 0  # seconds (chain time), from validation
    valid_until: int | None = None  # seconds; None (or 0, the EntryPoint's way): no limit
    prefund: int = 0
    # Gas validation used (the EntryPoint's preOpGas, preVerificationGas included): what a
    # bundle's gas cap counts, not verificationGasLimit (0: not known, the limits count).
    pre_op_gas: int = 0
    # (address, EXTCODEHASH) of the contracts validation touched: COD-010 re-checks them.
    code_hashes: tuple[tuple[str, str], ...] = ()
    # The contracts (but the sender) whose storage validation read or wrote: STO-041.
    storage: tuple[str, ...] = ()
    accepted_block: int = 0  # the head when accepted (THROTTLED_ENTITY_LIVE_BLOCKS)
    submitted_at: int = 0  # ms: when the client's eth_sendUserOperation was accepted
    status: EntryStatus = "pending"
    bundle_tx: str | None = None
    block_number: int | None = None
    block_hash: str | None = None
    reason: str | None = None
    updated_at: int = 0  # ms

    def with_(self, **changes: object) -> Entry:
        return msgspec.structs.replace(self, **changes)


def _lower(address: str | None) -> str | None:
    return None if address is None else address.lower()


def new_entry(
    op: UserOperation,
    *,
    user_op_hash: str | bytes,
    entry_point: str,
    version: Version,
    now_ms: int,
    **validation: object,
) -> Entry:
    """An Entry for a validated operation: the fields derived from ``op``, plus what
    validation found (``valid_until``, ``sender_stake``, ``code_hashes``...)."""
    digest = user_op_hash if isinstance(user_op_hash, str) else "0x" + user_op_hash.hex()
    return Entry(
        hash=digest.lower(),
        op=op,
        entry_point=entry_point.lower(),
        version=version,
        sender=op.sender.lower(),
        nonce=op.nonce,
        max_fee_per_gas=op.max_fee_per_gas,
        max_priority_fee_per_gas=op.max_priority_fee_per_gas,
        # The EIP-7702 marker names no factory: no entity to count or blame.
        factory=_lower(op.factory) if op.deploys else None,
        paymaster=_lower(op.paymaster),
        submitted_at=now_ms,
        updated_at=now_ms,
        # The keywords are Entry's own fields (validation's findings), passed on by name.
        **validation,  # type: ignore[arg-type]  # a dict of Entry fields
    )


def expected_gas(entry: Entry) -> int:
    """The gas the operation is expected to use in a bundle, as the reference bundler counts
    it against its cap: validation as simulated (preOpGas) plus the call and postOp limits.
    A limit-sized cap (``op_gas``) would let one operation declaring a large
    verificationGasLimit fill a bundle it does not use (two with 5M each would never share a
    10M bundle: EREP-020's compliance case)."""
    if not entry.pre_op_gas:
        return op_gas(entry)
    op = entry.op
    post_op = (
        op.verification_gas_limit if entry.version == "0.6" and op.paymaster is not None else 0
    )
    return entry.pre_op_gas + op.call_gas_limit + op.paymaster_post_op_gas_limit + post_op


def op_gas(entry: Entry) -> int:
    """The most gas the operation can use in handleOps (what a bundle's gas cap sums): v0.6
    runs postOp under verificationGasLimit, so a paymaster triples it, as the EntryPoint's
    prefund computation does."""
    op = entry.op
    if entry.version == "0.6":
        factor = 3 if op.paymaster is not None else 1
        return op.pre_verification_gas + op.verification_gas_limit * factor + op.call_gas_limit
    return (
        op.pre_verification_gas
        + op.verification_gas_limit
        + op.call_gas_limit
        + op.paymaster_verification_gas_limit
        + op.paymaster_post_op_gas_limit
    )


def max_cost(entry: Entry) -> int:
    """The most the operation can take from its paymaster's (or sender's) deposit: every gas
    limit at maxFeePerGas, the EntryPoint's requiredPrefund."""
    return op_gas(entry) * entry.max_fee_per_gas


def effective_tip(entry: Entry, base_fee: int) -> int:
    """What the bundler earns per gas at this base fee (negative: cannot pay the base fee)."""
    return min(entry.max_priority_fee_per_gas, entry.max_fee_per_gas - base_fee)


class MempoolLimits(msgspec.Struct, frozen=True, kw_only=True):
    max_size: int = 10_000
    same_sender: int = SAME_SENDER_MEMPOOL_COUNT
    staked_entity_max: int = 1_000  # ERC-7562 leaves OK staked entities unlimited; we do not
    throttled_entity: int = THROTTLED_ENTITY_MEMPOOL_COUNT
    throttled_live_blocks: int = THROTTLED_ENTITY_LIVE_BLOCKS
    throttled_bundle: int = THROTTLED_ENTITY_BUNDLE_COUNT
    replacement_bump_percent: int = 10
    expiry_margin_s: int = 30  # an operation must stay valid at least this long to be kept
    max_finals: int = 10_000  # recently finished entries kept for lookups


class Added(msgspec.Struct, frozen=True):
    entry: Entry
    # The operation this one replaced: gone from the pool, ``dropped`` "replaced by <hash>".
    replaced: Entry | None
    evicted: tuple[Entry, ...]  # dropped to make room


class Selection(msgspec.Struct, frozen=True):
    entries: tuple[Entry, ...]  # the bundle, in order; still pending until mark_submitted
    dropped: tuple[Entry, ...]  # removed while selecting (expired, banned entity)


class Mempool:
    """The live operations of one network's bundler (all its entry points)."""

    def __init__(
        self,
        reputation: Reputation,
        limits: MempoolLimits | None = None,
        *,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.reputation = reputation
        self.limits = limits or MempoolLimits()
        self._clock = clock  # epoch milliseconds
        self._live: dict[str, Entry] = {}
        self._order: dict[str, int] = {}  # arrival order (a replacement keeps its place)
        self._next_order = 0
        self._slot: dict[tuple[str, int], str] = {}  # (sender, nonce) -> hash
        self._by_sender: dict[str, set[str]] = {}
        self._entities: Counter[str] = Counter()  # factory/paymaster/aggregator -> live ops
        self._costs: Counter[str] = Counter()  # paymaster -> its live ops' max_cost (EREP-010)
        # (role, address) -> the stakes its live ops recorded, counted: precheck reads the
        # highest of a few distinct values, not every live entry (a factory names them all).
        self._stakes: dict[tuple[Title, str], Counter[Stake]] = {}
        self._finals: OrderedDict[str, Entry] = OrderedDict()

    # --- lookups ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, user_op_hash: str) -> bool:
        return user_op_hash.lower() in self._live

    def get(self, user_op_hash: str) -> Entry | None:
        """A live entry, or a recently finished one."""
        key = user_op_hash.lower()
        return self._live.get(key) or self._finals.get(key)

    def by_sender(self, sender: str) -> list[Entry]:
        """The sender's live operations, by nonce."""
        hashes = self._by_sender.get(sender.lower(), ())
        return sorted((self._live[h] for h in hashes), key=lambda e: e.nonce)

    def entries(self) -> list[Entry]:
        """Live operations in arrival order (debug_bundler_dumpMempool)."""
        return sorted(self._live.values(), key=lambda e: self._order[e.hash])

    def pending(self) -> Iterator[Entry]:
        return (e for e in self._live.values() if e.status == "pending")

    def has_pending(self) -> bool:
        return any(e.status == "pending" for e in self._live.values())

    # --- admission -------------------------------------------------------------------------

    def add(self, entry: Entry, *, paymaster_deposit: int | None = None) -> Added:
        """Admit a validated operation or raise BundlerFault; see the module's rules.
        ``paymaster_deposit``: the paymaster's EntryPoint deposit as validation read it."""
        if entry.status != "pending":
            raise ValueError("only a pending entry can be added")
        self._check_known(entry)
        now_ms = self._clock()
        margin = self.limits.expiry_margin_s
        if entry.valid_until and entry.valid_until <= now_ms // 1000 + margin:
            raise BundlerFault(
                TIME_RANGE,
                f"userOperation expires too soon (validUntil {entry.valid_until};"
                f" it must stay valid at least {margin} s)",
                {"validUntil": entry.valid_until, "validAfter": entry.valid_after},
            )
        old_hash = self._slot.get((entry.sender, entry.nonce))
        old = self._live[old_hash] if old_hash is not None else None
        if old is not None:
            self._check_replacement(old, entry)
            self._unlink(old)  # the checks below judge the pool without the old operation
        try:
            self._check_roles(entry)
            self._check_entities(entry)
            self._check_deposit(entry, paymaster_deposit)
            evicted = self._make_room(entry) if old is None else ()
        except BundlerFault:
            if old is not None:
                self._link(old, self._order.pop(old.hash))
            raise
        replaced = None
        if old is not None:
            replaced = old.with_(
                status="dropped", reason=f"replaced by {entry.hash}", updated_at=now_ms
            )
            self._remember(replaced)
        order = self._order.pop(old.hash) if old is not None else self._take_order()
        self._link(entry, order)
        self._count_seen(entry, 1)
        return Added(entry, replaced, evicted)

    def precheck(self, entry: Entry) -> None:
        """``add``'s refusals that need no validation, before any node call: already known,
        replacement underpriced, STO-040, a banned entity, an entity at its mempool limit —
        judged with the stakes the pool's operations last showed for each entity (an entity
        at its limit has operations here).  Changes nothing."""
        self._check_known(entry)
        entry = entry.with_(
            sender_stake=self._seen_stake(entry.sender, "account"),
            factory_stake=self._seen_stake(entry.factory, "factory"),
            paymaster_stake=self._seen_stake(entry.paymaster, "paymaster"),
        )
        old_hash = self._slot.get((entry.sender, entry.nonce))
        old = self._live[old_hash] if old_hash is not None else None
        if old is not None:
            self._check_replacement(old, entry)
            self._unlink(old)
        try:
            self._check_roles(entry)
            self._check_entities(entry)
        finally:
            if old is not None:
                self._link(old, self._order.pop(old.hash))

    def paymaster_pending_cost(self, paymaster: str, replacing: tuple[str, int]) -> int:
        """EREP-010: what the paymaster's live operations can cost at most, but the one at
        (sender, nonce) ``replacing`` (a replacement frees its share)."""
        key = paymaster.lower()
        replaced = self._live.get(self._slot.get(replacing, ""))
        freed = max_cost(replaced) if replaced is not None and replaced.paymaster == key else 0
        return self._costs[key] - freed

    def _seen_stake(self, address: str | None, title: Title) -> Stake:
        """The stake the pool's live operations recorded for ``address`` in this role (the
        highest, if they differ); none seen: unstaked, which binds no limit at count 0."""
        if address is None or (title != "account" and not self._entities[address]):
            return Stake()
        if title == "account":
            stakes: Iterable[Stake] = [
                self._live[h].sender_stake for h in self._by_sender.get(address, ())
            ]
        else:
            stakes = self._stakes.get((title, address), ())
        return max(stakes, key=lambda s: (s.stake, s.unstake_delay_sec), default=Stake())

    def _check_known(self, entry: Entry) -> None:
        if entry.hash in self._live:
            raise BundlerFault(INVALID_PARAMS, "userOperation already known", {"hash": entry.hash})
        final = self._finals.get(entry.hash)
        if final is not None and final.status == "included":
            raise BundlerFault(INVALID_PARAMS, "userOperation already known", {"hash": entry.hash})

    def _check_deposit(self, entry: Entry, deposit: int | None) -> None:
        """EREP-010 (the replaced operation, if any, is already out of the pool here)."""
        if entry.paymaster is None or deposit is None:
            return
        pending = self.paymaster_pending_cost(entry.paymaster, (entry.sender, entry.nonce))
        needed = pending + max_cost(entry)
        if deposit < needed:
            raise BundlerFault(
                PAYMASTER_BALANCE,
                f"paymaster deposit too low for all its pending operations: {deposit} <"
                f" {needed} (this operation and those in the mempool) [EREP-010]"
                f" (paymaster {entry.paymaster})",
                {"paymaster": entry.paymaster, "deposit": hex(deposit), "needed": hex(needed)},
            )

    def forget(self, added: Added) -> None:
        """Undo ``add`` (the store could not keep it): the entry leaves, the operation it
        replaced and those it evicted come back as they were."""
        entry = added.entry
        if self._live.get(entry.hash) != entry:
            return
        self._unlink(entry)
        order = self._order.pop(entry.hash)
        self._count_seen(entry, -1)
        for back in (added.replaced, *added.evicted):
            if back is None or (back.sender, back.nonce) in self._slot:
                continue
            self._finals.pop(back.hash, None)
            restored = back.with_(status="pending", reason=None)
            self._link(restored, order if back is added.replaced else self._take_order())

    def _check_replacement(self, old: Entry, new: Entry) -> None:
        if old.status != "pending":
            raise BundlerFault(
                INVALID_PARAMS,
                f"the operation with nonce {hex(new.nonce)} of sender {new.op.sender} is in a"
                " bundle being submitted and can no longer be replaced",
                {"hash": old.hash, "bundleTransaction": old.bundle_tx},
            )
        bump = 100 + self.limits.replacement_bump_percent
        for name, before, after in (
            ("maxPriorityFeePerGas", old.max_priority_fee_per_gas, new.max_priority_fee_per_gas),
            ("maxFeePerGas", old.max_fee_per_gas, new.max_fee_per_gas),
        ):
            if after * 100 < before * bump:
                raise BundlerFault(
                    INVALID_PARAMS,
                    f"replacement underpriced: replacement UserOperation must have"
                    f" {name} at least {self.limits.replacement_bump_percent}% higher"
                    f" (old={before} new={after})",
                    {"replaces": old.hash, "field": name, "minimum": hex(-(-before * bump // 100))},
                )

    def _check_roles(self, entry: Entry) -> None:
        """STO-040: an address is either a sender or an entity (factory/paymaster/aggregator)
        among the pool's operations, never both."""
        if self._entities[entry.sender] > 0:
            raise BundlerFault(
                BANNED_OPCODE,
                f'The sender address "{entry.op.sender}" is used as a different entity in'
                " another UserOperation currently in mempool",
                {"sender": entry.sender},
            )
        for title, address in self._entities_of(entry):
            if address in self._by_sender:
                raise BundlerFault(
                    BANNED_OPCODE,
                    f"A {title.capitalize()} at {address} in this UserOperation is used as a"
                    " sender entity in another UserOperation currently in mempool.",
                    {title: address},
                )

    def _check_entities(self, entry: Entry) -> None:
        rep, limits = self.reputation, self.limits
        checks: list[tuple[Title, str, int, Stake | None]] = [
            (
                "account",
                entry.sender,
                len(self._by_sender.get(entry.sender, ())),
                entry.sender_stake,
            )
        ]
        for title, address in self._entities_of(entry):
            stake = {"factory": entry.factory_stake, "paymaster": entry.paymaster_stake}.get(title)
            checks.append((title, address, self._entities[address], stake))
        for title, address, count, stake in checks:
            rep.check_entity(title, address)  # banned: GREP-010
            if rep.status(address) == "throttled" and count >= limits.throttled_entity:
                raise BundlerFault(
                    THROTTLED,
                    f"{title} {address} is throttled: it already has {count} operations in"
                    " the mempool",
                    {title: address},
                )
            staked = stake is not None and rep.is_staked(stake.stake, stake.unstake_delay_sec)
            if staked or address in rep.whitelist:
                if count >= limits.staked_entity_max:
                    raise BundlerFault(
                        THROTTLED,
                        f"{title} {address} already has {count} operations in the mempool",
                        {title: address},
                    )
                continue
            allowed = (
                limits.same_sender
                if title == "account"
                else rep.max_mempool_ops_unstaked(title, address)
            )
            if count >= allowed:
                have = stake.stake if stake is not None else 0
                raise BundlerFault(
                    STAKE_TOO_LOW,
                    f"{title} {address} is unstaked"
                    + (f" (stake {have} or its unstake delay is too low)" if have else "")
                    + f": it may have {allowed} operations in the mempool and has {count}",
                    {title: address, "minimumStake": hex(rep.min_stake)},
                )

    def _make_room(self, entry: Entry) -> tuple[Entry, ...]:
        if len(self._live) < self.limits.max_size:
            return ()
        victim = min(
            (e for e in self._live.values() if e.status == "pending"),
            key=lambda e: (e.max_priority_fee_per_gas, e.max_fee_per_gas, -self._order[e.hash]),
            default=None,
        )
        if victim is None or (victim.max_priority_fee_per_gas, victim.max_fee_per_gas) >= (
            entry.max_priority_fee_per_gas,
            entry.max_fee_per_gas,
        ):
            raise BundlerFault(
                THROTTLED,
                "the mempool is full: raise maxPriorityFeePerGas to outbid its cheapest operation",
                {"size": len(self._live)},
            )
        return (self._finish(victim, "dropped", reason="evicted by a higher-paying operation"),)

    def _count_seen(self, entry: Entry, delta: int) -> None:
        """Reputation: a unique valid operation named these entities (the sender only when it
        is staked, as the reference bundler counts); -1 takes it back."""
        rep = self.reputation
        if rep.is_staked(entry.sender_stake.stake, entry.sender_stake.unstake_delay_sec):
            rep.seen(entry.sender, delta)
        rep.seen(entry.aggregator, delta)
        rep.seen(entry.paymaster, delta)
        rep.seen(entry.factory, delta)

    # --- bundles ---------------------------------------------------------------------------

    def select_bundle(
        self,
        *,
        base_fee: int,
        max_gas: int,
        max_ops: int = 256,
        entry_point: str | None = None,
        block_number: int | None = None,
    ) -> Selection:
        """The next bundle's operations (of one entry point if given).  Expired operations and
        those of banned entities are dropped on the way (returned in ``dropped``)."""
        dropped = list(self.expire(block_number))
        rep = self.reputation
        now_s = self._clock() // 1000
        in_flight = {e.sender for e in self._live.values() if e.status == "submitted"}
        ep = entry_point.lower() if entry_point is not None else None
        # The head of each (sender, nonce key) queue; then one candidate per sender.
        heads: dict[tuple[str, int], Entry] = {}
        for e in self._live.values():
            if e.status != "pending" or e.sender in in_flight:
                continue
            key = (e.sender, e.nonce >> 64)
            if key not in heads or e.nonce < heads[key].nonce:
                heads[key] = e
        best: dict[str, Entry] = {}
        for (sender, _), e in heads.items():
            if (ep is not None and e.entry_point != ep) or e.valid_after > now_s:
                continue
            tip = effective_tip(e, base_fee)
            if tip < 0:
                continue  # cannot pay this base fee: wait for a cheaper block
            if sender not in best or tip > effective_tip(best[sender], base_fee):
                best[sender] = e
        ranked = sorted(
            best.values(),
            key=lambda e: (-effective_tip(e, base_fee), self._order[e.hash]),
        )
        chosen: list[Entry] = []
        known: dict[str, Status] = {}  # each entity's status, read once (selecting changes none)
        per_entity: Counter[str] = Counter()
        senders: set[str] = set()
        touched: set[str] = set()  # storage the chosen operations' validations used
        gas = 0
        for e in ranked:
            if len(chosen) >= max_ops:
                break
            if e.sender in touched or not senders.isdisjoint(e.storage):
                continue  # STO-041: stays pending for a later bundle
            entities = [a for _, a in self._entities_of(e)]
            statuses = [known.get(a) or known.setdefault(a, rep.status(a)) for a in entities]
            if "banned" in statuses:
                dropped.append(self._finish(e, "dropped", reason="an entity is banned"))
                continue
            if any(
                s == "throttled" and per_entity[a] >= self.limits.throttled_bundle
                for a, s in zip(entities, statuses, strict=True)
            ):
                continue
            cost = expected_gas(e)
            if gas + cost > max_gas:
                continue  # a smaller one may still fit
            gas += cost
            per_entity.update(entities)
            senders.add(e.sender)
            touched.update(e.storage)
            chosen.append(e)
        return Selection(tuple(chosen), tuple(dropped))

    def expire(self, block_number: int | None = None) -> list[Entry]:
        """Drop the pending operations that expire within the margin, and (given the head)
        those of throttled entities older than THROTTLED_ENTITY_LIVE_BLOCKS."""
        deadline = self._clock() // 1000 + self.limits.expiry_margin_s
        out = []
        # Each entity's status read once per call, not once per operation naming it (the
        # pool's operations share a few factories and paymasters; dropping changes no count).
        throttled: dict[str, bool] = {}
        for e in list(self._live.values()):
            if e.status != "pending":
                continue
            if e.valid_until and e.valid_until <= deadline:
                out.append(self._finish(e, "dropped", reason="expired"))
            elif (
                block_number is not None
                and block_number - e.accepted_block > self.limits.throttled_live_blocks
                and any(self._throttled(a, throttled) for _, a in self._entities_of(e))
            ):
                out.append(self._finish(e, "dropped", reason="throttled entity: kept too long"))
        return out

    def _throttled(self, address: str, memo: dict[str, bool]) -> bool:
        found = memo.get(address)
        if found is None:
            found = memo[address] = self.reputation.status(address) == "throttled"
        return found

    # --- lifecycle -------------------------------------------------------------------------

    def mark_submitted(self, hashes: Iterable[str], bundle_tx: str) -> list[Entry]:
        """pending -> submitted in the bundle transaction ``bundle_tx`` (also used when a fee
        bump replaces the transaction: the entries move to the new hash)."""
        out = []
        for h in hashes:
            e = self._live.get(h.lower())
            if e is not None:
                out.append(self._replace(e, status="submitted", bundle_tx=bundle_tx.lower()))
        return out

    def requeue(self, hashes: Iterable[str], reason: str) -> list[Entry]:
        """submitted -> pending: the bundle transaction was dropped or never mined."""
        out = []
        for h in hashes:
            e = self._live.get(h.lower())
            if e is not None and e.status == "submitted":
                out.append(self._replace(e, status="pending", bundle_tx=None, reason=reason))
        return out

    def mark_included(
        self, user_op_hash: str, *, block_number: int, block_hash: str, tx_hash: str
    ) -> tuple[Entry | None, list[Entry]]:
        """A UserOperationEvent for this hash: (the entry now included, or None if it was not
        live here; the sender's pending operations this inclusion made stale — same nonce key,
        nonce not above the included one — now dropped)."""
        e = self._live.get(user_op_hash.lower())
        if e is None:
            return None, []
        done = self._finish(
            e,
            "included",
            bundle_tx=tx_hash.lower(),
            block_number=block_number,
            block_hash=block_hash.lower(),
            reason=None,
        )
        rep = self.reputation
        if rep.is_staked(e.sender_stake.stake, e.sender_stake.unstake_delay_sec):
            rep.included(e.sender)
        for _, address in self._entities_of(e):
            rep.included(address)
        key = e.nonce >> 64
        stale = [
            self._finish(o, "dropped", reason=f"nonce used by {e.hash}")
            for o in self.by_sender(e.sender)
            if o.status == "pending" and o.nonce >> 64 == key and o.nonce <= e.nonce
        ]
        return done, stale

    def included(self, user_op_hash: str) -> Entry | None:
        """The entry if this pool holds it as included (recently finished)."""
        e = self._finals.get(user_op_hash.lower())
        return e if e is not None and e.status == "included" else None

    def revert_inclusion(self, user_op_hash: str, *, still_sent: bool = False) -> Entry | None:
        """included -> pending (``still_sent``: submitted, under the same transaction): its
        block was orphaned.  None if this pool no longer holds the entry (the caller restores
        it from the store with ``restore``)."""
        e = self.included(user_op_hash)
        return None if e is None else self.restore(e, still_sent=still_sent)

    def restore(self, entry: Entry, *, still_sent: bool = False) -> Entry | None:
        """Put a finished (or loaded) entry back as pending, without the admission checks it
        passed once — or, ``still_sent``, as submitted in the bundle transaction it names (the
        node still has it: a second bundle of it would revert); None if its (sender, nonce) is
        taken by another live operation."""
        if entry.hash in self._live or (entry.sender, entry.nonce) in self._slot:
            return None
        self._finals.pop(entry.hash, None)
        back = entry.with_(
            status="submitted" if still_sent else "pending",
            bundle_tx=entry.bundle_tx if still_sent else None,
            block_number=None,
            block_hash=None,
            reason="reorged",
            updated_at=self._clock(),
        )
        self._link(back, self._take_order())
        return back

    def mark_failed(self, user_op_hash: str, reason: str) -> Entry | None:
        e = self._live.get(user_op_hash.lower())
        return None if e is None else self._finish(e, "failed", reason=reason)

    def drop(self, user_op_hash: str, reason: str) -> Entry | None:
        e = self._live.get(user_op_hash.lower())
        return None if e is None else self._finish(e, "dropped", reason=reason)

    def drop_entity(self, address: str, reason: str = "an entity is banned") -> list[Entry]:
        """GREP-010: remove every pending operation naming ``address`` (as any role)."""
        key = address.lower()
        return [
            self._finish(e, "dropped", reason=reason)
            for e in list(self._live.values())
            if e.status == "pending"
            and (e.sender == key or any(a == key for _, a in self._entities_of(e)))
        ]

    def load(self, entries: Iterable[Entry]) -> int:
        """Start from what the store kept: live entries as they were (no admission checks:
        they passed them once).  Returns how many were taken."""
        taken = 0
        for e in sorted(entries, key=lambda e: e.submitted_at):
            if e.status not in LIVE or e.hash in self._live:
                continue
            if (e.sender, e.nonce) in self._slot or len(self._live) >= self.limits.max_size:
                continue
            self._link(e, self._take_order())
            taken += 1
        return taken

    def forget_live(self) -> None:
        """A new leader's start (chaingate.cluster): what this process kept while another led
        may have been bundled, included or dropped there; the store's rows are loaded next."""
        for entry in list(self._live.values()):
            self._unlink(entry)
            self._order.pop(entry.hash, None)

    def clear(self) -> list[Entry]:
        """debug_bundler_clearState: every pending operation dropped (those in a bundle being
        submitted stay, or their fate would be lost)."""
        self._finals.clear()
        return [
            self._finish(e, "dropped", reason="cleared")
            for e in list(self._live.values())
            if e.status == "pending"
        ]

    # --- internals -------------------------------------------------------------------------

    @staticmethod
    def _entities_of(entry: Entry) -> list[tuple[Title, str]]:
        out: list[tuple[Title, str]] = []
        if entry.factory is not None:
            out.append(("factory", entry.factory))
        if entry.paymaster is not None:
            out.append(("paymaster", entry.paymaster))
        if entry.aggregator is not None:
            out.append(("aggregator", entry.aggregator))
        return out

    @staticmethod
    def _stakes_of(entry: Entry) -> list[tuple[tuple[Title, str], Stake]]:
        """The factory's and paymaster's stakes the entry recorded (``_seen_stake``'s index;
        ``_replace`` never changes them)."""
        out: list[tuple[tuple[Title, str], Stake]] = []
        if entry.factory is not None:
            out.append((("factory", entry.factory), entry.factory_stake))
        if entry.paymaster is not None:
            out.append((("paymaster", entry.paymaster), entry.paymaster_stake))
        return out

    def _take_order(self) -> int:
        self._next_order += 1
        return self._next_order

    def _link(self, entry: Entry, order: int) -> None:
        self._live[entry.hash] = entry
        self._order[entry.hash] = order
        self._slot[(entry.sender, entry.nonce)] = entry.hash
        self._by_sender.setdefault(entry.sender, set()).add(entry.hash)
        for _, address in self._entities_of(entry):
            self._entities[address] += 1
        for key, stake in self._stakes_of(entry):
            self._stakes.setdefault(key, Counter())[stake] += 1
        if entry.paymaster is not None:
            self._costs[entry.paymaster] += max_cost(entry)

    def _unlink(self, entry: Entry) -> None:
        """Remove from the live indexes (``_order`` is left for the caller)."""
        del self._live[entry.hash]
        del self._slot[(entry.sender, entry.nonce)]
        hashes = self._by_sender[entry.sender]
        hashes.discard(entry.hash)
        if not hashes:
            del self._by_sender[entry.sender]
        for _, address in self._entities_of(entry):
            self._entities[address] -= 1
            if self._entities[address] <= 0:
                del self._entities[address]
        for key, stake in self._stakes_of(entry):
            counted = self._stakes[key]
            counted[stake] -= 1
            if counted[stake] <= 0:
                del counted[stake]
                if not counted:
                    del self._stakes[key]
        if entry.paymaster is not None:
            self._costs[entry.paymaster] -= max_cost(entry)
            if self._costs[entry.paymaster] <= 0:
                del self._costs[entry.paymaster]

    def _replace(self, entry: Entry, **changes: object) -> Entry:
        new = entry.with_(updated_at=self._clock(), **changes)
        self._live[entry.hash] = new
        return new

    def _finish(self, entry: Entry, status: EntryStatus, **changes: object) -> Entry:
        self._unlink(entry)
        self._order.pop(entry.hash, None)
        done = entry.with_(status=status, updated_at=self._clock(), **changes)
        self._remember(done)
        return done

    def _remember(self, done: Entry) -> None:
        self._finals[done.hash] = done
        self._finals.move_to_end(done.hash)
        while len(self._finals) > self.limits.max_finals:
            self._finals.popitem(last=False)
