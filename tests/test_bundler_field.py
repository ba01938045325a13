"""The bundler as the field's compliance suite and tools check it (issues 20 and 25), end to
end: a real gateway whose node is a real anvil behind a relay that records every request
(tests/http_relay.py forwards them byte for byte), the real EntryPoints v0.6 and v0.7, and the
rule-breaking entities of tests/bundler_contracts/RuleBreakers.sol.

* reputation and mempool rules: EREP-010 (a paymaster's deposit covers all its pending
  operations), EREP-015 (a paymaster is not charged for an account's failure), EREP-020 (a
  staked factory answers for the accounts it deploys), STO-041 (an operation reading another
  bundled sender's storage waits for a later bundle, still pending);
* refusals that need no simulation (the fifth operation of an unstaked sender, a duplicate, a
  banned entity, a fee below the floor) make no node call at all;
* answers tools parse: the reference bundler's messages, ``debug_bundler_sendBundleNow`` never
  null, ``debug_bundler_getStakeStatus`` in decimal, a receipt's ``reason`` a string, "Missing/
  invalid userOpHash";
* a batch of operations validates concurrently; a body nested 1,000 deep or with invalid UTF-8
  answers -32700 (both framing twins).
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler import rules
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.bundler.sanity import required_prefund
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.addresses import create2_address
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.twins import Impl
from tests.conftest import make_settings
from tests.helpers import GatewayHandle
from tests.http_relay import HttpRelay
from tests.test_bundler_e2e import PATH, Bundler, self_paid_op, send
from tests.test_bundler_rules import (
    CONTEXT,
    FACTORY_OK,
    FAILING,
    OK,
    OWN_STORAGE,
    TIMESTAMP,
    World,
    world,
)
from tests.test_upstream_faults import Records

__all__ = ["world"]  # the fixture, imported from test_bundler_rules

Devnet = tuple[AnvilProcess, Manifest]
GWEI = 10**9
MIN_PRIORITY_FEE = GWEI // 10


@pytest.fixture(scope="module")
def devnet(module_devnet: Devnet) -> Devnet:
    """This module's own devnet: its operations stake, ban and drain entities."""
    return module_devnet


class Field(Bundler):
    """The gateway's bundler, its node behind a relay that keeps every request body."""

    def __init__(
        self, handle: GatewayHandle, node: AnvilProcess, manifest: Manifest, seen: list[bytes]
    ) -> None:
        super().__init__(handle, node, manifest)
        self.seen = seen

    def node_calls_naming(self, address: str) -> int:
        """Requests the gateway sent the node that name ``address`` (any case, in params or
        ABI-encoded calldata): what admitting an operation of that sender costs the node."""
        needle = address.lower()[2:].encode()
        return sum(needle in body.lower() for body in self.seen)

    async def send(self, op: UserOperation, version: Version) -> dict[str, Any]:
        return await send(self, op, version)


async def start_field(
    nursery: trio.Nursery,
    impl: Impl,
    devnet: Devnet,
    tmp_path: Path,
    *,
    delay: float = 0.0,
) -> Field:
    node, manifest = devnet
    seen: list[bytes] = []

    def record(body: bytes) -> float:
        seen.append(body)
        return delay if b"debug_traceCall" in body else 0.0

    relay = HttpRelay(node.port, delay=record)
    port = await nursery.start(relay.serve)
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    key = PrivateKey.generate()
    with DevnetRpc(node.url) as rpc:
        rpc.call("anvil_setBalance", key.address, hex(100 * 10**18))
    settings = make_settings(
        # One request per connection at a time: the relay answers a connection's requests in
        # order, so a held trace must not hold the others behind it.
        [
            {
                "url": f"http://127.0.0.1:{port}",
                "name": "anvil",
                "pipeline_depth": 1,
                "max_connections": 32,
            }
        ],
        network={
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": False},
            "bundler": {"safe_mode": True, "min_priority_fee": MIN_PRIORITY_FEE},
        },
        store={"url": f"sqlite://{tmp_path}/store.db"},
        bundler={"key": key.hex(), "debug": True},
        data_dir=str(tmp_path),
    )
    logs = io.BytesIO()
    gateway = Gateway(settings, impl=impl, access_stream=logs, outbound_policy=OutboundPolicy.dev())
    await nursery.start(gateway.run)
    field = Field(GatewayHandle(gateway, logs), node, manifest, seen)
    assert await field.result("debug_bundler_setBundlingMode", "manual") == "ok"
    return field


