"""The chain follower against real anvil: following, reorgs, faults, restarts, backfill.

Every test compares what the follower emitted and stored with anvil's own canonical chain,
block hash by block hash.
"""

from __future__ import annotations

import io
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from chaingate.chain.events import Apply, ChainEvent, Finalized, Revert
from chaingate.chain.follower import Follower
from chaingate.chain.store import ChainRows
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.gateway import Gateway
from tests.conftest import make_settings
from tests.helpers import FaultyRelay
from tests.provider_stub import RangeLimitedRelay

ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
# A contract whose code is set with anvil_setCode: LOG1 with the first calldata word as topic.
EMITTER = "0x00000000000000000000000000000000000e1117"
EMITTER_CODE = "0x60003560006000a100"
RECEIPT = "eth_getTransactionReceipt"


async def node_call(url: str, method: str, params: list[Any] | None = None) -> Any:
    async with node_client() as client:
        return await call_on(client, url, method, params)


def node_client() -> httpx.AsyncClient:
    # Generous: mining thousands of blocks (a setup step) takes tens of seconds on a busy machine.
    return httpx.AsyncClient(timeout=120)


async def call_on(
    client: httpx.AsyncClient, url: str, method: str, params: list[Any] | None = None
) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
    reply = (await client.post(url, json=body)).json()
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


async def emit_logs(url: str, count: int) -> list[str]:
    """``count`` transactions, each emitting one log, each in a block of its own (automine).

    Each is sent once the one before is mined: anvil answers a send before it mines, and on a
    busy machine sends back to back share a block (tests/test_cluster_handover.py), while the
    tests here count one block per transaction.  Nor are they ever in anvil's pool together,
    where its automine can strand one sender's later nonces (foundry-rs/foundry#10122)."""
    hashes = []
    async with node_client() as client:
        for _ in range(count):
            tx = {"from": ACCOUNT, "to": EMITTER, "data": "0x" + secrets.token_hex(32)}
            tx_hash = await call_on(client, url, "eth_sendTransaction", [tx])
            with trio.fail_after(30):  # bounds a hang only: one block, mined at once
                while not (receipt := await call_on(client, url, RECEIPT, [tx_hash])):
                    await trio.sleep(0.005)
            assert receipt["status"] == "0x1", receipt
            hashes.append(tx_hash)
    return hashes


async def canonical_hashes(url: str, first: int, last: int) -> dict[int, str]:
    out = {}
    for number in range(first, last + 1):
        block = await node_call(url, "eth_getBlockByNumber", [hex(number), False])
        out[number] = block["hash"]
    return out


class Run:
    """One gateway with its follower on, and every event the follower emitted."""

    def __init__(self, gateway: Gateway, events: list[ChainEvent]) -> None:
        self.gateway = gateway
        self.events = events
        self.scope = trio.CancelScope()

    @property
    def follower(self) -> Follower:
        return self.gateway.chain.followers["ethereum/devnet"]

    def applied(self) -> list[tuple[int, str]]:
        return [
            (e.block.header.number, e.block.header.hash)
            for e in self.events
            if isinstance(e, Apply)
        ]

    async def wait_for_head(self, url: str, limit: float = 15) -> None:
        """Until the follower's tip is anvil's head."""
        with trio.fail_after(limit):
            while True:
                head = await node_call(url, "eth_getBlockByNumber", ["latest", False])
                applied = self.applied()
                if applied and applied[-1][1] == head["hash"]:
                    break
                await trio.sleep(0.02)
        # Until the follower has emitted what follows that Apply (Finalized) and gone idle.
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)


Starter = Callable[..., Any]


@pytest.fixture
def follow(nursery: trio.Nursery, tmp_path: Path) -> Starter:
    async def start(url: str | dict[str, Any], *, store_url: str = "", **follower: Any) -> Run:
        upstream = url if isinstance(url, dict) else {"url": url, "name": "anvil"}
        settings = make_settings(
            [upstream],
            network={
                "finality_depth": follower.pop("finality_depth", 2),
                "follower": {"enabled": True, "poll_interval": 0.02, **follower},
            },
            store={"url": store_url},
            data_dir=str(tmp_path),
        )
        gateway = Gateway(settings, access_stream=io.BytesIO())
        events: list[ChainEvent] = []
        stream = gateway.chain.followers["ethereum/devnet"].subscribe("test", buffer=1_000_000)
        run = Run(gateway, events)

        async def collect() -> None:
            async for event in stream:
                events.append(event)

        async def serve(task_status: trio.TaskStatus[None]) -> None:
            with run.scope:
                async with trio.open_nursery() as inner:
                    inner.start_soon(collect)
                    await inner.start(gateway.run)
                    task_status.started()

        await nursery.start(serve)
        return run

    return start


