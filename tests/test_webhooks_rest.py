"""The webhooks REST resource over HTTP, on SQLite and PostgreSQL: a gateway (keys on)
following a real anvil, its webhook service built by the gateway itself.

Every answer is checked against the OpenAPI document (``GatewayHandle.client``).  The URL
checks run under the production outbound policy with an injected resolver and a recording
connector: a refused URL is refused before any connection, which the connector proves by
recording none.  Deliveries (the test ping, replays, a rotated secret) go to a real HTTP
receiver on loopback, under the dev policy with ``allow_http``.
"""

from __future__ import annotations

import io
import secrets
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from chaingate.api.build import build_api
from chaingate.api.openapi import document
from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.addresses import checksum_address
from chaingate.gateway import Gateway
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.webhooks.outbox import Attempt, Outcome
from chaingate.webhooks.service import WebhookService
from chaingate.webhooks.variants import verify_a
from tests.conftest import make_settings
from tests.helpers import GatewayHandle
from tests.test_auth import PEPPER
from tests.test_outbound_support import (
    HttpServer,
    RecordingConnector,
    SeenRequest,
    StaticResolver,
    reply,
)

NET = "ethereum/devnet"
PUBLIC = "93.184.216.34"  # a global unicast address the injected resolver hands out
HOOK = "https://hooks.example.com/chaingate/in"
NAMES = {
    "hooks.example.com": [PUBLIC],
    "internal.example.com": ["10.1.2.3"],
    "metadata.example.com": ["169.254.169.254"],
}


def address() -> str:
    return "0x" + secrets.token_hex(20)


