"""The loopback IPFS gateway ``chaingate dev`` runs for the devnet's own documents."""

from __future__ import annotations

import base64
import hashlib

import httpx
import trio

from chaingate.devnet.demo import ipfs_documents
from chaingate.devnet.ipfsgateway import serve_ipfs_gateway


def test_every_document_is_named_by_its_own_content() -> None:
    documents = ipfs_documents()
    assert len(documents) == 3
    for cid, document in documents.items():
        raw = base64.b32decode(cid[1:].upper() + "=" * (-len(cid[1:]) % 8))
        assert raw[:4] == bytes([0x01, 0x55, 0x12, 0x20])  # CIDv1, raw, sha2-256
        assert raw[4:] == hashlib.sha256(document).digest()


async def test_the_gateway_serves_the_documents_and_nothing_else(nursery: trio.Nursery) -> None:
    documents = ipfs_documents()
    base = await nursery.start(serve_ipfs_gateway, documents)
    assert base.startswith("http://127.0.0.1:")
    cid, document = next(iter(documents.items()))
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        found = await client.get(f"/ipfs/{cid}")
        assert found.status_code == 200 and found.content == document
        assert found.headers["content-type"] == "application/json"
        assert (await client.get("/ipfs/bafkreiaaaa")).status_code == 404
        assert (await client.get("/etc/passwd")).status_code == 404
        assert (await client.post(f"/ipfs/{cid}", content=b"x")).status_code == 404
    # Something that is not HTTP gets the connection closed, and the gateway keeps serving.
    stream = await trio.open_tcp_stream("127.0.0.1", int(base.rsplit(":", 1)[1]))
    await stream.send_all(b"\x00\x01 not http\r\n\r\n")
    with trio.fail_after(5):
        assert await stream.receive_some(100) == b""  # closed, nothing said
    await stream.aclose()
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        assert (await client.get(f"/ipfs/{cid}")).status_code == 200
