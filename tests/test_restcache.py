"""The edge's short-lived cache of REST answers (``chaingate.edge.restcache``), as pure state."""

from __future__ import annotations

from chaingate.edge.restcache import RestCache

KEY = ("live", b"GET", b"/v1/tokens/ethereum/balances/0xabc", b"")


def test_an_answer_lives_for_its_seconds_and_dies_with_the_data() -> None:
    cache = RestCache()
    cache.put(KEY, 1.0, b"H: 1\r\n", b"{}", cache.version(), now=10.0)
    assert cache.get(KEY, now=10.5) == (b"H: 1\r\n", b"{}")
    assert cache.get(KEY, now=11.0) is None  # expired
    generation = [7]
    cache.version = lambda: generation[0]  # the index's commit generation
    cache.put(KEY, 1.0, b"", b"{}", 7, now=20.0)
    assert cache.get(KEY, now=20.1) is not None
    generation[0] = 8  # an index commit begins
    assert cache.get(KEY, now=20.2) is None
    assert (cache.hits, cache.misses) == (2, 2)


def test_an_answer_read_before_a_commit_is_never_labelled_with_it() -> None:
    cache = RestCache()
    generation = [4]
    cache.version = lambda: generation[0]
    noted = cache.version()  # the edge notes the version, then reads the store ...
    generation[0] = 6  # ... while a commit runs and ends
    cache.put(KEY, 1.0, b"", b"old balances", noted, now=0.0)
    assert cache.get(KEY, now=0.1) is None


def test_keys_keep_environments_apart() -> None:
    cache = RestCache()
    cache.put(KEY, 1.0, b"", b"mainnet data", None, now=0.0)
    assert cache.get(("test", *KEY[1:]), now=0.1) is None


def test_memory_is_bounded_by_entries_and_bytes() -> None:
    cache = RestCache(max_entries=3, max_bytes=1600)
    for i in range(10):
        cache.put(("live", b"GET", b"/p%d" % i, b""), 5.0, b"", b"x" * 90, None, now=0.0)
    assert len(cache) == 3 and cache.size == 270
    cache.put(("live", b"GET", b"/huge", b""), 5.0, b"", b"x" * 200, None, now=0.0)
    assert cache.get(("live", b"GET", b"/huge", b""), now=0.0) is None  # > 1/16 of the bytes
    for i in range(20):
        cache.put(("live", b"GET", b"/q%d" % i, b""), 5.0, b"", b"y" * 99, None, now=0.0)
    assert cache.size <= 1600
