"""The SSRF-safe outbound HTTP client: GET (redirects followed, each re-checked) and POST.

One fetch = parse the URL, refuse it by name or port, resolve, refuse it if *any* address is
refused, connect to the checked addresses in order, one HTTP/1.1 exchange; for a GET that
answers a redirect, the same again for the new URL (at most three times).  All of it runs
under the caller's one deadline.

Without a pool every request has its own connection and says ``Connection: close``.  With
one (webhook delivery), every check above still runs on every request, and only then is an
idle connection to an admitted address taken; it goes back to the pool only after a complete
answer that leaves it reusable, and is closed on any error, timeout or cancellation.
Nothing is retried but this: a request on a *reused* connection that the server closed (or
reset) before a single byte of the answer arrived is sent once more, on a new connection.
That is how a server closing an idle connection as we write to it looks; the server may, in
rare cases, have acted on the request before dropping it, which webhook receivers already
handle since delivery is at-least-once.  Other retries are the caller's (delivery schedules
its own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import h11
import trio

from chaingate import __version__
from chaingate.outbound.body import BodyReader, content_encoding
from chaingate.outbound.errors import FetchError, Reason
from chaingate.outbound.exchange import Exchange
from chaingate.outbound.limits import FetchLimits
from chaingate.outbound.net import Connector, Resolver, SystemResolver, TcpConnector
from chaingate.outbound.policy import (
    IPAddress,
    OutboundPolicy,
    judge,
    judge_name,
    port_allowed,
)
from chaingate.outbound.pool import Connection, ConnectionPool, PoolKey
from chaingate.outbound.response import Response, media_type_allowed
from chaingate.outbound.url import Target, follow_redirect, parse_url

HeadersLike = Mapping[str, str] | Iterable[tuple[str, str]]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
FOLLOWS_REDIRECTS = frozenset({"GET", "HEAD"})
# Framing and hop-by-hop headers are ours to set: a caller's value could smuggle a second
# request or break the byte counting.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "accept-encoding",
    }
)
# Caller headers carried across a redirect to another origin; the rest (Authorization,
# signatures, gateway tokens...) were meant for the first origin only.
CROSS_ORIGIN_HEADERS = frozenset({"accept", "accept-language", "user-agent"})

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")  # h11 encodes str values as ASCII
DEFAULT_LIMITS = FetchLimits()


def _request_headers(headers: HeadersLike) -> list[tuple[str, str]]:
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    for name, value in items:
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise ValueError(f"invalid header {name!r}")
        if name.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by the fetcher")
    return items


class _Stale(Exception):
    """A reused connection was closed by the server before it answered: send again."""


class Fetcher:
    """Outbound HTTP under an ``OutboundPolicy``.  Safe to share between tasks.

    ``pool``: keep connections alive between requests (see ``ConnectionPool``); its owner
    closes it.  Without one each request has a connection of its own.
    """

    def __init__(
        self,
        policy: OutboundPolicy | None = None,
        *,
        resolver: Resolver | None = None,
        connector: Connector | None = None,
        user_agent: str = f"chaingate/{__version__}",
        pool: ConnectionPool | None = None,
    ) -> None:
        self.policy = policy or OutboundPolicy()
        self._resolver: Resolver = resolver or SystemResolver()
        self._connector: Connector = connector or TcpConnector()
        self._user_agent = user_agent
        if pool is not None:
            pool.attach(self)
        self._pool = pool

    @property
    def pool(self) -> ConnectionPool | None:
        return self._pool

    async def get(
        self, url: str, *, headers: HeadersLike = (), limits: FetchLimits = DEFAULT_LIMITS
    ) -> Response:
        return await self.request("GET", url, headers=headers, limits=limits)

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        headers: HeadersLike = (),
        limits: FetchLimits = DEFAULT_LIMITS,
    ) -> Response:
        """POST ``body``; a 3xx answer is returned, never followed."""
        return await self.request("POST", url, body=body, headers=headers, limits=limits)

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes = b"",
        headers: HeadersLike = (),
        limits: FetchLimits = DEFAULT_LIMITS,
    ) -> Response:
        """Any status is returned as a Response; everything else raises FetchError."""
        if not _TOKEN.fullmatch(method):
            raise ValueError(f"invalid method {method!r}")
        extra = _request_headers(headers)
        target = parse_url(url)
        trail = [target]  # the hops so far; the last one names a timeout's origin
        try:
            with trio.fail_after(limits.timeout):
                return await self._fetch(method.upper(), trail, body, extra, limits)
        except trio.TooSlowError:
            raise FetchError(
                Reason.TIMEOUT,
                f"{trail[-1].origin}: no complete answer within {limits.timeout:g} s",
            ) from None

    async def _fetch(
        self,
        method: str,
        trail: list[Target],
        body: bytes,
        extra: list[tuple[str, str]],
        limits: FetchLimits,
    ) -> Response:
        while True:
            target = trail[-1]
            connection, exchange, head = await self._begin(method, target, body, extra, limits)
            try:
                following = self._redirect(method, head, trail, limits)
                if following is None:
                    response = await self._answer(exchange, head, target, limits, method)
            except BaseException:
                await connection.aclose()
                raise
            if following is None:
                await self._release(connection, exchange)
                return response
            await connection.aclose()  # a redirect's own body is never read
            if not following.same_origin(target):
                extra = [h for h in extra if h[0].lower() in CROSS_ORIGIN_HEADERS]
            trail.append(following)

    async def _begin(
        self,
        method: str,
        target: Target,
        body: bytes,
        extra: list[tuple[str, str]],
        limits: FetchLimits,
    ) -> tuple[Connection, Exchange, h11.Response]:
        """Send the request and read the answer's head, on an idle connection if the pool has
        one to an address admitted just now, else on a new one."""
        addresses = await self.admitted(target)
        connection = await self._idle(target, addresses)
        if connection is not None:
            try:
                exchange, head = await self._send(connection, method, target, body, extra, limits)
            except _Stale:
                pass  # closed already; once more below, on a connection of our own
            else:
                return connection, exchange, head
        connection = await self._connect(target, addresses, limits)
        exchange, head = await self._send(connection, method, target, body, extra, limits)
        return connection, exchange, head

    async def _send(
        self,
        connection: Connection,
        method: str,
        target: Target,
        body: bytes,
        extra: list[tuple[str, str]],
        limits: FetchLimits,
    ) -> tuple[Exchange, h11.Response]:
        """One request on ``connection`` up to the answer's head; on failure it is closed."""
        reused = connection.requests > 0
        connection.requests += 1
        # The last request a connection may carry says so, and the server closes it with us.
        last = self._pool is None or connection.requests >= self._pool.limits.max_requests
        exchange = Exchange(connection.stream, target.origin, limits.max_header_bytes)
        try:
            await exchange.send(self._head(method, target, body, extra, close=last), body)
            return exchange, await exchange.receive_head()
        except FetchError as exc:
            await connection.aclose()
            if reused and exchange.stale:
                raise _Stale from exc
            raise
        except BaseException:
            await connection.aclose()
            raise

    async def _release(self, connection: Connection, exchange: Exchange) -> None:
        if self._pool is not None and exchange.reusable:
            await self._pool.give_back(connection)
        else:
            await connection.aclose()

    @staticmethod
    def _redirect(
        method: str, head: h11.Response, trail: list[Target], limits: FetchLimits
    ) -> Target | None:
        """Where a GET's redirect leads (checked like any URL), or None to return ``head``."""
        if method not in FOLLOWS_REDIRECTS or head.status_code not in REDIRECT_STATUSES:
            return None
        location = _header(head, b"location")
        if location is None:  # a 3xx without Location is an answer, not a redirect
            return None
        target = trail[-1]
        if len(trail) > limits.max_redirects:
            raise FetchError(
                Reason.TOO_MANY_REDIRECTS,
                f"{target.origin}: more than {limits.max_redirects} redirects",
            )
        return follow_redirect(target, location)

    async def admitted(self, target: Target) -> list[IPAddress]:
        """Every address of ``target``, each allowed by the policy; FetchError if any is not.

        Runs on every request, kept-alive connection or not: nothing is connected to, or
        taken from the pool, before it.  Public for callers that judge a URL ahead of any
        fetch (a webhook's, at creation): the same checks, the same resolver.
        """
        if not port_allowed(self.policy, target.port):
            raise FetchError(Reason.BAD_URL, f"{target.origin}: port not allowed")
        refused_name = judge_name(self.policy, target.host)
        if refused_name is not None:
            raise FetchError(
                Reason.BLOCKED_ADDRESS, f"{target.origin}: {refused_name} host name refused"
            )
        addresses: Sequence[IPAddress]
        if target.ip is not None:
            addresses = [target.ip]
        else:
            addresses = await self._resolver.resolve(target.host, target.port)
            if not addresses:
                raise FetchError(Reason.RESOLVE_FAILED, f"{target.host} has no address")
        verdicts = [judge(self.policy, address) for address in addresses]
        for verdict in verdicts:
            # One refused address refuses the name: a host that also points inside is no
            # host we want to talk to, and its answer must not depend on which address works.
            if not verdict.allowed:
                raise FetchError(
                    Reason.BLOCKED_ADDRESS,
                    f"{target.origin}: address {verdict.address} refused ({verdict.category})",
                )
        return [verdict.address for verdict in verdicts]

    async def _idle(self, target: Target, addresses: list[IPAddress]) -> Connection | None:
        if self._pool is None:
            return None
        for address in addresses:
            connection = await self._pool.take(_key(target, address))
            if connection is not None:
                return connection
        return None

    async def _connect(
        self, target: Target, addresses: list[IPAddress], limits: FetchLimits
    ) -> Connection:
        """A new connection to the first of the admitted ``addresses`` that accepts one."""
        server_name = target.host if target.tls else None
        failures: list[str] = []
        for address in addresses:
            with trio.move_on_after(limits.connect_timeout):
                try:
                    stream = await self._connector.connect(address, target.port, server_name)
                except OSError as exc:
                    failures.append(f"{address}: {exc.strerror or type(exc).__name__}")
                    continue
                return Connection(_key(target, address), stream)
            failures.append(f"{address}: timed out")
        raise FetchError(Reason.CONNECT_FAILED, f"{target.origin}: {'; '.join(failures)}")

    def _head(
        self,
        method: str,
        target: Target,
        body: bytes,
        extra: list[tuple[str, str]],
        *,
        close: bool,
    ) -> h11.Request:
        headers = [("Host", target.authority), ("Accept-Encoding", "identity")]
        given = {name.lower() for name, _ in extra}
        if "user-agent" not in given:
            headers.append(("User-Agent", self._user_agent))
        if "accept" not in given:
            headers.append(("Accept", "*/*"))
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            headers.append(("Content-Length", str(len(body))))
        if close:
            headers.append(("Connection", "close"))
        return h11.Request(method=method, target=target.path, headers=headers + extra)

    async def _answer(
        self,
        exchange: Exchange,
        head: h11.Response,
        target: Target,
        limits: FetchLimits,
        method: str,
    ) -> Response:
        headers = tuple(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers
        )
        content_type = _header(head, b"content-type")
        ok = 200 <= head.status_code < 300
        accepted = limits.content_types is None or media_type_allowed(
            content_type, limits.content_types
        )
        if ok and not accepted:
            raise FetchError(
                Reason.BAD_CONTENT_TYPE,
                f"{target.origin}: content type {_shown(content_type)} not accepted",
            )
        length = _header(head, b"content-length")
        # A HEAD answer's Content-Length describes a body that is not sent.
        if length is not None and method != "HEAD" and int(length) > limits.max_bytes:
            # Refused before reading a byte of it.
            raise FetchError(
                Reason.TOO_LARGE,
                f"{target.origin}: Content-Length {length} exceeds {limits.max_bytes} bytes",
            )
        try:
            encoding = content_encoding(_header(head, b"content-encoding"))
        except FetchError as exc:
            raise FetchError(exc.reason, f"{target.origin}: {exc.message}") from None
        body = await exchange.receive_body(BodyReader(limits.max_bytes, encoding))
        return Response(
            status=head.status_code,
            reason=head.reason.decode("latin-1"),
            headers=headers,
            body=body,
            url=target.url,
        )


def _key(target: Target, address: IPAddress) -> PoolKey:
    server_name = target.host if target.tls else None
    return PoolKey(target.scheme, target.host, target.port, address, server_name)


def _header(head: h11.Response, name: bytes) -> str | None:
    """The first value of ``name`` (h11 lowercases names)."""
    for key, value in head.headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _shown(content_type: str | None) -> str:
    return repr(content_type[:100]) if content_type is not None else "(none)"
