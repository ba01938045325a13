"""Two ``chaingate serve`` processes on one PostgreSQL both deliver one block's webhook events,
each event exactly once; and the wake-up that makes it so reaches only its own schema.

Only one process leads ``webhooks:ethereum/devnet`` (it matches blocks and writes the outbox);
both deliver.  The dispatchers poll the outbox only every 5 s here, so the other process can
take part only if the leader's commit wakes it (``store/notify.py``: ``NOTIFY`` at commit,
``LISTEN`` in every process), and only if the leader leaves it something: a process holds no
more events than it can start soon (``max_concurrency`` in flight and as many waiting), not
the whole block.  The receiver is slow enough that the block takes the leader alone well over
a second at its concurrency, and well under the poll.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from chaingate.store.notify import Listener, notify
from chaingate.webhooks.outbox import OUTBOX_CHANNEL
from tests.conftest import DEVNET_SIGNER, pg_schema
from tests.test_cluster_handover import Node, cluster_env, rpc, until
from tests.webhook_receiver import Receiver

PEPPER = "cluster-delivery-pepper-" + "p" * 32
NETWORK = "ethereum/devnet"
EVENTS = 300  # recipients of one airdrop: one block, one event each
CONCURRENCY = 8  # per process
RECEIVER_DELAY = 0.03  # seconds per answer: the leader alone needs EVENTS / 8 * 0.03 = 1.1 s
POLL = 5.0  # the dispatchers' own look at the outbox: longer than the whole block takes
DELIVERED = re.compile(r'^chaingate_webhook_deliveries_total\{outcome="delivered"\} (\S+)$', re.M)


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    with AnvilProcess() as node:
        yield (
            node,
            bootstrap_devnet(
                node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
            ),
        )


def config_text(data_dir: Path, anvil_url: str, manifest: Path, head: int) -> str:
    return (
        f'data_dir = "{data_dir}"\n'
        "[observability]\naccess_log = false\n"
        '[outbound]\nallow_cidrs = ["127.0.0.1/32"]\n'
        f"[webhooks]\nallow_http = true\npoll_interval = {POLL}\n"
        f"max_concurrency = {CONCURRENCY}\nmax_per_endpoint = {CONCURRENCY}\n"
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nfinality_depth = 2\n"
        f'block_time = 1.0\nmanifest = "{manifest}"\n'
        "[chains.ethereum.devnet.follower]\nenabled = true\npoll_interval = 0.05\n"
        f"start_block = {head}\n"
        "[chains.ethereum.devnet.indexer]\nenabled = false\n"
        f'[[chains.ethereum.devnet.upstreams]]\nurl = "{anvil_url}"\nname = "anvil"\n'
    )


def recipients(count: int) -> list[str]:
    """Fresh addresses no one holds a key of (0x + lowercase hex)."""
    return [
        "0x" + hashlib.sha256(f"cluster-delivery/{n}".encode()).digest()[:20].hex()
        for n in range(count)
    ]


async def delivered_by(node: Node) -> int:
    """The process's own count of delivered events (its /metrics)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (
            await client.get(
                f"http://127.0.0.1:{node.port}/metrics",
                headers={"Authorization": "Bearer cluster-admin"},
            )
        ).text
    found = DELIVERED.search(text)
    assert found is not None, "no delivered counter in /metrics"
    return int(float(found[1]))


