"""Signed webhooks end to end, for both variants, on real anvil and both stores.

A gateway (keys on, follower and indexer on) follows a devnet of this module's own; webhooks
are created through the REST API and point at an HTTPS receiver on loopback whose
certificate comes from a trustme CA.  Chain activity — an ERC-20 transfer, a native send, an
ERC-721 and an ERC-1155 mint, a contract interaction, an internal transfer made by a smart
account, a pending transaction — must reach each webhook whose filter it matches, and every
delivery must verify: the Standard Webhooks headers with the ``standardwebhooks`` package
(code we did not write), the variant's own header by hand with ``hmac``.

Then the chain is reorganised under delivered events (``anvil_reorg``): each comes back as a
compensating event, in order, carrying the original's id.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from standardwebhooks.webhooks import Webhook

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.gateway import Gateway
from chaingate.outbound import Fetcher, OutboundPolicy, TcpConnector
from chaingate.store import open_store
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.test_auth import PEPPER
from tests.webhook_receiver import Received, Receiver, tls_pair

NET = "ethereum/devnet"
ETH = 10**18
TRANSFER_TOPIC = abi.event_topic("Transfer(address,address,uint256)")


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """A devnet of this module's own: its blocks are mined on demand and reorganised."""
    with AnvilProcess() as node:
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
        )
        yield node, manifest


def rpc(node: AnvilProcess, method: str, *params: Any) -> Any:
    with DevnetRpc(node.url) as client:
        return client.call(method, *params)


def send(node: AnvilProcess, sender: str, to: str | None, data: bytes = b"", value: int = 0) -> str:
    tx: dict[str, Any] = {"from": sender, "data": "0x" + data.hex(), "gas": hex(1_000_000)}
    if to is not None:
        tx["to"] = to
    if value:
        tx["value"] = hex(value)
    tx_hash: str = rpc(node, "eth_sendTransaction", tx)
    if not rpc(node, "anvil_getAutomine"):
        return tx_hash  # the test mines it
    # anvil answers a send before its block is the chain's head: wait until it is.
    deadline = time.monotonic() + 10
    while rpc(node, "eth_getTransactionReceipt", tx_hash) is None:
        assert time.monotonic() < deadline, f"{tx_hash} not mined"
        time.sleep(0.01)
    return tx_hash


def topic(address: str) -> str:
    return "0x" + "0" * 24 + address[2:].lower()


class Hooks:
    """The gateway, the receiver and the keys of one run."""

    def __init__(
        self,
        gateway: Gateway,
        receiver: Receiver,
        key: str,
        node: AnvilProcess,
        manifest: Manifest,
    ) -> None:
        self.handle = GatewayHandle(gateway, io.BytesIO())
        self.gateway = gateway
        self.receiver = receiver
        self.key = key
        self.node = node
        self.manifest = manifest
        self.secrets: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.receiver.port}/hooks"

    async def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        async with self.handle.client(headers={"X-API-Key": self.key}) as client:
            return await client.request(method, path, json=body)

    async def create(self, event_type: str, config: dict[str, Any], **extra: Any) -> str:
        answer = await self.request(
            "POST",
            "/v1/webhooks",
            {"url": self.url, "chain": "ethereum", "event_type": event_type, "config": config}
            | extra,
        )
        assert answer.status_code == 201, answer.text
        created = answer.json()
        assert created["status"] == "active" and created["signing_secret"].startswith("whsec_")
        self.secrets[created["id"]] = created["signing_secret"]
        return str(created["id"])

    async def matched_through_head(self) -> int:
        """Until the webhook matcher has matched the node's head; that head."""
        head = int(rpc(self.node, "eth_blockNumber"), 16)
        assert self.gateway.webhooks is not None
        matcher = self.gateway.webhooks.matchers[NET]
        with trio.fail_after(20):
            while matcher.cursor is None or matcher.cursor[0] < head:
                await trio.sleep(0.02)
        return head

    def deliveries(self, webhook_id: str) -> list[Received]:
        return [r for r in self.receiver.received if webhook_of(r) == webhook_id]


def webhook_of(received: Received) -> str | None:
    body = received.json()
    hook = body.get("webhook_id") or body.get("webhookId")
    return str(hook) if hook is not None else None


