"""Per-key allowlists (Alchemy's and Infura's "security" settings), checked from memory.

Four optional lists, each empty by default (empty: no restriction):

* ``origins`` — the browser origins the key may be used from: ``https://app.example.com``, or
  ``https://*.example.com`` for any subdomain (not the apex).  With the list set, a request
  whose ``Origin`` is missing or not on it is refused, WebSocket handshakes included.
* ``ips`` — client address ranges (CIDR, IPv4 and IPv6; a bare address is one host).
* ``methods`` — the JSON-RPC methods the key may call.
* ``contracts`` — the addresses ``eth_call``/``eth_estimateGas`` (``to``),
  ``eth_sendRawTransaction`` (the signed transaction's ``to``, every transaction type) and
  ``eth_getLogs``/``eth_newFilter`` (``address``) may target.

``Allowlists`` is the stored form (one JSON object in ``api_keys.allowlists``); ``parse_*``
validate and normalise what an operator types; ``Policy`` is the compiled form the key
registry keeps on each ``Principal`` and the gate and the RPC service ask, sans IO.  A refusal
is a message naming the list, shown to the client.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from chaingate.evm.tx import tx_target

MAX_ENTRIES = 256  # per list: an allowlist is a short human-made list, not a database
_SHOWN = 8  # entries named in a refusal message
_PEER_CACHE = 1024

# JSON-RPC error codes of a call refused by a list (EIP-1474).
METHOD_NOT_SUPPORTED = -32004
RESOURCE_UNAVAILABLE = -32002


class AllowlistError(ValueError):
    """An entry an operator typed that cannot be an allowlist entry (message says why)."""


class Allowlists(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The stored form: normalised entries, each list optional."""

    origins: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    contracts: tuple[str, ...] = ()

    def empty(self) -> bool:
        return not (self.origins or self.ips or self.methods or self.contracts)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Allowlists)


def dumps(lists: Allowlists) -> str | None:
    """The column's value: None when no list is set."""
    return None if lists.empty() else _encoder.encode(lists).decode()


def loads(text: str | None) -> Allowlists:
    if not text:
        return Allowlists()
    return _decoder.decode(text)


# --- parsing what an operator types ------------------------------------------------------

