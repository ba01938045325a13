"""``tests/node/bundler_permissionless.mjs`` — permissionless.js + viem's bundler actions — run
against Alto (npm, unsafe mode), the reference bundler the script is proven on, and then
against chaingate's own bundler (``test_script_through_chaingate_sponsored_by_its_paymaster``).

The script is what chaingate's own bundler tests run against ``/v1/bundler/{chain}/{network}``;
here it is shown to work against a bundler nobody here wrote: a SimpleAccount (v0.6 and
v0.7) is deployed by its first operation, which sends 1 wei; the account pays its own prefund
(funded first with anvil_setBalance at the address chaingate.aa computes).  Needs Node and npm:
without them the test is skipped loudly, except under ``CI=true``.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate import twins as impl_module
from chaingate.aa import accounts
from chaingate.aa.userop import Version
from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.keeper import refresh_price_feeds
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.store import open_store
from chaingate.twins import Impl
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.node_clients import run_script

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"
TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07", "0.8": "v08"}


@pytest.fixture(scope="module")
def devnet(module_devnet: tuple[AnvilProcess, Manifest]) -> tuple[AnvilProcess, Manifest]:
    """This module's own devnet, not the session's: its operations deploy accounts and spend
    the paymasters' deposits, which other modules check."""
    return module_devnet


@pytest.fixture(scope="module")
def alto_url(
    devnet: tuple[AnvilProcess, Manifest], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Alto in unsafe mode on the session devnet (its safe mode refuses every operation on
    anvil 1.7.1: docs/decisions/bundler.md, "ERC-7562 tracing")."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        reason = "!!! ALTO NOT RUN: Node.js/npm missing !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true)")
        pytest.skip(reason)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from benchkit import alto
    finally:
        sys.path.remove(str(ROOT / "bench"))
    try:
        alto.install(announce=False)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        reason = f"!!! ALTO NOT RUN: not installable from npm ({exc}) !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true)")
        pytest.skip(reason)
    node, manifest = devnet
    executor = PrivateKey.generate()
    rpc_call(node.url, "anvil_setBalance", [executor.address, hex(10**21)])
    server = alto.AltoServer(
        tmp_path_factory.mktemp("alto"),
        "alto-unsafe",
        node.url,
        [manifest.address("entry_point_v06"), manifest.address("entry_point_v07")],
        safe=False,
        executor=executor,
    )
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


class _Caller:
    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, params: Sequence[Any]) -> Any:
        return await trio.to_thread.run_sync(lambda: rpc_call(self.url, method, list(params)))


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_script_against_alto(
    devnet: tuple[AnvilProcess, Manifest], alto_url: str, version: Version, tmp_path: Path
) -> None:
    node, manifest = devnet
    owner = PrivateKey.generate()
    factory = await accounts.learn_factory(
        _Caller(node.url), manifest.address(f"simple_account_factory_{TAGS[version]}"), version
    )
    account = factory.account_address(owner.address, 0)  # permissionless.js's index 0
    rpc_call(node.url, "anvil_setBalance", [account, hex(10**18)])
    recipient = checksum_address(secrets.token_bytes(20))
    args = ["--bundler", alto_url, "--rpc", node.url, "--entry-point", version]
    args += ["--owner-key", owner.hex(), "--to", recipient, "--value", "1"]
    result = await trio.to_thread.run_sync(
        lambda: run_script("bundler_permissionless.mjs", args, tmp_path)
    )
    assert result["success"] is True, result
    assert result["account"] == account  # permissionless.js and chaingate.aa agree
    assert result["entryPoint"].lower() == manifest.address(f"entry_point_{TAGS[version]}").lower()
    assert int(result["actualGasUsed"]) > 0 and result["paymaster"] is None
    assert result["userOpHash"].startswith("0x") and len(result["userOpHash"]) == 66
    receipt = rpc_call(node.url, "eth_getTransactionReceipt", [result["transactionHash"]])
    assert isinstance(receipt, dict) and receipt["status"] == "0x1"
    assert rpc_call(node.url, "eth_getCode", [account, "latest"]) not in ("0x", "")
    assert rpc_call(node.url, "eth_getBalance", [recipient, "latest"]) == "0x1"


# --- the same script through chaingate's own bundler, sponsored by chaingate's paymaster ----


