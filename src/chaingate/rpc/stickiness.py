"""Read-your-writes: a sender's reads follow its transaction to the upstream that took it.

Behind a pool, a client that sends a transaction through upstream X and then asks for its
nonce may be answered by Y, which has not seen the transaction yet (another mempool, or a
head a block behind): the nonce goes backwards and the client's next transaction reuses it.
So, for ``window`` seconds after ``eth_sendRawTransaction`` succeeded on X:

* ``eth_getTransactionCount`` of the sender (recovered from the raw transaction's
  signature: legacy, EIP-155, 2930, 1559, 4844, 7702 — ``chaingate.evm.tx``), and
* ``eth_getTransactionByHash`` / ``eth_getTransactionReceipt`` of the transaction

go to X first; if X fails, to upstreams whose head is at least X's, and only then to the
rest (pool.py).  Memory is bounded: one LRU of ``max_entries`` senders and hashes together,
and entries past their window are dropped as they are met.  Sans-IO: the service feeds it
the sends and asks it where a read goes.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from chaingate.config import ReadYourWritesSettings
from chaingate.evm.tx import decode_raw, tx_hash

# Methods whose first parameter is a sender (address) or a transaction hash.
BY_SENDER = frozenset({"eth_getTransactionCount"})
BY_HASH = frozenset({"eth_getTransactionByHash", "eth_getTransactionReceipt"})
STICKY_METHODS = BY_SENDER | BY_HASH


def _first(params: bytes | None) -> str | None:
    """The first parameter when it is a string, lower-cased (addresses and hashes)."""
    if not params:
        return None
    try:
        values = msgspec.json.decode(params)
    except msgspec.DecodeError:
        return None
    if isinstance(values, list) and values and isinstance(values[0], str):
        return values[0].lower()
    return None


class Stickiness:
    """Which upstream took a sender's (or a transaction's) latest write, for a while."""

    def __init__(self, settings: ReadYourWritesSettings) -> None:
        self.window = max(0.0, settings.window)
        self.max_entries = max(1, settings.max_entries)
        # key -> (upstream, expires); the fast lane holds it too, to ask in C whether any
        # write is remembered (a sticky method's call is handed over only then).
        self.routes: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.routed = 0  # reads sent to a write's upstream (for /metrics)
        self.undecodable = 0  # sends whose sender could not be read (keyed by hash only)

    def __len__(self) -> int:
        return len(self.routes)

    def note_send(self, params: bytes | None, result: bytes, upstream: str, now: float) -> None:
        """``eth_sendRawTransaction`` with ``params`` went to ``upstream`` and answered
        ``result`` (the transaction hash)."""
        expires = now + self.window
        keys: list[str] = []
        raw_hex = _first(params)
        if raw_hex is not None and raw_hex.startswith("0x"):
            try:
                raw = bytes.fromhex(raw_hex[2:])
            except ValueError:
                raw = b""
            try:
                decoded = decode_raw(raw)
            except ValueError:
                # A kind we cannot read: its hash still routes its lookups.
                self.undecodable += 1
                if raw:
                    keys.append(tx_hash(raw))
            else:
                keys += [decoded.sender.lower(), decoded.hash.lower()]
        try:
            answered = msgspec.json.decode(result)
        except msgspec.DecodeError:
            answered = None
        if isinstance(answered, str):
            keys.append(answered.lower())  # the hash as the node computed it
        routes = self.routes
        for key in keys:
            if not key:
                continue
            routes[key] = (upstream, expires)
            routes.move_to_end(key)
        while len(routes) > self.max_entries:
            routes.popitem(last=False)

    def route(self, method: str, params: bytes | None, now: float) -> str | None:
        """The upstream a read should go to first, if a recent write of its sender or
        transaction went somewhere."""
        if not self.routes or method not in STICKY_METHODS:
            return None
        key = _first(params)
        if key is None:
            return None
        found = self.routes.get(key)
        if found is None:
            return None
        upstream, expires = found
        if expires <= now:
            del self.routes[key]
            return None
        self.routed += 1
        return upstream
