"""Who is subscribed to what, on one chain/network: pure bookkeeping, no I/O.

A subscription belongs to a sink (one client connection) and has a kind.  The hub walks
``of_kind(kind)`` to fan an event out; the sources behind ``newPendingTransactions`` and
``syncing`` poll only while ``count(kind)`` is above zero (``changed`` tells them when).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from chaingate.ws.filters import LogFilter
from chaingate.ws.protocol import new_subscription_id, push_prefix

KINDS = ("newHeads", "logs", "newPendingTransactions", "syncing")


class Sink(Protocol):
    """A client connection as the fan-out sees it: never awaited, never blocks."""

    def push(self, frame: bytes, cu: int) -> None:
        """Queue one framed message (or drop the connection if its queue is full)."""
        ...


class Subscription:
    __slots__ = ("full", "id", "kind", "log_filter", "prefix", "sink")

    def __init__(
        self,
        kind: str,
        sink: Sink,
        log_filter: LogFilter | None = None,
        full: bool = False,
        subscription_id: str | None = None,
    ) -> None:
        self.id = subscription_id or new_subscription_id()
        self.kind = kind
        self.sink = sink
        self.log_filter = log_filter
        self.full = full  # newPendingTransactions: whole transaction objects, not hashes
        self.prefix = push_prefix(self.id)

    @property
    def cost(self) -> int:
        """Filter bytes this subscription holds (see ``chaingate.ws.caps``)."""
        return self.log_filter.cost if self.log_filter is not None else 0


class Registry:
    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, Subscription]] = {kind: {} for kind in KINDS}
        # Called with the kind whenever a kind gains its first or loses its last subscriber.
        self.changed: Callable[[str], None] = lambda kind: None

    def add(self, subscription: Subscription) -> None:
        subs = self._by_kind[subscription.kind]
        subs[subscription.id] = subscription
        if len(subs) == 1:
            self.changed(subscription.kind)

    def remove(self, subscription: Subscription) -> bool:
        subs = self._by_kind[subscription.kind]
        if subs.pop(subscription.id, None) is None:
            return False
        if not subs:
            self.changed(subscription.kind)
        return True

    def of_kind(self, kind: str) -> dict[str, Subscription]:
        """The live mapping (do not mutate while iterating: copy first if pushes may drop)."""
        return self._by_kind[kind]

    def count(self, kind: str | None = None) -> int:
        if kind is not None:
            return len(self._by_kind[kind])
        return sum(len(subs) for subs in self._by_kind.values())