@pytest.fixture
def node(anvil_factory: Callable[..., AnvilProcess]) -> AnvilProcess:
    started = anvil_factory()
    rpc_call(started.url, "anvil_setCode", [EMITTER, EMITTER_CODE])
    return started


async def assert_stored_chain_is_canonical(run: Run, url: str) -> None:
    store = run.gateway.store
    assert store is not None
    cursor, rows = await ChainRows(store).load_chain("ethereum", "devnet")
    assert cursor is not None and rows
    canonical = await canonical_hashes(url, rows[0].number, cursor.number)
    assert {row.number: row.hash for row in rows} == canonical
    head = await node_call(url, "eth_getBlockByNumber", ["latest", False])
    assert (cursor.number, cursor.hash) == (int(head["number"], 16), head["hash"])
    # The window in memory is the same chain.
    assert {b.header.number: b.header.hash for b in run.follower.window} == {
        n: h for n, h in canonical.items() if n >= run.follower.window.base
    }


def check_order(events: list[ChainEvent]) -> None:
    """Applies extend the chain; a revert undoes the newest applied block."""
    chain: list[tuple[int, str]] = []
    for event in events:
        if isinstance(event, Apply):
            header = event.block.header
            if chain:
                assert header.number == chain[-1][0] + 1
                assert header.parent_hash == chain[-1][1]
            chain.append((header.number, header.hash))
        elif isinstance(event, Revert):
            assert chain and chain[-1] == (event.block.header.number, event.block.header.hash)
            chain.pop()


async def test_follows_new_blocks_with_their_logs(follow: Starter, node: AnvilProcess) -> None:
    run = await follow(node.url)
    await run.wait_for_head(node.url)
    start = run.follower.head
    assert start is not None
    txs = await emit_logs(node.url, 5)
    await run.wait_for_head(node.url)
    applied = [e for e in run.events if isinstance(e, Apply)]
    new = [e.block for e in applied if e.block.header.number > start.number]
    assert [b.header.number for b in new] == list(range(start.number + 1, start.number + 6))
    assert all(e.live for e in applied if e.block.header.number > start.number)
    for block, tx in zip(new, txs, strict=True):
        assert block.transactions == [tx]
        assert len(block.logs) == 1
        log = block.logs[0]
        assert log.transaction_hash == tx and log.block_hash == block.header.hash
        assert log.address.lower() == EMITTER
    # Finalized trails the head by finality_depth (2), in order.
    finalized = [e.header.number for e in run.events if isinstance(e, Finalized)]
    assert finalized == list(range(finalized[0], start.number + 5 - 2 + 1))
    check_order(run.events)
    await assert_stored_chain_is_canonical(run, node.url)
    # The follower and the gas oracle it feeds are visible in /metrics.
    metrics = run.gateway.registry.render().decode()
    labels = '{chain="ethereum",network="devnet"}'
    assert f"chaingate_follower_block{labels} {start.number + 5}" in metrics
    assert f"chaingate_follower_finalized_block{labels} {start.number + 3}" in metrics
    assert (
        'chaingate_follower_events_total{chain="ethereum",network="devnet",kind="applied"}'
        in metrics
    )
    assert "chaingate_gas_updates_total" + labels in metrics


async def test_polling_a_head_already_applied_keeps_nothing(
    follow: Starter, node: AnvilProcess
) -> None:
    """Each poll of ``latest`` notes the head's transactions until the block is applied; a
    head already applied must not leave its list behind — one per block piled up until
    10,000 were held (a busy chain's blocks: hundreds of hashes each; issue 39's soak)."""
    run = await follow(node.url)
    await run.wait_for_head(node.url)
    for _ in range(12):
        await emit_logs(node.url, 1)
        await run.wait_for_head(node.url)
        await trio.sleep(0.1)  # polls that find the head already applied
    assert len(run.follower._txs) <= 1, len(run.follower._txs)


