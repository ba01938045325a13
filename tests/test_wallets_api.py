"""Smart wallets, gas policies and sponsorship end to end, for EntryPoint v0.6 and v0.7: a
gateway (keys on) following a devnet of this module's own, answering over HTTP.

The proof is on chain: a wallet created through the API, an operation sponsored through the
API and signed by its owner with eth-account (code we did not write), submitted by a plain
EOA with ``EntryPoint.handleOps`` — it executes, which the EntryPoint allows only with a valid
paymaster signature; the paymaster hash is recovered by eth-account too.  Then the follower:
the wallet turns ``deployed`` with that transaction, the sponsorship settles at the actual
cost, and ``anvil_reorg`` removing the block turns both back.
"""

from __future__ import annotations

import io
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from eth_account import Account
from eth_account.messages import encode_defunct

from chaingate.aa.paymaster import decode_paymaster_data, verifying_paymaster_hash
from chaingate.aa.userop import UserOperation, handle_ops_calldata, user_op_hash
from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.keeper import refresh_price_feeds
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.store import open_store
from chaingate.twins import Impl
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.provider_stub import MissingMethodsStub
from tests.test_auth import PEPPER
from tests.test_gas import network_settings, open_client

NET = "ethereum/devnet"
TAG = {"0.6": "v06", "0.7": "v07"}
GWEI = 10**9


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """A devnet of this module's own: its blocks are reorganised."""
    with AnvilProcess() as node:
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
        )
        refresh_price_feeds(node.url, manifest)
        yield node, manifest


class Api:
    def __init__(
        self, gateway: Gateway, keys: dict[str, str], node: AnvilProcess, manifest: Manifest
    ) -> None:
        self.handle = GatewayHandle(gateway, io.BytesIO())
        self.gateway = gateway
        self.keys = keys
        self.node = node
        self.manifest = manifest

    async def request(
        self, method: str, path: str, body: Any = None, *, who: str = "a", **params: Any
    ) -> httpx.Response:
        async with self.handle.client(headers={"X-API-Key": self.keys[who]}) as client:
            return await client.request(method, path, json=body, params=params or None)

    def rpc(self, method: str, *params: Any) -> Any:
        with DevnetRpc(self.node.url) as rpc:
            return rpc.call(method, *params)

    async def create_wallet(self, owner: str, version: str, salt: int = 0) -> dict[str, Any]:
        response = await self.request(
            "POST",
            "/v1/wallets/create",
            {
                "owner": owner,
                "chain": "ethereum",
                "salt": str(salt),
                "entry_point_version": version,
            },
        )
        assert response.status_code in (200, 201), response.text
        result: dict[str, Any] = response.json()
        return result

    async def policy(self, rules: dict[str, Any], who: str = "a") -> str:
        response = await self.request(
            "POST", "/v1/gas/policies", {"name": "p", "chain": "ethereum", "rules": rules}, who=who
        )
        assert response.status_code == 201, response.text
        policy_id: str = response.json()["id"]
        return policy_id

    async def follower_at_head(self) -> None:
        head = int(self.rpc("eth_blockNumber"), 16)
        follower = self.gateway.chain.followers[NET]
        with trio.fail_after(20):
            while follower.progress[0] is None or follower.progress[0] < head:
                await trio.sleep(0.02)
        # The tracker took the block from the follower; let it write.
        tracker = self.gateway.wallets.trackers[NET] if self.gateway.wallets else None
        assert tracker is not None
        await trio.sleep(0.2)


@pytest.fixture
async def api(
    nursery: trio.Nursery, impl: Impl, chain: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> Api:
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "finality_depth": 2,
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": False},
            # Above the devnet paymasters' 10 ETH: the floor's warning is logged.
            "wallets": {"deposit_floor": str(100 * 10**18), "deposit_poll_interval": 0.2},
        },
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": f"sqlite://{tmp_path}/store.db"},
        paymaster={"key": DEVNET_SIGNER.hex()},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    store = open_store(settings.store.url, tmp_path)
    keys = {}
    async with store:
        for who in ("a", "b"):
            account = await admin.ensure_account(AuthRows(store), f"{who}@wallets", "enterprise")
            keys[who], _ = await admin.create_key(
                AuthRows(store), PEPPER.encode(), account.id, who, "test", admin.parse_scopes("")
            )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    return Api(gateway, keys, node, manifest)


