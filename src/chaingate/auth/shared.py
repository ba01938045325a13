"""One plan across many processes: rate-limit counters shared through Redis, off the request path.

Every process keeps its own token buckets (``KeyLimiter``) and answers from them alone.  Every
``interval`` a sync task adds this process's consumption per key to running totals in Redis
(``HINCRBY``, which returns the new total) and charges the local buckets for whatever the other
processes consumed since the last sync (``KeyLimiter.absorb``).  Each bucket thus pays for the
key's consumption everywhere, one sync late at most; the debt floor of one second's worth pays
back the extra burst that several full buckets allow at the start.  Day quotas must hold
exactly, so they are not shared after the fact but granted beforehand
(``chaingate.auth.dayquotas``), in the same rhythm.

Redis down: each process keeps enforcing its own limits (fail-open — a Redis outage must not
take the API down), logs it once, and reports it in ``chaingate_shared_limits_up``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import coredis
import trio

from chaingate.auth.dayquotas import AccountDays, DayAllowances
from chaingate.auth.gate import Principal
from chaingate.auth.plans import Limits

log = logging.getLogger("chaingate.auth.shared")

ACTIVE_SECONDS = 10.0  # keys used here this recently keep absorbing others' consumption
RECENT_MS = 1000  # another process's use of a key this recent is paid for at the first look
KEY_TTL = 86_400 * 2
SYNC_TIMEOUT = 1.0  # a sync that takes longer means Redis is away (hung, not only down)
EXIT_WAIT = 2.0  # at exit, how long giving back the units held may take


class Registry(AccountDays, Protocol):
    """What the shared limits read of the key registry (``KeyRegistry``)."""

    def limits_of(self, principal: Principal) -> Limits | None:
        """The current limits of the key's account."""


class SharedLimits:
    def __init__(self, url: str, registry: Registry, interval: float = 0.05) -> None:
        self._url = url
        self._registry = registry
        self._interval = interval
        self._active: dict[Principal, float] = {}
        self._seen: dict[bytes, int] = {}  # Redis counter -> total last seen
        self.quotas = DayAllowances(registry.account_quota, registry.day_limit, registry.day_floor)
        self._quota_lock = trio.Lock()
        self.up = False
        self.syncs = 0
        self.failures = 0

    def note(self, principal: Principal) -> None:
        """Called by the gate for the first request it admits for a key since the last sync
        (the sync then takes the key's pending counts, so the next one notes it again: "used
        recently" to within one interval, at one call per key and interval rather than per
        request), and for each refused for the day quota (a starved process keeps asking for
        units): a dict store, nothing more."""
        self._active[principal] = time.monotonic()

    async def run(self) -> None:
        try:
            client = coredis.Redis.from_url(self._url, decode_responses=False)
            async with client:
                await self._loop(client)
        finally:
            # Graceful exit (a restart): the units held unused go back, or they would be lost
            # for the rest of the day.  Bounded (Redis may be away), and on a client of its
            # own: the loop's went down with the cancellation.
            with trio.CancelScope(shield=True), trio.move_on_after(EXIT_WAIT):
                try:
                    async with coredis.Redis.from_url(self._url, decode_responses=False) as last:
                        await self.quotas.give_back_all(last)
                except (coredis.exceptions.RedisError, OSError, TimeoutError) as exc:
                    log.warning(
                        "day-quota units not given back at exit",
                        extra={"fields": {"error": exc.__class__.__name__}},
                    )

    async def _loop(self, client: coredis.Redis[bytes]) -> None:
        while True:
            await trio.sleep(self._interval)
            try:
                with trio.fail_after(SYNC_TIMEOUT):
                    await self._sync(client)
            except (
                coredis.exceptions.RedisError,
                OSError,
                TimeoutError,
                trio.TooSlowError,
            ) as exc:
                self.failures += 1
                self.quotas.release_all()  # fail-open: each process on its own view
                if self.up or self.failures == 1:
                    log.warning(
                        "shared rate limits unavailable: each process enforces its own",
                        extra={"fields": {"error": exc.__class__.__name__}},
                    )
                self.up = False
                await trio.sleep(1.0)  # back off while Redis is away

    async def _sync(self, client: coredis.Redis[bytes]) -> None:
        """One round trip: the active keys' counters and the day quotas' grants (the quota
        lock held: a failure releases every account, ``_loop``; a cancellation at exit keeps
        them held, so that the exit path gives their units back)."""
        now = time.monotonic()
        for principal, last in list(self._active.items()):
            if now - last > ACTIVE_SECONDS and not principal.pending_requests:
                del self._active[principal]
        work: list[tuple[Principal, int, int, Any, Any, Any]] = []
        per_account: dict[str, int] = {}
        now_ms = int(time.time() * 1000)
        async with self._quota_lock:
            async with client.pipeline(transaction=False) as pipe:
                for principal in self._active:
                    requests, units = principal.pending_requests, principal.pending_units
                    principal.pending_requests = principal.pending_units = 0
                    name = b"cg:rl:" + principal.key_id.encode()
                    synced = pipe.hget(name, b"t")  # when a process last added to it
                    total_requests = pipe.hincrby(name, b"r", requests)
                    total_units = pipe.hincrby(name, b"c", units)
                    pipe.hset(name, {b"t": now_ms})
                    pipe.expire(name, KEY_TTL)
                    work.append((principal, requests, units, total_requests, total_units, synced))
                    per_account[principal.account_id] = (
                        per_account.get(principal.account_id, 0) + requests
                    )
                # No key active: still asked, to give back units a starved process needs.
                settle = self.quotas.queue_top_up(client, pipe, per_account)
            for principal, requests, units, total_requests, total_units, synced in work:
                last_sync = await synced
                recent = last_sync is not None and now_ms - int(last_sync) < RECENT_MS
                limits = self._registry.limits_of(principal)
                others_requests = self._others(
                    b"r:" + principal.key_id.encode(),
                    await total_requests,
                    requests,
                    self._first_look_cap(recent, limits.requests_per_second if limits else 0),
                )
                others_units = self._others(
                    b"c:" + principal.key_id.encode(),
                    await total_units,
                    units,
                    self._first_look_cap(recent, limits.compute_units_per_second if limits else 0),
                )
                if others_requests or others_units:
                    principal.limiter.absorb(now, others_requests, others_units)
            await settle()
        self.syncs += 1
        self._mark_up()

    @staticmethod
    def _first_look_cap(recent: bool, rate: int) -> int:
        """At most one RECENT_MS of the key's rate is charged at a first look (0: nothing)."""
        return rate * RECENT_MS // 1000 if recent else 0

    def _others(self, counter: bytes, total: int, mine: int, cap: int) -> int:
        """What the other processes added to ``counter`` since this process last looked.
        At the first look, what came before is history, not a burst to pay for — unless
        another process added to it within RECENT_MS: then it is the burst they are spending
        now, paid for here too, but at most ``cap`` (one RECENT_MS of the key's rate: the
        total is the key's whole history)."""
        last = self._seen.get(counter)
        self._seen[counter] = total
        if last is None:
            return min(cap, max(0, total - mine))
        return max(0, total - last - mine)

    def _mark_up(self) -> None:
        if not self.up:
            self.up = True
            if self.failures:
                log.info("shared rate limits restored")