class Gate:
    """An in-process gateway (API keys on) with the bundler (a funded key of its own), the
    paymaster and the wallets on the session devnet; ``key`` has only the scopes it needs."""

    def __init__(self, handle: GatewayHandle, node: AnvilProcess, manifest: Manifest, key: str):
        self.handle = handle
        self.node = node
        self.manifest = manifest
        self.key = key
        self._id = 0

    async def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        async with self.handle.client(headers={"X-API-Key": self.key}) as client:
            return await client.request(method, path, json=body)

    async def bundler(self, method: str, *params: Any) -> Any:
        self._id += 1
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)}
        answer = await self.request("POST", BUNDLER_PATH, body)
        assert answer.status_code == 200, answer.text
        reply = answer.json()
        assert "error" not in reply, reply
        return reply["result"]

    async def follower_at(self, block: int) -> None:
        follower = self.handle.gateway.chain.followers["ethereum/devnet"]
        with trio.fail_after(20):
            while follower.progress[0] is None or follower.progress[0] < block:
                await trio.sleep(0.02)
        await trio.sleep(0.2)  # the wallet tracker took the block; let it write


BUNDLER_PATH = "/v1/bundler/ethereum/devnet"
PEPPER = "bundler-permissionless-pepper-" + "p" * 32


def _impl() -> Impl:
    try:
        return impl_module.compiled()
    except ImportError:
        return impl_module.pure()


@pytest.fixture(params=["safe", "unsafe"])
async def gate(
    request: pytest.FixtureRequest,
    nursery: trio.Nursery,
    devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
) -> Gate:
    node, manifest = devnet
    refresh_price_feeds(node.url, manifest)  # sponsorship prices gas in USD from the feeds
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    bundler_key = PrivateKey.generate()
    rpc_call(node.url, "anvil_setBalance", [bundler_key.address, hex(100 * 10**18)])
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": False},
            "bundler": {"safe_mode": request.param == "safe"},
        },
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": f"sqlite://{tmp_path}/store.db"},
        paymaster={"key": DEVNET_SIGNER.hex()},
        bundler={"key": bundler_key.hex()},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=_impl(), access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    async with open_store(settings.store.url, tmp_path) as store:
        account = await admin.ensure_account(
            AuthRows(store), "permissionless@bundler", "enterprise"
        )
        key, _ = await admin.create_key(
            AuthRows(store),
            PEPPER.encode(),
            account.id,
            "permissionless",
            "test",
            admin.parse_scopes("bundler:send wallets:manage gas:manage"),
        )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    return Gate(GatewayHandle(gateway, io.BytesIO()), node, manifest, key)


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_script_through_chaingate_sponsored_by_its_paymaster(
    gate: Gate, version: Version, tmp_path: Path
) -> None:
    """The wallet created over REST for the owner; a gas policy over REST; permissionless.js
    (viem's paymaster client asks pm_getPaymasterStubData/pm_getPaymasterData with context
    {policyId}, then eth_estimateUserOperationGas, eth_sendUserOperation and
    eth_getUserOperationReceipt) with a key scoped to what it needs; safe and unsafe mode.
    The account is never funded: only the paymaster pays."""
    node, manifest = gate.node, gate.manifest
    owner = PrivateKey.generate()
    created = await gate.request(
        "POST",
        "/v1/wallets/create",
        {"owner": owner.address, "chain": "ethereum", "salt": "0", "entry_point_version": version},
    )
    assert created.status_code in (200, 201), created.text
    account = created.json()["address"]
    assert created.json()["status"] == "counterfactual"
    policy = await gate.request(
        "POST", "/v1/gas/policies", {"name": "permissionless", "chain": "ethereum", "rules": {}}
    )
    assert policy.status_code == 201, policy.text
    policy_id = policy.json()["id"]
    # Nothing funds the account: the paymaster pays, or nothing runs.
    assert rpc_call(node.url, "eth_getBalance", [account, "latest"]) == "0x0"
    recipient = checksum_address(secrets.token_bytes(20))
    args = ["--bundler", f"{gate.handle.base}{BUNDLER_PATH}", "--rpc", node.url]
    args += ["--entry-point", version, "--owner-key", owner.hex(), "--to", recipient]
    args += ["--value", "0", "--policy", policy_id, "--api-key", gate.key]
    result = await trio.to_thread.run_sync(
        lambda: run_script("bundler_permissionless.mjs", args, tmp_path)
    )
    assert result["success"] is True, result
    assert result["account"] == account  # permissionless.js, chaingate.aa and the API agree
    paymaster = manifest.address(f"verifying_paymaster_{TAGS[version]}")
    assert result["paymaster"] is not None and result["paymaster"].lower() == paymaster.lower()
    assert result["entryPoint"].lower() == manifest.address(f"entry_point_{TAGS[version]}").lower()
    receipt = rpc_call(node.url, "eth_getTransactionReceipt", [result["transactionHash"]])
    assert isinstance(receipt, dict) and receipt["status"] == "0x1"
    assert rpc_call(node.url, "eth_getCode", [account, "latest"]) not in ("0x", "")

    status = await gate.bundler("chaingate_getUserOperationStatus", result["userOpHash"])
    assert status["status"] == "included", status
    assert status["transactionHash"] == result["transactionHash"]
    assert int(status["blockNumber"], 16) == int(result["blockNumber"])
    by_rpc = await gate.bundler("eth_getUserOperationReceipt", result["userOpHash"])
    assert by_rpc["success"] is True and by_rpc["sender"] == account
    assert await gate.bundler("chaingate_getPendingUserOperations", account) == []

    await gate.follower_at(int(result["blockNumber"]))
    wallet = await gate.request("GET", f"/v1/wallets/{account}")
    assert wallet.status_code == 200, wallet.text
    body = wallet.json()
    assert body["status"] == "deployed", body
    assert body["deploy_tx"] == result["transactionHash"]
    spend = (await gate.request("GET", f"/v1/gas/policies/{policy_id}")).json()["spend"]
    assert spend["settled_operations"] == 1 and spend["reserved_operations"] == 0, spend


