"""The bundler end to end: a real gateway on a real devnet (anvil, the npm EntryPoints).

Operations built and signed with chaingate.aa (the same as tests/test_aa_devnet.py builds,
proven there against the contracts) go to ``POST /v1/bundler/ethereum/devnet`` over HTTP; the
bundler validates them (safe mode: traced under the ERC-7562 rules; unsafe: simulation only),
bundles them with its own key, and the follower's logs give the receipt.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.aa import accounts
from chaingate.aa.paymaster import eth_signed_message_hash
from chaingate.aa.userop import UserOperation, Version, user_op_hash
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.twins import Impl
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.test_aa_devnet import TAGS, NodeCaller, build_op

PATH = "/v1/bundler/ethereum/devnet"


class Bundler:
    def __init__(self, handle: GatewayHandle, node: AnvilProcess, manifest: Manifest) -> None:
        self.handle = handle
        self.node = node
        self.manifest = manifest
        self._id = 0

    async def call(self, method: str, *params: Any) -> dict[str, Any]:
        self._id += 1
        body = {"jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)}
        async with self.handle.client() as client:
            answer = await client.post(PATH, json=body)
        assert answer.status_code == 200, answer.text
        reply: dict[str, Any] = answer.json()
        assert reply["id"] == self._id
        return reply

    async def result(self, method: str, *params: Any) -> Any:
        reply = await self.call(method, *params)
        assert "error" not in reply, reply
        return reply["result"]

    async def receipt(self, user_op_hash: str, wait: float = 20.0) -> dict[str, Any]:
        with trio.fail_after(wait):
            while True:
                receipt = await self.result("eth_getUserOperationReceipt", user_op_hash)
                if receipt is not None:
                    return dict(receipt)
                await trio.sleep(0.1)


def start_settings(node: AnvilProcess, tmp_path: Path, manifest: Manifest, **bundler: Any) -> Any:
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    key = PrivateKey.generate()
    with DevnetRpc(node.url) as rpc:
        rpc.call("anvil_setBalance", key.address, hex(100 * 10**18))
    return make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02},
            "indexer": {"enabled": False},
            "bundler": bundler,
        },
        store={"url": f"sqlite://{tmp_path}/store.db"},
        bundler={"key": key.hex(), "debug": True},
        data_dir=str(tmp_path),
    )


@pytest.fixture(params=["safe", "unsafe"])
async def bundler(
    request: pytest.FixtureRequest,
    nursery: trio.Nursery,
    impl: Impl,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
) -> Bundler:
    node, manifest = module_devnet
    settings = start_settings(node, tmp_path, manifest, safe_mode=request.param == "safe")
    logs = io.BytesIO()
    gateway = Gateway(settings, impl=impl, access_stream=logs, outbound_policy=OutboundPolicy.dev())
    await nursery.start(gateway.run)
    return Bundler(GatewayHandle(gateway, logs), node, manifest)


async def sponsored_op(b: Bundler, version: Version) -> tuple[UserOperation, str]:
    factory = await accounts.learn_factory(
        NodeCaller(b.node.url),
        b.manifest.address(f"simple_account_factory_{TAGS[version]}"),
        version,
    )
    with DevnetRpc(b.node.url) as rpc:
        op, digest = build_op(
            rpc, b.manifest, version, factory, PrivateKey.generate(), DEVNET_SIGNER
        )
    return op, "0x" + digest.hex()


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_an_operation_is_validated_bundled_and_its_receipt_found(
    bundler: Bundler, version: Version
) -> None:
    entry_point = bundler.manifest.address(f"entry_point_{TAGS[version]}")
    supported = await bundler.result("eth_supportedEntryPoints")
    assert entry_point in supported
    assert await bundler.result("eth_chainId") == "0x7a69"
    op, expected = await sponsored_op(bundler, version)
    sent = await bundler.result(
        "eth_sendUserOperation", encode_user_operation(op, version), entry_point
    )
    assert sent == expected
    receipt = await bundler.receipt(sent)
    assert receipt["success"] is True and receipt["userOpHash"] == sent
    assert receipt["sender"] == op.sender and receipt["entryPoint"] == entry_point
    assert int(receipt["actualGasCost"], 16) > 0
    assert receipt["receipt"]["transactionHash"] == receipt["receipt"]["transactionHash"]
    assert receipt["receipt"]["status"] == "0x1"
    by_hash = await bundler.result("eth_getUserOperationByHash", sent)
    assert by_hash["userOperation"] == encode_user_operation(op, version)
    assert by_hash["transactionHash"] == receipt["receipt"]["transactionHash"]
    status = await bundler.result("chaingate_getUserOperationStatus", sent)
    assert status["status"] == "included"
    assert status["transactionHash"] == receipt["receipt"]["transactionHash"]
    # The same operation again is known, not accepted twice.
    again = await bundler.call(
        "eth_sendUserOperation", encode_user_operation(op, version), entry_point
    )
    assert again["error"]["code"] in (-32602, -32500), again


@pytest.mark.parametrize("version", ["0.6", "0.7"])
async def test_a_bad_signature_is_refused_with_its_code(bundler: Bundler, version: Version) -> None:
    entry_point = bundler.manifest.address(f"entry_point_{TAGS[version]}")
    op, _ = await sponsored_op(bundler, version)
    forged = op.with_(signature=PrivateKey.generate().sign_digest(b"\x01" * 32))
    reply = await bundler.call(
        "eth_sendUserOperation", encode_user_operation(forged, version), entry_point
    )
    assert reply["error"]["code"] == -32507, reply
    assert "AA24" in reply["error"]["message"]
    unknown = await bundler.result("chaingate_getUserOperationStatus", "0x" + "ab" * 32)
    assert unknown["status"] == "not_found"
    assert await bundler.result("eth_getUserOperationReceipt", "0x" + "ab" * 32) is None


async def test_bad_params_are_invalid_params(bundler: Bundler) -> None:
    entry_point = bundler.manifest.address("entry_point_v07")
    for params in ([], [{}], [{"sender": "0x1"}, entry_point], [{}, "0x" + "11" * 20]):
        reply = await bundler.call("eth_sendUserOperation", *params)
        assert reply["error"]["code"] == -32602, (params, reply)
    reply = await bundler.call("eth_getUserOperationReceipt", "0x12")
    assert reply["error"]["code"] == -32602


# --- the mempool's rules and reputation, on real operations ----------------------------------

GWEI = 10**9


async def self_paid_op(
    b: Bundler,
    version: Version,
    owner: PrivateKey,
    salt: int,
    *,
    key: int = 0,
    tip: int = GWEI,
    fee: int = 50 * GWEI,
    deployed: bool = False,
) -> UserOperation:
    """An owner-signed operation of a counterfactual SimpleAccount paying its own prefund
    (funded here), nonce ``key << 64``."""
    factory = await accounts.learn_factory(
        NodeCaller(b.node.url),
        b.manifest.address(f"simple_account_factory_{TAGS[version]}"),
        version,
    )
    sender = factory.account_address(owner.address, salt)
    with DevnetRpc(b.node.url) as rpc:
        rpc.call("anvil_setBalance", sender, hex(10**18))
    op = UserOperation(
        sender=sender,
        nonce=key << 64,
        call_data=b"",
        call_gas_limit=50_000,
        verification_gas_limit=1_000_000,
        pre_verification_gas=100_000,
        max_fee_per_gas=fee,
        max_priority_fee_per_gas=tip,
        factory=None if deployed else factory.address,
        factory_data=b"" if deployed else factory.factory_data(owner.address, salt),
    )
    entry_point = b.manifest.address(f"entry_point_{TAGS[version]}")
    digest = user_op_hash(op, entry_point=entry_point, chain_id=31337, version=version)
    return op.with_(signature=owner.sign_digest(eth_signed_message_hash(digest)))


async def send(b: Bundler, op: UserOperation, version: Version) -> dict[str, Any]:
    entry_point = b.manifest.address(f"entry_point_{TAGS[version]}")
    return await b.call("eth_sendUserOperation", encode_user_operation(op, version), entry_point)


async def test_replacement_needs_ten_percent_more_on_both_fees(bundler: Bundler) -> None:
    assert await bundler.result("debug_bundler_setBundlingMode", "manual") == "ok"
    owner, salt = PrivateKey.generate(), 7
    first = await self_paid_op(bundler, "0.7", owner, salt, tip=GWEI, fee=50 * GWEI)
    accepted = await send(bundler, first, "0.7")
    assert "result" in accepted, accepted
    cheap = await self_paid_op(bundler, "0.7", owner, salt, tip=GWEI * 105 // 100, fee=60 * GWEI)
    refused = await send(bundler, cheap, "0.7")
    assert refused["error"]["code"] == -32602 and "underpriced" in refused["error"]["message"]
    better = await self_paid_op(bundler, "0.7", owner, salt, tip=GWEI * 11 // 10, fee=55 * GWEI)
    replaced = await send(bundler, better, "0.7")
    assert "result" in replaced, replaced
    old = await bundler.result("chaingate_getUserOperationStatus", accepted["result"])
    assert old["status"] == "dropped" and replaced["result"] in old["reason"]
    pending = await bundler.result("chaingate_getPendingUserOperations", first.sender)
    assert [p["userOpHash"] for p in pending] == [replaced["result"]]
    mempool = await bundler.result(
        "debug_bundler_dumpMempool", bundler.manifest.address("entry_point_v07")
    )
    assert [m["sender"] for m in mempool] == [first.sender]
    mined = await bundler.result("debug_bundler_sendBundleNow")
    assert mined["userOpHashes"] == [replaced["result"]] and mined["status"] == "0x1"
    receipt = await bundler.receipt(replaced["result"])
    assert receipt["receipt"]["transactionHash"] == mined["transactionHash"]


async def test_the_fifth_operation_of_an_unstaked_sender_is_refused(bundler: Bundler) -> None:
    assert await bundler.result("debug_bundler_setBundlingMode", "manual") == "ok"
    owner = PrivateKey.generate()
    deploy = await send(bundler, await self_paid_op(bundler, "0.6", owner, 1), "0.6")
    await bundler.result("debug_bundler_sendBundleNow")
    assert (await bundler.receipt(deploy["result"]))["success"] is True
    hashes = []
    for key in range(1, 5):  # four nonce keys: four operations valid at once
        op = await self_paid_op(bundler, "0.6", owner, 1, key=key, deployed=True)
        reply = await send(bundler, op, "0.6")
        assert "result" in reply, reply
        hashes.append(reply["result"])
    op = await self_paid_op(bundler, "0.6", owner, 1, key=5, deployed=True)
    fifth = await send(bundler, op, "0.6")
    assert fifth["error"]["code"] == -32505, fifth
    assert "unstaked" in fifth["error"]["message"]
    # One operation per sender per bundle: four bundles include all four, once each.
    for _ in range(4):
        assert (await bundler.result("debug_bundler_sendBundleNow"))["status"] == "0x1"
    for sent in hashes:
        assert (await bundler.receipt(sent))["success"] is True


async def test_a_banned_paymaster_is_refused_and_a_throttled_one_limited(bundler: Bundler) -> None:
    assert await bundler.result("debug_bundler_setBundlingMode", "manual") == "ok"
    paymaster = bundler.manifest.address("verifying_paymaster_v07")
    entry_point = bundler.manifest.address("entry_point_v07")
    stake = await bundler.result("debug_bundler_getStakeStatus", paymaster, entry_point)
    assert stake["isStaked"] is True and stake["stakeInfo"]["stake"] == str(10**18)
    await bundler.result(
        "debug_bundler_setReputation",
        [{"address": paymaster, "opsSeen": hex(1000), "opsIncluded": "0x0"}],
        entry_point,
    )
    dumped = await bundler.result("debug_bundler_dumpReputation", entry_point)
    assert [d["status"] for d in dumped if d["address"] == paymaster] == ["banned"]
    op, _ = await sponsored_op(bundler, "0.7")
    banned = await send(bundler, op, "0.7")
    assert banned["error"]["code"] == -32504 and "banned" in banned["error"]["message"]
    # Throttled (seen 200, included 0): at most four of its operations in the mempool.
    await bundler.result(
        "debug_bundler_setReputation",
        [{"address": paymaster, "opsSeen": hex(200), "opsIncluded": "0x0"}],
        entry_point,
    )
    for _ in range(4):
        op, _ = await sponsored_op(bundler, "0.7")
        assert "result" in await send(bundler, op, "0.7")
    op, _ = await sponsored_op(bundler, "0.7")
    throttled = await send(bundler, op, "0.7")
    assert throttled["error"]["code"] == -32504 and "throttled" in throttled["error"]["message"]
    assert await bundler.result("debug_bundler_clearReputation") == "ok"
    assert await bundler.result("debug_bundler_clearState") == "ok"
    assert await bundler.result("debug_bundler_dumpMempool", entry_point) == []
    op, _ = await sponsored_op(bundler, "0.7")
    assert "result" in await send(bundler, op, "0.7")


def test_a_receipt_s_block_is_read_from_the_node_s_own_text() -> None:
    """eth_getUserOperationReceipt passes the node's receipt on as it wrote it and reads only
    its blockHash: no receipt, one without a block (or not an object) names none."""
    import msgspec

    from chaingate.bundler.methods import _block_hash

    block = "0x" + "Ab" * 32
    assert _block_hash(msgspec.Raw(b'{"status":"0x1","blockHash":"%s"}' % block.encode())) == (
        block.lower()
    )
    for text in (b"null", b"{}", b'{"blockHash":null}', b'"0x12"', b"[1]", b'{"blockHash":""}'):
        assert _block_hash(msgspec.Raw(text)) is None, text
