"""Usage by network (issue 23, the overview's "by network"): the meter counts per key,
network, method and minute on every path that meters — fast lane, handler, bundler, REST —
on both twins and both stores; the dashboard shows it; ``GET /v1/usage`` keeps its shape
(the spec has no network breakdown) and sums the networks; usage metered before migration
0017 keeps network ''.
"""

from __future__ import annotations

import csv
import io
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio

from chaingate.auth.store import AuthRows, UsageDelta
from chaingate.store import open_store
from chaingate.store.migrate import apply_pending, load_migrations
from chaingate.twins import Impl
from tests.test_auth import auth_settings, start_auth
from tests.test_dashboard import account_with_password, browser, sign_in

DEVNET = "/v1/rpc/ethereum/devnet"
MAINNET = "/v1/rpc/ethereum/mainnet"
BUNDLER = "/v1/bundler/ethereum/devnet"


def call(method: str, id: int = 1, params: list[Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or []}


async def on_every_rpc_path(client: httpx.AsyncClient) -> None:
    """JSON-RPC requests down every path that meters them: three single calls on devnet (the
    fast lane on the compiled edge), a batch of two on mainnet, a write on mainnet (the
    handler: the slow lane; the node refuses it, an error), the bundler's endpoint (answered
    in process)."""
    for _ in range(3):
        assert (await client.post(DEVNET, json=call("eth_blockNumber"))).status_code == 200
    batch = [call("eth_blockNumber", 1), call("eth_chainId", 2)]
    assert (await client.post(MAINNET, json=batch)).status_code == 200
    raw = call("eth_sendRawTransaction", 3, ["0x00"])
    assert (await client.post(MAINNET, json=raw)).status_code == 200
    supported = call("eth_supportedEntryPoints", 4)
    assert (await client.post(BUNDLER, json=supported)).status_code == 200


async def test_every_path_meters_its_network_and_the_dashboard_shows_it(
    nursery: trio.Nursery, impl: Impl, anvil: Any, store_url: str, tmp_path: Path
) -> None:
    settings = auth_settings(anvil, store_url, tmp_path, dashboard={"secure_cookie": False})
    stack = await start_auth(nursery, impl, settings)
    email = f"networks-{time.monotonic_ns()}@example.com"
    account_id = await account_with_password(stack, email)
    key, key_id = await stack.key(env="live", email=email)
    async with stack.client(key) as client:
        await on_every_rpc_path(client)
        # REST calls belong to no one network.
        assert (await client.get("/v1/health")).status_code == 200
        first_report = await client.get("/v1/usage", params={"granularity": "minute"})
        assert first_report.status_code == 200
        now_minute = int(time.time() // 60)
        rows = AuthRows(stack.store)
        expected = {
            ("ethereum/devnet", "eth_blockNumber"): (3, 3, 0),
            ("ethereum/mainnet", "eth_blockNumber"): (1, 1, 0),
            ("ethereum/mainnet", "eth_chainId"): (1, 0, 0),
            ("ethereum/mainnet", "eth_sendRawTransaction"): (1, 20, 1),
            ("ethereum/devnet", "eth_supportedEntryPoints"): (1, 1, 0),
        }
        with trio.fail_after(10):  # the usage writer flushes every 0.2 s here
            while True:
                found = {
                    (r.network, r.method): (r.requests, r.compute_units, r.errors)
                    for r in await rows.usage_totals(account_id, "minute", 0, now_minute + 2)
                }
                if (
                    all(found.get(slot, (0,))[0] >= n[0] for slot, n in expected.items())
                    and ("", "GET /v1/usage") in found
                ):  # the REST call: recorded as it ends
                    break
                await trio.sleep(0.05)
        for slot, (requests, _units, errors) in expected.items():
            assert found[slot][0] == requests and found[slot][2] == errors, (slot, found)
        assert all(
            key_id == r.key_id for r in await rows.usage_totals(account_id, "hour", 0, 10**9)
        )
        assert {network for network, _ in found} <= {"", "ethereum/devnet", "ethereum/mainnet"}
        # The REST usage API keeps the spec's (and its own) shape: per period and method, the
        # networks summed, no field added.
        report = (await client.get("/v1/usage", params={"granularity": "day"})).json()
        assert set(report) == {"account_id", "granularity", "from", "to", "usage", "totals"}
        assert all(
            set(row) == {"period", "method", "requests", "compute_units", "errors"}
            for row in report["usage"]
        )
        methods = {row["method"]: row["requests"] for row in report["usage"]}
        assert methods["eth_blockNumber"] == 4  # 3 on devnet + 1 on mainnet, one row
    dashboard = browser(stack)
    async with aclosing(dashboard):
        assert (await sign_in(dashboard, email)).status_code == 303
        overview = await dashboard.get("/dashboard/?range=hour")
        assert overview.status_code == 200
        table = overview.text.split('id="by-network"', 1)[1].split("</table>", 1)[0]
        assert "<td><code>ethereum/devnet</code></td><td>4</td>" in table, table
        # mainnet: eth_blockNumber, eth_chainId, eth_sendRawTransaction (one error)
        assert "<td><code>ethereum/mainnet</code></td><td>3</td>" in table, table
        assert "<td><code>(no network)</code></td>" in table  # the REST calls
        assert "Requests by network" in overview.text
        usage = await dashboard.get("/dashboard/usage?range=hour")
        assert "<code>ethereum/mainnet</code></td><td><code>eth_sendRawTransaction" in usage.text
        exported = await dashboard.get("/dashboard/usage.csv?range=day")
        header, *rows = list(csv.reader(io.StringIO(exported.text)))
        assert header == [
            "period_start",
            "key_id",
            "key",
            "network",
            "method",
            "requests",
            "compute_units",
            "errors",
        ]
        assert any(row[3:6] == ["ethereum/devnet", "eth_blockNumber", "3"] for row in rows), rows


async def test_usage_metered_before_networks_keeps_network_empty(
    store_url: str, tmp_path: Path
) -> None:
    store = open_store(store_url, tmp_path)
    async with store:
        migrations = load_migrations()
        before = [m for m in migrations if m.version < 17]
        assert [m.version for m in migrations if m.version >= 17][:1] == [17]
        await apply_pending(store, before)
        account = await AuthRows(store).create_account("before@example.com", "free")
        minute = 1440 * 20 + 61

        def old_rows(tx: Any) -> None:
            tx.execute(
                "INSERT INTO usage_minutes (key_id, account_id, method, minute, requests,"
                " compute_units, errors) VALUES (?, ?, ?, ?, ?, ?, ?)",
                ("key_a", account.id, "eth_call", minute, 2, 52, 1),
            )
            for table, period in (("usage_hours", 1440 * 20 + 60), ("usage_days", 1440 * 20)):
                tx.execute(
                    f"INSERT INTO {table} (account_id, key_id, method, period, requests,"
                    " compute_units, errors) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (account.id, "key_a", "eth_call", period, 2, 52, 1),
                )

        await store.run_transaction(old_rows)
        await store.migrate()
        rows = AuthRows(store)
        for granularity in ("minute", "hour", "day"):
            found = await rows.usage_totals(account.id, granularity, 0, 1440 * 21)
            assert [(r.network, r.method, r.requests, r.errors) for r in found] == [
                ("", "eth_call", 2, 1)
            ], granularity
        # The same key, method and minute on a network now: a row of its own, everywhere.
        await AuthRows(store).add_usage(
            [UsageDelta("key_a", account.id, "eth_call", minute, 3, 78, 0, "ethereum/devnet")]
        )
        for granularity in ("minute", "hour", "day"):
            found = await rows.usage_totals(account.id, granularity, 0, 1440 * 21)
            assert [(r.network, r.requests) for r in found] == [
                ("", 2),
                ("ethereum/devnet", 3),
            ], granularity
        # The account's usage as the REST API reads it: the networks summed per method.
        summed = await AuthRows(store).usage(account.id, 0, 1440 * 21, "day")
        assert [(r.method, r.requests, r.compute_units) for r in summed] == [("eth_call", 5, 130)]
        # A second add to the same (key, network, method, minute) adds up, it does not clash.
        await AuthRows(store).add_usage(
            [UsageDelta("key_a", account.id, "eth_call", minute, 1, 26, 0, "ethereum/devnet")]
        )
        found = await rows.usage_totals(account.id, "minute", 0, 1440 * 21)
        assert [(r.network, r.requests) for r in found] == [("", 2), ("ethereum/devnet", 4)]
