"""A leader that stops without dying (issue 39): ``SIGSTOP`` of the ``chaingate serve`` process
that leads webhooks, one of two on one PostgreSQL.  Its session locks outlive the stop, so
before leases nobody took over and deliveries waited for the stall.  Now the other process
finds it silent past ``server.leader_timeout``, ends its sessions and takes its roles (every
one) within the timeout and a margin; deliveries go on meanwhile.  Resumed (``SIGCONT``),
the stopped one has written nothing more (its matcher's commits did not move), steps down,
and joins again as a candidate: the roles split between the two once more.  No webhook
event is lost or made twice.  The takeover's seconds are printed (``pytest -s``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import trio

from chaingate.config.leases import MIN_LEADER_TIMEOUT
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm import abi
from tests.conftest import pg_schema
from tests.test_cluster_handover import Node, chain, cluster_env, config_text, rpc, until
from tests.webhook_receiver import Receiver

__all__ = ["chain"]  # the module-scoped devnet fixture, shared with the handover test

PEPPER = "cluster-stall-pepper-" + "p" * 32
LEASE = MIN_LEADER_TIMEOUT  # server.leader_timeout, seconds (5 by default)
MARGIN = 3.0  # a tick to notice, a tick to take, and a loaded machine's slack
WEBHOOKS = "webhooks:ethereum/devnet"


async def metrics(node: Node) -> dict[str, float]:
    """``name{labels}`` -> value, of the lines this test reads."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (
            await client.get(
                f"http://127.0.0.1:{node.port}/metrics",
                headers={"Authorization": "Bearer cluster-admin"},
            )
        ).text
    found = {}
    for line in text.splitlines():
        if line.startswith(("chaingate_leader", "chaingate_webhook_matcher_total")):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def commits(seen: dict[str, float]) -> float:
    return sum(v for k, v in seen.items() if "matcher_total" in k and 'kind="commits"' in k)


async def test_a_stopped_leader_loses_its_roles_and_comes_back_as_a_candidate(
    nursery: trio.Nursery, chain: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    receiver = Receiver()
    await nursery.start(receiver.serve)
    head = int(rpc(node, "eth_blockNumber"), 16)
    watched = manifest.accounts[7]
    token = manifest.address("erc20_cgt")
    sent: list[str] = []

    def transfer() -> None:
        call = abi.encode_call("transfer(address,uint256)", watched, len(sent) + 1)
        sent.append(
            rpc(
                node,
                "eth_sendTransaction",
                {"from": manifest.accounts[1], "to": token, "data": "0x" + call.hex()},
            )
        )

    async def delivered() -> set[str]:
        return {r.json()["data"]["tx_hash"] for r in receiver.received}

    with pg_schema() as url:
        config = tmp_path / "chaingate.toml"
        config.write_text(config_text(tmp_path, node.url, manifest_path, head))
        env, key = await cluster_env(url, tmp_path, PEPPER, "stall@hooks")
        env["CHAINGATE_SERVER__LEADER_TIMEOUT"] = str(LEASE)
        nodes = [Node(n, config, env, tmp_path / f"{n}.log") for n in ("a", "b")]
        stopped: Node | None = None
        try:
            for n in nodes:
                await n.start()
            every = await nodes[0].roles()

            async def split() -> bool:
                a, b = await nodes[0].leads(), await nodes[1].leads()
                return bool(a and b and a.isdisjoint(b) and a | b == every)

            await until(split, 30, "roles split")
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{nodes[0].port}", headers={"X-API-Key": key}, timeout=10
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
            transfer()
            with trio.fail_after(30):
                while await delivered() != set(sent):
                    await receiver.changed.wait()

            leads = [await n.leads() or set() for n in nodes]
            leader = nodes[0] if WEBHOOKS in leads[0] else nodes[1]
            other = nodes[1] if leader is nodes[0] else nodes[0]
            assert leader.server.process is not None
            before = await metrics(leader)
            os.kill(leader.server.process.pid, signal.SIGSTOP)
            stopped, stopped_at = leader, time.monotonic()

            async def taken() -> bool:
                return await other.leads() == every  # the stopped one's roles too

            took = await until(taken, LEASE + 30, "the other takes every role")
            print(f"\nevery role taken {took:.2f}s after SIGSTOP (server.leader_timeout {LEASE}s)")
            assert took <= LEASE + MARGIN, took
            # Deliveries go on while the leader is stopped: the other matches and sends.
            for _ in range(3):
                transfer()
            with trio.fail_after(30):
                while await delivered() != set(sent):
                    await receiver.changed.wait()
            assert time.monotonic() - stopped_at > LEASE  # all of it during the stop
            os.kill(leader.server.process.pid, signal.SIGCONT)
            stopped = None

            # Resumed: it finds its session ended and steps down, having written nothing.
            async def stepped_down() -> bool:
                lost = await metrics(leader)
                return lost.get('chaingate_leadership_total{kind="lost"}', 0) >= 1

            await until(stepped_down, 15, "the resumed one steps down")
            after = await metrics(leader)
            assert after['chaingate_leader{role="webhooks",chain="ethereum",network="devnet"}'] == 0
            assert commits(after) == commits(before)
            # ...and is a candidate again: the roles split between the two once more.
            await until(split, 60, "roles split again")
            transfer()
            with trio.fail_after(30):
                while await delivered() != set(sent):
                    await receiver.changed.wait()
            by_tx: dict[str, set[str]] = {}
            for body in (r.json() for r in receiver.received):
                by_tx.setdefault(body["data"]["tx_hash"], set()).add(body["id"])
            assert set(by_tx) == set(sent)
            assert all(len(ids) == 1 for ids in by_tx.values())  # one event per transfer
        finally:
            if stopped is not None and stopped.server.process is not None:
                os.kill(stopped.server.process.pid, signal.SIGCONT)
            for n in nodes:
                n.server.stop()