async def test_an_eip7702_account_through_chaingate_sponsored_by_its_paymaster(
    gate: Gate, tmp_path: Path
) -> None:
    """permissionless.js's to7702SimpleSmartAccount on EntryPoint v0.8: the owner's own EOA,
    never funded, delegated to the Simple7702Account by the EIP-7702 authorization viem signs
    and sends beside its first operation (eip7702Auth), sponsored by a policy through the
    ERC-7677 methods; chaingate bundles it in a type-4 transaction and the receipt reads
    back; safe and unsafe mode."""
    node, manifest = gate.node, gate.manifest
    owner = PrivateKey.generate()
    policy = await gate.request(
        "POST", "/v1/gas/policies", {"name": "eip7702", "chain": "ethereum", "rules": {}}
    )
    assert policy.status_code == 201, policy.text
    policy_id = policy.json()["id"]
    assert rpc_call(node.url, "eth_getBalance", [owner.address, "latest"]) == "0x0"
    recipient = checksum_address(secrets.token_bytes(20))
    args = ["--bundler", f"{gate.handle.base}{BUNDLER_PATH}", "--rpc", node.url]
    args += ["--entry-point", "0.8", "--eip7702", "--owner-key", owner.hex(), "--to", recipient]
    args += ["--value", "0", "--policy", policy_id, "--api-key", gate.key]
    result = await trio.to_thread.run_sync(
        lambda: run_script("bundler_permissionless.mjs", args, tmp_path)
    )
    assert result["success"] is True, result
    assert result["account"] == owner.address
    assert result["paymaster"].lower() == manifest.address("verifying_paymaster_v08").lower()
    tx = rpc_call(node.url, "eth_getTransactionByHash", [result["transactionHash"]])
    assert isinstance(tx, dict) and tx["type"] == "0x4", tx
    code = rpc_call(node.url, "eth_getCode", [owner.address, "latest"])
    delegate = manifest.address("simple_7702_account_v08")
    assert code == "0xef0100" + delegate[2:].lower()
    by_rpc = await gate.bundler("eth_getUserOperationReceipt", result["userOpHash"])
    assert by_rpc["success"] is True and by_rpc["sender"] == owner.address
    await gate.follower_at(int(result["blockNumber"]))
    spend = (await gate.request("GET", f"/v1/gas/policies/{policy_id}")).json()["spend"]
    assert spend["settled_operations"] == 1 and spend["reserved_operations"] == 0, spend