def verify(variant: str, received: Received, secret: str) -> dict[str, Any]:
    """Check a delivery's signatures — the Standard Webhooks headers with the standardwebhooks
    package, the variant's own header by hand — and return its body."""
    headers = received.headers
    body = received.body
    Webhook(secret).verify(body, headers)  # raises on a bad signature or timestamp
    if variant == "a":
        timestamp = headers["x-service-timestamp"]
        expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
        assert expected.hexdigest() in headers["x-service-signature"].split(",")
    else:
        expected = hmac.new(secret.encode(), body, hashlib.sha256)
        values = [v.strip() for v in headers["x-cloud-signature"].split(",")]
        assert f"sha256={expected.hexdigest()}" in values
        decoded = received.json()
        assert headers["x-webhook-idempotency-key"] == decoded["id"]
        assert headers["x-webhook-event"] == decoded["type"]
    assert headers["content-type"].startswith("application/json")
    assert headers["webhook-id"] == received.json()["id"]
    decoded_body: dict[str, Any] = received.json()
    return decoded_body


@pytest.fixture(params=["a", "b"])
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def hooks(
    nursery: trio.Nursery,
    chain: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    store_url: str,
    variant: str,
) -> Hooks:
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    server_tls, client_tls = tls_pair()
    receiver = Receiver()
    await nursery.start(receiver.serve, server_tls)
    head = int(rpc(node, "eth_blockNumber"), 16)
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "finality_depth": 2,
            "block_time": 1.0,
            "manifest": str(manifest_path),
            # Follow from the current head: this run's webhooks see this run's blocks.
            "follower": {"enabled": True, "poll_interval": 0.02, "start_block": head},
            "indexer": {"enabled": True, "batch_seconds": 0.05},
        },
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": store_url},
        webhooks={"variant": variant, "poll_interval": 0.05},
        data_dir=str(tmp_path),
    )
    fetcher = Fetcher(OutboundPolicy.dev(), connector=TcpConnector(client_tls))
    gateway = Gateway(
        settings,
        access_stream=io.BytesIO(),
        outbound_policy=OutboundPolicy.dev(),
        webhook_fetcher=fetcher,
    )
    await nursery.start(gateway.run)
    store = open_store(settings.store.url, tmp_path)
    async with store:
        account = await admin.ensure_account(AuthRows(store), "hooks@example.com", "enterprise")
        key, _ = await admin.create_key(
            AuthRows(store), PEPPER.encode(), account.id, "hooks", "test", admin.parse_scopes("")
        )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    run = Hooks(gateway, receiver, key, node, manifest)
    await run.matched_through_head()
    return run


