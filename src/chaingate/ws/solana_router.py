"""Solana subscriptions shared upstream, routed by id: pure state, no I/O.

One ``Channel`` per distinct ``Key`` (method, canonical params) holds the upstream
subscription every client asking the same shares, and its ``members`` (the clients'
subscriptions, each with its own id, unique on this hub).  Upstream notifications are routed
by the upstream's subscription id to the channel, and fanned out to its members by the hub.

A client that asks for a key already live upstream is a member at once; otherwise it waits
(``Waiter``) for the upstream's answer: its id then, or the upstream's error unchanged.  The
last member leaving unsubscribes upstream (even when the upstream's answer is still to come).

The connection to the upstream is the hub's: ``connected`` gives the requests to send on a
new one (every channel subscribed again), ``lost`` forgets every upstream id and remembers
when the channel's members stopped hearing, so the hub can tell them of the gap once the
channel is live again (``Acked.resumed``).  A ``signatureSubscribe`` ends with its
notification, upstream and for every member (``Notify.ended``).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, Protocol

import msgspec

from chaingate.ws.solana_methods import (
    NOTIFICATIONS,
    ONE_SHOT,
    Key,
    Notification,
    decode_notification_params,
    decode_upstream,
    tail,
    unsubscribe_request,
)


class SolanaSink(Protocol):
    """A client connection (``Session``).  The router only holds it (and compares it by
    identity); the hub tells it what happens, never awaiting it."""

    @property
    def closing(self) -> bool: ...

    @property
    def gap_notices(self) -> bool:
        """Told of an upstream loss by ``subscriptionGap`` (else: the connection closes)."""

    def close(self, code: int, reason: str) -> None: ...

    def push(self, frame: bytes, cu: int) -> None: ...

    def joined(self, member: Member, id_raw: bytes) -> None:
        """The subscription is live: acknowledge it (its id) before any push."""

    def refused(self, id_raw: bytes, error: bytes) -> None:
        """The upstream's (or chaingate's) error object for the subscribe call."""

    def ended(self, member: Member) -> None:
        """The subscription is over without the client asking (a signature notified)."""


class Member:
    """One client's subscription (what the session holds under ``id``)."""

    __slots__ = ("channel", "id", "number", "sink", "tail")

    cost = 0  # no filter bytes: Solana's params are bounded by MAX_PARAMS_BYTES instead

    def __init__(self, number: int, channel: Channel, sink: SolanaSink) -> None:
        self.number = number
        self.id = str(number)
        self.channel = channel
        self.sink = sink
        self.tail = tail(number)


class Waiter(NamedTuple):
    sink: SolanaSink
    id_raw: bytes  # the client's request id, as it came
    since: float


class Channel:
    __slots__ = ("key", "lost_at", "members", "notification", "request", "upstream_id", "waiting")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.notification = NOTIFICATIONS[key.method]
        self.members: dict[int, Member] = {}
        self.waiting: list[Waiter] = []
        self.upstream_id: int | None = None
        self.request: int | None = None  # a subscribe request awaiting its answer
        self.lost_at: float | None = None  # members stopped hearing then (upstream lost)


class Acked(NamedTuple):
    channel: Channel
    joined: list[tuple[Member, Waiter]]  # waiters now members: acknowledge each
    resumed: list[Member]  # members that heard nothing since lost_at
    lost_at: float


class Refused(NamedTuple):
    channel: Channel
    waiters: list[Waiter]
    error: bytes  # the upstream's error object, unchanged
    ended: list[Member]  # members of a channel the new upstream would not take again


class Notify(NamedTuple):
    channel: Channel
    members: list[Member]
    notification: Notification
    ended: bool  # a signature's notification: every member's subscription is over


Outcome = Acked | Refused | Notify | None


