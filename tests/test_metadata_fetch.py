"""NFT and collection metadata end to end: real anvil, real HTTPS, a stand-in IPFS gateway.

* HTTPS: a local server with a certificate for ``metadata.chaingate.localhost`` from a trustme
  CA (the devnet's https token URIs name that host); the fetcher resolves the name to loopback
  and routes port 443 to the server — the dev setting (``OutboundPolicy.dev()``).
* IPFS: ``IpfsGatewayStub`` — a **stub** (no IPFS node runs here): a loopback HTTP server that
  serves bytes under ``/ipfs/<cid>``, every CID computed from the bytes it names.  A second
  gateway that accepts and never answers, and one that answers 500, stand before it.

Every test asserts what a client would see through ``MetadataService``: the fields, the status
with its reason, the URL the fetcher asked for.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
from typing import Any

import pytest
import trio
import trustme

from chaingate.devnet import demo
from chaingate.evm import abi
from chaingate.metadata.cid import is_cid
from chaingate.metadata.service import MetadataService
from chaingate.metadata.store import MetaRows
from chaingate.metadata.uris import token_id_hex
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.store import Store
from tests.test_metadata_devnet import (
    UPDATABLE_CONTRACT_DOC,
    Clock,
    MetaDevnet,
    chain,
    meta_devnet,
    send,
    start_service,
    store,
)
from tests.test_outbound_support import (
    Handler,
    HttpServer,
    RecordingConnector,
    SeenRequest,
    StaticResolver,
    reply,
)

__all__ = ["chain", "meta_devnet", "store"]  # fixtures shared with test_metadata_devnet

HOST = "metadata.chaingate.localhost"
GATEWAY = "https://gateway.example"  # image_gateway_url's form (never fetched)
ARWEAVE = "https://arweave.example"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
ZERO_V0 = "QmNLei78zWmzUdbeRB3CiUfAizWUrbeeZh5K1rhAQKCh51"  # CIDv0 of a zero digest


def base58(data: bytes) -> str:
    value = int.from_bytes(data, "big")
    out = ""
    while value:
        value, digit = divmod(value, 58)
        out = _B58[digit] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def json_doc(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


class IpfsGatewayStub:
    """Stand-in for an IPFS HTTP gateway (stub).  ``add`` returns the CID of the bytes:
    CIDv1 raw/sha2-256 (base32), or with ``v0`` a CIDv0 (base58 sha2-256 multihash).
    ``add_directory`` serves files under ``/ipfs/<dir cid>/<name>``, the CID a CIDv1
    dag-pb over the sorted listing's digest (shaped like a directory's, computed not real)."""

    def __init__(self) -> None:
        self.server = HttpServer({})
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> IpfsGatewayStub:
        await self.server.start(nursery)
        self.url = f"http://127.0.0.1:{self.server.port}"
        return self

    def _serve(self, path: str, content: bytes) -> None:
        self.server.routes[path] = reply(body=content)

    def add(self, content: bytes, *, v0: bool = False) -> str:
        digest = hashlib.sha256(content).digest()
        if v0:
            cid = base58(b"\x12\x20" + digest)
        else:
            raw = bytes([0x01, 0x55, 0x12, 0x20]) + digest
            cid = "b" + base64.b32encode(raw).decode().lower().rstrip("=")
        self._serve(f"/ipfs/{cid}", content)
        return cid

    def add_directory(self, files: dict[str, bytes]) -> str:
        listing = b"".join(
            name.encode() + b"\0" + hashlib.sha256(body).digest()
            for name, body in sorted(files.items())
        )
        raw = bytes([0x01, 0x70, 0x12, 0x20]) + hashlib.sha256(listing).digest()
        cid = "b" + base64.b32encode(raw).decode().lower().rstrip("=")
        for name, body in files.items():
            self._serve(f"/ipfs/{cid}/{name}", body)
        return cid

    @property
    def requests(self) -> list[SeenRequest]:
        return self.server.requests


async def hang(request: SeenRequest, stream: trio.abc.Stream) -> None:
    await trio.sleep_forever()


class Servers:
    def __init__(self, https: HttpServer, ipfs: IpfsGatewayStub, hanging: HttpServer) -> None:
        self.https = https
        self.ipfs = ipfs
        self.hanging = hanging

    def route(self, path: str, handler: Handler) -> None:
        self.https.routes[path] = handler

    def targets(self) -> list[str]:
        return [r.target for r in self.https.requests]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture
async def servers(nursery: trio.Nursery, ca: trustme.CA) -> Servers:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    https = await HttpServer({}, ssl_context=context).start(nursery)
    ipfs = await IpfsGatewayStub().start(nursery)
    hanging = await HttpServer({}).start(nursery)
    return Servers(https, ipfs, hanging)


def fetcher_for(servers: Servers, client_context: ssl.SSLContext) -> Fetcher:
    """The dev setting; the devnet's metadata host resolves to loopback, port 443 → our server."""
    return Fetcher(
        OutboundPolicy.dev(),
        resolver=StaticResolver({HOST: ["127.0.0.1"]}),
        connector=RecordingConnector(
            {("127.0.0.1", 443): servers.https.port},
            ssl_context=client_context,
            pass_loopback=True,
        ),
    )


