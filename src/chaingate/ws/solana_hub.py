"""One hub per Solana network: one upstream PubSub connection, shared by every client.

The hub holds one WebSocket to one of the network's upstreams (its ``ws_url``), opened when
the first client subscribes.  On it, one upstream subscription per distinct (method, params)
(``solana_router``); notifications are routed by upstream id and fanned out to every member
without waiting (a connection that cannot take a push drops itself, see ``Session.push``).

When the connection is lost (closed, reset, silent past its ping, or leaving requests
unanswered), the hub connects to the next upstream in the list and subscribes every channel
again.  No client
sees a gap it is not told about: a client that connected with ``?gaps=notify`` keeps its
subscriptions, and once a channel is live again each of its members gets one
``subscriptionGap`` notification (what may be missing: between ``lostAt`` and
``resumedAt``) before any new notification; any other client's connection is closed at once
with 1012 (client libraries route notifications by subscription id whatever their method, so
an unknown notification could reach an application as a slot or an account).  A client
still waiting for its subscription's answer just waits for the new upstream's (bounded by
``answer_timeout``).
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from typing import NamedTuple
from urllib.parse import urlsplit

import msgspec
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    Ping,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from chaingate.ws.solana_methods import GAP_METHOD, Key, Notification, gap_result
from chaingate.ws.solana_router import (
    Acked,
    Member,
    Notify,
    Outcome,
    Refused,
    Router,
    SolanaSink,
)
from chaingate.wsupstream import UpstreamMessages

log = logging.getLogger("chaingate.ws")

MAX_MESSAGE = 16 << 20  # one upstream message (a programNotification of a large account)
# Requests the upstream has not answered yet, beyond one subscribe and one unsubscribe per
# channel (a new connection subscribes every channel at once, however many there are): more
# and the upstream is taken for lost (it does not read, or does not answer).
UNANSWERED = 10_000
PING_INTERVAL = 10.0  # seconds without a byte from the upstream before a ping
PONG_TIMEOUT = 10.0  # then this long for any byte, or the upstream is taken for lost
MAX_BACKOFF = 5.0  # between rounds of every upstream failing
FANOUT_SLICE = 64  # pushes between two checkpoints


class PubSubUrl(NamedTuple):
    name: str  # for logs and metrics
    url: str  # ws:// or wss:// (never logged: it may hold a key)
    headers: tuple[tuple[str, str], ...] = ()  # the upstream's extra headers (never logged)


class _Link:
    """The current upstream connection's sending side."""

    def __init__(self, ws: WSConnection, out: trio.MemorySendChannel[bytes]) -> None:
        self.ws = ws
        self.out = out
        self.broken = False


