"""Property: random token activity with ``anvil_reorg`` at random depths in between leaves an
index equal to the recomputation over the canonical chain and to the contracts' own answers.

Each example is a fresh devnet (anvil + the cached bootstrap), a fresh index and a gateway
following it; hypothesis draws a sequence of ERC-20 transfers, mints, burns and airdrops,
ERC-721 mints, transfers and burns, ERC-1155 mints, transfers, batch transfers and burns, native
sends (some to contracts that revert, keeping the value), pauses that let the index catch up
(so later reorgs revert blocks it has applied, live) and reorgs of 1..5 blocks whose new
branch carries transactions of its own.  Amounts are drawn as a share of the sender's balance,
up to 120 %, so some transactions fail — the index must ignore those too.
``CHAINGATE_INDEXER_EXAMPLES`` (default 4) sets the examples per store.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaingate.chain.store import CHAIN_TABLES
from chaingate.config.manifest import Manifest
from chaingate.data.store import INDEX_TABLES
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from chaingate.store import Store
from tests.conftest import DEVNET_SIGNER
from tests.test_indexer import start_indexed_in
from tests.test_indexer_oracle import (
    Node,
    assert_index_matches,
    open_index_store,
    wait_until_indexed,
)

EXAMPLES = int(os.environ.get("CHAINGATE_INDEXER_EXAMPLES", "4"))

ACCOUNT = st.integers(1, 5)
TOKEN = st.sampled_from(["erc20_cgusd", "erc20_cgt"])
ITEM = st.integers(1, 4)
SHARE = st.integers(0, 120)  # percent of the sender's balance

TOKEN_OPS = st.one_of(
    st.tuples(st.just("erc20_transfer"), TOKEN, ACCOUNT, ACCOUNT, SHARE),
    st.tuples(st.just("erc20_mint"), TOKEN, ACCOUNT, st.integers(1, 10**9)),
    st.tuples(st.just("erc20_burn"), TOKEN, ACCOUNT, SHARE),
    st.tuples(
        st.just("erc20_airdrop"),
        TOKEN,
        ACCOUNT,
        st.lists(ACCOUNT, min_size=1, max_size=4),
        st.integers(1, 1000),
    ),
    st.tuples(st.just("nft_mint"), ACCOUNT),
    st.tuples(st.just("nft_transfer"), st.integers(1, 10), ACCOUNT),
    st.tuples(st.just("nft_burn"), st.integers(1, 10)),
    st.tuples(st.just("item_mint"), ACCOUNT, ITEM, st.integers(1, 100)),
    st.tuples(st.just("item_transfer"), ACCOUNT, ACCOUNT, ITEM, st.integers(0, 60)),
    st.tuples(
        st.just("item_batch"),
        ACCOUNT,
        ACCOUNT,
        st.lists(st.tuples(ITEM, st.integers(0, 30)), min_size=1, max_size=4),
    ),
    st.tuples(st.just("item_burn"), ACCOUNT, ITEM, st.integers(0, 40)),
    st.tuples(st.just("native"), ACCOUNT, ACCOUNT, st.integers(0, 10**18)),
    st.tuples(st.just("native_to_token"), ACCOUNT),
)
# A segment: some transactions, maybe a pause until the index caught up, then a reorg of
# 0 (none) to 5 blocks whose new branch carries up to three transactions of its own.
SEGMENT = st.tuples(
    st.lists(TOKEN_OPS, min_size=1, max_size=5),
    st.booleans(),
    st.integers(0, 5),
    st.lists(TOKEN_OPS, max_size=3),
)
OPS = st.lists(SEGMENT, min_size=2, max_size=5).map(
    lambda segments: [
        op
        for txs, wait, depth, branch in segments
        for op in [
            *txs,
            *([("wait",)] if wait else []),
            *([("reorg", depth, branch)] if depth else []),
        ]
    ]
)


class Driver:
    """Turns drawn operations into transactions on the devnet."""

    def __init__(self, node: Node, manifest: Manifest) -> None:
        self.node = node
        self.manifest = manifest
        self.accounts = manifest.accounts
        self.first_block = 0

    def _uint(self, answer: bytes | None) -> int:
        return int(abi.decode(["uint256"], answer)[0]) if answer else 0

    async def _balance(self, token: str, holder: str) -> int:
        return self._uint(
            await self.node.eth_call(token, abi.encode_call("balanceOf(address)", holder))
        )

    async def _item_balance(self, holder: str, item: int) -> int:
        items = self.manifest.address("erc1155_items")
        data = abi.encode_call("balanceOf(address,uint256)", holder, item)
        return self._uint(await self.node.eth_call(items, data))

    async def _owner(self, token_id: int) -> str:
        nft = self.manifest.address("erc721_collection")
        answer = await self.node.eth_call(nft, abi.encode_call("ownerOf(uint256)", token_id))
        return abi.decode(["address"], answer)[0] if answer else self.accounts[1]

    async def tx(self, op: tuple[Any, ...]) -> dict[str, Any]:
        """The transaction an operation sends (amounts from the current state)."""
        a = self.accounts
        deployer = self.manifest.deployer
        kind = op[0]

        def call(sender: str, to: str, signature: str, *args: Any) -> dict[str, Any]:
            return {
                "from": sender,
                "to": to,
                "data": "0x" + abi.encode_call(signature, *args).hex(),
            }

        if kind == "erc20_transfer":
            token = self.manifest.address(op[1])
            amount = await self._balance(token, a[op[2]]) * op[4] // 100
            return call(a[op[2]], token, "transfer(address,uint256)", a[op[3]], amount)
        if kind == "erc20_mint":
            token = self.manifest.address(op[1])
            return call(deployer, token, "mint(address,uint256)", a[op[2]], op[3])
        if kind == "erc20_burn":
            token = self.manifest.address(op[1])
            amount = await self._balance(token, a[op[2]]) * op[3] // 100
            return call(a[op[2]], token, "burn(uint256)", amount)
        if kind == "erc20_airdrop":
            token = self.manifest.address(op[1])
            to = [a[i] for i in op[3]]
            return call(a[op[2]], token, "airdrop(address[],uint256)", to, op[4])
        nft = self.manifest.address("erc721_collection")
        if kind == "nft_mint":
            return call(deployer, nft, "mint(address,string)", a[op[1]], "ipfs://x")
        if kind == "nft_transfer":
            owner = await self._owner(op[1])
            return call(owner, nft, "transferFrom(address,address,uint256)", owner, a[op[2]], op[1])
        if kind == "nft_burn":
            owner = await self._owner(op[1])
            return call(owner, nft, "burn(uint256)", op[1])
        items = self.manifest.address("erc1155_items")
        if kind == "item_mint":
            signature = "mint(address,uint256,uint256,string)"
            return call(deployer, items, signature, a[op[1]], op[2], op[3], "")
        if kind == "item_transfer":
            amount = await self._item_balance(a[op[1]], op[3]) * op[4] // 40
            signature = "safeTransferFrom(address,address,uint256,uint256,bytes)"
            return call(a[op[1]], items, signature, a[op[1]], a[op[2]], op[3], amount, b"")
        if kind == "item_batch":
            ids = [i for i, _ in op[3]]
            amounts = [n for _, n in op[3]]
            signature = "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)"
            return call(a[op[1]], items, signature, a[op[1]], a[op[2]], ids, amounts, b"")
        if kind == "item_burn":
            return call(a[op[1]], items, "burn(address,uint256,uint256)", a[op[1]], op[2], op[3])
        if kind == "native":
            return {"from": a[op[1]], "to": a[op[2]], "value": hex(op[3])}
        if kind == "native_to_token":  # DevToken has no payable entry: reverts, value stays
            return {
                "from": a[op[1]],
                "to": self.manifest.address("erc20_cgt"),
                "value": hex(10**15),
            }
        raise AssertionError(f"unknown operation {op}")

    async def run(self, op: tuple[Any, ...], store: Store) -> None:
        if op[0] == "wait":
            await wait_until_indexed(store, self.node)
        elif op[0] == "reorg":
            await self.reorg(op[1], op[2])
        else:
            await self.node.send(await self.tx(op))

    async def reorg(self, depth: int, replacements: list[tuple[Any, ...]]) -> None:
        head, _ = await self.node.head()
        # Only blocks mined in this example: anvil keeps no state below a loaded snapshot.
        depth = min(depth, head - self.first_block)
        if depth < 1:
            return
        base = hex(head - depth)
        nonces: dict[str, int] = {}
        pairs = []
        for i, op in enumerate(replacements):
            tx = await self.tx(op)
            sender = tx["from"]
            if sender not in nonces:
                nonces[sender] = int(
                    await self.node.call("eth_getTransactionCount", sender, base), 16
                )
            tx.update(nonce=hex(nonces[sender]), gas=hex(1_000_000))
            nonces[sender] += 1
            # In order: one sender's transactions must stay in nonce order across blocks.
            pairs.append([tx, min(depth - 1, i)])
        await self.node.call("anvil_reorg", depth, pairs)


async def _clear(store: Store) -> None:
    """Empty the follower's and the index's tables between examples."""

    def clear(tx: Any) -> None:
        for table in (*CHAIN_TABLES, *INDEX_TABLES):
            tx.execute(f"DELETE FROM {table}")

    await store.run_transaction(clear)


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
async def test_random_activity_and_reorgs_leave_an_exact_index(
    store_url: str, tmp_path: Path, ops: list[tuple[Any, ...]]
) -> None:
    # Fixtures live across examples, so each example opens its own nursery and data dir.
    with AnvilProcess() as anvil, tempfile.TemporaryDirectory(dir=tmp_path) as data_dir:
        manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
        node = Node(anvil.url)
        async with trio.open_nursery() as nursery:
            run = await start_indexed_in(nursery, anvil.url, store_url, Path(data_dir))
            driver = Driver(node, manifest)
            driver.first_block = (await node.head())[0]
            try:
                for op in ops:
                    await driver.run(op, run.store)
                await assert_index_matches(run.store, node, manifest)
            finally:
                run.scope.cancel()
        # The gateway has stopped: empty its tables for the next example.
        async with open_index_store(store_url, Path(data_dir)) as store:
            await _clear(store)
        await node.aclose()


async def test_a_reorg_of_indexed_blocks_is_undone_exactly(
    nursery: trio.Nursery, store_url: str, tmp_path: Path
) -> None:
    """A fixed scenario (the property's core, always run): tokens move, the index applies
    the blocks live, a reorg replaces them with other transfers."""
    with AnvilProcess() as anvil:
        manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
        node = Node(anvil.url)
        run = await start_indexed_in(nursery, anvil.url, store_url, tmp_path)
        driver = Driver(node, manifest)
        driver.first_block = (await node.head())[0]
        for op in [
            ("erc20_transfer", "erc20_cgusd", 1, 5, 50),
            ("nft_transfer", 2, 5),
            ("item_batch", 1, 5, [(1, 3), (1, 2)]),
            ("native", 3, 5, 10**17),
            ("erc20_mint", "erc20_cgt", 5, 777),
        ]:
            await driver.run(op, run.store)
        await assert_index_matches(run.store, node, manifest)
        before = run.indexer.stats["reverted_blocks"]
        await driver.reorg(4, [("erc20_transfer", "erc20_cgusd", 2, 4, 10), ("nft_burn", 3)])
        got = await assert_index_matches(run.store, node, manifest)
        assert run.indexer.stats["reverted_blocks"] - before == 4
        # Account 5 keeps the first block's CGUSD; the NFT, the items and the CGT mint of the
        # orphaned blocks are gone (its CGT is the demo airdrop's again).
        five = manifest.accounts[5].lower()
        cgt, usd = manifest.address("erc20_cgt").lower(), manifest.address("erc20_cgusd").lower()
        assert got.balances[(five, cgt)] == 10 * 10**18
        assert got.balances[(five, usd)] > 0
        assert not [k for k in got.holdings if k[0] == five]
        run.scope.cancel()
        await node.aclose()


def test_operations_are_drawn_from_every_kind() -> None:
    """The strategy can produce each operation (a typo in a kind would silently never run)."""
    kinds = {
        "erc20_transfer",
        "erc20_mint",
        "erc20_burn",
        "erc20_airdrop",
        "nft_mint",
        "nft_transfer",
        "nft_burn",
        "item_mint",
        "item_transfer",
        "item_batch",
        "item_burn",
        "native",
        "native_to_token",
        "wait",
        "reorg",
    }
    seen: set[str] = set()

    @settings(max_examples=400, database=None)
    @given(OPS)
    def collect(ops: list[tuple[Any, ...]]) -> None:
        seen.update(op[0] for op in ops)

    collect()
    assert seen == kinds


async def test_a_reorg_deeper_than_the_followers_window(
    nursery: trio.Nursery, store_url: str, tmp_path: Path
) -> None:
    """Deeper than finality: the follower reverts its whole window and re-applies from its
    base; blocks below the window changed too, which the index finds by asking the node."""
    with AnvilProcess() as anvil:
        manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
        node = Node(anvil.url)
        run = await start_indexed_in(
            nursery, anvil.url, store_url, tmp_path, finality_depth=2, follower={"keep_blocks": 8}
        )
        driver = Driver(node, manifest)
        driver.first_block = (await node.head())[0]
        for i in range(14):
            await driver.run(("erc20_transfer", "erc20_cgusd", 1 + i % 3, 4, 30), run.store)
            await driver.run(("native", 2, 5, 10**15 + i), run.store)
        await assert_index_matches(run.store, node, manifest)
        await driver.reorg(12, [("erc20_mint", "erc20_cgt", 5, 31337), ("nft_mint", 4)])
        await node.send(await driver.tx(("native", 3, 1, 12345)))
        await assert_index_matches(run.store, node, manifest)
        follower = run.gateway.chain.followers["ethereum/devnet"]
        assert follower.stats["deep_reorgs"] == 1
        assert run.indexer.stats["reverted_blocks"] >= 12
        # The 4 changed blocks below the window were noticed (an Apply that did not extend the
        # tip: a reconcile) and undone with the window (the 12 reverted above); they came back
        # fetched by the index or re-applied by the follower, whichever got there first — the
        # index equals the canonical chain's either way (asserted above).
        assert run.indexer.stats["reconciles"] >= 1, dict(run.indexer.stats)
        run.scope.cancel()
        await node.aclose()
