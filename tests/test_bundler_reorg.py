"""A reorg after inclusion: the operation goes back to the mempool and is included again,
exactly once, on real anvil with an in-process gateway (bundler key funded, follower on).

``anvil_reorg`` (depth 1, no transactions) replaces the block that included the bundle with an
empty one; anvil drops the orphaned bundle transaction.  The follower's ``Revert`` must take
the receipt back and put the operation back as pending; the bundler sends it again and it
lands in a new block.  "Exactly once" is counted on the final chain: the EntryPoint's
``UserOperationEvent`` logs for the operation's hash (eth_getLogs over this module's own
short chain).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.aa.userop import Version
from chaingate.bundler.network import BundlerNetwork
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.bundler.submitter import Mined, Submitter
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from tests.helpers import GatewayHandle
from tests.test_aa_devnet import TAGS
from tests.test_bundler_e2e import Bundler, sponsored_op, start_settings
from tests.test_bundler_permissionless import _impl

USER_OPERATION_EVENT = abi.event_topic(
    "UserOperationEvent(bytes32,address,address,uint256,bool,uint256,uint256)"
)


def rpc(node: AnvilProcess, method: str, *params: Any) -> Any:
    with DevnetRpc(node.url) as client:
        return client.call(method, *params)


def events_for(node: AnvilProcess, entry_point: str, user_op_hash: str) -> list[dict[str, Any]]:
    logs: list[dict[str, Any]] = rpc(
        node,
        "eth_getLogs",
        {
            "fromBlock": "0x0",
            "toBlock": "latest",
            "address": entry_point,
            "topics": [USER_OPERATION_EVENT, user_op_hash],
        },
    )
    return logs


async def start(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    *,
    mode: str,
    safe: bool,
) -> Bundler:
    node, manifest = module_devnet
    settings = start_settings(node, tmp_path, manifest, safe_mode=safe, mode=mode)
    gateway = Gateway(
        settings, impl=_impl(), access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    return Bundler(GatewayHandle(gateway, io.BytesIO()), node, manifest)


async def send_sponsored(b: Bundler, version: Version) -> tuple[str, str]:
    """(entry point, operation hash) of a sponsored operation sent to the bundler."""
    entry_point = b.manifest.address(f"entry_point_{TAGS[version]}")
    op, _ = await sponsored_op(b, version)
    sent = await b.result("eth_sendUserOperation", encode_user_operation(op, version), entry_point)
    return entry_point, sent


async def wait_status(b: Bundler, user_op_hash: str, wanted: set[str], wait: float = 20.0) -> Any:
    with trio.fail_after(wait):
        while True:
            status = await b.result("chaingate_getUserOperationStatus", user_op_hash)
            if status["status"] in wanted:
                return status
            await trio.sleep(0.05)


async def receipt_not_in(b: Bundler, user_op_hash: str, block_hash: str) -> dict[str, Any]:
    """The receipt once it names a block other than ``block_hash`` (the orphaned one).  An
    answer whose transaction receipt is null (the orphaned bundle's, asked of the node before
    the follower took the receipt back) is not it: that answer was a bug of its own, guarded by
    ``test_no_receipt_answer_names_an_orphaned_bundle``."""
    with trio.fail_after(30):
        while True:
            receipt = await b.result("eth_getUserOperationReceipt", user_op_hash)
            if (
                receipt is not None
                and receipt["receipt"] is not None
                and receipt["receipt"]["blockHash"] != block_hash
            ):
                return dict(receipt)
            await trio.sleep(0.05)


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_manual_mode_a_reorged_operation_is_pending_again_then_included_once(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    version: Version,
) -> None:
    """Manual bundling holds the operation where the reorg left it, so its state between the
    two inclusions can be read: pending again, no receipt, listed for its sender."""
    b = await start(nursery, module_devnet, tmp_path, mode="manual", safe=True)
    entry_point = b.manifest.address(f"entry_point_{TAGS[version]}")
    op, op_hash = await sponsored_op(b, version)
    sent = await b.result("eth_sendUserOperation", encode_user_operation(op, version), entry_point)
    assert sent == op_hash
    assert (await b.result("chaingate_getUserOperationStatus", sent))["status"] == "pending"
    bundle = await b.result("debug_bundler_sendBundleNow")
    assert bundle is not None and bundle["userOpHashes"] == [sent], bundle
    first = await b.receipt(sent)
    assert first["receipt"]["transactionHash"] == bundle["transactionHash"]
    assert rpc(b.node, "eth_getBlockByNumber", "latest", False)["hash"] == bundle["blockHash"]
    assert len(events_for(b.node, entry_point, sent)) == 1

    rpc(b.node, "anvil_reorg", 1, [])  # the bundle's block replaced by an empty one
    assert events_for(b.node, entry_point, sent) == []
    assert rpc(b.node, "eth_getTransactionReceipt", bundle["transactionHash"]) is None
    status = await wait_status(b, sent, {"pending"})
    assert status["status"] == "pending", status
    assert await b.result("eth_getUserOperationReceipt", sent) is None
    waiting = await b.result("chaingate_getPendingUserOperations", op.sender)
    assert [w["userOpHash"] for w in waiting] == [sent], waiting

    again = await b.result("debug_bundler_sendBundleNow")
    assert again is not None and again["userOpHashes"] == [sent], again
    assert again["blockHash"] != bundle["blockHash"]
    second = await receipt_not_in(b, sent, bundle["blockHash"])
    assert second["success"] is True
    assert second["receipt"]["transactionHash"] == again["transactionHash"]
    assert second["receipt"]["blockHash"] == again["blockHash"]
    status = await wait_status(b, sent, {"included"})
    assert status["transactionHash"] == again["transactionHash"]
    # Exactly once on the final chain; nothing left to bundle.
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["blockHash"] == again["blockHash"], logs
    assert await b.result("debug_bundler_sendBundleNow") == "ok"
    assert await b.result("debug_bundler_dumpMempool") == []


@pytest.mark.parametrize("safe", [True, False], ids=["safe", "unsafe"])
@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_auto_mode_a_reorged_operation_is_bundled_again_by_itself_once(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    version: Version,
    safe: bool,
) -> None:
    b = await start(nursery, module_devnet, tmp_path, mode="auto", safe=safe)
    entry_point, sent = await send_sponsored(b, version)
    first = await b.receipt(sent)
    orphaned = first["receipt"]["blockHash"]
    # Mine nothing else before the reorg: the bundle's block must be the head.
    assert rpc(b.node, "eth_getBlockByNumber", "latest", False)["hash"] == orphaned

    rpc(b.node, "anvil_reorg", 1, [])
    second = await receipt_not_in(b, sent, orphaned)
    assert second["success"] is True
    assert second["receipt"]["transactionHash"] != first["receipt"]["transactionHash"]
    status = await wait_status(b, sent, {"included"})
    assert status["transactionHash"] == second["receipt"]["transactionHash"]
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["blockHash"] == second["receipt"]["blockHash"], logs
    # A few more blocks: it is not bundled a third time.
    for _ in range(3):
        rpc(b.node, "evm_mine")
    await trio.sleep(1.5)
    assert len(events_for(b.node, entry_point, sent)) == 1
    assert await b.result("debug_bundler_dumpMempool") == []


async def test_no_receipt_answer_names_an_orphaned_bundle(
    nursery: trio.Nursery, module_devnet: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    """Between the reorg and the follower's ``Revert``, eth_getUserOperationReceipt must not
    answer a receipt whose ``receipt`` is null (the node no longer knows the orphaned bundle
    transaction) — viem's receipt formatter throws on it.  Null (not included) or a full
    receipt, never half of one.  Polled as fast as the endpoint answers from the reorg until
    the operation is included again; a run that misses the window passes (the window is the
    follower's poll, ~20-100 ms).  This was a bug once; the test keeps it fixed."""
    b = await start(nursery, module_devnet, tmp_path, mode="manual", safe=False)
    entry_point, sent = await send_sponsored(b, "0.7")
    bundle = await b.result("debug_bundler_sendBundleNow")
    await b.receipt(sent)
    rpc(b.node, "anvil_reorg", 1, [])
    half: list[dict[str, Any]] = []
    with trio.fail_after(20):
        while True:
            receipt = await b.result("eth_getUserOperationReceipt", sent)
            if receipt is None:
                break  # the follower took it back
            if receipt["receipt"] is None or receipt["receipt"]["blockHash"] != bundle["blockHash"]:
                half.append(receipt)
    assert half == [], f"{len(half)} answers named an orphaned bundle: {half[0]}"


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_reorg_that_mines_the_same_bundle_again_leaves_it_included_blaming_nobody(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    version: Version,
) -> None:
    """What a real chain does more often than dropping it: the orphaned bundle transaction is
    mined again in the replacing block (same transaction, new block hash).  The follower sees
    Revert then Apply; the bundler must end with the operation included in the new block, once,
    with no bundle of its own reverted on it and no entity penalised for the FailedOp a second
    bundle would hit (the factory is blamed for AA10 "sender already constructed")."""
    b = await start(nursery, module_devnet, tmp_path, mode="auto", safe=True)
    entry_point, sent = await send_sponsored(b, version)
    first = await b.receipt(sent)
    orphaned = first["receipt"]["blockHash"]
    bundle_tx = first["receipt"]["transactionHash"]
    raw = rpc(b.node, "eth_getRawTransactionByHash", bundle_tx)
    head = int(rpc(b.node, "eth_blockNumber"), 16)

    rpc(b.node, "anvil_reorg", 1, [[raw, 0]])  # the same transaction, in a new block
    mined = rpc(b.node, "eth_getTransactionReceipt", bundle_tx)
    assert mined is not None and mined["blockHash"] != orphaned and mined["status"] == "0x1"
    second = await receipt_not_in(b, sent, orphaned)
    assert second["receipt"]["transactionHash"] == bundle_tx
    assert second["receipt"]["blockHash"] == mined["blockHash"]
    await trio.sleep(2)  # bundle rounds after the Revert: none may send it again
    status = await wait_status(b, sent, {"included"})
    assert status["transactionHash"] == bundle_tx and status["blockHash"] == mined["blockHash"]
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["blockHash"] == mined["blockHash"], logs
    bundler_key = b.handle.gateway.bundler.key  # type: ignore[union-attr]
    assert bundler_key is not None
    for number in range(head, int(rpc(b.node, "eth_blockNumber"), 16) + 1):
        block = rpc(b.node, "eth_getBlockByNumber", hex(number), True)
        for tx in block["transactions"]:
            if tx["from"].lower() == bundler_key.address.lower() and tx["hash"] != bundle_tx:
                raise AssertionError(f"a second bundle was sent: {tx['hash']}")
    reputation = await b.result("debug_bundler_dumpReputation")
    assert reputation and all(r["status"] == "ok" for r in reputation), reputation
    factory = b.manifest.address(f"simple_account_factory_{TAGS[version]}")
    assert factory.lower() in {r["address"].lower() for r in reputation}, reputation
    assert await b.result("debug_bundler_dumpMempool") == []


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_reorg_while_the_submitter_still_waits_for_the_bundle_is_bundled_again_once(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    version: Version,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race a busy machine showed: the bundle is mined and its receipt served, and its
    block orphaned before the submitter's next receipt poll (held here until the reorg is
    done), so the submitter is still waiting for a transaction anvil dropped.  It must not
    wait ``resend_after`` (30 s) for it: a copy with the same nonce (only one can be mined)
    is sent as soon as the node shows none pending, its operations submitted under it."""
    reorged = trio.Event()
    poll = Submitter.receipt

    async def late_poll(self: Submitter, hashes: Sequence[str]) -> Mined | None:
        await reorged.wait()
        return await poll(self, hashes)

    monkeypatch.setattr(Submitter, "receipt", late_poll)
    b = await start(nursery, module_devnet, tmp_path, mode="auto", safe=True)
    entry_point, sent = await send_sponsored(b, version)
    first = await b.receipt(sent)
    orphaned = first["receipt"]["blockHash"]
    assert rpc(b.node, "eth_getBlockByNumber", "latest", False)["hash"] == orphaned
    bundle_tx = rpc(b.node, "eth_getTransactionByHash", first["receipt"]["transactionHash"])
    rpc(b.node, "anvil_reorg", 1, [])
    await wait_status(b, sent, {"pending"})  # the follower's revert, while the submitter waits
    reorged.set()
    with trio.fail_after(15):  # well before resend_after
        second = await receipt_not_in(b, sent, orphaned)
    assert second["success"] is True
    copy = rpc(b.node, "eth_getTransactionByHash", second["receipt"]["transactionHash"])
    assert copy["hash"] != bundle_tx["hash"] and copy["nonce"] == bundle_tx["nonce"], copy
    status = await wait_status(b, sent, {"included"})
    assert status["transactionHash"] == second["receipt"]["transactionHash"]
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["blockHash"] == second["receipt"]["blockHash"], logs
    assert await b.result("debug_bundler_dumpMempool") == []


async def orphan_and_pool_again(
    b: Bundler, version: Version, held: tuple[trio.Event, trio.Event]
) -> tuple[str, str, str, int]:
    """A sponsored operation bundled and mined, its block orphaned, and its bundle transaction
    put back into the node's pool, pending (what many nodes do with an orphaned block's
    transactions; anvil drops them, so the test sends the same bytes again, automine off)
    before the bundler hears of the reorg.  Returns (entry point, operation hash, bundle
    transaction, the block before the bundle's) once the bundler has taken the receipt back."""
    entry_point, sent = await send_sponsored(b, version)
    first = await b.receipt(sent)
    bundle_tx = first["receipt"]["transactionHash"]
    raw = rpc(b.node, "eth_getRawTransactionByHash", bundle_tx)
    before = int(first["receipt"]["blockNumber"], 16) - 1
    rpc(b.node, "evm_setAutomine", False)
    rpc(b.node, "anvil_reorg", 1, [])
    assert rpc(b.node, "eth_getTransactionByHash", bundle_tx) is None
    rpc(b.node, "eth_sendRawTransaction", raw)
    assert rpc(b.node, "eth_getTransactionByHash", bundle_tx)["blockHash"] is None
    repooled, handled = held
    repooled.set()
    with trio.fail_after(30):
        await handled.wait()
    return entry_point, sent, bundle_tx, before


def hold_reverts(monkeypatch: pytest.MonkeyPatch) -> tuple[trio.Event, trio.Event]:
    """The bundler's ``reverted`` held until the first event is set; the second is set once
    it has returned."""
    repooled, handled = trio.Event(), trio.Event()
    reverted = BundlerNetwork.reverted

    async def held(self: BundlerNetwork, hashes: Sequence[str]) -> None:
        await repooled.wait()
        await reverted(self, hashes)
        handled.set()

    monkeypatch.setattr(BundlerNetwork, "reverted", held)
    return repooled, handled


def bundler_txs(b: Bundler, first: int) -> list[str]:
    """The bundler key's transactions in blocks ``first``.. of the node's chain."""
    bundler_key = b.handle.gateway.bundler.key  # type: ignore[union-attr]
    assert bundler_key is not None
    found = []
    for number in range(first, int(rpc(b.node, "eth_blockNumber"), 16) + 1):
        block = rpc(b.node, "eth_getBlockByNumber", hex(number), True)
        found += [
            tx["hash"]
            for tx in block["transactions"]
            if tx["from"].lower() == bundler_key.address.lower()
        ]
    return found


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_reorged_bundle_the_node_pools_again_is_mined_once_not_bundled_again(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    version: Version,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its operations stay submitted under the pooled transaction (a second bundle of them
    would revert on chain); once the node mines it, they are included by it, once, and the
    bundler sent no other transaction."""
    held = hold_reverts(monkeypatch)
    b = await start(nursery, module_devnet, tmp_path, mode="auto", safe=True)
    try:
        entry_point, sent, bundle_tx, before = await orphan_and_pool_again(b, version, held)
        status = await b.result("chaingate_getUserOperationStatus", sent)
        assert status["status"] == "submitted" and status["transactionHash"] == bundle_tx, status
        rpc(b.node, "evm_mine")
    finally:
        rpc(b.node, "evm_setAutomine", True)
    mined = rpc(b.node, "eth_getTransactionReceipt", bundle_tx)
    assert mined is not None and mined["status"] == "0x1"
    status = await wait_status(b, sent, {"included"})
    assert status["transactionHash"] == bundle_tx and status["blockHash"] == mined["blockHash"]
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["blockHash"] == mined["blockHash"], logs
    assert bundler_txs(b, before) == [bundle_tx]
    assert await b.result("debug_bundler_dumpMempool") == []


async def test_a_reorged_bundle_the_node_pooled_then_dropped_is_bundled_again_once(
    nursery: trio.Nursery,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pooled again, then gone from the pool: its operations go back to pending and are
    bundled again, once."""
    held = hold_reverts(monkeypatch)
    b = await start(nursery, module_devnet, tmp_path, mode="auto", safe=True)
    try:
        entry_point, sent, bundle_tx, before = await orphan_and_pool_again(b, "0.7", held)
        assert (await b.result("chaingate_getUserOperationStatus", sent))["status"] == "submitted"
        rpc(b.node, "anvil_dropTransaction", bundle_tx)
    finally:
        rpc(b.node, "evm_setAutomine", True)
    status = await wait_status(b, sent, {"included"}, wait=30)
    assert status["transactionHash"] != bundle_tx
    logs = events_for(b.node, entry_point, sent)
    assert len(logs) == 1 and logs[0]["transactionHash"] == status["transactionHash"], logs
    assert bundler_txs(b, before) == [status["transactionHash"]]
    assert await b.result("debug_bundler_dumpMempool") == []
