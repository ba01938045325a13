"""A latency histogram that merges by addition: log-spaced buckets, ~2% wide.

Workers send theirs to the master as plain dicts; percentiles come from the merged counts, so a
distributed run's p99 is the p99 of every request, not an average of the workers' p99s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

GROWTH = 1.02  # each bucket is 2% wider than the one before: percentiles within ~1%
_LOG_GROWTH = math.log(GROWTH)
FLOOR_MS = 0.01  # everything faster lands in bucket 0


def bucket_of(ms: float) -> int:
    if ms <= FLOOR_MS:
        return 0
    return 1 + int(math.log(ms / FLOOR_MS) / _LOG_GROWTH)


def bucket_value(index: int) -> float:
    """A bucket's representative latency (ms): its geometric middle."""
    if index == 0:
        return FLOOR_MS
    return float(FLOOR_MS * GROWTH ** (index - 0.5))


class Histogram:
    __slots__ = ("counts", "max_ms", "sum_ms", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.sum_ms = 0.0
        self.max_ms = 0.0

    def add(self, ms: float) -> None:
        index = bucket_of(ms)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.total += 1
        self.sum_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def merge(self, other: Histogram) -> None:
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        self.total += other.total
        self.sum_ms += other.sum_ms
        self.max_ms = max(self.max_ms, other.max_ms)

    def percentile(self, p: float) -> float | None:
        """Latency (ms) under which a share ``p`` (0..1) of the samples fall; None if empty."""
        if not self.total:
            return None
        rank = max(1, math.ceil(p * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return min(bucket_value(index), self.max_ms)
        return self.max_ms

    def mean(self) -> float | None:
        return self.sum_ms / self.total if self.total else None

    def bins(self, edges: Iterable[float]) -> list[int]:
        """Counts between consecutive ``edges`` (ms); the last bin takes everything above."""
        bounds = list(edges)
        out = [0] * len(bounds)
        for index, count in self.counts.items():
            value = bucket_value(index)
            slot = 0
            while slot + 1 < len(bounds) and value >= bounds[slot + 1]:
                slot += 1
            out[slot] += count
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "counts": {str(k): v for k, v in self.counts.items()},
            "total": self.total,
            "sum_ms": self.sum_ms,
            "max_ms": self.max_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Histogram:
        histogram = cls()
        counts = data.get("counts", {})
        assert isinstance(counts, dict)
        histogram.counts = {int(k): int(v) for k, v in counts.items()}
        histogram.total = int(str(data.get("total", 0)))
        histogram.sum_ms = float(str(data.get("sum_ms", 0.0)))
        histogram.max_ms = float(str(data.get("max_ms", 0.0)))
        return histogram
