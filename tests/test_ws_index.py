"""The logs index, the filter caps and the nesting check, without a gateway.

* the index finds exactly what a scan of every filter finds, through adds and removes, and
  meets only the filters filed under a log's address or topics;
* identical filters and identical value sets are stored once;
* the caps resolve plan against ceiling and name the limit that applies;
* ``too_deep`` agrees with both framing twins on where JSON is nested too deep;
* the hub's logs fan-out yields by work done: a block whose logs meet many filters that do
  not match them (so nothing is pushed) does not stall the loop.
"""

from __future__ import annotations

import gc
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from chaingate.auth.plans import Limits
from chaingate.chain.events import ChainEvent, Log
from chaingate.config import WebSocketSettings
from chaingate.jsondepth import too_deep
from chaingate.twins import Impl
from chaingate.ws.caps import NO_LIMIT, KeyBudgets, Limit, caps_for, over_budget
from chaingate.ws.filters import FilterError, LogFilter, log_key, parse_log_filter
from chaingate.ws.hub import Hub
from chaingate.ws.logindex import ADDRESS, LogIndex, key_dimension
from chaingate.ws.registry import Subscription


def addr(n: int) -> str:
    return "0x" + n.to_bytes(20, "big").hex()


def t(n: int) -> str:
    return "0x" + n.to_bytes(32, "big").hex()


def make_log(address: str, *topics: str, index: int = 0) -> Log:
    return Log(
        address=address,
        topics=list(topics),
        data="0x",
        block_number="0x1",
        block_hash="0x" + "01" * 32,
        transaction_hash="0x" + "11" * 32,
        transaction_index="0x0",
        log_index=hex(index),
    )


class Sink:
    def __init__(self) -> None:
        self.pushes = 0

    def push(self, frame: bytes, cu: int) -> None:
        self.pushes += 1


def subscription(criteria: Any) -> Subscription:
    return Subscription("logs", Sink(), log_filter=parse_log_filter(criteria))


def matched(index: LogIndex, log: Log) -> set[str]:
    key = log_key(log)
    assert key is not None
    groups = index.candidates(*key)
    assert len(groups) == len(set(map(id, groups)))  # each group met once at most
    return {member.id for group in groups if group.filter.accepts(*key) for member in group.members}


# --- the index against a scan -----------------------------------------------------------------


def _random_criteria(rng: random.Random) -> Any:
    def one(pool: list[str], null_alternative: bool) -> Any:
        choice = rng.random()
        if choice < 0.3:
            return None
        if choice < 0.55:
            return rng.choice(pool)
        items: list[Any] = rng.sample(pool, rng.randint(0, 4))
        if null_alternative and rng.random() < 0.1:
            items.append(None)  # a null alternative: the position is a wildcard
        return items

    addresses = [addr(n) for n in range(6)]
    topics = [t(n) for n in range(6)]
    criteria: dict[str, Any] = {}
    if rng.random() < 0.7:
        criteria["address"] = one(addresses, False)
    if rng.random() < 0.8:
        criteria["topics"] = [one(topics, True) for _ in range(rng.randint(0, 4))]
    return criteria


