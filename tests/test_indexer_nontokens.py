"""Contracts that are not tokens cannot break the index.

A test-only contract (``LogEmitter``, compiled here by the devnet's pinned solc) emits any log
it is asked to: look-alikes of Transfer/TransferSingle/TransferBatch with the wrong topic
count, data length, padding or array bounds, and well-shaped ERC-20/721 Transfers although it
has no token function at all (``balanceOf`` reverts).  The index must count the look-alikes as
ignored, index the well-shaped ones by their shape (as the recomputation does), keep going, and
still equal the recomputation and the demo tokens' own answers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, cache_root
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.solc import compile_sources
from chaingate.evm import abi
from tests.conftest import DEVNET_SIGNER
from tests.test_indexer import Start, indexed_starter
from tests.test_indexer_oracle import (
    T_BATCH,
    T_SINGLE,
    T_TRANSFER,
    ZERO,
    Node,
    assert_index_matches,
)

EMITTER_SOURCE = """// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// Test-only: emits the log it is given (0-4 topics), and has no other function.
contract LogEmitter {
    function emitLog(bytes32[] calldata topics, bytes calldata data) external {
        bytes memory d = data;
        uint256 n = topics.length;
        assembly {
            let p := add(d, 32)
            let s := mload(d)
            let t := topics.offset
            switch n
            case 0 { log0(p, s) }
            case 1 { log1(p, s, calldataload(t)) }
            case 2 { log2(p, s, calldataload(t), calldataload(add(t, 32))) }
            case 3 {
                log3(p, s, calldataload(t), calldataload(add(t, 32)), calldataload(add(t, 64)))
            }
            default {
                log4(
                    p, s, calldataload(t), calldataload(add(t, 32)), calldataload(add(t, 64)),
                    calldataload(add(t, 96))
                )
            }
        }
    }
}
"""


@pytest.fixture
def start_indexed(nursery: trio.Nursery, tmp_path: Path) -> Start:
    return indexed_starter(nursery, tmp_path)


def t(address: str) -> bytes:
    return bytes(12) + bytes.fromhex(address[2:])


def w(value: int) -> bytes:
    return value.to_bytes(32, "big")


def topic(hex_topic: str) -> bytes:
    return bytes.fromhex(hex_topic[2:])


async def test_look_alikes_and_non_token_transfers_do_not_break_the_index(
    start_indexed: Start, anvil_factory: Callable[..., AnvilProcess], store_url: str
) -> None:
    anvil = anvil_factory()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    artifact = (
        await trio.to_thread.run_sync(
            compile_sources, {"LogEmitter.sol": EMITTER_SOURCE}, cache_root() / "test-contracts"
        )
    )["LogEmitter"]
    a = manifest.accounts
    receipt = await node.send({"from": a[1], "data": "0x" + artifact.bytecode.hex()})
    emitter = receipt["contractAddress"]
    # Not a token: balanceOf reverts.
    assert await node.eth_call(emitter, abi.encode_call("balanceOf(address)", a[1])) is None
    run = await start_indexed(anvil.url, store_url)
    await assert_index_matches(run.store, node, manifest)
    one, two = a[1].lower(), a[2].lower()
    malformed: list[tuple[list[bytes], bytes]] = [
        ([topic(T_TRANSFER)], bytes(96)),
        ([topic(T_TRANSFER), t(one)], w(5)),
        ([topic(T_TRANSFER), t(one), t(two)], b""),
        ([topic(T_TRANSFER), t(one), t(two)], w(1) + w(2)),
        ([topic(T_TRANSFER), t(one), t(two), w(3)], w(4)),
        ([topic(T_TRANSFER), b"\xff" * 32, t(two)], w(1)),
        ([topic(T_SINGLE), t(one), t(one), t(two)], w(1)),
        ([topic(T_SINGLE), t(one), t(one)], w(1) + w(2)),
        (
            [topic(T_BATCH), t(one), t(one), t(two)],
            abi.encode(["uint256[]", "uint256[]"], [[1], [1, 2]]),
        ),
        ([topic(T_BATCH), t(one), t(one), t(two)], w(64) + w(2**255)),
        ([topic(T_BATCH), t(one), t(one), t(two)], w(64) + w(96) + w(10**9)),
    ]
    shaped: list[tuple[list[bytes], bytes]] = [
        ([topic(T_TRANSFER), t(ZERO), t(one)], w(1000)),  # an "ERC-20" mint
        ([topic(T_TRANSFER), t(one), t(two)], w(2**256 - 1)),  # more than it has: goes negative
        ([topic(T_TRANSFER), t(ZERO), t(two), w(77)], b""),  # an "ERC-721" mint
        (
            [topic(T_BATCH), t(one), t(ZERO), t(two)],
            abi.encode(["uint256[]", "uint256[]"], [[5, 5, 6], [1, 2, 2**256 - 1]]),
        ),
    ]
    before = run.indexer.stats["ignored_logs"]
    for topics, data in malformed + shaped:
        call = abi.encode_call("emitLog(bytes32[],bytes)", topics, data)
        receipt = await node.send({"from": a[1], "to": emitter, "data": "0x" + call.hex()})
        assert int(receipt["status"], 16) == 1 and len(receipt["logs"]) == 1
    # The demo tokens keep moving alongside.
    usd = manifest.address("erc20_cgusd")
    move = abi.encode_call("transfer(address,uint256)", a[3], 1)
    await node.send({"from": a[1], "to": usd, "data": "0x" + move.hex()})
    got = await assert_index_matches(run.store, node, manifest)
    assert run.indexer.stats["ignored_logs"] - before == len(malformed)
    assert run.indexer.stats["bugs"] == 0
    info = await run.indexer.reader.contract(emitter)
    assert info is not None
    assert (info.standard, info.standards) == ("ERC20", ["ERC20", "ERC721", "ERC1155"])
    assert got.balances[(one, emitter.lower())] == 1000 - (2**256 - 1)
    # Only positive balances are listed: the emitter's negative one is not.
    listed = await run.indexer.reader.balances(a[1], limit=100)
    assert emitter.lower() not in {b.contract for b in listed.items}
    await node.aclose()


def test_emitter_helpers() -> None:
    """The helpers above build what the EVM expects: 32-byte topics."""
    assert len(t(ZERO)) == 32 and len(w(1)) == 32 and len(topic(T_TRANSFER)) == 32
    args: Any = ([t(ZERO)], b"")
    assert abi.decode(["bytes32[]", "bytes"], abi.encode(["bytes32[]", "bytes"], args)) == (
        [t(ZERO)],
        b"",
    )
