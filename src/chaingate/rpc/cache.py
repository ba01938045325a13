"""A bounded LRU cache of JSON-RPC results that can no longer change.

Keys are ``(method, raw params)``; values are the raw ``result`` bytes exactly as a node sent
them.  Bounded both by entry count and by bytes; the oldest entries go first.  Only the RPC
service decides what may enter (static answers and facts about finalized blocks) — the cache
itself never guesses.
"""

from __future__ import annotations

from collections import OrderedDict

CacheKey = tuple[str, bytes]

# Rough per-entry overhead (tuple, bytes headers, dict slot) counted against max_bytes.
_ENTRY_OVERHEAD = 160


class ResponseCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._entries: OrderedDict[CacheKey, bytes] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> bytes | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: CacheKey, value: bytes) -> None:
        size = len(value) + len(key[1]) + _ENTRY_OVERHEAD
        if size > self._max_bytes or self._max_entries <= 0:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old) + len(key[1]) + _ENTRY_OVERHEAD
        self._entries[key] = value
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            old_key, old_value = self._entries.popitem(last=False)
            self.bytes -= len(old_value) + len(old_key[1]) + _ENTRY_OVERHEAD
            self.evictions += 1
