"""Kept-alive connections, for callers that send many requests to a few endpoints (webhooks).

A connection is filed under everything that made it safe to use: scheme, host name, port, the
exact address the policy admitted, and the TLS server name its certificate was verified for.
The pool itself resolves and judges nothing: the fetcher resolves the name and judges every
address on every request, and only then asks for an idle connection to one of the addresses
it admitted — so a name whose DNS answer moved somewhere refused is refused, idle connections
to its old address or not.

Bounded in every direction: idle connections per key and in all, how long one stays idle, how
many requests one carries.  No background task is needed: expired connections are closed
whenever the pool is used; ``run()`` (optional, in a nursery) also closes them while nothing
is sent.  The pool does not cap connections in use — its callers bound their concurrency
(webhook delivery: ``max_concurrency`` and ``max_per_endpoint``), so open connections never
exceed the requests in flight plus ``max_idle``.
"""

from __future__ import annotations

import collections
import dataclasses
import select
from collections.abc import Iterable

import trio

from chaingate.outbound.policy import IPAddress


@dataclasses.dataclass(frozen=True, slots=True)
class PoolKey:
    scheme: str
    host: str  # the URL's host: it is the Host header, and virtual hosts differ
    port: int
    address: IPAddress  # the admitted address connected to
    server_name: str | None  # what the certificate was verified for; None over plain HTTP


@dataclasses.dataclass(frozen=True, slots=True)
class PoolLimits:
    """How much a ``ConnectionPool`` keeps.

    ``max_idle_per_key`` matches webhook delivery's default ``max_per_endpoint``, so an
    endpoint kept busy at that concurrency never waits on a handshake.  ``idle_timeout`` is
    below the keep-alive timeout of common servers (Node's 5 s is the shortest in wide use),
    so we usually close first and seldom send on a connection the server is closing.
    ``max_requests`` retires a connection (its last request says ``Connection: close``), which
    spreads load again when an endpoint adds servers behind one address.
    """

    max_idle_per_key: int = 16
    max_idle: int = 256
    idle_timeout: float = 4.0
    max_requests: int = 1000

    def __post_init__(self) -> None:
        if self.max_idle_per_key < 1 or self.max_idle < 1 or self.max_requests < 1:
            raise ValueError("pool limits must be at least 1")
        if self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")


@dataclasses.dataclass(eq=False, slots=True)
class Connection:
    """One stream and what the pool knows about it."""

    key: PoolKey
    stream: trio.abc.Stream
    requests: int = 0  # requests started on it, the current one included
    idle_since: float = 0.0

    async def aclose(self) -> None:
        await close_all([self])


async def close_all(connections: Iterable[Connection]) -> None:
    """Close every one, even when cancelled: a forceful close never blocks, so the shield
    costs nothing and no socket is left open half-way through the list."""
    doomed = list(connections)
    if not doomed:
        return  # the common case: no cancel scope to enter and leave
    with trio.CancelScope(shield=True):
        for connection in doomed:
            await trio.aclose_forcefully(connection.stream)


class IdleSet:
    """Idle connections by key, and all of them oldest first (sans-IO bookkeeping).

    Connections are added in the order they go idle, so the oldest overall is also the oldest
    of its key: expiry and the total bound take from the front of both orders, a request
    takes the newest of its key (the least likely to have been closed by the server).
    """

    def __init__(self) -> None:
        self._by_key: dict[PoolKey, collections.deque[Connection]] = {}
        self._order: dict[Connection, None] = {}  # insertion-ordered set

    def __len__(self) -> int:
        return len(self._order)

    def count(self, key: PoolKey) -> int:
        return len(self._by_key.get(key, ()))

    def oldest(self) -> Connection | None:
        return next(iter(self._order), None)

    def add(self, connection: Connection, limits: PoolLimits) -> list[Connection]:
        """File ``connection``; return the ones pushed out by the bounds."""
        idle = self._by_key.setdefault(connection.key, collections.deque())
        idle.append(connection)
        self._order[connection] = None
        evicted: list[Connection] = []
        if len(idle) > limits.max_idle_per_key:
            evicted.append(self._remove(idle[0]))
        if len(self._order) > limits.max_idle:
            oldest = self.oldest()
            assert oldest is not None
            evicted.append(self._remove(oldest))
        return evicted

    def take(self, key: PoolKey) -> Connection | None:
        idle = self._by_key.get(key)
        return self._remove(idle[-1]) if idle else None

    def expire(self, now: float, timeout: float) -> list[Connection]:
        """Remove and return those idle for ``timeout`` seconds or more."""
        expired: list[Connection] = []
        # The same sum run() sleeps until: no rounding can leave it awake with nothing expired.
        while (oldest := self.oldest()) is not None and now >= oldest.idle_since + timeout:
            expired.append(self._remove(oldest))
        return expired

    def drain(self) -> list[Connection]:
        drained = list(self._order)
        self._by_key.clear()
        self._order.clear()
        return drained

    def _remove(self, connection: Connection) -> Connection:
        idle = self._by_key[connection.key]
        idle.remove(connection)  # at one end of a short deque
        if not idle:
            del self._by_key[connection.key]
        del self._order[connection]
        return connection


