"""Solana's usage shown like EVM's (issue 37, item 6): real calls through chaingate to the
devnet's Solana node (LiteSVM behind JSON-RPC and PubSub) — single calls, a batch, a node
error, a WebSocket subscription whose pushes are metered as ``solana_subscription`` — then
``GET /v1/usage``, the dashboard's overview, usage page and CSV, the operator's view, a key's
method allowlist, ``/metrics`` and the access log, each checked for the Solana network and
its methods, compute units and errors."""

from __future__ import annotations

import base64
import csv
import io
import json
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import Message
from solders.system_program import TransferParams, transfer
from solders.transaction import Transaction

from chaingate.auth.store import AuthRows
from chaingate.twins import Impl
from tests.test_auth import AuthStack, keyed_settings, start_auth
from tests.test_dashboard import account_with_password, browser, csrf, sign_in
from tests.test_ws_solana import Node, next_of, start_node
from tests.ws_clients import Client

URL = "/v1/rpc/solana/devnet"
WS = "/v1/ws/solana/devnet"


def call(method: str, *params: Any, id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": list(params)}


async def solana_stack(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> tuple[AuthStack, Node, io.BytesIO]:
    node = await start_node(nursery)
    settings = keyed_settings(
        ["http://127.0.0.1:1"],
        f"sqlite://{tmp_path}/store.db",
        tmp_path,
        dashboard={"secure_cookie": False},
        chains={
            "solana": {
                "devnet": {
                    "family": "solana",
                    "testnet": True,
                    "upstreams": [{"url": node.urls.http, "ws_url": node.urls.ws, "name": "sol0"}],
                }
            }
        },
    )
    logs = io.BytesIO()
    return await start_auth(nursery, impl, settings, logs), node, logs


async def solana_traffic(client: httpx.AsyncClient, ws_url: str) -> int:
    """Two getSlot, a getBalance answered and one the node refuses (-32602: an error), a
    batch of getBlockHeight and getHealth, a sendTransaction failing preflight (an error), an
    EVM method (-32601, never forwarded), and a
    slotSubscribe with three pushes: the units those pushes cost (0.04 CU a byte, rounded up,
    one at least, as on EVM)."""
    for _ in range(2):
        assert "result" in (await client.post(URL, json=call("getSlot"))).json()
    system = "11111111111111111111111111111111"
    assert "result" in (await client.post(URL, json=call("getBalance", system))).json()
    bad = (await client.post(URL, json=call("getBalance", "nope"))).json()
    assert bad["error"]["code"] == -32602, bad
    batch = [call("getBlockHeight", id=1), call("getHealth", id=2)]
    assert all("result" in r for r in (await client.post(URL, json=batch)).json())
    # A write the node refuses (preflight: the payer has no lamports): Solana's own -32002.
    latest = (await client.post(URL, json=call("getLatestBlockhash"))).json()["result"]
    payer = Keypair()
    ix = transfer(
        TransferParams(from_pubkey=payer.pubkey(), to_pubkey=Keypair().pubkey(), lamports=1)
    )
    tx = Transaction(
        [payer], Message([ix], payer.pubkey()), Hash.from_string(latest["value"]["blockhash"])
    )
    raw = base64.b64encode(bytes(tx)).decode()
    sent = await client.post(URL, json=call("sendTransaction", raw, {"encoding": "base64"}))
    assert sent.json()["error"]["code"] == -32002, sent.text
    evm = (await client.post(URL, json=call("eth_blockNumber"))).json()
    assert evm["error"]["code"] == -32601
    ws = await Client.open(ws_url)
    subscription = (await ws.call("slotSubscribe"))["result"]
    assert isinstance(subscription, int)
    pushes = [await next_of(ws, "slotNotification") for _ in range(3)]
    assert (await ws.call("slotUnsubscribe", [subscription]))["result"] is True
    pushes += [m for m in ws.early if m.get("method") == "slotNotification"]  # before its answer
    await ws.close()
    sizes = [len(json.dumps(push, separators=(",", ":"))) for push in pushes]
    return sum(max(1, -(-size * 4 // 100)) for size in sizes)


# (network, method) -> (requests, compute units, errors), as config/methods.toml prices them.
EXPECTED = {
    ("solana/devnet", "getSlot"): (2, 2, 0),
    ("solana/devnet", "getBalance"): (2, 10, 1),
    ("solana/devnet", "getBlockHeight"): (1, 1, 0),
    ("solana/devnet", "getHealth"): (1, 1, 0),
    ("solana/devnet", "slotSubscribe"): (1, 10, 0),
    ("solana/devnet", "slotUnsubscribe"): (1, 0, 0),  # free, as eth_unsubscribe
    ("solana/devnet", "getLatestBlockhash"): (1, 2, 0),
    ("solana/devnet", "sendTransaction"): (1, 20, 1),
}


async def test_solana_usage_shows_like_evm_usage_everywhere(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> None:
    stack, node, logs = await solana_stack(nursery, impl, tmp_path)
    email = f"sol-{time.monotonic_ns()}@example.com"
    account_id = await account_with_password(stack, email)
    key, key_id = await stack.key(env="live", email=email)
    ws_url = f"ws://127.0.0.1:{stack.handle.port}{WS}?apiKey={key}"
    async with stack.client(key) as client:
        push_units = await solana_traffic(client, ws_url)
        rows = AuthRows(stack.store)
        with trio.fail_after(10):  # the usage writer flushes every 0.2 s here
            while True:
                found = {
                    (r.network, r.method): (r.requests, r.compute_units, r.errors)
                    for r in await rows.usage_totals(account_id, "day", 0, 10**9)
                }
                pushed = found.get(("solana/devnet", "solana_subscription"), (0, 0, 0))
                if all(slot in found for slot in EXPECTED) and pushed[1] >= push_units:
                    break
                await trio.sleep(0.05)
        for slot, counts in EXPECTED.items():
            assert found[slot] == counts, (slot, found)
        # Pushes: no request, their bytes' units.
        assert pushed == (0, push_units, 0), (pushed, push_units)
        # A method of another family is refused before any node and costs nothing, as on EVM.
        assert not any(method.startswith("eth_") for _, method in found)
        assert {network for network, _ in found} == {"solana/devnet"}
        report = (await client.get("/v1/usage", params={"granularity": "day"})).json()
        methods = {
            r["method"]: (r["requests"], r["compute_units"], r["errors"]) for r in report["usage"]
        }
        for (_, method), counts in EXPECTED.items():
            assert methods[method] == counts, methods
        assert methods["solana_subscription"] == pushed
        assert report["totals"]["requests"] == 10 and report["totals"]["errors"] == 2
        metrics = (
            await client.get("/metrics", headers={"Authorization": "Bearer test-admin-token"})
        ).text
    # /metrics: the per-method series carry Solana's names and outcomes.
    series = 'chaingate_rpc_calls_total{chain="solana",network="devnet",method='
    assert series + '"getSlot",outcome="ok"} 2' in metrics
    assert series + '"getBalance",outcome="error"} 1' in metrics
    assert series + '"getHealth",outcome="ok"} 1' in metrics
    # The access log names the Solana method, as it names an EVM one.
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    logged = [line.get("rpc") for line in lines if line.get("path") == URL]
    assert logged.count("getSlot") == 2 and logged.count("getBalance") == 2
    assert "batch" in logged

    dashboard = browser(stack)
    async with aclosing(dashboard):
        assert (await sign_in(dashboard, email)).status_code == 303
        overview = (await dashboard.get("/dashboard/?range=hour")).text
        by_network = overview.split('id="by-network"', 1)[1].split("</table>", 1)[0]
        # 10 requests on solana/devnet (the EVM method is not one), 2 errors.
        assert "<td><code>solana/devnet</code></td><td>10</td>" in by_network, by_network
        assert "<td><code>sendTransaction</code></td><td>1</td><td>20</td><td>1</td>" in overview
        by_method = overview.split('id="by-method"', 1)[1].split("</table>", 1)[0]
        assert "<td><code>getBalance</code></td><td>2</td><td>10</td><td>1</td>" in by_method
        assert "<td><code>slotSubscribe</code></td><td>1</td><td>10</td><td>0</td>" in by_method
        assert "<td><code>solana_subscription</code></td><td>0</td>" in by_method
        assert (
            "Requests by network" in overview
            and "solana/devnet" in overview.split("Requests by network", 1)[1].split("</svg>", 1)[0]
        )
        usage = (await dashboard.get("/dashboard/usage?range=hour")).text
        assert (
            "<code>solana/devnet</code></td><td><code>getSlot</code></td><td>2</td><td>2</td><td>0</td>"
            in usage
        )
        exported = (await dashboard.get("/dashboard/usage.csv?range=day")).text
        _header, *csv_rows = list(csv.reader(io.StringIO(exported)))
        shown = {(r[3], r[4]): (int(r[5]), int(r[6]), int(r[7])) for r in csv_rows}
        for slot, counts in EXPECTED.items():
            assert shown[slot] == counts, shown
        assert shown[("solana/devnet", "solana_subscription")] == pushed

        # Webhooks and gas policies are EVM features: their chain pickers offer no Solana.
        for form_page in ("/dashboard/webhooks", "/dashboard/policies"):
            text = (await dashboard.get(form_page)).text
            assert "<option>ethereum</option>" in text or ">ethereum</option>" in text, text
            assert "solana</option>" not in text, form_page
        # A key locked to Solana methods from its page: the list takes Solana names, and the
        # gate applies it over HTTP and WebSocket as it does EVM ones.
        page = await dashboard.get(f"/dashboard/keys/{key_id}")
        assert "getBalance" in page.text  # the form says Solana names are welcome
        saved = await dashboard.post(
            f"/dashboard/keys/{key_id}/allowlists",
            data={"csrf": csrf(page.text), "methods": "getSlot, slotSubscribe"},
        )
        assert saved.status_code == 200 and "getSlot" in saved.text, saved.text[-2000:]
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    async with stack.client(key) as client:
        assert "result" in (await client.post(URL, json=call("getSlot"))).json()
        refused = await client.post(
            URL, json=call("getBalance", "11111111111111111111111111111111")
        )
        error = refused.json()["error"]
        assert error["code"] == -32004 and "method allowlist" in error["message"], error
    ws = await Client.open(ws_url)
    assert isinstance((await ws.call("slotSubscribe"))["result"], int)
    account_sub = await ws.call("accountSubscribe", ["11111111111111111111111111111111"])
    assert account_sub["error"]["code"] == -32004, account_sub
    await ws.close()


async def test_the_operator_sees_solana_upstreams_and_usage(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> None:
    stack, node, _logs = await solana_stack(nursery, impl, tmp_path)
    email = f"sol-op-{time.monotonic_ns()}@example.com"
    await account_with_password(stack, email)
    key, _ = await stack.key(env="live", email=email)
    async with stack.client(key) as client:
        for _ in range(3):
            assert "result" in (await client.post(URL, json=call("getSlot"))).json()
    account = await AuthRows(stack.store).find_account_by_email(email)
    assert account is not None
    async with browser(stack) as operator:
        form = await operator.get("/dashboard/signin")
        answer = await operator.post(
            "/dashboard/signin/admin",
            data={"csrf": csrf(form.text), "admin_token": "test-admin-token"},
        )
        assert answer.status_code == 303
        with trio.fail_after(10):
            while True:
                page = (await operator.get("/dashboard/operator")).text
                row = page.split(f">{account.id}</a>", 1)[1].split("</tr>", 1)[0]
                if "<td>3</td><td>3</td><td>0</td>" in row:  # requests, CUs, errors today
                    break
                await trio.sleep(0.1)
        upstreams = page.split('id="upstreams"', 1)[1].split("</table>", 1)[0]
        assert "<td>solana/devnet</td><td>sol0</td><td>up</td>" in upstreams, upstreams
