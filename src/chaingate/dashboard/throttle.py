"""Sign-in throttling: failures counted per account and per client address (sans-IO).

Past ``per_account`` failures for one e-mail, or ``per_address`` from one address, within
``window`` seconds, sign-in is refused — even with the right password — until the oldest
failure leaves the window.  An attempt is counted *before* its password is checked
(``attempt``), so requests sent side by side cannot each pass the check while the others are
still hashing; a success then takes its own attempt back and clears the account's count (not
the address's other failures: one address guessing many accounts stays limited).
Counters live in process memory, bounded in entries: the rule of a single process.  With
``auth.redis_url`` set (``--workers N``, several machines) the dashboard uses
``sharedthrottle.SharedLoginThrottle`` instead, the same rule with its counts in Redis, so N
processes share one budget (docs/decisions/dashboard.md).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Protocol

MAX_TRACKED = 10_000


class _Failures:
    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, who: str, now: float) -> deque[float] | None:
        times = self._seen.get(who)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._seen[who]
            return None
        return times

    def blocked_for(self, who: str, now: float) -> float:
        """Seconds until ``who`` may try again (0: now)."""
        times = self._recent(who, now)
        if times is None or len(times) < self.limit:
            return 0.0
        return max(0.0, times[-self.limit] + self.window - now)

    def fail(self, who: str, now: float) -> None:
        times = self._recent(who, now)
        if times is None:
            times = self._seen[who] = deque(maxlen=max(1, self.limit))
        times.append(now)
        self._seen.move_to_end(who)
        while len(self._seen) > MAX_TRACKED:
            self._seen.popitem(last=False)

    def undo(self, who: str, at: float) -> None:
        """Take back one attempt counted at ``at``."""
        times = self._seen.get(who)
        if times is not None and at in times:
            times.remove(at)
            if not times:
                del self._seen[who]

    def clear(self, who: str) -> None:
        self._seen.pop(who, None)


class LoginThrottle:
    def __init__(self, per_account: int, per_address: int, window: float) -> None:
        self._accounts = _Failures(per_account, window)
        self._addresses = _Failures(per_address, window)
        # The admin token: per address only, apart from e-mails and password sign-ins, so
        # failures from one address lock out that address, not the operator everywhere.
        self._admin = _Failures(per_account, window)

    def blocked_for(self, email: str, address: str, now: float) -> float:
        return max(
            self._accounts.blocked_for(email.lower(), now),
            self._addresses.blocked_for(address, now),
        )

    def attempt(self, email: str, address: str, now: float) -> float:
        """Count an attempt before checking it; the seconds to wait (0: go ahead, counted)."""
        wait = self.blocked_for(email, address, now)
        if wait <= 0:
            self.failed(email, address, now)
        return wait

    def failed(self, email: str, address: str, now: float) -> None:
        self._accounts.fail(email.lower(), now)
        self._addresses.fail(address, now)

    def succeeded(self, email: str, address: str, at: float) -> None:
        """The attempt counted at ``at`` was right: it is no failure."""
        self._accounts.clear(email.lower())
        self._addresses.undo(address, at)

    def admin_attempt(self, address: str, now: float) -> float:
        """An admin-token attempt, counted before its check (as ``attempt``)."""
        wait = self._admin.blocked_for(address, now)
        if wait <= 0:
            self._admin.fail(address, now)
        return wait

    def admin_succeeded(self, address: str, at: float) -> None:
        self._admin.undo(address, at)


class SignInThrottle(Protocol):
    """What the sign-in pages ask (``InProcessThrottle`` or ``SharedLoginThrottle``)."""

    async def attempt(self, email: str, address: str, now: float) -> float: ...

    async def succeeded(self, email: str, address: str, at: float) -> None: ...

    async def admin_attempt(self, address: str, now: float) -> float: ...

    async def admin_succeeded(self, address: str, at: float) -> None: ...


class InProcessThrottle:
    """``LoginThrottle`` behind the pages' (awaitable) interface: one process, no Redis."""

    def __init__(self, per_account: int, per_address: int, window: float) -> None:
        self.rule = LoginThrottle(per_account, per_address, window)

    async def attempt(self, email: str, address: str, now: float) -> float:
        return self.rule.attempt(email, address, now)

    async def succeeded(self, email: str, address: str, at: float) -> None:
        self.rule.succeeded(email, address, at)

    async def admin_attempt(self, address: str, now: float) -> float:
        return self.rule.admin_attempt(address, now)

    async def admin_succeeded(self, address: str, at: float) -> None:
        self.rule.admin_succeeded(address, at)
