"""Solana PubSub's method names, subscription keys and notification frames: no I/O.

A client's ``<kind>Subscribe(params)`` becomes a ``Key``: the method and its params encoded
canonically (object members sorted, no spaces), so two clients asking for the same thing —
whatever the order of their config members — share one upstream subscription.  The params
are bounded in bytes (``MAX_PARAMS_BYTES``): a key is held for as long as anyone subscribes.

Notifications are re-framed per client without decoding their result: the upstream's
``params.result`` bytes are kept as they came, and every client's frame is the shared head
and result plus its own ``"subscription":<id>`` tail (Solana's member order).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from chaingate.ws.protocol import frame_header, push_cost

# <kind>Subscribe -> the method of its notifications.
NOTIFICATIONS = {
    "accountSubscribe": "accountNotification",
    "logsSubscribe": "logsNotification",
    "programSubscribe": "programNotification",
    "rootSubscribe": "rootNotification",
    "signatureSubscribe": "signatureNotification",
    "slotSubscribe": "slotNotification",
}
UNSUBSCRIBES = frozenset(method.replace("Subscribe", "Unsubscribe") for method in NOTIFICATIONS)
METHODS = frozenset(NOTIFICATIONS) | UNSUBSCRIBES
# A signature is notified once; the subscription then ends (on Solana as here).
ONE_SHOT = "signatureSubscribe"
# Canonical params bytes at most: a pubkey, a program id with a few memcmp filters fit.
MAX_PARAMS_BYTES = 4096
# What chaingate tells a subscription whose upstream went away (see docs/decisions/ws.md).
GAP_METHOD = "subscriptionGap"
INVALID_SUBSCRIPTION_ID = "Invalid subscription id."

_canonical = msgspec.json.Encoder(order="sorted").encode


class Key(NamedTuple):
    """One upstream subscription: what every client asking the same shares."""

    method: str
    params: bytes  # canonical JSON array

    def request(self, request_id: int) -> bytes:
        return (
            b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":' % (request_id, self.method.encode())
            + self.params
            + b"}"
        )


class ParamsError(ValueError):
    """Params chaingate refuses before asking any upstream (-32602)."""


def subscription_key(method: str, params: object) -> Key:
    """The key of ``method(params)``; ParamsError when it cannot be one.  What the params mean
    is the upstream's to judge (its error comes back to the client unchanged)."""
    if method not in NOTIFICATIONS:
        raise ParamsError(f"not a subscription method: {method[:64]}")
    if params is None:
        params = []
    if not isinstance(params, list):
        raise ParamsError("Invalid params: expected an array")
    encoded = _canonical(params)
    if len(encoded) > MAX_PARAMS_BYTES:
        raise ParamsError(
            f"Invalid params: subscription params of {len(encoded)} bytes "
            f"(chaingate takes at most {MAX_PARAMS_BYTES})"
        )
    return Key(method, encoded)


def unsubscribe_request(request_id: int, method: str, upstream_id: int) -> bytes:
    name = method.replace("Subscribe", "Unsubscribe").encode()
    return b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":[%d]}' % (
        request_id,
        name,
        upstream_id,
    )


class Upstream(msgspec.Struct):
    """Any message from the upstream: a reply (``id``) or a notification (``method``)."""

    id: Any = None
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw(b"")
    result: msgspec.Raw = msgspec.Raw(b"")
    error: msgspec.Raw = msgspec.Raw(b"")


class NotificationParams(msgspec.Struct):
    subscription: int
    result: msgspec.Raw = msgspec.Raw(b"null")


decode_upstream = msgspec.json.Decoder(Upstream).decode
decode_notification_params = msgspec.json.Decoder(NotificationParams).decode


def tail(subscription_id: int) -> bytes:
    """A client's own end of every notification frame."""
    return b',"subscription":%d}}' % subscription_id


class Notification:
    """One upstream notification, framed for each client of its key: the frame header and
    the shared body are joined once per tail length (client ids differ only in digits), so a
    client's frame is one concatenation with its own tail."""

    __slots__ = ("_leads", "body")

    def __init__(self, method: str, result: bytes) -> None:
        self.body = (
            b'{"jsonrpc":"2.0","method":"' + method.encode() + b'","params":{"result":' + result
        )
        self._leads: dict[int, tuple[bytes, int]] = {}  # tail length -> (header + body, cu)

    def frame(self, own_tail: bytes) -> tuple[bytes, int]:
        """The frame for a client whose tail is ``own_tail``, and the compute units it costs."""
        cached = self._leads.get(len(own_tail))
        if cached is None:
            length = len(self.body) + len(own_tail)
            cached = (frame_header(length) + self.body, push_cost(length))
            self._leads[len(own_tail)] = cached
        lead, cu = cached
        return lead + own_tail, cu


def gap_result(reason: str, lost_at: float, resumed_at: float, upstream: str) -> bytes:
    """What a ``subscriptionGap`` notification says: notifications between ``lost_at`` and
    ``resumed_at`` (unix seconds) may be missing."""
    return msgspec.json.encode(
        {
            "reason": reason,
            "lostAt": round(lost_at, 3),
            "resumedAt": round(resumed_at, 3),
            "upstream": upstream,
        }
    )
