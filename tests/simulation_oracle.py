"""The oracle the simulation tests hold chaingate to: the chain itself.

A scenario is simulated through chaingate, then its transactions are sent for real on anvil
(impersonating their senders) on a snapshot that is reverted afterwards.  What the simulated
changes imply — each holder's balance of each asset moved by the net of its TRANSFER changes,
each approval left as its last APPROVE change says — must be exactly what the chain shows when
read before and after, for every asset and holder the scenario watches as well as every one a
change names (so a missing change fails as surely as a wrong one).  The gas each real
transaction paid is added back to its sender: simulations charge none, as Alchemy's do not.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from chaingate.devnet.rpc import DevnetRpc, RpcError
from chaingate.evm import abi

# A balance: ("NATIVE", None, None, holder), (standard, contract, token id or None, holder).
Balance = tuple[str, str | None, int | None, str]
# An approval: ("allowance", token, owner, spender) -> amount; ("approved", nft, token id,
# None) -> the approved address; ("all", contract, owner, operator) -> 1/0.
Approval = tuple[str, str, Any, str | None]

ZERO = "0x" + "00" * 20


def _low(address: str | None) -> str:
    return (address or ZERO).lower()


def balance_deltas(results: Iterable[dict[str, Any]]) -> dict[Balance, int]:
    """Each holder's net change per asset, from the simulated changes."""
    deltas: defaultdict[Balance, int] = defaultdict(int)
    for result in results:
        for change in result["changes"]:
            if change["changeType"] != "TRANSFER":
                continue
            asset = change["assetType"]
            contract = change["contractAddress"]
            token_id = int(change["tokenId"], 16) if change["tokenId"] else None
            amount = int(change["rawAmount"])
            deltas[(asset, contract, token_id, _low(change["from"]))] -= amount
            deltas[(asset, contract, token_id, _low(change["to"]))] += amount
    # A token's mints come from, and its burns go to, the zero address: no holder.
    return {key: n for key, n in deltas.items() if key[0] == "NATIVE" or key[3] != ZERO}


def final_approvals(results: Iterable[dict[str, Any]]) -> dict[Approval, Any]:
    """The approvals the simulated changes leave (the last one of each wins)."""
    left: dict[Approval, Any] = {}
    for result in results:
        for change in result["changes"]:
            if change["changeType"] != "APPROVE":
                continue
            contract, owner, other = change["contractAddress"], change["from"], change["to"]
            amount = int(change["rawAmount"])
            if change["assetType"] == "ERC20":
                left[("allowance", contract, _low(owner), _low(other))] = amount
            elif change["tokenId"] is not None:
                left[("approved", contract, int(change["tokenId"], 16), None)] = _low(other)
            else:
                left[("all", contract, _low(owner), _low(other))] = amount
    return left


class Chain:
    """Reads what the oracle compares, straight from anvil."""

    def __init__(self, url: str) -> None:
        self.rpc = DevnetRpc(url)

    def call(self, to: str, signature: str, *args: Any) -> bytes:
        data = "0x" + abi.encode_call(signature, *args).hex()
        return bytes.fromhex(self.rpc.call("eth_call", {"to": to, "data": data}, "latest")[2:])

    def word(self, to: str, signature: str, *args: Any) -> int:
        return int(abi.decode(["uint256"], self.call(to, signature, *args))[0])

    def balance(self, key: Balance) -> int:
        asset, contract, token_id, holder = key
        if asset == "NATIVE":
            return int(self.rpc.call("eth_getBalance", holder, "latest"), 16)
        assert contract is not None
        if asset == "ERC20":
            return self.word(contract, "balanceOf(address)", holder)
        if asset == "ERC1155":
            return self.word(contract, "balanceOf(address,uint256)", holder, token_id)
        try:
            owner = abi.decode(["address"], self.call(contract, "ownerOf(uint256)", token_id))[0]
        except RpcError:  # burnt or never minted
            return 0
        return 1 if owner.lower() == holder else 0

    def approval(self, key: Approval) -> Any:
        kind, contract, first, second = key
        if kind == "allowance":
            return self.word(contract, "allowance(address,address)", first, second)
        if kind == "all":
            return self.word(contract, "isApprovedForAll(address,address)", first, second)
        answer = self.call(contract, "getApproved(uint256)", first)
        return abi.decode(["address"], answer)[0].lower()

    def send(self, tx: dict[str, Any]) -> dict[str, Any]:
        """Sends a transaction as its sender (impersonated); its receipt."""
        sender = tx["from"]
        self.rpc.call("anvil_impersonateAccount", sender)
        try:
            digest = self.rpc.call("eth_sendTransaction", {**tx, "gas": hex(3_000_000)})
        finally:
            self.rpc.call("anvil_stopImpersonatingAccount", sender)
        for _ in range(200):  # mined at once, though its receipt may take a moment
            receipt: dict[str, Any] | None = self.rpc.call("eth_getTransactionReceipt", digest)
            if receipt is not None:
                return receipt
            time.sleep(0.01)
        raise AssertionError(f"{digest} was not mined")

    def snapshot(self) -> str:
        return str(self.rpc.call("evm_snapshot"))

    def revert(self, snapshot: str) -> None:
        assert self.rpc.call("evm_revert", snapshot) is True


def check_against_chain(
    chain: Chain,
    txs: Sequence[dict[str, Any]],
    results: Sequence[dict[str, Any]],
    *,
    watch: Iterable[Balance] = (),
    watch_approvals: Iterable[Approval] = (),
) -> list[dict[str, Any]]:
    """Send ``txs`` for real on a snapshot and assert the chain moved exactly as ``results``
    (the simulation of ``txs``, one result per transaction) say; the receipts."""
    deltas = balance_deltas(results)
    approvals = final_approvals(results)
    balances = sorted({*deltas, *watch}, key=repr)
    permissions = sorted({*approvals, *watch_approvals}, key=repr)
    before = {key: chain.balance(key) for key in balances}
    granted = {key: chain.approval(key) for key in permissions}
    snapshot = chain.snapshot()
    try:
        receipts = [chain.send(tx) for tx in txs]
        after = {key: chain.balance(key) for key in balances}
        now = {key: chain.approval(key) for key in permissions}
    finally:
        chain.revert(snapshot)
    gas: defaultdict[str, int] = defaultdict(int)
    for receipt in receipts:
        gas[receipt["from"].lower()] += int(receipt["gasUsed"], 16) * int(
            receipt["effectiveGasPrice"], 16
        )
    observed = {
        key: after[key] - before[key] + (gas[key[3]] if key[0] == "NATIVE" else 0)
        for key in balances
    }
    simulated = {key: deltas.get(key, 0) for key in balances}
    assert observed == simulated, {k: (observed[k], simulated[k]) for k in balances}
    expected = {key: approvals.get(key, granted[key]) for key in permissions}
    assert now == expected
    for receipt, result in zip(receipts, results, strict=True):
        # A transaction the simulation says reverts reverts for real, and the other way round.
        assert (receipt["status"] == "0x1") == (result["error"] is None), (receipt, result)
    return receipts
