"""A UserOperation's asset changes, simulated as the EntryPoint runs it, against the truth.

For EntryPoint v0.6, v0.7 and v0.8: a new SimpleAccount (deployed by the operation) moves tokens and
native currency; the operation is simulated through chaingate — on ``/v1/bundler`` and on
``/v1/rpc`` under Alchemy's name, the same answer — then sent to chaingate's bundler for real,
and the holders' balances read before and after must have moved exactly as simulated
(tests/simulation_oracle.py).  Sponsored by the devnet's VerifyingPaymaster it costs its sender
nothing; paying for itself, the sender's prefund to the EntryPoint is one of its changes.  An
operation whose call reverts, and one not yet signed, are simulated too.  Both framing twins,
both stores.
"""

from __future__ import annotations

import io
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.aa import accounts, paymaster
from chaingate.aa.userop import UserOperation, Version, user_op_hash
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.twins import Impl
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.simulation_oracle import Balance, Chain, balance_deltas
from tests.test_aa_devnet import TAGS, NodeCaller

CHAIN_ID = 31337
ETHER = 10**18
BUNDLER = "/v1/bundler/ethereum/devnet"


class Setup:
    def __init__(self, handle: GatewayHandle, node: AnvilProcess, manifest: Manifest) -> None:
        self.handle = handle
        self.chain = Chain(node.url)
        self.node = node
        self.manifest = manifest
        self.token = manifest.address("erc20_cgt").lower()

    async def post(self, path: str, method: str, params: list[Any]) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        async with self.handle.client() as client:
            answer = await client.post(path, json=body)
        assert answer.status_code == 200, answer.text
        reply: dict[str, Any] = answer.json()
        return reply

    async def result(self, path: str, method: str, params: list[Any]) -> Any:
        reply = await self.post(path, method, params)
        assert "result" in reply, reply
        return reply["result"]


@pytest.fixture
async def setup(
    nursery: trio.Nursery,
    impl: Impl,
    store_url: str,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
) -> Setup:
    node, manifest = module_devnet
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    key = PrivateKey.generate()
    Chain(node.url).rpc.call("anvil_setBalance", key.address, hex(100 * ETHER))
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": True},
            "bundler": {"safe_mode": False},
        },
        store={"url": store_url},
        bundler={"key": key.hex()},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    # Token facts known before the first simulation: its answers are then the same each time.
    assert gateway.data is not None
    await gateway.data.metadata["ethereum/devnet"].tokens([manifest.address("erc20_cgt")], wait=30)
    return Setup(GatewayHandle(gateway, io.BytesIO()), node, manifest)


