"""The bundler end to end: a real gateway on a real devnet (anvil, the npm EntryPoints).

Operations built and signed with chaingate.aa (the same as tests/test_aa_devnet.py builds,
proven there against the contracts) go to ``POST /v1/bundler/ethereum/devnet`` over HTTP; the
bundler validates them (safe mode: traced under the ERC-7562 rules; unsafe: simulation only),
bundles them with its own key, and the follower's logs give the receipt.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.aa import accounts
from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.manifest import Manifest, dumps
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.impl import Impl
from chaingate.outbound import OutboundPolicy
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.test_aa_devnet import TAGS, NodeCaller, build_op

PATH = "/v1/bundler/ethereum/devnet"


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """A devnet of this module's own: bundles move the chain and spend deposits."""
    with AnvilProcess() as node:
        yield (
            node,
            bootstrap_devnet(
                node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
            ),
        )


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
    chain: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
) -> Bundler:
    node, manifest = chain
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
