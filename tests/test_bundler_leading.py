"""A bundler that no longer leads its network's ``bundler`` role (chaingate.cluster: its lease
session died, another process took the role) signs and sends no bundle: it asks right before
it does.  A real gateway on a real devnet (anvil, the npm EntryPoints)."""

from __future__ import annotations

import io
from pathlib import Path

import trio

from chaingate.bundler.network import NOT_LEADING
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.twins import Impl
from tests.helpers import GatewayHandle
from tests.test_aa_devnet import TAGS
from tests.test_bundler_e2e import Bundler, sponsored_op, start_settings


async def test_a_bundler_that_lost_its_role_sends_no_bundle(
    nursery: trio.Nursery,
    impl: Impl,
    module_devnet: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
) -> None:
    node, manifest = module_devnet
    settings = start_settings(node, tmp_path, manifest, safe_mode=False, mode="manual")
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    bundler = Bundler(GatewayHandle(gateway, io.BytesIO()), node, manifest)
    assert gateway.bundler is not None
    net = gateway.bundler.networks["ethereum/devnet"]
    assert net.submitter is not None
    leading = True
    net.leads = lambda: leading

    def sent_transactions() -> int:
        with DevnetRpc(node.url) as rpc:
            return int(rpc.call("eth_getTransactionCount", net.submitter.address, "pending"), 16)

    op, expected = await sponsored_op(bundler, "0.7")
    entry_point = manifest.address(f"entry_point_{TAGS['0.7']}")
    sent = await bundler.result(
        "eth_sendUserOperation", encode_user_operation(op, "0.7"), entry_point
    )
    assert sent == expected
    before = sent_transactions()

    leading = False  # another process took the role
    refused = await bundler.call("debug_bundler_sendBundleNow")
    assert refused["error"]["code"] == NOT_LEADING, refused
    assert sent_transactions() == before
    status = await bundler.result("chaingate_getUserOperationStatus", sent)
    assert status["status"] == "pending"

    leading = True  # led here again: bundled as usual
    await bundler.result("debug_bundler_sendBundleNow")
    receipt = await bundler.receipt(sent)
    assert receipt["success"] is True
    assert sent_transactions() == before + 1
