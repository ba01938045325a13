"""The HTTP/2 connection (``chaingate.rpc.h2connection``) against a server it did not write:
the ``h2`` library's own server-side state machine, on the other end of a real socket pair.

What nginx does not do on demand is driven here frame by frame: a REFUSED_STREAM next to
another reset, a GOAWAY whose last-stream-id falls between open streams, a stream past its
deadline beside a live one, a silent connection, a stream limit of one, an oversized answer.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import DataReceived, Event, RequestReceived, StreamEnded, StreamReset
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from chaingate import twins as impl_module
from chaingate.rpc.connection import PlainTransport
from chaingate.rpc.errors import (
    BAD_RESPONSE,
    CONNECTION_LOST,
    REFUSED,
    TIMEOUT,
    UpstreamError,
)
from chaingate.rpc.future import Future
from chaingate.rpc.h2connection import Http2Connection

BODY = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'


class Server:
    """h2's server side over one end of the pair; records every request it received whole."""

    def __init__(self, sock: socket.socket, max_streams: int | None = None) -> None:
        self.sock = trio.socket.from_stdlib_socket(sock)
        self.h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        if max_streams is not None:
            self.h2.local_settings = Settings(
                client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: max_streams}
            )
        self.h2.initiate_connection()
        self.bodies: dict[int, bytes] = {}
        self.complete: list[int] = []
        self.events: list[Event] = []

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        while data:
            sent = await self.sock.send(data)
            data = data[sent:]

    async def send_raw(self, data: bytes) -> None:
        await self.flush()
        await self.sock.send(data)

    async def read_until_complete(self, count: int) -> None:
        """Read until ``count`` requests arrived whole (headers and body)."""
        with trio.fail_after(5):
            while len(self.complete) < count:
                data = await self.sock.recv(65536)
                assert data, "the client closed the connection"
                for event in self.h2.receive_data(data):
                    self.events.append(event)
                    if isinstance(event, RequestReceived):
                        self.bodies[event.stream_id] = b""
                    elif isinstance(event, DataReceived):
                        self.bodies[event.stream_id] += event.data
                        self.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, StreamEnded):
                        self.complete.append(event.stream_id)
                await self.flush()

    async def read_some(self) -> None:
        with trio.fail_after(5):
            data = await self.sock.recv(65536)
        self.events.extend(self.h2.receive_data(data))
        await self.flush()

    async def answer(self, stream_id: int, body: bytes, status: int = 200) -> None:
        self.h2.send_headers(
            stream_id,
            [(b":status", b"%d" % status), (b"content-type", b"application/json")],
        )
        self.h2.send_data(stream_id, body, end_stream=True)
        await self.flush()

    async def reset(self, stream_id: int, code: ErrorCodes) -> None:
        self.h2.reset_stream(stream_id, code)
        await self.flush()


class Pair:
    def __init__(self, conn: Http2Connection, server: Server) -> None:
        self.conn = conn
        self.server = server


async def open_pair(
    nursery: trio.Nursery, max_streams: int | None = None, max_body: int = 1 << 20
) -> Pair:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    conn = Http2Connection(
        "peer",
        PlainTransport(ours),
        authority=b"localhost",
        path=b"/",
        headers=[(b"x-api-key", b"k")],
        max_body=max_body,
        response_type=impl_module.pure().http1.Response,
    )
    nursery.start_soon(conn.run)
    server = Server(theirs, max_streams)
    await server.flush()
    return Pair(conn, server)


@pytest.fixture
async def pair(nursery: trio.Nursery) -> AsyncIterator[Pair]:
    made = await open_pair(nursery)
    yield made
    made.conn.abort(CONNECTION_LOST, "test over")


async def outcome(future: Future[Any]) -> Any:
    with trio.fail_after(5):
        try:
            return await future.wait()
        except UpstreamError as exc:
            return exc


async def test_requests_carry_our_headers_and_answers_come_back_by_stream(pair: Pair) -> None:
    first = pair.conn.submit(BODY, trio.current_time() + 5)
    second = pair.conn.submit(BODY + b" ", trio.current_time() + 5)
    await pair.server.read_until_complete(2)
    request = next(e for e in pair.server.events if isinstance(e, RequestReceived))
    assert dict(request.headers or []) == {
        b":method": b"POST",
        b":scheme": b"https",
        b":authority": b"localhost",
        b":path": b"/",
        b"content-type": b"application/json",
        b"content-length": b"%d" % len(BODY),
        b"x-api-key": b"k",
    }
    await pair.server.answer(3, b"[3]")  # out of order: streams, not a pipeline
    await pair.server.answer(1, b"[1]", status=429)
    assert (await outcome(second)).body == b"[3]"
    answer = await outcome(first)
    assert (answer.status, answer.body, answer.content_type) == (429, b"[1]", b"application/json")
    assert pair.server.bodies == {1: BODY, 3: BODY + b" "}


