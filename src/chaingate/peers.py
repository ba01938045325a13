"""Which clients count as one for per-address limits.

An IPv4 address is one client; an IPv6 client is its /64, because a single host is routinely
given a whole /64 and can rotate through it at will (RFC 4941 privacy addresses), so a limit
per exact IPv6 address limits nothing.  An IPv4-mapped IPv6 address is its IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

_CACHE_SIZE = 4096
_cache: OrderedDict[str, str] = OrderedDict()


def peer_group(peer: str) -> str:
    """The key per-address limits use for ``peer`` (as the edge reports it)."""
    if ":" not in peer:
        return peer  # IPv4 (or "unix"): the address itself, without any parsing
    group = _cache.get(peer)
    if group is not None:
        return group
    try:
        address = ipaddress.IPv6Address(peer.split("%", 1)[0])
    except ValueError:
        group = peer
    else:
        mapped = address.ipv4_mapped
        if mapped is not None:
            group = str(mapped)
        else:
            group = str(ipaddress.IPv6Network((address, 64), strict=False))
    _cache[peer] = group
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return group
