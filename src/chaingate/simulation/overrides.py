"""A bundle on a node without ``eth_simulateV1``: each transaction's effects carried to the next
as state overrides (sans-IO).

``debug_traceCall`` runs one call on a block's state.  For the bundle's next transaction to see
what the previous ones did, the previous one is traced a second time with ``prestateTracer`` in
``diffMode``: its ``post`` is every account it changed (balance, nonce, code, the storage slots
it wrote), its ``pre`` what they were.  Folded into the state override set the next call runs
with, that is exactly the state the transaction left — geth's diff mode (which anvil shares):

* a slot in ``pre`` but not in ``post`` of an account in ``post`` was set to zero (post omits
  zeros);
* an account in ``pre`` but not in ``post`` was deleted (a contract created and destroyed in
  the same transaction): no balance, nonce, code or storage.

An account whose overrides replace its whole storage (``state``) keeps replacing it, updated;
others get ``stateDiff``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["fold_diff"]

_ZERO_WORD = "0x" + "00" * 32


def _word(value: str) -> str:
    return "0x" + value[2:].lower().rjust(64, "0")


def _quantity(value: object) -> str:
    return hex(value) if isinstance(value, int) else hex(int(str(value), 16))


def fold_diff(
    overrides: Mapping[str, Mapping[str, Any]], diff: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """``overrides`` updated with one transaction's prestate ``diff``; ValueError when the
    diff is not one."""
    out: dict[str, dict[str, Any]] = {a: dict(entry) for a, entry in overrides.items()}
    pre = diff.get("pre", {})
    post = diff.get("post", {})
    if not isinstance(pre, Mapping) or not isinstance(post, Mapping):
        raise ValueError("a prestate diff has pre and post objects")
    for raw_address in set(pre) | set(post):
        address = raw_address.lower()
        before = pre.get(raw_address) or {}
        after = post.get(raw_address)
        entry = out.setdefault(address, {})
        if after is None:
            if raw_address not in pre:
                continue
            entry.clear()  # deleted
            entry.update({"balance": "0x0", "nonce": "0x0", "code": "0x", "state": {}})
            continue
        if "balance" in after:
            entry["balance"] = _quantity(after["balance"])
        if "nonce" in after:
            entry["nonce"] = _quantity(after["nonce"])
        if "code" in after:
            entry["code"] = after["code"] or "0x"
        written = {_word(slot): _word(word) for slot, word in (after.get("storage") or {}).items()}
        for slot in before.get("storage") or {}:
            written.setdefault(_word(slot), _ZERO_WORD)
        if written:
            kind = "state" if "state" in entry else "stateDiff"
            entry[kind] = {**entry.get(kind, {}), **written}
    return out
