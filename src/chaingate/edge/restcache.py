"""A short-lived cache of REST answers, consulted by the edge after admission.

Many clients asking the same page within a second (a wallet's balance view polled by
thousands of users, a dashboard) get the same bytes: computing them once per second instead
of once per request is what keeps a popular page cheap.  Only routes that declare a
``cache_seconds`` are cached, only their 200 answers, and only for that long; every entry
also dies when the data under it moves: an entry remembers ``version()`` as it was *before*
the answer was computed (the gateway makes that every index's commit generation, which never
repeats) and is dead once the version differs — noted after computing, an answer read just
before a commit would be labelled with the commit's version and outlive it.  The
key holds the caller key's environment as well as the path and query: a test key is refused
mainnet data by the handler, so its answers must never come from a live key's entry.

Admission and metering happen before the lookup: a cached answer is billed like any other.
Pure state, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from time import monotonic

CacheKey = tuple[str, bytes, bytes, bytes]  # environment, method, path, query


class RestCache:
    def __init__(self, max_entries: int = 10_000, max_bytes: int = 64 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, tuple[float, object, bytes, bytes]] = OrderedDict()
        self._bytes = 0
        # What the answers were computed from (the gateway: every index's position).
        self.version: Callable[[], object] = lambda: None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes held (header lines and bodies)."""
        return self._bytes

    def get(self, key: CacheKey, now: float | None = None) -> tuple[bytes, bytes] | None:
        """(header lines, body) of a live entry, or None."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        expires, version, headers, body = entry
        if (now if now is not None else monotonic()) >= expires or version != self.version():
            self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return headers, body

    def put(
        self,
        key: CacheKey,
        seconds: float,
        headers: bytes,
        body: bytes,
        version: object,
        now: float | None = None,
    ) -> None:
        """Keep an answer computed from the data at ``version`` (read before computing)."""
        size = len(headers) + len(body)
        if size > self.max_bytes // 16:
            return  # one huge answer must not evict everything else
        self._drop(key)
        expires = (now if now is not None else monotonic()) + seconds
        self._entries[key] = (expires, version, headers, body)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)

    def _drop(self, key: CacheKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry[2]) + len(entry[3])
