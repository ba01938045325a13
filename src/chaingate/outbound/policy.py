"""Which destinations an outbound request may reach (sans-IO: decisions only, no sockets).

Every address a name resolves to is classified; anything that is not plainly global unicast is
refused unless the policy allows its class.  IPv6 forms that embed an IPv4 address
(IPv4-mapped, 6to4, NAT64's well-known prefix) are judged by the IPv4 address inside, since
that is where the packets end up.  Cloud metadata endpoints, the unspecified address (which
Linux routes to the local host) and multicast are refused whatever the policy says.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Category(enum.StrEnum):
    METADATA = "metadata"
    UNSPECIFIED = "unspecified"
    LOOPBACK = "loopback"
    LINK_LOCAL = "link_local"
    MULTICAST = "multicast"
    SHARED = "shared"  # 100.64.0.0/10, carrier-grade NAT
    PRIVATE = "private"  # RFC 1918 and IPv6 unique local addresses
    RESERVED = "reserved"
    NON_GLOBAL = "non_global"  # documentation, benchmarking, Teredo, ... (not is_global)


# No operator setting reaches these: nothing legitimate is served there to us.
NEVER_ALLOWED = frozenset({Category.METADATA, Category.UNSPECIFIED, Category.MULTICAST})

_ip = ipaddress.ip_address
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        _ip("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, DigitalOcean...
        _ip("169.254.170.2"),  # AWS ECS task credentials
        _ip("169.254.169.253"),  # AWS VPC DNS
        _ip("fd00:ec2::254"),  # AWS IMDS over IPv6
        _ip("fd00:ec2::23"),  # AWS time sync / VPC DNS over IPv6
        _ip("100.100.100.200"),  # Alibaba Cloud
        _ip("192.0.0.192"),  # Oracle Cloud
    }
)
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.com",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
    }
)

_UNSPECIFIED_V4 = ipaddress.IPv4Network("0.0.0.0/8")
_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")
_PRIVATE = (
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.168.0.0/16"),
    ipaddress.IPv6Network("fc00::/7"),
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclasses.dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """Where outbound requests may go.  The defaults are production's: public addresses only.

    ``allow_loopback`` is for the devnet (``chaingate dev``) and tests only.
    ``allow_private`` admits RFC 1918, unique local (fc00::/7) and CGNAT (100.64.0.0/10)
    addresses, for operators whose IPFS gateway or webhook receivers live on their own network.
    ``allow_cidrs`` admits exactly these networks (for one internal host rather than all of
    them); neither reaches metadata, unspecified or multicast addresses.
    ``allowed_ports``: None allows every port (gateways run on 8080, devnets on anything).
    """

    allow_loopback: bool = False
    allow_private: bool = False
    allow_cidrs: tuple[IPNetwork, ...] = ()
    allowed_ports: frozenset[int] | None = None

    @classmethod
    def production(
        cls,
        *,
        allow_private: bool = False,
        allow_cidrs: Iterable[str | IPNetwork] = (),
        allowed_ports: Iterable[int] | None = None,
    ) -> OutboundPolicy:
        return cls(
            allow_private=allow_private,
            allow_cidrs=tuple(ipaddress.ip_network(cidr) for cidr in allow_cidrs),
            allowed_ports=None if allowed_ports is None else frozenset(allowed_ports),
        )

    @classmethod
    def dev(cls) -> OutboundPolicy:
        """The devnet's setting: loopback too (the local IPFS gateway, token URI servers)."""
        return cls(allow_loopback=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    address: IPAddress  # where to connect: an IPv4-mapped address is unwrapped
    category: Category | None  # None: an ordinary global address


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries to (IPv4-mapped, 6to4, NAT64), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@functools.lru_cache(maxsize=4096)
def classify(address: IPAddress) -> Category | None:
    """The class of ``address`` that needs permission, or None for a global unicast one
    (pure: remembered, since every outbound request asks it of every address again)."""
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        # fe80::1%eth0 is not equal to fe80::1: judge the address without its zone.
        address = ipaddress.IPv6Address(address.compressed.split("%", 1)[0])
    if address in METADATA_ADDRESSES:
        return Category.METADATA
    inner = embedded_ipv4(address)
    if inner is not None:
        # The IPv6 prefixes themselves sit in ::/8 or are routable; what matters is the inside.
        return classify(inner)
    if address.is_unspecified or address in _UNSPECIFIED_V4:
        return Category.UNSPECIFIED
    if address.is_loopback:
        return Category.LOOPBACK
    if address.is_link_local:
        return Category.LINK_LOCAL
    if address.is_multicast:
        return Category.MULTICAST
    if address in _SHARED_V4:
        return Category.SHARED
    if any(address in network for network in _PRIVATE):
        return Category.PRIVATE
    if address.is_reserved:
        return Category.RESERVED
    if address.is_private or not address.is_global:
        return Category.NON_GLOBAL
    return None


@functools.lru_cache(maxsize=4096)
def judge(policy: OutboundPolicy, address: IPAddress) -> Verdict:
    """May a request connect to ``address``?  (Pure, and asked again on every request:
    remembered.)"""
    target: IPAddress = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        target = address.ipv4_mapped  # connect over IPv4: the same host, without dual-stack
    category = classify(address)
    if category is None:
        return Verdict(True, target, None)
    if category in NEVER_ALLOWED:
        return Verdict(False, target, category)
    allowed = (
        any(target in network or address in network for network in policy.allow_cidrs)
        or (category is Category.LOOPBACK and policy.allow_loopback)
        or (category in (Category.PRIVATE, Category.SHARED) and policy.allow_private)
    )
    return Verdict(allowed, target, category)


def judge_name(policy: OutboundPolicy, host: str) -> Category | None:
    """The class a host *name* is refused as, before any resolution; None if it may resolve.

    Resolution is checked anyway; refusing these names first means a resolver that answers
    something odd for them (a split-horizon DNS, /etc/hosts) is never even asked.
    """
    name = host.rstrip(".").lower()
    if name in METADATA_NAMES:
        return Category.METADATA
    if (name == "localhost" or name.endswith(".localhost")) and not policy.allow_loopback:
        return Category.LOOPBACK
    return None


def port_allowed(policy: OutboundPolicy, port: int) -> bool:
    return policy.allowed_ports is None or port in policy.allowed_ports
