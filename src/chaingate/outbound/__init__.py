"""SSRF-safe outbound HTTP: NFT metadata now, webhook delivery later.

``Fetcher(policy).get(url, limits=...)`` / ``.post(url, body, headers=...)`` return a
``Response`` or raise ``FetchError`` (``.reason`` is a ``Reason``).  The policy refuses every
address that is not global unicast unless the operator allows it; ``OutboundPolicy.dev()``
adds loopback for the devnet.  ``Fetcher(policy, pool=ConnectionPool())`` keeps connections
alive between requests (webhook delivery); every check still runs on every request.  See
docs/decisions/outbound.md, "Outbound HTTP".
"""

from chaingate.outbound.errors import FetchError, Reason
from chaingate.outbound.fetch import Fetcher
from chaingate.outbound.limits import FetchLimits
from chaingate.outbound.net import Connector, Resolver, SystemResolver, TcpConnector
from chaingate.outbound.policy import Category, IPAddress, OutboundPolicy
from chaingate.outbound.pool import ConnectionPool, PoolKey, PoolLimits
from chaingate.outbound.response import Response

__all__ = [
    "Category",
    "ConnectionPool",
    "Connector",
    "FetchError",
    "FetchLimits",
    "Fetcher",
    "IPAddress",
    "OutboundPolicy",
    "PoolKey",
    "PoolLimits",
    "Reason",
    "Resolver",
    "Response",
    "SystemResolver",
    "TcpConnector",
]
