"""Latency per account (issue 23): ``add_usage`` adds request-latency histograms per
(account, network, method, minute) to minute, hour and day rows in the usage rows'
transaction; ``usage_latency`` reads one account's; the prune keeps what the pages read;
migration 0018 upgrades a store at 0017; the overview shows the signed-in account's p50/p99
by network and by method, and the operator's page the whole deployment's — both stores.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows, LatencyDelta, UsageDelta
from chaingate.dashboard.latency import percentile
from chaingate.dashboard.store import DashboardRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.store import Store, open_store
from chaingate.store.migrate import apply_pending, load_migrations
from chaingate.twins import Impl, select
from tests.test_auth import PEPPER, AuthStack, auth_settings, start_auth
from tests.test_dashboard import account_with_password, browser, csrf, sign_in

M0 = 28_333_440  # a minute that starts a UTC day (2023-11-13T00:00Z)
EMPTY = (0,) * 16


def buckets(**counts: int) -> tuple[int, ...]:
    """16 bucket counts from ``b3=5``-style arguments."""
    values = [0] * 16
    for name, count in counts.items():
        values[int(name[1:])] = count
    return tuple(values)


def plus(*rows: Sequence[int]) -> list[int]:
    return [sum(column) for column in zip(*rows, strict=True)]


@asynccontextmanager
async def migrated(store_url: str, tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(store_url, tmp_path)
    async with store:
        await store.migrate()
        yield store


async def all_latency(store: Store) -> list[tuple[Any, ...]]:
    return await store.run_transaction(
        lambda tx: tx.query(
            "SELECT account_id, granularity, period, network, method, b0, b3, b15"
            " FROM usage_latency ORDER BY 1, 2, 3, 4, 5"
        ),
        write=False,
    )


async def test_latency_lands_in_minutes_hours_and_days_and_adds_up(
    store_url: str, tmp_path: Path
) -> None:
    async with migrated(store_url, tmp_path) as store:
        a = LatencyDelta("acct_a", "ethereum/mainnet", "eth_call", M0 + 61, buckets(b3=2, b15=1))
        b = LatencyDelta("acct_a", "ethereum/mainnet", "eth_call", M0 + 62, buckets(b3=5))
        c = LatencyDelta("acct_a", "", "GET /v1/health", M0 + 61, buckets(b0=7))
        # One call with a repeated key (merged), then a second "process" adding the same keys.
        await AuthRows(store).add_usage([], [a, b, a])
        await AuthRows(store).add_usage(
            [UsageDelta("key_a", "acct_a", "eth_call", M0 + 61, 1, 26)], [a, c]
        )
        minutes = await AuthRows(store).usage_latency("acct_a", "minute", M0, M0 + 1440)
        assert [(r.period, r.network, r.method, r.counts) for r in minutes] == [
            (M0 + 61, "", "GET /v1/health", list(c.counts)),
            (M0 + 61, "ethereum/mainnet", "eth_call", plus(a.counts, a.counts, a.counts)),
            (M0 + 62, "ethereum/mainnet", "eth_call", list(b.counts)),
        ]
        everything = plus(a.counts, a.counts, a.counts, b.counts)
        for granularity, period in (("hour", M0 + 60), ("day", M0)):
            rows = await AuthRows(store).usage_latency("acct_a", granularity, M0, M0 + 1440)
            assert [(r.period, r.network, r.method, r.counts) for r in rows] == [
                (period, "", "GET /v1/health", list(c.counts)),
                (period, "ethereum/mainnet", "eth_call", everything),
            ], granularity
        # The usage delta of the same call was written with it.
        assert [u.requests for u in await AuthRows(store).usage("acct_a", M0, M0 + 1440)] == [1]


async def test_counts_of_another_length_are_refused_and_nothing_is_written(
    store_url: str, tmp_path: Path
) -> None:
    async with migrated(store_url, tmp_path) as store:
        good = LatencyDelta("acct_a", "ethereum/mainnet", "eth_call", M0, buckets(b1=1))
        bad = LatencyDelta("acct_a", "ethereum/mainnet", "eth_call", M0, (1,) * 15)
        usage = UsageDelta("key_a", "acct_a", "eth_call", M0, 1, 26)
        for latency in ([good, bad], [LatencyDelta("acct_a", "", "m", M0, (1,) * 17)]):
            with pytest.raises(ValueError, match="16 buckets"):
                await AuthRows(store).add_usage([usage], latency)
        assert await all_latency(store) == []
        assert (
            await AuthRows(store).usage("acct_a", 0, M0 + 1440) == []
        )  # not even the usage deltas
        await AuthRows(store).add_usage([], [])  # nothing to write: no transaction, no error


async def test_usage_latency_reads_one_account_in_its_range(store_url: str, tmp_path: Path) -> None:
    async with migrated(store_url, tmp_path) as store:
        counts = buckets(b4=1)
        await AuthRows(store).add_usage(
            [],
            [
                LatencyDelta("acct_a", "n", "m", M0 - 1, counts),  # before the range
                LatencyDelta("acct_a", "n", "m", M0, counts),
                LatencyDelta("acct_a", "n", "m", M0 + 59, counts),
                LatencyDelta("acct_a", "n", "m", M0 + 60, counts),  # its end: excluded
                LatencyDelta("acct_b", "n", "m", M0 + 1, counts),  # another account
            ],
        )
        rows = await AuthRows(store).usage_latency("acct_a", "minute", M0, M0 + 60)
        assert [r.period for r in rows] == [M0, M0 + 59]
        hours = await AuthRows(store).usage_latency("acct_a", "hour", M0, M0 + 60)
        assert [(r.period, r.counts[4]) for r in hours] == [(M0, 2)]
        assert await AuthRows(store).usage_latency("acct_c", "day", 0, M0 + 1440) == []


async def test_the_prune_deletes_old_minutes_and_hours_only(store_url: str, tmp_path: Path) -> None:
    async with migrated(store_url, tmp_path) as store:
        now = M0 + 100 * 1440
        counts = buckets(b2=1)
        await AuthRows(store).add_usage(
            [],
            [
                LatencyDelta("acct_a", "n", "m", now - 10, counts),  # kept everywhere
                LatencyDelta("acct_a", "n", "m", now - 3 * 1440, counts),  # its minute goes
                LatencyDelta("acct_b", "n", "m", now - 40 * 1440, counts),  # minute and hour go
            ],
        )
        assert await AuthRows(store).prune_usage_latency(now) == 3
        left = [(g, p) for _, g, p, *_ in await all_latency(store)]
        assert sorted(left) == sorted(
            [
                (1, now - 10),
                (60, (now - 10) // 60 * 60),
                (1440, (now - 10) // 1440 * 1440),
                (60, (now - 3 * 1440) // 60 * 60),
                (1440, (now - 3 * 1440) // 1440 * 1440),
                (1440, (now - 40 * 1440) // 1440 * 1440),
            ]
        )
        assert await AuthRows(store).prune_usage_latency(now) == 0


async def test_the_migration_upgrades_a_store_at_0017(store_url: str, tmp_path: Path) -> None:
    store = open_store(store_url, tmp_path)
    async with store:
        migrations = load_migrations()
        assert [m.name for m in migrations if m.version == 18] == ["usage_latency"]
        await apply_pending(store, [m for m in migrations if m.version <= 17])
        await AuthRows(store).add_usage(
            [UsageDelta("key_a", "acct_a", "eth_call", M0 + 5, 2, 52, 1, "n")]
        )
        assert 18 in await store.migrate()
        usage = await AuthRows(store).usage("acct_a", M0, M0 + 1440, "day")
        assert [(u.method, u.requests, u.errors) for u in usage] == [("eth_call", 2, 1)]
        await AuthRows(store).add_usage(
            [], [LatencyDelta("acct_a", "n", "eth_call", M0 + 5, buckets(b1=3))]
        )
        assert [
            r.counts[1] for r in await AuthRows(store).usage_latency("acct_a", "day", M0, M0 + 1)
        ] == [3]


# --- the pages -----------------------------------------------------------------------------


@pytest.fixture
def impl() -> Impl:
    return select()  # the dashboard is framing-agnostic: one implementation is enough


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> AuthStack:
    settings = auth_settings(anvil, store_url, tmp_path, dashboard={"secure_cookie": False})
    return await start_auth(nursery, impl, settings)


def cell(counts: Sequence[int], q: float) -> str:
    """The table's p50/p99 cell, computed here from the buckets."""
    value = percentile(counts, q)
    assert value is not None
    return f"{round(value * 1000, 2):.2f}"


