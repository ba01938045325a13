"""``kill -9`` of a real ``chaingate serve`` with operations in its mempool, or with a bundle
transaction in flight, then a restart: nothing lost, nothing bundled twice — on SQLite and
PostgreSQL.

The process runs the bundler with a key of its own (``[bundler] key``, funded on anvil) and
``debug = true``; operations (half EntryPoint v0.6, half v0.7, each a new sender deployed by
its own operation, sponsored by the devnet paymaster) are built and signed here with
chaingate.aa as tests/test_bundler_e2e.py builds them.  ``mode = "manual"`` holds them in the
mempool until the kill; the restart runs ``mode = "auto"``.

What the chain must show afterwards is counted on the chain itself: one EntryPoint
``UserOperationEvent`` per operation hash (eth_getLogs, this module's own short chain), and
every operation event of the test in a mined, successful transaction of the bundler's key — so
no bundle carried an operation twice and no bundle reverted on one already included.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.aa import accounts
from chaingate.aa.userop import Version
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey
from tests.conftest import DEVNET_SIGNER
from tests.serve_process import KillableServe
from tests.test_aa_devnet import TAGS, NodeCaller, build_op
from tests.test_indexer_restart import wait_for_health

N = 8
USER_OPERATION_EVENT = abi.event_topic(
    "UserOperationEvent(bytes32,address,address,uint256,bool,uint256,uint256)"
)
PATH = "/v1/bundler/ethereum/devnet"


def rpc(node: AnvilProcess, method: str, *params: Any) -> Any:
    with DevnetRpc(node.url) as client:
        return client.call(method, *params)


def config_text(
    data_dir: Path,
    port: int,
    node: AnvilProcess,
    manifest: Path,
    key: PrivateKey,
    mode: str,
    resend_after: float,
    follower_poll: float = 0.05,
    bundle_interval: float = 0.5,
    safe: bool = True,
) -> str:
    return (
        f'data_dir = "{data_dir}"\n'
        f"[server]\nport = {port}\n"
        "[auth]\nenabled = false\n"
        "[observability]\naccess_log = false\n"
        f'[bundler]\nkey = "{key.hex()}"\ndebug = true\n'
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nfinality_depth = 2\n"
        f'block_time = 1.0\nmanifest = "{manifest}"\n'
        "[chains.ethereum.devnet.follower]\nenabled = true\n"
        f"poll_interval = {follower_poll}\n"
        "[chains.ethereum.devnet.indexer]\nenabled = false\n"
        f'[chains.ethereum.devnet.bundler]\nmode = "{mode}"\n'
        f"bundle_interval = {bundle_interval}\nsafe_mode = {str(safe).lower()}\n"
        f"resend_after = {resend_after}\n"
        f'[[chains.ethereum.devnet.upstreams]]\nurl = "{node.url}"\nname = "anvil"\n'
    )


class Server(KillableServe):
    """One ``chaingate serve`` process at a time over the same data dir, store and port."""

    def __init__(
        self,
        tmp: Path,
        node: AnvilProcess,
        manifest: Manifest,
        store_url: str,
        key: PrivateKey,
    ) -> None:
        self.node = node
        self.manifest = manifest
        self.key = key
        self.port = free_port()
        self.data_dir = tmp / "serve"
        self.data_dir.mkdir()
        self.manifest_path = tmp / "manifest.json"
        self.manifest_path.write_bytes(dumps(manifest))
        super().__init__(
            self.data_dir / "chaingate.toml",
            {**os.environ, "CHAINGATE_STORE__URL": store_url},
            self.data_dir / "stderr.log",
        )
        self._id = 0

    async def start(self, mode: str, resend_after: float = 30.0, **timing: Any) -> None:
        await wait_for_health(self.port, self.launch(mode, resend_after, **timing))

    def launch(self, mode: str, resend_after: float, **timing: Any) -> subprocess.Popen[bytes]:
        self.config.write_text(
            config_text(
                self.data_dir,
                self.port,
                self.node,
                self.manifest_path,
                self.key,
                mode,
                resend_after,
                **timing,
            )
        )
        return self.spawn()

    async def call(self, method: str, *params: Any, seconds: float = 30) -> dict[str, Any]:
        self._id += 1
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)}
        async with httpx.AsyncClient(timeout=seconds) as client:
            answer = await client.post(f"http://127.0.0.1:{self.port}{PATH}", json=body)
        assert answer.status_code == 200, answer.text
        reply: dict[str, Any] = answer.json()
        return reply

    async def result(self, method: str, *params: Any, seconds: float = 30) -> Any:
        reply = await self.call(method, *params, seconds=seconds)
        assert "error" not in reply, reply
        return reply["result"]

    async def statuses(self, hashes: list[str]) -> dict[str, dict[str, Any]]:
        return {h: await self.result("chaingate_getUserOperationStatus", h) for h in hashes}

    def stderr_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def server(
    module_devnet: tuple[AnvilProcess, Manifest], store_url: str, tmp_path: Path
) -> Iterator[Server]:
    node, manifest = module_devnet
    key = PrivateKey.generate()  # not anvil's account 0: a key of its own, funded
    rpc(node, "anvil_setBalance", key.address, hex(100 * 10**18))
    served = Server(tmp_path, node, manifest, store_url, key)
    try:
        yield served
    finally:
        served.stop()
        with contextlib.suppress(Exception):
            rpc(node, "evm_setAutomine", True)


async def send_operations(s: Server) -> dict[str, Version]:
    """N operations of N new senders (alternating v0.6 and v0.7), accepted; hash -> version."""
    sent: dict[str, Version] = {}
    factories = {
        version: await accounts.learn_factory(
            NodeCaller(s.node.url),
            s.manifest.address(f"simple_account_factory_{TAGS[version]}"),
            version,
        )
        for version in ("0.6", "0.7")
    }
    for i in range(N):
        version: Version = "0.6" if i % 2 == 0 else "0.7"
        with DevnetRpc(s.node.url) as node_rpc:
            op, digest = build_op(
                node_rpc,
                s.manifest,
                version,
                factories[version],
                PrivateKey.generate(),
                DEVNET_SIGNER,
            )
        entry_point = s.manifest.address(f"entry_point_{TAGS[version]}")
        answer = await s.result(
            "eth_sendUserOperation", encode_user_operation(op, version), entry_point
        )
        assert answer == "0x" + digest.hex()
        sent[answer] = version
    return sent


async def wait_all_included(s: Server, hashes: list[str], wait: float = 60) -> None:
    """Until every operation is included; none may have been reported failed or dropped on
    the way (each was included, so such a report was wrong, and blamed someone)."""
    seen: dict[str, set[str]] = {h: set() for h in hashes}
    statuses: dict[str, dict[str, Any]] = {}
    with trio.move_on_after(wait):
        while True:
            statuses = await s.statuses(hashes)
            for h, st in statuses.items():
                seen[h].add(st["status"])
            if all(st["status"] == "included" for st in statuses.values()):
                break
            await trio.sleep(0.1)
    assert all(st["status"] == "included" for st in statuses.values()), (
        f"not all included after {wait} s: {statuses}\n{s.stderr_tail()}"
    )
    wrong = {h: sorted(k) for h, k in seen.items() if k & {"failed", "dropped"}}
    assert not wrong, f"included operations were reported {wrong}\n{s.stderr_tail()}"


def check_once_on_chain(s: Server, sent: dict[str, Version], first_block: int) -> None:
    """One UserOperationEvent per operation, each in a successful bundle of the bundler's key;
    no bundle of the key carries an operation of another hash or reverted."""
    events: Counter[str] = Counter()
    event_txs: dict[str, str] = {}
    for version in ("0.6", "0.7"):
        logs = rpc(
            s.node,
            "eth_getLogs",
            {
                "fromBlock": hex(first_block),
                "toBlock": "latest",
                "address": s.manifest.address(f"entry_point_{TAGS[version]}"),
                "topics": [USER_OPERATION_EVENT],
            },
        )
        for entry in logs:
            events[entry["topics"][1]] += 1
            event_txs[entry["topics"][1]] = entry["transactionHash"]
    assert {h: events[h] for h in sent} == dict.fromkeys(sent, 1), events
    assert set(events) == set(sent), f"operations nobody sent here: {set(events) - set(sent)}"
    bundles = set(event_txs.values())
    head = int(rpc(s.node, "eth_blockNumber"), 16)
    ours: list[str] = []
    for number in range(first_block, head + 1):
        block = rpc(s.node, "eth_getBlockByNumber", hex(number), True)
        ours += [
            tx["hash"]
            for tx in block["transactions"]
            if tx["from"].lower() == s.key.address.lower()
        ]
    for tx in ours:
        receipt = rpc(s.node, "eth_getTransactionReceipt", tx)
        assert receipt["status"] == "0x1", receipt  # no bundle reverted (e.g. on a repeat)
    assert set(ours) == bundles, (ours, bundles)


async def test_kill_9_with_operations_in_the_mempool_loses_none_and_bundles_each_once(
    server: Server,
) -> None:
    first_block = int(rpc(server.node, "eth_blockNumber"), 16) + 1
    await server.start("manual")
    sent = await send_operations(server)
    assert len(await server.result("debug_bundler_dumpMempool")) == N
    assert all(st["status"] == "pending" for st in (await server.statuses(list(sent))).values())
    server.kill()

    await server.start("auto")
    await wait_all_included(server, list(sent))
    check_once_on_chain(server, sent, first_block)
    # Settled: nothing waits, and another bundle finds nothing to send.
    assert await server.result("debug_bundler_dumpMempool") == []
    assert await server.result("debug_bundler_sendBundleNow") == "ok"
    for h in sent:
        receipt = await server.result("eth_getUserOperationReceipt", h)
        assert receipt is not None and receipt["success"] is True, receipt


@pytest.mark.parametrize("mined", ["before_restart", "after_restart"])
async def test_kill_9_with_a_bundle_in_flight_includes_each_operation_once(
    nursery: trio.Nursery, server: Server, mined: str
) -> None:
    """The bundle transaction sits in anvil's pool (automine off) when the process dies; it is
    mined while the process is down (``before_restart``) or once it is back, still in the pool
    when it starts (``after_restart``)."""
    node = server.node
    first_block = int(rpc(node, "eth_blockNumber"), 16) + 1
    await server.start("manual")
    sent = await send_operations(server)
    rpc(node, "evm_setAutomine", False)

    async def bundle_now() -> None:
        # Answers once the bundle is mined: never, here; the kill cuts the connection.
        with contextlib.suppress(httpx.HTTPError):
            await server.call("debug_bundler_sendBundleNow", seconds=120)

    nursery.start_soon(bundle_now)
    with trio.fail_after(30):
        while True:
            statuses = await server.statuses(list(sent))
            in_flight = {h: st for h, st in statuses.items() if st["status"] == "submitted"}
            if in_flight:
                break
            await trio.sleep(0.05)
    bundle_tx = next(iter(in_flight.values()))["transactionHash"]
    assert {st["transactionHash"] for st in in_flight.values()} == {bundle_tx}
    pooled = rpc(node, "eth_getTransactionByHash", bundle_tx)
    assert pooled is not None and pooled["blockNumber"] is None  # in the pool, not mined
    server.kill()

    if mined == "before_restart":
        rpc(node, "evm_setAutomine", True)
        rpc(node, "evm_mine")
        assert rpc(node, "eth_getTransactionReceipt", bundle_tx)["status"] == "0x1"
        await server.start("auto")
    else:
        await server.start("auto")
        await trio.sleep(2)  # the restarted bundler sees its bundle still in the pool
        rpc(node, "evm_setAutomine", True)
        rpc(node, "evm_mine")
    await wait_all_included(server, list(sent))
    statuses = await server.statuses(list(sent))
    for h in in_flight:
        assert statuses[h]["transactionHash"] == bundle_tx, statuses[h]
    check_once_on_chain(server, sent, first_block)
    assert await server.result("debug_bundler_dumpMempool") == []


def pooled_hash(node: AnvilProcess, sender: str) -> str | None:
    """The hash of ``sender``'s transaction in anvil's pool (one at most here)."""
    pool = rpc(node, "txpool_content")
    for address, by_nonce in pool.get("pending", {}).items():
        if address.lower() == sender.lower():
            for tx in by_nonce.values():
                return str(tx["hash"])
    return None


@pytest.mark.parametrize(
    "timing",
    [{}, {"bundle_interval": 0.1}, {"bundle_interval": 0.1, "safe": False}],
    ids=["follower_first", "bundler_first_safe", "bundler_first_unsafe"],
)
async def test_kill_9_after_a_fee_bump_settles_on_the_copy_that_was_mined(
    nursery: trio.Nursery, server: Server, timing: dict[str, Any]
) -> None:
    """The stalled bundle is resent with higher fees (``resend_after = 1``): the copy in the
    pool, and then on chain, is not the transaction the store recorded first.  Killed then,
    mined while down, restarted: its operations are included by the copy, once, never
    reported failed on the way, and no entity is blamed.

    The ``bundler_first_*`` ids once failed: the copy's hash was never stored, so the restart
    requeued the operations and the first bundle round reported them ``failed`` before the
    follower read the block that included them.  They guard that fix."""
    node = server.node
    first_block = int(rpc(node, "eth_blockNumber"), 16) + 1
    await server.start("manual", resend_after=1.0)
    sent = await send_operations(server)
    rpc(node, "evm_setAutomine", False)

    async def bundle_now() -> None:
        with contextlib.suppress(httpx.HTTPError):
            await server.call("debug_bundler_sendBundleNow", seconds=120)

    nursery.start_soon(bundle_now)
    with trio.fail_after(30):
        while True:
            statuses = await server.statuses(list(sent))
            in_flight = {h: st for h, st in statuses.items() if st["status"] == "submitted"}
            if in_flight:
                break
            await trio.sleep(0.05)
    first_tx = next(iter(in_flight.values()))["transactionHash"]
    with trio.fail_after(30):  # the resend replaces it in the pool
        while pooled_hash(node, server.key.address) in (None, first_tx):
            await trio.sleep(0.1)
    server.kill()
    # The copy is what the pool holds once the bundler is dead: it may have resent once more
    # between the look above and the kill (a slow machine's second passes at resend_after).
    copy = pooled_hash(node, server.key.address)
    assert copy is not None and copy != first_tx
    if timing:
        # The copy is mined behind 300 empty blocks, which the restarted follower must read
        # first: the bundler's first rounds come before it learns the copy was mined.
        raw_copy = rpc(node, "eth_getRawTransactionByHash", copy)
        rpc(node, "anvil_dropTransaction", copy)
        rpc(node, "anvil_mine", hex(300))
        rpc(node, "eth_sendRawTransaction", raw_copy)
    rpc(node, "evm_setAutomine", True)
    rpc(node, "evm_mine")
    assert rpc(node, "eth_getTransactionReceipt", first_tx) is None
    assert rpc(node, "eth_getTransactionReceipt", copy)["status"] == "0x1"

    await server.start("auto", resend_after=1.0, **timing)
    await wait_all_included(server, list(sent))
    await trio.sleep(2)  # a few bundle rounds: none may bundle the copy's operations again
    statuses = await server.statuses(list(sent))
    for h in in_flight:
        assert statuses[h]["status"] == "included", statuses[h]
        assert statuses[h]["transactionHash"] == copy, statuses[h]
    check_once_on_chain(server, sent, first_block)
    assert await server.result("debug_bundler_dumpMempool") == []
    # The factory and paymaster of the in-flight operations did nothing wrong.
    reputation = await server.result("debug_bundler_dumpReputation")
    assert reputation and all(r["status"] == "ok" for r in reputation), reputation
    dropped = [
        line for line in server.stderr_tail().splitlines() if "dropped from a bundle" in line
    ]
    assert dropped == [], dropped
