"""The upstream WebSocket's messages (chaingate.wsupstream), without I/O."""

from __future__ import annotations

import pytest
from wsproto.events import CloseConnection, Event, Ping, RejectConnection, TextMessage

from chaingate.wsupstream import UpstreamMessages


def test_a_message_in_frames_is_whole_once_finished() -> None:
    messages = UpstreamMessages(limit=16)
    assert messages.complete(TextMessage('{"a":', message_finished=False)) is None
    assert messages.complete(Ping(b"x")) is None
    assert messages.complete(TextMessage("1}")) == b'{"a":1}'
    assert messages.complete(TextMessage("2")) == b"2"  # the next one starts afresh


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (RejectConnection(status_code=403), "upgrade refused: HTTP 403"),
        (CloseConnection(code=1001), "upstream closed: 1001"),
        (TextMessage("x" * 17, message_finished=False), "upstream message too large"),
    ],
)
def test_what_ends_the_connection(event: Event, reason: str) -> None:
    with pytest.raises(ConnectionError, match=reason):
        UpstreamMessages(limit=16).complete(event)
