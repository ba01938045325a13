"""ERC-7562 reputation of the entities a UserOperation names (sans-IO).

Per entity address: ``ops_seen`` (unique valid operations naming it that this bundler
accepted) and ``ops_included`` (those that appeared on chain).  The status follows ERC-7562's
"Reputation Calculation":

    max_seen = ops_seen // MIN_INCLUSION_RATE_DENOMINATOR
    BANNED     if max_seen > ops_included + BAN_SLACK
    THROTTLED  if max_seen > ops_included + THROTTLING_SLACK
    OK         otherwise

Both counters decay every hour (``value * 23 // 24``), driven by an injected clock, never wall
time read here: ``tick()`` (which every reading call runs first) applies the hours that passed
since the last decay.  GREP-040: an
entity that breaks a bundle after passing the second validation gets ``ops_seen +=
BAN_OPS_SEEN_PENALTY`` and ``ops_included = 0`` (banned at once, and for days).

The table is bounded (``max_entries``): when full, the OK entities with the fewest ops seen are
forgotten first — forgetting an OK entity changes nothing it may do, forgetting a throttled or
banned one would pardon it, so those are kept.  Changes since the last ``take_changes()`` are
tracked so the service persists only what moved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Literal

import msgspec

from chaingate.bundler.errors import STAKE_TOO_LOW, THROTTLED, BundlerFault

__all__ = [
    "BAN_OPS_SEEN_PENALTY",
    "BUNDLER_PARAMS",
    "CLIENT_PARAMS",
    "MAX_OPS_ALLOWED_UNSTAKED_ENTITY",
    "MIN_UNSTAKE_DELAY",
    "SAME_SENDER_MEMPOOL_COUNT",
    "SAME_UNSTAKED_ENTITY_MEMPOOL_COUNT",
    "THROTTLED_ENTITY_BUNDLE_COUNT",
    "THROTTLED_ENTITY_LIVE_BLOCKS",
    "THROTTLED_ENTITY_MEMPOOL_COUNT",
    "Reputation",
    "ReputationChanges",
    "ReputationEntry",
    "ReputationParams",
    "Status",
]

# ERC-7562 "Constants".
MIN_UNSTAKE_DELAY = 86400
SAME_SENDER_MEMPOOL_COUNT = 4
SAME_UNSTAKED_ENTITY_MEMPOOL_COUNT = 10
THROTTLED_ENTITY_MEMPOOL_COUNT = 4
THROTTLED_ENTITY_LIVE_BLOCKS = 10
THROTTLED_ENTITY_BUNDLE_COUNT = 4
BAN_OPS_SEEN_PENALTY = 10000
MAX_OPS_ALLOWED_UNSTAKED_ENTITY = 10000
# The reference bundler's UREP-020 scaling of the inclusion rate (a rate of 1 adds 10 ops).
INCLUSION_RATE_FACTOR = 10

DECAY_INTERVAL_S = 3600
# After this many hourly decays every counter below 2**64 has reached 0 (23/24 per hour).
_DECAYS_TO_ZERO = 1100

Status = Literal["ok", "throttled", "banned"]
Title = Literal["account", "paymaster", "factory", "aggregator"]


class ReputationParams(msgspec.Struct, frozen=True):
    min_inclusion_denominator: int
    throttling_slack: int = 10
    ban_slack: int = 50


# A bundler judges the entities of operations it bundles itself; a "client" (a node that only
# relays to the mempool) sees fewer inclusions per op and so allows a lower inclusion rate.
BUNDLER_PARAMS = ReputationParams(min_inclusion_denominator=10)
CLIENT_PARAMS = ReputationParams(min_inclusion_denominator=100)


class ReputationEntry(msgspec.Struct, frozen=True):
    """One entity's counters, as ``debug_bundler_dumpReputation`` shows and the store keeps."""

    address: str  # 0x + 40 lowercase hex
    ops_seen: int
    ops_included: int


class ReputationChanges(msgspec.Struct, frozen=True):
    """What ``Reputation.take_changes`` returned, and the table's last decay time: what the
    store writes (with an admission's entries, in its transaction)."""

    upserts: list[ReputationEntry]
    deletes: list[str]
    decayed_at_ms: int

    def __bool__(self) -> bool:
        return bool(self.upserts or self.deletes)


def _key(address: str) -> str:
    return address.lower()