class Hooks:
    """A running gateway, keys for accounts ``a``, ``b`` and ``small`` (2 webhooks, 3 values),
    and a ``reader`` key of account ``a`` without the webhooks scope."""

    def __init__(
        self,
        gateway: Gateway,
        keys: dict[str, str],
        accounts: dict[str, str],
        resolver: StaticResolver | None,
        connector: RecordingConnector | None,
    ) -> None:
        self.handle = GatewayHandle(gateway, io.BytesIO())
        self.gateway = gateway
        self.keys = keys
        self.accounts = accounts
        self.resolver = resolver
        self.connector = connector

    @property
    def service(self) -> WebhookService:
        assert self.gateway.webhooks is not None
        return self.gateway.webhooks

    async def request(
        self, method: str, path: str, body: Any = None, *, who: str = "a", **params: Any
    ) -> httpx.Response:
        async with self.handle.client(headers={"X-API-Key": self.keys[who]}) as client:
            return await client.request(method, path, json=body, params=params or None)

    async def create(self, who: str = "a", **fields: Any) -> dict[str, Any]:
        body = {
            "url": HOOK,
            "chain": "ethereum",
            "event_type": "address_activity",
            "config": {"addresses": [address()]},
            **fields,
        }
        response = await self.request("POST", "/v1/webhooks", body, who=who)
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    async def get(self, webhook_id: str, who: str = "a") -> dict[str, Any]:
        return ok(await self.request("GET", f"/v1/webhooks/{webhook_id}", who=who))

    async def patch(self, webhook_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return ok(await self.request("PATCH", f"/v1/webhooks/{webhook_id}", body))

    async def matcher_at_head(self) -> int:
        """Mine a block and wait until the network's matcher has committed it: its number."""
        rpc = DevnetRpc(self.gateway.settings.chains["ethereum"]["devnet"].upstreams[0].url)
        try:
            rpc.call("evm_mine")
            head = int(rpc.call("eth_blockNumber"), 16)
        finally:
            rpc.close()
        matcher = self.service.matchers[NET]
        with trio.fail_after(20):
            while matcher.cursor is None or matcher.cursor[0] < head:
                await trio.sleep(0.02)
        return head


async def start_hooks(
    nursery: trio.Nursery,
    anvil: AnvilProcess,
    store_url: str,
    data_dir: Path,
    *,
    fetcher: Fetcher | None = None,
    **webhooks: Any,
) -> Hooks:
    resolver = connector = None
    if fetcher is None:
        resolver = StaticResolver(NAMES)
        connector = RecordingConnector()
        fetcher = Fetcher(OutboundPolicy(), resolver=resolver, connector=connector)
    settings = make_settings(
        [{"url": anvil.url, "name": "anvil"}],
        network={
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": False},
        },
        # A network configured but not followed: webhooks are not served there.
        chains={
            "base": {
                "sepolia": {
                    "chain_id": 31337,
                    "testnet": True,
                    "upstreams": [{"url": anvil.url, "name": "b"}],
                    "follower": {"enabled": False},
                }
            }
        },
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": store_url},
        webhooks=webhooks,
        data_dir=str(data_dir),
    )
    gateway = Gateway(settings, access_stream=io.BytesIO(), webhook_fetcher=fetcher)
    await nursery.start(gateway.run)
    store = gateway.store
    assert store is not None and gateway.keys is not None
    tag = secrets.token_hex(4)
    keys, accounts = {}, {}
    small = '{"webhooks": 2, "webhook_addresses": 3}'
    for who, limits in (("a", None), ("b", None), ("small", small)):
        account = await AuthRows(store).create_account(f"{who}-{tag}@hooks", "enterprise", limits)
        accounts[who] = account.id
        keys[who], _ = await admin.create_key(
            AuthRows(store), PEPPER.encode(), account.id, who, "test"
        )
        if who == "a":
            keys["reader"], _ = await admin.create_key(
                AuthRows(store),
                PEPPER.encode(),
                account.id,
                "r",
                "test",
                admin.parse_scopes("data:read"),
            )
    await gateway.keys.refresh()
    return Hooks(gateway, keys, accounts, resolver, connector)


@pytest.fixture
async def hooks(
    nursery: trio.Nursery, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> Hooks:
    return await start_hooks(nursery, anvil, store_url, tmp_path)


def ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    result: dict[str, Any] = response.json()
    return result


def refused(response: httpx.Response, status: int, *named: str) -> str:
    """An error in the spec's envelope, its message naming each of ``named``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    code = {400: "invalid_request", 403: "forbidden", 404: "not_found", 409: "conflict"}
    assert error["status"] == status and error["code"] == code[status], error
    message: str = error["message"]
    for fragment in named:
        assert fragment in message, message
    return message


def seconds(text: str) -> float:
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- create, get, list -----------------------------------------------------------------------


async def test_create_answers_the_secret_once(hooks: Hooks) -> None:
    watched = [address().upper().replace("0X", "0x"), address()]
    before = time.time()
    created = await hooks.create(config={"addresses": watched}, confirmations=3)
    assert set(created) == {
        "id",
        "url",
        "chain",
        "event_type",
        "config",
        "signing_secret",
        "status",
        "created_at",
        "confirmations",
        "matched_from_block",
    }
    assert created["id"].startswith("wh_") and len(created["id"]) > 10
    assert created["signing_secret"].startswith("whsec_")
    assert created["url"] == HOOK and created["chain"] == "ethereum"
    assert created["event_type"] == "address_activity" and created["status"] == "active"
    assert created["confirmations"] == 3
    # Normalised: lower case, sorted.
    # Normalised (sorted by their lowercase form, de-duplicated) and shown EIP-55.
    assert created["config"] == {
        "addresses": [checksum_address(a) for a in sorted(a.lower() for a in watched)]
    }
    assert before - 1 <= seconds(created["created_at"]) <= time.time() + 1

    secret = created["signing_secret"]
    one = await hooks.get(created["id"])
    assert "signing_secret" not in one
    assert one["config"] == created["config"] and one["status_reason"] is None
    assert one["created_at"] == created["created_at"] == one["updated_at"]
    assert one["matched_from_block"] == created["matched_from_block"]
    listed = await hooks.request("GET", "/v1/webhooks")
    assert secret not in listed.text
    assert ok(listed)["webhooks"] == [
        {k: created[k] for k in ("id", "url", "chain", "event_type", "status", "created_at")}
    ]
    # Each creation has a secret of its own.
    assert (await hooks.create())["signing_secret"] != secret


async def test_a_webhook_is_matched_from_the_block_its_answer_names(hooks: Hooks) -> None:
    head = await hooks.matcher_at_head()
    created = await hooks.create()
    assert created["matched_from_block"] == head + 1
    # A change of what is matched names the block it takes effect at; one that is not does not.
    head = await hooks.matcher_at_head()
    patched = await hooks.patch(created["id"], {"config": {"addresses": [address()]}})
    assert patched["matched_from_block"] == head + 1
    assert "matched_from_block" not in await hooks.patch(created["id"], {"url": HOOK + "/2"})
    head = await hooks.matcher_at_head()
    assert (await hooks.patch(created["id"], {"confirmations": 2}))["matched_from_block"] == (
        head + 1
    )
    assert (await hooks.get(created["id"]))["matched_from_block"] == head + 1


@pytest.mark.parametrize(
    ("change", "status", "named"),
    [
        ({"url": None}, 400, ["missing required field 'url'"]),
        ({"url": "https://hooks.example.com/" + "a" * 2048}, 400, ["'url'", "2048"]),
        ({"url": "http://hooks.example.com/in"}, 400, ["'url'", "https://"]),
        ({"url": "hooks.example.com/in"}, 400, ["'url'"]),
        ({"url": "https://nowhere.example.com/in"}, 400, ["'url'", "nowhere.example.com"]),
        ({"url": 5}, 400, ["'url'"]),
        ({"event_type": None}, 400, ["missing required field 'event_type'"]),
        ({"event_type": "bogus"}, 400, ["'event_type'", "address_activity", "log"]),
        # Variant B's name for the same kind: this deployment runs variant A.
        ({"event_type": "ADDRESS_ACTIVITY"}, 400, ["'event_type'", "token_transfer"]),
        ({"event_type": "new_block"}, 400, ["'event_type'"]),
        ({"config": None}, 400, ["'config.addresses'", "required"]),
        ({"config": []}, 400, ["'config'"]),
        ({"config": {"addresses": ["0x12"]}}, 400, ["'config.addresses[0]'"]),
        ({"config": {"addresses": [address()], "topics": []}}, 400, ["'config.topics'"]),
        ({"confirmations": -1}, 400, ["'confirmations'"]),
        ({"confirmations": 129}, 400, ["'confirmations'", "128"]),
        ({"confirmations": "1"}, 400, ["'confirmations'"]),
        ({"chain": None}, 400, ["missing required field 'chain'"]),
        ({"chain": "a b"}, 400, ["'chain'"]),
        ({"nonsense": 1}, 400, ["unknown field 'nonsense'"]),
        ({"chain": "nochain"}, 404, ["nochain"]),
        ({"chain": "base"}, 404, ["base/sepolia", "not followed"]),
    ],
)
async def test_create_refuses_what_it_cannot_serve(
    hooks: Hooks, change: dict[str, Any], status: int, named: list[str]
) -> None:
    body: dict[str, Any] = {
        "url": HOOK,
        "chain": "ethereum",
        "event_type": "address_activity",
        "config": {"addresses": [address()]},
    }
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    refused(await hooks.request("POST", "/v1/webhooks", body), status, *named)
    assert ok(await hooks.request("GET", "/v1/webhooks"))["total"] == 0


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("https://127.0.0.1/in", "127.0.0.1"),
        ("https://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("https://10.0.0.1/in", "10.0.0.1"),
        ("https://[::1]/in", "::1"),
        ("https://localhost/in", "localhost"),
        ("https://internal.example.com/in", "10.1.2.3"),
        ("https://metadata.example.com/in", "169.254.169.254"),
    ],
)
async def test_create_refuses_urls_to_private_addresses_without_connecting(
    hooks: Hooks, url: str, named: str
) -> None:
    body = {
        "url": url,
        "chain": "ethereum",
        "event_type": "address_activity",
        "config": {"addresses": [address()]},
    }
    refused(await hooks.request("POST", "/v1/webhooks", body), 400, "'url'", named)
    assert hooks.connector is not None and hooks.connector.attempts == []
    assert ok(await hooks.request("GET", "/v1/webhooks"))["total"] == 0
    # The name was resolved (so the refusal is about where it points), never connected to.
    if "example.com" in url:
        assert hooks.resolver is not None
        assert hooks.resolver.queries == [url.split("/")[2]]


async def test_list_pages_and_filters_by_status(hooks: Hooks) -> None:
    made = [await hooks.create() for _ in range(5)]
    ids = [m["id"] for m in made]
    await hooks.patch(ids[1], {"status": "paused"})
    await hooks.patch(ids[3], {"status": "paused"})

    first = ok(await hooks.request("GET", "/v1/webhooks", limit=2))
    assert (first["page"], first["total"], first["limit"]) == (1, 5, 2)
    third = ok(await hooks.request("GET", "/v1/webhooks", limit=2, page=3))
    second = ok(await hooks.request("GET", "/v1/webhooks", limit=2, page=2))
    listed = [w["id"] for page in (first, second, third) for w in page["webhooks"]]
    assert listed == ids  # oldest first, each once
    assert ok(await hooks.request("GET", "/v1/webhooks", page=4, limit=2))["webhooks"] == []

    paused = ok(await hooks.request("GET", "/v1/webhooks", status="paused"))
    assert [w["id"] for w in paused["webhooks"]] == [ids[1], ids[3]] and paused["total"] == 2
    assert all(w["status"] == "paused" for w in paused["webhooks"])
    active = ok(await hooks.request("GET", "/v1/webhooks", status="active"))
    assert [w["id"] for w in active["webhooks"]] == [ids[0], ids[2], ids[4]]
    assert ok(await hooks.request("GET", "/v1/webhooks", status="disabled"))["total"] == 0
    assert ok(await hooks.request("GET", "/v1/webhooks"))["limit"] == 25

    refused(await hooks.request("GET", "/v1/webhooks", status="gone"), 400, "'status'")
    refused(await hooks.request("GET", "/v1/webhooks", limit=101), 400, "'limit'")
    refused(await hooks.request("GET", "/v1/webhooks", page=0), 400, "'page'")
    refused(await hooks.request("GET", "/v1/webhooks", chain="x"), 400, "'chain'")


# --- update, delete, ownership ---------------------------------------------------------------


async def test_patch_pauses_resumes_and_edits_the_filter(hooks: Hooks) -> None:
    # Answers show addresses EIP-55, in the filter's order (by lowercase form).
    first, second, third = (checksum_address(a) for a in sorted(address() for _ in range(3)))
    created = await hooks.create(config={"addresses": [first]})
    webhook_id = created["id"]

    paused = await hooks.patch(webhook_id, {"status": "paused"})
    assert set(paused) == {"id", "url", "chain", "event_type", "status", "updated_at"}
    assert paused["status"] == "paused" and paused["id"] == webhook_id
    assert seconds(paused["updated_at"]) >= seconds(created["created_at"])
    assert (await hooks.get(webhook_id))["status"] == "paused"

    resumed = await hooks.patch(webhook_id, {"status": "active"})
    assert resumed["status"] == "active" and isinstance(resumed["matched_from_block"], int)

    # The whole filter replaced; then edited without sending it again.
    replaced = await hooks.patch(webhook_id, {"config": {"addresses": [second]}})
    assert "matched_from_block" in replaced
    assert (await hooks.get(webhook_id))["config"] == {"addresses": [second]}
    edited = await hooks.patch(
        webhook_id, {"addresses_to_add": [first.upper().replace("0X", "0x"), third]}
    )
    assert "matched_from_block" in edited
    assert (await hooks.get(webhook_id))["config"] == {"addresses": [first, second, third]}
    await hooks.patch(webhook_id, {"addresses_to_remove": [second, address()]})
    assert (await hooks.get(webhook_id))["config"] == {"addresses": [first, third]}
    # config first, then the edits.
    await hooks.patch(
        webhook_id,
        {"config": {"addresses": [second]}, "addresses_to_add": [third], "addresses_to_remove": []},
    )
    assert (await hooks.get(webhook_id))["config"] == {"addresses": [second, third]}

    moved = await hooks.patch(webhook_id, {"url": "https://hooks.example.com/other"})
    assert moved["url"] == "https://hooks.example.com/other" and "matched_from_block" not in moved
    # Nothing to change: the webhook as it is.
    same = await hooks.patch(webhook_id, {})
    assert same["updated_at"] == moved["updated_at"] and same["status"] == "active"
    one = await hooks.get(webhook_id)
    assert one["url"] == "https://hooks.example.com/other"
    assert one["updated_at"] == moved["updated_at"]


async def test_resuming_a_webhook_the_service_stopped_clears_its_reason(hooks: Hooks) -> None:
    created = await hooks.create()
    store = hooks.service.store
    stopped = await store.update_webhook(
        hooks.accounts["a"],
        created["id"],
        {"status": "disabled", "status_reason": "the receiver answered 410 Gone"},
        int(time.time() * 1000),
    )
    assert stopped is not None
    one = await hooks.get(created["id"])
    assert (one["status"], one["status_reason"]) == ("disabled", "the receiver answered 410 Gone")
    listed = ok(await hooks.request("GET", "/v1/webhooks", status="disabled"))
    assert [w["id"] for w in listed["webhooks"]] == [created["id"]]

    resumed = await hooks.patch(created["id"], {"status": "active"})
    assert resumed["status"] == "active" and "matched_from_block" in resumed
    one = await hooks.get(created["id"])
    assert (one["status"], one["status_reason"]) == ("active", None)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"status": "disabled"}, ["'status'"]),
        ({"status": "deleted"}, ["'status'"]),
        ({"url": "http://hooks.example.com/in"}, ["'url'", "https://"]),
        ({"url": "https://internal.example.com/in"}, ["'url'", "10.1.2.3"]),
        ({"url": ""}, ["'url'"]),
        ({"config": {"addresses": []}}, ["'config.addresses'"]),
        ({"config": {"selectors": ["0x12345678"]}}, ["'config.addresses'", "required"]),
        ({"config": {"contracts": [address()]}}, ["'config.contracts'", "unknown key"]),
        ({"confirmations": 1000}, ["'confirmations'", "128"]),
        ({"addresses_to_add": ["0xnope"]}, ["'addresses_to_add[0]'"]),
        ({"addresses_to_add": "0x" + "11" * 20}, ["'addresses_to_add'"]),
        ({"addresses_to_remove": [7]}, ["'addresses_to_remove[0]'"]),
        ({"event_type": "log"}, ["unknown field 'event_type'"]),
        ({"chain": "ethereum"}, ["unknown field 'chain'"]),
    ],
)
async def test_patch_refuses_bad_fields(
    hooks: Hooks, body: dict[str, Any], named: list[str]
) -> None:
    created = await hooks.create()
    refused(await hooks.request("PATCH", f"/v1/webhooks/{created['id']}", body), 400, *named)
    one = await hooks.get(created["id"])
    assert one["config"] == created["config"] and one["url"] == created["url"]
    assert one["status"] == "active" and one["updated_at"] == one["created_at"]


async def test_removing_every_address_is_refused(hooks: Hooks) -> None:
    created = await hooks.create()
    (only,) = created["config"]["addresses"]
    response = await hooks.request(
        "PATCH", f"/v1/webhooks/{created['id']}", {"addresses_to_remove": [only]}
    )
    refused(response, 400, "'addresses_to_remove'")
    # A kind without addresses cannot be edited this way.
    blocks = await hooks.create(
        event_type="mined_transaction", config={"transaction_hashes": ["0x" + "ab" * 32]}
    )
    response = await hooks.request(
        "PATCH", f"/v1/webhooks/{blocks['id']}", {"addresses_to_add": [address()]}
    )
    refused(response, 400, "'addresses_to_add'", "mined_transaction")


async def test_another_accounts_webhook_is_not_found(hooks: Hooks) -> None:
    theirs = await hooks.create(who="b")
    missing = "wh_" + "x" * 20
    for webhook_id in (theirs["id"], missing):
        calls = [
            ("GET", f"/v1/webhooks/{webhook_id}", None),
            ("PATCH", f"/v1/webhooks/{webhook_id}", {"status": "paused"}),
            ("DELETE", f"/v1/webhooks/{webhook_id}", None),
            ("GET", f"/v1/webhooks/{webhook_id}/events", None),
            ("GET", f"/v1/webhooks/{webhook_id}/attempts", None),
            ("POST", f"/v1/webhooks/{webhook_id}/test", None),
            ("POST", f"/v1/webhooks/{webhook_id}/rotate-secret", None),
            ("POST", f"/v1/webhooks/{webhook_id}/replay", {"since": "0"}),
            ("POST", f"/v1/webhooks/{webhook_id}/events/evt_x/replay", None),
        ]
        for method, path, body in calls:
            message = refused(await hooks.request(method, path, body), 404)
            # The same answer whether it exists elsewhere or not at all.
            assert message == f"no webhook {webhook_id} in this account", (method, path)
    assert ok(await hooks.request("GET", "/v1/webhooks"))["total"] == 0
    # Untouched: still theirs, still active, same secret-free view.
    assert (await hooks.get(theirs["id"], who="b"))["status"] == "active"
    assert ok(await hooks.request("GET", "/v1/webhooks", who="b"))["total"] == 1


async def test_delete_is_permanent(hooks: Hooks) -> None:
    kept = await hooks.create()
    gone = await hooks.create()
    answer = ok(await hooks.request("DELETE", f"/v1/webhooks/{gone['id']}"))
    assert answer == {"id": gone["id"], "deleted": True}
    refused(await hooks.request("GET", f"/v1/webhooks/{gone['id']}"), 404)
    refused(await hooks.request("DELETE", f"/v1/webhooks/{gone['id']}"), 404)
    listed = ok(await hooks.request("GET", "/v1/webhooks"))
    assert [w["id"] for w in listed["webhooks"]] == [kept["id"]]


async def test_plan_limits(hooks: Hooks) -> None:
    three = [address() for _ in range(3)]
    first = await hooks.create(who="small", config={"addresses": three})
    # Values over the plan's limit per webhook: 400 naming the key and the limit.
    body = {
        "url": HOOK,
        "chain": "ethereum",
        "event_type": "address_activity",
        "config": {"addresses": [*three, address()]},
    }
    response = await hooks.request("POST", "/v1/webhooks", body, who="small")
    refused(response, 400, "'config.addresses'", "at most 3")
    response = await hooks.request(
        "PATCH", f"/v1/webhooks/{first['id']}", {"addresses_to_add": [address()]}, who="small"
    )
    refused(response, 400, "'addresses_to_add'", "at most 3")
    # Webhooks over the plan's limit per account: 403.
    await hooks.create(who="small")
    body["config"] = {"addresses": three}
    response = await hooks.request("POST", "/v1/webhooks", body, who="small")
    refused(response, 403, "already has 2 webhooks")
    assert ok(await hooks.request("GET", "/v1/webhooks", who="small"))["total"] == 2
    # Another account is not limited by this one's plan.
    await hooks.create(who="a", config={"addresses": [*three, address()]})


async def test_the_webhooks_scope_is_required(hooks: Hooks) -> None:
    response = await hooks.request("GET", "/v1/webhooks", who="reader")
    assert response.status_code == 403, response.text
    assert "webhooks:manage" in response.json()["error"]["message"]
    refused(await hooks.request("POST", "/v1/webhooks", {}, who="reader"), 403)


async def test_without_the_service_webhooks_are_not_found(
    nursery: trio.Nursery, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    hooks = await start_hooks(nursery, anvil, store_url, tmp_path, enabled=False)
    assert hooks.gateway.webhooks is None
    refused(await hooks.request("GET", "/v1/webhooks"), 404, "webhooks need a store")
    body = {"url": HOOK, "chain": "ethereum", "event_type": "address_activity"}
    refused(await hooks.request("POST", "/v1/webhooks", body), 404, "webhooks need a store")


# --- deliveries: the log, replays, the test ping, secret rotation ----------------------------


async def received(server: HttpServer, count: int) -> list[Any]:
    with trio.fail_after(20):
        while len(server.requests) < count:
            await trio.sleep(0.02)
    return server.requests


async def test_delivery_log_replays_and_rotation(
    nursery: trio.Nursery, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    receiver = await HttpServer({"/hook": reply(200, b"thanks")}).start(nursery)
    hooks = await start_hooks(
        nursery,
        anvil,
        store_url,
        tmp_path,
        fetcher=Fetcher(OutboundPolicy.dev()),
        allow_http=True,  # plain HTTP only where the deployment allows it
    )
    url = f"http://127.0.0.1:{receiver.port}/hook"
    created = await hooks.create(url=url)
    webhook_id, secret = created["id"], created["signing_secret"]

    # The test ping: 202, then delivered, signed with the webhook's secret.
    ping = ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/test"), 202)
    event_id = ping["event_id"]
    assert event_id.startswith("evt_")
    (request,) = await received(receiver, 1)
    headers = dict(request.headers)
    assert verify_a(request.body, headers, secret)
    assert msgspec.json.decode(request.body)["id"] == event_id

    events = await _events_when(hooks, webhook_id, lambda e: e["state"] == "delivered")
    (event,) = events["events"]
    assert event["id"] == event_id and event["body"] == msgspec.json.decode(request.body)
    assert event["attempts"] == 1 and event["last_status"] == 200 and event["last_error"] is None
    assert event["next_attempt_at"] is None and event["original_id"] is None
    assert event["block_number"] is None and event["sequence"] >= 1
    assert (
        ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/events", state="failed"))[
            "events"
        ]
        == []
    )
    refused(
        await hooks.request("GET", f"/v1/webhooks/{webhook_id}/events", state="lost"),
        400,
        "'state'",
    )

    attempts = ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/attempts"))
    (attempt,) = attempts["attempts"]
    assert attempt["event_id"] == event_id and attempt["url"] == url
    assert attempt["status"] == 200 and attempt["response_body"] == "thanks"
    assert attempt["error"] is None and attempt["latency_ms"] >= 0
    assert ["Content-Type", "application/json"] in attempt["request_headers"]
    filtered = await hooks.request(
        "GET", f"/v1/webhooks/{webhook_id}/attempts", event_id="evt_other"
    )
    assert ok(filtered)["attempts"] == [] and ok(filtered)["total"] == 0

    # One event sent again: the same id, a new attempt.
    replay = f"/v1/webhooks/{webhook_id}/events/{event_id}/replay"
    assert ok(await hooks.request("POST", replay), 202) == {"replayed": 1}
    requests = await received(receiver, 2)
    assert msgspec.json.decode(requests[1].body)["id"] == event_id
    refused(
        await hooks.request("POST", f"/v1/webhooks/{webhook_id}/events/evt_nope/replay"),
        404,
        "evt_nope",
    )

    # A rotation: a new secret, shown once; both sign until the old one expires.
    before = time.time()
    rotated = ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/rotate-secret"))
    assert rotated["id"] == webhook_id and rotated["signing_secret"].startswith("whsec_")
    assert rotated["signing_secret"] != secret
    expires = seconds(rotated["previous_secret_expires_at"])
    assert before + 86_400 - 2 <= expires <= time.time() + 86_400 + 2
    assert (
        rotated["signing_secret"]
        not in (await hooks.request("GET", f"/v1/webhooks/{webhook_id}")).text
    )
    ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/test"), 202)
    requests = await received(receiver, 3)
    headers = dict(requests[2].headers)
    assert verify_a(requests[2].body, headers, rotated["signing_secret"])
    assert verify_a(requests[2].body, headers, secret)

    # A paused webhook's events wait; resuming delivers them.
    await hooks.patch(webhook_id, {"status": "paused"})
    held = ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/test"), 202)["event_id"]
    await trio.sleep(1.0)
    assert len(receiver.requests) == 3
    pending = ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/events", state="pending"))
    assert [e["id"] for e in pending["events"]] == [held]
    assert pending["events"][0]["next_attempt_at"] is not None
    await hooks.patch(webhook_id, {"status": "active"})
    requests = await received(receiver, 4)
    assert msgspec.json.decode(requests[3].body)["id"] == held

    # Every failed event since a moment: the first ping's last attempt recorded as failed (as
    # the dispatcher records a delivery whose retries ran out), then replayed.
    store = hooks.service.store
    now = int(time.time() * 1000)
    failed = Attempt(
        event_id=event_id,
        attempt=99,
        webhook_id=webhook_id,
        started_at=now,
        url=url,
        request_headers="[]",
        status=500,
        response_body="down",
        latency_ms=3,
        error=None,
    )
    await store.finish_attempts(
        [Outcome(attempt=failed, state="failed", retries=5, next_attempt_at=now)]
    )
    listed = ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/events", state="failed"))
    assert [e["id"] for e in listed["events"]] == [event_id]
    path = f"/v1/webhooks/{webhook_id}/replay"
    later = str(int(time.time()) + 3600)
    assert ok(await hooks.request("POST", path, {"since": later}), 202) == {"replayed": 0}
    since = created["created_at"]
    assert ok(await hooks.request("POST", path, {"since": since}), 202) == {"replayed": 1}
    requests = await received(receiver, 5)
    assert msgspec.json.decode(requests[4].body)["id"] == event_id
    refused(await hooks.request("POST", path, {"since": "yesterday"}), 400, "'since'")
    refused(await hooks.request("POST", path, {}), 400, "'since'")


async def test_an_event_being_delivered_is_not_replayed_at_once(
    nursery: trio.Nursery, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    # Issue 25, item 4: a replay while an attempt is unanswered would free the event for a
    # second, concurrent copy.  It is 409 (with Retry-After) until the attempt ends.
    answer = trio.Event()

    async def slow(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await answer.wait()
        await reply(200, b"late")(request, stream)

    receiver = await HttpServer({"/slow": slow}).start(nursery)
    hooks = await start_hooks(
        nursery, anvil, store_url, tmp_path, fetcher=Fetcher(OutboundPolicy.dev()), allow_http=True
    )
    webhook_id = (await hooks.create(url=f"http://127.0.0.1:{receiver.port}/slow"))["id"]
    event_id = ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/test"), 202)["event_id"]
    await received(receiver, 1)  # the first attempt is on the wire, unanswered

    replay = f"/v1/webhooks/{webhook_id}/events/{event_id}/replay"
    answers: list[httpx.Response] = []

    async def replay_once() -> None:
        answers.append(await hooks.request("POST", replay))

    async with trio.open_nursery() as many:
        for _ in range(10):
            many.start_soon(replay_once)
    for response in answers:
        refused(response, 409, event_id, "being delivered")
        assert 1 <= int(response.headers["Retry-After"]) <= 60, response.headers
    bulk = ok(await hooks.request("POST", f"/v1/webhooks/{webhook_id}/replay", {"since": "0"}), 202)
    assert bulk == {"replayed": 0}
    await trio.sleep(1.0)
    assert len(receiver.requests) == 1  # no second copy went out meanwhile

    answer.set()  # the first attempt is answered and written back
    await _events_when(hooks, webhook_id, lambda e: e["state"] == "delivered")
    assert ok(await hooks.request("POST", replay), 202) == {"replayed": 1}
    requests = await received(receiver, 2)
    assert [msgspec.json.decode(r.body)["id"] for r in requests] == [event_id, event_id]
    await _events_when(hooks, webhook_id, lambda e: e["state"] == "delivered")
    await trio.sleep(0.5)
    assert len(receiver.requests) == 2
    attempts = ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/attempts"))
    assert attempts["total"] == 2


async def _events_when(hooks: Hooks, webhook_id: str, done: Any) -> dict[str, Any]:
    with trio.fail_after(20):
        while True:
            events = ok(await hooks.request("GET", f"/v1/webhooks/{webhook_id}/events"))
            if events["events"] and all(done(e) for e in events["events"]):
                return events
            await trio.sleep(0.05)


# --- the document ----------------------------------------------------------------------------


def test_the_document_describes_every_webhook_route() -> None:
    api = build_api()
    doc = document(api)
    routes = {
        ("post", "/v1/webhooks"): "201",
        ("get", "/v1/webhooks"): "200",
        ("get", "/v1/webhooks/{id}"): "200",
        ("patch", "/v1/webhooks/{id}"): "200",
        ("delete", "/v1/webhooks/{id}"): "200",
        ("get", "/v1/webhooks/{id}/events"): "200",
        ("get", "/v1/webhooks/{id}/attempts"): "200",
        ("post", "/v1/webhooks/{id}/events/{event_id}/replay"): "202",
        ("post", "/v1/webhooks/{id}/replay"): "202",
        ("post", "/v1/webhooks/{id}/test"): "202",
        ("post", "/v1/webhooks/{id}/rotate-secret"): "200",
    }
    for (method, path), status in routes.items():
        operation = doc["paths"][path][method]
        assert operation["x-scope"] == "webhooks:manage", path
        assert status in operation["responses"], (method, path)
        assert "404" in operation["responses"], (method, path)
    created = doc["components"]["schemas"]["CreatedWebhook"]
    assert "signing_secret" in created["required"]
    for name in ("Webhook", "WebhookSummary", "UpdatedWebhook"):
        assert "signing_secret" not in doc["components"]["schemas"][name]["properties"]
    # Literal segments are not webhook ids: /v1/webhooks/{id}/test is no event replay.
    match = api.match("POST", "/v1/webhooks/wh_1/events/evt_1/replay")
    assert match is not None and match.params == {"id": "wh_1", "event_id": "evt_1"}
