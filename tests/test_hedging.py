"""Hedged reads: a slow answer is raced by a second upstream; the budget bounds the hedges.

One real anvil behind two HTTP relays (tests/http_relay.py, a fault injector): each relay holds
one answer in 33 for 250 ms, at different positions, so either upstream is sometimes slow —
and, HTTP/1.1 answering in order, whatever is pipelined behind a held answer waits too.  The
same sequential workload runs against a gateway with hedging off, then on: with it on the
p99 latency falls well below the held time, and ``/metrics`` shows hedges within the budget.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

import httpx
import pytest
import trio

from chaingate.config import HedgeSettings
from chaingate.devnet.anvil import AnvilProcess
from chaingate.rpc.hedging import Hedger
from tests.http_relay import HttpRelay

HELD = 0.25
EVERY = 33
CALLS = 300
BUDGET = 0.05
BURST = 5
DEV = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"


def _holder(offset: int) -> Any:
    counter = itertools.count()

    def delay(body: bytes) -> float:
        if b"eth_getBalance" not in body:
            return 0.0  # probes and warm-up pass; the workload is what gets held
        return HELD if next(counter) % EVERY == offset else 0.0

    return delay


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


async def _workload(
    nursery: trio.Nursery, start_gateway: Any, node: AnvilProcess, hedging: bool
) -> tuple[list[float], Any, str]:
    relays = [HttpRelay(node.port, delay=_holder(5)), HttpRelay(node.port, delay=_holder(21))]
    for relay in relays:
        await nursery.start(relay.serve)
    handle = await start_gateway(
        [{"url": f"http://127.0.0.1:{r.port}", "name": f"r{i}"} for i, r in enumerate(relays)],
        network={
            "hedging": {
                "enabled": hedging,
                "budget": BUDGET,
                "burst": BURST,
                "min_delay": 0.02,
                "max_delay": 0.1,
            }
        },
    )
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=handle.base, timeout=20) as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance"}
        for i in range(CALLS + 20):
            address = "0x" + "ab" * 12 + f"{i:016x}"
            started = time.perf_counter()
            response = await client.post(
                "/v1/rpc/ethereum/devnet", json={**body, "params": [address, "latest"]}
            )
            elapsed = time.perf_counter() - started
            assert response.json()["result"].startswith("0x")
            if i >= 20:  # the first calls only teach the pool the upstreams' latencies
                latencies.append(elapsed)
        metrics = await client.get("/metrics", headers={"Authorization": "Bearer test-admin-token"})
    assert sum(relay.delayed for relay in relays) >= CALLS // EVERY
    return latencies, handle, metrics.text


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(len(ordered) * 0.99) - 1]


async def test_hedging_cuts_the_tail_within_budget(
    nursery: trio.Nursery, start_gateway: Any, anvil: AnvilProcess
) -> None:
    off, _, off_metrics = await _workload(nursery, start_gateway, anvil, hedging=False)
    on, handle, on_metrics = await _workload(nursery, start_gateway, anvil, hedging=True)
    p99_off, p99_on = _p99(off), _p99(on)
    assert p99_off >= HELD * 0.9, f"the fault was not reproduced (p99 {p99_off:.3f}s)"
    assert p99_on < HELD / 2, f"hedging did not cut the tail: p99 {p99_on:.3f}s vs {p99_off:.3f}s"
    # Off: no hedging families' samples.  On: hedges sent, won, and within the budget.
    assert "chaingate_rpc_hedges_sent_total{" not in off_metrics
    sent = _metric(on_metrics, "chaingate_rpc_hedges_sent_total")
    won = _metric(on_metrics, "chaingate_rpc_hedges_won_total")
    calls = _metric(on_metrics, "chaingate_rpc_hedgeable_total")
    assert calls >= CALLS
    assert 1 <= won <= sent
    assert sent <= BUDGET * calls + BURST, (sent, calls)
    pool = handle.gateway.chain.services["ethereum/devnet"].pool
    assert pool.hedger is not None and pool.hedger.sent == sent


async def test_writes_are_never_hedged(
    nursery: trio.Nursery, start_gateway: Any, anvil_factory: Any
) -> None:
    node = anvil_factory()
    relays = [HttpRelay(node.port, delay=lambda body: 0.3), HttpRelay(node.port)]
    for relay in relays:
        await nursery.start(relay.serve)
    handle = await start_gateway(
        [{"url": f"http://127.0.0.1:{r.port}", "name": f"r{i}"} for i, r in enumerate(relays)],
        network={"hedging": {"enabled": True, "min_delay": 0.01, "max_delay": 0.01}},
    )
    pool = handle.gateway.chain.services["ethereum/devnet"].pool
    sender = DEV
    tx = {"from": sender, "to": sender, "value": "0x1"}
    reply = await handle.rpc("eth_sendTransaction", [tx])
    assert reply["result"].startswith("0x")
    assert pool.hedger is not None and pool.hedger.sent == 0 and pool.hedger.calls == 0


def test_budget_and_delay() -> None:
    hedger = Hedger(HedgeSettings(enabled=True, budget=0.1, burst=2, min_delay=0.01, max_delay=1))
    assert hedger.delay("x") == 1.0  # no samples yet: the ceiling
    for latency in [0.001] * 97 + [0.5] * 3:
        hedger.observe("x", latency)
    assert hedger.delay("x") == pytest.approx(0.01)  # p95 of fast answers, raised to the floor
    for _ in range(100):
        hedger.observe("x", 0.3)
    assert hedger.delay("x") == pytest.approx(0.3)
    taken = 0
    for _ in range(1000):
        hedger.earn()
        taken += hedger.take()
    assert taken <= 0.1 * 1000 + 2 and taken >= 0.1 * 1000 - 1
