"""Exact day quotas across processes: each process admits only what Redis has granted it.

Admission stays local and synchronous (no Redis call per request).  Per account and UTC day,
Redis holds the number of requests granted to all processes together; a Lua script grants a
process more only while that number stays within the plan's ``requests_per_day``.  Each
process sets its local ``DayQuota``'s limit to what it was granted, and tops the grant up off
the request path (the shared-limits sync) before it runs out: ``MIN_ROOM`` at least, or a few
sync intervals' worth of the account's recent use.  Near the end of the quota a grant is at
most half of what is left, so the last units spread over the processes that ask.

An account is granted only once it is used here: until Redis has answered its first ask it is
admitted on this process's own view (the store's day total at start-up plus what it served),
and what it admitted meanwhile is charged.  It changes hands only with that answer: an ask in
flight (a slow or hung Redis: up to the sync's timeout) leaves it admitting as before, and an
ask never answered is taken as never made — the next one charges from the same count, and
(after a release) takes back this process's record, whichever ask wrote it: a hung Redis
mostly swallows the script's SCRIPT EXISTS, so the ask was never sent; should it have run,
its charge is made twice, which errs on the side of the quota.

Units granted and never admitted do not stay lost:
- a process that exits gracefully gives back every unit it holds;
- each process records, per account, the units it holds unused (``cg:dq:<day>:<acct>:h``,
  one field per process, reported at each sync for the accounts it used) and keeps a liveness
  mark (``cg:dq:live:<process>``, ``LIVE_TTL``).  A crashed process's mark expires, and the
  next grant of each of its accounts takes its recorded units back;
- a process that asked in vain marks the account "starved"; a process holding unused units it
  has not used lately gives them back.

Redis away (fail-open): an account released to the process's own view keeps a local count
covering every unit granted so far (to any process), so only units never granted are admitted
again; what it admits meanwhile is charged when Redis is back, and what it held unused then
goes back.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from chaingate.twintypes.limiter import DayQuota

MIN_ROOM = 16  # units a process keeps in hand per account far from the quota's end
USE_FACTOR = 4  # ... or this many sync intervals of the account's recent use
STARVED_SECONDS = 2.0  # how long an "asked in vain" mark lasts
RETURN_AFTER = 0.25  # unused units are given back only if the account was idle this long here
LIVE_TTL = 3  # seconds a process's liveness mark outlives its last sync
KEY_TTL = 86_400 * 2
LIVE_PREFIX = b"cg:dq:live:"

# KEYS[1]: granted total of (day, account); KEYS[2]: the day's starved set; KEYS[3]: units
# held unused per process.  ARGV: limit, want, floor (granted can be no less: the store's day
# total, should Redis have lost its data), charge (units admitted without a grant), now, ttl,
# the account, the asker's room (with none left and none given, the account is marked
# starved), the asker's id, the liveness prefix, and whether the asker had been released
# (its record then is stale: taken back, its admissions since arrive as the charge).
# Returns {given, granted total}.  Reads the liveness marks by name (one Redis, not a cluster).
RESERVE = """
local granted = tonumber(redis.call('GET', KEYS[1]) or '0')
local holders = redis.call('HGETALL', KEYS[3])
for i = 1, #holders, 2 do
  local who = holders[i]
  if (who == ARGV[9] and ARGV[11] == '1') or
     (who ~= ARGV[9] and redis.call('EXISTS', ARGV[10] .. who) == 0) then
    granted = granted - tonumber(holders[i + 1])
    redis.call('HDEL', KEYS[3], who)
  end
end
granted = granted + tonumber(ARGV[4])
local floor = tonumber(ARGV[3])
if granted < floor then granted = floor end
if granted < 0 then granted = 0 end
local left = tonumber(ARGV[1]) - granted
local give = 0
if left > 0 then
  give = math.min(tonumber(ARGV[2]), math.max(1, math.floor(left / 2)))