class Reputation:
    """The reputation table of one network's bundler."""

    def __init__(
        self,
        params: ReputationParams = BUNDLER_PARAMS,
        *,
        min_stake: int,
        min_unstake_delay: int = MIN_UNSTAKE_DELAY,
        clock: Callable[[], float] = time.time,
        max_entries: int = 100_000,
        whitelist: Iterable[str] = (),
        blacklist: Iterable[str] = (),
    ) -> None:
        if params.min_inclusion_denominator <= 0:
            raise ValueError("min_inclusion_denominator must be positive")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.params = params
        self.min_stake = min_stake
        self.min_unstake_delay = min_unstake_delay
        self.max_entries = max_entries
        self._clock = clock
        self._seen: dict[str, int] = {}
        self._included: dict[str, int] = {}
        self.whitelist = frozenset(_key(a) for a in whitelist)
        self.blacklist = frozenset(_key(a) for a in blacklist)
        self.decayed_at = clock()  # seconds on the injected clock
        self._changed: set[str] = set()

    # --- counters --------------------------------------------------------------------------

    def status(self, address: str | None) -> Status:
        self.tick()
        if address is None:
            return "ok"
        key = _key(address)
        if key in self.whitelist:
            return "ok"
        if key in self.blacklist:
            return "banned"
        seen = self._seen.get(key)
        if seen is None:
            return "ok"  # new entities start OK
        max_seen = seen // self.params.min_inclusion_denominator
        included = self._included.get(key, 0)
        if max_seen > included + self.params.ban_slack:
            return "banned"
        if max_seen > included + self.params.throttling_slack:
            return "throttled"
        return "ok"

    def entry(self, address: str) -> ReputationEntry:
        key = _key(address)
        return ReputationEntry(key, self._seen.get(key, 0), self._included.get(key, 0))

    def seen(self, address: str | None, delta: int = 1) -> None:
        """A unique valid operation naming ``address`` was accepted (``delta`` -1: EREP-015's
        correction when a paymaster was not to blame); never below 0."""
        if address is None:
            return
        self.tick()
        key = self._touch(address)
        self._seen[key] = max(0, self._seen[key] + delta)

    def included(self, address: str | None) -> None:
        """An operation naming ``address`` that this bundler had seen was included."""
        if address is None:
            return
        self.tick()
        key = self._touch(address)
        self._included[key] += 1

    def crashed_handle_ops(self, address: str | None) -> None:
        """GREP-040: ``address`` failed the bundle after passing the second validation."""
        if address is None:
            return
        self.tick()
        key = self._touch(address)
        self._seen[key] += BAN_OPS_SEEN_PENALTY
        self._included[key] = 0

    def tick(self) -> int:
        """Apply the hourly decays due by the clock; return how many hours were applied.
        Every reading and counting call ticks first, so no timer is needed (a service may
        still tick from its loop to persist decayed rows promptly)."""
        now = self._clock()
        hours = int((now - self.decayed_at) // DECAY_INTERVAL_S)
        if hours <= 0:
            return 0
        self.decayed_at += hours * DECAY_INTERVAL_S
        if hours >= _DECAYS_TO_ZERO:
            self._changed.update(self._seen)
            self._seen.clear()
            self._included.clear()
            return hours
        for key in list(self._seen):
            seen, included = self._seen[key], self._included[key]
            for _ in range(hours):
                seen = seen * 23 // 24
                included = included * 23 // 24
                if seen == 0 and included == 0:
                    break
            self._changed.add(key)
            if seen == 0 and included == 0:
                del self._seen[key], self._included[key]
            else:
                self._seen[key], self._included[key] = seen, included
        return hours

    def _touch(self, address: str) -> str:
        key = _key(address)
        if key not in self._seen:
            if len(self._seen) >= self.max_entries:
                self._evict()
            self._seen[key] = 0
            self._included[key] = 0
        self._changed.add(key)
        return key

    def _evict(self) -> None:
        """Forget the OK entities with the fewest ops seen, down to 90% of the bound (amortised:
        one sort per tenth of the table's worth of new entities)."""
        target = self.max_entries * 9 // 10
        ok = sorted((k for k in self._seen if self.status(k) == "ok"), key=self._seen.__getitem__)
        for key in ok[: max(1, len(self._seen) - target)]:
            del self._seen[key], self._included[key]
            self._changed.add(key)
        if len(self._seen) >= self.max_entries:
            # Nothing OK left to forget: every tracked entity is throttled or banned.  The
            # least-seen of those goes, rather than refusing to track a new one.
            victim = min(self._seen, key=self._seen.__getitem__)
            del self._seen[victim], self._included[victim]
            self._changed.add(victim)

    # --- checks ----------------------------------------------------------------------------

    def is_staked(self, stake: int, unstake_delay_sec: int) -> bool:
        return stake >= self.min_stake and unstake_delay_sec >= self.min_unstake_delay

    def entity_fault(
        self, title: Title, address: str | None, *, throttled_ok: bool = True
    ) -> BundlerFault | None:
        """The refusal for an entity of this status, or None: banned is always refused;
        throttled only when ``throttled_ok`` is False (the caller's limit for throttled
        entities is reached)."""
        status = self.status(address)
        if status == "banned" or (status == "throttled" and not throttled_ok):
            return BundlerFault(
                THROTTLED,
                f"{title} {_key(address or '')} is {status}",
                {title: _key(address or "")},
            )
        return None

    def check_entity(self, title: Title, address: str | None, *, throttled_ok: bool = True) -> None:
        """Raise ``entity_fault``'s refusal, if any."""
        fault = self.entity_fault(title, address, throttled_ok=throttled_ok)
        if fault is not None:
            raise fault

    def check_stake(self, title: Title, address: str, stake: int, unstake_delay_sec: int) -> None:
        """Raise STAKE_TOO_LOW unless the entity is staked enough (whitelisted ones pass);
        a banned entity is refused first, as the reference bundler does."""
        key = _key(address)
        if key in self.whitelist:
            return
        self.check_entity(title, key)
        if stake < self.min_stake:
            what = "is unstaked" if stake == 0 else f"stake {stake} is too low"
            raise BundlerFault(
                STAKE_TOO_LOW,
                f"{title} {key} {what} (min={self.min_stake})",
                {title: key, "minimumStake": hex(self.min_stake)},
            )
        if unstake_delay_sec < self.min_unstake_delay:
            raise BundlerFault(
                STAKE_TOO_LOW,
                f"{title} {key} unstake delay {unstake_delay_sec} is too low"
                f" (min={self.min_unstake_delay})",
                {title: key, "minimumUnstakeDelay": hex(self.min_unstake_delay)},
            )

    def max_mempool_ops_unstaked(self, title: Title, address: str) -> int:
        """How many operations an unstaked entity may have in the mempool: UREP-010 for an
        account, UREP-020 (grows with its inclusions) for the others."""
        if title == "account":
            return SAME_SENDER_MEMPOOL_COUNT
        self.tick()
        key = _key(address)
        seen = self._seen.get(key, 0)
        included = self._included.get(key, 0)
        rate = included / seen if seen > 0 else 0.0
        return (
            SAME_UNSTAKED_ENTITY_MEMPOOL_COUNT
            + int(rate * INCLUSION_RATE_FACTOR)
            + min(included, MAX_OPS_ALLOWED_UNSTAKED_ENTITY)
        )

    # --- debug_bundler_* and persistence ---------------------------------------------------

    def dump(self) -> list[tuple[ReputationEntry, Status]]:
        self.tick()
        return [(self.entry(k), self.status(k)) for k in sorted(self._seen)]

    def set_reputation(self, entries: Iterable[ReputationEntry]) -> None:
        """Put these counters in place (debug_bundler_setReputation, and loading at start)."""
        for e in entries:
            if e.ops_seen < 0 or e.ops_included < 0:
                raise ValueError(f"{e.address}: counters cannot be negative")
            key = self._touch(e.address)
            self._seen[key] = e.ops_seen
            self._included[key] = e.ops_included

    def load(self, entries: Iterable[ReputationEntry], decayed_at: float | None) -> None:
        """Restore what the store kept; the next ``tick`` applies the hours missed while down."""
        self.set_reputation(entries)
        if decayed_at is not None:
            self.decayed_at = decayed_at
        self._changed.clear()

    def clear(self) -> None:
        self._changed.update(self._seen)
        self._seen.clear()
        self._included.clear()

    def take_changes(self) -> tuple[list[ReputationEntry], list[str]]:
        """(entries to save, addresses to delete) since the last call."""
        upserts = [self.entry(k) for k in sorted(self._changed) if k in self._seen]
        deletes = sorted(k for k in self._changed if k not in self._seen)
        self._changed.clear()
        return upserts, deletes

    def changes(self) -> ReputationChanges:
        """``take_changes`` with the decay time, as the store writes them."""
        upserts, deletes = self.take_changes()
        return ReputationChanges(upserts, deletes, int(self.decayed_at * 1000))

    def untake(self, changes: ReputationChanges) -> None:
        """The store did not keep ``changes``: they are taken again with the next ones."""
        self._changed.update(e.address for e in changes.upserts)
        self._changed.update(changes.deletes)

    def __len__(self) -> int:
        return len(self._seen)
