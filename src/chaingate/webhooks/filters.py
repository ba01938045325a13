"""A webhook's ``config``: what a client may send for each kind, checked and normalised.

``parse_config`` is strict: a key the kind does not take, a value of the wrong type, a
malformed address or hash, a list over the webhook's value limit — each is a ``FilterError``
naming the key (and the index) at fault, which the API answers as
``400 invalid field 'config.<key>'``.  What it returns is the ``Filter`` chaingate stores and
shows back: 0x + lowercase hex, each list de-duplicated and sorted, amounts as decimal
strings.  Parsing a stored filter's JSON again yields the same filter.

Keys by kind (``docs/decisions/webhooks.md``, "Webhook filters", has an example of each):

=====================  ==============================================================
address_activity       ``addresses`` (required), ``selectors``
token_transfer         ``contracts``, ``addresses``, ``from``, ``to``, ``min_value``
                       (at least one of the first four)
nft_transfer           ``contracts``, ``addresses``, ``from``, ``to``, ``token_ids``
                       (at least one of the first four; ``token_ids`` needs ``contracts``)
mined_transaction      ``transaction_hashes`` (required)
log                    ``addresses``, ``topics`` (at least one address or one topic)
internal_transfer      ``addresses`` (required), ``min_value``
new_block              none
pending_transaction    ``addresses`` (required), ``selectors``
=====================  ==============================================================

Every list counts against ``max_values`` — each alone and all of them together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from chaingate.evm import abi
from chaingate.jsonvalues import Address, Uint256
from chaingate.webhooks.model import Kind

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_HASH = re.compile(r"0x[0-9a-fA-F]{64}")
_SELECTOR = re.compile(r"0x[0-9a-fA-F]{8}")
_SIGNATURE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]{0,127}\([a-z0-9\[\](),]{0,512}\)")
# Solidity's aliases: a selector is the keccak of the canonical names (uint256, int256).
_ALIAS = re.compile(r"(?<![a-z0-9])(u?int)(?![0-9a-z])")
MAX_TOPIC_POSITIONS = 4  # a log has at most four topics
MAX_KEY_SHOWN = 64


class FilterError(ValueError):
    """A config a client sent that cannot be a filter: ``key`` is the config key at fault
    (``"addresses[3]"``, ``"topics[1][0]"``; ``""`` is the config itself)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message

    @property
    def field(self) -> str:
        """The request field to name in the API's answer: ``config`` or ``config.<key>``."""
        return f"config.{self.key}" if self.key else "config"


class Filter(msgspec.Struct, frozen=True, omit_defaults=True):
    """A normalised config: empty means "not given" (no constraint from that key).

    Encodes to the JSON stored and shown back, with only the keys given; ``from_`` is
    ``"from"`` there.  ``topics`` holds one entry per position: None (any topic, but the log
    has one there), or the alternatives accepted."""

    addresses: tuple[str, ...] = ()
    contracts: tuple[str, ...] = ()
    from_: tuple[str, ...] = msgspec.field(default=(), name="from")
    to: tuple[str, ...] = ()
    min_value: str | None = None  # decimal: JSON numbers lose digits past 2**53 in clients
    topics: tuple[tuple[str, ...] | None, ...] = ()
    selectors: tuple[str, ...] = ()
    transaction_hashes: tuple[str, ...] = ()
    token_ids: tuple[str, ...] = ()  # decimal, in numeric order


# The keys each kind takes, and which of them must be there (at least one of each group).
_KEYS: dict[str, tuple[str, ...]] = {
    "address_activity": ("addresses", "selectors"),
    "token_transfer": ("contracts", "addresses", "from", "to", "min_value"),
    "nft_transfer": ("contracts", "addresses", "from", "to", "token_ids"),
    "mined_transaction": ("transaction_hashes",),
    "log": ("addresses", "topics"),
    "internal_transfer": ("addresses", "min_value"),
    "new_block": (),
    "pending_transaction": ("addresses", "selectors"),
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "address_activity": ("addresses",),
    # A webhook for every ERC-20 (or NFT) transfer of a chain is a firehose no receiver wants
    # and every block would pay for: some party or contract must narrow it.
    "token_transfer": ("contracts", "addresses", "from", "to"),
    "nft_transfer": ("contracts", "addresses", "from", "to"),
    "mined_transaction": ("transaction_hashes",),
    "log": ("addresses", "topics"),
    "internal_transfer": ("addresses",),
    "pending_transaction": ("addresses",),
}


