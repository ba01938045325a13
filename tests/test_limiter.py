"""The limiter twins: unit behaviour on both, and identical results for any operation sequence."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate import twins as impl_module
from chaingate.twins import Impl
from tests.conftest import IN_CI


def test_bucket_admits_a_seconds_worth_then_the_rate(impl: Impl) -> None:
    limiter = impl.limiter.KeyLimiter(10, 200, 0.0)
    assert [limiter.take(0.0, 1, 1) for _ in range(10)] == [0.0] * 10
    assert limiter.take(0.0, 1, 1) == pytest.approx(0.1)
    assert limiter.take(0.1, 1, 1) == 0.0
    assert limiter.remaining(0.1) == 0
    assert limiter.full_in(0.1) == pytest.approx(1.0)


def test_headers_read_before_a_refusal_show_the_bucket_it_was_refused_on(impl: Impl) -> None:
    """The edge reads the clock before ``admit`` and asks a refused request's headers at that
    moment (``KeyGate.response_headers(principal, at)``): a bucket refills only forwards, so
    they show the balance the refusal saw, not a refill a slow machine made meanwhile."""
    limiter = impl.limiter.KeyLimiter(10, 200, 0.0)
    assert [limiter.take(0.0, 1, 1) for _ in range(10)] == [0.0] * 10
    decided = 0.095  # read before admit; the bucket is refilled to 0.95 of a request by then
    assert limiter.take(0.0951, 1, 1) > 0  # refused
    assert b"X-RateLimit-Remaining: 0\r\n" in limiter.headers(decided, 0.0, 10)
    # Asked later instead (a slow machine between the refusal and its answer): a request
    # remains, which a 429 must not say.
    assert b"X-RateLimit-Remaining: 1\r\n" in limiter.headers(0.15, 0.0, 10)


def test_an_unlimited_plans_headers_name_the_second_asked(impl: Impl) -> None:
    """The compiled twin writes an unlimited plan's lines once a second: each answer still
    names the second it was asked at, whichever came before."""
    limiter = impl.limiter.KeyLimiter(0, 0, 0.0)
    unlimited = b"X-RateLimit-Limit: 2147483647\r\nX-RateLimit-Remaining: 2147483647\r\n"
    for epoch, second in ((100.2, 100), (100.9, 100), (101.0, 101), (99.5, 99), (101.4, 101)):
        assert limiter.headers(0.0, epoch, 0) == unlimited + b"X-RateLimit-Reset: %d\r\n" % second
    assert b"X-RateLimit-Limit: 5\r\n" in impl.limiter.KeyLimiter(5, 0, 0.0).headers(0.0, 101.4, 5)


def test_compute_units_bind_independently(impl: Impl) -> None:
    limiter = impl.limiter.KeyLimiter(100, 200, 0.0)
    assert [limiter.take(0.0, 1, 20) for _ in range(10)] == [0.0] * 10
    assert limiter.take(0.0, 1, 20) == pytest.approx(0.1)


def test_an_oversized_cost_is_admitted_when_full_and_leaves_a_debt(impl: Impl) -> None:
    limiter = impl.limiter.KeyLimiter(10, 200, 0.0)
    assert limiter.take(0.0, 1, 1000) == 0.0  # bigger than a second's worth: admitted once
    assert limiter.take(0.0, 1, 1) == pytest.approx(1000 / 200 - 1 + 1 / 200)


def test_absorb_charges_others_consumption_with_a_floor(impl: Impl) -> None:
    limiter = impl.limiter.KeyLimiter(10, 200, 0.0)
    limiter.absorb(0.0, 100, 0)
    assert limiter.take(0.0, 1, 1) == pytest.approx(1.1)  # debt floored at one second
    unlimited = impl.limiter.KeyLimiter(0, 0, 0.0)
    unlimited.absorb(0.0, 100, 100)
    assert unlimited.take(0.0, 1000, 1000) == 0.0


def test_day_quota(impl: Impl) -> None:
    quota = impl.limiter.DayQuota(3, 100, used=1)
    assert quota.room(100) == 2
    assert [quota.take(100, 1) for _ in range(3)] == [True, True, False]
    assert quota.room(101) == 3 and quota.take(101, 3) and quota.used == 3
    quota.add(101, 5)
    assert quota.room(101) == 0
    assert impl.limiter.DayQuota(0, 1).room(1) == -1


def test_meter_and_headers(impl: Impl) -> None:
    meter = impl.limiter.UsageMeter()
    meter.record("k", "a", "eth/main", "m", 1, 1, 5, 0)
    meter.record("k", "a", "eth/main", "m", 1, 2, 10, 1)
    meter.record("k", "a", "eth/main", "n", 1, 1, 1, 0)
    meter.record("k", "a", "eth/test", "m", 1, 4, 4, 0)  # another network: its own counter
    assert meter.drain() == [
        ("k", "a", "eth/main", "m", 1, 3, 15, 1),
        ("k", "a", "eth/main", "n", 1, 1, 1, 0),
        ("k", "a", "eth/test", "m", 1, 4, 4, 0),
    ]
    assert meter.drain() == [] and len(meter) == 0
    assert impl.limiter.rate_headers(10, 3, 99) == (
        b"X-RateLimit-Limit: 10\r\nX-RateLimit-Remaining: 3\r\nX-RateLimit-Reset: 99\r\n"
    )


def _pair() -> tuple[Any, Any]:
    try:
        return impl_module.pure().limiter, impl_module.compiled().limiter
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("compiled modules not built")


operation = st.one_of(
    st.tuples(st.just("take"), st.floats(0, 3), st.integers(0, 50), st.integers(0, 5000)),
    st.tuples(st.just("absorb"), st.floats(0, 3), st.floats(0, 100), st.floats(0, 5000)),
    st.tuples(st.just("remaining"), st.floats(0, 3)),
    st.tuples(st.just("full_in"), st.floats(0, 3)),
    st.tuples(st.just("rates"), st.integers(0, 200), st.integers(0, 5000)),
    st.tuples(
        st.just("admit"),
        st.floats(0, 3),
        st.integers(0, 2),
        st.integers(0, 50),
        st.integers(0, 5000),
    ),
    st.tuples(st.just("headers"), st.floats(0, 3), st.floats(0, 2e9), st.integers(0, 200)),
)


@settings(max_examples=400)
@given(
    rps=st.integers(0, 200),
    units=st.integers(0, 5000),
    steps=st.lists(operation, max_size=60),
)
def test_twins_agree_on_any_sequence(rps: int, units: int, steps: list[tuple[Any, ...]]) -> None:
    pure, compiled = _pair()
    a, b = pure.KeyLimiter(rps, units, 0.0), compiled.KeyLimiter(rps, units, 0.0)
    quota_a, quota_b = pure.DayQuota(rps * 3, 0), compiled.DayQuota(rps * 3, 0)
    now = 0.0
    for step in steps:
        kind = step[0]
        if kind == "rates":
            a.set_rates(step[1], step[2])
            b.set_rates(step[1], step[2])
            continue
        now += step[1]
        if kind == "take":
            assert a.take(now, step[2], step[3]) == b.take(now, step[2], step[3])
        elif kind == "absorb":
            a.absorb(now, step[2], step[3])
            b.absorb(now, step[2], step[3])
        elif kind == "admit":
            assert a.admit(now, step[2], step[3], step[4], quota_a) == b.admit(
                now, step[2], step[3], step[4], quota_b
            )
            assert quota_a.used == quota_b.used
        elif kind == "headers":
            assert a.headers(now, step[2], step[3]) == b.headers(now, step[2], step[3])
        elif kind == "remaining":
            assert a.remaining(now) == b.remaining(now)
        else:
            assert a.full_in(now) == b.full_in(now)


@settings(max_examples=300)
@given(
    limit=st.integers(0, 20),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10), st.booleans()), max_size=40),
)
def test_day_quota_twins_agree(limit: int, steps: list[tuple[int, int, bool]]) -> None:
    pure, compiled = _pair()
    a, b = pure.DayQuota(limit, 0), compiled.DayQuota(limit, 0)
    for day, requests, take in steps:
        assert a.room(day) == b.room(day)
        if take:
            assert a.take(day, requests) == b.take(day, requests)
        else:
            a.add(day, requests)
            b.add(day, requests)
        assert a.used == b.used


meter_step = st.one_of(
    st.tuples(
        st.just("record"),
        st.sampled_from(["k1", "k2"]),
        st.sampled_from(["a1", "a2"]),
        st.sampled_from(["eth/main", "eth/test", ""]),
        st.sampled_from(["eth_call", "eth_getBalance", "batch"]),
        st.integers(100, 102),
        st.integers(0, 3),
        st.integers(0, 50),
        st.integers(0, 2),
        st.booleans(),  # the same str objects as the last sample's, or equal copies
    ),
    st.tuples(st.just("drain")),
)


@settings(max_examples=300)
@given(steps=st.lists(meter_step, max_size=40))
def test_the_usage_meter_twins_agree(steps: list[Any]) -> None:
    """The compiled meter finds the slot it counted last without a lookup when its strings
    are the same objects: equal copies, other slots, a new minute and drains between samples
    must all count exactly as the pure meter does."""
    pure, compiled = (limiter.UsageMeter() for limiter in _pair())
    for step in steps:
        if step[0] == "drain":
            assert pure.drain() == compiled.drain()
            continue
        *names, minute, requests, cu, errors, same = step[1:]
        if not same:
            names = ["".join(list(name)) for name in names]  # equal, not identical
        for meter in (pure, compiled):
            meter.record(*names, minute, requests, cu, errors)
        assert len(pure) == len(compiled)
    assert pure.drain() == compiled.drain()