@pytest.mark.parametrize("depth", [1, 3])
async def test_anvil_reorg_reverts_then_applies(
    follow: Starter, node: AnvilProcess, depth: int
) -> None:
    await emit_logs(node.url, 6)
    run = await follow(node.url, finality_depth=8)
    await run.wait_for_head(node.url)
    before = await canonical_hashes(node.url, 1, 6)
    seen = len(run.events)
    # Replace the last ``depth`` blocks; the new branch carries one transaction of its own.
    tx = {"from": ACCOUNT, "to": EMITTER, "data": "0x" + "ab" * 32, "nonce": hex(6 - depth)}
    await node_call(node.url, "anvil_reorg", [depth, [[tx, 0]]])
    await run.wait_for_head(node.url)
    after = await canonical_hashes(node.url, 1, 6)
    orphaned = [n for n in range(6, 6 - depth, -1)]
    assert all(before[n] != after[n] for n in orphaned)
    tail = [e for e in run.events[seen:] if not isinstance(e, Finalized)]
    expected = [("revert", n, before[n]) for n in orphaned] + [
        ("apply", n, after[n]) for n in reversed(orphaned)
    ]
    assert [
        ("revert" if isinstance(e, Revert) else "apply", e.block.header.number, e.block.header.hash)
        for e in tail
    ] == expected
    # Reverted blocks carry the logs a consumer must undo.
    assert all(len(e.block.logs) == 1 for e in tail if isinstance(e, Revert))
    check_order(run.events)
    await assert_stored_chain_is_canonical(run, node.url)


async def test_snapshot_revert_then_new_branch(follow: Starter, node: AnvilProcess) -> None:
    await emit_logs(node.url, 2)
    snapshot = await node_call(node.url, "evm_snapshot")
    await emit_logs(node.url, 3)  # blocks 3, 4, 5: to be orphaned
    run = await follow(node.url, finality_depth=8)
    await run.wait_for_head(node.url)
    before = await canonical_hashes(node.url, 1, 5)
    seen = len(run.events)
    assert await node_call(node.url, "evm_revert", [snapshot]) is True
    await emit_logs(node.url, 2)  # blocks 3', 4'
    await run.wait_for_head(node.url)
    after = await canonical_hashes(node.url, 1, 4)
    tail = [e for e in run.events[seen:] if not isinstance(e, Finalized)]
    assert [
        ("revert" if isinstance(e, Revert) else "apply", e.block.header.number, e.block.header.hash)
        for e in tail
    ] == [("revert", n, before[n]) for n in (5, 4, 3)] + [("apply", n, after[n]) for n in (3, 4)]
    check_order(run.events)
    await assert_stored_chain_is_canonical(run, node.url)


async def test_reorg_deeper_than_the_window(follow: Starter, node: AnvilProcess) -> None:
    """Beyond finality, nothing is left to compare with: the follower reverts its whole
    window and re-applies the canonical blocks from the window's base, loudly."""
    await emit_logs(node.url, 12)
    run = await follow(node.url, finality_depth=2, keep_blocks=8, start_block=1)
    await run.wait_for_head(node.url)
    window = [b.header for b in run.follower.window]
    seen = len(run.events)
    tx = {"from": ACCOUNT, "to": EMITTER, "data": "0x" + "cd" * 32, "nonce": hex(2)}
    await node_call(node.url, "anvil_reorg", [10, [[tx, 0]]])
    await run.wait_for_head(node.url)
    assert run.follower.stats["deep_reorgs"] == 1
    tail = [e for e in run.events[seen:] if not isinstance(e, Finalized)]
    reverts = [e.block.header for e in tail if isinstance(e, Revert)]
    assert reverts == list(reversed(window))
    applies = [e.block.header for e in tail[len(reverts) :]]
    assert all(isinstance(e, Apply) for e in tail[len(reverts) :])
    canonical = await canonical_hashes(node.url, window[0].number, 12)
    assert {h.number: h.hash for h in applies} == canonical
    check_order(tail[len(reverts) :])
    await assert_stored_chain_is_canonical(run, node.url)


