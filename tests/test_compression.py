"""Compression: the parsed encoding headers (both twins), Accept-Encoding negotiation, gzip
answers on the HTTP paths, gzip request bodies with a cap on the inflated size, and
permessage-deflate on the WebSocket."""

from __future__ import annotations

import gzip
import json
import secrets
import tracemalloc
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.edge import compression
from chaingate.twins import Impl
from chaingate.ws import deflate
from tests.conftest import StartGateway
from tests.helpers import exchange, parse_responses, post_bytes, rpc_body
from tests.ws_clients import Client, RawClient, client_frame, handshake_bytes


def _one_request(impl: Impl, data: bytes) -> Any:
    parser = impl.http1.RequestParser()
    parser.feed(data)
    request = parser.next_event()
    assert isinstance(request, impl.http1.Request), request
    return request


def test_parser_fills_origin_and_encoding_fields(impl: Impl) -> None:
    r = _one_request(
        impl,
        b"POST / HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example\r\n"
        b"accept-encoding: gzip;q=1.0\r\nContent-Encoding:  gzip \r\nContent-Length: 0\r\n\r\n",
    )
    assert (r.origin, r.accept_encoding, r.content_encoding) == (
        b"https://app.example",
        b"gzip;q=1.0",
        b"gzip",
    )


def test_encoding_fields_default_to_none(impl: Impl) -> None:
    r = _one_request(impl, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (r.origin, r.accept_encoding, r.content_encoding) == (None, None, None)


def test_repeated_list_headers_combine_and_first_origin_wins(impl: Impl) -> None:
    r = _one_request(
        impl,
        b"GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://a\r\nOrigin: https://b\r\n"
        b"Accept-Encoding: br\r\nAccept-Encoding: gzip;q=0.5\r\n"
        b"Content-Encoding: gzip\r\nContent-Encoding: identity\r\n\r\n",
    )
    assert r.origin == b"https://a"
    assert r.accept_encoding == b"br, gzip;q=0.5"
    assert r.content_encoding == b"gzip, identity"


# --- Accept-Encoding and the choice of coding (sans-IO) -----------------------------------

JSON_HEAD = b"Content-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("accept", "best", "identity_q"),
    [
        (b"gzip", b"gzip", 1.0),
        (b"gzip, deflate", b"gzip", 1.0),
        (b"GZIP;Q=1", b"gzip", 1.0),
        (b"x-gzip", b"gzip", 1.0),
        (b"gzip;q=0", None, 1.0),
        (b"br", None, 1.0),
        (b"", None, 1.0),
        (b"*", b"zstd", 1.0),
        (b"*;q=0", None, 0.0),
        (b"*;q=0, identity", None, 1.0),
        (b"gzip, identity;q=0", b"gzip", 0.0),
        (b"gzip;q=0.5, zstd;q=0.4", b"gzip", 1.0),
        (b"gzip;q=0.4, zstd;q=0.5", b"zstd", 1.0),
        (b"gzip, deflate, br, zstd", b"zstd", 1.0),
        (b"gzip;q=2", None, 1.0),  # a malformed q-value: the element is ignored
        (b"gzip;q=0.0001", None, 1.0),
        (b"gzip ; q=0.800 , *;q=0.1", b"gzip", 0.1),
        (b"zstd;q=0, *", b"gzip", 1.0),
    ],
)
def test_accept_encoding_q_values(accept: bytes, best: bytes | None, identity_q: float) -> None:
    prefs = compression.parse_accept_encoding(accept)
    assert (prefs.best, prefs.identity_q) == (best, identity_q)


def test_small_answers_are_sent_as_they_are_and_without_vary() -> None:
    assert compression.plan(b"gzip", 200, JSON_HEAD, 1399, 1400) == (None, False)
    assert compression.plan(b"gzip", 200, JSON_HEAD, 1400, 1400) == (b"gzip", True)


