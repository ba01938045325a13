"""Sans-IO: top-level native value transfers from a block's full transactions and receipts.

A transaction moves native currency from ``from`` to ``to`` (or to the contract it creates)
only when it succeeds: a reverted call keeps its value.  So a value-carrying transaction counts
only with a receipt whose ``status`` is 1.  Receipts without ``status`` (before Byzantium) are
taken as successful — those chains' clients did not record failure.  Transfers made by
contracts during execution (internal, trace-level) are out of scope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaingate.data.transfers import NativeTransfer


class NativeDataError(ValueError):
    """A transaction or receipt object lacks what a native transfer needs."""


def value_transactions(block: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Transactions of an ``eth_getBlockByHash(hash, true)`` result that carry value."""
    found = []
    for tx in block.get("transactions") or []:
        if not isinstance(tx, Mapping):
            raise NativeDataError("block transactions are hashes, not objects")
        value = tx.get("value")
        if isinstance(value, str) and value not in ("0x0", "0x", "0x00"):
            found.append(tx)
    return found


def native_transfers(
    transactions: Sequence[Mapping[str, Any]], receipts: Mapping[str, Mapping[str, Any]]
) -> list[NativeTransfer]:
    """Native transfers of ``transactions`` (value-carrying), given their receipts by hash."""
    out = []
    for tx in transactions:
        try:
            tx_hash = str(tx["hash"])
            receipt = receipts[tx_hash]
            status = receipt.get("status")
            if status is not None and int(status, 16) != 1:
                continue
            receiver = tx.get("to") or receipt.get("contractAddress")
            if not receiver:
                raise NativeDataError(f"transaction {tx_hash} has no receiver")
            value = int(tx["value"], 16)
            if value == 0:
                continue
            out.append(
                NativeTransfer(
                    int(tx["transactionIndex"], 16),
                    tx_hash,
                    str(tx["from"]).lower(),
                    str(receiver).lower(),
                    value,
                )
            )
        except NativeDataError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise NativeDataError(f"malformed transaction or receipt: {exc!r}") from None
    return out