async def service_for(
    nursery: trio.Nursery,
    devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    **settings: Any,
) -> MetadataService:
    settings.setdefault("ipfs_gateways", [servers.ipfs.url])
    settings.setdefault("image_gateway", GATEWAY)
    settings.setdefault("arweave_gateway", ARWEAVE)
    settings.setdefault("gateway_timeout", 1.0)
    return await start_service(
        nursery, devnet, store, fetcher=fetcher_for(servers, client_context), **settings
    )


def one(url: str, to: str, signature: str, returns: str, *args: Any) -> Any:
    from chaingate.devnet.rpc import DevnetRpc

    with DevnetRpc(url) as rpc:
        data = rpc.call(
            "eth_call",
            {"to": to, "input": "0x" + abi.encode_call(signature, *args).hex()},
            "latest",
        )
    return abi.decode([returns], bytes.fromhex(data[2:]))[0]


@pytest.fixture
def devnet_docs(servers: Servers) -> None:
    """The documents the devnet's URIs name, served where they point."""
    # Collection token 2: ipfs://<CIDv1 of the document demo.py wrote>.
    servers.ipfs.add(demo._metadata("Devnet #2", "Metadata on IPFS.", "#1aa36f"))
    servers.route(
        "/devnet/collection/3.json",
        reply(
            body=json_doc(
                name="Devnet #3",
                description="Metadata over https.\nSecond line.",
                image=f"ipfs://ipfs/{ZERO_V0}/img.png",
                attributes=[
                    {"trait_type": "Level", "value": 5},
                    {"trait_type": "Ratio", "value": 1.50},
                    {"trait_type": "Shiny", "value": True},
                    {"trait_type": "Meta", "value": {"a": [1, 2]}},
                    {"value": "Bare"},
                    {"trait_type": "Nothing", "value": None},
                ],
            ).replace(b":1.5}", b":1.50}")  # a decimal exactly as some servers write it
        ),
    )


# --- the IPFS stub is honest --------------------------------------------------------------


async def test_ipfs_stub_serves_bytes_by_their_own_cid(nursery: trio.Nursery) -> None:
    stub = await IpfsGatewayStub().start(nursery)
    document = b'{"name":"x"}'
    v1, v0 = stub.add(document), stub.add(document, v0=True)
    assert is_cid(v1) and is_cid(v0) and v0.startswith("Qm") and len(v0) == 46
    assert v1 == demo.ipfs_uri(document).removeprefix("ipfs://")  # the devnet's own CIDs
    fetcher = Fetcher(OutboundPolicy.dev())
    for cid in (v1, v0):
        response = await fetcher.get(f"{stub.url}/ipfs/{cid}")
        assert response.status == 200
        assert hashlib.sha256(response.body).digest() == hashlib.sha256(document).digest()
    assert (await fetcher.get(f"{stub.url}/ipfs/{v1}x")).status == 404


