"""Two real ``chaingate serve`` processes sharing one PostgreSQL store sponsor for one policy:
50 concurrent ``POST /v1/gas/sponsor`` split across both, against a policy with exactly 10
left, give exactly 10 signatures.  Each process checks the policy in its own memory, so only
the store's reservation transaction (the policy's row lock) can make this hold.

Needs PostgreSQL at 127.0.0.1:5432 (``tests.conftest._require_pg``: skipped loudly, a failure
under CI=true); each run gets a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from eth_account import Account
from psycopg import sql

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.store import open_store
from tests.conftest import DEVNET_SIGNER, PG_URL
from tests.test_indexer_restart import wait_for_health
from tests.test_wallets_api import chain, execute, operation
from tests.test_wallets_policies import expected_usd, refused, usd

__all__ = ["chain"]  # a fixture, imported for pytest

PEPPER = "wallets-pg-pepper-" + "p" * 32


def config_text(data_dir: Path, port: int, anvil_url: str, manifest: Path) -> str:
    return (
        f'data_dir = "{data_dir}"\n'
        f"[server]\nport = {port}\n"
        "[auth]\nrefresh_interval = 0.1\n"
        "[observability]\naccess_log = false\n"
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nfinality_depth = 2\n"
        f'block_time = 1.0\nmanifest = "{manifest}"\n'
        "[chains.ethereum.devnet.follower]\nenabled = true\npoll_interval = 0.05\n"
        "[chains.ethereum.devnet.indexer]\nenabled = false\n"
        f'[[chains.ethereum.devnet.upstreams]]\nurl = "{anvil_url}"\nname = "anvil"\n'
    )


@pytest.fixture
def servers(
    chain: tuple[AnvilProcess, Manifest], store_url: str, tmp_path: Path
) -> Iterator[list[tuple[int, subprocess.Popen[bytes]]]]:
    """Two ``chaingate serve`` on ``store_url`` (the PostgreSQL one: see the parametrize),
    the paymaster key given through CHAINGATE_PAYMASTER__KEY."""
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    env = {
        **os.environ,
        "CHAINGATE_AUTH__PEPPER": PEPPER,
        "CHAINGATE_PAYMASTER__KEY": DEVNET_SIGNER.hex(),
        "CHAINGATE_STORE__URL": store_url,
    }
    started: list[tuple[int, subprocess.Popen[bytes]]] = []
    try:
        for i in range(2):
            data_dir = tmp_path / f"serve{i}"
            data_dir.mkdir()
            port = free_port()
            config = data_dir / "chaingate.toml"
            config.write_text(config_text(data_dir, port, node.url, manifest_path))
            with (data_dir / "stderr.log").open("wb") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "chaingate", "serve", "--config", str(config)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                )
            started.append((port, process))
        yield started
    finally:
        for _, process in started:
            process.terminate()
        for _, process in started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


async def make_key(store_url: str, tmp_path: Path) -> str:
    async with open_store(store_url, tmp_path) as store:
        account = await admin.ensure_account(AuthRows(store), "pg@wallets", "enterprise")
        key, _ = await admin.create_key(AuthRows(store), PEPPER.encode(), account.id, "pg", "test")
    return key


async def fire(ports: list[int], key: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every body POSTed to /v1/gas/sponsor at once, alternately to each process."""
    answers: list[httpx.Response | None] = [None] * len(bodies)
    clients = [
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"X-API-Key": key},
            timeout=30,
            limits=httpx.Limits(max_connections=100),
        )
        for port in ports
    ]
    try:

        async def one(i: int) -> None:
            answers[i] = await clients[i % len(clients)].post("/v1/gas/sponsor", json=bodies[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(bodies)):
                nursery.start_soon(one, i)
    finally:
        for client in clients:
            await client.aclose()
    return [a for a in answers if a is not None]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_two_processes_on_one_postgres_sponsor_exactly_ten_of_fifty(
    servers: list[tuple[int, subprocess.Popen[bytes]]],
    chain: tuple[AnvilProcess, Manifest],
    store_url: str,
    tmp_path: Path,
) -> None:
    _, manifest = chain
    for port, process in servers:
        await wait_for_health(port, process)
    ports = [port for port, _ in servers]
    key = await make_key(store_url, tmp_path)
    first = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{ports[0]}", headers={"X-API-Key": key}, timeout=30
    )
    second = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{ports[1]}", headers={"X-API-Key": key}, timeout=30
    )
    async with first, second:
        with trio.fail_after(10):  # the key reaches both processes' key caches
            for client in (first, second):
                while (await client.get("/v1/gas/policies")).status_code == 401:
                    await trio.sleep(0.05)

        async def policy(rules: dict[str, Any]) -> str:
            body = {"name": "pg", "chain": "ethereum", "rules": rules}
            response = await first.post("/v1/gas/policies", json=body)
            assert response.status_code == 201, response.text
            policy_id: str = response.json()["id"]
            return policy_id

        async def wallet() -> str:
            body = {
                "owner": Account.create().address,
                "chain": "ethereum",
                "salt": str(secrets.randbits(64)),
            }
            response = await first.post("/v1/wallets/create", json=body)
            assert response.status_code == 201, response.text
            address: str = response.json()["address"]
            return address

        call = execute(manifest.address("erc20_cgt"))

        # One sender, a rate limit with exactly 10 left.
        limited = await policy({"rate_limit": {"max_operations": 10, "interval_seconds": 3600}})
        op = operation(await wallet(), call)
        body = {"chain": "ethereum", "policy_id": limited, "user_operation": op}
        answers = await fire(ports, key, [body] * 50)
        assert sorted(a.status_code for a in answers) == [200] * 10 + [429] * 40, answers[0].text
        for answer in answers:
            if answer.status_code != 200:
                refused(answer, 429, limited, "rate_limit")
        ledger = (await second.get(f"/v1/gas/policies/{limited}")).json()["spend"]
        assert ledger["reserved_operations"] == 10

        # Fifty senders, a budget that fits exactly 10 of their (identical) worst cases.
        ops = [operation(await wallet(), call) for _ in range(50)]
        cost = expected_usd(ops[0], "0.7")
        budget = await policy({"max_total_usd": usd(10 * cost)})
        bodies = [{"chain": "ethereum", "policy_id": budget, "user_operation": op} for op in ops]
        answers = await fire(ports, key, bodies)
        assert sorted(a.status_code for a in answers) == [200] * 10 + [403] * 40
        for answer in answers:
            if answer.status_code != 200:
                refused(answer, 403, budget, "max_total_usd")
        ledger = (await second.get(f"/v1/gas/policies/{budget}")).json()["spend"]
        assert ledger["reserved_operations"] == 10
        assert ledger["reserved_usd"] == usd(10 * cost)

    # What the store holds, read directly.
    schema = store_url.split("search_path%3D")[-1]
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        rows = conn.execute(
            "SELECT policy_id, COUNT(*), COUNT(DISTINCT user_op_hash) FROM sponsorships"
            " GROUP BY policy_id ORDER BY policy_id"
        ).fetchall()
    assert sorted((p, n) for p, n, _ in rows) == sorted([(limited, 10), (budget, 10)])
    assert {p: d for p, _, d in rows}[budget] == 10  # fifty senders: ten distinct operations