@pytest.fixture
async def field(nursery: trio.Nursery, devnet: Devnet, tmp_path: Path) -> Field:
    """The bundler logic is the same on both framing twins: the compiled one runs it here
    (``test_bodies_that_cannot_be_decoded_answer_parse_errors`` takes both)."""
    from chaingate import twins as impl_module

    return await start_field(nursery, impl_module.compiled(), devnet, tmp_path)


def rule_op(world: World, version: Version, **kwargs: Any) -> UserOperation:
    """A RuleBreakers operation priced for the gateway's sanity checks."""
    op = world.op(version, **kwargs)
    return op.with_(pre_verification_gas=150_000, max_fee_per_gas=20 * GWEI)


def fresh_account(world: World) -> str:
    """A RuleAccount of its own, funded for its prefunds."""
    account = world.deploy("RuleAccount", abi.encode(["address"], [world.store]))
    world.rpc.call("anvil_setBalance", account, hex(10**18))
    return account


async def reputation_of(field: Field, address: str, entry_point: str) -> tuple[int, int]:
    dumped = await field.result("debug_bundler_dumpReputation", entry_point)
    for row in dumped:
        if row["address"].lower() == address.lower():
            return int(row["opsSeen"], 16), int(row["opsIncluded"], 16)
    return 0, 0


# --- refusals before any node call (issue 25, item 5) ------------------------------------------


async def test_refusals_that_need_no_simulation_make_no_node_call(field: Field) -> None:
    owner = PrivateKey.generate()
    deploy = await field.send(await self_paid_op(field, "0.6", owner, 1), "0.6")
    assert "result" in deploy, deploy
    assert (await field.result("debug_bundler_sendBundleNow"))["status"] == "0x1"
    await field.receipt(deploy["result"])
    ops = [await self_paid_op(field, "0.6", owner, 1, key=k, deployed=True) for k in range(1, 6)]
    sender = ops[0].sender
    for op in ops[:4]:
        assert "result" in await field.send(op, "0.6")
    before = field.node_calls_naming(sender)
    assert before > 0  # admitting the four asked the node (code, nonce, traces)

    fifth = await field.send(ops[4], "0.6")
    assert fifth["error"]["code"] == -32505 and "unstaked" in fifth["error"]["message"], fifth
    again = await field.send(ops[0], "0.6")
    assert again["error"]["code"] == -32602 and "already known" in again["error"]["message"]
    assert field.node_calls_naming(sender) == before

    # A fee below the floor, and a banned paymaster: refused before the node is asked
    # anything about the operation.
    other = await self_paid_op(field, "0.6", PrivateKey.generate(), 2)
    cheap = other.with_(max_priority_fee_per_gas=MIN_PRIORITY_FEE - 1)
    floor = await field.send(cheap, "0.6")
    assert floor["error"]["code"] == -32602 and "floor" in floor["error"]["message"], floor
    paymaster = field.manifest.address("verifying_paymaster_v06")
    entry_point = field.manifest.address("entry_point_v06")
    await field.result(
        "debug_bundler_setReputation",
        [{"address": paymaster, "opsSeen": hex(100_000), "opsIncluded": "0x0"}],
        entry_point,
    )
    sponsored = other.with_(paymaster=paymaster, paymaster_data=b"\x01" * 97)
    banned = await field.send(sponsored, "0.6")
    assert banned["error"]["code"] == -32504 and "banned" in banned["error"]["message"], banned
    assert field.node_calls_naming(other.sender) == 0


