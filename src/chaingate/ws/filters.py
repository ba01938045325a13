"""The ``logs`` subscription filter, with geth's semantics, as pure code.

Parameters (``eth_subscribe("logs", {...})``):

* ``address`` — one address or a list of them; a log matches when its address is one of them.
  Absent, null or an empty list: any address.
* ``topics`` — up to four positions; each is null (any topic), one topic, or a list of topics
  (OR; a null inside the list, or an empty list, makes the position a wildcard).  A log with
  fewer topics than the filter has positions never matches — ``[null]`` needs one topic.

``fromBlock``/``toBlock`` are accepted and ignored (a subscription only ever sees new blocks),
as geth does for subscriptions.  Addresses and topics are compared case-insensitively.
"""

from __future__ import annotations

from typing import Any

from chaingate.chain.events import Log

# geth's bounds (eth/filters): positions, alternatives per position, addresses.
MAX_TOPICS = 4
MAX_TOPIC_OPTIONS = 1000
MAX_ADDRESSES = 1000

_HEX = frozenset("0123456789abcdefABCDEF")


class FilterError(ValueError):
    """Invalid filter parameters; the message is what the client is told (-32602)."""


class LogFilter:
    """A parsed filter: ``addresses`` None means any; each topic position None means any."""

    __slots__ = ("addresses", "topics")

    def __init__(
        self, addresses: frozenset[str] | None, topics: tuple[frozenset[str] | None, ...]
    ) -> None:
        self.addresses = addresses
        self.topics = topics

    def matches(self, log: Log) -> bool:
        addresses = self.addresses
        if addresses is not None and log.address.lower() not in addresses:
            return False
        topics = self.topics
        if not topics:
            return True
        have = log.topics
        if len(topics) > len(have):
            return False
        for wanted, topic in zip(topics, have, strict=False):
            if wanted is not None and topic.lower() not in wanted:
                return False
        return True


ANY = LogFilter(None, ())


def _hex_bytes(value: Any, size: int, what: str) -> str:
    if not isinstance(value, str):
        raise FilterError(f"invalid {what}: expected a hex string")
    if not value.startswith(("0x", "0X")) or len(value) != 2 + 2 * size:
        raise FilterError(f"invalid {what} {value[:80]!r}: expected {size} bytes as 0x-hex")
    if not all(c in _HEX for c in value[2:]):
        raise FilterError(f"invalid {what} {value[:80]!r}: not hex")
    return "0x" + value[2:].lower()


def _addresses(raw: Any) -> frozenset[str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return frozenset([_hex_bytes(raw, 20, "address")])
    if not isinstance(raw, list):
        raise FilterError("invalid address: expected an address or a list of addresses")
    if len(raw) > MAX_ADDRESSES:
        raise FilterError(f"too many addresses (at most {MAX_ADDRESSES})")
    if not raw:
        return None
    return frozenset(_hex_bytes(item, 20, "address") for item in raw)


def _position(raw: Any) -> frozenset[str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return frozenset([_hex_bytes(raw, 32, "topic")])
    if not isinstance(raw, list):
        raise FilterError("invalid topic: expected null, a topic or a list of topics")
    if len(raw) > MAX_TOPIC_OPTIONS:
        raise FilterError(f"too many topics in one position (at most {MAX_TOPIC_OPTIONS})")
    options = set()
    for item in raw:
        if item is None:
            return None  # geth: a null alternative matches anything
        options.add(_hex_bytes(item, 32, "topic"))
    return frozenset(options) if options else None


def parse_log_filter(raw: Any) -> LogFilter:
    """A LogFilter from the decoded second ``eth_subscribe`` parameter (absent: None)."""
    if raw is None:
        return ANY
    if not isinstance(raw, dict):
        raise FilterError("invalid logs filter: expected an object")
    addresses = _addresses(raw.get("address"))
    topics_raw = raw.get("topics")
    if topics_raw is None:
        topics: tuple[frozenset[str] | None, ...] = ()
    elif not isinstance(topics_raw, list):
        raise FilterError("invalid topics: expected a list")
    elif len(topics_raw) > MAX_TOPICS:
        raise FilterError(f"too many topic positions (at most {MAX_TOPICS})")
    else:
        topics = tuple(_position(item) for item in topics_raw)
    return LogFilter(addresses, topics)
