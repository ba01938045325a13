"""Exact day quotas across processes: each process admits only what Redis has granted it.

Admission stays local and synchronous (no Redis call per request).  Per account and UTC day,
Redis holds the number of requests granted to all processes together; a Lua script grants a
process more only while that number stays within the plan's ``requests_per_day``, so the
processes together never admit more than the quota.  Each process sets its local
``DayQuota``'s limit to what it was granted, and tops the grant up off the request path (the
shared-limits sync) before it runs out: ``MIN_ROOM`` at least, or a few sync intervals' worth
of the account's recent use.  Near the end of the quota a grant is at most half of what is
left, so the last units spread over the processes that ask.

When an account is exhausted for the day, a process that asked in vain marks it "starved";
a process holding unused units of it that it has not used lately gives them back, so the
quota is used up exactly even when the traffic leaves one process for another.

Limits: a request refused while another process still holds unused units (until that process
uses or returns them, a sync interval or two) is the price of exactness; at UTC midnight, a
process that has not synced since serves the new day's first requests from the old day's
grant and charges them to the new day at its next sync.  Redis away: the quotas fall back to
each process's own view (fail-open, as the rate limits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

MIN_ROOM = 16  # units a process keeps in hand per account far from the quota's end
USE_FACTOR = 4  # ... or this many sync intervals of the account's recent use
STARVED_SECONDS = 2.0  # how long an "asked in vain" mark lasts
RETURN_AFTER = 0.25  # unused units are given back only if the account was idle this long here
KEY_TTL = 86_400 * 2

# KEYS[1]: granted total of (day, account); KEYS[2]: the day's starved set.
# ARGV: limit, want, floor (granted can be no less: the store's day total, should Redis have
# lost its data), charge (units admitted without a grant, counted unconditionally), now, ttl,
# the account, and the asker's room: with none left and none given, the account is marked
# starved (a process topping up a room it still has is not starving).
RESERVE = """
local granted = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[3])
if granted < floor then granted = floor end
granted = granted + tonumber(ARGV[4])
local left = tonumber(ARGV[1]) - granted
local give = 0
if left > 0 then
  give = math.min(tonumber(ARGV[2]), math.max(1, math.floor(left / 2)))
end
redis.call('SET', KEYS[1], granted + give, 'EX', tonumber(ARGV[6]))
if give == 0 and tonumber(ARGV[8]) <= 0 then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), ARGV[7])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
end
return give
"""


def utc_day(epoch: float) -> int:
    return int(epoch // 86_400)


class _Held:
    """An account whose local day quota is what Redis granted this process."""

    __slots__ = ("day", "floor", "last_used", "returned_at")

    def __init__(self, day: int, floor: int) -> None:
        self.day = day
        self.floor = floor
        self.last_used = 0.0
        self.returned_at = -1e9


class AccountDays(Protocol):
    """What the grants read of each account (the key registry, ``KeyRegistry``, keeps it)."""

    def account_quota(self, account_id: str) -> Any:
        """The account's ``DayQuota`` (compiled or pure twin); None: unknown here."""

    def day_limit(self, account_id: str) -> int:
        """Requests per day (0: unlimited or unknown)."""

    def day_floor(self, account_id: str, day: int) -> int:
        """The store's total of ``day`` at start-up (0 for any other day)."""


