"""A hand-assembled contract for the ``eth_call`` scenario.

The runtime answers every call (any calldata) with storage slot 0 as one 32-byte word; the
constructor stores ``VALUE`` there.  Deployed with ``eth_sendTransaction`` from anvil's first
unlocked account, straight to the node (chaingate does not forward writes to a devnet unless
``passthrough`` is on, and the bench does not need it to).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from chaingate.devnet.anvil import rpc_call

VALUE = 0xC0FFEE

# Opcodes used below.
PUSH1, MSTORE, SLOAD, SSTORE, CODECOPY, RETURN = 0x60, 0x52, 0x54, 0x55, 0x39, 0xF3


def push(value: int) -> bytes:
    """PUSHn with the smallest n that holds ``value``."""
    data = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return bytes([PUSH1 + len(data) - 1]) + data


def runtime_code() -> bytes:
    """mstore(0, sload(0)); return(0, 32)"""
    return (
        push(0) + bytes([SLOAD]) + push(0) + bytes([MSTORE]) + push(32) + push(0) + bytes([RETURN])
    )


def init_code(value: int = VALUE) -> bytes:
    """sstore(0, value); codecopy(0, <runtime offset>, <runtime size>); return(0, <size>)"""
    runtime = runtime_code()
    size = len(runtime)

    def prefix(offset: int) -> bytes:
        return (
            push(value) + push(0) + bytes([SSTORE])
            + push(size) + push(offset) + push(0) + bytes([CODECOPY])
            + push(size) + push(0) + bytes([RETURN])
        )  # fmt: skip

    offset = len(prefix(0))
    code = prefix(offset)
    assert len(code) == offset, "runtime offset must not change the prefix length"
    return code + runtime


def word(value: int) -> str:
    return "0x" + value.to_bytes(32, "big").hex()


@dataclass(frozen=True)
class Contract:
    address: str
    deployer: str
    expected: str  # what eth_call returns, as the node's hex string


def _receipt(url: str, tx_hash: str, timeout: float = 10.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        receipt = rpc_call(url, "eth_getTransactionReceipt", [tx_hash])
        if isinstance(receipt, dict):
            return receipt
        if time.monotonic() > deadline:
            raise RuntimeError(f"no receipt for {tx_hash} after {timeout:.0f}s")
        time.sleep(0.05)


def deploy(url: str) -> Contract:
    """Deploy the contract on the node at ``url`` and check that a call returns VALUE."""
    accounts = rpc_call(url, "eth_accounts")
    if not isinstance(accounts, list) or not accounts:
        raise RuntimeError(f"the node has no unlocked account: {accounts!r}")
    deployer = str(accounts[0])
    tx = {"from": deployer, "data": "0x" + init_code().hex(), "gas": hex(200_000)}
    tx_hash = str(rpc_call(url, "eth_sendTransaction", [tx]))
    receipt = _receipt(url, tx_hash)
    if receipt.get("status") != "0x1" or not receipt.get("contractAddress"):
        raise RuntimeError(f"contract deployment failed: {receipt}")
    address = str(receipt["contractAddress"])
    code = rpc_call(url, "eth_getCode", [address, "latest"])
    if code != "0x" + runtime_code().hex():
        raise RuntimeError(f"deployed code {code!r} is not the runtime that was assembled")
    expected = word(VALUE)
    answer = rpc_call(url, "eth_call", [{"to": address, "data": "0x"}, "latest"])
    if answer != expected:
        raise RuntimeError(f"eth_call returned {answer!r}, expected {expected}")
    return Contract(address=address, deployer=deployer, expected=expected)
