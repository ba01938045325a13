"""The auth subsystem as the gateway runs it: the key gate and what feeds it.

``AuthService`` builds the key registry (a polling cache of the store's keys and plans), the
``KeyGate`` the edge admits requests through, the usage writer that flushes its meter, and the
limits shared through Redis when configured.
"""

from __future__ import annotations

import trio

from chaingate.auth.gate import Principal
from chaingate.auth.keygate import KeyGate, KeyRegistry
from chaingate.auth.plans import Plans
from chaingate.auth.shared import SharedLimits
from chaingate.auth.store import AuthRows
from chaingate.auth.usage import UsageWriter
from chaingate.config import AuthSettings, ConfigError, Settings, config_file
from chaingate.store import Store
from chaingate.twins import Impl


class AuthService:
    def __init__(self, settings: Settings, store: Store, impl: Impl) -> None:
        if not settings.auth.pepper:
            raise ConfigError(
                "auth.pepper is required when API keys are enabled: set CHAINGATE_AUTH__PEPPER "
                "to a long random secret (it must stay the same, or every key stops working)"
            )
        self.settings: AuthSettings = settings.auth
        plans = Plans.load(config_file(settings, settings.auth.plans_file))
        rows = AuthRows(store)
        self.keys = KeyRegistry(rows, plans, settings.auth.pepper.encode(), impl.limiter)
        self.gate = KeyGate(self.keys, impl.limiter, impl.fastlane)
        self.usage_writer = UsageWriter(rows, self.gate.meter, self.gate.latency, self.keys)
        self.shared: SharedLimits | None = None
        if settings.auth.redis_url:
            self.shared = self.gate.shared = self.keys.shared = SharedLimits(
                settings.auth.redis_url, self.keys
            )

    def logs_range_of(self, principal: Principal) -> int:
        """The widest eth_getLogs range a caller's plan allows (0: the network's limit)."""
        limits = self.keys.limits_of(principal)
        return limits.logs_max_block_range if limits is not None else 0

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests, ready once the keys are loaded; the usage writer and shared
        limits run beside."""
        if self.shared is not None:
            nursery.start_soon(self.shared.run)  # first: the keys' first load asks it
        await nursery.start(self.keys.run, self.settings.refresh_interval)
        nursery.start_soon(self.usage_writer.run, self.settings.usage_flush_interval)

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """None: every process meters and flushes its own usage (additive rows)."""

    def shutdown(self) -> None:
        """Nothing to drain: usage not yet flushed is flushed when the writer is cancelled."""
