"""The ``logs`` subscription filter, with geth's semantics, as pure code.

Parameters (``eth_subscribe("logs", {...})``):

* ``address`` — one address or a list of them; a log matches when its address is one of them.
  Absent, null or an empty list: any address.
* ``topics`` — up to four positions; each is null (any topic), one topic, or a list of topics
  (OR; a null inside the list, or an empty list, makes the position a wildcard).  A log with
  fewer topics than the filter has positions never matches — ``[null]`` needs one topic.

``fromBlock``/``toBlock`` are accepted and ignored (a subscription only ever sees new blocks),
as geth does for subscriptions.  Addresses and topics are compared case-insensitively.

Values are kept as raw bytes (20 or 32, not 42 or 66 characters of hex: about half the
memory, and no case to fold); the hub's index (``chaingate.ws.logindex``) shares identical
filters and identical value sets between subscriptions.  A filter's ``cost`` — 20 bytes per
distinct address, 32 per distinct topic value — is what the per-connection and per-key
budgets count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from chaingate.chain.events import Log
from chaingate.ws.caps import Limit

# geth's bounds (eth/filters): positions, alternatives per position.  How many addresses and
# topics a whole filter may hold is the plan's (and [ws]'s) business: see ``caps``.
MAX_TOPICS = 4
MAX_TOPIC_OPTIONS = 1000
MAX_ADDRESSES = 1000
ADDRESS_BYTES = 20
TOPIC_BYTES = 32

DEFAULT_ADDRESSES = Limit(MAX_ADDRESSES, "[ws] max_filter_addresses")
DEFAULT_TOPICS = Limit(MAX_TOPICS * MAX_TOPIC_OPTIONS, "[ws] max_filter_topics")

_ADDRESS = re.compile(r"0[xX][0-9a-fA-F]{40}").fullmatch
_TOPIC = re.compile(r"0[xX][0-9a-fA-F]{64}").fullmatch
_fromhex = bytes.fromhex

Values = frozenset[bytes]
FilterKey = tuple[Values | None, tuple[Values | None, ...]]


class FilterError(ValueError):
    """Invalid filter parameters; the message is what the client is told (-32602).  ``limit``
    is set when the filter is well formed but over a cap."""

    def __init__(self, message: str, limit: Limit | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class LogFilter:
    """A parsed filter: ``addresses`` None means any; each topic position None means any."""

    __slots__ = ("addresses", "checks", "cost", "key", "need", "topics")

    def __init__(self, addresses: Values | None, topics: tuple[Values | None, ...]) -> None:
        self.addresses = addresses
        self.topics = topics
        self.key: FilterKey = (addresses, topics)
        # Only the constrained positions are checked; a log needs ``need`` topics at least.
        self.checks = tuple((i, wanted) for i, wanted in enumerate(topics) if wanted is not None)
        self.need = len(topics)
        self.cost = ADDRESS_BYTES * len(addresses or ()) + TOPIC_BYTES * sum(
            len(wanted) for _, wanted in self.checks
        )

    def accepts(self, address: bytes, topics: Sequence[bytes]) -> bool:
        """Does a log with this address and these topics (raw bytes, see ``log_key``) match?"""
        addresses = self.addresses
        if addresses is not None and address not in addresses:
            return False
        if self.need > len(topics):
            return False
        for position, wanted in self.checks:  # noqa: SIM110 (a generator costs more here)
            if topics[position] not in wanted:
                return False
        return True

    def matches(self, log: Log) -> bool:
        key = log_key(log)
        return key is not None and self.accepts(*key)


ANY = LogFilter(None, ())


def log_key(log: Log) -> tuple[bytes, list[bytes]] | None:
    """A log's address and topics as filters hold them; None if the node sent no hex."""
    try:
        return _fromhex(log.address[2:]), [_fromhex(topic[2:]) for topic in log.topics]
    except ValueError:
        return None


def _value(
    value: object, valid: Callable[[str], re.Match[str] | None], size: int, what: str
) -> bytes:
    if not isinstance(value, str):
        raise FilterError(f"invalid {what}: expected a hex string")
    if valid(value) is None:
        raise FilterError(f"invalid {what} {value[:80]!r}: expected {size} bytes as 0x-hex")
    return _fromhex(value[2:])


def _address(value: object) -> bytes:
    return _value(value, _ADDRESS, ADDRESS_BYTES, "address")


def _topic(value: object) -> bytes:
    return _value(value, _TOPIC, TOPIC_BYTES, "topic")


def _addresses(raw: object, cap: Limit) -> Values | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return frozenset([_address(raw)])
    if not isinstance(raw, list):
        raise FilterError("invalid address: expected an address or a list of addresses")
    if cap.exceeded_by(len(raw)):
        raise FilterError(
            f"too many addresses in the filter: {len(raw)} (limit {cap.name} = {cap.value})", cap
        )
    if not raw:
        return None
    return frozenset(map(_address, raw))


def _position(raw: object) -> Values | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return frozenset([_topic(raw)])
    if not isinstance(raw, list):
        raise FilterError("invalid topic: expected null, a topic or a list of topics")
    if len(raw) > MAX_TOPIC_OPTIONS:
        raise FilterError(f"too many topics in one position (at most {MAX_TOPIC_OPTIONS})")
    if None in raw:
        for item in raw:  # still validated: a malformed topic is an error wherever it is
            if item is not None:
                _topic(item)
        return None  # geth: a null alternative matches anything
    return frozenset(map(_topic, raw)) if raw else None


def _topic_count(positions: list[Any]) -> int:
    return sum(len(p) if isinstance(p, list) else p is not None for p in positions)


def parse_log_filter(
    raw: object, addresses: Limit = DEFAULT_ADDRESSES, topics: Limit = DEFAULT_TOPICS
) -> LogFilter:
    """A LogFilter from the decoded second ``eth_subscribe`` parameter (absent: None), with
    at most ``addresses`` addresses and ``topics`` topic alternatives (counted as sent)."""
    if raw is None:
        return ANY
    if not isinstance(raw, dict):
        raise FilterError("invalid logs filter: expected an object")
    topics_raw = raw.get("topics")
    if topics_raw is None:
        positions: tuple[Values | None, ...] = ()
    elif not isinstance(topics_raw, list):
        raise FilterError("invalid topics: expected a list")
    elif len(topics_raw) > MAX_TOPICS:
        raise FilterError(f"too many topic positions (at most {MAX_TOPICS})")
    else:
        count = _topic_count(topics_raw)
        if topics.exceeded_by(count):
            raise FilterError(
                f"too many topics in the filter: {count} (limit {topics.name} = {topics.value})",
                topics,
            )
        positions = tuple(_position(item) for item in topics_raw)
    return LogFilter(_addresses(raw.get("address"), addresses), positions)
