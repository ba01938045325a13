"""Plans: requests per second, requests per day, compute units per second, WebSocket caps."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec


class Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # Requests per second of each key (a batch of N calls is N), requests per UTC day of the
    # account, and compute units per second of each key (a method's units are in
    # config/methods.toml, a REST route's in config/rest.toml).
    requests_per_second: int = 0
    requests_per_day: int = 0
    compute_units_per_second: int = 0
    # WebSocket: open connections per API key, subscriptions per connection (0: only the
    # server's own ceilings in [ws] apply).
    ws_connections: int = 0
    ws_subscriptions: int = 0
    # WebSocket logs filters: addresses and topic alternatives (all positions together) in
    # one filter, and filter bytes (20 per address, 32 per topic) held per connection and
    # per key (0: only [ws]'s ceilings apply; there is none per key).
    ws_filter_addresses: int = 0
    ws_filter_topics: int = 0
    ws_filter_bytes_per_connection: int = 0
    ws_filter_bytes_per_key: int = 0
    # Webhooks per account, addresses (filter values) per webhook, deliveries per account per
    # UTC day (past it events are held, not lost, until the next day opens).  0: only
    # [webhooks]' ceilings apply.
    webhooks: int = 0
    webhook_addresses: int = 0
    webhook_deliveries_per_day: int = 0
    # The widest eth_getLogs block range (0: the network's logs.max_block_range; a plan
    # value never raises it above that).
    logs_max_block_range: int = 0


class PlanError(ValueError):
    """An unknown plan or malformed limits; the message says which."""


class Plans:
    def __init__(self, plans: dict[str, Limits]) -> None:
        self._plans = plans

    @property
    def names(self) -> list[str]:
        return sorted(self._plans)

    @classmethod
    def load(cls, path: Path) -> Plans:
        try:
            data = tomllib.loads(path.read_text())
            return cls({name: msgspec.convert(raw, Limits) for name, raw in data.items()})
        except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise PlanError(f"cannot read plans from {path}: {exc}") from None

    def limits(self, plan: str, overrides_json: str | None = None) -> Limits:
        """The plan's limits, replaced by the account's own where it has any."""
        base = self._plans.get(plan)
        if base is None:
            raise PlanError(f"unknown plan {plan!r} (known: {', '.join(self.names)})")
        if not overrides_json:
            return base
        try:
            overrides = msgspec.json.decode(overrides_json, type=dict[str, int])
            return msgspec.convert({**msgspec.structs.asdict(base), **overrides}, Limits)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise PlanError(f"invalid account limits {overrides_json!r}: {exc}") from None