# --- reputation and mempool rules (issue 20, item 3) --------------------------------------------


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_paymaster_deposit_must_cover_all_its_pending_operations(
    field: Field, world: World, version: Version
) -> None:
    """EREP-010: with a deposit one wei short of three operations' worst cost, two are
    accepted and the third refused -32508 ("too low"); a replacement frees its share."""
    paymaster = world.deploy("RulePaymaster", abi.encode(["address"], [world.store]))
    entry_point = world.entry_points[version]
    ops = [
        rule_op(world, version, paymaster=paymaster).with_(nonce=key << 64) for key in range(1, 4)
    ]
    cost = required_prefund(ops[0], version)
    world.send(entry_point, abi.encode_call("depositTo(address)", paymaster), value=3 * cost - 1)
    for op in ops[:2]:
        reply = await field.send(op, version)
        assert "result" in reply, reply
    third = await field.send(ops[2], version)
    assert third["error"]["code"] == -32508, third
    assert "too low" in third["error"]["message"] and "EREP-010" in third["error"]["message"]
    # A replacement (same sender and nonce, +10% on both fees) frees its share: the deposit
    # covers the first operation and the replacement, not the three.
    bumped = ops[1].with_(
        max_fee_per_gas=ops[1].max_fee_per_gas * 11 // 10,
        max_priority_fee_per_gas=ops[1].max_priority_fee_per_gas * 11 // 10,
    )
    assert (
        cost + required_prefund(bumped, version)
        < 3 * cost - 1
        < 2 * cost + required_prefund(bumped, version)
    )
    replaced = await field.send(bumped, version)
    assert "result" in replaced, replaced
    await field.result("debug_bundler_clearState")


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_paymaster_is_not_charged_for_an_account_failing_at_bundle_time(
    field: Field, world: World, version: Version
) -> None:
    """EREP-015: accepted, the staked paymaster's opsSeen goes up by one; the account then
    fails its second validation (handleOps) and the paymaster's counters are as before."""
    entry_point = world.entry_points[version]
    account = fresh_account(world)
    paymaster = world.staked_paymaster
    await field.result(
        "debug_bundler_setReputation",
        [{"address": paymaster, "opsSeen": 5, "opsIncluded": 2}],
        entry_point,
    )
    op = rule_op(world, version, mode=FAILING, paymaster=paymaster).with_(sender=account)
    sent = await field.send(op, version)
    assert "result" in sent, sent
    assert await reputation_of(field, paymaster, entry_point) == (6, 2)
    world.send(account, abi.encode_call("setFailing(bool)", True))
    assert await field.result("debug_bundler_sendBundleNow") == "ok"  # nothing left to bundle
    status = await field.result("chaingate_getUserOperationStatus", sent["result"])
    assert status["status"] == "failed" and status["reason"].startswith("AA23"), status
    assert await reputation_of(field, paymaster, entry_point) == (5, 2)


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_staked_factory_answers_for_the_account_it_deploys(
    field: Field, world: World, version: Version
) -> None:
    """EREP-020: the deployed account fails at bundle time (its prefund gone): the staked
    factory is blamed (banned), not the unstaked account."""
    entry_point = world.entry_points[version]
    factory = world.deploy("RuleFactory", abi.encode(["address"], [world.store]))
    world.send(
        factory,
        abi.encode_call("stake(address,uint32)", entry_point, rules.MIN_UNSTAKE_DELAY),
        value=rules.MIN_STAKE,
    )
    salt = secrets.token_bytes(32)
    sender = create2_address(factory, salt, world.account_init)
    world.rpc.call("anvil_setBalance", sender, hex(10**18))
    op = rule_op(world, version).with_(
        sender=sender,
        factory=factory,
        factory_data=abi.encode_call("deploy(bytes32,uint256)", salt, FACTORY_OK),
    )
    sent = await field.send(op, version)
    assert "result" in sent, sent
    world.rpc.call("anvil_setBalance", sender, "0x0")  # AA21 at bundle time: the account's
    assert await field.result("debug_bundler_sendBundleNow") == "ok"
    status = await field.result("chaingate_getUserOperationStatus", sent["result"])
    assert status["status"] == "failed" and status["reason"].startswith("AA21"), status
    seen, _ = await reputation_of(field, factory, entry_point)
    assert seen >= 10_000
    dumped = await field.result("debug_bundler_dumpReputation", entry_point)
    assert [r["status"] for r in dumped if r["address"].lower() == factory.lower()] == ["banned"]


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_staked_factory_is_charged_when_its_account_reverts_in_the_bundle(
    field: Field, world: World, version: Version
) -> None:
    """EREP-020, the compliance suite's case: two operations deploying accounts of one staked
    factory, each declaring 5M of verification gas; each validates alone, but in one bundle
    the second account's validation reverts (AA23, "failing").  Both fit one bundle (it
    counts the gas validation used, not the limits), the second is dropped and the factory's
    opsSeen raised to a ban; the first is included."""
    entry_point = world.entry_points[version]
    factory = world.deploy("RuleCountingFactory", abi.encode(["address"], [world.store]))
    world.send(
        factory,
        abi.encode_call("stake(address,uint32)", entry_point, rules.MIN_UNSTAKE_DELAY),
        value=rules.MIN_STAKE,
    )
    seen_before, _ = await reputation_of(field, factory, entry_point)
    sent = []
    for _ in range(2):
        salt = secrets.token_bytes(32)
        sender = create2_address(factory, salt, world.account_init)
        world.rpc.call("anvil_setBalance", sender, hex(10**18))
        op = rule_op(world, version, mode=FAILING).with_(
            sender=sender,
            factory=factory,
            factory_data=abi.encode_call("deploy(bytes32)", salt),
            verification_gas_limit=5_000_000,
        )
        reply = await field.send(op, version)
        assert "result" in reply, reply
        sent.append(reply["result"])
    bundle = await field.result("debug_bundler_sendBundleNow")
    assert len(bundle["userOpHashes"]) == 1 and bundle["status"] == "0x1", bundle
    failed = next(h for h in sent if h not in bundle["userOpHashes"])
    status = await field.result("chaingate_getUserOperationStatus", failed)
    assert status["status"] == "failed" and status["reason"].startswith("AA23"), status
    seen, _ = await reputation_of(field, factory, entry_point)
    assert seen >= seen_before + 10_000
    assert (await field.receipt(bundle["userOpHashes"][0]))["success"] is True


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_an_operation_reading_another_bundled_senders_storage_waits(
    field: Field, world: World, version: Version
) -> None:
    """STO-041: B's validation reads A's storage; A's validation (first in the bundle) would
    change it.  The bundle takes A alone; B stays pending in the mempool."""
    token = world.deploy("RuleTokenAccount", b"")
    other = world.deploy("RuleTokenAccount", b"")
    for account in (token, other):
        world.rpc.call("anvil_setBalance", account, hex(10**18))
    world.send(token, abi.encode_call("setBalance(address,uint256)", other, 1))
    world.send(other, abi.encode_call("setOther(address)", token))
    base = rule_op(world, version)
    first = base.with_(sender=token, call_data=bytes.fromhex(other[2:]), signature=b"")
    second = base.with_(sender=other, call_data=b"", signature=b"")
    sent = [await field.send(op, version) for op in (first, second)]
    assert all("result" in s for s in sent), sent
    bundle = await field.result("debug_bundler_sendBundleNow")
    assert bundle["userOpHashes"] == [sent[0]["result"]], bundle
    assert (await field.receipt(sent[0]["result"]))["success"] is True
    waiting = await field.result("chaingate_getUserOperationStatus", sent[1]["result"])
    assert waiting["status"] == "pending", waiting
    mempool = await field.result("debug_bundler_dumpMempool", world.entry_points[version])
    assert [m["sender"].lower() for m in mempool] == [other.lower()]
    assert await field.result("eth_getUserOperationReceipt", sent[1]["result"]) is None
    await field.result("debug_bundler_clearState")


