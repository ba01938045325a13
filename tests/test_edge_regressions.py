"""What a review of the native edge loop found, kept as regression tests through the real
gateway (both twins): a busy keep-alive connection closed as idle, more queued answers than one
sendmsg takes, a connection reset while its upgrade was handed off (the gateway died), and a
hang-up that came with the last bytes."""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import trio

from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import StartGateway
from tests.helpers import parse_responses, post_bytes, rpc_body
from tests.ws_clients import handshake_bytes

RPC = "/v1/rpc/ethereum/devnet"


async def _read_responses(stream: trio.SocketStream, count: int, limit: float) -> bytes:
    data = b""
    with trio.move_on_after(limit):
        while data.count(b"HTTP/1.1 ") < count or not data.endswith((b"}", b"]")):
            chunk = await stream.receive_some(1 << 20)
            if not chunk:
                break
            data += chunk
    return data


async def _answer_or_close(stream: trio.SocketStream) -> bool:
    """Read one small answer: True, or False when the server closed the connection."""
    data = b""
    with trio.fail_after(10):  # a stall, not a close: fails as a timeout, not as a close
        while not (b"HTTP/1.1 " in data and data.endswith((b"}", b"]"))):
            try:
                chunk = await stream.receive_some(1 << 20)
            except trio.BrokenResourceError:  # reset: closed with our request unread
                return False
            if not chunk:
                return False
            data += chunk
    return True


async def test_busy_keep_alive_connection_is_not_closed_as_idle(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """A connection used every 0.2 s must survive an idle_timeout of 1 s.

    The client shares the process (and its event loop) with the gateway, so a stall of the
    process delays the client's next request too.  The server's idle time is never longer
    than the client's time from one request to the next (the answer comes between), so a
    close after a gap below the timeout is the bug; after a longer gap (the client itself
    stalled) the server was right, and the test goes on with a new connection."""
    idle_timeout = 1.0
    gw = await start_gateway([anvil.url], server={"idle_timeout": idle_timeout})
    started = time.monotonic()
    answered = 0
    while time.monotonic() - started < 3.0:
        stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
        async with stream:
            sent = time.monotonic()
            gap = 0.0
            while time.monotonic() - started < 3.0:
                await stream.send_all(post_bytes(RPC, rpc_body("eth_chainId", id=answered)))
                if not await _answer_or_close(stream):
                    assert gap > idle_timeout, (
                        f"closed by the server after {answered} answers, "
                        f"{time.monotonic() - started:.2f} s, {gap:.2f} s after the last request"
                    )
                    break
                answered += 1
                await trio.sleep(0.2)
                gap, sent = time.monotonic() - sent, time.monotonic()
    assert answered >= 5


async def test_a_request_waiting_in_the_kernel_is_not_idle(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """The sweeper may run before the poll that would see a request's bytes (the process
    stalled while they came, and both were due at once): the edge asks the kernel before it
    closes a connection as idle, else the request is lost (the client gets a reset)."""
    gw = await start_gateway([anvil.url], server={"idle_timeout": 1.0})
    loop = gw.gateway.front.edge.loop
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(post_bytes(RPC, rpc_body("eth_chainId", id=1)))
        assert await _answer_or_close(stream)
        with trio.fail_after(5):
            while not any(loop.idle(conn) for conn in loop.conns.values()):
                await trio.sleep(0.01)
        (conn,) = loop.conns.values()
        # Sent without a checkpoint: no poll runs before the question is asked.
        os.write(stream.socket.fileno(), post_bytes(RPC, rpc_body("eth_chainId", id=2)))
        assert not loop.idle(conn)
        assert await _answer_or_close(stream)
        # A stall as the sweeper meets it: the process blocked past the idle timeout with
        # the request in the kernel; whichever task trio runs first, the answer comes.
        for _ in range(4):
            os.write(stream.socket.fileno(), post_bytes(RPC, rpc_body("eth_chainId", id=3)))
            time.sleep(1.3)  # noqa: ASYNC251 - the stall under test
            assert await _answer_or_close(stream)


async def test_many_pipelined_answers_with_a_large_one_are_all_written(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """63 small inline answers and a 70 KB one, twice on one connection."""
    gw = await start_gateway([anvil.url])
    small = post_bytes(RPC, rpc_body("eth_chainId", id=1))
    calls = b",".join(b'{"jsonrpc":"2.0","id":%d,"method":"x"}' % i for i in range(1000))
    large = post_bytes(RPC, b"[" + calls + b"]")  # 1,000 unknown methods: an ~85 KB answer
    assert len(small * 63 + large) < 65536
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(small)  # warm the cache
        assert await _read_responses(stream, 1, 5.0)
        for round_ in range(3):
            await stream.send_all(small * 63 + large)
            data = await _read_responses(stream, 64, 3.0)
            assert data.endswith(b"]"), (
                f"round {round_}: {len(data)} bytes, the batch answer unfinished after 3 s"
            )
            got = len(parse_responses(data, ["POST"] * data.count(b"HTTP/1.1 ")))
            assert data.endswith(b"]") and got == 64, (round_, got, len(data))


async def test_connection_reset_while_an_upgrade_is_handed_off(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """An inline answer, then a WebSocket upgrade, then RST: the edge must survive."""
    gw = await start_gateway([anvil.url])
    bad_json = post_bytes(RPC, b"{nope")  # answered inline by the fast lane (parse error)
    upgrade = handshake_bytes("/v1/ws/ethereum/devnet")
    sock = socket.socket()
    sock.setblocking(False)
    try:
        sock.connect(("127.0.0.1", gw.port))
    except BlockingIOError:
        await trio.lowlevel.wait_writable(sock)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await trio.sleep(0.1)  # accepted and registered
    sock.send(bad_json + upgrade)
    sock.close()  # RST, before the edge's task has run
    await trio.sleep(0.5)
    # The edge still answers.
    stream = await trio.open_tcp_stream("127.0.0.1", gw.port)
    async with stream:
        await stream.send_all(post_bytes(RPC, rpc_body("eth_chainId", id=7)))
        data = await _read_responses(stream, 1, 3.0)
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["id"] == 7


async def test_half_closed_client_is_closed_after_its_answer(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """Request + FIN arriving together: the server should close after answering."""
    gw = await start_gateway([anvil.url], server={"idle_timeout": 30.0})
    sock = socket.socket()
    sock.setblocking(False)
    try:
        sock.connect(("127.0.0.1", gw.port))
    except BlockingIOError:
        await trio.lowlevel.wait_writable(sock)
    await trio.sleep(0.1)
    sock.send(post_bytes(RPC, b"{nope"))
    sock.shutdown(socket.SHUT_WR)  # FIN right behind the request, before the edge runs
    data = b""
    with trio.move_on_after(3.0):
        while True:
            await trio.lowlevel.wait_readable(sock)
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    sock.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    assert len(gw.gateway.front.edge.loop.conns) == 0, "the half-closed connection is still open"