async def test_upstream_connections_dying_lose_and_duplicate_nothing(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery
) -> None:
    relay = FaultyRelay(node.port)
    await nursery.start(relay.serve)
    run = await follow(f"http://127.0.0.1:{relay.port}")
    await run.wait_for_head(node.url)
    first = run.follower.head
    assert first is not None

    async def mine() -> None:
        await emit_logs(node.url, 30)

    async with trio.open_nursery() as inner:
        inner.start_soon(mine)
        for _ in range(5):
            await trio.sleep(0.05)
            relay.mode = "swallow_response"  # every answer dies with a reset
            await trio.sleep(0.1)
            relay.mode = "pass"
    await run.wait_for_head(node.url)
    assert relay.responses_swallowed > 0
    assert run.follower.stats["errors"] > 0
    numbers = [n for n, _ in run.applied()]
    assert numbers == list(range(first.number, first.number + 31))  # no gap, no duplicate
    check_order(run.events)
    await assert_stored_chain_is_canonical(run, node.url)


@pytest.mark.slow
async def test_restart_mid_backfill_resumes_without_gap_or_duplicate(
    follow: Starter, node: AnvilProcess, store_url: str
) -> None:
    await emit_logs(node.url, 20)
    await node_call(node.url, "anvil_mine", [hex(400)])
    await emit_logs(node.url, 20)
    first = await follow(node.url, store_url=store_url, start_block=0, max_log_range=16)
    with trio.fail_after(20):
        while len(first.applied()) < 150:
            await trio.sleep(0.005)
    first.scope.cancel()
    await trio.sleep(0.1)  # let the first run's shielded save finish
    stopped_at = first.applied()[-1][0]
    head = int(await node_call(node.url, "eth_blockNumber"), 16)
    assert stopped_at < head - 10, "the first run must stop mid-backfill"
    await emit_logs(node.url, 3)  # and the chain moves on while chaingate is down
    second = await follow(node.url, store_url=store_url, start_block=0)
    await second.wait_for_head(node.url)
    combined = first.applied() + second.applied()
    head = int(await node_call(node.url, "eth_blockNumber"), 16)
    assert [n for n, _ in combined] == list(range(0, head + 1))
    canonical = await canonical_hashes(node.url, 0, head)
    assert dict(combined) == canonical
    logs = sum(
        len(e.block.logs) for run in (first, second) for e in run.events if isinstance(e, Apply)
    )
    assert logs == 43
    await assert_stored_chain_is_canonical(second, node.url)


@pytest.mark.slow
async def test_backfill_5000_blocks_through_a_range_limit(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery
) -> None:
    await emit_logs(node.url, 10)
    await node_call(node.url, "anvil_mine", [hex(2500)])
    await emit_logs(node.url, 10)
    await node_call(node.url, "anvil_mine", [hex(2500)])
    await emit_logs(node.url, 10)
    head = int(await node_call(node.url, "eth_blockNumber"), 16)
    assert head >= 5000
    relay = RangeLimitedRelay(node.url, max_range=100)
    await nursery.start(relay.serve)
    run = await follow(relay.url, start_block=0, max_log_range=2000)
    await run.wait_for_head(node.url, limit=120)
    assert relay.refused > 0  # the limit was hit and the range split
    assert all(b - a + 1 <= 100 for a, b in relay.log_ranges)
    assert run.follower.stats["log_range_splits"] >= 1
    numbers = [n for n, _ in run.applied()]
    assert numbers == list(range(0, head + 1))
    assert sum(len(e.block.logs) for e in run.events if isinstance(e, Apply)) == 30
    backfilled = [e for e in run.events if isinstance(e, Apply) and not e.live]
    assert len(backfilled) >= head - 2 - 8  # all but the last few came from ranged getLogs
    check_order(run.events)
    await assert_stored_chain_is_canonical(run, node.url)


async def test_a_node_error_while_reading_ahead_is_a_retried_error_not_a_crash(
    follow: Starter, node: AnvilProcess, nursery: trio.Nursery
) -> None:
    """The backfill reads the next range in a task of its own; a node's error there comes
    out as that error (counted, retried quietly), not as an exception group (a 'bug')."""
    await emit_logs(node.url, 3)
    await node_call(node.url, "anvil_mine", [hex(600)])
    relay = RangeLimitedRelay(node.url, max_range=100, failed_header_batches=2)
    await nursery.start(relay.serve)
    run = await follow(relay.url, start_block=0, max_log_range=100)
    await run.wait_for_head(node.url, limit=120)
    assert relay.failed_header_batches == 0
    assert run.follower.stats["errors"] >= 2
    assert run.follower.stats["bugs"] == 0
    check_order(run.events)


