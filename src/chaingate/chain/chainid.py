"""A network's chain id, asked of its upstreams (``eth_chainId``) when the config gives none.

Every upstream is asked (each one itself: an answer from another upstream after a failover
does not count for it); the ones that answer must agree — upstreams of one network on
different chains would mix them in every answer, so that is refused, naming each.
"""

from __future__ import annotations

import msgspec
import trio

from chaingate.rpc.errors import UpstreamError
from chaingate.rpc.pool import UpstreamPool

__all__ = ["ChainIdMismatch", "upstream_chain_id"]

_BODY = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'


class _Answer(msgspec.Struct):
    result: str | None = None


_decode = msgspec.json.Decoder(_Answer).decode


class ChainIdMismatch(Exception):
    """The upstreams answered different chain ids: ``found`` maps upstream name -> id."""

    def __init__(self, found: dict[str, int]) -> None:
        named = ", ".join(f"{name}: {cid}" for name, cid in sorted(found.items()))
        super().__init__(f"the upstreams are on different chains ({named})")
        self.found = found


async def upstream_chain_id(pool: UpstreamPool, seconds: float = 10.0) -> int | None:
    """The chain id every answering upstream agrees on; None when none answered."""
    found: dict[str, int] = {}

    async def ask(name: str) -> None:
        deadline = trio.current_time() + seconds
        try:
            upstream, response, _ = await pool.request_parsed(
                _BODY, retry_safe=True, deadline=deadline, prefer=name
            )
            answer = _decode(bytes(response.body))
        except (UpstreamError, msgspec.DecodeError):
            return
        if upstream.name != name or not isinstance(answer.result, str):
            return  # another upstream answered for it, or an error
        try:
            found[name] = int(answer.result, 16)
        except ValueError:
            return

    async with trio.open_nursery() as nursery:
        for upstream in pool.ranked():
            nursery.start_soon(ask, upstream.name)
    ids = set(found.values())
    if len(ids) > 1:
        raise ChainIdMismatch(found)
    return ids.pop() if ids else None