_ORIGIN_ENTRY = re.compile(
    r"(https?)://(\*\.)?([a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
    r"|\[[0-9a-f:.]+\])(?::([0-9]{1,5}))?/?"
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_METHOD = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")


def _bounded(entries: list[str], what: str) -> tuple[str, ...]:
    unique = tuple(dict.fromkeys(entries))
    if len(unique) > MAX_ENTRIES:
        raise AllowlistError(f"at most {MAX_ENTRIES} {what} per key, got {len(unique)}")
    return unique


def parse_origin(text: str) -> str:
    """``scheme://host[:port]`` as browsers send it in ``Origin`` (lowercase, no default port,
    no path); ``*.`` before the host allows its subdomains."""
    entry = text.strip().lower()
    match = _ORIGIN_ENTRY.fullmatch(entry)
    if match is None:
        raise AllowlistError(
            f"not an origin: {text!r} (expected scheme://host[:port], e.g. "
            "https://app.example.com or https://*.example.com; no path, ASCII host)"
        )
    scheme, wildcard, host, port = match.groups()
    if wildcard and host.startswith("["):
        raise AllowlistError(f"a wildcard needs a domain name, not an address: {text!r}")
    port_text = ""
    if port is not None:
        number = int(port)
        if not 1 <= number <= 65535:
            raise AllowlistError(f"port out of range in {text!r}")
        if number != _DEFAULT_PORTS[scheme]:
            port_text = f":{number}"
    return f"{scheme}://{wildcard or ''}{host}{port_text}"


def parse_ip(text: str) -> str:
    """A CIDR range (or one address), IPv4 or IPv6, in its canonical form."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise AllowlistError(
            f"not an IP address or CIDR range: {text!r} (e.g. 203.0.113.0/24, 2001:db8::/32)"
        ) from None
    return str(network)


def parse_method(text: str) -> str:
    name = text.strip()
    if not _METHOD.fullmatch(name):
        raise AllowlistError(f"not a JSON-RPC method name: {text!r}")
    return name


def parse_contract(text: str) -> str:
    address = text.strip()
    if not _ADDRESS.fullmatch(address):
        raise AllowlistError(f"not a contract address (0x and 40 hex digits): {text!r}")
    return address.lower()


def build(
    origins: Iterable[str] = (),
    ips: Iterable[str] = (),
    methods: Iterable[str] = (),
    contracts: Iterable[str] = (),
) -> Allowlists:
    """Validated, normalised lists (AllowlistError names the first bad entry)."""
    return Allowlists(
        origins=_bounded([parse_origin(o) for o in origins], "origins"),
        ips=_bounded([parse_ip(i) for i in ips], "IP ranges"),
        methods=_bounded([parse_method(m) for m in methods], "methods"),
        contracts=_bounded([parse_contract(c) for c in contracts], "contracts"),
    )


# --- what a signed transaction targets ---------------------------------------------------

# Typed transactions: where ``to`` is among the fields (EIP-2930, 1559, 4844, 7702).
# --- the compiled form, asked on the hot path ---------------------------------------------


class _Target(msgspec.Struct):
    to: str | None = None


class _Filter(msgspec.Struct):
    address: str | list[str] | None = None


_params = msgspec.json.Decoder(list[msgspec.Raw])
_target = msgspec.json.Decoder(_Target)
_filter = msgspec.json.Decoder(_Filter)
_string = msgspec.json.Decoder(str)

_CALL_LIKE = frozenset({"eth_call", "eth_estimateGas"})
_FILTER_LIKE = frozenset({"eth_getLogs", "eth_newFilter"})
_SEND_RAW = "eth_sendRawTransaction"
CONTRACT_METHODS = _CALL_LIKE | _FILTER_LIKE | {_SEND_RAW}

# What a browser sends in Origin: scheme://host[:port], already lowercase.
_REQUEST_ORIGIN = re.compile(rb"(https?)://([a-z0-9.-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")


def _named(entries: tuple[str, ...]) -> str:
    shown = ", ".join(entries[:_SHOWN])
    if len(entries) > _SHOWN:
        shown += f", … ({len(entries) - _SHOWN} more)"
    return shown


class Policy:
    """One key's lists, compiled for quick checks.  Immutable once built (the registry swaps
    the whole policy when the stored lists change)."""

    __slots__ = (
        "_broken",
        "_contracts",
        "_exact_origins",
        "_methods",
        "_networks",
        "_peers",
        "_wild_origins",
        "lists",
        "source",
    )

    def __init__(self, lists: Allowlists, source: str | None = None) -> None:
        self.lists = lists
        self.source = source  # the stored JSON it was built from (to see whether it changed)
        exact: set[bytes] = set()
        wild: list[tuple[bytes, bytes]] = []  # (scheme://, .domain[:port])
        for origin in lists.origins:
            scheme, _, rest = origin.partition("://")
            if rest.startswith("*."):
                wild.append(((scheme + "://").encode(), rest[1:].encode()))
            else:
                exact.add(origin.encode())
        self._exact_origins = frozenset(exact)
        self._wild_origins = tuple(wild)
        self._networks = tuple(ipaddress.ip_network(ip) for ip in lists.ips)
        self._peers: dict[str, bool] = {}
        self._methods = frozenset(lists.methods)
        self._contracts = frozenset(bytes.fromhex(c[2:]) for c in lists.contracts)
        self._broken: str | None = None

    @classmethod
    def refusing(cls, source: str | None) -> Policy:
        """What a key whose stored lists cannot be read gets: nothing (fail closed — the
        lists were set to restrict it, and which restriction is now unknown)."""
        policy = cls(Allowlists(), source)
        policy._broken = "this API key's allowlists cannot be read: ask the operator to set them"
        return policy

    # --- who may call (asked once per request by the gate) --------------------------------

    def origin_allowed(self, origin: bytes) -> bool:
        if not self.lists.origins:
            return True
        origin = origin.lower()
        if origin in self._exact_origins:
            return True
        if not self._wild_origins or _REQUEST_ORIGIN.fullmatch(origin) is None:
            return False
        for scheme, suffix in self._wild_origins:
            if origin.startswith(scheme) and origin.endswith(suffix):
                host = origin[len(scheme) : len(origin) - len(suffix)]
                if host and not host.endswith(b".") and b":" not in host:
                    return True
        return False

    def origin_refusal(self, origin: bytes | None) -> str | None:
        if self._broken is not None:
            return self._broken
        if not self.lists.origins:
            return None
        if origin is None:
            return (
                "this API key may be used only from the browser origins on its origin "
                f"allowlist ({_named(self.lists.origins)}), and the request has no Origin"
            )
        if self.origin_allowed(origin):
            return None
        shown = origin[:200].decode("latin-1")
        return (
            f"origin {shown} is not on this API key's origin allowlist "
            f"({_named(self.lists.origins)})"
        )

    def admits(self, origin: bytes | None, peer: str) -> bool:
        """May a request from ``origin`` and ``peer`` use the key (the fast lane asks; a
        refused request goes to the gate, which says why)?"""
        return self.origin_refusal(origin) is None and self.peer_allowed(peer)

    def peer_allowed(self, peer: str) -> bool:
        if not self._networks:
            return True
        verdict = self._peers.get(peer)
        if verdict is None:
            verdict = self._judge_peer(peer)
            if len(self._peers) >= _PEER_CACHE:
                self._peers.clear()  # a policy sees few addresses; a flood just starts over
            self._peers[peer] = verdict
        return verdict

    def _judge_peer(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False  # a Unix socket (or anything not an address) is on no list
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self._networks)

    def peer_refusal(self, peer: str) -> str | None:
        if self.peer_allowed(peer):
            return None
        return (
            f"client address {peer[:64]} is not on this API key's IP allowlist "
            f"({_named(self.lists.ips)})"
        )

    # --- what may be called (asked per JSON-RPC call by the RPC service) -----------------

    def call_refusal(self, method: str | None, params: bytes | None) -> tuple[int, str] | None:
        """(JSON-RPC error code, message) for a call a list forbids, else None."""
        if self._methods and method not in self._methods:
            return METHOD_NOT_SUPPORTED, (
                f"method {str(method)[:64]} is not on this API key's method allowlist "
                f"({_named(self.lists.methods)})"
            )
        if self._contracts and method in CONTRACT_METHODS:
            return self._contract_refusal(method, params)
        return None

    def contract_refusal(self, method: str, params: bytes) -> tuple[int, str] | None:
        """The contract list alone, for a call shaped like ``method``'s: what a subsystem
        answering calls itself (a simulation of an eth_call) asks of the key."""
        if not self._contracts:
            return None
        return self._contract_refusal(method, params)

    def subscribe_refusal(self, params: list[Any]) -> tuple[int, str] | None:
        """The same lists for ``eth_subscribe`` over a WebSocket (``params`` decoded): the
        method list must name it, and a ``logs`` subscription is a filter like eth_getLogs."""
        refused = self.call_refusal("eth_subscribe", None)
        if refused is not None or not self._contracts or params[0] != "logs":
            return refused
        criteria = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        address = criteria.get("address")
        filters = b"[" + _encoder.encode({"address": address}) + b"]"
        return self._contract_refusal("eth_subscribe(logs)", filters)

    def _contract_refusal(self, method: str, params: bytes | None) -> tuple[int, str] | None:
        listed = _named(self.lists.contracts)
        try:
            targets = self._targets(method, params)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return RESOURCE_UNAVAILABLE, (
                f"{method}: cannot tell which contract the call targets (malformed params), "
                f"and this API key may target only the contracts on its contract allowlist "
                f"({listed})"
            )
        if targets is None:
            what = (
                "creates a contract"
                if method in (_SEND_RAW, *_CALL_LIKE)
                else "reads every contract's logs"
            )
            return RESOURCE_UNAVAILABLE, (
                f"{method} without a target address {what}; this API key may target only "
                f"the contracts on its contract allowlist ({listed})"
            )
        for target in targets:
            if target not in self._contracts:
                return RESOURCE_UNAVAILABLE, (
                    f"{method}: contract 0x{target.hex()} is not on this API key's contract "
                    f"allowlist ({listed})"
                )
        return None

    @staticmethod
    def _targets(method: str, params: bytes | None) -> list[bytes] | None:
        """The addresses a call targets; None when it targets none (or every one)."""
        items = _params.decode(params or b"[]")
        if not items:
            raise ValueError("no params")
        first = items[0]
        if method == _SEND_RAW:
            text = _string.decode(first)
            if text[:2] not in ("0x", "0X"):
                raise ValueError("not hex")
            to = tx_target(bytes.fromhex(text[2:]))
            return None if to is None else [to]
        if method in _CALL_LIKE:
            to_text = _target.decode(first).to
            return None if to_text is None else [_address(to_text)]
        address = _filter.decode(first).address  # eth_getLogs, eth_newFilter, logs subscription
        if address is None or address == []:
            return None
        if isinstance(address, str):
            return [_address(address)]
        return [_address(a) for a in address]


def _address(text: str) -> bytes:
    if not _ADDRESS.fullmatch(text):
        raise ValueError("not an address")
    return bytes.fromhex(text[2:])


def compile_policy(source: str | None) -> Policy | None:
    """The policy of a stored row's allowlists (None: no lists, nothing to check).
    ValueError (msgspec.DecodeError/ValidationError) when the stored text is unreadable."""
    lists = loads(source)
    if lists.empty():
        return None
    return Policy(lists, source)