async def operation(
    s: Setup, version: Version, *, sponsored: bool, reverts: bool = False, signed: bool = True
) -> tuple[UserOperation, str, str, str]:
    """(the operation, its sender, the token's and the native currency's recipients): a new
    account holding 100 CGT and 1 ETH sends 5 CGT and (v0.7, v0.8) 0.25 ETH."""
    tag = TAGS[version]
    factory = await accounts.learn_factory(
        NodeCaller(s.node.url), s.manifest.address(f"simple_account_factory_{tag}"), version
    )
    owner = PrivateKey.generate()
    salt = secrets.randbits(64)
    sender = factory.account_address(owner.address, salt)
    s.chain.rpc.call("anvil_setBalance", sender, hex(ETHER))
    mint = abi.encode_call("mint(address,uint256)", sender, 100 * ETHER)
    s.chain.send({"from": s.manifest.deployer, "to": s.token, "data": "0x" + mint.hex()})
    to_token, to_native = "0x" + secrets.token_hex(20), "0x" + secrets.token_hex(20)
    amount = 500 * ETHER if reverts else 5 * ETHER  # more than it holds: the call reverts
    transfer = abi.encode_call("transfer(address,uint256)", to_token, amount)
    packed = version != "0.6"  # v0.7 and v0.8 take the same operation form
    if not packed:
        call_data = abi.encode_call("execute(address,uint256,bytes)", s.token, 0, transfer)
    elif version == "0.7":
        call_data = abi.encode_call(
            "executeBatch(address[],uint256[],bytes[])",
            [s.token, to_native],
            [0, ETHER // 4],
            [transfer, b""],
        )
    else:  # v0.8's SimpleAccount takes BaseAccount's Call[]
        calls = [(s.token, 0, transfer), (to_native, ETHER // 4, b"")]
        call_data = abi.encode_call("executeBatch((address,uint256,bytes)[])", calls)
    block = s.chain.rpc.call("eth_getBlockByNumber", "latest", False)
    priority = 10**9
    op = UserOperation(
        sender=sender,
        nonce=0,
        call_data=call_data,
        call_gas_limit=300_000,
        verification_gas_limit=1_000_000,
        pre_verification_gas=60_000,
        max_fee_per_gas=2 * int(block["baseFeePerGas"], 16) + priority,
        max_priority_fee_per_gas=priority,
        factory=factory.address,
        factory_data=factory.factory_data(owner.address, salt),
        paymaster_verification_gas_limit=200_000 if sponsored and packed else 0,
        paymaster_post_op_gas_limit=50_000 if sponsored and packed else 0,
    )
    if sponsored:
        op = paymaster.sponsor(
            op,
            DEVNET_SIGNER,
            paymaster=s.manifest.address(f"verifying_paymaster_{tag}"),
            chain_id=CHAIN_ID,
            valid_until=max(int(block["timestamp"], 16), int(time.time())) + 3600,
            valid_after=0,
            version=version,
        )
    entry_point = s.manifest.address(f"entry_point_{tag}")
    digest = user_op_hash(op, entry_point=entry_point, chain_id=CHAIN_ID, version=version)
    who = owner if signed else PrivateKey.generate()  # a well-formed signature, not the owner's
    op = op.with_(signature=who.sign_digest(accounts.owner_digest(digest, version)))
    return op, sender.lower(), to_token, to_native


def natives(result: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [
        (c["from"], c["to"], int(c["rawAmount"]))
        for c in result["changes"]
        if c["assetType"] == "NATIVE"
    ]


async def simulate_both_ways(s: Setup, op: UserOperation, version: Version) -> dict[str, Any]:
    """The simulation on the bundler's endpoint, checked equal to the alias on /v1/rpc."""
    entry_point = s.manifest.address(f"entry_point_{TAGS[version]}")
    params = [encode_user_operation(op, version), entry_point]
    on_bundler = await s.result(BUNDLER, "chaingate_simulateUserOperationAssetChanges", params)
    on_rpc = await s.result(
        "/v1/rpc/ethereum/devnet", "alchemy_simulateUserOperationAssetChanges", params
    )
    for answer in (on_bundler, on_rpc):  # what the node computed with the state it had
        answer["gas"].pop("cost")
    assert on_bundler == on_rpc, (on_bundler, on_rpc)
    return on_bundler  # type: ignore[no-any-return]


async def send_and_compare(
    s: Setup, op: UserOperation, version: Version, result: dict[str, Any], watch: list[Balance]
) -> dict[str, Any]:
    """Send ``op`` through chaingate's bundler for real and compare the watched balances (and
    every one a change names but the EntryPoint's, which also pays the bundle's beneficiary)."""
    entry_point = s.manifest.address(f"entry_point_{TAGS[version]}")
    deltas = balance_deltas([result])
    keys = sorted({*watch, *(k for k in deltas if k[3] != entry_point.lower())}, key=repr)
    before = {key: s.chain.balance(key) for key in keys}
    snapshot = s.chain.snapshot()
    try:
        sent = await s.result(
            BUNDLER, "eth_sendUserOperation", [encode_user_operation(op, version), entry_point]
        )
        with trio.fail_after(30):
            while (
                receipt := await s.result(BUNDLER, "eth_getUserOperationReceipt", [sent])
            ) is None:
                await trio.sleep(0.1)
        after = {key: s.chain.balance(key) for key in keys}
    finally:
        s.chain.revert(snapshot)
    observed = {key: after[key] - before[key] for key in keys}
    assert observed == {key: deltas.get(key, 0) for key in keys}
    assert receipt["success"] is (result["error"] is None)
    return receipt  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_a_sponsored_operation_costs_its_sender_nothing(
    setup: Setup, version: Version
) -> None:
    op, sender, to_token, to_native = await operation(setup, version, sponsored=True)
    result = await simulate_both_ways(setup, op, version)
    pm = setup.manifest.address(f"verifying_paymaster_{TAGS[version]}").lower()
    assert result["error"] is None
    assert result["gas"]["payer"] == pm and result["gas"]["sponsored"] is True
    assert result["validation"]["accountSignatureValid"] is True
    assert result["validation"]["paymasterSignatureValid"] is True
    sent_native = ETHER // 4 if version != "0.6" else 0
    assert natives(result) == ([(sender, to_native, sent_native)] if sent_native else [])
    tokens = [
        (c["from"], c["to"], c["rawAmount"], c["symbol"])
        for c in result["changes"]
        if c["assetType"] == "ERC20"
    ]
    assert tokens == [(sender, to_token, str(5 * ETHER), "CGT")]
    watch: list[Balance] = [
        ("NATIVE", None, None, sender),
        ("ERC20", setup.token, None, sender),
        ("ERC20", setup.token, None, to_token),
    ]
    receipt = await send_and_compare(setup, op, version, result, watch)
    # The paymaster paid, within what the operation allowed.
    assert 0 < int(receipt["actualGasCost"], 16) <= int(result["gas"]["maxCost"])


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_an_operation_paying_for_itself_sends_its_prefund(
    setup: Setup, version: Version
) -> None:
    op, sender, _, _ = await operation(setup, version, sponsored=False)
    result = await simulate_both_ways(setup, op, version)
    entry_point = setup.manifest.address(f"entry_point_{TAGS[version]}").lower()
    assert result["gas"]["payer"] == sender and result["gas"]["sponsored"] is False
    prefund = int(result["gas"]["maxCost"])
    assert natives(result)[0] == (sender, entry_point, prefund)  # validation pays first
    await send_and_compare(setup, op, version, result, [("NATIVE", None, None, sender)])


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_a_reverting_call_leaves_only_the_gas_payment(setup: Setup, version: Version) -> None:
    op, sender, _, _ = await operation(setup, version, sponsored=True, reverts=True)
    result = await simulate_both_ways(setup, op, version)
    assert result["changes"] == []  # sponsored: not even the gas moved the sender's money
    revert = result["error"]["revert"]
    if version == "0.8":  # v0.8's account wraps a batch's failed call
        assert revert["name"] == "ExecuteError" and revert["args"][0]["value"] == "0"
        revert = revert["inner"]
    assert revert["name"] == "InsufficientBalance"
    assert result["error"]["message"].startswith("the operation's call reverted")
    await send_and_compare(setup, op, version, result, [("ERC20", setup.token, None, sender)])


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_an_unsigned_operation_is_simulated_and_its_signature_reported(
    setup: Setup, version: Version
) -> None:
    op, sender, to_token, _ = await operation(setup, version, sponsored=True, signed=False)
    result = await simulate_both_ways(setup, op, version)
    assert result["validation"]["accountSignatureValid"] is False
    assert result["validation"]["paymasterSignatureValid"] is True
    assert (sender, to_token) in [(c["from"], c["to"]) for c in result["changes"]]
    refused = await setup.post(
        BUNDLER,
        "chaingate_simulateUserOperationAssetChanges",
        [encode_user_operation(op, version), "0x" + "11" * 20],
    )
    assert refused["error"]["code"] == -32602 and "not an EntryPoint" in refused["error"]["message"]