def test_refused_identity_codes_even_a_small_answer() -> None:
    assert compression.plan(b"gzip, identity;q=0", 200, JSON_HEAD, 40, 1400) == (b"gzip", True)
    # Nothing acceptable at all: identity anyway (an answer beats none).
    assert compression.plan(b"br, identity;q=0", 200, JSON_HEAD, 40, 1400) == (None, False)
    assert compression.plan(b"br, identity;q=0", 200, JSON_HEAD, 4000, 1400) == (None, True)


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (200, b"Content-Type: application/json; charset=utf-8\r\n", (b"gzip", True)),
        (500, JSON_HEAD, (b"gzip", True)),  # an error document compresses like any other
        (200, b"content-type: text/plain; version=0.0.4\r\n", (b"gzip", True)),
        (200, b"Content-Type: application/problem+json\r\n", (b"gzip", True)),
        (200, b"Content-Type: image/png\r\n", (None, False)),  # already compressed
        (200, b"X-Other: 1\r\n", (None, False)),  # no type: left alone
        (200, JSON_HEAD + b"Content-Encoding: br\r\n", (None, False)),  # coded already
        (204, JSON_HEAD, (None, False)),
        (304, JSON_HEAD, (None, False)),
    ],
)
def test_which_answers_are_coded(
    status: int, headers: bytes, expected: tuple[bytes | None, bool]
) -> None:
    assert compression.plan(b"gzip", status, headers, 5000, 1400) == expected


def test_client_preferring_identity_gets_identity_with_vary() -> None:
    assert compression.plan(b"gzip;q=0.5, identity", 200, JSON_HEAD, 5000, 1400) == (None, True)


def test_compression_off_codes_nothing() -> None:
    assert compression.plan(b"gzip, identity;q=0", 200, JSON_HEAD, 5000, 0) == (None, False)


# --- request bodies (sans-IO) -------------------------------------------------------------

CAP = 1 << 20


def test_gzip_body_round_trip_and_identity() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
    assert compression.decode_body(b"gzip", gzip.compress(body), CAP) == body
    assert compression.decode_body(b"X-GZIP", gzip.compress(body), CAP) == body
    assert compression.decode_body(b"identity", body, CAP) == body
    assert compression.decode_body(b"gzip, identity", gzip.compress(body), CAP) == body


def test_zip_bomb_is_413_without_inflating_past_the_cap() -> None:
    bomb = gzip.compress(b"\0" * (10 << 20), 9)
    assert len(bomb) < 20_000
    tracemalloc.start()
    try:
        with pytest.raises(compression.BodyError) as caught:
            compression.decode_body(b"gzip", bomb, CAP)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.status == 413
    assert f"limit {CAP} bytes" in caught.value.message
    # At most the cap (plus one byte) was ever inflated, nowhere near the bomb's 10 MB (zlib's
    # output buffer is joined once at the end: twice the cap, for a moment).
    assert peak < 2 * CAP + (256 << 10), peak


def test_inflated_body_replaces_the_wire_headers(impl: Impl) -> None:
    body = b'{"a":' + b"1" * 100 + b"}"
    wire = gzip.compress(body)
    r = _one_request(
        impl,
        b"POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(wire), wire),
    )
    compression.replace_body(r, compression.decode_body(r.content_encoding, r.body, CAP))
    assert r.body == body and r.content_encoding is None
    assert r.headers == [(b"host", b"h"), (b"content-length", b"%d" % len(body))]


@pytest.mark.parametrize(
    ("coding", "body", "status"),
    [
        (b"br", b"xx", 415),
        (b"deflate", b"xx", 415),
        (b"gzip, gzip", b"xx", 415),
        (b"gzip", b"not gzip at all", 400),
        # mtime=0: a parameter's bytes are its test's id, the same in every test process
        (b"gzip", gzip.compress(b"x" * 1000, mtime=0)[:-12], 400),  # truncated
        (b"gzip", gzip.compress(b"{}", mtime=0) + b"junk", 400),
    ],
)
def test_bad_request_bodies(coding: bytes, body: bytes, status: int) -> None:
    with pytest.raises(compression.BodyError) as caught:
        compression.decode_body(coding, body, CAP)
    assert caught.value.status == status


# --- end to end: the gateway over real sockets, real anvil, real clients ---------------------

BIG_TXS = 200