end
redis.call('SET', KEYS[1], granted + give, 'EX', tonumber(ARGV[6]))
redis.call('HSET', KEYS[3], ARGV[9], tonumber(ARGV[8]) + give)
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[6]))
if give == 0 and tonumber(ARGV[8]) <= 0 then
  redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), ARGV[7])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
end
return {give, granted + give}
"""


# At exit.  KEYS[1]: granted total; KEYS[2]: the records.  ARGV: the process, and what it
# admitted since its record was written: the rest of the record goes back.
EXIT = """
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  local back = tonumber(held) - tonumber(ARGV[2])
  if back > 0 then redis.call('DECRBY', KEYS[1], back) end
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 0
"""


def utc_day(epoch: float) -> int:
    return int(epoch // 86_400)


def _granted_key(day: int, account_id: str) -> bytes:
    return b"cg:dq:%d:" % day + account_id.encode()


def _holders_key(day: int, account_id: str) -> bytes:
    return b"cg:dq:%d:" % day + account_id.encode() + b":h"


class _Held:
    """An account whose local day quota is what Redis granted this process."""

    __slots__ = ("day", "granted_total", "last_used", "owed", "returned_at")

    def __init__(self, day: int) -> None:
        self.day = day
        self.granted_total = 0  # all processes' grants, as of the last reply
        self.last_used = 0.0
        self.returned_at = -1e9
        self.owed = 0  # admitted while its first ask was in flight, beyond what that granted


class _Ask:
    """One account's ask of a sync, as queued: ``used`` is its local count then."""

    __slots__ = ("account_id", "adopt", "charge", "quota", "room", "stale", "used", "want")

    def __init__(
        self,
        account_id: str,
        quota: DayQuota,
        want: int,
        charge: int,
        room: int,
        stale: bool,
        adopt: bool,
    ) -> None:
        self.account_id = account_id
        self.quota = quota
        self.want = want
        self.charge = charge
        self.room = room
        self.stale = stale
        self.adopt = adopt  # the account is on this process's own view until the answer
        self.used = quota.used


class AccountDays(Protocol):
    """What the grants read of each account (the key registry, ``KeyRegistry``, keeps it)."""

    def account_quota(self, account_id: str) -> DayQuota | None:
        """The account's ``DayQuota`` (compiled or pure twin); None: unknown here."""

    def day_limit(self, account_id: str) -> int:
        """Requests per day (0: unlimited or unknown)."""

    def day_floor(self, account_id: str, day: int) -> int:
        """The store's total of ``day`` at start-up (0 for any other day)."""