def drawn(chart: str) -> list[str]:
    """The series a chart draws (a point or a line each) named by its legend."""
    legend = re.findall(
        r'<li><span class="swatch s(\d)" aria-hidden="true"></span>([^<]*)</li>', chart
    )
    marks = set(re.findall(r'<(?:circle|polyline) class="(?:line )?s(\d)"', chart))
    return [name for index, name in legend if index in marks]


def table(html: str, table_id: str) -> str:
    return html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]


async def seed(stack: AuthStack, email: str, weights: dict[str, tuple[int, ...]]) -> str:
    """An account with usage and latency over the last two minutes, on two networks."""
    account_id = await account_with_password(stack, email)
    _, key = await admin.create_key(AuthRows(stack.store), PEPPER.encode(), account_id, "k", "live")
    now = int(time.time() // 60)
    usage, latency = [], []
    for minute in (now - 2, now - 1):
        for network, method, requests in (
            ("ethereum/mainnet", "eth_call", 5),
            ("polygon/mainnet", "eth_getBalance", 3),
        ):
            usage.append(
                UsageDelta(key.id, account_id, method, minute, requests, 26 * requests, 1, network)
            )
            latency.append(LatencyDelta(account_id, network, method, minute, weights[method]))
        # A batch: its calls are usage of their own methods, its answer one "batch" latency.
        latency.append(
            LatencyDelta(account_id, "ethereum/mainnet", "batch", minute, weights["batch"])
        )
    await AuthRows(stack.store).add_usage(usage, latency)
    return account_id


async def test_the_overview_shows_the_accounts_own_latency_by_network_and_method(
    stack: AuthStack,
) -> None:
    mine = {
        "eth_call": buckets(b2=10, b5=1),
        "eth_getBalance": buckets(b0=4, b8=2),
        "batch": buckets(b10=3),
    }
    theirs = {name: buckets(b14=100) for name in mine}
    await seed(stack, "latency-other@example.com", theirs)
    await seed(stack, "latency-mine@example.com", mine)
    twice = {name: plus(counts, counts) for name, counts in mine.items()}  # two minutes
    expected_networks = {
        "ethereum/mainnet": ("10", "260", "2", plus(twice["eth_call"], twice["batch"])),
        "polygon/mainnet": ("6", "156", "2", twice["eth_getBalance"]),
    }
    expected_methods = {
        "eth_call": ("10", "260", "2", twice["eth_call"]),
        "eth_getBalance": ("6", "156", "2", twice["eth_getBalance"]),
        "batch": ("—", "—", "—", twice["batch"]),  # latency only: no usage of its own
    }
    client = browser(stack)
    async with aclosing(client):
        assert (await sign_in(client, "latency-mine@example.com")).status_code == 303
        for range_name in ("hour", "day", "month"):
            page = await client.get(f"/dashboard/?range={range_name}")
            assert page.status_code == 200
            for table_id, expected in (
                ("by-network", expected_networks),
                ("by-method", expected_methods),
            ):
                found = table(page.text, table_id)
                for name, (requests, units, errors, counts) in expected.items():
                    row = (
                        f"<tr><td><code>{name}</code></td><td>{requests}</td><td>{units}</td>"
                        f"<td>{errors}</td><td>{cell(counts, 0.5)}</td>"
                        f"<td>{cell(counts, 0.99)}</td></tr>"
                    )
                    assert row in found, (range_name, row, found)
                # Another account's latency (all in bucket 14) is nowhere.
                assert cell(buckets(b14=1), 0.5) not in found
            # The chart: this account's p50 and p99 over time.
            chart = page.text.split('aria-label="Latency, ms"', 1)[1].split("</ul>", 1)[0]
            assert drawn(chart) == ["p50", "p99"], chart
            assert "whole deployment" not in page.text
            assert "arrival at the edge" in page.text  # the note says what is measured


async def test_the_operator_page_charts_the_whole_deployment(stack: AuthStack) -> None:
    rows = DashboardRows(stack.store)
    now = int(time.time() // 60)
    await rows.add_latency(
        [(minute, "rpc", buckets(b3=4)) for minute in (now - 2, now - 1)]
        + [(now - 1, "dashboard", buckets(b15=9))]  # the dashboard's own pages: not the API's
    )
    async with browser(stack) as client:
        form = await client.get("/dashboard/signin")
        answer = await client.post(
            "/dashboard/signin/admin",
            data={"csrf": csrf(form.text), "admin_token": "test-admin-token"},
        )
        assert answer.status_code == 303
        page = await client.get("/dashboard/operator?range=hour")
        assert page.status_code == 200
        chart = page.text.split('aria-label="Latency (whole deployment), ms"', 1)[1]
        chart = chart.split("</ul>", 1)[0]
        assert drawn(chart) == ["p50", "p99"], chart
        # The axis' top is the p99 of bucket 3 alone (the dashboard's b15 left out): 5 ms.
        assert ">5 ms</text>" in chart, chart
        assert (await client.get("/dashboard/operator?range=month")).status_code == 200
