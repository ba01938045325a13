"""The ``logs`` subscriptions of one network, indexed so a log only meets filters that could
match it.  Pure bookkeeping, no I/O.

* **Groups.**  Subscriptions with the same filter (same address set, same topic positions)
  share one ``Group``: the filter is stored once (the subscription's own copy is dropped for
  the group's) and checked once per log, then pushed to every member.  Groups share their
  value sets too: two filters with the same 1,000 topics hold one set of them.
* **One key dimension per group.**  A group is filed under each value of one constrained
  dimension — its address set or one topic position — the one with the fewest values, a
  topic0 value counting as ``TOPIC0_WEIGHT`` (topic0 is the event signature, shared by most
  contracts' logs: ``Transfer`` would make a poor key).  A log then looks up its address and
  each of its first four topics in the matching tables: the groups found are the only
  candidates.  Groups with no constrained dimension (a filter of wildcards, at most five of
  them: one per number of positions) are the only ones met by every log.
* **Incremental.**  Adding or removing a subscription costs the size of its filter when it
  makes a new group or empties one, O(1) when it joins or leaves one; nothing is rebuilt.

A bucket holds one group directly, or a dict of groups (an ordered set) when several share
the value.  ``candidates`` copies what it finds, so the caller may yield between candidates
while subscriptions come and go.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaingate.ws.filters import ANY, MAX_TOPICS, FilterKey, LogFilter, Values
from chaingate.ws.registry import Subscription

TOPIC0_WEIGHT = 16
ADDRESS = -1  # the key dimension "address"; 0..3 are topic positions; None: no key


class Group:
    __slots__ = ("dimension", "filter", "members")

    def __init__(self, log_filter: LogFilter, dimension: int | None) -> None:
        self.filter = log_filter
        self.dimension = dimension
        # An ordered set; the fan-out iterates a copy (it may yield while members change).
        self.members: dict[Subscription, None] = {}


Bucket = Group | dict[Group, None]
Key = bytes


class _Held:
    """One value set, and how many groups use it."""

    __slots__ = ("users", "values")

    def __init__(self, values: Values) -> None:
        self.values = values
        self.users = 1


def key_dimension(log_filter: LogFilter) -> int | None:
    """The dimension a filter is filed under (see the module docstring); None: none."""
    best: int | None = None
    score = 0
    if log_filter.addresses is not None:
        best, score = ADDRESS, len(log_filter.addresses)
    for position, wanted in log_filter.checks:
        weight = len(wanted) * (TOPIC0_WEIGHT if position == 0 else 1)
        if best is None or weight < score:
            best, score = position, weight
    return best


class LogIndex:
    def __init__(self) -> None:
        self._groups: dict[FilterKey, Group] = {}
        self._by_address: dict[Key, Bucket] = {}
        self._by_topic: tuple[dict[Key, Bucket], ...] = tuple({} for _ in range(MAX_TOPICS))
        self._anywhere: dict[Group, None] = {}
        self._sets: dict[Values, _Held] = {}  # each distinct value set, once
        self.subscriptions = 0

    @property
    def groups(self) -> int:
        return len(self._groups)

    @property
    def value_sets(self) -> int:
        return len(self._sets)

    @property
    def filed(self) -> int:
        """Entries over every table (a group counts once per value it is filed under)."""
        tables = (self._by_address, *self._by_topic)
        entries = sum(
            1 if isinstance(bucket, Group) else len(bucket)
            for table in tables
            for bucket in table.values()
        )
        return entries + len(self._anywhere)

    # --- updates ---------------------------------------------------------------------------

    def add(self, subscription: Subscription) -> None:
        log_filter = subscription.log_filter or ANY
        group = self._groups.get(log_filter.key)
        if group is None:
            log_filter = self._share(log_filter)
            group = Group(log_filter, key_dimension(log_filter))
            self._groups[log_filter.key] = group
            self._file(group)
        subscription.log_filter = group.filter  # one copy of the values, the group's
        group.members[subscription] = None
        self.subscriptions += 1

    def remove(self, subscription: Subscription) -> bool:
        log_filter = subscription.log_filter or ANY
        group = self._groups.get(log_filter.key)
        if group is None or subscription not in group.members:
            return False
        del group.members[subscription]
        self.subscriptions -= 1
        if not group.members:
            del self._groups[log_filter.key]
            self._unfile(group)
            self._unshare(group.filter)
        return True

    def _share(self, log_filter: LogFilter) -> LogFilter:
        """The filter rebuilt on the value sets other groups already hold, where equal."""
        return LogFilter(
            self._hold(log_filter.addresses), tuple(map(self._hold, log_filter.topics))
        )

    def _hold(self, values: Values | None) -> Values | None:
        if values is None:
            return None
        held = self._sets.get(values)
        if held is None:
            self._sets[values] = _Held(values)
            return values
        held.users += 1
        return held.values

    def _unshare(self, log_filter: LogFilter) -> None:
        for values in (log_filter.addresses, *log_filter.topics):
            if values is not None:
                held = self._sets[values]
                held.users -= 1
                if not held.users:
                    del self._sets[values]

    def _table(self, group: Group) -> tuple[dict[Key, Bucket], Values]:
        dimension = group.dimension
        log_filter = group.filter
        if dimension == ADDRESS:
            assert log_filter.addresses is not None
            return self._by_address, log_filter.addresses
        assert dimension is not None
        values = log_filter.topics[dimension]
        assert values is not None
        return self._by_topic[dimension], values

    def _file(self, group: Group) -> None:
        if group.dimension is None:
            self._anywhere[group] = None
            return
        table, values = self._table(group)
        for value in values:
            bucket = table.get(value)
            if bucket is None:
                table[value] = group
            elif isinstance(bucket, Group):
                table[value] = {bucket: None, group: None}
            else:
                bucket[group] = None

    def _unfile(self, group: Group) -> None:
        if group.dimension is None:
            del self._anywhere[group]
            return
        table, values = self._table(group)
        for value in values:
            bucket = table[value]
            if isinstance(bucket, Group):
                del table[value]
                continue
            del bucket[group]
            if len(bucket) == 1:
                table[value] = next(iter(bucket))

    # --- matching --------------------------------------------------------------------------

    def candidates(self, address: Key, topics: Sequence[Key]) -> list[Group]:
        """The groups a log with this address and these topics (see ``filters.log_key``) may
        match: each at most once (a group is filed under one dimension, once per value)."""
        found: list[Group] = []
        bucket = self._by_address.get(address)
        if bucket is not None:
            if isinstance(bucket, Group):
                found.append(bucket)
            else:
                found.extend(bucket)
        for table, value in zip(self._by_topic, topics, strict=False):
            bucket = table.get(value)
            if bucket is not None:
                if isinstance(bucket, Group):
                    found.append(bucket)
                else:
                    found.extend(bucket)
        if self._anywhere:
            found.extend(self._anywhere)
        return found
