"""The edge loop's twins, driven directly over real loopback sockets with a stand-in lane.

Each test runs on the compiled and the pure loop (``_native/edgeloop``, ``_pure/edgeloop``),
calling ``poll`` by hand — the loop is sans-trio — and checks what a client reads: answers in
order, all of them, then the connection's state.  The stand-in lane answers at once, defers,
or hands off, as the fast lane does; everything else is the real loop (http1 framing included).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chaingate import twins as impl_module
from chaingate.edge.responses import DateHeader
from chaingate.envelope import error_body
from chaingate.framing_constants import BUSY, IDLE

PATH = b"/v1/rpc/x/y"


class StandInLane:
    """Answers ``POST /v1/rpc/x/y`` with its body echoed; defers when asked to."""

    def __init__(self, impl: impl_module.Impl) -> None:
        self.ids = impl.fastlane.RequestIds(b"t")
        self.ledger = self
        self.sink: Any = None
        self.defer = False
        self.deferred: list[tuple[Any, Any]] = []
        self.notes: list[int] = []
        self.bodies: list[bytes] = []  # request bodies, in the order the loop served them
        self.on_serve: Any = None  # called with each body served, before it is answered

    def log_path(self, path: bytes) -> str:
        return path.decode("latin-1")

    def note(self, route: str, status: int, *rest: Any) -> None:
        self.notes.append(status)

    def serve(self, conn: Any, request: Any, peer: str, group: str) -> Any:
        if request.path != PATH:
            return "handoff"
        self.bodies.append(request.body)
        if self.on_serve is not None:
            self.on_serve(request.body)
        if self.defer:
            self.deferred.append((conn, request))
            return "defer"
        return 200, b"Content-Type: application/json\r\n", request.body


class Harness:
    def __init__(self, impl: impl_module.Impl, **settings: Any) -> None:
        self.lane = StandInLane(impl)
        self.handed: list[Any] = []
        self.closed: list[Any] = []
        self.loop = impl.edgeloop.Loop(
            impl.http1,
            self.lane,
            limits=(8192, 16384, 100, 1 << 20),
            max_unsent_bytes=settings.get("max_unsent_bytes", 64 << 20),
            max_auth_failures=10,
            compress_min=0,
            budget=impl.fastlane.AnswerBudget(1 << 30),
            date=DateHeader(),
            error_body=error_body,
            handoff=lambda conn, request: self.handed.append((conn, request)),
            encode=lambda *args: pytest.fail("nothing is coded here"),
            closed=self.closed.append,
        )
        self.listener = socket.create_server(("127.0.0.1", 0))

    def connect(self) -> tuple[socket.socket, Any]:
        client = socket.create_connection(self.listener.getsockname())
        server, address = self.listener.accept()
        server.setblocking(False)
        conn = self.loop.register(server, address[0], address[0])
        return client, conn

    def spin(self, until: Any, seconds: float = 5.0) -> None:
        deadline = time.monotonic() + seconds
        while not until():
            self.loop.poll()
            assert time.monotonic() < deadline, "the loop did not get there"
            time.sleep(0.001)

    def close(self) -> None:
        self.loop.close_loop()
        self.listener.close()


@pytest.fixture(params=["compiled", "pure"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "compiled":
        try:
            impl = impl_module.compiled()
        except ImportError:
            pytest.skip("compiled modules not built")
    else:
        impl = impl_module.pure()
    made = Harness(impl)
    yield made
    made.close()


def post(body: bytes, path: bytes = PATH) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)


def read_answers(client: socket.socket, count: int, harness: Harness) -> list[bytes]:
    """``count`` answer bodies (Content-Length framed), polling the loop meanwhile."""
    client.setblocking(False)
    data = b""
    bodies: list[bytes] = []

    def enough() -> bool:
        nonlocal data
        try:
            chunk = client.recv(1 << 20)
        except BlockingIOError:
            chunk = b""
        data += chunk
        while True:
            head = data.find(b"\r\n\r\n")
            if head < 0:
                break
            length = int(data[:head].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(data) < head + 4 + length:
                break
            bodies.append(data[head + 4 : head + 4 + length])
            data = data[head + 4 + length :]
        return len(bodies) >= count

    harness.spin(enough)
    return bodies


def test_pipelined_requests_are_answered_in_order(harness: Harness) -> None:
    client, conn = harness.connect()
    client.sendall(b"".join(post(b"%d" % i) for i in range(20)))
    assert read_answers(client, 20, harness) == [b"%d" % i for i in range(20)]
    assert conn.state == IDLE and harness.loop.idle(conn)


def test_more_answers_than_one_sendmsg_takes_all_arrive(harness: Harness) -> None:
    """More queued pieces than one sendmsg offers (64): the rest follow without waiting."""
    client, conn = harness.connect()
    client.sendall(b"".join(post(b"x" * 10) for _ in range(150)))
    assert len(read_answers(client, 150, harness)) == 150
    assert harness.loop.unsent_bytes == 0


def test_a_readiness_of_several_connections_gets_one_more_look(harness: Harness) -> None:
    """What arrives while a readiness of several connections is served is served in the same
    poll (one epoll_wait more, where going back to trio costs a turn of its loop); one more
    look only, and none after a readiness of one connection (one request at a time)."""
    (a, _), (b, _), (c, _), (d, _) = (harness.connect() for _ in range(4))
    arrives = {b"a": (c, b"c"), b"c": (d, b"d"), b"e": (b, b"f")}

    def send_next(body: bytes) -> None:
        if body in arrives:
            client, sent = arrives[body]
            client.sendall(post(sent))  # on loopback, ready for the loop when this returns

    harness.lane.on_serve = send_next
    a.sendall(post(b"a"))
    b.sendall(post(b"b"))
    harness.loop.poll()
    assert sorted(harness.lane.bodies[:2]) == [b"a", b"b"]
    assert harness.lane.bodies[2:] == [b"c"]  # d arrived during the second look: next poll
    harness.loop.poll()
    assert harness.lane.bodies[3:] == [b"d"]
    a.sendall(post(b"e"))
    harness.loop.poll()
    assert harness.lane.bodies[4:] == [b"e"]  # f (sent meanwhile) waits: a readiness of one
    harness.loop.poll()
    assert harness.lane.bodies[5:] == [b"f"]
    for client, count in ((a, 2), (b, 2), (c, 1), (d, 1)):
        assert len(read_answers(client, count, harness)) == count


def test_a_connection_is_idle_from_its_last_answer(harness: Harness) -> None:
    client, conn = harness.connect()
    for i in range(3):
        time.sleep(0.05)
        before = time.monotonic()
        client.sendall(post(b"%d" % i))
        read_answers(client, 1, harness)
        assert conn.since >= before  # the sweeper measures idleness from the last answer


def test_a_request_and_its_hang_up_together_close_after_the_answer(harness: Harness) -> None:
    client, conn = harness.connect()
    client.sendall(post(b"bye"))
    client.shutdown(socket.SHUT_WR)
    assert read_answers(client, 1, harness) == [b"bye"]
    harness.spin(lambda: conn.fd not in harness.loop.conns)
    assert harness.closed == [conn]


def test_a_deferred_answer_goes_only_to_the_request_it_answers(harness: Harness) -> None:
    harness.lane.defer = True
    client, conn = harness.connect()
    client.sendall(post(b"first") + post(b"second"))
    harness.spin(lambda: len(harness.lane.deferred) == 1)
    (deferred_conn, first) = harness.lane.deferred[0]
    assert deferred_conn is conn and conn.state == BUSY
    harness.loop.deliver(conn, object(), 200, b"", b"not its answer")  # ignored
    harness.loop.deliver(conn, first, 200, b"", b"1")
    harness.spin(lambda: len(harness.lane.deferred) == 2)  # then the pipelined second
    second = harness.lane.deferred[1][1]
    harness.loop.deliver(conn, first, 200, b"", b"late twin")  # its answer was given: ignored
    harness.loop.deliver(conn, second, 200, b"", b"2")
    assert read_answers(client, 2, harness) == [b"1", b"2"]


def test_other_requests_are_handed_off_and_answered_in_order(harness: Harness) -> None:
    client, conn = harness.connect()
    client.sendall(post(b"a", b"/v1/other") + post(b"b"))
    harness.spin(lambda: len(harness.handed) == 1)
    assert conn.state == BUSY
    handed_conn, request = harness.handed[0]
    harness.loop.answer(handed_conn, 200, b"", b"handled " + request.body)
    assert read_answers(client, 2, harness) == [b"handled a", b"b"]


def test_a_closed_connection_cannot_be_detached(harness: Harness) -> None:
    client, conn = harness.connect()
    client.sendall(post(b"up", b"/v1/other"))
    harness.spin(lambda: len(harness.handed) == 1)
    client.close()  # the client goes; the loop notices on its next read
    harness.loop.close(conn)
    assert harness.loop.detach(conn) is None


def test_framing_errors_are_answered_counted_and_logged(harness: Harness) -> None:
    client, conn = harness.connect()
    client.sendall(b"BROKEN\r\n\r\n")
    (body,) = read_answers(client, 1, harness)
    assert b'"status":400' in body
    assert harness.loop.framing_errors == {400: 1} and harness.lane.notes == [400]