async def test_upstream_websocket_new_heads_wake_the_follower(
    follow: Starter, node: AnvilProcess
) -> None:
    """With the upstream's ws_url, a new block is followed at once although polling is slow.

    Polling is an hour apart, so a block followed within the test can only have been woken by
    newHeads: the proof is causal, and the time limits below only bound a hang (a loaded
    machine once took 4 s per block, which a 2 s limit called a failure)."""
    upstream = {"url": node.url, "name": "anvil", "ws_url": f"ws://127.0.0.1:{node.port}"}
    run = await follow(upstream, poll_interval=3600)
    notifier = run.follower.notifier
    assert notifier is not None
    with trio.fail_after(10):
        while notifier.connected == 0:
            await trio.sleep(0.01)
    await run.wait_for_head(node.url)
    for _ in range(3):
        await emit_logs(node.url, 1)
        await run.wait_for_head(node.url, limit=30)  # far below the hour between polls
    assert notifier.notifications >= 3
    check_order(run.events)


@pytest.mark.parametrize("start_block", [None, 0])
@pytest.mark.parametrize("new_head", [30, 116])
async def test_resume_on_a_chain_restarted_fresh_never_finalizes_above_the_head(
    follow: Starter,
    anvil_factory: Callable[..., AnvilProcess],
    store_url: str,
    start_block: int | None,
    new_head: int,
) -> None:
    """The stored cursor names a chain that is gone: the node was restarted from scratch and
    is now shorter than the old chain — below the window's base (30) or inside its heights
    (116).  The follower reverts what it held, follows the new chain, and its finalized block
    follows the new chain instead of staying where the old one was (it said 118 with head 30)."""
    old = anvil_factory()
    await node_call(old.url, "anvil_mine", [hex(110)])
    first = await follow(old.url, store_url=store_url, start_block=start_block)
    await first.wait_for_head(old.url)
    await node_call(old.url, "anvil_mine", [hex(10)])  # followed live: a full window
    await first.wait_for_head(old.url)
    assert first.follower.finalized == 118
    base = first.follower.window.base
    assert base == 113
    first.scope.cancel()
    await trio.sleep(0.1)  # the first run's shielded save
    old.stop()
    # Another genesis time: two nodes started in the same second would mine identical blocks.
    new = anvil_factory(extra=["--timestamp", "1700000000"])
    await node_call(new.url, "anvil_mine", [hex(new_head)])
    second = await follow(new.url, store_url=store_url, start_block=start_block)
    await second.wait_for_head(new.url)
    head = second.follower.head
    assert head is not None and head.number == new_head
    assert second.follower.finalized == new_head - 2
    health = second.gateway.health()["networks"][0]["follower"]
    assert (health["block"], health["finalized"]) == (new_head, new_head - 2)
    # What it held of the old chain is reverted, newest first, before anything new.
    reverts = [e for e in second.events if isinstance(e, Revert)]
    assert [e.block.header.number for e in reverts] == list(range(120, base - 1, -1))
    assert second.events[: len(reverts)] == reverts
    rest = second.events[len(reverts) :]
    check_order(rest)
    # Below the base there is nothing to refill from: a first start on the new chain.  Else it
    # refills from the window's base, and the reverted heights are finalized again.
    first_start = 0 if start_block == 0 else new_head - 2
    first_applied = first_start if new_head < base else base
    assert [n for n, _ in second.applied()] == list(range(first_applied, new_head + 1))
    finalized = {e.header.number: e.header.hash for e in rest if isinstance(e, Finalized)}
    assert list(finalized) == list(range(first_applied, new_head - 1))
    assert finalized == await canonical_hashes(new.url, first_applied, new_head - 2)
    store = second.gateway.store
    assert store is not None
    cursor, _ = await ChainRows(store).load_chain("ethereum", "devnet")
    assert cursor is not None and cursor.finalized == new_head - 2
    await assert_stored_chain_is_canonical(second, new.url)