# --- token documents ------------------------------------------------------------------------


async def test_collection_metadata_from_data_ipfs_and_https(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    devnet_docs: None,
) -> None:
    service = await service_for(nursery, meta_devnet, store, servers, client_context)
    collection = meta_devnet.address("erc721_collection")
    first = await service.nft(collection, 1, wait=15)
    assert (first.status, first.standard, first.name) == ("ok", "ERC721", "Devnet #1")
    assert first.token_uri and first.token_uri.startswith("data:application/json;base64,…")
    assert first.image_url and first.image_url.startswith("data:image/svg+xml;base64,")
    assert first.image_gateway_url == first.image_url  # a data: image is its own URL
    second = await service.nft(collection, 2, wait=15)
    assert (second.status, second.name, second.description) == (
        "ok",
        "Devnet #2",
        "Metadata on IPFS.",
    )
    assert [r.target for r in servers.ipfs.requests] == [
        "/ipfs/" + (second.token_uri or "").removeprefix("ipfs://")
    ]
    third = await service.nft(collection, 3, wait=15)
    assert third.status == "ok", third.last_error
    assert servers.targets() == ["/devnet/collection/3.json"]
    assert third.description == "Metadata over https.\nSecond line."
    cid_v0 = ZERO_V0
    assert cid_v0 == base58(b"\x12\x20" + bytes(32))
    assert third.image_url == f"ipfs://ipfs/{cid_v0}/img.png"
    assert third.image_gateway_url == f"{GATEWAY}/ipfs/{cid_v0}/img.png"
    assert [(t.trait_type, t.value) for t in third.traits] == [
        ("Level", "5"),
        ("Ratio", "1.50"),
        ("Shiny", "true"),
        ("Meta", '{"a":[1,2]}'),
        ("", "Bare"),
    ]
    # Burned token: tokenURI reverts — failed, with the reason and a retry scheduled.
    burned = await service.nft(collection, 4, wait=15)
    assert burned.status == "failed" and "tokenURI reverted" in (burned.last_error or "")
    assert burned.next_retry_at is not None and burned.attempts == 1


async def test_erc1155_uri_gets_the_lowercase_64_hex_id(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
) -> None:
    items = meta_devnet.address("erc1155_items")
    template = one(meta_devnet.node.url, items, "uri(uint256)", "string", 2)
    assert template.endswith("/items/{id}.json")  # the contract answers the raw template
    id_hex = "0" * 63 + "2"
    servers.route(
        f"/devnet/items/{id_hex}.json",
        reply(body=json_doc(name="Item 2", image=f"{demo.METADATA_HOST}/items/{{id}}.png")),
    )
    service = await service_for(nursery, meta_devnet, store, servers, client_context)
    item = await service.nft(items, 2, wait=15)
    assert (item.status, item.standard, item.name) == ("ok", "ERC1155", "Item 2")
    assert servers.targets() == [f"/devnet/items/{id_hex}.json"]
    assert item.token_uri == f"{demo.METADATA_HOST}/items/{id_hex}.json"
    assert item.image_url == f"{demo.METADATA_HOST}/items/{id_hex}.png"  # {id} in the JSON too
    # An id above 15 and with hex letters: still lowercase and zero-padded, never decimal.
    big = 0xABCDEF
    servers.route(
        f"/devnet/items/{token_id_hex(big)}.json", reply(body=json_doc(name="Item abcdef"))
    )
    assert (await service.nft(items, big, wait=15)).name == "Item abcdef"
    assert servers.targets()[-1] == f"/devnet/items/{'0' * 58}abcdef.json"
    own = await service.nft(items, 1, wait=15)  # an id with its own data: URI
    assert (own.status, own.name) == ("ok", "Devnet item 1")