def parse_config(kind: Kind, raw: Mapping[str, Any] | None, *, max_values: int) -> Filter:
    """The normalised filter of ``raw`` (a request's ``config``; None: not given) for
    ``kind``; ``FilterError`` names what is wrong."""
    keys = _KEYS.get(kind)
    if keys is None:
        raise ValueError(f"{kind!r} is not a kind a webhook subscribes to")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise FilterError("", "expected an object")
    for key in raw:
        if key not in keys:
            known = f" (it takes {', '.join(keys)})" if keys else " (it takes none)"
            # Echoed in the answer: cut short, since a client may send any length.
            raise FilterError(str(key)[:MAX_KEY_SHOWN], f"unknown key for {kind}{known}")
    budget = _Budget(max_values)
    values: dict[str, Any] = {}
    for key in keys:
        if key not in raw:
            continue
        value = raw[key]
        if key in ("addresses", "contracts", "from", "to"):
            values["from_" if key == "from" else key] = _addresses(key, value, budget)
        elif key == "selectors":
            values[key] = _list(key, value, budget, _selector)
        elif key == "transaction_hashes":
            values[key] = _list(key, value, budget, _hash)
        elif key == "token_ids":
            values[key] = _token_ids(key, value, budget)
        elif key == "topics":
            values[key] = _topics(key, value, budget)
        elif key == "min_value":
            values[key] = str(_uint(key, value))
    result = Filter(**values)
    _check_required(kind, result)
    return result


def filter_values(f: Filter) -> int:
    """How many values ``f`` holds: what the per-plan limit on a webhook's values counts."""
    return (
        len(f.addresses)
        + len(f.contracts)
        + len(f.from_)
        + len(f.to)
        + len(f.selectors)
        + len(f.transaction_hashes)
        + len(f.token_ids)
        + sum(len(alternatives) for alternatives in f.topics if alternatives is not None)
    )


def merge_addresses(
    f: Filter,
    add: Sequence[str],
    remove: Sequence[str],
    *,
    max_values: int | None = None,
) -> Filter:
    """``f`` with ``add`` added to its addresses and ``remove`` taken out: a PATCH that edits
    a long list without sending it whole.  Removing an address it lacks is no error.

    Errors name ``addresses_to_add[i]`` / ``addresses_to_remove[i]``.  Only a filter that has
    addresses can be edited so (another kind's config takes a whole new ``config``), and none
    may be left at the end: that would widen the filter, or watch nothing."""
    if not f.addresses:
        raise FilterError("addresses_to_add", "this webhook's config has no addresses to edit")
    for key, values in (("addresses_to_add", add), ("addresses_to_remove", remove)):
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise FilterError(key, "expected an array of addresses")
        if max_values is not None and len(values) > max_values:
            raise FilterError(key, f"at most {max_values} values, got {len(values)}")
    added = {_address(f"addresses_to_add[{i}]", a) for i, a in enumerate(add)}
    removed = {_address(f"addresses_to_remove[{i}]", a) for i, a in enumerate(remove)}
    addresses = (set(f.addresses) | added) - removed
    if not addresses:
        raise FilterError("addresses_to_remove", "would leave no address; delete the webhook")
    merged = msgspec.structs.replace(f, addresses=tuple(sorted(addresses)))
    total = filter_values(merged)
    if max_values is not None and total > max_values:
        raise FilterError("addresses_to_add", f"at most {max_values} values in all, got {total}")
    return merged


# --- values ----------------------------------------------------------------------------------


