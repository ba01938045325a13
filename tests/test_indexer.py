"""The indexer inside a real gateway, following a bootstrapped devnet on anvil.

Every test ends with ``assert_index_matches``: the whole index equals a recomputation over the
canonical chain's logs and the demo contracts' own ``balanceOf``/``ownerOf``/``totalSupply``
at the head — on SQLite and on PostgreSQL (``store_url``).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.config.manifest import Manifest
from chaingate.data.indexer import IndexCommit, Indexer
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from chaingate.gateway import Gateway
from chaingate.store import Store
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.test_indexer_oracle import Node, assert_index_matches


class Indexed:
    """A gateway following ``node`` with its indexer on."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.scope = trio.CancelScope()
        self.commits: list[IndexCommit] = []

    @property
    def indexer(self) -> Indexer:
        assert self.gateway.data is not None
        return self.gateway.data.indexers["ethereum/devnet"]

    @property
    def store(self) -> Store:
        assert self.gateway.store is not None
        return self.gateway.store


Start = Callable[..., Any]


async def start_indexed_in(
    nursery: trio.Nursery,
    url: str,
    store_url: str,
    data_dir: Path,
    *,
    finality_depth: int = 8,
    follower: dict[str, Any] | None = None,
    **indexer: Any,
) -> Indexed:
    """A gateway with follower and indexer on, following ``url`` from genesis, in ``nursery``."""
    settings = make_settings(
        [{"url": url, "name": "anvil"}],
        network={
            "finality_depth": finality_depth,
            "follower": {
                "enabled": True,
                "poll_interval": 0.02,
                "start_block": 0,
                **(follower or {}),
            },
            "indexer": {"batch_seconds": 0.05, **indexer},
        },
        store={"url": store_url},
        data_dir=str(data_dir),
    )
    gateway = Gateway(settings, access_stream=io.BytesIO())
    run = Indexed(gateway)

    async def record(commit: IndexCommit) -> None:
        run.commits.append(commit)

    if indexer.get("enabled", True):
        run.indexer.add_listener(record)

    async def serve(task_status: trio.TaskStatus[None]) -> None:
        with run.scope:
            await gateway.run(task_status=task_status)  # type: ignore[arg-type]

    await nursery.start(serve)
    return run


def indexed_starter(nursery: trio.Nursery, tmp_path: Path) -> Start:
    """What the ``start_indexed`` fixtures of the indexer tests return."""
    started = 0

    async def start(url: str, store_url: str, **kwargs: Any) -> Indexed:
        nonlocal started
        started += 1
        return await start_indexed_in(
            nursery, url, store_url, tmp_path / f"data-{started}", **kwargs
        )

    return start


@pytest.fixture
def start_indexed(nursery: trio.Nursery, tmp_path: Path) -> Start:
    return indexed_starter(nursery, tmp_path)


@pytest.fixture
def devnet_node(anvil_factory: Callable[..., AnvilProcess]) -> tuple[AnvilProcess, Manifest]:
    """A fresh bootstrapped devnet per test (the state cache makes it ~0.1 s): tests here
    reorganise and extend its chain."""
    node = anvil_factory()
    return node, bootstrap_devnet(node.url, paymaster_signer=DEVNET_SIGNER.address)


async def test_devnet_history_is_indexed_exactly(
    start_indexed: Start, devnet_node: tuple[AnvilProcess, Manifest], store_url: str
) -> None:
    anvil, manifest = devnet_node
    node = Node(anvil.url)
    run = await start_indexed(anvil.url, store_url)
    got = await assert_index_matches(run.store, node, manifest)
    # The demo history: both tokens, the collection and the items, with holders.
    cgt = manifest.address("erc20_cgt").lower()
    assert got.contracts[cgt][0] == "ERC20" and got.contracts[cgt][3] >= 9  # airdrop recipients
    items = manifest.address("erc1155_items").lower()
    assert got.contracts[items][0] == "ERC1155"
    natives = [t for t in got.transfers if t[2] == "native"]
    assert len(natives) >= 2  # the deployer's and a3's ETH sends
    # A listener heard of every token contract, once each.
    seen = [c.contract for commit in run.commits for c in commit.contracts]
    assert sorted(seen) == sorted(got.contracts)
    # ... and of the ERC-1155 URIs set at mint.
    uris = [m for commit in run.commits for m in commit.metadata if m.kind == "erc1155_uri"]
    assert {(m.contract, m.first_token) for m in uris} == {(items, 1), (items, 3)}
    # New blocks are indexed as they come.
    a1, a2 = manifest.accounts[1], manifest.accounts[2]
    usd = manifest.address("erc20_cgusd")
    await node.send(
        {
            "from": a1,
            "to": usd,
            "data": "0x" + abi.encode_call("transfer(address,uint256)", a2, 5).hex(),
        }
    )
    # wait_indexed returns once the index holds the new head (what `chaingate dev` waits for).
    sent_at, _ = await node.head()
    assert run.gateway.data is not None
    with trio.fail_after(10):
        await run.gateway.data.wait_indexed("ethereum/devnet", sent_at)
    assert run.indexer.cursor is not None and run.indexer.cursor.number >= sent_at
    await assert_index_matches(run.store, node, manifest)
    assert run.indexer.live
    # The index is visible in /metrics: its block and its counters.
    head, _ = await node.head()
    metrics = run.gateway.registry.render().decode()
    labels = 'chain="ethereum",network="devnet"'
    assert f"chaingate_indexer_block{{{labels}}} {head}" in metrics
    transfers = run.indexer.stats["transfers"]
    assert f'chaingate_indexer_events_total{{{labels},kind="transfers"}} {transfers}' in metrics
    # The follower may resume from the index's cursor (Follower.subscribe(resume=...)).
    assert await run.indexer.resume_point() == (head, (await node.head())[1])
    await node.aclose()
