"""Every consumer the follower feeds in leadership terms — the indexer, the webhook matcher,
the wallets' and the bundler's trackers — covers every block from its start when its first
term begins long after the follower passed those blocks, on SQLite and PostgreSQL.

Issue 39: on PostgreSQL a leadership lock won late left the indexer beginning at the first
block its term happened to see (100 of 1,053 logs indexed by a fresh-clone CI run; none once
the first lock check was 20 ms late).  Here the first grant is held back, deterministically,
by an event (``Leadership.hold_first_grant``) until the follower has reached the head, far
past its window of recent blocks; then every consumer must hold the history from the
network's origin (the follower's ``start_block``, 0): the handleOps operation of an early
block, and every transfer of the blocks after it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from chaingate.aa import accounts, userop
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.store import Store, open_store
from chaingate.store.base import new_id
from chaingate.webhooks.filters import parse_config
from chaingate.webhooks.store import WebhookRow, WebhookRows
from chaingate.webhooks.variants import VARIANT_A
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.test_aa_devnet import NodeCaller, build_op, funded_bundler, send
from tests.webhook_receiver import Receiver

TRANSFERS = 6
GAP = 5  # empty blocks after each transfer: the history is several windows long
KEEP = 8  # the follower's window (finality_depth 2: the window's floor, MIN_KEEP)
NETWORK = "ethereum/devnet"


class History(msgspec.Struct, frozen=True):
    """What the chain holds that every consumer must have seen."""

    head: int
    logs: int  # every log of blocks 0..head
    op_block: int  # the block of the handleOps operation
    op_hash: str
    op_sender: str
    watched: str  # the receiver of ``TRANSFERS`` CGT transfers
    token: str


@pytest.fixture(scope="module")
def history(module_devnet: tuple[AnvilProcess, Manifest]) -> History:
    node, manifest = module_devnet
    factory = trio.run(
        accounts.learn_factory,
        NodeCaller(node.url),
        manifest.address("simple_account_factory_v07"),
        "0.7",
    )
    watched = "0x" + PrivateKey.generate().address[2:].lower()
    token = manifest.address("erc20_cgt")
    with DevnetRpc(node.url) as rpc:
        op, digest = build_op(rpc, manifest, "0.7", factory, PrivateKey.generate(), DEVNET_SIGNER)
        bundler = funded_bundler(rpc)
        calldata = userop.handle_ops_calldata([op], bundler, "0.7")
        receipt = send(rpc, bundler, manifest.address("entry_point_v07"), calldata)
        assert receipt["status"] == "0x1"
        for n in range(TRANSFERS):
            rpc.call("anvil_mine", hex(GAP))
            call = abi.encode_call("transfer(address,uint256)", watched, n + 1)
            send(rpc, manifest.accounts[1], token, call)
        rpc.call("anvil_mine", hex(GAP))
        head = int(rpc.call("eth_blockNumber"), 16)
        logs = rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head)})
    assert head - int(receipt["blockNumber"], 16) > 4 * KEEP
    return History(
        head=head,
        logs=len(logs),
        op_block=int(receipt["blockNumber"], 16),
        op_hash="0x" + digest.hex(),
        op_sender=op.sender.lower(),
        watched=watched,
        token=token.lower(),
    )


async def watch(store: Store, watched: str, url: str) -> WebhookRow:
    """A token-transfer webhook on ``watched``, made before the matcher ever ran (so it is
    matched from the network's origin)."""
    await store.migrate()
    account = await AuthRows(store).create_account("late-term@example.com", "free")
    config = parse_config("token_transfer", {"addresses": [watched]}, max_values=100)
    now = store.clock()
    row = WebhookRow(
        id=new_id("wh_"),
        account_id=account.id,
        url=url,
        chain="ethereum",
        network="devnet",
        chain_label="ethereum",
        event_type=VARIANT_A.type_name("token_transfer"),
        config=msgspec.json.encode(config).decode(),
        confirmations=0,
        status="active",
        status_reason=None,
        secret="whsec_" + "a" * 32,
        previous_secret=None,
        previous_secret_until=None,
        sequence=0,
        matched_from=None,
        created_at=now,
        updated_at=now,
    )
    created = await WebhookRows(store).create_webhook(row, limit=0)
    assert created.matched_from is None  # nothing matched yet: from the origin
    return created


async def count(store: Store, sql: str, *params: Any) -> int:
    def select(tx: Any) -> int:
        return int(tx.query(sql, params)[0][0])

    return await store.run_transaction(select, write=False)


async def test_a_first_term_that_begins_late_covers_every_block_from_the_start(
    module_devnet: tuple[AnvilProcess, Manifest],
    history: History,
    store_url: str,
    tmp_path: Path,
    nursery: trio.Nursery,
) -> None:
    node, manifest = module_devnet
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    receiver = Receiver()
    await nursery.start(receiver.serve)
    async with open_store(store_url, tmp_path) as store:
        hook = await watch(store, history.watched, f"http://127.0.0.1:{receiver.port}/hook")
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02, "start_block": 0},
            "indexer": {"batch_seconds": 0.05},
        },
        store={"url": store_url},
        data_dir=str(tmp_path),
        webhooks={"allow_http": True},
        outbound={"allow_cidrs": ["127.0.0.1/32"]},
    )
    gateway = Gateway(settings, access_stream=io.BytesIO())
    first_lock = trio.Event()
    gateway.leadership.hold_first_grant(first_lock)
    follower = gateway.chain.followers[NETWORK]
    assert gateway.data is not None and gateway.webhooks is not None
    assert gateway.wallets is not None and gateway.bundler is not None
    indexer = gateway.data.indexers[NETWORK]
    matcher = gateway.webhooks.matchers[NETWORK]
    await nursery.start(gateway.run)
    store = gateway.store
    assert store is not None

    # The follower reaches the head with no role led anywhere: its window is far past the
    # operation's block, and no consumer has begun.
    with trio.fail_after(60):
        while (follower.progress[0] or 0) < history.head:
            await trio.sleep(0.02)
    assert follower.window.base is not None and follower.window.base > history.op_block + KEEP
    assert gateway.leadership.leads() == []
    assert indexer.cursor is None and matcher.cursor is None

    first_lock.set()  # the first lock is won at last

    async def positions() -> tuple[int, ...]:
        index = await indexer.resume_point()
        matched = await matcher.resume_point()
        kept = [
            await gateway.wallets.trackers[NETWORK].position.resume_point(),  # type: ignore[union-attr]
            await gateway.bundler.trackers[NETWORK].position.resume_point(),  # type: ignore[union-attr]
        ]
        return tuple(p[0] if p is not None else -1 for p in [index, matched, *kept])

    with trio.move_on_after(60):
        while min(await positions()) < history.head:
            await trio.sleep(0.05)
    assert min(await positions()) >= history.head, (await positions(), history.head)

    # The indexer: every log of blocks 0..head, and every transfer to the watched address.
    assert indexer.stats["logs"] == history.logs
    transfers = await count(
        store,
        "SELECT COUNT(*) FROM idx_transfers WHERE chain = 'ethereum' AND network = 'devnet'"
        " AND receiver = ? AND contract = ?",
        history.watched,
        history.token,
    )
    assert transfers == TRANSFERS
    # The webhook matcher: an event for each transfer, the first blocks' too.
    events = await count(store, "SELECT COUNT(*) FROM webhook_events WHERE webhook_id = ?", hook.id)
    assert events == TRANSFERS
    # The wallets' tracker: the operation's deployment; the bundler's: its receipt.
    deployed = await count(
        store,
        "SELECT COUNT(*) FROM wallet_deployments WHERE chain = 'ethereum' AND network = 'devnet'"
        " AND address = ? AND block_number = ?",
        history.op_sender,
        history.op_block,
    )
    assert deployed == 1
    receipts = await count(
        store,
        "SELECT COUNT(*) FROM bundler_receipts WHERE chain = 'ethereum' AND network = 'devnet'"
        " AND user_op_hash = ? AND block_number = ?",
        history.op_hash,
        history.op_block,
    )
    assert receipts == 1
    gateway.shutdown()