async def test_a_hanging_or_failing_gateway_falls_over_to_the_next(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    devnet_docs: None,
) -> None:
    servers.hanging.routes = {}
    failing = await HttpServer({}).start(nursery)
    document = demo._metadata("Devnet #2", "Metadata on IPFS.", "#1aa36f")
    cid = servers.ipfs.add(document)
    failing.routes[f"/ipfs/{cid}"] = reply(500, b"gateway error")
    servers.hanging.routes[f"/ipfs/{cid}"] = hang
    gateways = [
        f"http://127.0.0.1:{servers.hanging.port}",
        f"http://127.0.0.1:{failing.port}",
        servers.ipfs.url,
    ]
    service = await service_for(
        nursery, meta_devnet, store, servers, client_context, ipfs_gateways=gateways
    )
    started = trio.current_time()
    nft = await service.nft(meta_devnet.address("erc721_collection"), 2, wait=15)
    elapsed = trio.current_time() - started
    assert (nft.status, nft.name) == ("ok", "Devnet #2")
    assert [len(s.requests) for s in (servers.hanging, failing)] == [1, 1]
    assert len(servers.ipfs.requests) == 1
    assert 1.0 <= elapsed < 10  # one gateway timeout (1 s), not the hanging server's forever
    # Every gateway failing on a refresh: the data stays served (stale), each gateway's
    # reason is kept, by origin only.
    servers.ipfs.server.routes.clear()
    key = (meta_devnet.address("erc721_collection").lower(), token_id_hex(2))
    events = service.refresher.watch([key])
    assert (await service.request_refresh(key[0], 2)).status == "accepted"
    await service.refresher.wait(events, 15)
    nft = await service.nft(key[0], 2)
    assert (nft.status, nft.name, nft.attempts) == ("stale", "Devnet #2", 1)
    error = nft.last_error or ""
    assert "timeout" in error and "HTTP 500" in error and "HTTP 404" in error, error
    assert cid not in error


# --- failures, retries and refreshes ----------------------------------------------------------


async def test_a_failure_is_retried_on_schedule_and_not_remembered(
    nursery: trio.Nursery,
    chain: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
) -> None:
    servers.route("/devnet/updatable/1", reply(503, b"busy"))
    clock = Clock()
    service = await service_for(
        nursery,
        chain,
        store,
        servers,
        client_context,
        clock=clock,
        retry_schedule=[30, 600],
        max_attempts=2,
    )
    updatable = chain.address("erc721_updatable")
    failed = await service.nft(updatable, 1, wait=15)
    assert (failed.status, failed.attempts) == ("failed", 1)
    assert "HTTP 503" in (failed.last_error or "")
    assert failed.next_retry_at == pytest.approx(service.now_ms() + 30_000, abs=2_000)
    # Asking again before the retry is due fetches nothing.
    assert (await service.nft(updatable, 1, wait=0.5)).attempts == 1
    assert servers.targets() == ["/devnet/updatable/1"]
    # The second (and last automatic) attempt fails too: nothing scheduled any more.
    events = service.refresher.watch([(updatable.lower(), token_id_hex(1))])
    clock.advance(31)
    service.refresher.poke()
    await service.refresher.wait(events, 15)
    spent = await service.nft(updatable, 1)
    assert (spent.status, spent.attempts, spent.next_retry_at) == ("failed", 2, None)
    # The server is fixed.  A client asking after the longest retry delay gets a new attempt.
    servers.route("/devnet/updatable/1", reply(body=json_doc(name="Updatable #1")))
    clock.advance(601)
    fixed = await service.nft(updatable, 1, wait=15)
    assert (fixed.status, fixed.name, fixed.attempts, fixed.last_error) == (
        "ok",
        "Updatable #1",
        0,
        None,
    )
    assert len(servers.targets()) == 3


