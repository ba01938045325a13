"""Rate limiting and metering, sans-IO: the pure-Python twin of ``native/limiter.pyx``.

* ``KeyLimiter`` — two token buckets per API key, requests per second and compute units per
  second, each holding at most one second's worth (the allowed burst).  A request is admitted
  only when both buckets can pay for it.  A request costing more than a whole second's worth of
  compute units is admitted when the bucket is full and leaves it in debt, so a big batch is
  slowed down rather than refused forever.  A rate of 0 means unlimited.
* ``DayQuota`` — requests per UTC day for an account; survives restarts because the gateway
  seeds it from the stored usage of the day.
* ``UsageMeter`` — requests, compute units and errors per (key, method, minute), drained in
  batches to the store.
* ``rate_headers`` — the three ``X-RateLimit-*`` header lines.

Time is passed in (monotonic seconds), never read here, so the behaviour is exactly
reproducible in tests — and identical between the twins.
"""

from __future__ import annotations

import math

from chaingate.twintypes import limiter as twin

__all__ = [
    "IMPLEMENTATION",
    "DayQuota",
    "KeyLimiter",
    "UsageMeter",
    "rate_headers",
]

IMPLEMENTATION = "pure"

# What the rate-limit headers report for an unlimited plan.
UNLIMITED = 2**31 - 1


class KeyLimiter:
    __slots__ = ("_cu", "_cu_rate", "_last", "_requests", "_rps")

    def __init__(self, rps: float, cu_rate: float, now: float) -> None:
        self._rps = float(rps)
        self._cu_rate = float(cu_rate)
        self._requests = float(rps)
        self._cu = float(cu_rate)
        self._last = now

    @property
    def rps(self) -> float:
        return self._rps

    @property
    def cu_rate(self) -> float:
        return self._cu_rate

    def set_rates(self, rps: float, cu_rate: float) -> None:
        """A plan change: new rates; current balances are capped at the new capacity."""
        self._rps = float(rps)
        self._cu_rate = float(cu_rate)
        self._requests = min(self._requests, self._rps)
        self._cu = min(self._cu, self._cu_rate)

    def _refill(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            self._requests = min(self._rps, self._requests + elapsed * self._rps)
            self._cu = min(self._cu_rate, self._cu + elapsed * self._cu_rate)
            self._last = now

    def take(self, now: float, requests: int, cu: int) -> float:
        """Admit and pay (returns 0.0), or refuse: seconds until this request could pass."""
        self._refill(now)
        wait = 0.0
        if self._rps > 0:
            need = min(float(requests), self._rps)
            if self._requests < need:
                wait = (need - self._requests) / self._rps
        if self._cu_rate > 0:
            need = min(float(cu), self._cu_rate)
            if self._cu < need:
                wait = max(wait, (need - self._cu) / self._cu_rate)
        if wait > 0:
            return wait
        if self._rps > 0:
            self._requests -= requests
        if self._cu_rate > 0:
            self._cu -= cu
        return 0.0

    def admit(self, now: float, day: int, requests: int, cu: int, quota: twin.DayQuota) -> float:
        """The whole admission of one request in one call: 0.0 when admitted (buckets and the
        day quota paid), the seconds to wait when a bucket is short, -1.0 when the day quota
        is spent (nothing is paid then)."""
        room = quota.room(day)
        if 0 <= room < requests:
            return -1.0
        wait = self.take(now, requests, cu)
        if wait == 0.0:
            quota.take(day, requests)
        return wait

    def headers(self, now: float, epoch: float, limit: int) -> bytes:
        """The X-RateLimit-* lines for this bucket; ``limit`` 0 reports an unlimited plan."""
        if limit <= 0:
            return rate_headers(UNLIMITED, UNLIMITED, int(epoch))
        return rate_headers(limit, self.remaining(now), math.ceil(epoch + self.full_in(now)))

    def absorb(self, now: float, requests: float, cu: float) -> None:
        """Pay for consumption that happened elsewhere (other processes, seen through Redis).

        Balances may go negative (down to one second's worth of debt) but never further, so a
        burst reported late cannot lock a key out for long.
        """
        self._refill(now)
        if self._rps > 0:
            self._requests = max(-self._rps, self._requests - requests)
        if self._cu_rate > 0:
            self._cu = max(-self._cu_rate, self._cu - cu)

    def remaining(self, now: float) -> int:
        """Whole requests the request bucket could admit right now (the header's Remaining)."""
        self._refill(now)
        if self._rps <= 0:
            return 0
        return max(0, math.floor(self._requests))

    def full_in(self, now: float) -> float:
        """Seconds until the request bucket is full again (the header's Reset, relative)."""
        self._refill(now)
        if self._rps <= 0:
            return 0.0
        return max(0.0, (self._rps - self._requests) / self._rps)


class DayQuota:
    """Requests per UTC day; a limit of 0 means unlimited."""

    __slots__ = ("_count", "_day", "_limit")

    def __init__(self, limit: int, day: int, used: int = 0) -> None:
        self._limit = limit
        self._day = day
        self._count = used

    @property
    def used(self) -> int:
        return self._count

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = limit

    def room(self, day: int) -> int:
        """Requests still allowed on ``day``; -1 when unlimited."""
        if self._limit <= 0:
            return -1
        used = self._count if day == self._day else 0
        return max(0, self._limit - used)

    def take(self, day: int, requests: int) -> bool:
        """Count ``requests`` for ``day`` (UTC day index) if the quota allows them."""
        if day != self._day:
            self._day = day
            self._count = 0
        if self._limit > 0 and self._count + requests > self._limit:
            return False
        self._count += requests
        return True

    def add(self, day: int, requests: int) -> None:
        """Count requests served elsewhere (another process) without checking the limit."""
        if day != self._day:
            self._day = day
            self._count = 0
        self._count += requests


class UsageMeter:
    """Counters per (key id, account id, network, method, minute), handed out by ``drain``.
    ``network`` is the endpoint's ``chain/network`` ('' for calls of no network: REST)."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str, str, int], list[int]] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def record(
        self,
        key_id: str,
        account_id: str,
        network: str,
        method: str,
        minute: int,
        requests: int,
        cu: int,
        errors: int,
    ) -> None:
        slot = (key_id, account_id, network, method, minute)
        counts = self._counts.get(slot)
        if counts is None:
            self._counts[slot] = [requests, cu, errors]
        else:
            counts[0] += requests
            counts[1] += cu
            counts[2] += errors

    def drain(self) -> list[tuple[str, str, str, str, int, int, int, int]]:
        """Every counter since the last drain, as (key, account, network, method, minute,
        requests, compute units, errors), sorted; the meter starts again from zero."""
        counts, self._counts = self._counts, {}
        return sorted((*slot, v[0], v[1], v[2]) for slot, v in counts.items())


def rate_headers(limit: int, remaining: int, reset: int) -> bytes:
    """The rate-limit header lines every response carries (reset: Unix seconds)."""
    return b"X-RateLimit-Limit: %d\r\nX-RateLimit-Remaining: %d\r\nX-RateLimit-Reset: %d\r\n" % (
        limit,
        remaining,
        reset,
    )
