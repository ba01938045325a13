"""One client connection after the upgrade: read calls, answer them, carry pushes, close well.

One task reads (wsproto decodes frames; messages are bounded by ``max_message_bytes``).
``eth_subscribe``/``eth_unsubscribe`` are answered inline, so an acknowledgement is always
queued before the subscription's first push; every other call goes to the network's
``RpcService`` exactly as an HTTP request would, up to ``max_inflight`` at a time (then the
reader stops reading: TCP backpressure).

A ``logs`` filter is charged in filter bytes against the connection's and the key's budgets
(``chaingate.ws.caps``), given back when the subscription ends.

Writing never waits in the caller: a frame goes straight to the socket when nothing is queued
(the usual case), and only what the kernel did not take is queued, for a flusher task that
exists only while there is something to flush.  The queue is bounded in bytes: a push that
does not fit drops the connection with close code 1008 (a slow reader cannot grow memory or
delay anyone else); a reply waits for room instead (it is the client's own request).

Closing: ``close(code, reason)`` sends the close frame and gives the client
``close_timeout`` to answer; the endpoint's sweeper aborts it after that.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from time import monotonic, perf_counter
from typing import Any, Protocol

import msgspec
import trio
from trio.lowlevel import ParkingLot, wait_writable
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    TextMessage,
)

from chaingate import netio
from chaingate.auth.gate import Gate, Principal, Rejection, book
from chaingate.config import WebSocketSettings
from chaingate.edge.compression import THREAD_BYTES
from chaingate.jsondepth import too_deep
from chaingate.rpc.reply import RpcReply
from chaingate.rpc.service import RpcService
from chaingate.ws.caps import KeyBudgets, WsCaps, over_budget
from chaingate.ws.deflate import InboundDeflate, Negotiated, deflate_message
from chaingate.ws.hub import Hub, SubscribeError
from chaingate.ws.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_EXCEEDED,
    MSG_BAD_UTF8,
    MSG_TOO_DEEP,
    PARSE_ERROR,
    RESOURCE_UNAVAILABLE,
    Call,
    deflated_frame,
    error_reply,
    id_bytes,
    peek_call,
    result_reply,
    text_frame,
    utf8,
)
from chaingate.ws.registry import Subscription
from chaingate.ws.solana_hub import SolanaHub
from chaingate.ws.solana_methods import (
    INVALID_SUBSCRIPTION_ID,
    UNSUBSCRIBES,
    Key,
    ParamsError,
    subscription_key,
)
from chaingate.ws.solana_methods import METHODS as SOLANA_METHODS
from chaingate.ws.solana_router import Member


class Endpoint(Protocol):
    """What a session needs of the endpoint that accepted it (``WsEndpoint``)."""

    @property
    def settings(self) -> WebSocketSettings: ...

    @property
    def gate(self) -> Gate: ...

    @property
    def filter_budgets(self) -> KeyBudgets: ...  # logs filter bytes held per key


log = logging.getLogger("chaingate.ws")

# What eth_subscribe costs (Alchemy's price); eth_unsubscribe is free so that a client over
# its limits can always stop its own pushes.
SUBSCRIBE_CU = 10
SEND_BATCH = 64  # frames handed to one sendmsg
_SUBSCRIPTION_METHODS = ("eth_subscribe", "eth_unsubscribe")
_decode = msgspec.json.decode


class Session:
    def __init__(
        self,
        endpoint: Endpoint,
        sock: socket.socket,
        peer: str,
        request_id: str,
        principal: Principal,
        hub: Hub | SolanaHub,
        service: RpcService,
        caps: WsCaps,
        deflate: Negotiated | None = None,
    ) -> None:
        self._endpoint = endpoint
        self.settings: WebSocketSettings = endpoint.settings
        self._gate: Gate = endpoint.gate
        self.sock = sock
        self.peer = peer
        self.request_id = request_id
        self.principal = principal
        self.hub = hub
        self.service = service
        self.caps = caps
        self.subscriptions: dict[str, Subscription | Member] = {}
        # The calls answered here rather than by the RPC service: (un)subscriptions.
        self._inline = SOLANA_METHODS if isinstance(hub, SolanaHub) else _SUBSCRIPTION_METHODS
        self._waiting = 0  # Solana subscriptions waiting for their upstream's answer
        # Solana: an upstream loss is told by a subscriptionGap notification (True) or by
        # closing the connection with 1012 (False, the default: every client understands it).
        self.gap_notices = False
        self.filter_bytes = 0  # held by this connection's logs filters (see caps)
        # permessage-deflate when negotiated: inflating (bounded) is wsproto's, deflating ours.
        self._deflate = deflate
        self._ws = Connection(
            ConnectionType.SERVER,
            [InboundDeflate(self.settings.max_message_bytes)] if deflate is not None else None,
        )
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._head_partial = False  # the first queued frame is partly on the wire already
        self._flushing = False
        self._room = ParkingLot()  # replies waiting for queue room; the flusher's progress
        self._inflight = trio.Semaphore(self.settings.max_inflight)
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._parts: list[bytes] = []
        self._parts_size = 0
        self._discarding = False
        self.opened = monotonic()
        self.last_seen = self.opened
        self.ping_sent: float | None = None
        self.stalled_since = 0.0
        self.closing = False
        self.close_deadline = float("inf")
        self.close_code = 1006
        self.close_reason = ""
        self.pending_cu = 0  # pushed compute units not yet charged (the sweeper charges them)
        # While a batch's subscription calls run: their answers, and subscriptions whose
        # welcome waits until the batch's answer is out (as geth activates them).
        self._collect: list[bytes] | None = None
        self._welcome: list[Subscription] = []
        self.pushes = 0
        self.deflated = 0  # replies sent deflated
        self.dropped = False  # cut off as a slow consumer

    # --- running ---------------------------------------------------------------------------

    async def run(self, leftover: bytes) -> None:
        try:
            await self._run(leftover)
        finally:
            # Over, however it ended (cancelled too): nothing more is written, not even a
            # push still on its way (a fan-out's snapshot of subscribers).
            self.closing = True
            self._nursery = None

    async def _run(self, leftover: bytes) -> None:
        with self._scope:
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    if leftover:
                        self._ws.receive_data(leftover)
                        await self._process()
                    if self._ws.state is not ConnectionState.CLOSED:
                        await self._read_loop()
                    self.closing = True  # no more pushes: what is queued is the last of it
                    await self._drain()
                    nursery.cancel_scope.cancel()
            except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as gone:
                # The peer went away (a reset, most often): normal for a client, so said at
                # debug — never an error with a traceback.  (The nursery wraps it in a group.)
                self.abort("connection lost")
                log.debug(
                    "websocket connection lost",
                    extra={
                        "fields": {
                            "request_id": self.request_id,
                            "error": repr(gone.exceptions[0])[:200],
                        }
                    },
                )

    def abort(self, reason: str) -> None:
        """Drop the connection now, without a closing handshake."""
        if not self.closing:
            self.closing = True
            self.close_reason = reason
        self._room.unpark_all()
        self._scope.cancel()

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake (idempotent); nothing but the close frame is sent."""
        if self.closing:
            return
        self.closing = True
        self.close_code = code
        self.close_reason = reason
        self.close_deadline = monotonic() + self.settings.close_timeout
        if self._ws.state is ConnectionState.OPEN:
            self._write(self._ws.send(CloseConnection(code, reason)))
        self._room.unpark_all()

    async def _read_loop(self) -> None:
        sock = self.sock
        while True:
            data = await netio.recv_some(sock)
            self.last_seen = monotonic()
            self.ping_sent = None
            if not data:
                self._ws.receive_data(None)
            else:
                self._ws.receive_data(data)
            await self._process()
            if self._ws.state is ConnectionState.CLOSED or not data:
                return

    async def _process(self) -> None:
        for event in self._ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                data = event.data
                chunk = data.encode() if isinstance(data, str) else bytes(data)
                message = self._assemble(chunk, event.message_finished)
                if message is not None and not self.closing:
                    await self._dispatch(message)
            elif isinstance(event, Ping):
                if self._ws.state is ConnectionState.OPEN:
                    self._send_bounded(self._ws.send(event.response()))
            elif isinstance(event, Pong):
                pass  # any inbound byte already counted as a sign of life
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    self._write(self._ws.send(event.response()))
                    if not self.closing:
                        self.closing = True
                        self.close_code = event.code
                        self.close_reason = "client closed"
                elif self._ws.state is ConnectionState.OPEN:
                    # A protocol error while parsing: wsproto tells us what to answer.
                    self.close(event.code, event.reason or "protocol error")
                    self.close_reason = "protocol error"
                return

    def _assemble(self, chunk: bytes, finished: bool) -> bytes | None:
        """Frames into messages, bounded: a message over the cap closes with 1009."""
        if self._discarding:
            if finished:
                self._discarding = False
            return None
        self._parts_size += len(chunk)
        if self._parts_size > self.settings.max_message_bytes:
            self._parts = []
            self._parts_size = 0
            self._discarding = not finished
            self.close(1009, f"message too big (limit {self.settings.max_message_bytes} bytes)")
            return None
        if not finished:
            self._parts.append(chunk)
            return None
        if self._parts:
            self._parts.append(chunk)
            chunk = b"".join(self._parts)
            self._parts = []
        self._parts_size = 0
        return chunk

    # --- calls ---------------------------------------------------------------------------

    async def _dispatch(self, message: bytes) -> None:
        if self.principal.revoked:
            self.close(1008, "API key revoked")
            return
        call = peek_call(message)
        if call is not None and call.method in self._inline:
            if isinstance(self.hub, SolanaHub):
                self._solana_call(self.hub, call, message)
            else:
                self._subscription_call(self.hub, call, message)
            # A burst of them in one read takes turns with everyone else on the loop.
            await trio.lowlevel.checkpoint()
            return
        started = perf_counter()  # a call's latency counts its wait for a slot too
        await self._inflight.acquire()
        assert self._nursery is not None
        if call is None and b"subscribe" in message and isinstance(self.hub, Hub):
            # A batch with eth_(un)subscribe?
            parts = _batch_parts(message, self.service.max_batch)
            if parts is not None:
                self._nursery.start_soon(self._batch, parts, started)
                return
        self._nursery.start_soon(self._proxy, message, call, started)

    async def _batch(self, parts: list[tuple[bytes, Call | None]], started: float) -> None:
        """A batch with eth_subscribe/eth_unsubscribe in it, answered as geth does: one
        array, every call's answer at its place; the subscriptions' first pushes come only
        after it.  The other calls go to the RPC service as one batch."""
        try:
            others = [raw for raw, call in parts if not _subscription(call)]
            answers: deque[bytes] = deque()
            if others:
                reply = await self.service.handle(b"[" + b",".join(others) + b"]", self.principal)
                self._booked(reply, started)
                answers.extend(_answers_of(reply, [c for r, c in parts if not _subscription(c)]))
            # Room first, then the subscription calls, their answers and the write with no
            # await between them: no push of a new subscription can overtake its id.
            limit = self.settings.send_queue_bytes
            size = sum(map(len, answers)) + 128 * len(parts)
            while not self.closing and self._queue and self._queued + size > limit:
                await self._room.park()
            if self.closing:
                return
            hub = self.hub
            assert isinstance(hub, Hub)  # a Solana session's batches go to the RPC service
            self._collect = []
            body: list[bytes] = []
            for raw, call in parts:
                if _subscription(call):
                    assert call is not None
                    self._subscription_call(hub, call, raw)
                    body += self._collect
                    self._collect.clear()
                elif (call is None or bytes(call.id)) and answers:
                    body.append(answers.popleft())
            self._collect = None
            body += answers
            if body:
                self._write(text_frame(b"[" + b",".join(body) + b"]"))
            welcome, self._welcome = self._welcome, []
            for subscription in welcome:
                hub.welcome(subscription)
        finally:
            self._collect = None
            self._inflight.release()

    async def _proxy(self, message: bytes, call: Call | None, started: float) -> None:
        try:
            try:
                reply = await self.service.handle(message, self.principal)
            except Exception:
                # A bug of ours costs this call an error, never the connection.
                log.exception("unhandled error while answering a WebSocket call")
                body: bytes | None = error_reply(
                    id_bytes(call) if call else b"null", INTERNAL_ERROR, "internal error"
                )
            else:
                self._booked(reply, started)
                body = reply.body
                if body is None and reply.rejection is not None:
                    body = _refusal(id_bytes(call) if call else b"null", reply.rejection)
            if body is not None:
                await self._reply(await self._frame(body))
        finally:
            self._inflight.release()

    def _booked(self, reply: RpcReply, started: float) -> None:
        """A message the RPC service answered: its calls' usage, and its latency from the
        message to its answer once admitted (the subscription calls of a batch are not timed:
        they are answered here, at once)."""
        seconds = perf_counter() - started if reply.admitted else None
        book(self._gate, self.principal, self.service.label, reply.usage, reply.label, seconds)

    def bill(self, method: str, requests: int, units: int) -> None:
        """Usage of this connection's key answered here: (un)subscriptions, or units pushed
        (``requests`` 0)."""
        book(self._gate, self.principal, self.service.label, [(method, requests, units, 0)])

    async def _frame(self, body: bytes) -> bytes:
        """A reply's frame: deflated when negotiated and large enough to pay."""
        deflate = self._deflate
        if deflate is None or len(body) < deflate.min_bytes:
            return text_frame(body)
        if len(body) >= THREAD_BYTES:  # off the event loop, as the HTTP edge does
            coded = await trio.to_thread.run_sync(deflate_message, body, deflate.window_bits)
        else:
            coded = deflate_message(body, deflate.window_bits)
        self.deflated += 1
        return deflated_frame(coded)

    def _checked(self, call: Call, message: bytes) -> tuple[bytes, bool, list[Any]] | None:
        """A subscription call's id (as it came), whether it is a notification, and its
        params; None when it was answered already (malformed)."""
        if too_deep(message):
            # What the HTTP proxy answers (deeper still, peek_call gives up and the RPC
            # service's framing answers the same).
            self._answer(error_reply(b"null", PARSE_ERROR, MSG_TOO_DEEP))
            return None
        if not utf8(message):  # a binary frame's bytes inside a string: as HTTP answers it
            self._answer(error_reply(b"null", PARSE_ERROR, MSG_BAD_UTF8))
            return None
        notification = not bytes(call.id)
        id_raw = id_bytes(call)
        if not notification and id_raw == b"null" and bytes(call.id) != b"null":
            self._answer(error_reply(b"null", INVALID_REQUEST, "invalid request: bad id"))
            return None
        try:
            params = _decode(bytes(call.params)) if bytes(call.params) else []
        except msgspec.DecodeError:
            params = None
        if not isinstance(params, list):
            if not notification:
                self._answer(error_reply(id_raw, INVALID_PARAMS, "params must be an array"))
            return None
        return id_raw, notification, params

    def _subscription_call(self, hub: Hub, call: Call, message: bytes) -> None:
        checked = self._checked(call, message)
        if checked is None:
            return
        id_raw, notification, params = checked
        if call.method == "eth_unsubscribe":
            found = False
            if params and isinstance(params[0], str):
                subscription = self.subscriptions.pop(params[0], None)
                found = subscription is not None and self._end(subscription)
            self.bill("eth_unsubscribe", 1, 0)
            if not notification:
                self._answer(result_reply(id_raw, b"true" if found else b"false"))
            return
        if notification:
            return  # nobody would learn the subscription id
        outcome = self._subscribe(hub, params)
        if isinstance(outcome, SubscribeError):
            self._answer(error_reply(id_raw, outcome.code, outcome.message, outcome.data))
            return
        subscription = outcome
        self.subscriptions[subscription.id] = subscription
        cost = subscription.cost
        if cost:
            self.filter_bytes += cost
            self._endpoint.filter_budgets.take(self.principal.key_id, cost)
        hub.add(subscription)
        self._answer(result_reply(id_raw, b'"' + subscription.id.encode() + b'"'))
        if self._collect is not None:
            self._welcome.append(subscription)
        else:
            hub.welcome(subscription)

    # --- Solana PubSub -------------------------------------------------------------------

    def _solana_call(self, hub: SolanaHub, call: Call, message: bytes) -> None:
        """``<kind>Subscribe`` / ``<kind>Unsubscribe``: shared upstream through the hub; the
        acknowledgement comes now (the key is live) or when the upstream answers."""
        checked = self._checked(call, message)
        if checked is None:
            return
        id_raw, notification, params = checked
        method = str(call.method)
        if method in UNSUBSCRIBES:
            found = False
            if params and isinstance(params[0], int) and not isinstance(params[0], bool):
                member = self.subscriptions.pop(str(params[0]), None)
                found = member is not None and self._end(member)
            self.bill(method, 1, 0)
            if notification:
                return
            if found:
                self._answer(result_reply(id_raw, b"true"))
            else:
                self._answer(error_reply(id_raw, INVALID_PARAMS, INVALID_SUBSCRIPTION_ID))
            return
        if notification:
            return  # nobody would learn the subscription id
        if not hub.upstreams:
            message_text = f"no upstream of {hub.label} has a PubSub URL (ws_url)"
            self._answer(error_reply(id_raw, RESOURCE_UNAVAILABLE, message_text))
            return
        refused = self._solana_refusal(method, params)
        if isinstance(refused, SubscribeError):
            self._answer(error_reply(id_raw, refused.code, refused.message, refused.data))
            return
        member = hub.subscribe(refused, self, id_raw)
        self._waiting += 1
        if member is not None:
            self.joined(member, id_raw)

    def _solana_refusal(self, method: str, params: list[Any]) -> Key | SubscribeError:
        """The subscription's key (admitted and billed), or a SubscribeError."""
        caps = self.caps
        if len(self.subscriptions) + self._waiting >= caps.subscriptions:
            return SubscribeError(
                LIMIT_EXCEEDED, f"subscription limit reached ({caps.subscriptions} per connection)"
            )
        if self.principal.allow is not None:
            refused = self.principal.allow.call_refusal(method, None)
            if refused is not None:
                return SubscribeError(*refused)
        try:
            key = subscription_key(method, params)
        except ParamsError as exc:
            return SubscribeError(INVALID_PARAMS, str(exc))
        rejection = self._gate.admit(self.principal, True, False, 1, SUBSCRIBE_CU, SUBSCRIBE_CU)
        if rejection is not None:
            code = LIMIT_EXCEEDED if rejection.status == 429 else RESOURCE_UNAVAILABLE
            return SubscribeError(code, rejection.message)
        self.bill(method, 1, SUBSCRIBE_CU)
        return key

    def joined(self, member: Member, id_raw: bytes) -> None:
        """(The Solana hub:) the subscription is live: its id, before any of its pushes."""
        self._waiting -= 1
        if self.closing:
            self._end(member)
            return
        self.subscriptions[member.id] = member
        self._send_bounded(text_frame(result_reply(id_raw, member.id.encode())))

    def refused(self, id_raw: bytes, error: bytes) -> None:
        """(The Solana hub:) the upstream's error for a subscribe call, unchanged."""
        self._waiting -= 1
        self._send_bounded(
            text_frame(b'{"jsonrpc":"2.0","id":' + id_raw + b',"error":' + error + b"}")
        )

    def ended(self, member: Member) -> None:
        """(The Solana hub:) the subscription is over (a signature notified)."""
        self.subscriptions.pop(member.id, None)

    def _subscribe(self, hub: Hub, params: list[Any]) -> Subscription | SubscribeError:
        """A new subscription (admitted and billed, not yet live), or why not."""
        if not params:
            return SubscribeError(INVALID_PARAMS, "missing subscription kind")
        if self.principal.allow is not None:  # the key's method and contract allowlists
            refused = self.principal.allow.subscribe_refusal(params)
            if refused is not None:
                return SubscribeError(*refused)
        caps = self.caps
        if len(self.subscriptions) >= caps.subscriptions:
            return SubscribeError(
                LIMIT_EXCEEDED, f"subscription limit reached ({caps.subscriptions} per connection)"
            )
        try:
            subscription = hub.prepare(params[0], params[1:], self, caps)
        except SubscribeError as exc:
            return exc
        cost = subscription.cost
        held_by_key = self._endpoint.filter_budgets.held(self.principal.key_id)
        over = over_budget(cost, self.filter_bytes, held_by_key, caps)
        if over is not None:
            held = self.filter_bytes if over is caps.filter_bytes_connection else held_by_key
            return SubscribeError(
                LIMIT_EXCEEDED,
                f"logs filter budget exceeded: this filter takes {cost} filter bytes (20 per "
                f"address, 32 per topic), {held} of {over.value} are in use "
                f"(limit {over.name} = {over.value})",
                {"limit": over.name, "value": over.value},
            )
        rejection = self._gate.admit(self.principal, True, False, 1, SUBSCRIBE_CU, SUBSCRIBE_CU)
        if rejection is not None:
            code = LIMIT_EXCEEDED if rejection.status == 429 else RESOURCE_UNAVAILABLE
            return SubscribeError(code, rejection.message)
        self.bill("eth_subscribe", 1, SUBSCRIBE_CU)
        return subscription

    def _end(self, subscription: Subscription | Member) -> bool:
        """Take a subscription out of the hub and give its filter bytes back."""
        hub = self.hub
        if isinstance(subscription, Member):
            return isinstance(hub, SolanaHub) and hub.remove(subscription)
        if not isinstance(hub, Hub) or not hub.remove(subscription):
            return False
        cost = subscription.cost
        if cost:
            self.filter_bytes -= cost
            self._endpoint.filter_budgets.give(self.principal.key_id, cost)
        return True

    def end_all(self) -> None:
        """The connection is over: every subscription ends."""
        for subscription in self.subscriptions.values():
            self._end(subscription)
        self.subscriptions.clear()
        if isinstance(self.hub, SolanaHub):
            self.hub.forget(self)

    # --- writing -------------------------------------------------------------------------

    def push(self, frame: bytes, cu: int) -> None:
        """A subscription message (from the hub): queued now, or the connection is dropped."""
        if self.closing:
            return
        if self._queue and self._queued + len(frame) > self.settings.send_queue_bytes:
            self._overflow()
            return
        self.pending_cu += cu
        self.pushes += 1
        self._write(frame)

    def _answer(self, body: bytes) -> None:
        if self._collect is not None:
            self._collect.append(body)  # part of a batch's answer
            return
        self._send_bounded(text_frame(body))

    def _send_bounded(self, frame: bytes) -> None:
        """A small frame produced while reading (acks, pongs): bounded like a push."""
        if self.closing:
            return
        if self._queue and self._queued + len(frame) > self.settings.send_queue_bytes:
            self._overflow()
            return
        self._write(frame)

    async def _reply(self, frame: bytes) -> None:
        """An answer to a call: waits for queue room (the client's own backpressure)."""
        limit = self.settings.send_queue_bytes
        while not self.closing and self._queue and self._queued + len(frame) > limit:
            await self._room.park()
        if not self.closing:
            self._write(frame)

    def _overflow(self) -> None:
        self.dropped = True
        # Frames not yet started are dropped; one partly written must be finished first,
        # or the close frame would land in the middle of it.
        keep = self._queue[0] if self._queue and self._head_partial else None
        self._queue.clear()
        self._queued = 0
        self._head_partial = keep is not None
        if keep is not None:
            self._queue.append(keep)
            self._queued = len(keep)
        self.close(1008, "send queue full: the client does not read fast enough")

    def _write(self, frame: bytes) -> None:
        if self._queue:
            self._queue.append(frame)
            self._queued += len(frame)
            return
        try:
            sent = self.sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.abort("send failed")
            return
        if sent == len(frame):
            return
        rest = frame[sent:]
        self._queue.append(rest)
        self._queued += len(rest)
        self._head_partial = sent > 0
        if not self._flushing and self._nursery is not None:
            self._flushing = True
            self.stalled_since = monotonic()
            self._nursery.start_soon(self._flush)

    async def _flush(self) -> None:
        queue = self._queue
        sock = self.sock
        try:
            while queue:
                await wait_writable(sock)
                batch = [queue[i] for i in range(min(len(queue), SEND_BATCH))]
                try:
                    sent = sock.sendmsg(batch)
                except BlockingIOError:
                    continue
                if sent:
                    self.stalled_since = monotonic()
                    self._queued -= sent
                    while sent:
                        head = queue[0]
                        if sent >= len(head):
                            queue.popleft()
                            sent -= len(head)
                            self._head_partial = False
                        else:
                            queue[0] = head[sent:]
                            self._head_partial = True
                            sent = 0
                    self._room.unpark_all()
        except OSError:
            self.abort("send failed")
        finally:
            self._flushing = False
            self.stalled_since = 0.0
            self._room.unpark_all()

    async def _drain(self) -> None:
        """Give what is queued (a close frame, last answers) a bounded chance to go out."""
        with trio.move_on_after(self.settings.close_timeout):
            while self._queue:
                await self._room.park()

    def ping(self) -> None:
        if self._ws.state is ConnectionState.OPEN and not self.closing:
            self.ping_sent = monotonic()
            self._send_bounded(self._ws.send(Ping(b"chaingate")))


