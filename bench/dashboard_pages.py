"""Dashboard pages, server-side latency, on a store holding 1,000,000 usage rows (with their
per-account latency) and 10,000 webhook delivery attempts.

    python bench/dashboard_pages.py [--store-url URL] [--usage-rows 1000000]
                                    [--attempts 10000] [--requests 200] [--smoke]

Seeds a store (SQLite under a temporary directory unless ``--store-url`` names PostgreSQL):
one account with 5 keys, 5 methods each, one usage row per key, method and minute over the
last ``usage-rows / 25`` minutes (1,000,000 rows: ~28 days), written through the store's own
``add_usage`` (so the hour and day rollups are too) with one latency histogram per network,
method and minute (what the meter hands over: 200,000 for 1,000,000 usage rows, and their hour
and day rows); the deployment's latency (``latency_rollups``) per route and minute over the
same minutes; one webhook with ``attempts / 2`` events of two delivery attempts each.  The
account is an operator, so the operator's page (the deployment's latency) is asked too.
Then a gateway in this process (API keys and the dashboard on, no chain) signs a client in with
a one-time link and asks every page ``--requests`` times, one at a time. Server-side time is
what the edge's access log says each answer took (from the complete request to the response);
the client's time, and this process's CPU time per request (server and client together: a
figure that waiting for a busy machine does not inflate), are printed beside it. The target is
p99 <= 50 ms per page. Prints a table; exit 0 (the target is reported, not enforced).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from chaingate import config
from chaingate.auth import admin
from chaingate.auth.store import AuthRows, LatencyDelta, UsageDelta
from chaingate.dashboard.store import DashboardRows
from chaingate.gateway import Gateway
from chaingate.store import new_id, open_store
from chaingate.webhooks.store import WebhookRow, WebhookRows

PEPPER = "bench-pepper-" + "0" * 32
METHODS = ("eth_call", "eth_getBalance", "eth_blockNumber", "eth_getLogs", "GET /v1/usage")
KEYS = 5
# JSON-RPC methods are metered per network (REST calls under ''): spread over two.
NETWORKS = ("ethereum/mainnet", "polygon/mainnet")
BATCH = 50_000
ROUTES = ("rpc", "rest")  # the deployment's latency, sampled per route


def histogram(n: int, requests: int) -> tuple[int, ...]:
    """16 bucket counts of ``requests`` spread over a few buckets (method ``n``'s own)."""
    counts = [0] * 16
    counts[2 + n] = requests - requests // 4
    counts[4 + n] = requests // 4
    return tuple(counts)


async def seed(store: Any, usage_rows: int, attempts: int) -> tuple[str, str]:
    """The account id and the webhook id."""
    account = await admin.ensure_account(AuthRows(store), "bench@example.com", "enterprise")
    key_ids = []
    for i in range(KEYS):
        _, row = await admin.create_key(
            AuthRows(store), PEPPER.encode(), account.id, f"k{i}", "live"
        )
        key_ids.append(row.id)
    minutes = usage_rows // (KEYS * len(METHODS))
    end = int(time.time() // 60)
    deltas: list[UsageDelta] = []
    latency: list[LatencyDelta] = []
    started = time.monotonic()
    for minute in range(end - minutes, end):
        for n, method in enumerate(METHODS):
            network = "" if method.startswith("GET ") else NETWORKS[n % len(NETWORKS)]
            for key_id in key_ids:
                deltas.append(
                    UsageDelta(
                        key_id, account.id, method, minute, 3 + n, 20 + n, minute % 2, network
                    )
                )
            # One histogram per network, method and minute: the keys' requests together.
            latency.append(
                LatencyDelta(account.id, network, method, minute, histogram(n, KEYS * (3 + n)))
            )
        if len(deltas) >= BATCH:
            await AuthRows(store).add_usage(deltas, latency)
            deltas, latency = [], []
    if deltas:
        await AuthRows(store).add_usage(deltas, latency)
    rows = DashboardRows(store)
    await rows.add_latency(
        [
            (minute, route, histogram(n, 100))
            for minute in range(end - minutes, end)
            for n, route in enumerate(ROUTES)
        ]
    )
    await rows.set_credentials(account.id, operator=True)
    print(
        f"seeded {minutes * KEYS * len(METHODS):,} usage rows and"
        f" {minutes * len(METHODS):,} latency histograms in"
        f" {time.monotonic() - started:.1f} s",
        flush=True,
    )
    now = store.clock()
    hook = WebhookRow(
        id=new_id("wh_"),
        account_id=account.id,
        url="https://receiver.example/hooks",
        chain="ethereum",
        network="mainnet",
        chain_label="ethereum",
        event_type="address_activity",
        config='{"addresses":[]}',
        confirmations=0,
        status="active",
        status_reason=None,
        secret="whsec_bench",
        previous_secret=None,
        previous_secret_until=None,
        sequence=0,
        matched_from=None,
        created_at=now,
        updated_at=now,
    )
    await WebhookRows(store).create_webhook(hook, limit=0)
    events = attempts // 2
    body = json.dumps({"id": "evt", "event_type": "address_activity", "data": {"value": "1"}})
    headers = json.dumps([["content-type", "application/json"], ["webhook-id", "evt"]])

    def insert(tx: Any) -> None:
        tx.executemany(
            "INSERT INTO webhook_events (id, webhook_id, account_id, chain, network, sequence,"
            " event_type, block_number, block_hash, deliver_at_block, original_id, body, state,"
            " attempts, retries, next_attempt_at, lease_until, created_at, finished_at,"
            " last_status, last_error) VALUES (?, ?, ?, 'ethereum', 'mainnet', ?,"
            " 'address_activity', ?, NULL, NULL, NULL, ?, 'delivered', 2, 0, 0, 0, ?, ?, 200,"
            " NULL)",
            [
                (f"evt_{i:08d}", hook.id, account.id, i, i, body, now - i, now - i)
                for i in range(events)
            ],
        )
        tx.executemany(
            "INSERT INTO webhook_attempts (event_id, attempt, webhook_id, started_at, url,"
            " request_headers, status, response_body, latency_ms, error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
            [
                (
                    f"evt_{i:08d}",
                    n,
                    hook.id,
                    now - i * 10 + n,
                    hook.url,
                    headers,
                    500 if n == 1 else 200,
                    "ok",
                    12,
                )
                for i in range(events)
                for n in (1, 2)
            ],
        )

    await store.run_transaction(insert)
    print(f"seeded {events * 2:,} delivery attempts", flush=True)
    return account.id, hook.id


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> int:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store_url or f"sqlite://{tmp}/bench.db"
        settings = config.from_mapping(
            {
                "server": {"port": 0},
                "auth": {"enabled": True, "pepper": PEPPER},
                "store": {"url": url},
                "observability": {"access_log": True, "admin_token": "bench"},
                "dashboard": {"secure_cookie": False},
                "data_dir": tmp,
            },
            environ={},
        )
        store = open_store(url, Path(tmp))
        async with store:
            await store.migrate()
            account_id, hook_id = await seed(store, args.usage_rows, args.attempts)
            token = await DashboardRows(store).create_signin_link(account_id, 600_000)
        logs = io.BytesIO()
        gateway = Gateway(settings, access_stream=logs)
        async with trio.open_nursery() as nursery:
            await nursery.start(gateway.run)
            base = f"http://127.0.0.1:{gateway.port}"
            pages = {
                "overview (hour)": "/dashboard/?range=hour",
                "overview (day)": "/dashboard/?range=day",
                "overview (30 days)": "/dashboard/?range=month",
                "usage (30 days)": "/dashboard/usage?range=month",
                "usage CSV (30 days)": "/dashboard/usage.csv?range=month",
                "keys": "/dashboard/keys",
                "webhooks": "/dashboard/webhooks",
                "webhook + delivery log": f"/dashboard/webhooks/{hook_id}",
                "delivery log, one event": f"/dashboard/webhooks/{hook_id}?event_id=evt_00001234",
                "delivery log, page 40": f"/dashboard/webhooks/{hook_id}?page=40",
                "policies": "/dashboard/policies",
                "reference": "/dashboard/reference",
                "operator (hour)": "/dashboard/operator?range=hour",
                "operator (30 days)": "/dashboard/operator?range=month",
            }
            client_ms: dict[str, list[float]] = {name: [] for name in pages}
            cpu_ms: dict[str, list[float]] = {name: [] for name in pages}
            # The access log has paths without their queries: its dashboard lines are matched
            # to the requests by order (one request at a time).
            order: list[str] = ["sign-in page", "sign-in"]
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                # The link's page (it uses nothing), then its button: a POST with CSRF.
                opened = await client.get(f"/dashboard/signin/link/{token}")
                csrf = re.search(r'name="csrf" value="([^"]+)"', opened.text)
                assert opened.status_code == 200, opened.text
                assert csrf, opened.text
                signed = await client.post(
                    f"/dashboard/signin/link/{token}", data={"csrf": csrf[1]}
                )
                assert signed.status_code == 303, signed.text
                for name, path in pages.items():
                    order.append("warm-up")
                    first = await client.get(path)  # warm (templates compiled, caches)
                    assert first.status_code == 200, (name, first.status_code, first.text[:500])
                for _ in range(args.requests):
                    for name, path in pages.items():
                        order.append(name)
                        started = time.perf_counter()
                        cpu = time.process_time()
                        answer = await client.get(path)
                        cpu_ms[name].append((time.process_time() - cpu) * 1000)
                        client_ms[name].append((time.perf_counter() - started) * 1000)
                        assert answer.status_code == 200
            gateway.front.access_log.sync()
            server: dict[str, list[float]] = {}
            lines = [json.loads(line) for line in logs.getvalue().splitlines()]
            dashboard = [e for e in lines if str(e.get("path", "")).startswith("/dashboard")]
            assert len(dashboard) == len(order), (len(dashboard), len(order))
            for name, entry in zip(order, dashboard, strict=True):
                server.setdefault(name, []).append(entry["duration_us"] / 1000)
            gateway.shutdown()
    print(f"\nstore: {url.split('://')[0]}; {args.requests} requests per page, one at a time")
    print(f"load average before the run: {load}")
    print(
        f"{'page':<28} {'server p50':>10} {'server p99':>10} {'client p99':>10}"
        f" {'CPU/req':>8}  (ms)"
    )
    worst = 0.0
    for name in pages:
        times = server[name]
        p99 = percentile(times, 0.99)
        worst = max(worst, p99)
        print(
            f"{name:<28} {statistics.median(times):>10.2f} {p99:>10.2f} "
            f"{percentile(client_ms[name], 0.99):>10.2f} {statistics.mean(cpu_ms[name]):>8.2f}"
        )
    print(
        f"\nworst server-side p99: {worst:.2f} ms (target <= 50 ms): "
        + ("met" if worst <= 50 else "MISSED")
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-url", default="")
    parser.add_argument("--usage-rows", type=int, default=1_000_000)
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="10,000 rows, 20 requests")
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.usage_rows, arguments.attempts, arguments.requests = 10_000, 1_000, 20
    sys.exit(trio.run(main, arguments))
