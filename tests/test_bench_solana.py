"""``chaingate bench rpc --profile solana``: the Solana read mix, drawn from the devnet Solana
node's finalized blocks, against chaingate (``solana/devnet``) and the node side by side."""

from __future__ import annotations

import json
import time
from functools import partial
from importlib import resources
from pathlib import Path

import trio
from solders.keypair import Keypair

from chaingate.benchsuite import rpcprofile, solsample
from chaingate.devnet.anvil import rpc_call
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.server import serve
from tests.conftest import StartGateway
from tests.test_bench_suite import bench

SOL = 10**9


def test_the_solana_profile_is_shipped_and_names_solana_kinds() -> None:
    profile = rpcprofile.load("solana")
    assert profile.family == "solana"
    assert set(profile.mix) - {rpcprofile.BATCH} == set(solsample.KINDS)


async def test_bench_rpc_solana_profile_against_chaingate_and_the_node(
    start_gateway: StartGateway, nursery: trio.Nursery, tmp_path: Path
) -> None:
    ledger = Ledger(genesis_time=time.time(), finalized_depth=4)
    urls = await nursery.start(partial(serve, ledger, slot_seconds=0.1))
    gateway = await start_gateway(
        ["http://127.0.0.1:1"],  # make_settings' EVM network, unused here
        chains={
            "solana": {
                "devnet": {
                    "family": "solana",
                    "testnet": True,
                    "finality_depth": 0,  # as config/dev.toml
                    "upstreams": [{"url": urls.http, "name": "node"}],
                }
            }
        },
    )
    # Transactions in finalized blocks for the profile to draw: airdrops to a few accounts.
    signatures = [
        await trio.to_thread.run_sync(
            rpc_call, urls.http, "requestAirdrop", [str(Keypair().pubkey()), SOL]
        )
        for _ in range(5)
    ]
    with trio.fail_after(10):
        while True:
            statuses = await trio.to_thread.run_sync(  # the node answers on this trio thread
                rpc_call, urls.http, "getSignatureStatuses", [signatures]
            )
            if all(s and s["confirmationStatus"] == "finalized" for s in statuses["value"]):
                break
            await trio.sleep(0.1)
    # The shipped profile as a user's copy, drawing from more slots: this node's are 100 ms, and
    # the bench starts (locust's import) in a few seconds: its 32 slots would miss the airdrops.
    shipped = resources.files("chaingate.benchsuite") / "profiles" / "solana.toml"
    profile = tmp_path / "solana.toml"
    profile.write_text(shipped.read_text().replace("blocks = 32", "blocks = 300"))
    out = tmp_path / "out"
    args = [
        "rpc", "--profile", str(profile),
        "--target", f"chaingate={gateway.rpc_url('solana', 'devnet')}",
        "--target", f"node={urls.http}",
        "--duration", "3", "--users", "2", "--out", str(out),
    ]  # fmt: skip
    done = await trio.to_thread.run_sync(lambda: bench(*args))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["profile"] == str(profile)
    assert "5 transactions" in data["settings"]["parameters"], data["settings"]["parameters"]
    checks = {c["check"]: c for c in data["checks"]}
    assert set(checks) >= {f"{kind}: answered alike" for kind in solsample.KINDS}
    assert all(c["ok"] for c in checks.values()), checks
    for target in ("chaingate", "node"):
        summary = data["totals"][target]
        assert summary["requests"] > 20 and summary["answered"] == summary["requests"], summary
        by_name = data["by_name"][target]
        for kind in (*solsample.KINDS, rpcprofile.BATCH):
            assert by_name[kind]["requests"] > 0, (target, kind)
    assert data["totals"]["chaingate"]["calls"] > data["totals"]["chaingate"]["requests"]