def _subscription(call: Call | None) -> bool:
    return call is not None and call.method in _SUBSCRIPTION_METHODS


_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def _batch_parts(message: bytes, max_batch: int) -> list[tuple[bytes, Call | None]] | None:
    """A batch's calls (raw, peeked) when it holds a subscription call; None otherwise, or
    when the RPC service should answer it whole (not JSON, too deep, empty, too long)."""
    if message.lstrip()[:1] != b"[" or too_deep(message) or not utf8(message):
        return None
    try:
        raws = _batch_decoder.decode(message)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None
    if not raws or len(raws) > max_batch:
        return None
    parts = [(bytes(raw), peek_call(bytes(raw))) for raw in raws]
    return parts if any(_subscription(call) for _, call in parts) else None


def _answers_of(reply: RpcReply, calls: list[Call | None]) -> list[bytes]:
    """The RPC service's answers to the batch's other calls, one per call that gets one."""
    if reply.body is None:
        if reply.rejection is None:
            return []
        return [
            _refusal(id_bytes(call) if call else b"null", reply.rejection)
            for call in calls
            if call is None or bytes(call.id)
        ]
    body = reply.body
    if body.lstrip()[:1] != b"[":
        return [body]  # one error for the whole sub-batch
    try:
        return [bytes(raw) for raw in _batch_decoder.decode(body)]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return [body]


def _refusal(id_raw: bytes, rejection: Rejection) -> bytes:
    """A call the gate refused without a JSON-RPC body (403: a scope the key lacks)."""
    code = LIMIT_EXCEEDED if rejection.status == 429 else RESOURCE_UNAVAILABLE
    return error_reply(
        id_raw, code, rejection.message, {"status": rejection.status, "code": rejection.code}
    )
