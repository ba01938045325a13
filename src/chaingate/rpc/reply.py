"""What the proxy answers: a request's reply to the edge, a call's outcome, its usage.

``RpcService.handle`` returns an ``RpcReply`` (the edge and the WebSocket session frame it and
book its ``usage``); a method chaingate answers itself returns an ``Outcome``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from chaingate.refusals import Rejection

# Who is calling (the key gate's principal): the proxy reads only its allowlists.
Principal = Any

# (result, error): exactly one is raw JSON bytes.
Outcome = tuple[bytes | None, bytes | None]
# A method chaingate answers itself (methods.toml ``local = true``): the call's raw params and
# the caller's principal in, its outcome out.  A subsystem registers it (``answer_locally``).
LocalAnswer = Callable[[bytes | None, Principal], Awaitable[Outcome]]
# The calls of one request answered so far, each (method, requests, billed units, errors): the
# request's usage, metered once by whoever answers the request (``chaingate.auth.gate.book``).
Usage = list[tuple[str, int, int, int]]


class RpcReply:
    """What the edge needs to frame the HTTP response of one RPC request."""

    __slots__ = ("admitted", "body", "cache", "label", "rejection", "usage")

    def __init__(
        self,
        body: bytes | None,
        cache: bytes,
        label: str,
        rejection: Rejection | None = None,
        admitted: bool = True,
        usage: Usage | None = None,
    ) -> None:
        self.body = body  # None: nothing to send (only notifications)
        self.cache = cache  # X-Cache value: HIT, MISS or PARTIAL
        self.label = label  # method name (or "batch") for logs
        self.rejection = rejection
        # False for what was answered before admission (malformed, unknown method, a bad
        # block tag, a range over the limit): its latency is not the caller's usage.
        self.admitted = admitted and rejection is None
        # The calls answered (the caller's usage), each (method, requests, units, errors).
        self.usage: Usage = usage if usage is not None else []