async def test_two_processes_both_deliver_one_block_and_no_event_twice(
    nursery: trio.Nursery, chain: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    receiver = Receiver(delay=RECEIVER_DELAY)
    await nursery.start(receiver.serve)
    head = int(rpc(node, "eth_blockNumber"), 16)
    with pg_schema() as url:
        config = tmp_path / "chaingate.toml"
        config.write_text(config_text(tmp_path, node.url, manifest_path, head))
        env, key = await cluster_env(url, tmp_path, PEPPER, "delivery@hooks")
        nodes = [Node(n, config, env, tmp_path / f"{n}.log") for n in ("a", "b")]
        try:
            for n in nodes:
                await n.start()

            async def one_leads_webhooks() -> bool:
                leads = [await n.leads() or set() for n in nodes]
                return sum(f"webhooks:{NETWORK}" in held for held in leads) == 1

            await until(one_leads_webhooks, 30, "one webhooks leader")
            watched = recipients(EVENTS)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{nodes[0].port}", headers={"X-API-Key": key}, timeout=10
            ) as client:
                created = await client.post(
                    "/v1/webhooks",
                    json={
                        "url": f"http://127.0.0.1:{receiver.port}/hook",
                        "chain": "ethereum",
                        "event_type": "token_transfer",
                        "config": {"addresses": watched},
                    },
                )
            assert created.status_code == 201, created.text
            # Past the first poll of both dispatchers: from here on, only a wake-up starts a
            # claim before POLL seconds are up.
            await trio.sleep(1.0)
            call = abi.encode_call("airdrop(address[],uint256)", watched, 1)
            tx = {
                "from": manifest.deployer,
                "to": manifest.address("erc20_cgt"),
                "data": "0x" + call.hex(),
                "gas": hex(200_000 + 40_000 * EVENTS),
            }
            sent_at = time.monotonic()
            tx_hash = rpc(node, "eth_sendTransaction", tx)
            with trio.fail_after(20):
                while rpc(node, "eth_getTransactionReceipt", tx_hash) is None:
                    await trio.sleep(0.05)
                while len({r.json()["id"] for r in receiver.received}) < EVENTS:
                    await receiver.changed.wait()
            took = time.monotonic() - sent_at
            await trio.sleep(1.0)  # a second delivery of anything would arrive by now
            bodies = [r.json() for r in receiver.received]
            per_process = [await delivered_by(n) for n in nodes]
        finally:
            for n in nodes:
                n.server.stop()
    repeats = sum(count - 1 for count in Counter(b["id"] for b in bodies).values())
    recipients_seen = {b["data"]["to"].lower() for b in bodies}
    print(
        f"\n{EVENTS} events of one block delivered in {took:.2f} s; per process "
        f"{per_process}; {repeats} repeated"
    )
    assert recipients_seen == set(watched)
    assert repeats == 0
    assert sum(per_process) == EVENTS  # each delivered once, by one of the two
    assert all(count > 0 for count in per_process), per_process
    assert took < POLL, "the non-leader was not woken; it waited for its poll"


async def test_a_wake_up_reaches_the_listeners_of_its_schema_at_commit_only() -> None:
    """``announce`` in a transaction wakes the listeners of the writer's schema when it
    commits; not when it rolls back, and never another schema's (a deployment of its own)."""
    with pg_schema() as one, pg_schema() as other:
        woken: Counter[str] = Counter()
        listeners = {
            name: Listener(url, OUTBOX_CHANNEL, functools.partial(woken.update, [name]))
            for name, url in (("one", one), ("other", other))
        }
        async with trio.open_nursery() as nursery:
            for listener in listeners.values():
                nursery.start_soon(listener.run)
            with trio.fail_after(10):
                while not all(listener.connects for listener in listeners.values()):
                    await trio.sleep(0.02)
            woken.clear()  # each wakes once on connecting

            def write(commit: bool) -> None:
                with psycopg.connect(one) as conn:  # a transaction, as the store's
                    notify(_Tx(conn), OUTBOX_CHANNEL)
                    if not commit:
                        conn.rollback()

            await trio.to_thread.run_sync(write, False)
            await trio.sleep(0.5)
            assert woken == Counter()
            await trio.to_thread.run_sync(write, True)
            with trio.fail_after(5):
                while woken["one"] == 0:
                    await trio.sleep(0.01)
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    assert woken == Counter(one=1)
    assert listeners["one"].heard == 1 and listeners["other"].heard == 0


class _Tx:
    """What ``announce`` needs of the store's transaction: ``execute``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str) -> None:
        self.conn.execute(sql)
