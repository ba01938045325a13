"""Latency per account, network and method (issue 23, the overview's p50/p99): every path that
meters times its admitted requests — the fast lane, the handler, the bundler, REST and
WebSocket calls — on both twins and both stores; a batch counts once, as "batch"; what was
never admitted (malformed, unknown, a bad tag, refused) is not timed, on either lane; the
overview shows the account's own.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.twins import Impl
from tests.test_auth import auth_settings, start_auth
from tests.test_dashboard import account_with_password, browser, sign_in
from tests.test_usage_by_network import DEVNET, MAINNET, call, on_every_rpc_path
from tests.ws_clients import Client

WS = "/v1/ws/ethereum/devnet"


async def test_every_path_times_its_requests_for_the_account(
    nursery: trio.Nursery, impl: Impl, anvil: Any, store_url: str, tmp_path: Path
) -> None:
    settings = auth_settings(anvil, store_url, tmp_path, dashboard={"secure_cookie": False})
    stack = await start_auth(nursery, impl, settings)
    email = f"latency-{time.monotonic_ns()}@example.com"
    # Unlimited: a rate limit's refusals would be left untimed, and this test counts.
    await admin.ensure_account(AuthRows(stack.store), email, "enterprise")
    account_id = await account_with_password(stack, email)
    key, _ = await stack.key(env="live", email=email)
    other_key, _ = await stack.key(env="live")  # another account's requests stay its own
    async with stack.client(key) as client, stack.client(other_key) as other:
        await on_every_rpc_path(client)  # the node refuses its write: still timed
        assert (await other.post(DEVNET, json=call("eth_blockNumber"))).status_code == 200
        assert (await client.get("/v1/usage")).status_code == 200
        # Never admitted: a malformed body, an unknown method, a batch of nothing else are
        # answered, not timed.
        assert (await client.post(DEVNET, content=b"{nope")).status_code == 200
        assert (await client.post(DEVNET, json=call("eth_nope"))).status_code == 200
        assert (await client.post(DEVNET, json=[call("eth_nope")])).status_code == 200
    # A key with an allowlist is answered by the handler (the slow lane): the same rules.
    listed, listed_id = await stack.key(env="live", email=email)
    await admin.update_allowlists(
        AuthRows(stack.store), listed_id, {"methods": ["eth_getBalance", "eth_nope"]}, set()
    )
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    balance = call("eth_getBalance", 5, ["0x" + "11" * 20, "latest"])
    async with stack.client(listed) as slow:
        assert (await slow.post(MAINNET, json=balance)).status_code == 200  # timed
        assert (await slow.post(MAINNET, content=b"{nope")).status_code == 200
        assert (await slow.post(MAINNET, json=call("eth_nope"))).status_code == 200
        assert (await slow.post(MAINNET, json=[call("eth_nope")])).status_code == 200
        bad_tag = call("eth_getBalance", 6, ["0x" + "11" * 20, "yesterday"])
        assert (await slow.post(MAINNET, json=bad_tag)).status_code == 200
        assert (await slow.post(MAINNET, json=call("eth_gasPrice"))).status_code == 403
    ws = await Client.open(
        f"ws://127.0.0.1:{stack.handle.port}{WS}", additional_headers={"X-API-Key": key}
    )
    try:
        assert "result" in await ws.call("eth_chainId")
        assert "result" in await ws.call("eth_gasPrice")
        # A batch with a subscription in it: its other calls are one timed "batch".
        await ws.send([call("eth_subscribe", 7, ["newHeads"]), call("eth_chainId", 8)])
        answers = await ws.recv()
        assert sorted(a["id"] for a in answers) == [7, 8], answers
    finally:
        await ws.close()
    expected = {
        ("ethereum/devnet", "eth_blockNumber"): 3,
        ("ethereum/mainnet", "batch"): 1,
        ("ethereum/mainnet", "eth_sendRawTransaction"): 1,
        ("ethereum/mainnet", "eth_getBalance"): 1,
        ("ethereum/devnet", "eth_supportedEntryPoints"): 1,
        ("", "GET /v1/usage"): 1,
        ("ethereum/devnet", "eth_chainId"): 1,
        ("ethereum/devnet", "eth_gasPrice"): 1,
        ("ethereum/devnet", "batch"): 1,
    }
    now_minute = int(time.time() // 60)
    with trio.fail_after(10):  # the usage writer flushes every 0.2 s here
        while True:
            rows = await AuthRows(stack.store).usage_latency(
                account_id, "minute", 0, now_minute + 2
            )
            found: dict[tuple[str, str], int] = {}
            for row in rows:
                slot = (row.network, row.method)
                found[slot] = found.get(slot, 0) + sum(row.counts)
            if all(found.get(slot, 0) >= n for slot, n in expected.items()):
                break
            await trio.sleep(0.05)
    assert found == expected
    assert all(len(row.counts) == 16 for row in rows)
    # The hour and day rollups hold the same samples.
    for granularity in ("hour", "day"):
        rolled = await AuthRows(stack.store).usage_latency(
            account_id, granularity, 0, now_minute + 1440
        )
        assert sum(sum(row.counts) for row in rolled) == sum(expected.values()), granularity
    dashboard = browser(stack)
    async with aclosing(dashboard):
        assert (await sign_in(dashboard, email)).status_code == 303
        overview = await dashboard.get("/dashboard/?range=hour")
        assert overview.status_code == 200
        table = overview.text.split('id="by-method"', 1)[1].split("</table>", 1)[0]
        assert "<code>batch</code>" in table and "<code>eth_gasPrice</code>" in table, table