async def test_refused_stream_is_the_proof_of_not_processed_other_resets_are_not(
    pair: Pair,
) -> None:
    refused = pair.conn.submit(BODY, trio.current_time() + 5)
    reset = pair.conn.submit(BODY, trio.current_time() + 5)
    await pair.server.read_until_complete(2)
    await pair.server.reset(1, ErrorCodes.REFUSED_STREAM)
    await pair.server.reset(3, ErrorCodes.INTERNAL_ERROR)
    first, second = await outcome(refused), await outcome(reset)
    assert (first.kind, first.sent) == (REFUSED, False)
    assert (second.kind, second.sent) == (CONNECTION_LOST, True)
    assert not pair.conn.closed  # a stream's reset is the stream's business


async def test_goaway_finishes_streams_up_to_its_last_id_and_refuses_the_rest(
    pair: Pair,
) -> None:
    futures = [pair.conn.submit(BODY, trio.current_time() + 5) for _ in range(3)]
    await pair.server.read_until_complete(3)  # streams 1, 3 and 5
    await pair.server.answer(1, b"[1]")
    goaway = GoAwayFrame(0)
    goaway.last_stream_id = 3
    await pair.server.send_raw(goaway.serialize())
    await pair.server.answer(3, b"[3]")  # after the GOAWAY: still delivered (h2#1181)
    one, three, five = [await outcome(future) for future in futures]
    assert (one.body, three.body) == (b"[1]", b"[3]")
    assert (five.kind, five.sent) == (REFUSED, False)
    assert pair.conn.draining and pair.conn.capacity == 0
    late = await outcome(pair.conn.submit(BODY, trio.current_time() + 5))
    assert (late.kind, late.sent) == (REFUSED, False)
    pair.conn.expire(trio.current_time(), idle_after=60)
    assert pair.conn.closed  # drained


async def test_a_late_stream_is_reset_alone_but_a_silent_connection_is_dropped(
    pair: Pair,
) -> None:
    late = pair.conn.submit(BODY, trio.current_time() + 0.2)
    live = pair.conn.submit(BODY, trio.current_time() + 5)
    await pair.server.read_until_complete(2)
    await pair.server.answer(3, b"[3]")
    assert (await outcome(live)).body == b"[3]"
    await trio.sleep(0.25)
    pair.conn.expire(trio.current_time(), idle_after=60)
    failed = await outcome(late)
    assert (failed.kind, failed.sent) == (TIMEOUT, True)
    assert not pair.conn.closed  # the connection answered after stream 1 went out
    await pair.server.read_some()
    (cancel,) = [e for e in pair.server.events if isinstance(e, StreamReset)]
    assert (cancel.stream_id, cancel.error_code) == (1, ErrorCodes.CANCEL)

    silent = pair.conn.submit(BODY, trio.current_time() + 0.2)
    await trio.sleep(0.25)
    pair.conn.expire(trio.current_time(), idle_after=60)
    failed = await outcome(silent)
    assert (failed.kind, failed.sent) == (TIMEOUT, True)
    assert pair.conn.closed  # nothing at all since it was sent: the connection is dead


async def test_beyond_the_servers_stream_limit_requests_wait_unsent(nursery: trio.Nursery) -> None:
    made = await open_pair(nursery, max_streams=1)
    conn, server = made.conn, made.server
    with trio.fail_after(5):
        while conn.capacity != 1:  # the server's SETTINGS have arrived
            await trio.sleep(0.01)
    futures = [conn.submit(BODY, trio.current_time() + 5) for _ in range(3)]
    assert (len(conn.pending), len(conn.waiting)) == (1, 2)
    await server.read_until_complete(1)
    await server.answer(1, b"[1]")
    assert (await outcome(futures[0])).body == b"[1]"
    await server.read_until_complete(2)  # the next one only once a stream was free
    assert server.h2.open_inbound_streams == 1
    server.sock.close()
    second, third = await outcome(futures[1]), await outcome(futures[2])
    assert (second.kind, second.sent) == (CONNECTION_LOST, True)
    assert (third.kind, third.sent) == (CONNECTION_LOST, False)  # never left: may go elsewhere


async def test_an_answer_over_max_body_fails_its_stream_only(nursery: trio.Nursery) -> None:
    made = await open_pair(nursery, max_body=1000)
    big = made.conn.submit(BODY, trio.current_time() + 5)
    small = made.conn.submit(BODY, trio.current_time() + 5)
    await made.server.read_until_complete(2)
    await made.server.answer(1, b"x" * 5000)
    await made.server.answer(3, b"[3]")
    failed = await outcome(big)
    assert (failed.kind, failed.sent) == (BAD_RESPONSE, True)
    assert (await outcome(small)).body == b"[3]"
    made.conn.abort(CONNECTION_LOST, "test over")