class DayAllowances:
    def __init__(
        self,
        quota_of: Callable[[str], Any],
        limit_of: Callable[[str], int],
        floor_of: Callable[[str, int], int],
    ) -> None:
        self._quota_of = quota_of  # account id -> DayQuota (None: unknown here)
        self._limit_of = limit_of  # account id -> requests per day (0: unlimited)
        self._floor_of = floor_of  # (account id, day) -> the store's total of that day at start-up
        self._held: dict[str, _Held] = {}
        self.granted = 0  # units granted to this process (for the metrics and tests)
        self.returned = 0

    def holds(self, account_id: str) -> bool:
        return account_id in self._held

    def _adopt(self, account_id: str, quota: Any, day: int) -> None:
        """From now on the account's local room is what Redis grants: none yet."""
        quota.add(day, 1)  # a phantom request keeps the limit >= 1 (0 would mean unlimited)
        quota.set_limit(quota.used)
        self._held[account_id] = _Held(day, self._floor_of(account_id, day))

    def release_all(self) -> None:
        """Redis away: every account back on the plan's limit, enforced by this process alone."""
        for account_id in list(self._held):
            self._release(account_id)

    def _release(self, account_id: str) -> None:
        del self._held[account_id]
        quota = self._quota_of(account_id)
        if quota is not None:
            quota.set_limit(self._limit_of(account_id))

    async def top_up(self, client: Any, used: dict[str, int], accounts: Iterable[str] = ()) -> None:
        """Grant more to the accounts used here (``used``: requests since the last round)
        and to ``accounts`` (new or changed ones); give back unused units of starved accounts
        not used here lately.  One pipeline."""
        epoch = time.time()
        day = utc_day(epoch)
        now = time.monotonic()
        asks: list[tuple[str, Any, int, int, int]] = []
        for account_id in {*used, *accounts}:
            quota = self._quota_of(account_id)
            limit = self._limit_of(account_id)
            held = self._held.get(account_id)
            if quota is None or limit <= 0:
                if held is not None:
                    self._release(account_id)  # now unlimited (or gone)
                continue
            charge = 0
            if held is None or held.day != day:
                if held is not None and quota.room(day) != quota.limit:
                    # A new day, already served here on yesterday's grant: charge it.
                    charge = quota.used
                self._adopt(account_id, quota, day)
                held = self._held[account_id]
            recent = used.get(account_id, 0)
            if recent:
                held.last_used = now
            elif now - held.returned_at < 2 * RETURN_AFTER and not charge:
                continue  # just gave its units back to a starved process: not straight back
            target = max(MIN_ROOM, USE_FACTOR * recent)
            room = quota.room(day)
            if room < target or charge:
                asks.append((account_id, quota, max(0, target - room), charge, room))
        starved_name = b"cg:dq:%d:starved" % day
        async with client.pipeline(transaction=False) as pipe:
            replies = [
                pipe.eval(
                    RESERVE,
                    keys=[b"cg:dq:%d:" % day + account_id.encode(), starved_name],
                    args=[
                        self._limit_of(account_id),
                        want,
                        self._held[account_id].floor,
                        charge,
                        epoch,
                        KEY_TTL,
                        account_id,
                        room,
                    ],
                )
                for account_id, _, want, charge, room in asks
            ]
            starved_reply = pipe.zrangebyscore(starved_name, epoch - STARVED_SECONDS, epoch + 3600)
        for (account_id, quota, *_), reply in zip(asks, replies, strict=True):
            give = int(await reply)
            if give and self._held.get(account_id) is not None:
                quota.set_limit(quota.limit + give)
                self.granted += give
        await self._give_back(client, day, now, await starved_reply)

    async def _give_back(self, client: Any, day: int, now: float, starved: list[bytes]) -> None:
        returns: list[tuple[str, int]] = []
        for raw in starved:
            account_id = raw.decode()
            held = self._held.get(account_id)
            quota = self._quota_of(account_id)
            if held is None or quota is None or held.day != day:
                continue
            if now - held.last_used < RETURN_AFTER:
                continue  # in use here: these units will be admitted here
            spare = quota.room(day)
            if spare > 0:
                quota.set_limit(quota.limit - spare)  # first locally: nothing admits them now
                held.returned_at = now
                returns.append((account_id, spare))
        if not returns:
            return
        async with client.pipeline(transaction=False) as pipe:
            for account_id, spare in returns:
                pipe.decrby(b"cg:dq:%d:" % day + account_id.encode(), spare)
        self.returned += sum(spare for _, spare in returns)