async def test_every_event_type_is_delivered_signed_and_verifiable(
    hooks: Hooks, variant: str
) -> None:
    node, manifest = hooks.node, hooks.manifest
    deployer = manifest.deployer
    a1, a2 = manifest.accounts[1], manifest.accounts[2]
    watched = manifest.accounts[6]
    cgt = manifest.address("erc20_cgt")
    nft = manifest.address("erc721_collection")
    items = manifest.address("erc1155_items")
    factory = manifest.address("simple_account_factory_v07")
    names = {
        "a": {
            "activity": "address_activity",
            "token": "token_transfer",
            "nft": "nft_transfer",
            "mined": "mined_transaction",
            "log": "log",
        },
        "b": {
            "activity": "ADDRESS_ACTIVITY",
            "token": "TOKEN_TRANSFER",
            "nft": "NFT_ACTIVITY",
            "mined": "MINED_TRANSACTION",
            "internal": "INTERNAL_TRANSFER",
            "block": "NEW_BLOCK",
            "pending": "PENDING_TRANSACTION",
        },
    }[variant]
    ids: dict[str, str] = {}
    ids["activity"] = await hooks.create(names["activity"], {"addresses": [watched]})
    ids["token"] = await hooks.create(names["token"], {"addresses": [watched]})
    ids["nft"] = await hooks.create(names["nft"], {"addresses": [watched]})
    if variant == "a":
        ids["log"] = await hooks.create(
            names["log"], {"addresses": [cgt], "topics": [TRANSFER_TOPIC, None, topic(watched)]}
        )
    else:
        ids["internal"] = await hooks.create(names["internal"], {"addresses": [a2]})
        ids["block"] = await hooks.create(names["block"], {})
        ids["pending"] = await hooks.create(names["pending"], {"addresses": [watched]})

    # A transaction that is pending while its webhook is created, then mined.
    rpc(node, "evm_setAutomine", False)
    try:
        native = send(node, a1, watched, value=ETH)
        ids["mined"] = await hooks.create(names["mined"], {"transaction_hashes": [native]})
        if variant == "b":
            # The pending transaction reaches PENDING_TRANSACTION before it is mined.
            with trio.fail_after(20):
                while not hooks.deliveries(ids["pending"]):
                    await hooks.receiver.changed.wait()
        rpc(node, "evm_mine")
    finally:
        rpc(node, "evm_setAutomine", True)
    # The deployer holds most of the supply: every run of this module's chain can send.
    erc20 = send(
        node, deployer, cgt, abi.encode_call("transfer(address,uint256)", watched, 5 * ETH)
    )
    minted = send(node, deployer, nft, abi.encode_call("mint(address,string)", watched, "ipfs://x"))
    item = send(
        node,
        deployer,
        items,
        abi.encode_call("mint(address,uint256,uint256,string)", watched, 7, 3, ""),
    )
    interaction = send(node, watched, cgt, abi.encode_call("approve(address,uint256)", a1, 1))
    # A smart account of `watched` forwards ETH to a2: an internal transfer.
    send(node, watched, factory, abi.encode_call("createAccount(address,uint256)", watched, 0))
    raw = rpc(
        node,
        "eth_call",
        {
            "to": factory,
            "data": "0x" + abi.encode_call("getAddress(address,uint256)", watched, 0).hex(),
        },
    )
    account = "0x" + raw[-40:]
    send(node, watched, account, value=ETH)
    inner = send(
        node, watched, account, abi.encode_call("execute(address,uint256,bytes)", a2, 1234, b"")
    )
    await hooks.matched_through_head()

    expected = {
        "activity": {native, erc20, minted, item, interaction},
        "token": {erc20},
        "nft": {minted, item},
        "mined": {native},
    }
    if variant == "a":
        expected["log"] = {erc20}
    else:
        expected["internal"] = {inner}
    with trio.fail_after(30):
        while True:
            seen = {
                name: {
                    tx_hash_of(hooks.deliveries(hook_id)[i].json())
                    for i in range(len(hooks.deliveries(hook_id)))
                }
                for name, hook_id in ids.items()
                if name in expected
            }
            if all(expected[name] <= seen.get(name, set()) for name in expected):
                break
            await hooks.receiver.changed.wait()

    for hook_id in ids.values():
        for received in hooks.deliveries(hook_id):
            body = verify(variant, received, hooks.secrets[hook_id])
            assert body["id"].startswith("evt_")
    # Spec-given payloads, field by field.
    token_body = hooks.deliveries(ids["token"])[0].json()
    if variant == "a":
        assert token_body["event_type"] == "token_transfer"
        data = token_body["data"]
        assert data["tx_hash"] == erc20 and data["value"] == str(5 * ETH)
        assert data["contract"].lower() == cgt.lower() and data["to"].lower() == watched.lower()
        assert data["symbol"] == "CGT" and data["decimals"] == 18
        assert isinstance(data["block_number"], int) and data["chain"] == "ethereum"
        activity = [r.json()["data"] for r in hooks.deliveries(ids["activity"])]
        incoming = [d for d in activity if d["tx_hash"] == native]
        assert incoming and incoming[0]["direction"] == "incoming"
        assert incoming[0]["value"] == str(ETH) and incoming[0]["contract"] is None
        nfts = {
            r.json()["data"]["standard"]: r.json()["data"] for r in hooks.deliveries(ids["nft"])
        }
        assert nfts["ERC1155"]["quantity"] == 3 and nfts["ERC1155"]["token_id"] == "7"
        assert nfts["ERC721"]["quantity"] == 1
    else:
        assert token_body["type"] == "TOKEN_TRANSFER" and token_body["chainId"] == 31337
        data = token_body["data"]
        assert data["transactionHash"] == erc20 and data["value"] == str(5 * ETH)
        assert data["token"]["symbol"] == "CGT" and data["token"]["decimals"] == 18
        assert data["valueFormatted"] in ("5", "5.0")
        assert isinstance(data["logIndex"], int)
        blocks = hooks.deliveries(ids["block"])
        assert blocks, "NEW_BLOCK delivered every block"


