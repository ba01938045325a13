"""Sending the bootstrap's transactions fast: JSON-RPC batches, explicit nonces and gas.

anvil answers a batch's items concurrently, so the order of transactions from *different*
senders inside one batch is not guaranteed; one sender's transactions run in nonce order.
A ``TxRunner.run`` call is therefore one stage: its transactions may depend on earlier stages
and on the same sender's earlier transactions, never on another sender's in the same stage.
Gas is explicit because estimating a transaction whose predecessors are not mined yet fails.
A stage is sent in chunks whose gas limits fit one block, each mined before the next is sent:
anvil drops a sender's later transactions (as "nonce too high") when an earlier one does not
fit the block being built and a later one does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from chaingate.config.manifest import Contract
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.addresses import create2_address

# Arachnid's deterministic deployment proxy, which anvil predeploys like every public chain has
# it: calldata = 32-byte salt ++ init code, CREATE2 with itself as the deployer.
DETERMINISTIC_DEPLOYER = "0x4e59b44847b379578588920ca78fbf26c0b4956c"


class BootstrapError(RuntimeError):
    """The devnet could not be brought to the expected state (a step failed or misplaced)."""


@dataclass(frozen=True)
class Tx:
    label: str  # says which step failed when one does
    sender: str
    to: str | None
    data: bytes = b""
    value: int = 0
    gas: int = 200_000


@dataclass(frozen=True)
class Planned:
    """A contract to deploy and its manifest entry (address and block filled in once mined)."""

    name: str
    tx: Tx
    address: str | None  # CREATE2: where it must land; None: a CREATE, read from its receipt
    contract: Contract


def create2_tx(label: str, sender: str, salt: bytes, init_code: bytes, gas: int) -> tuple[Tx, str]:
    """A deployment through the deterministic deployer, and the address it must land at."""
    tx = Tx(label, sender, DETERMINISTIC_DEPLOYER, salt + init_code, gas=gas)
    return tx, create2_address(DETERMINISTIC_DEPLOYER, salt, init_code)


class TxRunner:
    def __init__(self, rpc: DevnetRpc, *, receipt_timeout: float = 30.0) -> None:
        self.rpc = rpc
        self.receipt_timeout = receipt_timeout
        self._nonces: dict[str, int] = {}

    def _assign_nonces(self, txs: Sequence[Tx]) -> list[int]:
        unknown = sorted({tx.sender for tx in txs} - self._nonces.keys())
        counts = self.rpc.batch([("eth_getTransactionCount", [s, "pending"]) for s in unknown])
        for sender, count in zip(unknown, counts, strict=True):
            self._nonces[sender] = int(count, 16)
        assigned = []
        for tx in txs:
            assigned.append(self._nonces[tx.sender])
            self._nonces[tx.sender] += 1
        return assigned

    def run(self, txs: Sequence[Tx]) -> list[dict[str, Any]]:
        """Send one stage and wait for every receipt; any failed transaction raises."""
        if not txs:
            return []
        block_gas = int(self.rpc.call("eth_getBlockByNumber", "latest", False)["gasLimit"], 16)
        receipts: list[dict[str, Any]] = []
        chunk: list[Tx] = []
        for tx in txs:
            if chunk and sum(t.gas for t in chunk) + tx.gas > block_gas:
                receipts += self._run_chunk(chunk)
                chunk = []
            chunk.append(tx)
        return receipts + self._run_chunk(chunk)

    def _run_chunk(self, txs: Sequence[Tx]) -> list[dict[str, Any]]:
        nonces = self._assign_nonces(txs)
        calls = []
        for tx, nonce in zip(txs, nonces, strict=True):
            fields: dict[str, str] = {
                "from": tx.sender,
                "nonce": hex(nonce),
                "gas": hex(tx.gas),
                "value": hex(tx.value),
                "input": "0x" + tx.data.hex(),
            }
            if tx.to is not None:
                fields["to"] = tx.to
            calls.append(("eth_sendTransaction", [fields]))
        hashes = self.rpc.batch(calls)
        receipts = self._receipts(hashes, txs)
        failed = [tx.label for tx, r in zip(txs, receipts, strict=True) if r["status"] != "0x1"]
        if failed:
            raise BootstrapError(f"devnet bootstrap transactions reverted: {', '.join(failed)}")
        return receipts

    def _receipts(self, hashes: Sequence[str], txs: Sequence[Tx]) -> list[dict[str, Any]]:
        """Mine until every transaction has its receipt (see ``manual_mining``)."""
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.receipt_timeout
        while True:
            self.rpc.call("evm_mine")
            missing = [i for i in range(len(hashes)) if i not in found]
            answers = self.rpc.batch([("eth_getTransactionReceipt", [hashes[i]]) for i in missing])
            for i, receipt in zip(missing, answers, strict=True):
                if receipt is not None:
                    found[i] = receipt
            if len(found) == len(hashes):
                return [found[i] for i in range(len(hashes))]
            if time.monotonic() > deadline:
                late = ", ".join(txs[i].label for i in range(len(hashes)) if i not in found)
                raise BootstrapError(f"devnet transactions not mined in time: {late}")


@contextlib.contextmanager
def manual_mining(rpc: DevnetRpc) -> Iterator[None]:
    """Automine off while the bootstrap sends, back on after.

    With automine, a transaction that reaches anvil before its sender's previous one (batch
    items arrive concurrently) waits in the pool until some later transaction triggers a block
    — which, at the end of a stage, never comes.  Mining explicitly once a stage is sent puts
    every ready transaction in a block, in nonce order, every time.
    """
    automine = rpc.call("anvil_getAutomine")
    if automine:
        rpc.call("evm_setAutomine", False)
    try:
        yield
    finally:
        if automine:
            rpc.call("evm_setAutomine", True)
