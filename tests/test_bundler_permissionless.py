"""``tests/node/bundler_permissionless.mjs`` — permissionless.js + viem's bundler actions — run
against Alto (npm, unsafe mode), the reference bundler the script is proven on.

The script is what chaingate's own bundler tests run against ``/v1/bundler/{chain}/{network}``;
here it is shown to work against a bundler nobody here wrote: a SimpleAccount (v0.6 and
v0.7) is deployed by its first operation, which sends 1 wei; the account pays its own prefund
(funded first with anvil_setBalance at the address chaingate.aa computes).  Needs Node and npm:
without them the test is skipped loudly, except under ``CI=true``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.aa import accounts
from chaingate.aa.userop import Version
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.manifest import Manifest
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey
from tests.node_clients import run_script

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"
TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07"}


@pytest.fixture(scope="module")
def alto_url(
    devnet: tuple[AnvilProcess, Manifest], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Alto in unsafe mode on the session devnet (its safe mode refuses every operation on
    anvil 1.7.1: /work/notes/H7-decisions.md)."""
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
