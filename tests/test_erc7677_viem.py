"""ERC-7677 through viem's own paymaster client (Node), for EntryPoint v0.6 and v0.7.

viem's ``prepareUserOperation`` asks chaingate's ``/v1/bundler/{chain}/{network}`` for
``pm_getPaymasterStubData`` then ``pm_getPaymasterData`` (context ``{policyId}``) for a
permissionless.js SimpleAccount; the account signs; a plain EOA submits ``handleOps`` and the
operation executes — so the paymaster data chaingate signed is what the contract accepts.  The
follower then sees the wallet deployed and the sponsorship settled.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import trio
from eth_account import Account

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.evm import abi
from chaingate.store import open_store
from tests.node_clients import run_script
from tests.test_auth import PEPPER
from tests.test_wallets_api import TAG, Api, api, chain  # noqa: F401 - its fixtures


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_viem_paymaster_client_gets_stub_and_final_data_and_the_operation_runs(
    api: Api, version: str, tmp_path: Path
) -> None:
    owner = Account.create()
    created = await api.create_wallet(owner.address, version, 0)
    token = api.manifest.address("erc20_cgt")
    policy = await api.policy(
        {"allowed_contracts": [token], "allowed_methods": ["approve(address,uint256)"]}
    )
    data = abi.encode_call("approve(address,uint256)", owner.address, secrets.randbelow(100))
    result = await trio.to_thread.run_sync(
        lambda: run_script(
            "erc7677_viem.mjs",
            [
                api.node.url,
                f"{api.handle.base}/v1/bundler/ethereum/devnet",
                api.keys["a"],
                policy,
                version,
                "0x" + bytes(owner.key).hex(),
                token,
                "0x" + data.hex(),
            ],
            tmp_path,
        )
    )
    assert result["status"] == "success", result
    # permissionless.js computed the same counterfactual address as chaingate.
    assert result["sender"] == created["address"]
    assert (
        result["paymaster"].lower()
        == api.manifest.address(f"verifying_paymaster_{TAG[version]}").lower()
    )
    await api.follower_at_head()
    wallet = (await api.request("GET", f"/v1/wallets/{created['address']}")).json()
    assert wallet["status"] == "deployed" and wallet["deploy_tx"] == result["transaction"]
    spend = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()["spend"]
    assert spend["settled_operations"] == 1 and spend["reserved_operations"] == 0


async def test_stub_data_refuses_what_the_policy_refuses(api: Api) -> None:
    policy = await api.policy({"allowed_contracts": [api.manifest.address("erc20_cgt")]})
    owner = Account.create()
    created = await api.create_wallet(owner.address, "0.7", 0)
    factory = api.manifest.address("simple_account_factory_v07")
    other = "0x000000000000000000000000000000000000dEaD"
    op = {
        "sender": created["address"],
        "nonce": "0x0",
        "factory": factory,
        "factoryData": "0x"
        + abi.encode_call("createAccount(address,uint256)", owner.address, 0).hex(),
        "callData": "0x" + abi.encode_call("execute(address,uint256,bytes)", other, 0, b"").hex(),
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "pm_getPaymasterStubData",
        "params": [op, api.manifest.address("entry_point_v07"), "0x7a69", {"policyId": policy}],
    }
    async with api.handle.client(headers={"X-API-Key": api.keys["a"]}) as client:
        refused = (await client.post("/v1/bundler/ethereum/devnet", json=body)).json()
        body["params"][3] = {"policyId": "gp_nope"}
        unknown = (await client.post("/v1/bundler/ethereum/devnet", json=body)).json()
        # The bundler's own method on the same endpoint checks its own parameters.
        body["method"] = "eth_sendUserOperation"
        bundler = (await client.post("/v1/bundler/ethereum/devnet", json=body)).json()
    assert refused["id"] == 7 and refused["error"]["data"]["rule"] == "allowed_contracts"
    assert "allowed_contracts" in refused["error"]["message"]
    assert unknown["error"]["code"] == -32602 and "gp_nope" in unknown["error"]["message"]
    assert bundler["error"]["code"] == -32602 and "params" in bundler["error"]["message"]


async def test_sponsorship_needs_the_same_scope_at_both_doors(api: Api, tmp_path: Path) -> None:
    """pm_* on the bundler path needs gas:manage, as REST POST /v1/gas/sponsor: a key with
    only bundler:send is refused at both (-32002 / 403 forbidden); with both it is served."""
    policy = await api.policy({})
    owner = Account.create()
    created = await api.create_wallet(owner.address, "0.7", 0)
    async with open_store(api.gateway.settings.store.url, tmp_path) as store:
        account = await admin.ensure_account(AuthRows(store), "a@wallets", "enterprise")  # key a's
        scoped = {}
        for scopes in ("bundler:send", "bundler:send gas:manage"):
            scoped[scopes], _ = await admin.create_key(
                AuthRows(store),
                PEPPER.encode(),
                account.id,
                scopes,
                "test",
                admin.parse_scopes(scopes),
            )
    assert api.gateway.keys is not None
    await api.gateway.keys.refresh()
    op = {
        "sender": created["address"],
        "nonce": "0x0",
        "factory": api.manifest.address("simple_account_factory_v07"),
        "factoryData": "0x"
        + abi.encode_call("createAccount(address,uint256)", owner.address, 0).hex(),
        "callData": "0x",
        "callGasLimit": "0x30d40",
        "verificationGasLimit": "0xf4240",
        "preVerificationGas": "0xea60",
        "maxFeePerGas": "0xb2d05e00",
        "maxPriorityFeePerGas": "0x3b9aca00",
        "paymasterVerificationGasLimit": "0x30d40",
        "paymasterPostOpGasLimit": "0xc350",
    }
    params = [op, api.manifest.address("entry_point_v07"), "0x7a69", {"policyId": policy}]
    answers: dict[str, dict[str, Any]] = {}
    for scopes, key in scoped.items():
        async with api.handle.client(headers={"X-API-Key": key}) as client:
            for method in ("pm_getPaymasterStubData", "pm_getPaymasterData"):
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                reply = await client.post("/v1/bundler/ethereum/devnet", json=body)
                assert reply.status_code == 200, reply.text
                answers[f"{scopes}/{method}"] = reply.json()
            rest = await client.post(
                "/v1/gas/sponsor",
                json={"chain": "ethereum", "policy_id": policy, "user_operation": op},
            )
            answers[f"{scopes}/rest"] = {"status": rest.status_code, "body": rest.json()}
    for method in ("pm_getPaymasterStubData", "pm_getPaymasterData"):
        refused = answers[f"bundler:send/{method}"]["error"]
        assert refused["code"] == -32002 and "gas:manage" in refused["message"], refused
        assert refused["data"]["status"] == 403 and refused["data"]["code"] == "forbidden"
        served = answers[f"bundler:send gas:manage/{method}"]
        assert "result" in served and served["result"]["paymaster"], served
    assert answers["bundler:send/rest"]["status"] == 403
    assert answers["bundler:send gas:manage/rest"]["status"] == 200, answers
    spend = (await api.request("GET", f"/v1/gas/policies/{policy}")).json()["spend"]
    assert spend["reserved_operations"] == 2  # pm_getPaymasterData and REST, once each
