"""viem (npm, pinned; tests/node_clients.py), a client nobody here wrote, calls the simulation
methods under Alchemy's names and chaingate's: the same answers, as JSON-RPC results viem
accepts."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm import abi
from tests.conftest import StartGateway
from tests.node_clients import run_script


async def test_viem_gets_the_same_answer_from_the_alias_and_chaingates_method(
    start_gateway: StartGateway, devnet: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    node, manifest = devnet
    handle = await start_gateway([node.url])
    a, b = manifest.accounts[1], manifest.accounts[2]
    data = abi.encode_call("transfer(address,uint256)", b, 25)
    tx = {"from": a, "to": manifest.address("erc20_cgt"), "data": "0x" + data.hex()}
    answers = await trio.to_thread.run_sync(
        lambda: run_script(
            "simulation_viem.mjs", [handle.rpc_url(), json.dumps(tx)], tmp_path / "node"
        )
    )
    assert set(answers) == {
        "simulateAssetChanges",
        "simulateAssetChangesBundle",
        "simulateExecution",
    }
    for name, pair in answers.items():
        assert pair["alias"] == pair["own"], name
    (change,) = answers["simulateAssetChanges"]["own"]["changes"]
    assert (change["from"], change["to"], change["rawAmount"]) == (a.lower(), b.lower(), "25")
    assert len(answers["simulateAssetChangesBundle"]["own"]) == 2
    root = answers["simulateExecution"]["own"]["calls"][0]
    assert root["decoded"]["methodName"] == "transfer" and root["logs"][0]["decoded"]