async def test_owned_lists_read_the_cache_and_never_fetch_on_the_request(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    devnet_docs: None,
) -> None:
    release = trio.Event()

    async def slow(request: SeenRequest, stream: trio.abc.Stream) -> None:
        await release.wait()
        await reply(body=json_doc(name="Devnet #3 (slow)"))(request, stream)

    servers.route("/devnet/collection/3.json", slow)
    service = await service_for(nursery, meta_devnet, store, servers, client_context)
    collection = meta_devnet.address("erc721_collection")
    keys = [(collection, 1), (collection, 3)]
    with trio.fail_after(2):  # a request never waits on a metadata server
        first = await service.cached_nfts(keys)
    assert [first[k].status for k in keys] == ["pending", "pending"]
    # In the background: the data: one completes, the slow server's waits.
    with trio.fail_after(15):
        while (await service.cached_nfts(keys))[keys[0]].status != "ok":
            await trio.sleep(0.05)
    assert (await service.cached_nfts(keys))[keys[1]].status == "pending"
    with trio.fail_after(15):  # its fetch may not have reached the server yet
        while not servers.targets():
            await trio.sleep(0.02)
    assert servers.targets() == ["/devnet/collection/3.json"]  # asked once, still waiting
    release.set()
    with trio.fail_after(15):
        while (await service.cached_nfts(keys))[keys[1]].status != "ok":
            await trio.sleep(0.05)
    assert (await service.cached_nfts(keys))[keys[1]].name == "Devnet #3 (slow)"


async def test_collection_document_from_contract_uri(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
) -> None:
    servers.ipfs.add(UPDATABLE_CONTRACT_DOC)
    service = await service_for(nursery, meta_devnet, store, servers, client_context)
    updatable = await service.collection(meta_devnet.address("erc721_updatable"), wait=15)
    assert (updatable.status, updatable.standard, updatable.name, updatable.symbol) == (
        "ok",
        "ERC721",
        "Chaingate Updatable",  # on-chain name() first
        "CGUP",
    )
    assert updatable.description == "A collection whose metadata changes."
    image_cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    assert updatable.image_gateway_url == f"{GATEWAY}/ipfs/{image_cid}"
    tx = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFG"
    assert (updatable.banner_url, updatable.banner_gateway_url) == (
        f"ar://{tx}",
        f"{ARWEAVE}/{tx}",
    )
    assert updatable.external_url == "https://example.org/updatable"
    # No contractURI(): nothing failed, there is just no document.
    plain = await service.collection(meta_devnet.address("erc721_collection"), wait=15)
    assert (plain.status, plain.name, plain.description, plain.last_error) == (
        "ok",
        "Chaingate Devnet Collection",
        None,
        None,
    )
    items = await service.collection(meta_devnet.address("erc1155_items"), wait=15)
    assert (items.standard, items.status) == ("ERC1155", "ok")


