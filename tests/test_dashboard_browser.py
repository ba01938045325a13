"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright through the issue's flow (tests/node/dashboard_flow.mjs), on a real gateway
following real anvil, with a webhook receiver on loopback; on SQLite and on PostgreSQL.

Signed in through the one-time link, the script creates a key with the keyboard only, uses
it on the JSON-RPC path, revokes it (401 within a second), creates a webhook to the
receiver, sends a transfer, sees the delivery in the log, replays it (a second arrival),
pauses and resumes the webhook, shows a webhook whose URL holds ``<script>`` as text,
compares a policy's ledger with the REST answer, visits every page (no console error;
axe-core: no serious or critical violation) and uses the key form at 390 px.  It takes
docs/dashboard.png when CHAINGATE_SCREENSHOTS=1 (the README's picture).

playwright-core and axe-core are pinned npm packages installed once into chaingate's cache,
as tests/test_browser.py installs its own.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows, LatencyDelta, UsageDelta
from chaingate.dashboard.store import DashboardRows
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.npm import npm_install
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.twins import Impl, select
from tests.conftest import make_settings
from tests.test_auth import PEPPER
from tests.test_browser import CHROMIUM, PLAYWRIGHT
from tests.webhook_receiver import Receiver

AXE = "4.14.1"
DRIVER = Path(__file__).parent / "node" / "dashboard_flow.mjs"
DOCS_PNG = Path(__file__).parent.parent / "docs" / "dashboard.png"
# The screenshot's earlier hour: (method, weight, compute units, its latencies' usual bucket).
SEEDED = (
    ("eth_call", 3, 26, 3),
    ("eth_getBalance", 2, 19, 2),
    ("eth_blockNumber", 4, 10, 1),
    ("GET /v1/tokens/{chain}/balances/{address}", 1, 50, 5),
)


def seeded_latency(account_id: str, seeded: tuple[str, int, int, int], minute: int) -> LatencyDelta:
    """A minute of one method's latency: most answers in its usual bucket, a tail two buckets
    up that swells and ebbs with the traffic."""
    method, weight, _cu, bucket = seeded
    requests = int(weight * (20 + 12 * (1 + math.sin(minute / 6))))
    tail = max(1, requests // 25) if minute % 9 < 4 else 0
    counts = [0] * 16
    counts[bucket] = requests - tail
    counts[bucket + 2] = tail
    network = "" if method.startswith("GET ") else "ethereum/devnet"
    return LatencyDelta(account_id, network, method, minute, tuple(counts))


SERIOUS = ("serious", "critical")

pytestmark = pytest.mark.skipif(
    (not Path(CHROMIUM).exists() or shutil.which("node") is None)
    and os.environ.get("CI") != "true",
    reason="needs Debian's chromium and Node.js (apt-get install -y chromium nodejs npm)",
)


@pytest.fixture
def impl() -> Impl:
    return select()


def node_modules() -> Path:
    root = npm_install(
        f"dashboard-tests-playwright-core{PLAYWRIGHT}-axe-core{AXE}",
        [f"playwright-core@{PLAYWRIGHT}", f"axe-core@{AXE}"],
        "node_modules/axe-core/axe.min.js",
        what=f"playwright-core {PLAYWRIGHT} and axe-core {AXE}",
        announce=lambda _: None,
    )
    return root / "node_modules"


def run_flow(workdir: Path, config: dict[str, Any]) -> dict[str, Any]:
    modules = node_modules()
    (workdir / "node_modules").symlink_to(modules, target_is_directory=True)
    script = workdir / DRIVER.name
    shutil.copyfile(DRIVER, script)
    config["axe"] = str(modules / "axe-core" / "axe.min.js")
    (workdir / "flow.json").write_text(json.dumps(config))
    done = subprocess.run(
        [shutil.which("node") or "node", str(script), CHROMIUM, str(workdir / "flow.json")],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"browser run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def test_the_dashboard_flow_in_a_browser(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path, store_url: str
) -> None:
    receiver = Receiver()
    await nursery.start(receiver.serve)
    head = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    settings = make_settings(
        [{"url": anvil.url, "name": "anvil"}],
        network={
            "finality_depth": 2,
            "block_time": 1.0,
            "follower": {"enabled": True, "poll_interval": 0.02, "start_block": head},
        },
        auth={
            "enabled": True,
            "pepper": PEPPER,
            "refresh_interval": 0.1,
            "usage_flush_interval": 0.2,
        },
        store={"url": store_url},
        webhooks={"variant": "a", "poll_interval": 0.05, "allow_http": True},
        dashboard={"secure_cookie": False, "latency_sample_seconds": 1.0},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    store = gateway.store
    assert store is not None
    account = await admin.ensure_account(AuthRows(store), "browser@example.com", "growth")
    rows = DashboardRows(store)
    await rows.set_credentials(account.id, operator=True)
    link_token = await rows.create_signin_link(account.id, 600_000)
    api_key, api_row = await admin.create_key(
        AuthRows(store), PEPPER.encode(), account.id, "rest", "live"
    )
    # An hour of earlier traffic for the screenshot's charts (seeded: the flow's own requests
    # arrive in the last minute only).
    now_minute = int(time.time() // 60)
    await AuthRows(store).add_usage(
        [
            UsageDelta(
                api_row.id,
                account.id,
                method,
                minute,
                int(weight * (20 + 12 * (1 + math.sin(minute / 6)))),
                int(weight * cu * (20 + 12 * (1 + math.sin(minute / 6)))),
                1 if minute % 17 == 0 else 0,
                "" if method.startswith("GET ") else "ethereum/devnet",  # REST: no network
            )
            for minute in range(now_minute - 59, now_minute)
            for method, weight, cu, _bucket in SEEDED
        ]
    )
    # And their latency: most answers in one bucket (a method's own), a tail that swells
    # and ebbs.
    await AuthRows(store).add_usage(
        [],
        [
            seeded_latency(account.id, seeded, minute)
            for seeded in SEEDED
            for minute in range(now_minute - 59, now_minute)
        ],
    )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    accounts = rpc_call(anvil.url, "eth_accounts")
    assert isinstance(accounts, list)
    base = f"http://127.0.0.1:{gateway.port}"
    wanted = os.environ.get("CHAINGATE_SCREENSHOTS") == "1" and store_url.startswith("sqlite")
    screenshot = DOCS_PNG if wanted else tmp_path / "d.png"
    config = {
        "base": base,
        "link": f"{base}/dashboard/signin/link/{link_token}",
        "anvil": anvil.url,
        "receiver": f"http://127.0.0.1:{receiver.port}/hooks",
        "eventType": "address_activity",
        "watched": "0x" + os.urandom(20).hex(),
        "sender": accounts[0],
        "apiKey": api_key,
        "screenshot": str(screenshot),
        # Every page's picture, for a person to look at: CHAINGATE_DASHBOARD_SHOTS=DIR.
        "shots": os.environ.get("CHAINGATE_DASHBOARD_SHOTS", ""),
    }
    seen = await trio.to_thread.run_sync(run_flow, tmp_path, config)
    steps = json.dumps(seen, indent=1)[:6000]
    assert "error" not in seen, steps
    assert seen["signedIn"], steps
    keyboard = seen["keyboard"]
    assert keyboard["reachedName"] and keyboard["reachedSubmit"] and keyboard["created"], steps
    assert keyboard["reachedCopy"] and keyboard["copyNote"], steps
    assert keyboard["reachedRevoke"], steps  # revoked with Tab and Enter too
    assert seen["rpcBefore"] == 200 and seen["rpcAfter"] == 401, steps
    assert seen["revokeMs"] < 1000, steps
    hook = seen["webhook"]
    assert hook["secret"] and hook["deliveredInLog"] >= 1, steps
    assert hook["attemptsInLog"] >= 2, steps
    assert hook["paused"].startswith("paused") and hook["resumed"] == "active", steps
    arrivals = [r for r in receiver.received if r.json().get("id") == hook["eventId"]]
    assert len(arrivals) >= 2, [r.json() for r in receiver.received]  # the replay arrived
    assert seen["escaped"] == {"scripts": 1, "shown": True}, seen["escaped"]  # <script> as text
    policy = seen["policy"]
    assert policy["rest"] and policy["shown"] == {k: str(v) for k, v in policy["rest"].items()}
    assert seen["consoleErrors"] == [], seen["consoleErrors"]
    assert set(seen["pageStatus"].values()) == {200}, seen["pageStatus"]
    bad = {
        page: [v for v in found if v["impact"] in SERIOUS]
        for page, found in seen["axe"].items()
        if any(v["impact"] in SERIOUS for v in found)
    }
    assert bad == {}, json.dumps(bad, indent=1)
    assert int(seen["overview"]["requests"]) >= 40 and seen["overview"]["charts"] == 4, steps
    narrow = seen["narrow"]
    assert narrow["submitInside"] and narrow["created"], narrow
    assert all(width <= 390 for key, width in narrow.items() if key.startswith("/")), (
        narrow,
        seen.get("narrowWide"),
    )
    assert screenshot.exists()
