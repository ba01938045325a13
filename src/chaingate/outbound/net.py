"""The two I/O edges of the fetcher: name resolution and connecting to one exact address.

Both are protocols so tests (and, one day, a proxy or a caching resolver) can stand in.  The
fetcher never hands a host *name* to a connector: it resolves, checks every address, then asks
for a connection to one checked address — so a DNS answer that changes between the check and
the connect (rebinding) cannot redirect it.  TLS still verifies the certificate against the
URL's host name, which is sent as SNI.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Sequence
from typing import Protocol

import trio

from chaingate.outbound.errors import FetchError, Reason
from chaingate.outbound.policy import IPAddress


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        """Every address of ``host``, in the order to try them.  FetchError if none."""
        ...


class Connector(Protocol):
    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        """A stream to exactly ``address``:``port``; TLS verified for ``server_name`` if set.

        Raise OSError when the connection cannot be made (the fetcher tries the next address)
        and FetchError(TLS) when the handshake or the certificate fails.
        """
        ...


class SystemResolver:
    """The operating system's resolver through trio (``getaddrinfo`` in a worker thread)."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        try:
            infos = await trio.socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (OSError, UnicodeError):  # socket.gaierror is an OSError
            raise FetchError(Reason.RESOLVE_FAILED, f"{host} does not resolve") from None
        addresses: list[IPAddress] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = ipaddress.ip_address(sockaddr[0])
            if address not in addresses:
                addresses.append(address)
        return addresses


class TcpConnector:
    """Plain TCP to an exact address, TLS on top when asked.

    ``ssl_context`` defaults to the system trust store with hostname checking; tests (or an
    operator with a private CA) pass their own.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:  # built lazily: loading the trust store takes ~10 ms
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    async def connect(
        self, address: IPAddress, port: int, server_name: str | None
    ) -> trio.abc.Stream:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((str(address), port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        stream = trio.SocketStream(sock)
        if server_name is None:
            return stream
        tls = trio.SSLStream(
            stream, self._context(), server_hostname=server_name, https_compatible=True
        )
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(tls)
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
                detail = exc.__cause__.verify_message or "certificate verification failed"
                raise FetchError(Reason.TLS, f"{server_name}: {detail}") from None
            if isinstance(exc.__cause__, ssl.SSLError):
                raise FetchError(Reason.TLS, f"{server_name}: TLS handshake failed") from None
            raise OSError(f"connection to {server_name} lost during TLS handshake") from None
        except BaseException:
            await trio.aclose_forcefully(tls)
            raise
        return tls