async def test_erc4906_events_refresh_the_tokens_they_name(
    nursery: trio.Nursery,
    chain: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
) -> None:
    for i in (1, 2):
        servers.route(f"/devnet/updatable/{i}", reply(body=json_doc(name=f"v1 #{i}")))
    service = await service_for(nursery, chain, store, servers, client_context)
    updatable = chain.address("erc721_updatable")
    assert [(await service.nft(updatable, i, wait=15)).name for i in (1, 2)] == ["v1 #1", "v1 #2"]
    # setTokenURI emits MetadataUpdate(1); the indexer hands the event's id to the hook.
    servers.route("/devnet/v2/1.json", reply(body=json_doc(name="v2 #1")))
    receipt = send(
        chain.node.url,
        chain.manifest.deployer,
        updatable,
        "setTokenURI(uint256,string)",
        1,
        f"{demo.METADATA_HOST}/v2/1.json",
    )
    (log,) = receipt["logs"]
    assert log["topics"][0] == abi.event_topic("MetadataUpdate(uint256)")
    (token_id,) = abi.decode(["uint256"], bytes.fromhex(log["data"][2:]))
    events = service.refresher.watch([(updatable.lower(), token_id_hex(1))])
    assert await service.on_metadata_update(updatable, token_id) == 1
    stale = await service.nft(updatable, 1)
    assert (stale.status, stale.name) in {("stale", "v1 #1"), ("ok", "v2 #1")}
    await service.refresher.wait(events, 15)
    assert (await service.nft(updatable, 1)).name == "v2 #1"
    assert (await service.nft(updatable, 2)).name == "v1 #2"  # not named by the event
    # setBaseURI emits BatchMetadataUpdate(1, 2): both are fetched again.
    servers.route("/devnet/v3/2", reply(body=json_doc(name="v3 #2")))
    receipt = send(
        chain.node.url,
        chain.manifest.deployer,
        updatable,
        "setBaseURI(string)",
        f"{demo.METADATA_HOST}/v3/",
    )
    (log,) = receipt["logs"]
    assert log["topics"][0] == abi.event_topic("BatchMetadataUpdate(uint256,uint256)")
    first, last = abi.decode(["uint256", "uint256"], bytes.fromhex(log["data"][2:]))
    assert (first, last) == (1, 2)
    keys = [(updatable.lower(), token_id_hex(i)) for i in (1, 2)]
    events = service.refresher.watch(keys)
    assert await service.on_metadata_update(updatable, first, last) == 2
    await service.refresher.wait(events, 15)
    assert [(await service.nft(updatable, i)).name for i in (1, 2)] == ["v2 #1", "v3 #2"]


async def test_refresh_requests_refetch_with_a_cool_down(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
) -> None:
    servers.route("/devnet/updatable/2", reply(body=json_doc(name="before")))
    clock = Clock()
    service = await service_for(nursery, meta_devnet, store, servers, client_context, clock=clock)
    updatable = meta_devnet.address("erc721_updatable")
    assert (await service.nft(updatable, 2, wait=15)).name == "before"
    servers.route("/devnet/updatable/2", reply(body=json_doc(name="after")))
    key = (updatable.lower(), token_id_hex(2))
    events = service.refresher.watch([key])
    asked = service.now_ms()
    assert (await service.request_refresh(updatable, 2, "acct_a")).status == "accepted"
    await service.refresher.wait(events, 15)
    assert (await service.nft(updatable, 2)).name == "after"
    again = await service.request_refresh(updatable, 2, "acct_a")
    assert (again.status, again.retry_after) == ("cooldown", 300)
    # Another account is not refused for it (issue 25): its refresh is accepted, fetched
    # where the first one cools down — the document's origin is not asked again before.
    servers.route("/devnet/updatable/2", reply(body=json_doc(name="later")))
    fetches = servers.targets().count("/devnet/updatable/2")
    other = await service.request_refresh(updatable, 2, "acct_b")
    assert other.status == "accepted"
    assert 0 <= other.due_at_ms - (asked + 300_000) < 5_000, (other, asked)
    assert (await service.request_refresh(updatable, 2, "acct_b")).status == "cooldown"
    clock.advance(120)
    service.refresher.poke()
    await trio.sleep(2.5)  # a scan or more: nothing is due yet
    assert servers.targets().count("/devnet/updatable/2") == fetches
    assert 175 <= (await service.request_refresh(updatable, 2, "acct_a")).retry_after <= 180
    events = service.refresher.watch([key])
    clock.advance(181)
    service.refresher.poke()
    await service.refresher.wait(events, 15)
    assert servers.targets().count("/devnet/updatable/2") == fetches + 1
    assert (await service.nft(updatable, 2)).name == "later"
    assert (await service.request_refresh(updatable, 2, "acct_a")).status == "accepted"
    # The whole contract: its own cool-down, an hour by default.
    assert (await service.request_refresh(updatable, None)).status == "accepted"
    whole = await service.request_refresh(updatable, None)
    assert (whole.status, whole.retry_after) == ("cooldown", 3600)