def factory_address(api: Api, version: str, owner: str, salt: int) -> str:
    factory = api.manifest.address(f"simple_account_factory_{TAG[version]}")
    data = abi.encode_call("getAddress(address,uint256)", owner, salt)
    raw = api.rpc("eth_call", {"to": factory, "data": "0x" + data.hex()}, "latest")
    return str(abi.decode(["address"], bytes.fromhex(raw[2:]))[0])


def execute(target: str, data: bytes = b"") -> bytes:
    return abi.encode_call("execute(address,uint256,bytes)", target, 0, data)


def operation(sender: str, call_data: bytes, **changes: Any) -> dict[str, Any]:
    op = {
        "sender": sender,
        "nonce": "0x0",
        "callData": "0x" + call_data.hex(),
        "callGasLimit": hex(200_000),
        "verificationGasLimit": hex(1_000_000),
        "preVerificationGas": hex(60_000),
        "maxFeePerGas": hex(3 * GWEI),
        "maxPriorityFeePerGas": hex(GWEI),
    }
    op.update(changes)
    return op


def from_answer(op: dict[str, Any], answer: dict[str, Any], version: str) -> UserOperation:
    """The operation as the client now holds it: its fields plus the sponsorship's."""
    factory = answer.get("factory")
    factory_data = bytes.fromhex(answer.get("factoryData", "0x")[2:])
    if version == "0.6" and answer.get("initCode"):
        code = bytes.fromhex(answer["initCode"][2:])
        factory, factory_data = checksum_address(code[:20]), code[20:]
    return UserOperation(
        sender=op["sender"],
        nonce=int(op["nonce"], 16),
        call_data=bytes.fromhex(op["callData"][2:]),
        call_gas_limit=int(op["callGasLimit"], 16),
        verification_gas_limit=int(op["verificationGasLimit"], 16),
        pre_verification_gas=int(op["preVerificationGas"], 16),
        max_fee_per_gas=int(op["maxFeePerGas"], 16),
        max_priority_fee_per_gas=int(op["maxPriorityFeePerGas"], 16),
        factory=factory,
        factory_data=factory_data,
        paymaster=answer["paymaster"],
        paymaster_verification_gas_limit=int(answer["paymasterVerificationGasLimit"], 16),
        paymaster_post_op_gas_limit=int(answer["paymasterPostOpGasLimit"], 16),
        paymaster_data=bytes.fromhex(answer["paymasterData"][2:]),
    )