class Router:
    def __init__(self) -> None:
        self.channels: dict[Key, Channel] = {}
        # Channels with clients waiting for the upstream's answer: what ``forget`` (every
        # disconnect) and ``expire`` (every second) look through, not every channel.
        self._pending: set[Channel] = set()
        self._by_upstream: dict[int, Channel] = {}
        # Request id -> the channel it subscribes (None: an unsubscribe).
        self._requests: dict[int, Channel | None] = {}
        self._request_ids = itertools.count(1)
        self._member_ids = itertools.count(1)
        self.connected = False
        self.outbox: list[bytes] = []  # requests for the upstream, taken by the hub

    # --- clients ---------------------------------------------------------------------------

    def join(self, key: Key, sink: SolanaSink, id_raw: bytes, now: float) -> Member | None:
        """A member at once when the key is live upstream; else None (the client waits)."""
        channel = self.channels.get(key)
        if channel is None:
            channel = self.channels[key] = Channel(key)
        if channel.upstream_id is not None:
            return self._member(channel, sink)
        channel.waiting.append(Waiter(sink, id_raw, now))
        self._pending.add(channel)
        if channel.request is None and self.connected:
            self._subscribe(channel)
        return None

    def leave(self, member: Member) -> bool:
        """The member's subscription ends; False when it was not live."""
        channel = member.channel
        if channel.members.pop(member.number, None) is None:
            return False
        self._maybe_close(channel)
        return True

    def forget(self, sink: SolanaSink) -> None:
        """A client went away: whatever it still waits for is dropped."""
        for channel in list(self._pending):
            if any(waiter.sink is sink for waiter in channel.waiting):
                channel.waiting = [w for w in channel.waiting if w.sink is not sink]
                if not channel.waiting:
                    self._pending.discard(channel)
                self._maybe_close(channel)

    def expire(self, before: float) -> list[tuple[Channel, Waiter]]:
        """Waiters since before ``before`` (no upstream answered them in time): dropped."""
        expired: list[tuple[Channel, Waiter]] = []
        for channel in list(self._pending):
            late = [w for w in channel.waiting if w.since < before]
            if late:
                channel.waiting = [w for w in channel.waiting if w.since >= before]
                if not channel.waiting:
                    self._pending.discard(channel)
                expired.extend((channel, waiter) for waiter in late)
                self._maybe_close(channel)
        return expired

    def _member(self, channel: Channel, sink: SolanaSink) -> Member:
        member = Member(next(self._member_ids), channel, sink)
        channel.members[member.number] = member
        return member

    def _maybe_close(self, channel: Channel) -> None:
        if channel.members or channel.waiting:
            return
        if self.channels.get(channel.key) is channel:
            del self.channels[channel.key]
        if channel.upstream_id is not None:
            self._by_upstream.pop(channel.upstream_id, None)
            if self.connected:
                self._unsubscribe(channel.key.method, channel.upstream_id)
            channel.upstream_id = None
        # A subscribe still in flight is unsubscribed when its answer comes (see _reply).

    def _subscribe(self, channel: Channel) -> None:
        request_id = next(self._request_ids)
        channel.request = request_id
        self._requests[request_id] = channel
        self.outbox.append(channel.key.request(request_id))

    def _unsubscribe(self, method: str, upstream_id: int) -> None:
        request_id = next(self._request_ids)
        self._requests[request_id] = None
        self.outbox.append(unsubscribe_request(request_id, method, upstream_id))

    # --- the upstream connection -------------------------------------------------------------

    def connected_again(self) -> None:
        """A new upstream connection: every channel is subscribed on it."""
        self.connected = True
        for channel in self.channels.values():
            self._subscribe(channel)

    def lost(self, now: float) -> list[Member]:
        """The upstream connection is gone: every upstream id with it.  The members that
        were live on it (they stop hearing now)."""
        self.connected = False
        self.outbox.clear()
        self._requests.clear()
        self._by_upstream.clear()
        stopped: list[Member] = []
        for channel in self.channels.values():
            if channel.upstream_id is not None:
                stopped.extend(channel.members.values())
            channel.upstream_id = None
            channel.request = None
            if channel.members and channel.lost_at is None:
                channel.lost_at = now
        return stopped

    def receive(self, message: bytes) -> Outcome:
        """One message from the upstream.  ValueError when it is not JSON-RPC."""
        try:
            decoded = decode_upstream(message)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"not a JSON-RPC message: {exc}") from None
        if decoded.method is not None:
            return self._notification(decoded.method, bytes(decoded.params))
        if isinstance(decoded.id, int) and not isinstance(decoded.id, bool):
            return self._reply(decoded.id, bytes(decoded.result), bytes(decoded.error))
        return None

    def _reply(self, request_id: int, result: bytes, error: bytes) -> Outcome:
        if request_id not in self._requests:
            return None
        channel = self._requests.pop(request_id)
        if channel is None:
            return None  # an unsubscribe's answer: nothing waits for it
        channel.request = None
        if error:
            # Refused (or, on a new upstream, refused again): nobody on it hears more.
            waiters, channel.waiting = channel.waiting, []
            self._pending.discard(channel)
            ended = list(channel.members.values())
            channel.members.clear()
            if self.channels.get(channel.key) is channel:
                del self.channels[channel.key]
            return Refused(channel, waiters, error, ended)
        try:
            upstream_id = msgspec.json.decode(result, type=int)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ValueError("a subscription's answer is not an integer id") from None
        if self.channels.get(channel.key) is not channel:
            # Everyone left while the answer was on its way.
            self._unsubscribe(channel.key.method, upstream_id)
            return None
        channel.upstream_id = upstream_id
        self._by_upstream[upstream_id] = channel
        resumed = list(channel.members.values()) if channel.lost_at is not None else []
        lost_at, channel.lost_at = channel.lost_at, None
        joined = [(self._member(channel, w.sink), w) for w in channel.waiting]
        channel.waiting = []
        self._pending.discard(channel)
        return Acked(channel, joined, resumed, lost_at or 0.0)

    def _notification(self, method: str, params: bytes) -> Outcome:
        try:
            decoded = decode_notification_params(params)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ValueError(f"a {method[:40]} without a subscription id") from None
        channel = self._by_upstream.get(decoded.subscription)
        if channel is None or method != channel.notification:
            return None  # one we unsubscribed from, or not ours
        members = list(channel.members.values())
        ended = channel.key.method == ONE_SHOT
        if ended:
            # Solana ends it upstream by itself: no unsubscribe.
            del self._by_upstream[decoded.subscription]
            channel.upstream_id = None
            channel.members.clear()
            if channel.waiting:
                self._subscribe(channel)  # joined meanwhile: asks again (answered at once)
            elif self.channels.get(channel.key) is channel:
                del self.channels[channel.key]
        return Notify(channel, members, Notification(method, bytes(decoded.result)), ended)

    def take_outbox(self) -> list[bytes]:
        out, self.outbox = self.outbox, []
        return out

    @property
    def unanswered(self) -> int:
        """Requests sent (or queued) on this connection and not answered yet."""
        return len(self._requests)

    @property
    def members(self) -> int:
        return sum(len(channel.members) for channel in self.channels.values())
