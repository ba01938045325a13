"""Restarts: ``kill -9`` of a real ``chaingate serve`` mid-backfill, a graceful stop, an index
that starts below the follower, and two processes indexing one store.

After each, the index must equal the recomputation over the canonical chain and the
contracts' own answers (``assert_index_matches``), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from chaingate.chain.store import ChainRows
from chaingate.config.manifest import Manifest
from chaingate.data.store import IndexRows
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from tests.conftest import DEVNET_SIGNER
from tests.test_indexer import Start, indexed_starter
from tests.test_indexer_oracle import Node, assert_index_matches, open_index_store


@pytest.fixture
def start_indexed(nursery: trio.Nursery, tmp_path: Path) -> Start:
    return indexed_starter(nursery, tmp_path)


async def make_history(node: Node, manifest: Manifest, logs: int, per_tx: int, gap: int) -> None:
    """``logs`` CGT transfers to distinct new holders, ``per_tx`` per airdrop, ``gap`` empty
    blocks after each, plus some NFT and item moves in between."""
    token = manifest.address("erc20_cgt")
    deployer = manifest.deployer
    nft, items = manifest.address("erc721_collection"), manifest.address("erc1155_items")
    a = manifest.accounts
    for n, sent in enumerate(range(0, logs, per_tx)):
        recipients = [f"0x{sent + i + 1:040x}" for i in range(min(per_tx, logs - sent))]
        data = abi.encode_call("airdrop(address[],uint256)", recipients, 1 + n)
        await node.send(
            {"from": deployer, "to": token, "data": "0x" + data.hex(), "gas": hex(30_000_000)}
        )
        if n % 3 == 0:
            mint = abi.encode_call("mint(address,string)", a[1 + n % 4], "ipfs://x")
            await node.send({"from": deployer, "to": nft, "data": "0x" + mint.hex()})
            move = abi.encode_call(
                "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)",
                a[1],
                a[2 + n % 3],
                [1, 1],
                [1, 2],
                b"",
            )
            await node.send({"from": a[1], "to": items, "data": "0x" + move.hex()})
        await node.call("anvil_mine", hex(gap))


ADMIN = "indexer-restart-admin"


# How the index and the follower stand when the process dies, and what the restart must do:
# the follower saved beyond the index (it runs ahead in small ranges while the index commits
# big batches) -> the index fetches the gap itself; or the index committed beyond the
# follower's cursor (the follower saves once per 5,000-block range) -> the follower applies
# blocks the index holds again, and the index's feed passes none of them on (``feed_skipped``),
# or, its term begun after the follower passed them, it fetches the rest from the node.  It
# once passed them on and the index recognised them by hash (``replayed``): in neither case
# now does the index get a block twice.
KILL_CASES = {
    "follower_ahead": (
        "max_log_range = 100\nconsumer_buffer = 5000\n",
        "batch_blocks = 200\nbatch_seconds = 5\n",
        ("fetched_blocks",),
    ),
    "index_ahead": (
        "max_log_range = 5000\n",
        "batch_blocks = 100\nbatch_seconds = 0.2\n",
        ("feed_skipped", "fetched_blocks"),
    ),
}


def config_text(
    tmp: Path, port: int, anvil_url: str, store_url: str, follower: str, indexer: str
) -> str:
    return (
        f'data_dir = "{tmp}"\n'
        f"[server]\nport = {port}\n"
        "[auth]\nenabled = false\n"
        f'[observability]\naccess_log = false\nadmin_token = "{ADMIN}"\n'
        f'[store]\nurl = "{store_url}"\n'
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nfinality_depth = 2\n"
        "[chains.ethereum.devnet.follower]\nstart_block = 0\npoll_interval = 0.05\n"
        f"{follower}"
        f"[chains.ethereum.devnet.indexer]\n{indexer}"
        f'[[chains.ethereum.devnet.upstreams]]\nurl = "{anvil_url}"\nname = "anvil"\n'
    )


def serve(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "chaingate", "serve", "--config", str(config)],
        env={**os.environ},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_for_health(port: int, process: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(60):
        while True:
            assert process.poll() is None, f"chaingate serve exited with {process.returncode}"
            try:
                async with httpx.AsyncClient(timeout=1) as client:
                    if (await client.get(f"http://127.0.0.1:{port}/v1/health")).status_code in (
                        200,
                        503,
                    ):
                        return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(KILL_CASES))
async def test_kill_9_mid_backfill_then_restart(
    anvil_factory: Callable[..., AnvilProcess], store_url: str, tmp_path: Path, case: str
) -> None:
    follower, indexer, recovery_kinds = KILL_CASES[case]
    anvil = anvil_factory(extra=["--gas-limit", "100000000"])
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=12_000, per_tx=1_000, gap=60)
    head, _ = await node.head()
    port = free_port()
    config = tmp_path / "chaingate.toml"
    config.write_text(config_text(tmp_path, port, anvil.url, store_url, follower, indexer))
    store = open_index_store(store_url, tmp_path)
    rows = IndexRows(store)
    async with store:
        process = serve(config)
        try:
            await wait_for_health(port, process)
            # Kill it once it has committed part of the history, well before the head.
            with trio.fail_after(120):
                while True:
                    cursor = await rows.index_cursor("ethereum", "devnet")
                    if cursor is not None and cursor.number >= head // 4:
                        if case != "follower_ahead":
                            break
                        # The case needs the follower's saved cursor above the index's.
                        followed, _ = await ChainRows(store).load_chain("ethereum", "devnet")
                        if followed is not None and followed.number > cursor.number:
                            break
                    await trio.sleep(0.01)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        killed_at = await rows.index_cursor("ethereum", "devnet")
        assert killed_at is not None and killed_at.number < head - 100, (
            f"the kill must land mid-backfill (index at {killed_at}, head {head})"
        )
        # The chain moves on while chaingate is down.
        a = manifest.accounts
        await node.send({"from": a[1], "to": a[2], "value": hex(10**16)})
        process = serve(config)
        try:
            await wait_for_health(port, process)
            got = await assert_index_matches(store, node, manifest)
            # The second run found its way back as the case says it must.
            async with httpx.AsyncClient(timeout=5) as client:
                metrics = await client.get(
                    f"http://127.0.0.1:{port}/metrics",
                    headers={"Authorization": f"Bearer {ADMIN}"},
                )
            recovery = [
                line
                for line in metrics.text.splitlines()
                if line.startswith("chaingate_indexer_events_total")
            ]
            counts = {
                line.split('kind="')[1].split('"')[0]: float(line.split()[-1]) for line in recovery
            }
            assert any(counts.get(kind, 0) > 0 for kind in recovery_kinds), recovery
            assert counts.get("replayed", 0) == 0, recovery
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
    assert len([t for t in got.transfers if t[2] == "ERC20"]) >= 12_000
    await node.aclose()


@pytest.mark.slow
async def test_graceful_stop_mid_backfill_then_restart(
    start_indexed: Start,
    anvil_factory: Callable[..., AnvilProcess],
    store_url: str,
    tmp_path: Path,
) -> None:
    anvil = anvil_factory(extra=["--gas-limit", "100000000"])
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=6_000, per_tx=500, gap=80)
    head, _ = await node.head()
    first = await start_indexed(
        anvil.url, store_url, finality_depth=2, follower={"max_log_range": 100}, batch_blocks=50
    )
    with trio.fail_after(60):
        while first.indexer.cursor is None or first.indexer.cursor.number < head // 3:
            await trio.sleep(0.005)
    first.scope.cancel()
    await trio.sleep(0.2)  # the shielded saves of follower and indexer
    async with open_index_store(store_url, tmp_path) as store:  # the gateway closed its own
        stopped = await IndexRows(store).index_cursor("ethereum", "devnet")
    assert stopped is not None and stopped.number < head - 50
    second = await start_indexed(anvil.url, store_url, finality_depth=2)
    await assert_index_matches(second.store, node, manifest)
    # Nothing was applied twice: the second run started where the first committed.
    assert second.indexer.stats["blocks"] + stopped.number + 1 >= head
    await node.aclose()


async def test_index_starting_below_the_follower_fetches_the_gap(
    start_indexed: Start, anvil_factory: Callable[..., AnvilProcess], store_url: str
) -> None:
    """The follower starts at the head (its default), the index at genesis: the index reads
    the blocks in between from the node itself."""
    anvil = anvil_factory()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=300, per_tx=100, gap=40)
    run = await start_indexed(
        anvil.url, store_url, finality_depth=2, follower={"start_block": None}, start_block=0
    )
    await assert_index_matches(run.store, node, manifest)
    assert run.indexer.stats["fetched_blocks"] > 100
    await node.aclose()


async def test_index_behind_a_follower_at_the_head_catches_up_on_a_quiet_chain(
    start_indexed: Start, anvil_factory: Callable[..., AnvilProcess], store_url: str
) -> None:
    """The follower's stored cursor is at the head and the index has nothing (it was off);
    no block comes after the restart: the index still catches up, from the follower's window
    replayed at start (on one process as on a leadership term)."""
    anvil = anvil_factory()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=300, per_tx=100, gap=40)
    head, head_hash = await node.head()
    first = await start_indexed(anvil.url, store_url, finality_depth=2, enabled=False)
    followed = first.gateway.chain.followers["ethereum/devnet"]
    with trio.fail_after(60):
        while followed.head is None or followed.head.hash != head_hash:
            await trio.sleep(0.01)
    first.scope.cancel()
    await trio.sleep(0.2)  # the follower's shielded save
    second = await start_indexed(anvil.url, store_url, finality_depth=2, start_block=0)
    with trio.fail_after(60):
        await second.indexer.wait_indexed(head)
    assert await node.head() == (head, head_hash)  # no block came to show the gap
    await assert_index_matches(second.store, node, manifest)
    await node.aclose()


async def test_two_processes_indexing_one_store_never_double_apply(
    start_indexed: Start, anvil_factory: Callable[..., AnvilProcess], store_url: str
) -> None:
    """Two gateways share a store (two processes behind reuse_port, say).  On SQLite both
    index: the cursor's compare-and-set lets only one apply each block; the other reloads and
    carries on.  On PostgreSQL the ``indexer`` role's lock lets only one index at a time
    (chaingate.cluster), so no commit ever conflicts."""
    anvil = anvil_factory()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=400, per_tx=100, gap=30)
    one = await start_indexed(anvil.url, store_url, finality_depth=2, batch_blocks=20)
    two = await start_indexed(anvil.url, store_url, finality_depth=2, batch_blocks=20)
    await assert_index_matches(one.store, node, manifest)
    a = manifest.accounts
    for i in range(5):
        await node.send({"from": a[1], "to": a[2 + i % 3], "value": hex(10**15)})
    await assert_index_matches(two.store, node, manifest)
    stats = one.indexer.stats + two.indexer.stats
    assert stats["commits"] > 0
    conflicts = one.indexer.stats["conflicts"] + two.indexer.stats["conflicts"]
    if store_url.startswith("postgres"):
        assert conflicts == 0
    else:
        assert conflicts > 0
    await node.aclose()