def submit(api: Api, op: UserOperation, version: str) -> dict[str, Any]:
    """handleOps from a plain funded EOA; the mined receipt."""
    entry_point = api.manifest.address(f"entry_point_{TAG[version]}")
    submitter = api.manifest.accounts[0]
    data = handle_ops_calldata([op], submitter, version)  # type: ignore[arg-type]
    tx = api.rpc(
        "eth_sendTransaction",
        {"from": submitter, "to": entry_point, "data": "0x" + data.hex(), "gas": hex(3_000_000)},
    )
    deadline = time.monotonic() + 10
    while (receipt := api.rpc("eth_getTransactionReceipt", tx)) is None:
        assert time.monotonic() < deadline, f"{tx} was never mined"
        time.sleep(0.05)
    result: dict[str, Any] = receipt
    return result


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_sponsored_operation_deploys_the_wallet_and_a_reorg_undoes_it(
    api: Api, version: str
) -> None:
    owner = Account.create()
    salt = secrets.randbits(256)
    created = await api.create_wallet(owner.address.lower(), version, salt)
    address = created["address"]
    assert address == factory_address(api, version, owner.address, salt)
    assert created["status"] == "counterfactual" and created["owner"] == owner.address
    again = await api.request(
        "POST",
        "/v1/wallets/create",
        {
            "owner": owner.address,
            "chain": "ethereum",
            "salt": hex(salt),
            "entry_point_version": version,
        },
    )
    assert again.status_code == 200 and again.json()["address"] == address
    got = (await api.request("GET", f"/v1/wallets/{address}")).json()
    assert got["nonce"] == 0 and got["status"] == "counterfactual" and "deploy_tx" not in got
    assert (await api.request("GET", f"/v1/wallets/{address}", who="b")).status_code == 404

    token = api.manifest.address("erc20_cgt")
    policy = await api.policy(
        {"allowed_contracts": [token], "allowed_methods": ["approve(address,uint256)"]}
    )
    call = execute(token, abi.encode_call("approve(address,uint256)", owner.address, 5))
    op = operation(address, call)
    answer = await api.request(
        "POST", "/v1/gas/sponsor", {"chain": "ethereum", "policy_id": policy, "user_operation": op}
    )
    assert answer.status_code == 200, answer.text
    sponsored = answer.json()
    paymaster = api.manifest.address(f"verifying_paymaster_{TAG[version]}")
    assert sponsored["paymaster"] == paymaster
    assert float(sponsored["sponsored_gas_usd"]) > 0
    if version == "0.6":
        assert sponsored["paymasterAndData"] == paymaster.lower() + sponsored["paymasterData"][2:]
        assert sponsored["initCode"].startswith(
            api.manifest.address("simple_account_factory_v06").lower()
        )
    else:
        assert int(sponsored["paymasterVerificationGasLimit"], 16) > 0
        assert sponsored["factory"] == api.manifest.address("simple_account_factory_v07")

    held = from_answer(op, sponsored, version)
    # The paymaster's signature, recovered by eth-account from the contract's own hash.
    valid_until, valid_after, signature = decode_paymaster_data(held.paymaster_data)
    digest = verifying_paymaster_hash(
        held,
        paymaster=paymaster,
        chain_id=31337,
        valid_until=valid_until,
        valid_after=valid_after,
        version=version,  # type: ignore[arg-type]
    )
    on_chain = api.rpc(
        "eth_call",
        {
            "to": paymaster,
            "data": "0x" + _get_hash_call(held, version, valid_until, valid_after).hex(),
        },
        "latest",
    )
    assert bytes.fromhex(on_chain[2:]) == digest
    recovered = Account.recover_message(encode_defunct(primitive=digest), signature=signature)
    assert recovered == DEVNET_SIGNER.address
    entry_point = api.manifest.address(f"entry_point_{TAG[version]}")
    op_hash = user_op_hash(held, entry_point=entry_point, chain_id=31337, version=version)  # type: ignore[arg-type]
    assert "0x" + op_hash.hex() == sponsored["userOpHash"]

    # The owner signs; a plain EOA submits.
    owner_signature = owner.sign_message(encode_defunct(primitive=op_hash)).signature
    receipt = submit(api, held.with_(signature=bytes(owner_signature)), version)
    assert receipt["status"] == "0x1", receipt
    assert len(api.rpc("eth_getCode", address, "latest")) > 2
    await api.follower_at_head()
    deployed = (await api.request("GET", f"/v1/wallets/{address}")).json()
    assert deployed["status"] == "deployed", deployed
    assert deployed["deploy_tx"] == receipt["transactionHash"] and deployed["nonce"] == 1
    ledger = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()["spend"]
    assert ledger["settled_operations"] == 1 and ledger["reserved_operations"] == 0
    assert 0 < float(ledger["settled_usd"]) <= float(ledger["settled_estimated_usd"])
    listed = (await api.request("GET", "/v1/wallets", chain="ethereum")).json()
    assert {w["address"]: w["status"] for w in listed["wallets"]}[address] == "deployed"

    # The block is reorganised away (replaced by an empty one): both turn back.
    api.rpc("anvil_reorg", 1, [])
    await api.follower_at_head()
    reverted = (await api.request("GET", f"/v1/wallets/{address}")).json()
    assert reverted["status"] == "counterfactual" and "deploy_tx" not in reverted
    ledger = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()["spend"]
    assert ledger["settled_operations"] == 0 and ledger["reserved_operations"] == 1


def _get_hash_call(op: UserOperation, version: str, valid_until: int, valid_after: int) -> bytes:
    from chaingate.aa.userop import OP_TUPLE_TYPE, packed

    signature = f"getHash({OP_TUPLE_TYPE[version]},uint48,uint48)"  # type: ignore[index]
    return abi.encode_call(signature, packed(op, version), valid_until, valid_after)  # type: ignore[arg-type]