# --- what tools parse (issue 20, items 1, 2, 4 and 5) ------------------------------------------


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_refusals_read_as_the_reference_bundlers(
    field: Field, world: World, version: Version
) -> None:
    account = fresh_account(world)
    banned = await field.send(
        rule_op(world, version, mode=TIMESTAMP).with_(sender=account), version
    )
    error = banned["error"]
    assert error["code"] == -32502, error
    assert error["message"].startswith("account uses banned opcode: TIMESTAMP [OP-011]"), error
    assert error["data"] == {"account": account.lower(), "rule": "OP-011"}
    # A storage rule broken by an unstaked entity: -32502 (the reference's code), not -32505.
    op = rule_op(world, version, paymaster=world.paymaster, paymaster_mode=OWN_STORAGE)
    storage = await field.send(op.with_(sender=fresh_account(world)), version)
    assert storage["error"]["code"] == -32502, storage
    assert storage["error"]["message"].startswith("unstaked paymaster accessed paymaster slot")
    # EREP-050 as the suite's regression case: an unstaked paymaster's context is accepted.
    op = rule_op(world, version, paymaster=world.paymaster, paymaster_mode=CONTEXT)
    assert "result" in await field.send(op.with_(sender=fresh_account(world)), version)
    await field.result("debug_bundler_clearState")