def looks_alive(stream: trio.abc.Stream) -> bool:
    """False when an idle connection has become readable.

    A request was never pending on it, so whatever arrived — EOF, a reset, a TLS
    close_notify, bytes sent unasked — means it must not carry the next one.  Streams that are
    not trio's own sockets (a test's or a proxy's connector) cannot be looked into and count
    as alive; the fetcher's stale-connection retry covers them.
    """
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream) or not hasattr(select, "poll"):
        return True
    fileno = stream.socket.fileno()
    if fileno < 0:  # closed already
        return False
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return not poller.poll(0)


class ConnectionPool:
    """Idle kept-alive connections for one ``Fetcher`` (trio tasks may share it).

    ``async with ConnectionPool() as pool:`` or ``await pool.aclose()`` closes them all; a
    connection handed back after that is closed.  A pool serves a single Fetcher: its
    connections were made through that Fetcher's connector and trust store.
    """

    def __init__(self, limits: PoolLimits | None = None) -> None:
        self.limits = limits or PoolLimits()
        self._idle = IdleSet()
        self._closed = trio.Event()
        self._owner: object | None = None

    @property
    def idle(self) -> int:
        """Idle connections held now (expired ones included until the pool next looks)."""
        return len(self._idle)

    def idle_for(self, key: PoolKey) -> int:
        return self._idle.count(key)

    def attach(self, owner: object) -> None:
        """Called by the Fetcher that will use this pool; a second one is refused."""
        if self._owner is not None and self._owner is not owner:
            raise ValueError("a ConnectionPool serves one Fetcher")
        self._owner = owner

    async def take(self, key: PoolKey) -> Connection | None:
        """The most recently used idle connection to ``key`` that still looks alive, if any."""
        doomed = self._expired()
        found: Connection | None = None
        while found is None and (candidate := self._idle.take(key)) is not None:
            if looks_alive(candidate.stream):
                found = candidate
            else:
                doomed.append(candidate)
        await close_all(doomed)  # shielded: ``found`` cannot be lost to a cancellation here
        return found

    async def give_back(self, connection: Connection) -> None:
        """Keep ``connection`` for the next request to its key.

        The caller has checked that its last exchange left it reusable; retired (too many
        requests) or not, and whatever the bounds push out, is closed here.
        """
        doomed = self._expired()
        if self._closed.is_set() or connection.requests >= self.limits.max_requests:
            doomed.append(connection)
        else:
            connection.idle_since = trio.current_time()
            doomed += self._idle.add(connection, self.limits)
        await close_all(doomed)

    async def run(self) -> None:
        """Close idle connections as they expire, even while nothing is sent.

        Optional (start it in a nursery); returns once the pool is closed.
        """
        while not self._closed.is_set():
            oldest = self._idle.oldest()
            since = oldest.idle_since if oldest is not None else trio.current_time()
            # A connection that goes idle meanwhile expires after this wake-up, not before.
            with trio.move_on_at(since + self.limits.idle_timeout):
                await self._closed.wait()
            await close_all(self._expired())

    async def aclose(self) -> None:
        self._closed.set()
        await close_all(self._idle.drain())

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _expired(self) -> list[Connection]:
        return self._idle.expire(trio.current_time(), self.limits.idle_timeout)
