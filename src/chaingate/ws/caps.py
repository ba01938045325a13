"""What one WebSocket connection may hold: the plan's caps bounded by the server's ceilings.

Pure bookkeeping, no I/O.  ``caps_for`` resolves a key's plan (``config/plans.toml``, or the
account's own values) against ``[ws]``: a plan's 0 means "no plan cap", so the ceiling
applies; a ceiling of 0 (only ``max_filter_bytes_per_connection`` may be 0) means none.
Each cap keeps the name of the setting it came from, so a refusal can say which limit it
hit and its value.

``logs`` filters are charged in **filter bytes**: 20 per distinct address and 32 per
distinct topic value (the values' binary size), against a budget per connection and one per
API key (all of the key's connections on this process).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from chaingate.auth.plans import Limits
from chaingate.config import WebSocketSettings


class Limit(NamedTuple):
    value: int  # 0: unlimited
    name: str  # the setting it comes from, as the client is told

    def exceeded_by(self, amount: int) -> bool:
        return 0 < self.value < amount


NO_LIMIT = Limit(0, "")


class WsCaps(NamedTuple):
    subscriptions: int  # per connection (always bounded by [ws] max_subscriptions)
    filter_addresses: Limit  # addresses in one logs filter
    filter_topics: Limit  # topic alternatives in one logs filter, all positions together
    filter_bytes_connection: Limit
    filter_bytes_key: Limit


def _bounded(plan: int, plan_name: str, ceiling: int, ceiling_name: str) -> Limit:
    """The smaller of a plan value and a ceiling, either 0 meaning "none"."""
    if plan and (not ceiling or plan <= ceiling):
        return Limit(plan, plan_name)
    return Limit(ceiling, ceiling_name) if ceiling else NO_LIMIT


def caps_for(limits: Limits | None, settings: WebSocketSettings) -> WsCaps:
    """A connection's caps for a key with ``limits`` (None: API keys off, ceilings only)."""
    plan = limits or Limits()
    ceiling = settings.max_subscriptions
    return WsCaps(
        subscriptions=min(plan.ws_subscriptions, ceiling) if plan.ws_subscriptions else ceiling,
        filter_addresses=_bounded(
            plan.ws_filter_addresses,
            "ws_filter_addresses",
            settings.max_filter_addresses,
            "[ws] max_filter_addresses",
        ),
        filter_topics=_bounded(
            plan.ws_filter_topics,
            "ws_filter_topics",
            settings.max_filter_topics,
            "[ws] max_filter_topics",
        ),
        filter_bytes_connection=_bounded(
            plan.ws_filter_bytes_per_connection,
            "ws_filter_bytes_per_connection",
            settings.max_filter_bytes_per_connection,
            "[ws] max_filter_bytes_per_connection",
        ),
        filter_bytes_key=_bounded(plan.ws_filter_bytes_per_key, "ws_filter_bytes_per_key", 0, ""),
    )


class KeyBudgets:
    """Filter bytes held by each API key, over all its connections on this process."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    def held(self, key_id: str) -> int:
        return self._held[key_id]

    def take(self, key_id: str, amount: int) -> None:
        self._held[key_id] += amount

    def give(self, key_id: str, amount: int) -> None:
        left = self._held[key_id] - amount
        if left > 0:
            self._held[key_id] = left
        else:
            del self._held[key_id]


def over_budget(cost: int, connection_held: int, key_held: int, caps: WsCaps) -> Limit | None:
    """The budget a new filter of ``cost`` bytes would overrun, or None."""
    if not cost:
        return None
    if caps.filter_bytes_connection.exceeded_by(connection_held + cost):
        return caps.filter_bytes_connection
    if caps.filter_bytes_key.exceeded_by(key_held + cost):
        return caps.filter_bytes_key
    return None
