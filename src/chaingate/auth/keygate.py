"""API keys, scopes, plans and rate limits on every request — with no store call per request.

``KeyRegistry`` keeps every key and account in memory (by keyed hash, and by the raw key for
keys seen recently, so the HMAC is computed once per key, not per request) and polls the store
for changes every ``refresh_interval``: a revoked key stops working within that interval in
every process sharing the store.

``KeyGate`` implements the gate: 401 for a missing, malformed, unknown or revoked key; 403 for
a missing scope, a test key on a network that is not a testnet, or an origin or client address
the key's allowlists (``chaingate.auth.allowlists``) do not name; 429 when the key's token
buckets or its account's day quota are exhausted.

Failed authentications are limited per client address (an IPv6 client is its /64, see
``chaingate.peers``), and that limit is checked *before* the key is looked at: an address
over it gets 429 whatever key it sends — the right key included — so a guesser learns nothing
from the answers while it is limited.  Such a 429 also closes the connection, and the edge
closes any connection after ``server.max_auth_failures`` 401s: each further guess costs a new
handshake.  Its 401s and 429s carry truthful rate-limit headers.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, defaultdict
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from chaingate.auth import allowlists, apikeys
from chaingate.auth.gate import SCOPES, TWO_KEYS, Credentials, Principal, Rejection
from chaingate.auth.plans import Limits, PlanError, Plans
from chaingate.config.network import Network
from chaingate.framing_constants import DAY_QUOTA, NO_READ_SCOPE, NO_WRITE_SCOPE
from chaingate.obs.metrics import LATENCY_BUCKETS
from chaingate.peers import peer_group
from chaingate.twintypes import fastlane as lane
from chaingate.twintypes.fastlane import Admission, FastlaneModule, LatencyMeter
from chaingate.twintypes.http1 import Request
from chaingate.twintypes.limiter import DayQuota, KeyLimiter, LimiterModule, UsageMeter

if TYPE_CHECKING:
    from chaingate.auth.shared import SharedLimits

log = logging.getLogger("chaingate.auth")

RAW_KEY_CACHE = 100_000  # recently seen raw keys, to skip the HMAC (memory only, never logged)
ANONYMOUS_RPS = 10  # failed authentications allowed per second per client address
ANONYMOUS_PEERS = 10_000
SECONDS_PER_DAY = 86_400
CURSOR_OVERLAP_MS = 5_000


def utc_day(epoch: float) -> int:
    return int(epoch // SECONDS_PER_DAY)


class _Account:
    __slots__ = ("keys", "limits", "quota")

    def __init__(self, limits: Limits, quota: DayQuota) -> None:
        self.limits = limits
        self.quota = quota
        self.keys: list[Principal] = []


class KeyRegistry:
    """Every API key, in memory, kept current by polling the store."""

    def __init__(self, store: Any, plans: Plans, pepper: bytes, limiter: LimiterModule) -> None:
        self._store = store
        self._plans = plans
        self._pepper = pepper
        self._limiter = limiter  # the limiter module (compiled or pure twin)
        self._by_hash: dict[str, Principal] = {}
        self._by_raw: OrderedDict[bytes, Principal] = OrderedDict()
        self._accounts: dict[str, _Account] = {}
        self._key_cursor = 0
        # One refresh at a time: two interleaved ones (the periodic one and one asked for after
        # a change) could apply an older read after a newer one, undoing a revocation until
        # the next round.
        self._refreshing = trio.Lock()
        self._account_cursor = 0
        self._loaded: tuple[int, dict[str, int]] = (-1, {})  # (day, store's totals at start)
        self.used: set[str] = set()  # key ids used since the last touch of last_used_at
        # SharedLimits when processes share limits (Redis): it grants the day quotas.
        self.shared: SharedLimits | None = None

    @property
    def recent(self) -> dict[bytes, Principal]:
        """Raw keys seen recently and their principals (the fast lane reads it directly)."""
        return self._by_raw

    def lookup(self, raw: bytes) -> Principal | None:
        principal = self._by_raw.get(raw)
        if principal is not None:
            return principal
        digest = apikeys.hash_key(self._pepper, raw)
        principal = self._by_hash.get(digest)
        if principal is not None:
            self._by_raw[raw] = principal
            if len(self._by_raw) > RAW_KEY_CACHE:
                self._by_raw.popitem(last=False)
        return principal

    def account_quota(self, account_id: str) -> DayQuota | None:
        account = self._accounts.get(account_id)
        return None if account is None else account.quota

    def limits_of(self, principal: Principal) -> Limits | None:
        """The current limits of the key's account (WebSocket caps are read from here)."""
        account = self._accounts.get(principal.account_id)
        return None if account is None else account.limits

    def day_limit(self, account_id: str) -> int:
        """The account's requests per day (0: unlimited or unknown)."""
        account = self._accounts.get(account_id)
        return 0 if account is None else account.limits.requests_per_day

    def day_floor(self, account_id: str, day: int) -> int:
        """Requests the store had counted for the account on ``day`` at start-up (0 for any
        other day): a floor for the day's shared count, should Redis have lost it."""
        loaded_day, totals = self._loaded
        return totals.get(account_id, 0) if day == loaded_day else 0

    def account_limits(self, account_id: str) -> Limits | None:
        """The current limits of an account (None: not known to this process)."""
        account = self._accounts.get(account_id)
        return None if account is None else account.limits

    async def load(self) -> None:
        """Everything, once, at start-up; then ``refresh`` keeps it current."""
        now = time.time()
        totals = await self._store.day_totals(utc_day(now) * 1440)
        self._loaded = (utc_day(now), {a: requests for a, (requests, _) in totals.items()})
        await self.refresh()
        for account_id, (requests, _units) in totals.items():
            account = self._accounts.get(account_id)
            if account is not None and not self._granted(account_id):
                account.quota.add(utc_day(now), requests)

    def _granted(self, account_id: str) -> bool:
        """Whether the account's day quota is what Redis granted this process."""
        return self.shared is not None and self.shared.quotas.holds(account_id)

    async def run(
        self, interval: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.load()
        task_status.started()
        while True:
            await trio.sleep(interval)
            try:
                await self.refresh()
            except Exception:
                # The previous view stays in force; say so, and try again next round.
                log.exception("key refresh failed")

    async def refresh(self) -> None:
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        # Re-read a window behind the cursor: each process stamps rows with its own clock and a
        # transaction may commit a little after its timestamp, so the newest rows can arrive
        # late.  Applying a row twice is harmless.
        since = self._account_cursor - CURSOR_OVERLAP_MS
        accounts = await self._store.accounts_changed_since(since)
        for row in accounts:
            self._apply_account(row)
            self._account_cursor = max(self._account_cursor, row.updated_at)
        keys = await self._store.keys_changed_since(self._key_cursor - CURSOR_OVERLAP_MS)
        for row in keys:
            self._apply_key(row)
            self._key_cursor = max(self._key_cursor, row.updated_at)

    def _limits(self, plan: str, limits_json: str | None) -> Limits:
        try:
            return self._plans.limits(plan, limits_json)
        except PlanError:
            log.exception("account with an unusable plan: limited to nothing")
            return Limits(
                requests_per_second=1,
                requests_per_day=1,
                compute_units_per_second=1,
                ws_connections=1,
                ws_subscriptions=1,
                ws_filter_addresses=1,
                ws_filter_topics=1,
                ws_filter_bytes_per_connection=1,
                ws_filter_bytes_per_key=1,
            )

    def _apply_account(self, row: Any) -> None:
        limits = self._limits(row.plan, row.limits)
        account = self._accounts.get(row.id)
        if account is None:
            quota = self._limiter.DayQuota(limits.requests_per_day, utc_day(time.time()))
            self._accounts[row.id] = _Account(limits, quota)
            return
        account.limits = limits
        if not self._granted(row.id):
            account.quota.set_limit(limits.requests_per_day)
        for principal in account.keys:
            principal.limiter.set_rates(limits.requests_per_second, limits.compute_units_per_second)
            principal.limits_rps = limits.requests_per_second
            principal.logs_range = limits.logs_max_block_range

    @staticmethod
    def _apply_allowlists(principal: Principal, source: str | None) -> None:
        current = principal.allow
        if (current.source if current is not None else None) == source:
            return  # unchanged: keep the compiled policy (and its verdict cache)
        try:
            principal.allow = allowlists.compile_policy(source)
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
            log.exception("API key with unreadable allowlists: refused until they are set")
            principal.allow = allowlists.Policy.refusing(source)

    def _apply_key(self, row: Any) -> None:
        principal = self._by_hash.get(row.key_hash)
        if principal is not None:
            principal.revoked = row.revoked_at is not None
            self._apply_allowlists(principal, row.allowlists)
            return
        account = self._accounts.get(row.account_id)
        if account is None:
            return  # its account arrives with the next refresh
        limits = account.limits
        scopes = frozenset(row.scopes.split()) if row.scopes else frozenset(SCOPES)
        principal = Principal(
            key_id=row.id,
            account_id=row.account_id,
            prefix=row.prefix,
            environment=row.environment,
            scopes=scopes,
            limiter=self._limiter.KeyLimiter(
                limits.requests_per_second, limits.compute_units_per_second, time.monotonic()
            ),
            quota=account.quota,
            limits_rps=limits.requests_per_second,
            logs_range=limits.logs_max_block_range,
        )
        principal.revoked = row.revoked_at is not None
        self._apply_allowlists(principal, row.allowlists)
        self._by_hash[row.key_hash] = principal
        account.keys.append(principal)


class KeyGate:
    def __init__(
        self, registry: KeyRegistry, limiter: LimiterModule, fastlane: FastlaneModule
    ) -> None:
        """``limiter`` and ``fastlane``: the twins' modules (compiled or pure)."""
        self.registry = registry
        self._limiter = limiter
        self._meter = limiter.UsageMeter()
        self._latency = fastlane.LatencyMeter(LATENCY_BUCKETS)
        # Which key a request presents is the lane's rule (header, Bearer, path): one copy.
        self._presented_key = fastlane.presented_key
        self._anonymous: OrderedDict[str, KeyLimiter] = OrderedDict()
        # Refused requests by (status, reason), for /metrics.
        self.refusals: defaultdict[tuple[int, str], int] = defaultdict(int)
        # The admission rule (scopes, quota, buckets) and the fast lane's key check live in
        # the compiled twin; refusals are worded here (``rejection``).
        self.admission: Admission[Principal] = fastlane.KeyAdmission(
            self, registry.recent, self._anonymous, registry.used
        )
        # Metering is the lane's too: the samples the handler, the bundler, REST and WebSocket
        # book go into the same meters by the same sink as the lane's own answers.
        self.record = self.admission.record

    @property
    def meter(self) -> UsageMeter:
        return self._meter

    @property
    def latency(self) -> LatencyMeter:
        """Answered requests' latencies per account, network, method and minute."""
        return self._latency

    @property
    def shared(self) -> lane.SharedLimits[Principal] | None:
        """SharedLimits when several processes share a plan (Redis), else None."""
        return self.admission.shared

    @shared.setter
    def shared(self, shared: SharedLimits | None) -> None:
        self.admission.shared = shared

    # --- authentication ---------------------------------------------------------------------

    def _refuse(self, peer: str, status: int, message: str) -> Rejection:
        """A failed authentication, charged to the client's address."""
        group = peer_group(peer)
        bucket = self._anonymous.get(group)
        now = time.monotonic()
        if bucket is None:
            bucket = self._limiter.KeyLimiter(ANONYMOUS_RPS, 0, now)
            self._anonymous[group] = bucket
            if len(self._anonymous) > ANONYMOUS_PEERS:
                self._anonymous.popitem(last=False)
        else:
            self._anonymous.move_to_end(group)  # an active guesser is not the one forgotten
        wait = bucket.take(now, 1, 0)
        if wait:
            return self._limited(bucket, now, wait)
        self.refusals[(status, "authentication")] += 1
        headers = bucket.headers(now, time.time(), ANONYMOUS_RPS)
        return Rejection(status, "unauthorized" if status == 401 else "forbidden", message, headers)

    def _limited(self, bucket: KeyLimiter, now: float, wait: float) -> Rejection:
        self.refusals[(429, "authentication")] += 1
        headers = bucket.headers(now, time.time(), ANONYMOUS_RPS)
        return Rejection(
            429,
            "rate_limited",
            "too many failed authentications from this address",
            b"Retry-After: %d\r\n" % max(1, math.ceil(wait)) + headers,
            close=True,
        )

    def _over_failure_limit(self, peer: str) -> Rejection | None:
        """429 for an address that spent its failed-authentication allowance, before its key
        is even looked at (so the right key, guessed late, is refused like the wrong ones)."""
        bucket = self._anonymous.get(peer_group(peer))
        if bucket is None:
            return None
        now = time.monotonic()
        if bucket.remaining(now) >= 1:
            return None
        return self._limited(bucket, now, 1.0 / ANONYMOUS_RPS)

    def authenticate(
        self,
        request: Request | Credentials,
        peer: str,
        network: Network | None,
        scope: str | None,
        path_key: bytes | None = None,
    ) -> Principal | Rejection:
        raw = self._presented_key(request, path_key)
        if raw is None and path_key is not None:
            return TWO_KEYS
        if self._anonymous:
            # Only addresses that failed recently are in the table: an empty one costs nothing.
            limited = self._over_failure_limit(peer)
            if limited is not None:
                return limited
        if raw is None:
            if request.authorization is None:
                return self._refuse(
                    peer, 401, "missing API key: send X-API-Key or Authorization: Bearer"
                )
            return self._refuse(peer, 401, "malformed Authorization header: use Bearer <API key>")
        principal = self.registry.lookup(raw)
        if principal is None:
            if apikeys.environment_of(raw) is None:
                return self._refuse(peer, 401, "malformed API key")
            return self._refuse(peer, 401, "invalid API key")
        if principal.revoked:
            return self._refuse(peer, 401, "API key revoked")
        allow = principal.allow
        if allow is not None:
            refused = allow.origin_refusal(request.origin)
            if refused is not None:
                self.refusals[(403, "allowlist")] += 1
                headers = self.response_headers(principal)
                return Rejection(403, "forbidden", refused, headers, cors=False)
            refused = allow.peer_refusal(peer)
            if refused is not None:
                self.refusals[(403, "allowlist")] += 1
                return Rejection(403, "forbidden", refused, self.response_headers(principal))
        if network is not None and principal.environment == "test" and not network.testnet:
            return Rejection(
                403,
                "forbidden",
                f"a svc_test_ key cannot be used on {network}, which is not a testnet",
                self.response_headers(principal),
            )
        if scope is not None and scope not in principal.scopes:
            return Rejection(
                403,
                "forbidden",
                f"this API key lacks the {scope} scope",
                self.response_headers(principal),
            )
        self.registry.used.add(principal.key_id)
        return principal

    # --- admission and metering -----------------------------------------------------------

    def admit(
        self, principal: Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        return self.admission.admit(principal, reads, writes, requests, cu, tcu)

    def rejection(self, why: int, wait: float, epoch: float) -> Rejection:
        """The refusal of an admission (the fast lane's ``KeyAdmission`` said why), counted."""
        if why == NO_READ_SCOPE:
            self.refusals[(403, "scope")] += 1
            return Rejection(403, "forbidden", "this API key lacks the rpc:read scope")
        if why == NO_WRITE_SCOPE:
            self.refusals[(403, "scope")] += 1
            return Rejection(403, "forbidden", "this API key lacks the rpc:write scope")
        if why == DAY_QUOTA:
            self.refusals[(429, "day_quota")] += 1
            until_tomorrow = (utc_day(epoch) + 1) * SECONDS_PER_DAY - epoch
            return Rejection(
                429,
                "rate_limited",
                "daily request quota of the plan exhausted",
                b"Retry-After: %d\r\n" % math.ceil(until_tomorrow),
            )
        self.refusals[(429, "rate")] += 1
        return Rejection(
            429,
            "rate_limited",
            "rate limit exceeded (requests or compute units per second)",
            b"Retry-After: %d\r\n" % math.ceil(wait),
        )

    def response_headers(self, principal: Principal, at: float | None = None) -> bytes:
        if at is None:
            return self.admission.headers(principal)
        # Buckets only refill forwards: read at a moment before the refusal, they show the
        # state it was decided on, not a refill a slow machine made since (a 429 that says
        # a request remains).
        lines: bytes = principal.limiter.headers(at, time.time(), principal.limits_rps)
        return lines
