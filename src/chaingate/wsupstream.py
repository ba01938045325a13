"""Messages from an upstream WebSocket, chaingate the client (wsproto), without I/O.

Text messages are assembled from their frames and bounded; the events that end the
connection (a refused upgrade, a close) are raised as ``ConnectionError``, which the callers
(the follower's ``newHeads`` source, the Solana PubSub hub) treat as a lost upstream.  The
other events (accept, ping) and the socket stay with the caller.
"""

from __future__ import annotations

from wsproto.events import CloseConnection, Event, RejectConnection, TextMessage


class UpstreamMessages:
    """One connection's messages, each at most ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts = bytearray()

    def complete(self, event: Event) -> bytes | None:
        """The message ``event`` completes; None for a part of one or an event of another
        kind.  ``ConnectionError`` for a refused upgrade, a close or a message over the
        limit."""
        if isinstance(event, RejectConnection):
            raise ConnectionError(f"upgrade refused: HTTP {event.status_code}")
        if isinstance(event, CloseConnection):
            raise ConnectionError(f"upstream closed: {event.code}")
        if not isinstance(event, TextMessage):
            return None
        self._parts += event.data.encode()
        if len(self._parts) > self._limit:
            raise ConnectionError("upstream message too large")
        if not event.message_finished:
            return None
        message = bytes(self._parts)
        self._parts.clear()
        return message