class SolanaHub:
    push_method = "solana_subscription"  # how pushed units appear in usage

    def __init__(self, label: str, upstreams: list[PubSubUrl], answer_timeout: float) -> None:
        self.label = label
        self.upstreams = upstreams
        self.answer_timeout = answer_timeout
        self.router = Router()
        self._link: _Link | None = None
        self._wake = trio.Event()
        self._scope: trio.CancelScope | None = None  # the current connection's
        self.upstream: str | None = None  # the name of the upstream connected to
        # Observability.
        self.pushes = 0
        self.gaps = 0  # subscriptionGap notifications sent
        self.connects = 0
        self.arrival = 0.0  # wall clock of the newest notification's arrival
        self.fanout_seconds = 0.0  # spent handing notifications to every member
        self.fanouts = 0

    # --- clients (from sessions: synchronous) ------------------------------------------------

    def subscribe(self, key: Key, sink: SolanaSink, id_raw: bytes) -> Member | None:
        """A member now (the key is live upstream) or None: the sink hears ``joined`` or
        ``refused`` when the upstream answers."""
        member = self.router.join(key, sink, id_raw, trio.current_time())
        self._flush()
        return member

    def remove(self, member: Member) -> bool:
        found = self.router.leave(member)
        self._flush()
        return found

    def forget(self, sink: SolanaSink) -> None:
        self.router.forget(sink)
        self._flush()

    def _flush(self) -> None:
        link = self._link
        if link is None or link.broken:
            self.router.take_outbox()  # a new connection subscribes every channel again
            if self.router.channels:
                self._wake.set()  # someone needs an upstream
            return
        router = self.router
        for request in router.take_outbox():
            try:
                link.out.send_nowait(link.ws.send(TextMessage(request.decode())))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._break("upstream connection closed")
                return
            except LocalProtocolError:
                self._break("upstream connection closing")
                return
        if router.unanswered > UNANSWERED + 2 * len(router.channels):
            self._break("upstream leaves requests unanswered")

    def _break(self, reason: str) -> None:
        if self._link is not None:
            self._link.broken = True
        log.warning(
            "solana pubsub upstream dropped",
            extra={"fields": {"network": self.label, "upstream": self.upstream, "reason": reason}},
        )
        if self._scope is not None:
            self._scope.cancel()

    # --- the upstream ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire)
            task_status.started()
            await self._maintain()

    async def _maintain(self) -> None:
        if not self.upstreams:
            await trio.sleep_forever()
        index = 0
        failed_in_a_row = 0
        backoff = 0.1
        while True:
            while not self.router.channels:
                self._wake = trio.Event()
                await self._wake.wait()
            upstream = self.upstreams[index % len(self.upstreams)]
            connects = self.connects
            try:
                with trio.CancelScope() as scope:
                    self._scope = scope
                    await self._connection(upstream)
            except* (
                OSError,
                ConnectionError,
                trio.BrokenResourceError,
                trio.TooSlowError,
                ValueError,
            ) as group:
                exc = group.exceptions[0]
                log.warning(
                    "solana pubsub upstream lost",
                    extra={
                        "fields": {
                            "network": self.label,
                            "upstream": upstream.name,
                            "error": str(exc)[:200],
                        }
                    },
                )
            except* Exception:
                # A bug of ours costs this connection (and a gap), never the gateway.
                log.exception("solana pubsub hub failed", extra={"fields": {"network": self.label}})
            finally:
                self._scope = None
                self._link = None
                self.upstream = None
                stopped = self.router.lost(time.time())
            self._lost(stopped)  # (not when the hub itself is cancelled: shutdown says 1001)
            index += 1  # the next one: the lost upstream is the last tried again
            accepted = self.connects > connects
            failed_in_a_row = 0 if accepted else failed_in_a_row + 1
            if failed_in_a_row >= len(self.upstreams):
                await trio.sleep(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
            elif accepted:
                backoff = 0.1

    async def _connection(self, upstream: PubSubUrl) -> None:
        """Serve one upstream connection until it is lost (it only ends by raising)."""
        parts = urlsplit(upstream.url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError("ws_url must be ws:// or wss://")
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        with trio.fail_after(self.answer_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(parts.hostname, port)
        if parts.scheme == "wss":
            stream = trio.SSLStream(
                stream, ssl.create_default_context(), server_hostname=parts.hostname
            )
        ws = WSConnection(ConnectionType.CLIENT)
        # Unbounded here, bounded by what the upstream leaves unanswered (see _flush).
        out, pending = trio.open_memory_channel[bytes](math.inf)
        accepted = False
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(_writer, stream, pending)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = [(k.encode(), v.encode()) for k, v in upstream.headers]
            request = Request(host=parts.hostname, target=target, extra_headers=headers)
            out.send_nowait(ws.send(request))
            messages = UpstreamMessages(MAX_MESSAGE)
            pinged = False
            while True:
                with trio.move_on_after(PONG_TIMEOUT if pinged else PING_INTERVAL) as quiet:
                    data = await stream.receive_some(65536)
                if quiet.cancelled_caught:
                    if pinged or not accepted:
                        raise ConnectionError("upstream silent")
                    pinged = True
                    out.send_nowait(ws.send(Ping(b"chaingate")))
                    continue
                pinged = False
                if not data:
                    raise ConnectionError("upstream closed the connection")
                try:
                    ws.receive_data(bytes(data))
                    events = list(ws.events())
                except RemoteProtocolError as exc:
                    raise ConnectionError(f"upstream WebSocket protocol error: {exc}") from None
                for event in events:
                    if isinstance(event, AcceptConnection):
                        accepted = True
                        self.connects += 1
                        self.upstream = upstream.name
                        self._link = _Link(ws, out)
                        self.router.connected_again()
                        self._flush()
                    elif isinstance(event, Ping):
                        out.send_nowait(ws.send(event.response()))
                    elif (message := messages.complete(event)) is not None:
                        outcome = self.router.receive(message)
                        await self._apply(outcome)
                        self._flush()

    def _lost(self, members: list[Member]) -> None:
        """Clients that take no gap notices learn of the loss now: their connection closes
        (1012, "service restart": connect and subscribe again)."""
        closed: set[int] = set()
        for member in members:
            sink = member.sink
            if not sink.gap_notices and id(sink) not in closed:
                closed.add(id(sink))
                try:  # (outside the connection's guard: a bug here would end the hub)
                    sink.close(1012, "upstream PubSub lost: connect and subscribe again")
                except Exception:
                    self._sink_failed(sink)

    async def _expire(self) -> None:
        """Subscribe calls no upstream answered in time get an error."""
        error = msgspec.json.encode(
            {"code": -32002, "message": f"no upstream of {self.label} answered the subscription"}
        )
        while True:
            await trio.sleep(min(1.0, self.answer_timeout / 2))
            late = self.router.expire(trio.current_time() - self.answer_timeout)
            for _, waiter in late:
                sink = waiter.sink
                try:  # (a bug here would end the hub, and the gateway with it)
                    sink.refused(waiter.id_raw, error)
                except Exception:
                    self._sink_failed(sink)
            if late:
                self._flush()

    # --- fan-out -------------------------------------------------------------------------

    async def _apply(self, outcome: Outcome) -> None:
        if isinstance(outcome, Notify):
            self.arrival = time.time()
            started = time.perf_counter()
            frame_for = outcome.notification.frame
            ended = outcome.ended
            checkpoint = trio.lowlevel.checkpoint
            for n, member in enumerate(outcome.members, 1):
                sink = member.sink
                try:  # (free unless raised, 3.11)
                    sink.push(*frame_for(member.tail))
                    if ended:
                        sink.ended(member)
                except Exception:
                    self._sink_failed(sink)
                if n % FANOUT_SLICE == 0:
                    await checkpoint()
            self.pushes += len(outcome.members)
            self.fanout_seconds += time.perf_counter() - started
            self.fanouts += 1
        elif isinstance(outcome, Acked):
            for member, waiter in outcome.joined:
                sink = member.sink
                if sink.closing:
                    self.router.leave(member)
                else:
                    sink.joined(member, waiter.id_raw)
            if outcome.resumed:
                self._gap(outcome.resumed, "upstream lost", outcome.lost_at, False)
        elif isinstance(outcome, Refused):
            for waiter in outcome.waiters:
                sink = waiter.sink
                sink.refused(waiter.id_raw, outcome.error)
            if outcome.ended:
                reason = "upstream lost; the next upstream refused the subscription: "
                reason += outcome.error.decode(errors="replace")[:200]
                self._gap(outcome.ended, reason, time.time(), True)

    def _sink_failed(self, sink: SolanaSink) -> None:
        """A bug of ours in telling one client costs that client's connection, not the
        upstream connection every other client hears through (which would close them all
        with 1012, again and again if the bug is in every push), nor the hub."""
        log.exception("solana push failed", extra={"fields": {"network": self.label}})
        try:
            sink.close(1011, "internal error")
        except Exception:
            log.exception("closing a failed client failed", extra={"fields": {}})

    def _gap(self, members: list[Member], reason: str, lost_at: float, ended: bool) -> None:
        """Tell each member that notifications may be missing (and, ``ended``, that its
        subscription is over)."""
        notice = Notification(
            GAP_METHOD, gap_result(reason, lost_at, time.time(), self.upstream or "")
        )
        for member in members:
            sink = member.sink
            if not sink.gap_notices:
                sink.close(1012, "upstream PubSub lost: connect and subscribe again")
                continue
            frame, cu = notice.frame(member.tail)
            sink.push(frame, cu)
            self.gaps += 1
            if ended:
                sink.ended(member)


async def _writer(stream: trio.abc.Stream, pending: trio.MemoryReceiveChannel[bytes]) -> None:
    async for data in pending:
        await stream.send_all(data)