async def test_debug_and_lookup_answers_as_tools_parse_them(field: Field, world: World) -> None:
    entry_point = world.entry_points["0.7"]
    assert await field.result("debug_bundler_sendBundleNow") == "ok"  # nothing waits
    unstaked = await field.result("debug_bundler_getStakeStatus", world.paymaster, entry_point)
    assert unstaked["stakeInfo"] == {"addr": world.paymaster, "stake": "0", "unstakeDelaySec": "0"}
    assert unstaked["isStaked"] is False
    staked = await field.result("debug_bundler_getStakeStatus", world.staked_paymaster, entry_point)
    assert staked["stakeInfo"]["stake"] == str(rules.MIN_STAKE)
    assert staked["stakeInfo"]["unstakeDelaySec"] == str(rules.MIN_UNSTAKE_DELAY)
    assert staked["isStaked"] is True
    for method in ("eth_getUserOperationByHash", "eth_getUserOperationReceipt"):
        for params in ([""], [], ["0x1234"]):
            reply = await field.call(method, *params)
            assert reply["error"]["code"] == -32602, reply
            assert "Missing/invalid userOpHash" in reply["error"]["message"], reply
    # A successful operation's receipt: reason is a string (bytes, empty), never null.
    op = rule_op(world, "0.7", mode=OK).with_(sender=fresh_account(world))
    sent = await field.send(op, "0.7")
    assert "result" in sent, sent
    bundle = await field.result("debug_bundler_sendBundleNow")
    assert bundle["userOpHashes"] == [sent["result"]] and bundle["transactionHash"]
    receipt = await field.receipt(sent["result"])
    assert receipt["success"] is True and receipt["reason"] == "0x", receipt


# --- batches and undecodable bodies (issue 25, items 6 and 1) ----------------------------------


