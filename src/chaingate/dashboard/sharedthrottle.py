"""Sign-in throttling shared by every process through Redis (when ``auth.redis_url`` is set).

The rule is ``throttle.LoginThrottle``'s — at most ``per_account`` failures per e-mail and
``per_address`` per client address within ``window`` seconds, an attempt counted before its
check, a success taking its own attempt back — but the failures live in Redis sorted sets
(score: the attempt's time), so ``--workers N`` or N machines share one budget instead of
giving an attacker N of them.  Check and count are one Lua script: attempts sent side by side
to different processes cannot each pass the check while the others are counted.

E-mails are keyed by their SHA-256 (no addresses of people in Redis).  Redis unreachable:
each process throttles on its own (the in-process rule) until it is back — sign-in must not
go down with Redis, and it is no worse than one process's budget per process — logged once.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

import coredis
import trio

from chaingate.dashboard.throttle import LoginThrottle

log = logging.getLogger("chaingate.dashboard")

# KEYS: the sorted sets checked; ARGV: now, window, member, then each key's limit.  Drops what
# left the window, and if every key is under its limit adds the attempt to each; returns the
# seconds to wait (as a string: Lua numbers leave a script as integers).
_ATTEMPT = """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local wait = 0
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local limit = tonumber(ARGV[3 + i])
  if redis.call('ZCARD', key) >= limit then
    local nth = redis.call('ZRANGE', key, -limit, -limit, 'WITHSCORES')
    local left = tonumber(nth[2]) + window - now
    if left > wait then wait = left end
  end
end
if wait > 0 then return tostring(wait) end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, ARGV[3])
  redis.call('PEXPIRE', key, math.ceil(window * 1000))
end
return '0'
"""

# KEYS[1]: a sorted set; ARGV[1]: an attempt's time.  Takes back one attempt of that time.
_UNDO = """
local found = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', 0, 1)
if found[1] then redis.call('ZREM', KEYS[1], found[1]) end
return 0
"""

_REDIS_ERRORS = (coredis.exceptions.RedisError, OSError, TimeoutError, trio.TooSlowError)
RECONNECT_SECONDS = 1.0
# A sign-in waits at most this for Redis before it is throttled in process instead.
CALL_SECONDS = 1.0


class SharedLoginThrottle:
    def __init__(
        self,
        url: str,
        per_account: int,
        per_address: int,
        window: float,
        prefix: str = "cg:signin:",
    ) -> None:
        self._url = url
        self._limits = (per_account, per_address)
        self._window = window
        self._prefix = prefix
        self._client: Any = None  # set while ``run`` holds the connection
        self._local = LoginThrottle(per_account, per_address, window)
        self.up = False
        self.failures = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold a Redis client for the process's life (the dashboard's tasks run this); while
        none can be had, sign-ins are throttled in process, and a new client is tried every
        ``RECONNECT_SECONDS``.  Started once it has a client, or could not get one."""
        started = False
        while True:
            try:
                client = coredis.Redis.from_url(self._url, decode_responses=True)
                async with client:
                    self._client = client
                    if not started:
                        started = True
                        task_status.started()
                    await trio.sleep_forever()
            except _REDIS_ERRORS as exc:
                self._unavailable(exc)
            finally:
                self._client = None
            if not started:
                started = True
                task_status.started()
            await trio.sleep(RECONNECT_SECONDS)

    # --- keys ------------------------------------------------------------------------------

    def _account(self, email: str) -> str:
        return self._prefix + "a:" + hashlib.sha256(email.lower().encode()).hexdigest()

    def _address(self, address: str) -> str:
        return self._prefix + "ip:" + address[:64]

    def _admin(self, address: str) -> str:
        return self._prefix + "admin:" + address[:64]

    # --- the rule, in Redis ----------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> None:
        self.failures += 1
        if self.up or self.failures == 1:
            log.warning(
                "shared sign-in throttling unavailable: each process throttles on its own",
                extra={"fields": {"error": exc.__class__.__name__}},
            )
        self.up = False

    async def _attempt(self, keys: list[str], limits: list[int], now: float) -> float | None:
        """Seconds to wait (0: counted, go ahead); None when Redis could not answer."""
        client = self._client
        if client is None:
            return None
        member = f"{now!r}:{secrets.token_hex(6)}"  # unique: many attempts may share a time
        try:
            with trio.fail_after(CALL_SECONDS):
                answer = await client.eval(
                    _ATTEMPT, keys, [repr(now), repr(self._window), member, *limits]
                )
        except _REDIS_ERRORS as exc:
            self._unavailable(exc)
            return None
        self.up = True
        return max(0.0, float(answer))

    async def _undo(self, key: str, at: float) -> bool:
        client = self._client
        if client is None:
            return False
        try:
            with trio.fail_after(CALL_SECONDS):
                await client.eval(_UNDO, [key], [repr(at)])
        except _REDIS_ERRORS as exc:
            self._unavailable(exc)
            return False
        return True

    # --- what the sign-in pages call (as ``InProcessThrottle``) ------------------------------

    async def attempt(self, email: str, address: str, now: float) -> float:
        """Count an attempt before checking it; the seconds to wait (0: go ahead, counted)."""
        wait = await self._attempt(
            [self._account(email), self._address(address)], list(self._limits), now
        )
        if wait is None:
            return self._local.attempt(email, address, now)
        return wait

    async def succeeded(self, email: str, address: str, at: float) -> None:
        """The attempt counted at ``at`` was right: it is no failure (the account's count is
        cleared, the address's other failures stay)."""
        self._local.succeeded(email, address, at)
        client = self._client
        if client is None:
            return
        try:
            with trio.fail_after(CALL_SECONDS):
                await client.delete([self._account(email)])
        except _REDIS_ERRORS as exc:
            self._unavailable(exc)
            return
        await self._undo(self._address(address), at)

    async def admin_attempt(self, address: str, now: float) -> float:
        wait = await self._attempt([self._admin(address)], [self._limits[0]], now)
        if wait is None:
            return self._local.admin_attempt(address, now)
        return wait

    async def admin_succeeded(self, address: str, at: float) -> None:
        self._local.admin_succeeded(address, at)
        await self._undo(self._admin(address), at)