def _random_log(rng: random.Random) -> Log:
    address = addr(rng.randint(0, 7))  # 6 and 7: in no filter
    topics = [t(rng.randint(0, 7)) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.2:  # nodes may send upper-case hex; filters ignore case
        address = address.upper().replace("0X", "0x")
    return make_log(address, *topics)


def test_index_finds_what_a_scan_finds_through_adds_and_removes() -> None:
    rng = random.Random(14)
    index = LogIndex()
    live: dict[str, tuple[Subscription, LogFilter]] = {}  # with a filter of its own to scan
    for round_ in range(6):
        for _ in range(150):
            criteria = _random_criteria(rng)
            sub = subscription(criteria)
            index.add(sub)
            live[sub.id] = (sub, parse_log_filter(criteria))
        for sub_id in rng.sample(sorted(live), len(live) // 3):
            sub, _ = live.pop(sub_id)
            assert index.remove(sub)
            assert not index.remove(sub)  # twice: nothing left to remove
        assert index.subscriptions == len(live)
        for _ in range(300):
            log = _random_log(rng)
            expected = {sub.id for sub, scan in live.values() if scan.matches(log)}
            assert matched(index, log) == expected, (round_, log)
    for sub, _ in live.values():
        assert index.remove(sub)
    assert index.subscriptions == 0 and index.groups == 0
    assert index.filed == 0 and index.value_sets == 0


def test_a_log_meets_only_filters_filed_under_its_values() -> None:
    index = LogIndex()
    for n in range(200):
        index.add(subscription({"address": [addr(n), addr(n + 1000)]}))
        index.add(subscription({"topics": [None, [t(n), t(n + 1000)]]}))
    index.add(subscription({"topics": [None, None]}))  # wildcards: met by every log
    anything = subscription({})
    index.add(anything)
    key = log_key(make_log(addr(5), t(9999), t(7)))
    assert key is not None
    groups = index.candidates(*key)
    # addr(5)'s filter, topic1 = t(7)'s filter and the two wildcard groups: nothing else.
    assert len(groups) == 4
    # A log in no filter meets the two wildcard groups only ([None, None] needs two topics).
    outsider = make_log(addr(5000), t(5000))
    key = log_key(outsider)
    assert key is not None
    assert len(index.candidates(*key)) == 2
    assert matched(index, outsider) == {anything.id}


def test_identical_filters_and_value_sets_are_stored_once() -> None:
    index = LogIndex()
    topics = [t(n) for n in range(1000)]
    first = subscription({"address": addr(1), "topics": [topics]})
    same = subscription({"address": addr(1).upper().replace("0X", "0x"), "topics": [topics]})
    other = subscription({"address": addr(2), "topics": [list(reversed(topics))]})
    for sub in (first, same, other):
        index.add(sub)
    assert index.groups == 2
    assert first.log_filter is same.log_filter  # one filter for both subscriptions
    assert first.log_filter is not None and other.log_filter is not None
    assert first.log_filter.topics[0] is other.log_filter.topics[0]  # one set of topics
    # Both are filed under their one address (1 value), not under 1,000 topics.
    assert index.filed == 2
    assert index.value_sets == 3  # {addr(1)}, {addr(2)}, the topics
    assert index.remove(first) and index.groups == 2
    assert index.remove(same) and index.groups == 1 and index.value_sets == 2
    assert index.remove(other) and index.filed == 0 and index.groups == 0
    assert index.value_sets == 0


@pytest.mark.parametrize(
    ("criteria", "dimension"),
    [
        ({}, None),
        ({"topics": [None, None]}, None),
        ({"address": [addr(1), addr(2)], "topics": [t(1)]}, ADDRESS),  # 2 < 1 x 16
        ({"address": [addr(n) for n in range(20)], "topics": [t(1)]}, 0),  # 20 > 16
        ({"topics": [t(1), [t(2), t(3)]]}, 1),  # topic0 weighs 16, topic1 two values
        ({"topics": [None, None, [t(2), t(3)], t(4)]}, 3),
        ({"address": addr(1), "topics": [None, t(2)]}, ADDRESS),  # ties: address first
    ],
)
def test_key_dimension(criteria: Any, dimension: int | None) -> None:
    assert key_dimension(parse_log_filter(criteria)) == dimension


# --- caps --------------------------------------------------------------------------------------


def test_filter_caps_name_the_limit() -> None:
    two = Limit(2, "ws_filter_addresses")
    with pytest.raises(FilterError) as addresses:
        parse_log_filter({"address": [addr(1), addr(2), addr(3)]}, addresses=two)
    assert addresses.value.limit == two
    assert "3 (limit ws_filter_addresses = 2)" in str(addresses.value)
    three = Limit(3, "[ws] max_filter_topics")
    # Topic alternatives count over every position together.
    with pytest.raises(FilterError) as topics:
        parse_log_filter({"topics": [[t(1), t(2)], None, [t(3), t(4)]]}, topics=three)
    assert topics.value.limit == three
    assert "4 (limit [ws] max_filter_topics = 3)" in str(topics.value)
    assert parse_log_filter({"topics": [[t(1), t(2)], t(3)]}, topics=three).cost == 96
    # Within the caps; the cost counts distinct values, as they are stored.
    assert parse_log_filter({"address": [addr(1), "0x" + addr(1)[2:].upper()]}).cost == 20
    assert parse_log_filter({"address": [addr(1), addr(2)]}, addresses=two).cost == 40


def test_caps_resolve_plan_against_ceiling() -> None:
    settings = WebSocketSettings(
        max_subscriptions=50,
        max_filter_addresses=500,
        max_filter_topics=600,
        max_filter_bytes_per_connection=10_000,
    )
    ceilings = caps_for(None, settings)
    assert ceilings.subscriptions == 50
    assert ceilings.filter_addresses == Limit(500, "[ws] max_filter_addresses")
    assert ceilings.filter_topics == Limit(600, "[ws] max_filter_topics")
    assert ceilings.filter_bytes_connection == Limit(10_000, "[ws] max_filter_bytes_per_connection")
    assert ceilings.filter_bytes_key == NO_LIMIT
    plan = Limits(
        ws_subscriptions=100,  # above the ceiling: the ceiling holds
        ws_filter_addresses=100,
        ws_filter_topics=0,  # none in the plan: the ceiling
        ws_filter_bytes_per_connection=2_000,
        ws_filter_bytes_per_key=5_000,
    )
    caps = caps_for(plan, settings)
    assert caps.subscriptions == 50
    assert caps.filter_addresses == Limit(100, "ws_filter_addresses")
    assert caps.filter_topics == Limit(600, "[ws] max_filter_topics")
    assert caps.filter_bytes_connection == Limit(2_000, "ws_filter_bytes_per_connection")
    assert caps.filter_bytes_key == Limit(5_000, "ws_filter_bytes_per_key")
    unbounded = caps_for(None, WebSocketSettings(max_filter_bytes_per_connection=0))
    assert unbounded.filter_bytes_connection == NO_LIMIT
    # Budgets: the connection's first, then the key's; a filter of no values costs nothing.
    assert over_budget(1_000, 1_000, 1_000, caps) is None
    assert over_budget(1_001, 1_000, 1_000, caps) == caps.filter_bytes_connection
    assert over_budget(1_000, 0, 4_001, caps) == caps.filter_bytes_key
    assert over_budget(0, 10**9, 10**9, caps) is None
    budgets = KeyBudgets()
    budgets.take("k", 300)
    budgets.take("k", 200)
    budgets.give("k", 300)
    assert budgets.held("k") == 200
    budgets.give("k", 200)
    assert budgets.held("k") == 0


def test_plans_file_caps_every_plan() -> None:
    from pathlib import Path

    from chaingate.auth.plans import Plans

    plans = Plans.load(Path(__file__).resolve().parent.parent / "config" / "plans.toml")
    free, growth = plans.limits("free"), plans.limits("growth")
    assert 0 < free.ws_filter_addresses <= growth.ws_filter_addresses
    assert 0 < free.ws_filter_bytes_per_connection <= free.ws_filter_bytes_per_key
    assert 0 < growth.ws_filter_bytes_per_connection <= growth.ws_filter_bytes_per_key
    # An account's own values replace the plan's, like every other limit.
    own = plans.limits("free", json.dumps({"ws_filter_addresses": 7}))
    assert own.ws_filter_addresses == 7 and own.ws_filter_topics == free.ws_filter_topics


# --- nesting -------------------------------------------------------------------------------


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice([1, "[{", 'q"[', "\\", None, "]]}"])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value, "s": '[["{\\'}
    return value


def _noise(rng: random.Random, budget: int) -> Any:
    if budget <= 0 or rng.random() < 0.3:
        return rng.choice([1, "[", '"{', "\\\\[", None])
    if rng.random() < 0.5:
        return [_noise(rng, budget - 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _noise(rng, budget - 1) for i in range(rng.randint(0, 3))}


def test_too_deep_agrees_with_the_framing(impl: Impl) -> None:
    rng = random.Random(9)
    refused = 0
    for depth in [*range(120, 135), *(rng.randint(1, 300) for _ in range(400))]:
        params = [_noise(rng, 5) for _ in range(rng.randint(0, 40))]
        params.insert(rng.randint(0, len(params)), _nested(rng, depth))
        message = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": params}
        ).encode()
        framing = impl.jsonrpc.parse_request(message, 1000)
        assert too_deep(message) == (framing.error == -32700), depth
        refused += framing.error == -32700
    assert 0 < refused < 415  # both answers were exercised


# --- the fan-out yields by work ---------------------------------------------------------------


@pytest.fixture
def quiet_collector() -> Iterator[None]:
    """The test process carries pytest, web3, hypothesis and the rest: a full collection
    walks all of it (50-250 ms here, ~0 in a chaingate process).  Frozen out of the
    collector, the loop stalls a test measures are chaingate's own."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class StallMonitor:
    """The most CPU time the loop's thread spent between two turns of this task (which
    sleeps 1 ms a turn): work that ran without yielding.  CPU time, not wall time: the
    machine is shared, and time the OS gives other processes (or the GIL other threads)
    is nobody's stall here."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def run(self) -> None:
        last = time.thread_time()
        try:
            while True:
                await trio.sleep(0.001)
                now = time.thread_time()
                self.worst = max(self.worst, now - last)
                last = now
        finally:  # cancelled: a stall that ended just now counts too
            self.worst = max(self.worst, time.thread_time() - last)