@pytest.fixture(scope="module")
def big_block() -> Iterator[tuple[AnvilProcess, str, Any]]:
    """An anvil of its own whose latest block holds BIG_TXS transactions (a ~180 KB answer
    to eth_getBlockByNumber(..., true)), and that answer as the node gives it."""
    with AnvilProcess() as node:
        accounts = rpc_call(node.url, "eth_accounts")
        assert isinstance(accounts, list)
        rpc_call(node.url, "evm_setAutomine", [False])
        calls = [
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "eth_sendTransaction",
                "params": [
                    {
                        "from": accounts[i % 10],
                        "to": "0x" + secrets.token_hex(20),
                        "data": "0xa9059cbb" + secrets.token_hex(64),
                        "gas": hex(60_000),
                        "nonce": hex(i // 10),  # explicit: anvil races on a batch's nonces
                    }
                ],
            }
            for i in range(BIG_TXS)
        ]
        request = urllib.request.Request(
            node.url, json.dumps(calls).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert all("result" in r for r in json.loads(response.read()))
        rpc_call(node.url, "evm_mine")
        rpc_call(node.url, "evm_setAutomine", [True])
        number = rpc_call(node.url, "eth_blockNumber")
        assert isinstance(number, str)
        block = rpc_call(node.url, "eth_getBlockByNumber", [number, True])
        assert isinstance(block, dict) and len(block["transactions"]) == BIG_TXS
        yield node, number, block


def _block_body(number: str) -> bytes:
    return rpc_body("eth_getBlockByNumber", [number, True])


async def test_httpx_round_trip_is_coded_and_decoded(
    start_gateway: StartGateway, big_block: tuple[AnvilProcess, str, Any]
) -> None:
    node, number, block = big_block
    handle = await start_gateway([node.url])
    async with httpx.AsyncClient(timeout=30) as client:
        # httpx's own default Accept-Encoding (zstd among them, with zstandard installed).
        response = await client.post(handle.rpc_url(), content=_block_body(number))
        assert response.status_code == 200
        assert response.headers["content-encoding"] == "zstd"
        assert response.headers["vary"] == "Accept-Encoding"
        assert response.json()["result"] == block
        wire = int(response.headers["content-length"])
        assert wire * 2 < len(response.content), (wire, len(response.content))
        # gzip only: gzip.
        response = await client.post(
            handle.rpc_url(),
            content=_block_body(number),
            headers={"Accept-Encoding": "gzip"},
        )
        assert response.headers["content-encoding"] == "gzip"
        assert response.json()["result"] == block
        # No Accept-Encoding at all: as it is, but Vary (it could have been coded).
        response = await client.post(
            handle.rpc_url(), content=_block_body(number), headers={"Accept-Encoding": ""}
        )
        assert "content-encoding" not in response.headers
        assert response.headers["vary"] == "Accept-Encoding"
        assert int(response.headers["content-length"]) == len(response.content)
        assert response.json()["result"] == block
    server = handle.gateway.front.edge
    assert server.coded[b"zstd"] == 1 and server.coded[b"gzip"] == 1


async def test_curl_compressed_round_trip(
    start_gateway: StartGateway, big_block: tuple[AnvilProcess, str, Any], tmp_path: Path
) -> None:
    node, number, block = big_block
    handle = await start_gateway([node.url])
    headers = tmp_path / "headers"
    result = await trio.run_process(
        [
            "curl",
            "-sS",
            "--compressed",
            "-D",
            str(headers),
            "-w",
            "\n%{size_download}",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            _block_body(number).decode(),
            handle.rpc_url(),
        ],
        capture_stdout=True,
    )
    body, _, downloaded = result.stdout.rpartition(b"\n")
    assert json.loads(body)["result"] == block
    lines = headers.read_bytes().lower()
    assert b"content-encoding: " in lines and b"vary: accept-encoding" in lines
    assert int(downloaded) * 2 < len(body), (downloaded, len(body))


async def test_small_answers_are_not_coded(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            handle.rpc_url(),
            content=rpc_body("eth_blockNumber"),
            headers={"Accept-Encoding": "gzip"},
        )
    assert response.status_code == 200
    assert "content-encoding" not in response.headers and "vary" not in response.headers


async def test_identity_refused_codes_a_small_answer(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    raw = await exchange(
        handle.port,
        post_bytes(
            "/v1/rpc/ethereum/devnet",
            rpc_body("eth_chainId"),
            b"Accept-Encoding: gzip, identity;q=0\r\nConnection: close\r\n",
        ),
    )
    (response,) = parse_responses(raw, ["POST"])
    assert response.status == 200
    assert response.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(response.body))["result"] == "0x7a69"


async def test_metrics_text_is_coded_too(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    """A non-RPC path (GET /metrics, text/plain) goes through the same edge coding."""
    handle = await start_gateway([anvil.url])
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(
            f"{handle.base}/metrics",
            headers={"Authorization": "Bearer test-admin-token", "Accept-Encoding": "gzip"},
        )
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert "chaingate" in response.text


async def test_rest_answers_through_the_asgi_bridge_are_coded(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """The REST app (quart-trio behind the ASGI bridge) does not compress; the edge does."""
    handle = await start_gateway([anvil.url])
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{handle.base}/v1/openapi.json")
        plain = await client.get(
            f"{handle.base}/v1/openapi.json", headers={"Accept-Encoding": "identity"}
        )
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "zstd"
    assert response.headers["vary"] == "Accept-Encoding"
    assert response.json() == plain.json() and response.json()["openapi"] == "3.1.0"
    assert "content-encoding" not in plain.headers
    assert int(response.headers["content-length"]) * 3 < int(plain.headers["content-length"])


async def test_gzip_request_body_is_accepted(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            handle.rpc_url(),
            content=gzip.compress(rpc_body("eth_chainId")),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
    assert response.status_code == 200
    assert response.json()["result"] == "0x7a69"


async def test_zip_bomb_request_is_413_without_inflating_past_the_cap(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    # Valid JSON that inflates to 10 MB, sent as 10 KB.
    bomb = gzip.compress(
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":["' + b"0" * (10 << 20) + b'"]}'
    )
    assert len(bomb) < 20_000
    tracemalloc.start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(
                handle.rpc_url(),
                content=bomb,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
            )
            # The connection is still good for the next request.
            after = await client.post(handle.rpc_url(), content=rpc_body("eth_chainId"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert "once inflated (limit 1048576 bytes)" in response.json()["error"]["message"]
    assert after.json()["result"] == "0x7a69"
    # The whole process (gateway and client) never held the 10 MB the bomb inflates to.
    assert peak < 4 << 20, peak


async def test_unknown_request_coding_is_415(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            handle.rpc_url(),
            content=b"\x1b\x00",
            headers={"Content-Encoding": "br", "Content-Type": "application/json"},
        )
    assert response.status_code == 415
    assert response.headers["accept-encoding"] == "gzip"
    assert response.json()["error"]["code"] == "unsupported_media_type"


# --- WebSocket: permessage-deflate ---------------------------------------------------------

WS_PATH = "/v1/ws/ethereum/devnet"
OFFER = b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"


class _Upgrade:
    """Just the parts of a parsed request ``negotiate`` reads."""

    def __init__(self, *values: bytes) -> None:
        self.headers = [(b"sec-websocket-extensions", v) for v in values]


@pytest.mark.parametrize(
    ("offers", "window_bits"),
    [
        ((b"permessage-deflate",), 15),
        ((b"permessage-deflate; client_max_window_bits",), 15),
        ((b"permessage-deflate; server_max_window_bits=10; client_no_context_takeover",), 10),
        ((b'permessage-deflate; server_max_window_bits="12"',), 12),
        ((b"x-webkit-deflate-frame", b"permessage-deflate"), 15),
        # A declined first offer, then an acceptable fallback in the same header.
        ((b"permessage-deflate; server_max_window_bits=8, permessage-deflate",), 15),
        ((b"permessage-deflate; unknown_param",), None),
        ((b"permessage-deflate; server_max_window_bits=16",), None),
        ((b"permessage-deflate; server_no_context_takeover; server_no_context_takeover",), None),
        ((b"permessage-deflate; client_no_context_takeover=1",), None),
        ((), None),
    ],
)
def test_permessage_deflate_negotiation(offers: tuple[bytes, ...], window_bits: int | None) -> None:
    negotiated = deflate.negotiate(_Upgrade(*offers), 1400)
    if window_bits is None:
        assert negotiated is None
        return
    assert negotiated is not None and negotiated.window_bits == window_bits
    assert negotiated.header.startswith(
        b"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; "
        b"client_no_context_takeover"
    )
    assert deflate.negotiate(_Upgrade(*offers), 0) is None  # compression off


def test_deflated_message_inflates_as_rfc_7692_says() -> None:
    payload = json.dumps({"result": ["0x" + "ab" * 32] * 100}).encode()
    coded = deflate.deflate_message(payload, 15)
    assert not coded.endswith(b"\x00\x00\xff\xff") and len(coded) < len(payload) // 4
    assert zlib.decompressobj(-15).decompress(coded + b"\x00\x00\xff\xff") == payload


async def _raw_upgrade(port: int, extra: bytes) -> tuple[RawClient, bytes]:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    client = RawClient(sock)
    await sock.send(handshake_bytes(WS_PATH, extra=extra))
    head = await client.read_until(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return client, head


async def _next_frame(client: RawClient) -> tuple[int, bytes]:
    """(first byte: FIN, RSV1 and opcode; payload) of the next server frame."""
    while not client.buffer:
        data = await client.sock.recv(65536)
        if not data:
            raise EOFError
        client.buffer += data
    first = client.buffer[0]
    _, payload = await client.frame()
    return first, payload


async def test_websockets_client_gets_deflate_and_it_works(
    start_gateway: StartGateway, big_block: tuple[AnvilProcess, str, Any]
) -> None:
    node, number, block = big_block
    handle = await start_gateway([node.url])
    url = f"ws://127.0.0.1:{handle.port}{WS_PATH}"
    client = await Client.open(url)  # websockets offers permessage-deflate by default
    try:
        assert client.conn.response is not None
        extensions = client.conn.response.headers["Sec-WebSocket-Extensions"]
        assert extensions.startswith("permessage-deflate; server_no_context_takeover")
        assert [type(e).__name__ for e in client.conn.protocol.extensions] == ["PerMessageDeflate"]
        reply = await client.call("eth_getBlockByNumber", [number, True])
        assert reply["result"] == block
        reply = await client.call("eth_chainId")  # small: sent as it is
        assert reply["result"] == "0x7a69"
        # The client deflates what it sends too (its own choice): inflated on our side.
        reply = await client.call("eth_getBalance", ["0x" + secrets.token_hex(20), "latest"])
        assert reply["result"] == "0x0"
        (session,) = handle.gateway.front.ws.sessions
        assert session.deflated == 1
    finally:
        await client.close()
    # Without the offer: no extension.
    plain = await Client.open(url, compression=None)
    try:
        assert plain.conn.response is not None
        assert "Sec-WebSocket-Extensions" not in plain.conn.response.headers
        assert (await plain.call("eth_getBlockByNumber", [number, True]))["result"] == block
    finally:
        await plain.close()


async def test_raw_frames_carry_rsv1_only_when_deflated(
    start_gateway: StartGateway, big_block: tuple[AnvilProcess, str, Any]
) -> None:
    node, number, block = big_block
    handle = await start_gateway([node.url])
    client, head = await _raw_upgrade(handle.port, OFFER)
    try:
        assert b"permessage-deflate; server_no_context_takeover" in head
        await client.send_json(
            {"jsonrpc": "2.0", "id": 1, "method": "eth_getBlockByNumber", "params": [number, True]}
        )
        first, payload = await _next_frame(client)
        assert first == 0xC1  # FIN, RSV1, text
        inflated = zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")
        assert json.loads(inflated)["result"] == block
        await client.send_json({"jsonrpc": "2.0", "id": 2, "method": "eth_chainId"})
        first, payload = await _next_frame(client)
        assert first == 0x81 and json.loads(payload)["result"] == "0x7a69"
        # A message the client deflated, in two fragments with a ping between them.
        call = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "eth_chainId"}).encode()
        coded = deflate.deflate_message(call, 15)
        head_frame = bytearray(client_frame(coded[:5], opcode=1, fin=False))
        head_frame[0] |= 0x40
        await client.sock.send(
            bytes(head_frame) + client_frame(b"hi", opcode=9) + client_frame(coded[5:], opcode=0)
        )
        messages = [await _next_frame(client), await _next_frame(client)]
        assert messages[0] == (0x8A, b"hi")  # the pong
        assert json.loads(messages[1][1])["id"] == 3
    finally:
        client.close()


async def test_deflate_bomb_closes_1009_without_inflating_past_the_cap(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url])
    client, _ = await _raw_upgrade(handle.port, OFFER)
    cap = handle.gateway.front.ws.settings.max_message_bytes
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = packer.compress(b" " * (10 << 20)) + packer.flush(zlib.Z_SYNC_FLUSH)[:-4]
    assert len(bomb) < 20_000
    frame = bytearray(client_frame(bomb))
    frame[0] |= 0x40
    tracemalloc.start()
    try:
        await client.sock.send(bytes(frame))
        with trio.fail_after(10):
            first, payload = await _next_frame(client)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        client.close()
    assert first & 0x0F == 8 and int.from_bytes(payload[:2], "big") == 1009
    # Never the 10 MB: at most the message cap (1 MiB) and zlib's buffers.
    assert peak < 3 * cap, peak
