"""``kill -9`` of a real ``chaingate serve`` while it matches and delivers, then a restart:
every event the chain calls for is delivered, with the same id, on SQLite and PostgreSQL.

The receiver runs here (plain HTTP on loopback; the serve process's outbound policy admits
exactly 127.0.0.1/32).  It answers slowly, so deliveries are in flight when the process dies,
and the chain keeps moving while it is down.  What it must have seen is counted from the
chain itself: every ERC-20 Transfer to the watched address since the webhook's first block
(``eth_getLogs``).  Delivery is at least once: an event acknowledged in the instant before
the kill may come again (with the same id, so receivers de-duplicate) — at most the
deliveries in flight and those acknowledged but not yet recorded, which the settings bound.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.store import open_store
from tests.conftest import DEVNET_SIGNER
from tests.serve_process import KillableServe
from tests.test_indexer_restart import wait_for_health
from tests.webhook_receiver import Receiver

PEPPER = "webhooks-crash-pepper-" + "p" * 32
CONCURRENCY = 4
TRANSFER = abi.event_topic("Transfer(address,address,uint256)")


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    with AnvilProcess() as node:
        yield (
            node,
            bootstrap_devnet(
                node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
            ),
        )


def rpc(node: AnvilProcess, method: str, *params: Any) -> Any:
    with DevnetRpc(node.url) as client:
        return client.call(method, *params)


def config_text(data_dir: Path, port: int, anvil_url: str, manifest: Path, head: int) -> str:
    return (
        f'data_dir = "{data_dir}"\n'
        f"[server]\nport = {port}\n"
        "[auth]\nrefresh_interval = 0.1\n"
        "[observability]\naccess_log = false\n"
        '[outbound]\nallow_cidrs = ["127.0.0.1/32"]\n'
        f"[webhooks]\nallow_http = true\npoll_interval = 0.05\nmax_concurrency = {CONCURRENCY}\n"
        "lease_seconds = 2.0\n"
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nfinality_depth = 2\n"
        f'block_time = 1.0\nmanifest = "{manifest}"\n'
        "[chains.ethereum.devnet.follower]\nenabled = true\npoll_interval = 0.05\n"
        f"start_block = {head}\n"
        "[chains.ethereum.devnet.indexer]\nenabled = false\n"
        f'[[chains.ethereum.devnet.upstreams]]\nurl = "{anvil_url}"\nname = "anvil"\n'
    )


def transfers_to(node: AnvilProcess, token: str, watched: str, first: int) -> set[str]:
    logs = rpc(
        node,
        "eth_getLogs",
        {
            "fromBlock": hex(first),
            "toBlock": "latest",
            "address": token,
            "topics": [TRANSFER, None, "0x" + "0" * 24 + watched[2:].lower()],
        },
    )
    return {entry["transactionHash"] for entry in logs}


async def test_kill_9_while_matching_and_delivering_loses_nothing(
    nursery: trio.Nursery, chain: tuple[AnvilProcess, Manifest], store_url: str, tmp_path: Path
) -> None:
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))

    receiver = Receiver(delay=0.05)  # slow: deliveries are in flight when the process dies
    await nursery.start(receiver.serve)
    head = int(rpc(node, "eth_blockNumber"), 16)
    port = free_port()
    data_dir = tmp_path / "serve"
    data_dir.mkdir()
    config = data_dir / "chaingate.toml"
    config.write_text(config_text(data_dir, port, node.url, manifest_path, head))
    env = {**os.environ, "CHAINGATE_AUTH__PEPPER": PEPPER, "CHAINGATE_STORE__URL": store_url}
    async with open_store(store_url, tmp_path) as store:
        await store.migrate()
        account = await admin.ensure_account(AuthRows(store), "crash@hooks", "enterprise")
        key, _ = await admin.create_key(
            AuthRows(store), PEPPER.encode(), account.id, "crash", "test"
        )
    server = KillableServe(config, env, data_dir / "stderr.log")
    try:
        process = server.spawn()
        await wait_for_health(port, process)
        watched = manifest.accounts[8]
        token = manifest.address("erc20_cgt")
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": key}, timeout=10
        ) as client:
            created = await client.post(
                "/v1/webhooks",
                json={
                    "url": f"http://127.0.0.1:{receiver.port}/hook",
                    "chain": "ethereum",
                    "event_type": "token_transfer",
                    "config": {"addresses": [watched]},
                },
            )
        assert created.status_code == 201, created.text
        first_block = created.json()["matched_from_block"] or head + 1
        sender = manifest.accounts[1]

        sent: list[str] = []

        def transfer(amount: int) -> None:
            call = abi.encode_call("transfer(address,uint256)", watched, amount)
            sent.append(
                rpc(
                    node,
                    "eth_sendTransaction",
                    {"from": sender, "to": token, "data": "0x" + call.hex()},
                )
            )

        for amount in range(1, 21):
            transfer(amount)
        # Killed once deliveries are under way, with more of the chain still to match.
        with trio.fail_after(30):
            await receiver.wait_for(3)
        server.kill()
        for amount in range(21, 41):
            transfer(amount)  # while it is down
        process = server.spawn()
        await wait_for_health(port, process)
        for amount in range(41, 51):
            transfer(amount)
        with trio.fail_after(10):  # anvil answers a send before the block is in its chain
            while any(rpc(node, "eth_getTransactionReceipt", h) is None for h in sent):
                await trio.sleep(0.05)
        expected = transfers_to(node, token, watched, first_block)
        assert expected == set(sent)
        with trio.fail_after(60):
            while {b["data"]["tx_hash"] for b in (r.json() for r in receiver.received)} < expected:
                await receiver.changed.wait()
        bodies = [r.json() for r in receiver.received]
        by_tx: dict[str, set[str]] = {}
        for body in bodies:
            by_tx.setdefault(body["data"]["tx_hash"], set()).add(body["id"])
        # One id per event, whatever the number of deliveries.
        assert all(len(ids) == 1 for ids in by_tx.values()), by_tx
        assert set(by_tx) == expected
        # Sent again: what was in flight at the kill, and what had been acknowledged but not
        # yet recorded (outcomes are written in batches, about one batch per in-flight slot).
        repeats = sum(n - 1 for n in Counter(b["id"] for b in bodies).values())
        assert repeats <= 2 * CONCURRENCY, f"{repeats} repeated deliveries"
    finally:
        server.stop()