def follower_less_hub() -> Hub:
    hub = Hub("ethereum/devnet", None, 1.0, 1.0)  # type: ignore[arg-type]
    _, receive = trio.open_memory_channel[ChainEvent](0)
    hub.attach(receive, None)  # type: ignore[arg-type]
    return hub


@pytest.mark.usefixtures("quiet_collector")
async def test_logs_fanout_yields_while_checking_filters_that_do_not_match() -> None:
    hub = follower_less_hub()
    transfer = t(0xDDF2)
    sinks = []
    for n in range(1000):
        # Filed under topic0 (16 < 20 values of topic1): every Transfer log meets all 1,000.
        sink = Sink()
        window = [t(n + k) for k in range(20)]
        hub.add(hub.prepare("logs", [{"topics": [transfer, window]}], sink))
        sinks.append(sink)
    unmatched = [make_log(addr(1), transfer, t(10**6 + i), index=i) for i in range(3000)]
    matching = [make_log(addr(1), transfer, t(500), index=3000)]
    monitor = StallMonitor()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor.run)
        await trio.sleep(0.01)
        started = time.perf_counter()
        await hub.push_logs(unmatched + matching)
        took = time.perf_counter() - started
        await trio.sleep(0.01)  # the monitor sees the loop again
        nursery.cancel_scope.cancel()
    # t(500) is in windows 481..500: those 20 subscribers got the one matching log.
    assert [n for n, sink in enumerate(sinks) if sink.pushes] == list(range(481, 501))
    assert hub.pushes["logs"] == 20
    assert monitor.worst < 0.05, (monitor.worst, took)