class _Released:
    """An account released to this process's own view (Redis away): ``reported`` is the
    local count at the last report of its record, ``bump`` what was added to the local count
    at the release to cover the others' grants."""

    __slots__ = ("bump", "day", "reported")

    def __init__(self, day: int, reported: int, bump: int) -> None:
        self.day = day
        self.reported = reported
        self.bump = bump


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
        self._reported: dict[str, int] = {}  # held account -> local count at its last report
        self._released: dict[str, _Released] = {}
        self.me = secrets.token_hex(8).encode()  # this process, in the records
        self._scripts: dict[str, Any] = {}
        self.granted = 0  # units granted to this process (for the metrics and tests)
        self.returned = 0

    def holds(self, account_id: str) -> bool:
        return account_id in self._held

    def _adoption(self, account_id: str, quota: DayQuota, day: int) -> tuple[int, bool]:
        """What the first ask of an account on its own view carries: the charge (admissions
        here that no grant covered) and whether a stale record of this process is to be taken
        back first.  Nothing changes hands until Redis answers (``_take``)."""
        held = self._held.get(account_id)
        if held is not None:
            # A new day: yesterday's grant is spent; until today's first answer the account
            # is on this process's own view, as at start-up.
            del self._held[account_id]
            self._reported.pop(account_id, None)
            quota.set_limit(self._limit_of(account_id))
        quota.add(day, 0)  # on a new day, the count restarts
        released = self._released.get(account_id)
        if released is not None and released.day == day:
            return quota.used - released.bump - released.reported, True
        if released is not None:
            return quota.used, False  # all of today's count was served on an older grant
        return quota.used - self._floor_of(account_id, day), False

    def _take(self, ask: _Ask, day: int, give: int) -> _Held:
        """Redis answered an adoption: from now on the account's local room is what Redis
        grants.  What was admitted since the ask was queued comes out of this grant; any
        beyond it is owed at the next ask."""
        quota = ask.quota
        self._released.pop(ask.account_id, None)
        quota.add(day, 0)
        since = quota.used - ask.used
        owed = max(0, since - give)
        phantom = 1 if quota.used == 0 else 0  # keeps the limit >= 1 (0 means unlimited)
        quota.add(day, phantom)
        quota.set_limit(ask.used + phantom + give + owed)
        held = self._held[ask.account_id] = _Held(day)
        held.owed = owed
        # Its record (room 0 plus the grant) was written at the ask's count, the phantom in.
        self._reported[ask.account_id] = ask.used + phantom
        return held

    def release_all(self) -> None:
        """Redis away: every account back on the plan's limit, enforced by this process."""
        for account_id in list(self._held):
            self._release(account_id)

    def _release(self, account_id: str) -> None:
        held = self._held.pop(account_id)
        reported = self._reported.pop(account_id, None)
        quota = self._quota_of(account_id)
        if quota is None:
            return
        # The local count covers every unit granted: the others' grants, as if all used.
        room = max(0, quota.room(held.day))
        if reported is None:
            reported = quota.used  # no reply yet: whatever its record says goes back
        bump = max(0, held.granted_total - room - quota.used)
        quota.add(held.day, bump)
        quota.set_limit(self._limit_of(account_id))
        self._released[account_id] = _Released(held.day, reported, bump)

    def _script(self, client: Any, source: str) -> Any:
        """The script, sent once and then called by its SHA (EVALSHA)."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = client.register_script(source)
        return script

    async def top_up(self, client: Any, used: dict[str, int], accounts: Iterable[str] = ()) -> None:
        """Grant more to the accounts used here (``used``: requests since the last round),
        to ``accounts`` and to the released ones; report the units held unused of those used;
        give back unused units of starved accounts not used here lately.  One pipeline."""
        async with client.pipeline(transaction=False) as pipe:
            settle = self.queue_top_up(client, pipe, used, accounts)
        await settle()

    def queue_top_up(
        self, client: Any, pipe: Any, used: dict[str, int], accounts: Iterable[str] = ()
    ) -> Callable[[], Awaitable[None]]:
        """``top_up``'s commands, queued on ``pipe``, a pipeline of ``client`` (the shared
        limits send theirs in the same round trip); what it returns settles the replies once
        the pipeline has run (give-backs, rare, take a round trip of their own)."""
        epoch = time.time()
        day = utc_day(epoch)
        now = time.monotonic()
        asks: list[_Ask] = []
        reports: list[tuple[str, int]] = []
        # The local count as each record is written: updated once the pipeline has run (a
        # record whose reply was lost then over-counts a little here: never over the quota).
        written: dict[str, int] = {}
        # Released accounts (Redis was away) are adopted again at once, used or not: their
        # admissions meanwhile are charged, and their records taken back.
        for account_id in {*used, *accounts, *self._released}:
            quota = self._quota_of(account_id)
            limit = self._limit_of(account_id)
            held = self._held.get(account_id)
            if quota is None or limit <= 0:
                if held is not None:
                    self._release(account_id)  # now unlimited (or gone)
                    self._released.pop(account_id, None)
                continue
            recent = used.get(account_id, 0)
            target = max(MIN_ROOM, USE_FACTOR * recent)
            if held is None or held.day != day:
                charge, stale = self._adoption(account_id, quota, day)
                asks.append(_Ask(account_id, quota, target, max(0, charge), 0, stale, True))
                continue  # its record is written with the answer (``_take``)
            written[account_id] = quota.used
            if recent:
                held.last_used = now
            room = quota.room(day)
            if room < target or held.owed:
                if not held.owed and now - held.returned_at < 2 * RETURN_AFTER:
                    reports.append((account_id, room))  # just gave units back: not straight back
                else:
                    want = max(0, target - room)
                    asks.append(_Ask(account_id, quota, want, held.owed, room, False, False))
            elif recent:
                reports.append((account_id, room))
            else:
                del written[account_id]
        starved_name = b"cg:dq:%d:starved" % day
        reserve = self._script(client, RESERVE)
        pipe.set(LIVE_PREFIX + self.me, b"1", ex=LIVE_TTL)
        replies = [
            reserve(
                keys=[
                    _granted_key(day, ask.account_id),
                    starved_name,
                    _holders_key(day, ask.account_id),
                ],
                args=[
                    self._limit_of(ask.account_id),
                    ask.want,
                    self._floor_of(ask.account_id, day),
                    ask.charge,
                    epoch,
                    KEY_TTL,
                    ask.account_id,
                    ask.room,
                    self.me,
                    LIVE_PREFIX,
                    1 if ask.stale else 0,
                ],
                client=pipe,
            )
            for ask in asks
        ]
        for account_id, room in reports:
            pipe.hset(_holders_key(day, account_id), {self.me: room})
        starved_reply = pipe.zrangebyscore(starved_name, epoch - STARVED_SECONDS, epoch + 3600)

        async def settle() -> None:
            for account_id, count in written.items():
                if account_id in self._held:
                    self._reported[account_id] = count
            for ask, reply in zip(asks, replies, strict=True):
                give, total = (int(value) for value in await reply)
                if ask.adopt:
                    held = self._take(ask, day, give)
                    if used.get(ask.account_id):
                        held.last_used = now
                else:
                    maybe = self._held.get(ask.account_id)
                    if maybe is None:
                        continue
                    held = maybe
                    held.owed -= ask.charge
                    ask.quota.set_limit(ask.quota.limit + give)
                held.granted_total = total
                self.granted += give
            await self._give_back(client, day, now, await starved_reply)

        return settle

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
                self._reported[account_id] = quota.used
        if not returns:
            return
        async with client.pipeline(transaction=False) as pipe:
            for account_id, spare in returns:
                pipe.decrby(_granted_key(day, account_id), spare)
                pipe.hset(_holders_key(day, account_id), {self.me: 0})
        self.returned += sum(spare for _, spare in returns)

    async def give_back_all(self, client: Any) -> None:
        """At exit: every unit held unused goes back (records less what was admitted since
        they were written, released accounts included), and this process's records go."""
        day = utc_day(time.time())
        since: list[tuple[str, int]] = []
        for account_id, held in list(self._held.items()):
            quota = self._quota_of(account_id)
            del self._held[account_id]
            reported = self._reported.pop(account_id, None)
            if quota is None or held.day != day or reported is None:
                continue
            quota.set_limit(quota.used)  # nothing more admitted here
            since.append((account_id, quota.used - reported))
        for account_id, released in list(self._released.items()):
            quota = self._quota_of(account_id)
            del self._released[account_id]
            if quota is not None and released.day == day:
                since.append((account_id, quota.used - released.bump - released.reported))
        if since:
            async with client.pipeline(transaction=False) as pipe:  # once: EVAL is fine
                for account_id, admitted in since:
                    pipe.eval(
                        EXIT,
                        keys=[_granted_key(day, account_id), _holders_key(day, account_id)],
                        args=[self.me, max(0, admitted)],
                    )
        await client.delete([LIVE_PREFIX + self.me])  # any record left is taken back