def tx_hash_of(body: dict[str, Any]) -> str | None:
    data = body.get("data") or {}
    for name in ("tx_hash", "transactionHash", "hash"):
        if isinstance(data.get(name), str):
            return str(data[name])
    transaction = data.get("transaction")
    if isinstance(transaction, dict) and isinstance(transaction.get("hash"), str):
        return str(transaction["hash"])
    return None


async def test_a_reorg_takes_delivered_events_back_in_order(hooks: Hooks, variant: str) -> None:
    node, manifest = hooks.node, hooks.manifest
    watched = manifest.accounts[7]
    cgt = manifest.address("erc20_cgt")
    name = "token_transfer" if variant == "a" else "TOKEN_TRANSFER"
    hook_id = await hooks.create(name, {"addresses": [watched]})
    first = send(
        node, manifest.deployer, cgt, abi.encode_call("transfer(address,uint256)", watched, 1)
    )
    second = send(
        node, manifest.deployer, cgt, abi.encode_call("transfer(address,uint256)", watched, 2)
    )
    await hooks.matched_through_head()
    with trio.fail_after(20):
        while len(hooks.deliveries(hook_id)) < 2:
            await hooks.receiver.changed.wait()
    originals = [r.json() for r in hooks.deliveries(hook_id)]
    assert {tx_hash_of(b) for b in originals} == {first, second}
    # Both blocks leave the chain (replaced by two empty ones).
    rpc(node, "anvil_reorg", 2, [])
    await hooks.matched_through_head()
    with trio.fail_after(20):
        while len(hooks.deliveries(hook_id)) < 4:
            await hooks.receiver.changed.wait()
    bodies = [r.json() for r in hooks.deliveries(hook_id)]
    removals = bodies[2:]
    for removal in removals:
        assert removal["removed"] is True
        assert removal["id"] not in {b["id"] for b in originals}
    original_ref = "original_id" if variant == "a" else "originalId"
    assert {r[original_ref] for r in removals} == {b["id"] for b in originals}
    # Sequence numbers keep growing: the removals come after what they take back.
    sequences = [b["sequence"] for b in bodies]
    assert sequences == sorted(sequences) and len(set(sequences)) == 4
    for received in hooks.deliveries(hook_id):
        verify(variant, received, hooks.secrets[hook_id])


async def test_confirmations_hold_events_and_a_shallow_reorg_cancels_them_unsent(
    hooks: Hooks, variant: str
) -> None:
    node, manifest = hooks.node, hooks.manifest
    watched = manifest.accounts[9]
    cgt = manifest.address("erc20_cgt")
    name = "token_transfer" if variant == "a" else "TOKEN_TRANSFER"
    hook_id = await hooks.create(name, {"addresses": [watched]}, confirmations=2)
    call = abi.encode_call("transfer(address,uint256)", watched, 3)
    kept = send(node, manifest.deployer, cgt, call)
    await hooks.matched_through_head()
    await trio.sleep(0.3)
    assert not hooks.deliveries(hook_id), "held until 2 blocks deep"
    rpc(node, "evm_mine")
    rpc(node, "evm_mine")
    await hooks.matched_through_head()
    with trio.fail_after(20):
        while not hooks.deliveries(hook_id):
            await hooks.receiver.changed.wait()
    assert [tx_hash_of(r.json()) for r in hooks.deliveries(hook_id)] == [kept]
    # A transfer whose block leaves the chain before it is 2 deep: never sent, cancelled.
    dropped = send(node, manifest.deployer, cgt, call)
    await hooks.matched_through_head()
    rpc(node, "anvil_reorg", 1, [])
    for _ in range(3):
        rpc(node, "evm_mine")
    await hooks.matched_through_head()
    await trio.sleep(0.5)
    assert [tx_hash_of(r.json()) for r in hooks.deliveries(hook_id)] == [kept]
    events = (await hooks.request("GET", f"/v1/webhooks/{hook_id}/events")).json()["events"]
    states = {
        e["state"]
        for e in events
        if e["body"]["data"].get("tx_hash", e["body"]["data"].get("transactionHash")) == dropped
    }
    assert states == {"cancelled"}
