"""The document server ``chaingate dev`` runs for the devnet's own metadata: its IPFS gateway
and its https host, reached by chaingate's own fetcher through ``DevnetHost``."""

from __future__ import annotations

import base64
import hashlib
import json

import httpx
import pytest
import trio

from chaingate.devnet import demo
from chaingate.devnet.demo import https_documents, ipfs_documents, served_documents
from chaingate.devnet.docserver import DevnetHost, serve_documents
from chaingate.outbound import Fetcher, FetchError, OutboundPolicy


def test_every_document_is_named_by_its_own_content() -> None:
    documents = ipfs_documents()
    assert len(documents) == 3
    for cid, document in documents.items():
        raw = base64.b32decode(cid[1:].upper() + "=" * (-len(cid[1:]) % 8))
        assert raw[:4] == bytes([0x01, 0x55, 0x12, 0x20])  # CIDv1, raw, sha2-256
        assert raw[4:] == hashlib.sha256(document).digest()


def test_every_https_uri_of_the_demo_has_its_document() -> None:
    """The collection's token 3, the items' {id} template (item 2 uses it) and the updatable
    collection's base URI (tokens 1 and 2): what the demo mints names only served URLs."""
    documents = https_documents()
    uris = [u for u in demo.token_uris() if u.startswith("https://")]
    uris.append(f"{demo.METADATA_HOST}/items/{{id}}.json".replace("{id}", f"{2:064x}"))
    uris += [f"{demo.METADATA_HOST}/updatable/{token_id}" for token_id in (1, 2)]
    assert sorted(uris) == sorted(documents)
    for document in documents.values():
        assert json.loads(document)["name"]


async def test_the_server_serves_the_documents_and_nothing_else(nursery: trio.Nursery) -> None:
    documents = served_documents()
    base = await nursery.start(serve_documents, documents)
    assert base.startswith("http://127.0.0.1:")
    cid, document = next(iter(ipfs_documents().items()))
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        found = await client.get(f"/ipfs/{cid}")
        assert found.status_code == 200 and found.content == document
        assert found.headers["content-type"] == "application/json"
        assert (await client.get(f"/ipfs/{cid}/")).content == document
        assert (await client.get("/devnet/collection/3.json")).status_code == 200
        assert (await client.get("/ipfs/bafkreiaaaa")).status_code == 404
        assert (await client.get("/etc/passwd")).status_code == 404
        assert (await client.post(f"/ipfs/{cid}", content=b"x")).status_code == 404
    # Something that is not HTTP gets the connection closed, and the server keeps serving.
    stream = await trio.open_tcp_stream("127.0.0.1", int(base.rsplit(":", 1)[1]))
    await stream.send_all(b"\x00\x01 not http\r\n\r\n")
    with trio.fail_after(5):
        assert await stream.receive_some(100) == b""  # closed, nothing said
    await stream.aclose()
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        assert (await client.get(f"/ipfs/{cid}")).status_code == 200


async def test_chaingate_devs_fetcher_finds_the_devnet_https_host_on_loopback(
    nursery: trio.Nursery,
) -> None:
    base = await nursery.start(serve_documents, served_documents())
    route = DevnetHost(demo.METADATA_HOSTNAME, int(base.rsplit(":", 1)[1]))
    fetcher = Fetcher(OutboundPolicy.dev(), resolver=route, connector=route)
    for url, document in https_documents().items():
        answer = await fetcher.get(url)
        assert (answer.status, answer.body) == (200, document), url
    missing = await fetcher.get(f"{demo.METADATA_HOST}/collection/99.json")
    assert missing.status == 404
    # Any other name is the system's to resolve: here, one that does not exist.
    with pytest.raises(FetchError, match="does not resolve"):
        await fetcher.get("https://no-such-host.chaingate.invalid/x.json")
    # Without the route (production's fetcher), the devnet's host is nowhere.
    with pytest.raises(FetchError):
        await Fetcher(OutboundPolicy.dev()).get(f"{demo.METADATA_HOST}/collection/3.json")