class _Budget:
    """What is left of the webhook's limit on values, all keys together."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self.left = max_values

    def take(self, key: str, count: int) -> None:
        if count > self.max_values:
            raise FilterError(key, f"at most {self.max_values} values, got {count}")
        if count > self.left:
            raise FilterError(key, f"at most {self.max_values} values in all keys together")
        self.left -= count


def _array(key: str, value: object, budget: _Budget) -> Sequence[Any]:
    # Counted before anything is parsed: a million entries cost one len().
    if not isinstance(value, list | tuple):
        raise FilterError(key, "expected an array")
    if not value:
        raise FilterError(key, "expected at least one value (leave the key out for none)")
    budget.take(key, len(value))
    return value


def _list(
    key: str, value: object, budget: _Budget, parse: Callable[[str, object], str]
) -> tuple[str, ...]:
    items = _array(key, value, budget)
    return tuple(sorted({parse(f"{key}[{i}]", item) for i, item in enumerate(items)}))


def _addresses(key: str, value: object, budget: _Budget) -> tuple[str, ...]:
    return _list(key, value, budget, _address)


def _address(key: str, value: object) -> str:
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value):
        raise FilterError(key, "expected an address: 0x followed by 40 hex digits")
    digits = value[2:]
    if digits.islower() or digits.isupper() or digits.isdigit():
        return value.lower()  # no checksum to check: skip the keccak (100,000 addresses)
    try:
        return Address.parse(value).lower()
    except ValueError as exc:
        raise FilterError(key, str(exc)) from None


def _hash(key: str, value: object) -> str:
    if not isinstance(value, str) or not _HASH.fullmatch(value):
        raise FilterError(key, "expected a 32-byte hash: 0x followed by 64 hex digits")
    return value.lower()


def _selector(key: str, value: object) -> str:
    """A 4-byte selector, given as such or as the function's signature."""
    if isinstance(value, str) and _SELECTOR.fullmatch(value):
        return value.lower()
    signature = value.replace(" ", "") if isinstance(value, str) else ""
    if not _SIGNATURE.fullmatch(signature):
        raise FilterError(
            key,
            "expected a 4-byte selector (0x + 8 hex digits) or a signature like "
            '"transfer(address,uint256)"',
        )
    name, params = signature.split("(", 1)
    params = _ALIAS.sub(r"\g<1>256", "(" + params)
    try:
        abi.parse_type(params)  # a parameter list that is no ABI type would match nothing
    except ValueError:
        raise FilterError(key, f"{value!r} has a parameter type that is no ABI type") from None
    return "0x" + abi.selector(name + params).hex()


def _uint(key: str, value: object) -> int:
    if isinstance(value, float):
        raise FilterError(key, "expected an integer as a decimal string (a float loses digits)")
    try:
        return int(Uint256.parse(value))
    except ValueError as exc:
        raise FilterError(key, str(exc)) from None


def _token_ids(key: str, value: object, budget: _Budget) -> tuple[str, ...]:
    items = _array(key, value, budget)
    ids = {_uint(f"{key}[{i}]", item) for i, item in enumerate(items)}
    return tuple(str(token_id) for token_id in sorted(ids))


def _topics(key: str, value: object, budget: _Budget) -> tuple[tuple[str, ...] | None, ...]:
    """Up to four positions, each null (any topic), a topic, or a list of alternatives — as
    ``eth_getLogs`` takes them.  A position given is one the log must have, so ``[T, null,
    null, null]`` tells a 4-topic ERC-721 ``Transfer`` from a 3-topic ERC-20 one."""
    if not isinstance(value, list | tuple):
        raise FilterError(key, "expected an array of up to 4 positions")
    if len(value) > MAX_TOPIC_POSITIONS:
        raise FilterError(key, f"at most {MAX_TOPIC_POSITIONS} positions, got {len(value)}")
    positions: list[tuple[str, ...] | None] = []
    for i, position in enumerate(value):
        where = f"{key}[{i}]"
        if position is None:
            positions.append(None)
        elif isinstance(position, str):
            budget.take(where, 1)
            positions.append((_hash(where, position),))
        elif isinstance(position, list | tuple):
            if not position:
                raise FilterError(where, "expected at least one topic (null for any)")
            budget.take(where, len(position))
            alternatives = {_hash(f"{where}[{j}]", t) for j, t in enumerate(position)}
            positions.append(tuple(sorted(alternatives)))
        else:
            raise FilterError(where, "expected null, a topic or an array of topics")
    return tuple(positions)


def _given(f: Filter, key: str) -> bool:
    if key == "topics":
        return any(alternatives is not None for alternatives in f.topics)
    value: Iterable[Any] | str | None = getattr(f, "from_" if key == "from" else key)
    return bool(value)


def _check_required(kind: str, f: Filter) -> None:
    required = _REQUIRED.get(kind, ())
    if required and not any(_given(f, key) for key in required):
        if kind == "log" and f.topics:
            raise FilterError("topics", "every position is null: give a topic, or addresses")
        if len(required) == 1:
            raise FilterError(required[0], f"required for {kind}")
        names = ", ".join(required[:-1]) + " or " + required[-1]
        raise FilterError(required[0], f"{kind} needs {names} (one at least)")
    if kind == "nft_transfer" and f.token_ids and not f.contracts:
        raise FilterError("token_ids", "needs contracts: a token id names a token only there")