async def test_a_batch_of_operations_validates_concurrently(
    nursery: trio.Nursery, devnet: Devnet, world: World, tmp_path: Path
) -> None:
    """Every debug_traceCall held 0.3 s by the relay: eight operations validated one after
    another would take at least 2.4 s; a batch takes about one validation's time."""
    from chaingate import twins as impl_module

    field = await start_field(nursery, impl_module.compiled(), devnet, tmp_path, delay=0.3)
    accounts = [fresh_account(world) for _ in range(2)]
    ops = [
        rule_op(world, "0.7").with_(sender=account, nonce=key << 64)
        for account in accounts
        for key in range(1, 5)
    ]
    entry_point = world.entry_points["0.7"]
    batch = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "eth_sendUserOperation",
            "params": [encode_user_operation(op, "0.7"), entry_point],
        }
        for i, op in enumerate(ops)
    ]
    started = time.monotonic()
    async with field.handle.client() as client:
        answer = await client.post(PATH, json=batch)
    elapsed = time.monotonic() - started
    replies = answer.json()
    assert [r["id"] for r in replies] == list(range(len(ops)))
    assert all("result" in r for r in replies), replies
    assert elapsed < 2.0, elapsed
    await field.result("debug_bundler_clearState")


async def test_bodies_that_cannot_be_decoded_answer_parse_errors(
    nursery: trio.Nursery, impl: Impl, devnet: Devnet, tmp_path: Path
) -> None:
    """Nested 1,000 deep, invalid or overlong UTF-8: JSON-RPC -32700 (never a 500, never a
    traceback in the log), every one in the access log."""
    errors = Records()
    logging.getLogger("chaingate").addHandler(errors)
    field = await start_field(nursery, impl, devnet, tmp_path)
    bodies = [
        b"[" * 1000 + b"]" * 1000,
        b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[' * 500 + b"]}" * 500,
        b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":["\xff\xfe"]}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xc0\xaf","params":[]}',
    ]
    async with field.handle.client() as client:
        for body in bodies:
            answer = await client.post(
                PATH, content=body, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 200, (body[:40], answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == -32700, answer.text
    logging.getLogger("chaingate").removeHandler(errors)
    assert [r.getMessage() for r in errors.records if r.levelno >= logging.ERROR] == []
    access = [line for line in field.handle.log_lines() if line.get("path") == PATH]
    assert len([a for a in access if a.get("status") == 200]) >= len(bodies), access


# --- a minimal config starts (issue 20, item 9) ---------------------------------------------


def minimal_config(tmp_path: Path, port: int, *upstreams: str) -> Path:
    """One EVM network, no chain_id, no manifest: the bundler is on by default."""
    config = tmp_path / "chaingate.toml"
    lines = [f'data_dir = "{tmp_path}"', "[server]", f"port = {port}", "[auth]", "enabled = false"]
    lines += ["[chains.ethereum.devnet]", "testnet = true"]
    for i, url in enumerate(upstreams):
        lines += ["[[chains.ethereum.devnet.upstreams]]", f'url = "{url}"', f'name = "node{i}"']
    config.write_text("\n".join(lines) + "\n")
    return config


def test_serve_without_chain_id_takes_the_upstreams_and_refuses_a_disagreement(
    tmp_path: Path, anvil: AnvilProcess, anvil_factory: Any
) -> None:
    port = free_port()
    config = minimal_config(tmp_path, port, anvil.url)
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "chaingate", "serve", "--config", str(config)]
    env = {**os.environ, "CHAINGATE_AUTH__PEPPER": "p" * 40}
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        answer = None
        while answer is None:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                answer = httpx.post(
                    f"http://127.0.0.1:{port}{PATH}",
                    json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                    timeout=2,
                ).json()
            except httpx.HTTPError:
                time.sleep(0.1)
        assert answer["result"] == hex(anvil.chain_id), answer
    finally:
        process.terminate()
        process.wait(timeout=15)
    text = log.read_text()
    assert "needs chain_id" not in text and "Traceback" not in text, text
    assert text.count("chain id comes from the upstreams") == 1, text

    # Two upstreams on different chains: refused at start, naming both.
    other = anvil_factory(chain_id=1)
    minimal_config(tmp_path, free_port(), anvil.url, other.url)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "error: chains.ethereum.devnet: the upstreams are on different chains" in said, said
    assert "node0: 31337" in said and "node1: 1" in said and "Traceback" not in said, said