async def test_the_paymasters_deposits_are_a_metric_with_a_warning_below_the_floor(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    assert api.gateway.wallets is not None
    with trio.fail_after(10):
        while len(api.gateway.wallets.deposits) < 2:
            await trio.sleep(0.05)
    async with api.handle.client(headers={"Authorization": "Bearer test-admin-token"}) as c:
        metrics = (await c.get("/metrics")).text
    for version, tag in TAG.items():
        entry_point = api.manifest.address(f"entry_point_{tag}")
        paymaster = api.manifest.address(f"verifying_paymaster_{tag}")
        data = abi.encode_call("balanceOf(address)", paymaster)
        raw = api.rpc("eth_call", {"to": entry_point, "data": "0x" + data.hex()}, "latest")
        deposit = int(raw, 16)
        line = (
            'chaingate_paymaster_deposit_wei{chain="ethereum",network="devnet",'
            f'entry_point_version="{version}"}} {deposit}'
        )
        assert line in metrics, metrics
    warnings = [r for r in caplog.records if r.getMessage() == "paymaster deposit below its floor"]
    assert warnings, "no warning below the floor"
    assert DEVNET_SIGNER.hex() not in caplog.text  # the signer key is never logged


async def test_an_unused_signature_releases_its_reservation_when_it_expires(api: Api) -> None:
    assert api.gateway.wallets is not None
    now = [time.time() // 86400 * 86400 + 43200]  # noon UTC: the test never spans midnight
    api.gateway.wallets.clock = lambda: now[0]
    owner = Account.create()
    wallet = await api.create_wallet(owner.address, "0.7")
    policy = await api.policy({"max_per_user_per_day": 1})
    body = {
        "chain": "ethereum",
        "policy_id": policy,
        "user_operation": operation(wallet["address"], execute(owner.address)),
    }
    assert (await api.request("POST", "/v1/gas/sponsor", body)).status_code == 200
    assert (await api.request("POST", "/v1/gas/sponsor", body)).status_code == 429
    settings = api.gateway.settings.chains["ethereum"]["devnet"].wallets
    # Still counted through the signature's life and the follower's grace; released after.
    now[0] += settings.signature_ttl + settings.settle_grace - 1
    assert (await api.request("POST", "/v1/gas/sponsor", body)).status_code == 429
    now[0] += 2
    spend = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()["spend"]
    assert spend["released_operations"] == 1 and spend["reserved_operations"] == 0
    assert (await api.request("POST", "/v1/gas/sponsor", body)).status_code == 200


def delegate_by_type4(api: Api, owner: Any, delegate: str) -> str:
    """A type-4 transaction outside chaingate: a funded stranger sends it, carrying the
    owner's authorization (signed by eth-account) to ``delegate``; its hash once mined."""
    sender = Account.create()
    api.rpc("anvil_setBalance", sender.address, hex(10**18))
    nonce = int(api.rpc("eth_getTransactionCount", owner.address, "latest"), 16)
    auth = owner.sign_authorization({"chainId": 31337, "address": delegate, "nonce": nonce})
    block = api.rpc("eth_getBlockByNumber", "latest", False)
    signed = sender.sign_transaction(
        {
            "type": 4,
            "chainId": 31337,
            "nonce": 0,
            "to": sender.address,
            "value": 0,
            "gas": 100_000,
            "maxFeePerGas": 2 * int(block["baseFeePerGas"], 16) + GWEI,
            "maxPriorityFeePerGas": GWEI,
            "data": "0x",
            "accessList": [],
            "authorizationList": [auth],
        }
    )
    tx_hash: str = api.rpc("eth_sendRawTransaction", "0x" + bytes(signed.raw_transaction).hex())
    deadline = time.monotonic() + 10
    while (receipt := api.rpc("eth_getTransactionReceipt", tx_hash)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert receipt["status"] == "0x1", receipt
    return tx_hash


async def test_an_eip7702_wallet_follows_its_delegation_set_cleared_and_reorganised(
    api: Api,
) -> None:
    """POST /v1/wallets/create with eip7702: the owner's own address, counterfactual until a
    delegation to the devnet's Simple7702Account lands — sent outside chaingate — then
    deployed with that transaction; cleared, counterfactual again; the clearing block
    reorganised away, deployed again."""
    owner = Account.create()
    delegate = api.manifest.address("simple_7702_account_v08")
    response = await api.request(
        "POST", "/v1/wallets/create", {"owner": owner.address, "chain": "ethereum", "eip7702": True}
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["address"] == owner.address and created["account_type"] == "eip7702"
    assert created["factory"] == delegate and created["entry_point_version"] == "0.8"
    assert created["status"] == "counterfactual"
    refused = await api.request(
        "POST",
        "/v1/wallets/create",
        {
            "owner": owner.address,
            "chain": "ethereum",
            "eip7702": True,
            "entry_point_version": "0.7",
        },
    )
    assert refused.status_code == 400 and "v0.8" in refused.json()["error"]["message"]

    delegated = delegate_by_type4(api, owner, delegate)
    await api.follower_at_head()
    got = (await api.request("GET", f"/v1/wallets/{owner.address}")).json()
    assert got["status"] == "deployed" and got["deploy_tx"] == delegated, got
    assert got["nonce"] == 0  # the EntryPoint's nonce: no operation yet

    delegate_by_type4(api, owner, "0x" + "00" * 20)  # cleared
    await api.follower_at_head()
    got = (await api.request("GET", f"/v1/wallets/{owner.address}")).json()
    assert got["status"] == "counterfactual" and "deploy_tx" not in got, got

    api.rpc("anvil_reorg", 1, [])  # the clearing block is gone: the delegation is back
    await api.follower_at_head()
    got = (await api.request("GET", f"/v1/wallets/{owner.address}")).json()
    assert got["status"] == "deployed" and got["deploy_tx"] == delegated, got


class LaggingNodeStub(MissingMethodsStub):
    """anvil behind a node that lags: its first ``lag`` answers to eth_getBlockByHash are null
    (it has not the block yet) and to eth_getCode unreadable; the code's block is kept."""

    def __init__(self, target_url: str, lag: int) -> None:
        super().__init__(target_url, set())
        self.lag = lag
        self.code_blocks: list[Any] = []

    def _refusal(self, call: Any) -> dict[str, Any] | None:
        refused = super()._refusal(call)
        method = call.get("method")
        if method == "eth_getCode":
            self.code_blocks.append(call["params"][1])
        if method in ("eth_getBlockByHash", "eth_getCode") and self.asked[method] <= self.lag:
            result = None if method == "eth_getBlockByHash" else "0xnot-hex"
            return {"jsonrpc": "2.0", "id": call.get("id"), "result": result}
        return refused


async def test_a_delegation_waits_for_a_lagging_node_and_reads_the_blocks_own_code(
    nursery: trio.Nursery, api: Api
) -> None:
    """A null block (the node is behind) or unreadable code is asked again, never read as a
    block without delegations; the code is read at the block's hash (EIP-1898)."""
    stub = LaggingNodeStub(api.node.url, lag=1)
    await nursery.start(stub.serve)
    assert api.gateway.wallets is not None
    tracker = api.gateway.wallets.trackers[NET]
    tracker.client = await open_client(nursery, network_settings(stub.url))
    owner = Account.create()
    delegate = api.manifest.address("simple_7702_account_v08")
    response = await api.request(
        "POST", "/v1/wallets/create", {"owner": owner.address, "chain": "ethereum", "eip7702": True}
    )
    assert response.status_code == 201, response.text
    delegated = delegate_by_type4(api, owner, delegate)
    await api.follower_at_head()
    with trio.fail_after(20):
        while (got := (await api.request("GET", f"/v1/wallets/{owner.address}")).json())[
            "status"
        ] != "deployed":
            await trio.sleep(0.1)
    assert got["deploy_tx"] == delegated, got
    assert stub.asked["eth_getBlockByHash"] >= 2 and stub.asked["eth_getCode"] >= 2
    assert tracker.stats["node_errors"] >= 2
    assert all(isinstance(at, dict) and "blockHash" in at for at in stub.code_blocks)
