"""Gas prices: the fee arithmetic, the per-head oracle against real anvil, the endpoint."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from chaingate import twins as impl_module
from chaingate.api.app import create_app
from chaingate.api.build import build_api
from chaingate.api.chains import ChainNames
from chaingate.api.deps import ApiDeps
from chaingate.auth.gate import Principal
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import (
    Apply,
    Block,
    ChainEvent,
    Finalized,
    Revert,
    header_from_rpc,
    transaction_hashes,
)
from chaingate.config import ConfigError, NetworkSettings, RpcSettings
from chaingate.config.network import Network
from chaingate.devnet.anvil import AnvilProcess
from chaingate.gas import prices
from chaingate.gas.oracle import GasOracle
from chaingate.rpc.heads import parse_evm_head
from chaingate.rpc.pool import UpstreamPool
from chaingate.twins import Impl
from tests.conftest import StartGateway
from tests.test_auth import AuthStack, assert_rate_headers, auth_settings, start_auth

GWEI = 10**9
FLOOR = prices.PRIORITY_FLOOR_WEI
PERCENTILES = [10.0, 50.0, 90.0]
PROBE = b'{"jsonrpc":"2.0","id":0,"method":"eth_blockNumber","params":[]}'


# --- independent reference computations (deliberately not reusing prices.py) --------------


def gwei(wei: int) -> str:
    """Decimal gwei by Decimal arithmetic: the reference for ``format_gwei``."""
    with localcontext(prec=100):
        return format((Decimal(wei) / Decimal(GWEI)).normalize(), "f")


def reference_tips(history: dict[str, Any]) -> list[int]:
    rows = [[int(x, 16) for x in row] for row in history["reward"]]
    rows = [row for row in rows if any(row)]
    tips = [sorted(col)[len(col) // 2] for col in zip(*rows, strict=True)] if rows else [FLOOR] * 3
    out, previous = [], FLOOR
    for tip in tips:
        previous = max(previous, tip)
        out.append(previous)
    return out


def reference_body(history: dict[str, Any], block_time: float = 12.0) -> dict[str, Any]:
    """The expected body (minus updated_at) from a raw eth_feeHistory answer."""
    base = int(history["baseFeePerGas"][-1], 16)
    tips = reference_tips(history)
    seconds = [max(1, -(-int(n * block_time * 1000) // 1000)) for n in (4, 2, 1)]
    return {
        "block_number": int(history["oldestBlock"], 16) + len(history["gasUsedRatio"]) - 1,
        "base_fee_gwei": gwei(base),
        "estimates": {
            tier: {
                "max_fee_gwei": gwei(2 * base + tip),
                "max_priority_fee_gwei": gwei(tip),
                "estimated_seconds": secs,
            }
            for tier, tip, secs in zip(("slow", "standard", "fast"), tips, seconds, strict=True)
        },
    }


def without_time(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("updated_at", "chain", "network")}


def history(
    rewards: Sequence[Sequence[int]], base_fees: Sequence[int] | None = None, oldest: int = 100
) -> dict[str, Any]:
    n = len(rewards)
    base_fees = base_fees if base_fees is not None else [GWEI] * (n + 1)
    return {
        "oldestBlock": hex(oldest),
        "baseFeePerGas": [hex(b) for b in base_fees],
        "gasUsedRatio": [0.5 if any(r) else 0.0 for r in rewards],
        "reward": [[hex(v) for v in r] for r in rewards],
    }


# --- formatting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wei", "text"),
    [
        (0, "0"),
        (1, "0.000000001"),
        (10, "0.00000001"),
        (GWEI, "1"),
        (10 * GWEI, "10"),
        (1_500_000_000, "1.5"),
        (123_456_789_012, "123.456789012"),
        (1_000_000, "0.001"),
        (10**40, "1" + "0" * 31),
    ],
)
def test_format_gwei_examples(wei: int, text: str) -> None:
    assert prices.format_gwei(wei) == text


def test_format_gwei_refuses_negative_amounts() -> None:
    with pytest.raises(ValueError, match="negative"):
        prices.format_gwei(-1)


@given(st.integers(min_value=0, max_value=10**60))
def test_format_gwei_is_exact(wei: int) -> None:
    text = prices.format_gwei(wei)
    assert re.fullmatch(r"(0|[1-9][0-9]*)(\.[0-9]{0,8}[1-9])?", text), text
    with localcontext(prec=100):
        assert Decimal(text) * GWEI == wei  # exact: no float ever touched it
    assert text == gwei(wei)


@pytest.mark.parametrize(
    ("value", "expected"), [("0x0", 0), ("0x1", 1), ("0x3b9aca00", GWEI), ("0xfF", 255)]
)
def test_parse_quantity(value: str, expected: int) -> None:
    assert prices.parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value", ["", "0x", "12", "0xg", " 0x1", "0x1_0", "0X1", 5, None, "0x" + "f" * 65]
)
def test_parse_quantity_refuses_junk(value: Any) -> None:
    with pytest.raises(ValueError, match="hex quantity"):
        prices.parse_quantity(value)


@pytest.mark.parametrize(
    ("blocks", "block_time", "seconds"),
    [(4, 12.0, 48), (2, 12.0, 24), (1, 12.0, 12), (1, 0.25, 1), (4, 0.25, 1), (3, 0.1, 1),
     (4, 2.5, 10), (1, 0.0, 1), (1, 1.2, 2)],
)  # fmt: skip
def test_estimated_seconds(blocks: int, block_time: float, seconds: int) -> None:
    assert prices.estimated_seconds(blocks, block_time) == seconds


def test_iso_utc() -> None:
    assert prices.iso_utc(0) == "1970-01-01T00:00:00Z"
    assert prices.iso_utc(1_700_000_000.9) == "2023-11-14T22:13:20Z"


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "percentiles", "problem"),
    [
        (0, (10.0, 50.0, 90.0), "history_blocks"),
        (1025, (10.0, 50.0, 90.0), "history_blocks"),
        (20, (50.0, 50.0, 90.0), "strictly increasing"),
        (20, (90.0, 50.0, 10.0), "strictly increasing"),
        (20, (-1.0, 50.0, 90.0), "between 0 and 100"),
        (20, (10.0, 50.0, 100.5), "between 0 and 100"),
        (20, (10.0, 50.0), "three numbers"),
    ],
)
def test_bad_gas_settings_are_refused(
    blocks: int, percentiles: tuple[float, ...], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        prices.check_settings(blocks, percentiles)


def test_oracle_refuses_bad_settings_as_a_config_error() -> None:
    net = msgspec.convert(
        {"upstreams": [{"url": "http://127.0.0.1:1"}], "gas": {"percentiles": [90, 50, 10]}},
        NetworkSettings,
    )
    pool = UpstreamPool("x/y", net, RpcSettings(), impl_module.select(), PROBE, parse_evm_head)
    with pytest.raises(ConfigError, match=r"chains\.x\.y: .*strictly increasing"):
        GasOracle("x", "y", net, ChainClient(pool))


# --- fee history -> fees ---------------------------------------------------------------


def test_parse_fee_history_of_anvil_shape() -> None:
    raw = {
        "baseFeePerGas": ["0x3b9aca00", "0x3b9aca00", "0x3434cab8", "0x2dae3161"],
        "gasUsedRatio": [0.0, 0.0035, 0.0],
        "baseFeePerBlobGas": ["0x1", "0x1", "0x1", "0x1"],
        "blobGasUsedRatio": [0.0, 0.0, 0.0],
        "oldestBlock": "0x0",
        "reward": [["0x0", "0x0", "0x0"], ["0x3b9aca00", "0xb2d05e00", "0x1dcd65000"], ["0x0"] * 3],
    }
    parsed = prices.parse_fee_history(raw)
    assert parsed.oldest_block == 0 and parsed.newest_block == 2
    assert parsed.pending_base_fee == 0x2DAE3161
    assert parsed.rewards[1] == (GWEI, 3 * GWEI, 8 * GWEI)
    fees = prices.compute_fees(parsed)
    assert fees.block_number == 2
    assert fees.priority == (GWEI, 3 * GWEI, 8 * GWEI)  # the empty blocks do not count
    assert fees.max_fees == tuple(2 * 0x2DAE3161 + p for p in fees.priority)


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda h: h.update(gasUsedRatio=[], reward=[], baseFeePerGas=["0x1"]), "no blocks"),
        (lambda h: h.update(baseFeePerGas=["0x1"]), "one more entry"),
        (lambda h: h.pop("reward"), "one row per block"),
        (lambda h: h.update(reward=[["0x1", "0x2"], ["0x1", "0x2", "0x3"]]), "per percentile"),
        (lambda h: h.update(reward=[["0x1", "0x2", "junk"], ["0x1", "0x2", "0x3"]]), "hex"),
        (lambda h: h.update(oldestBlock=7), "str"),
        (lambda h: h.pop("gasUsedRatio"), "gasUsedRatio"),
    ],
)
def test_malformed_fee_history_is_a_value_error(
    mutate: Callable[[dict[str, Any]], Any], problem: str
) -> None:
    raw = history([[1, 2, 3], [4, 5, 6]])
    mutate(raw)
    with pytest.raises(ValueError, match=problem):
        prices.parse_fee_history(raw)


def test_fee_history_without_base_fee_field_is_pre_london() -> None:
    raw = history([[2 * GWEI, 3 * GWEI, 6 * GWEI]])
    raw.pop("baseFeePerGas")
    parsed = prices.parse_fee_history(raw)
    assert parsed.pending_base_fee == 0


def test_median_across_blocks_resists_one_outlier() -> None:
    rows = [[1 * GWEI, 2 * GWEI, 3 * GWEI]] * 4 + [[500 * GWEI, 900 * GWEI, 1000 * GWEI]]
    fees = prices.compute_fees(prices.parse_fee_history(history(rows)))
    assert fees.priority == (GWEI, 2 * GWEI, 3 * GWEI)


def test_even_count_takes_the_upper_middle() -> None:
    rows = [[1, 10, 100], [2, 20, 200], [3, 30, 300], [4, 40, 400]]
    rows = [[v * GWEI for v in row] for row in rows]
    fees = prices.compute_fees(prices.parse_fee_history(history(rows)))
    assert fees.priority == (3 * GWEI, 30 * GWEI, 300 * GWEI)


def test_zero_reward_blocks_are_left_out_but_zero_percentiles_count() -> None:
    rows = [[0, 0, 0]] * 10 + [[0, 2 * GWEI, 5 * GWEI], [0, 4 * GWEI, 7 * GWEI]]
    fees = prices.compute_fees(prices.parse_fee_history(history(rows)))
    # slow: the blocks paying tips had zero-tip transactions at p10: floor, not 0.
    assert fees.priority == (FLOOR, 4 * GWEI, 7 * GWEI)


def test_an_idle_window_offers_the_floor_on_every_tier() -> None:
    fees = prices.compute_fees(prices.parse_fee_history(history([[0, 0, 0]] * 20)))
    assert fees.priority == (FLOOR, FLOOR, FLOOR)
    assert fees.max_fees == (2 * GWEI + FLOOR,) * 3


def test_tiny_tips_are_lifted_to_the_floor() -> None:
    fees = prices.compute_fees(prices.parse_fee_history(history([[1, 2, 3 * GWEI]])))
    assert fees.priority == (FLOOR, FLOOR, 3 * GWEI)


def test_tiers_never_decrease_even_if_a_node_reports_them_backwards() -> None:
    assert prices.ascending_floor((9 * GWEI, 5 * GWEI, 7 * GWEI), FLOOR) == (9 * GWEI,) * 3


def test_pre_london_idle_window_falls_back_to_eth_gas_price() -> None:
    idle = prices.parse_fee_history(history([[0, 0, 0]] * 3, base_fees=[0] * 4))
    assert prices.needs_gas_price(idle)
    fees = prices.compute_fees(idle, gas_price=1_875_000_000)
    assert fees.base_fee == 0
    assert fees.priority == (1_875_000_000,) * 3 and fees.max_fees == fees.priority


def test_pre_london_rewards_are_whole_gas_prices() -> None:
    busy = prices.parse_fee_history(history([[2 * GWEI, 3 * GWEI, 6 * GWEI]], base_fees=[0, 0]))
    assert not prices.needs_gas_price(busy)
    fees = prices.compute_fees(busy, gas_price=GWEI)
    assert fees.priority == (2 * GWEI, 3 * GWEI, 6 * GWEI) and fees.max_fees == fees.priority


def test_london_idle_window_does_not_need_eth_gas_price() -> None:
    idle = prices.parse_fee_history(history([[0, 0, 0]] * 3))
    assert not prices.needs_gas_price(idle)
    assert prices.compute_fees(idle, gas_price=99 * GWEI).priority == (FLOOR,) * 3


def test_legacy_fees_without_fee_history() -> None:
    fees = prices.legacy_fees(42, 3 * GWEI)
    assert fees == prices.Fees(42, 0, (3 * GWEI,) * 3)
    assert prices.legacy_fees(42, 0).priority == (FLOOR,) * 3


def test_estimate_has_the_spec_fields_and_exact_strings() -> None:
    fees = prices.Fees(1234, 1_234_567_891, (FLOOR, 1_500_000_000, 2 * GWEI))
    body = msgspec.json.decode(
        msgspec.json.encode(
            prices.estimate(fees, chain="ethereum", network="mainnet", block_time=12.0, now=0)
        )
    )
    assert body == {
        "chain": "ethereum",
        "network": "mainnet",
        "block_number": 1234,
        "base_fee_gwei": "1.234567891",
        "estimates": {
            "slow": {
                "max_fee_gwei": "2.470135782",
                "max_priority_fee_gwei": "0.001",
                "estimated_seconds": 48,
            },
            "standard": {
                "max_fee_gwei": "3.969135782",
                "max_priority_fee_gwei": "1.5",
                "estimated_seconds": 24,
            },
            "fast": {
                "max_fee_gwei": "4.469135782",
                "max_priority_fee_gwei": "2",
                "estimated_seconds": 12,
            },
        },
        "updated_at": "1970-01-01T00:00:00Z",
    }


_wei = st.integers(min_value=0, max_value=10**24)
_row = st.lists(_wei, min_size=3, max_size=3).map(sorted)


@given(st.lists(_row, min_size=1, max_size=40), _wei, st.randoms(use_true_random=False))
def test_fee_properties(rows: list[list[int]], base_fee: int, rng: Any) -> None:
    raw = history(rows, base_fees=[base_fee] * (len(rows) + 1))
    fees = prices.compute_fees(prices.parse_fee_history(raw))
    slow, standard, fast = fees.priority
    assert FLOOR <= slow <= standard <= fast
    assert fees.max_fees == (2 * base_fee + slow, 2 * base_fee + standard, 2 * base_fee + fast)
    assert fees.block_number == 100 + len(rows) - 1
    # Each tier is an observed reward of its percentile (or the floor) within their range.
    paying = [row for row in rows if any(row)]
    for tier, tip in enumerate(fees.priority):
        column = [row[tier] for row in paying] or [FLOOR]
        assert tip == max(FLOOR, sorted(column)[len(column) // 2])
        assert tip <= max(FLOOR, max(column))
    # The order of blocks does not matter.
    shuffled = list(rows)
    rng.shuffle(shuffled)
    again = prices.compute_fees(
        prices.parse_fee_history(history(shuffled, base_fees=[base_fee] * (len(rows) + 1)))
    )
    assert again.priority == fees.priority
    assert reference_tips(raw) == list(fees.priority)


# --- against real anvil -------------------------------------------------------------------


async def node(url: str, method: str, params: list[Any] | None = None) -> Any:
    async with httpx.AsyncClient(timeout=10) as client:
        reply = (
            await client.post(
                url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
            )
        ).json()
    if "error" in reply:
        raise AssertionError(f"{method}: {reply['error']}")
    return reply["result"]


def network_settings(url: str, **extra: Any) -> NetworkSettings:
    return msgspec.convert(
        {"upstreams": [{"url": url, "name": "up0"}], "chain_id": 31337, "testnet": True, **extra},
        NetworkSettings,
    )


async def open_client(nursery: trio.Nursery, net: NetworkSettings) -> ChainClient:
    """A ChainClient over a running pool, built the way RpcService builds its pool."""
    rpc = RpcSettings(probe_interval=0.2)
    pool = UpstreamPool("ethereum/devnet", net, rpc, impl_module.select(), PROBE, parse_evm_head)
    await nursery.start(pool.run)
    return ChainClient(pool)


async def send_block(url: str, txs: Sequence[dict[str, Any]]) -> int:
    """Mine one block holding ``txs`` (from anvil's unlocked accounts); its number."""
    accounts = await node(url, "eth_accounts")
    await node(url, "evm_setAutomine", [False])
    for i, tx in enumerate(txs):
        call = {"from": accounts[i], "to": accounts[9], "value": "0x1", **tx}
        await node(url, "eth_sendTransaction", [call])
    await node(url, "evm_mine")
    await node(url, "evm_setAutomine", [True])
    return int(await node(url, "eth_blockNumber"), 16)


def tips(*gwei_tips: float) -> list[dict[str, str]]:
    return [
        {"maxPriorityFeePerGas": hex(int(t * GWEI)), "maxFeePerGas": hex(200 * GWEI)}
        for t in gwei_tips
    ]


async def busy_history(url: str) -> int:
    """Blocks with different tips, and empty blocks between them; the head."""
    await send_block(url, tips(1, 2, 3, 5, 8))
    await node(url, "evm_mine")
    await send_block(url, tips(4, 4, 10))
    await send_block(url, tips(0.5, 6, 7, 7))
    await node(url, "evm_mine")
    return await send_block(url, tips(2, 2.5))


async def apply_event(url: str, number: int, live: bool = True) -> Apply:
    obj = await node(url, "eth_getBlockByNumber", [hex(number), False])
    return Apply(Block(header_from_rpc(obj), [], transaction_hashes(obj)), live)


async def independent_history(url: str, number: int | str, blocks: int = 20) -> dict[str, Any]:
    newest = hex(number) if isinstance(number, int) else number
    result: dict[str, Any] = await node(url, "eth_feeHistory", [hex(blocks), newest, PERCENTILES])
    return result


async def wait_for_update(oracle: GasOracle, seen: int) -> None:
    with trio.fail_after(10):
        while oracle.updates == seen and not oracle.failures:
            await trio.sleep(0.01)


class Harness:
    def __init__(self, url: str, oracle: GasOracle, send: trio.MemorySendChannel[ChainEvent]):
        self.url = url
        self.oracle = oracle
        self.send = send


async def start_oracle(
    nursery: trio.Nursery, url: str, clock: Callable[[], float] | None = None, **net: Any
) -> Harness:
    settings = network_settings(url, **net)
    client = await open_client(nursery, settings)
    oracle = GasOracle("ethereum", "devnet", settings, client, clock=clock or (lambda: 1e9))
    send, receive = trio.open_memory_channel[ChainEvent](64)
    await nursery.start(oracle.run, receive)
    return Harness(url, oracle, send)


async def test_oracle_matches_an_independent_fee_history_on_every_head(
    nursery: trio.Nursery, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory().url
    head = await busy_history(url)
    h = await start_oracle(nursery, url)
    # Start-up estimate: computed before any event, at the node's latest block.
    assert h.oracle.updates == 1 and h.oracle.latest is not None
    body = json.loads(h.oracle.body or b"")
    assert without_time(body) == reference_body(await independent_history(url, head))
    assert body["chain"] == "ethereum" and body["network"] == "devnet"
    assert body["updated_at"] == "2001-09-09T01:46:40Z"  # the injected clock
    # The rewards are not trivial: three distinct tiers, none at the floor.
    tiers = [body["estimates"][t]["max_priority_fee_gwei"] for t in ("slow", "standard", "fast")]
    assert len(set(tiers)) == 3 and "0.001" not in tiers, tiers
    # A new head: the oracle recomputes for exactly that block.
    new_head = await send_block(url, tips(9, 9, 12))
    await h.send.send(await apply_event(url, new_head))
    await wait_for_update(h.oracle, 1)
    assert h.oracle.latest is not None and h.oracle.latest.block_number == new_head
    expected = reference_body(await independent_history(url, new_head))
    assert without_time(json.loads(h.oracle.body or b"")) == expected
    assert not h.oracle.failures


async def test_queued_heads_are_computed_once_for_the_newest(
    nursery: trio.Nursery, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory().url
    await busy_history(url)
    h = await start_oracle(nursery, url)
    client = h.oracle.client
    numbers = [await send_block(url, tips(i + 1)) for i in range(5)]
    events = [await apply_event(url, n) for n in numbers]
    calls = client.calls
    for event in events:  # no checkpoint in between: all five are queued at once
        h.send.send_nowait(event)
    await wait_for_update(h.oracle, 1)
    await trio.testing.wait_all_tasks_blocked()
    assert client.calls == calls + 1  # one eth_feeHistory, for the newest head
    assert h.oracle.updates == 2
    assert h.oracle.latest is not None and h.oracle.latest.block_number == numbers[-1]


async def test_history_finality_and_reverts_do_not_trigger_a_refresh(
    nursery: trio.Nursery, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory().url
    head = await busy_history(url)
    h = await start_oracle(nursery, url)
    client = h.oracle.client
    calls = client.calls
    old = await apply_event(url, head, live=False)
    await h.send.send(old)
    await h.send.send(Finalized(old.block.header))
    await h.send.send(Revert(old.block))
    await trio.testing.wait_all_tasks_blocked()
    assert client.calls == calls and h.oracle.updates == 1
    # A live head queued before a revert is dropped with it; the branch's Apply counts.
    live = await apply_event(url, head)
    h.send.send_nowait(live)
    h.send.send_nowait(Revert(live.block))
    await trio.testing.wait_all_tasks_blocked()
    assert client.calls == calls
    h.send.send_nowait(live)
    await wait_for_update(h.oracle, 1)
    assert client.calls == calls + 1


async def test_upstream_failure_keeps_the_previous_estimate(
    nursery: trio.Nursery,
    anvil_factory: Callable[..., AnvilProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    anvil = anvil_factory()
    url = anvil.url
    head = await busy_history(url)
    h = await start_oracle(nursery, url)
    body = h.oracle.body
    event = await apply_event(url, head)
    anvil.kill()
    with caplog.at_level(logging.WARNING, logger="chaingate.gas"):
        await h.send.send(event)
        with trio.fail_after(10):
            while not h.oracle.failures:
                await trio.sleep(0.01)
    assert h.oracle.body == body and h.oracle.updates == 1
    assert sum(h.oracle.failures.values()) == 1
    assert any("previous one is still served" in r.getMessage() for r in caplog.records)


async def test_start_up_failure_still_reports_ready_and_logs_no_secret(
    nursery: trio.Nursery, anvil: AnvilProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # A provider key in the URL path: anvil answers 404 there, so the refresh fails.
    secret_url = f"{anvil.url}/v3/SECRETPROVIDERKEY"
    with caplog.at_level(logging.WARNING):
        h = await start_oracle(nursery, secret_url)
    assert h.oracle.latest is None and h.oracle.body is None
    assert sum(h.oracle.failures.values()) == 1
    logged = [(r.getMessage(), getattr(r, "fields", {})) for r in caplog.records]
    assert logged and "SECRETPROVIDERKEY" not in repr(logged)


async def test_start_up_is_bounded_when_the_node_hangs(nursery: trio.Nursery) -> None:
    # A listener that accepts and never answers: the first attempt gives up, ready anyway.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def hang(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, hang, listeners)
    settings = network_settings(f"http://127.0.0.1:{port}", block_time=0.1)
    client = await open_client(nursery, settings)
    oracle = GasOracle("ethereum", "devnet", settings, client)
    oracle.startup_timeout = 0.3
    _, receive = trio.open_memory_channel[ChainEvent](1)
    with trio.fail_after(5):
        await nursery.start(oracle.run, receive)
    assert oracle.latest is None and oracle.failures["timeout"] == 1


async def test_pre_london_chain_uses_gas_prices(
    nursery: trio.Nursery, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory(extra=["--hardfork", "berlin"]).url
    h = await start_oracle(nursery, url)
    # Idle chain, no base fee: every tier is the node's eth_gasPrice.
    gas_price = int(await node(url, "eth_gasPrice"), 16)
    body = json.loads(h.oracle.body or b"")
    assert body["base_fee_gwei"] == "0"
    for tier in body["estimates"].values():
        assert tier["max_fee_gwei"] == tier["max_priority_fee_gwei"] == gwei(gas_price)
    # Legacy transactions: the "rewards" are whole gas prices, used as they are.
    legacy = [{"gasPrice": hex(g * GWEI)} for g in (2, 3, 4, 6)]
    head = await send_block(url, legacy)
    await h.send.send(await apply_event(url, head))
    await wait_for_update(h.oracle, 1)
    body = json.loads(h.oracle.body or b"")
    assert without_time(body) == reference_body(await independent_history(url, head))
    assert [body["estimates"][t]["max_fee_gwei"] for t in ("slow", "standard", "fast")] == [
        "2",
        "3",
        "6",
    ]


class FeeHistoryRefused(ChainClient):
    """Real anvil, except that eth_feeHistory is answered with the JSON-RPC error ``code``
    (-32601: a node from before the method; -32000: geth's "header not found" on a lagging
    upstream)."""

    def __init__(self, pool: UpstreamPool, code: int) -> None:
        super().__init__(pool)
        self.code = code

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        if method == "eth_feeHistory":
            self.calls += 1
            raise RpcCallError(method, self.code, "refused by the test")
        return await super().call(method, params, retry_safe=retry_safe)


async def test_node_without_fee_history_falls_back_to_gas_price(
    nursery: trio.Nursery, anvil: AnvilProcess
) -> None:
    settings = network_settings(anvil.url)
    pool = (await open_client(nursery, settings)).pool
    oracle = GasOracle("ethereum", "devnet", settings, FeeHistoryRefused(pool, -32601))
    assert await oracle.refresh()
    gas_price = int(await node(anvil.url, "eth_gasPrice"), 16)
    assert oracle.latest is not None
    assert oracle.latest.block_number == int(await node(anvil.url, "eth_blockNumber"), 16)
    assert oracle.latest.base_fee_gwei == "0"
    assert oracle.latest.estimates.fast.max_fee_gwei == gwei(max(gas_price, FLOOR))
    # At a given head, that head is the block number (no eth_blockNumber needed).
    assert await oracle.refresh(5) and oracle.latest.block_number == 5


async def test_other_node_errors_and_malformed_answers_are_counted(
    nursery: trio.Nursery, anvil: AnvilProcess
) -> None:
    settings = network_settings(anvil.url)
    pool = (await open_client(nursery, settings)).pool
    refused = GasOracle("ethereum", "devnet", settings, FeeHistoryRefused(pool, -32000))
    assert not await refused.refresh()
    assert refused.failures == {"node_error": 1} and refused.latest is None
    # A block beyond the node's head: anvil answers an empty history, which is no estimate.
    beyond = GasOracle("ethereum", "devnet", settings, ChainClient(pool))
    assert not await beyond.refresh(10**9)
    assert beyond.failures == {"bad_response": 1} and beyond.latest is None


# --- {chain} resolution --------------------------------------------------------------------


def test_chain_names() -> None:
    names = ChainNames(
        ["ethereum/mainnet", "ethereum/sepolia", "base/sepolia", "polygon/amoy", "polygon/zkevm"]
    )
    assert names.resolve("ethereum") == "ethereum/mainnet"
    assert names.resolve("ethereum-mainnet") == "ethereum/mainnet"
    assert names.resolve("ethereum-sepolia") == "ethereum/sepolia"
    assert names.resolve("base") == "base/sepolia"  # its only network
    assert names.resolve("polygon") is None  # two networks, no mainnet: name one
    assert names.resolve("polygon-amoy") == "polygon/amoy"
    assert names.resolve("Ethereum") is None and names.resolve("solana") is None
    assert names.name_of("ethereum/mainnet") == "ethereum"
    assert names.name_of("ethereum/sepolia") == "ethereum-sepolia"
    assert "polygon-amoy, polygon-zkevm" in names.not_found("polygon", "gas prices")
    message = names.not_found("bitcoin", "gas prices")
    assert "'bitcoin'" in message and "ethereum, ethereum-mainnet, ethereum-sepolia" in message
    assert len(names.not_found("x" * 5000, "gas prices")) < 500


def test_chain_names_ambiguities() -> None:
    # A bare chain name wins over another chain's "chain-network" spelling, and an alias two
    # networks could claim belongs to neither.
    names = ChainNames(["a-b/mainnet", "a/b", "a/b-c", "a-b/c"])
    assert names.resolve("a-b") == "a-b/mainnet"
    assert names.resolve("a-b-c") is None
    assert names.resolve("a") is None  # two networks, no mainnet
    assert (
        ChainNames([]).not_found("ethereum", "gas prices").startswith("gas prices are not served")
    )


# --- the endpoint (REST app) ------------------------------------------------------------------


def app_with(oracles: dict[str, GasOracle]) -> Any:
    networks = {Network.parse(key): oracle.settings for key, oracle in oracles.items()}
    return create_app(build_api(ApiDeps(evm_networks=networks, gas_oracles=oracles)))


def idle_oracle(chain: str, network: str, testnet: bool, block_time: float = 12.0) -> GasOracle:
    net = msgspec.convert(
        {
            "upstreams": [{"url": "http://127.0.0.1:1"}],
            "testnet": testnet,
            "block_time": block_time,
        },
        NetworkSettings,
    )
    pool = UpstreamPool(
        f"{chain}/{network}", net, RpcSettings(), impl_module.select(), PROBE, parse_evm_head
    )
    return GasOracle(chain, network, net, ChainClient(pool))


def publish(oracle: GasOracle, block: int = 7) -> None:
    oracle.latest = prices.estimate(
        prices.Fees(block, GWEI, (FLOOR, GWEI, 2 * GWEI)),
        chain=oracle.chain,
        network=oracle.network,
        block_time=12.0,
        now=0,
    )
    oracle.body = msgspec.json.encode(oracle.latest)


async def get(app: Any, path: str, principal: Principal | None = None) -> Any:
    client = app.test_client()
    return await client.get(path, scope_base={"chaingate.principal": principal})


async def test_endpoint_answers_from_memory(
    nursery: trio.Nursery, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory().url
    head = await busy_history(url)
    h = await start_oracle(nursery, url)
    app = app_with({"ethereum/devnet": h.oracle})
    calls = h.oracle.client.calls
    for path in ["/v1/gas/ethereum/prices", "/v1/gas/ethereum-devnet/prices"] * 50:
        response = await get(app, path)
        assert response.status_code == 200
        assert response.mimetype == "application/json"
        assert await response.get_data() == h.oracle.body
    assert h.oracle.client.calls == calls  # a hundred requests, no upstream call
    body = json.loads(h.oracle.body or b"")
    assert without_time(body) == reference_body(await independent_history(url, head))


async def test_endpoint_resolution_and_errors() -> None:
    mainnet = idle_oracle("ethereum", "mainnet", testnet=False)
    sepolia = idle_oracle("ethereum", "sepolia", testnet=True)
    devnet = idle_oracle("base", "devnet", testnet=True, block_time=2.5)
    for oracle in (mainnet, sepolia):
        publish(oracle)
    app = app_with(
        {"ethereum/mainnet": mainnet, "ethereum/sepolia": sepolia, "base/devnet": devnet}
    )
    live, test = Principal(environment="live"), Principal(environment="test")

    ok = await get(app, "/v1/gas/ethereum/prices", live)
    assert ok.status_code == 200 and json.loads(await ok.get_data())["network"] == "mainnet"
    ok = await get(app, "/v1/gas/ethereum-sepolia/prices", test)
    assert ok.status_code == 200 and json.loads(await ok.get_data())["network"] == "sepolia"

    async def error(path: str, principal: Principal | None, status: int, code: str) -> str:
        response = await get(app, path, principal)
        body = json.loads(await response.get_data())
        assert response.status_code == status, body
        assert body["error"]["code"] == code and body["error"]["status"] == status
        assert "Traceback" not in body["error"]["message"]
        return str(body["error"]["message"])

    message = await error("/v1/gas/bitcoin/prices", live, 404, "not_found")
    assert "base, base-devnet, ethereum, ethereum-mainnet, ethereum-sepolia" in message
    await error("/v1/gas/ethereum-goerli/prices", live, 404, "not_found")
    # A test key on mainnet, by either spelling: 403, and the message names the testnets.
    for path in ("/v1/gas/ethereum/prices", "/v1/gas/ethereum-mainnet/prices"):
        message = await error(path, test, 403, "forbidden")
        assert "ethereum-sepolia" in message
    # No estimate yet: 503 with Retry-After of about one block.
    response = await get(app, "/v1/gas/base/prices", test)
    assert response.status_code == 503 and response.headers["Retry-After"] == "3"
    body = json.loads(await response.get_data())
    assert body["error"] == {
        "code": "unavailable",
        "message": "no gas estimate for base/devnet yet: retry after the next block",
        "status": 503,
    }
    # Other methods and shapes are the app's usual envelope, never a 500.
    response = await app.test_client().post("/v1/gas/ethereum/prices")
    assert response.status_code == 405
    response = await get(app, "/v1/gas/ethereum/prices/extra", live)
    assert response.status_code == 404


async def test_without_oracles_every_chain_is_404() -> None:
    response = await get(create_app(build_api()), "/v1/gas/ethereum/prices")
    assert response.status_code == 404
    assert json.loads(await response.get_data())["error"]["code"] == "not_found"


# --- through the gateway, with API keys -------------------------------------------------------


@pytest.fixture
async def keyed(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> AuthStack:
    settings = auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    return await start_auth(nursery, impl, settings)


async def test_gateway_refusals_use_the_envelope_with_rate_headers(keyed: AuthStack) -> None:
    # auth_settings: ethereum/devnet (testnet) and ethereum/mainnet, both followed.
    assert set(keyed.handle.gateway.gas.oracles) == {"ethereum/devnet", "ethereum/mainnet"}
    no_data, _ = await keyed.key(env="live", scopes="rpc:read")
    live, _ = await keyed.key(env="live", scopes="data:read")
    test, _ = await keyed.key(env="test", scopes="data:read")
    cases = [
        (None, "/v1/gas/ethereum/prices", 401, "unauthorized"),
        (no_data, "/v1/gas/ethereum/prices", 403, "forbidden"),
        (test, "/v1/gas/ethereum/prices", 403, "forbidden"),  # "ethereum" is its mainnet
        (test, "/v1/gas/ethereum-mainnet/prices", 403, "forbidden"),
        (live, "/v1/gas/bitcoin/prices", 404, "not_found"),
        (test, "/v1/gas/bitcoin/prices", 404, "not_found"),
    ]
    for key, path, status, code in cases:
        async with keyed.client(key) as client:
            response = await client.get(path)
        assert response.status_code == status, (key, path, response.text)
        error = response.json()["error"]
        assert error["code"] == code and error["status"] == status
        assert_rate_headers(response)
        assert "retry-after" not in response.headers
    answered = [
        (test, "/v1/gas/ethereum-devnet/prices", "devnet"),
        (live, "/v1/gas/ethereum-devnet/prices", "devnet"),
        (live, "/v1/gas/ethereum/prices", "mainnet"),
    ]
    for key, path, network in answered:
        async with keyed.client(key, bearer=True) as client:
            response = await client.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"] == "application/json"
        assert response.json()["network"] == network
        assert_rate_headers(response)


async def test_end_to_end_a_mined_block_reaches_the_endpoint(
    start_gateway: StartGateway, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    url = anvil_factory().url
    await busy_history(url)
    gw = await start_gateway([url], network={"follower": {"enabled": True, "poll_interval": 0.02}})
    oracle = gw.gateway.gas.oracles["ethereum/devnet"]
    async with gw.client() as client:
        # Served from start-up on, before any new head.
        first = await client.get("/v1/gas/ethereum/prices")
        assert first.status_code == 200 and first.content == oracle.body
        head = await send_block(url, tips(11, 12, 13, 30))
        with trio.fail_after(10):
            while True:
                response = await client.get("/v1/gas/ethereum/prices")
                assert response.status_code == 200
                if response.json()["block_number"] == head:
                    break
                await trio.sleep(0.02)
        body = response.json()
        assert body["chain"] == "ethereum" and body["network"] == "devnet"
        assert without_time(body) == reference_body(await independent_history(url, head))
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", body["updated_at"])
        # Many requests, one computation per head: the body is the oracle's own bytes.
        updates = oracle.updates
        for _ in range(30):
            again = await client.get("/v1/gas/ethereum-devnet/prices")
            assert again.content == oracle.body
        assert oracle.updates == updates and not oracle.failures
