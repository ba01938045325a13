"""Hedged reads: when the first upstream is slow, ask a second; the first answer wins.

Sans-IO bookkeeping for the pool (pool.py runs the two attempts in one nursery and cancels the
loser):

* the delay before hedging is the first upstream's recent p95 latency (its last
  ``WINDOW`` answers), within ``[min_delay, max_delay]``; with too few samples, ``max_delay``;
* a token bucket bounds hedges to a share of calls: every retry-safe call earns ``budget``
  tokens (up to ``burst``), a hedge spends one — so over any stretch, hedges are at most
  ``budget`` of calls plus ``burst``;
* a primary that lost to its hedge is recorded at the time it was abandoned (a lower bound of
  its latency), so a slow node's p95 rises instead of looking fast for having been cut off.

Only retry-safe reads are hedged (the method table's ``retry``); writes and filter methods
never are.
"""

from __future__ import annotations

from collections import deque

from chaingate.config import HedgeSettings

WINDOW = 128  # latencies kept per upstream
_REFRESH = 16  # p95 recomputed every this many samples
_MIN_SAMPLES = 8


class LatencyWindow:
    """Recent answer latencies of one upstream, and their p95 (recomputed now and then)."""

    __slots__ = ("_fresh", "_p95", "samples")

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)
        self._p95: float | None = None
        self._fresh = 0

    def add(self, latency: float) -> None:
        self.samples.append(latency)
        self._fresh += 1
        if self._fresh >= _REFRESH:
            self._p95 = None  # recomputed on the next read

    def p95(self) -> float | None:
        if len(self.samples) < _MIN_SAMPLES:
            return None
        if self._p95 is None:
            ordered = sorted(self.samples)
            self._p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
            self._fresh = 0
        return self._p95


class Hedger:
    """The hedging policy of one network's pool, and its counters (read by /metrics)."""

    def __init__(self, settings: HedgeSettings) -> None:
        self.budget = min(max(settings.budget, 0.0), 1.0)
        self.burst = max(1, settings.burst)
        self.min_delay = max(0.0, settings.min_delay)
        self.max_delay = max(self.min_delay, settings.max_delay)
        self._tokens = float(self.burst)
        self._windows: dict[str, LatencyWindow] = {}
        self.calls = 0  # retry-safe calls that could have been hedged
        self.sent = 0  # hedges sent
        self.won = 0  # hedges that answered first

    def observe(self, upstream: str, latency: float) -> None:
        window = self._windows.get(upstream)
        if window is None:
            window = self._windows[upstream] = LatencyWindow()
        window.add(latency)

    def delay(self, upstream: str) -> float:
        """How long to wait for ``upstream`` before hedging: its p95, bounded."""
        window = self._windows.get(upstream)
        p95 = window.p95() if window is not None else None
        if p95 is None:
            return self.max_delay
        return min(self.max_delay, max(self.min_delay, p95))

    def earn(self) -> None:
        """A call that may be hedged: it adds its share to the budget."""
        self.calls += 1
        self._tokens = min(float(self.burst), self._tokens + self.budget)

    def take(self) -> bool:
        """Spend a token on a hedge, if one is left."""
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        self.sent += 1
        return True