async def test_production_policy_refuses_loopback_metadata(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    devnet_docs: None,
) -> None:
    production = Fetcher(
        OutboundPolicy.production(),
        resolver=StaticResolver({HOST: ["127.0.0.1"]}),
        connector=RecordingConnector(
            {("127.0.0.1", 443): servers.https.port}, ssl_context=client_context
        ),
    )
    service = await start_service(nursery, meta_devnet, store, fetcher=production)
    nft = await service.nft(meta_devnet.address("erc721_collection"), 3, wait=15)
    assert nft.status == "failed" and "blocked_address" in (nft.last_error or "")
    assert servers.https.requests == []


async def test_https_without_the_ca_is_a_tls_failure(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    devnet_docs: None,
) -> None:
    untrusting = Fetcher(
        OutboundPolicy.dev(),
        resolver=StaticResolver({HOST: ["127.0.0.1"]}),
        connector=RecordingConnector({("127.0.0.1", 443): servers.https.port}),
    )
    service = await start_service(nursery, meta_devnet, store, fetcher=untrusting)
    nft = await service.nft(meta_devnet.address("erc721_collection"), 3, wait=15)
    assert nft.status == "failed" and "tls" in (nft.last_error or "")
    assert servers.https.requests == []


def test_demo_metadata_documents_are_what_the_chain_names(meta_devnet: MetaDevnet) -> None:
    """The documents these tests serve are the ones the devnet's URIs point at."""
    collection = meta_devnet.address("erc721_collection")
    uri = one(meta_devnet.node.url, collection, "tokenURI(uint256)", "string", 2)
    assert uri == demo.ipfs_uri(demo._metadata("Devnet #2", "Metadata on IPFS.", "#1aa36f"))
    assert one(meta_devnet.node.url, collection, "tokenURI(uint256)", "string", 3) == (
        f"{demo.METADATA_HOST}/collection/3.json"
    )


async def test_the_indexers_commits_drive_probes_and_refreshes(
    nursery: trio.Nursery,
    meta_devnet: MetaDevnet,
    store: Store,
    servers: Servers,
    client_context: ssl.SSLContext,
    devnet_docs: None,
) -> None:
    from chaingate.data.indexer import IndexCommit
    from chaingate.data.ledger import ContractRow
    from chaingate.data.store import IndexCursor
    from chaingate.data.transfers import MetadataUpdate

    service = await service_for(nursery, meta_devnet, store, servers, client_context)
    collection = meta_devnet.address("erc721_collection")
    assert (await service.nft(collection, 3, wait=15)).name == "Devnet #3"
    emitter, odd = meta_devnet.address("transfer_emitter"), meta_devnet.address("erc20_bytes32")
    servers.route("/devnet/collection/3.json", reply(body=json_doc(name="Devnet #3, again")))
    commit = IndexCommit(
        "ethereum",
        "devnet",
        IndexCursor(1, "0x" + "00" * 32),
        True,
        [ContractRow(emitter.lower(), "ERC20", 1), ContractRow(odd.lower(), "ERC20", 1)],
        [MetadataUpdate(collection.lower(), 3, 3, "erc4906", 1, "0x", "0x", 0)],
    )
    events = service.refresher.watch([(collection.lower(), token_id_hex(3))])
    await service.on_index_commit(commit)
    await service.refresher.wait(events, 15)
    assert (await service.nft(collection, 3)).name == "Devnet #3, again"
    rows = MetaRows(store)
    with trio.fail_after(15):  # probed in the background, nobody asked
        while True:
            found = await rows.load_token_rows("ethereum", "devnet", [emitter.lower(), odd.lower()])
            if all(r.status == "ok" for r in found.values()) and len(found) == 2:
                break
            await trio.sleep(0.05)
    assert found[emitter.lower()].standard is None  # Transfer logs, but no token
    assert (found[odd.lower()].standard, found[odd.lower()].symbol) == ("ERC20", "CGB32")
    assert found[emitter.lower()].standard_hint == "ERC20"
