"""Several chaingate processes, one plan: rate-limit counters shared through Redis.

Needs Redis at 127.0.0.1:6379; without it these tests are skipped loudly, except under CI
(CI=true) where that is a failure.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import coredis
import coredis.patterns.pipeline
import httpx
import pytest
import trio

from chaingate.auth.shared import SharedLimits
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.twins import Impl
from tests.conftest import IN_CI
from tests.test_auth import auth_settings, start_auth

REDIS_URL = os.environ.get("CHAINGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CALL = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}


def _require_redis() -> None:
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=2).close()
    except OSError as exc:
        reason = (
            f"!!! Redis not reachable at 127.0.0.1:6379 — shared-limit tests SKIPPED !!! ({exc})"
        )
        if IN_CI:
            pytest.fail(reason + " (CI=true, so this is a failure)")
        pytest.skip(reason)


class Cluster:
    """N `chaingate serve` processes sharing one store (SQLite file) and, optionally, Redis."""

    def __init__(self, tmp: Path, anvil: AnvilProcess, redis_url: str, processes: int) -> None:
        self.config = tmp / "chaingate.toml"
        self.config.write_text(
            f'data_dir = "{tmp}"\n'
            f'[store]\nurl = "sqlite://{tmp}/shared.db"\n'
            f'[auth]\nrefresh_interval = 0.1\nredis_url = "{redis_url}"\n'
            "[observability]\naccess_log = false\n"
            "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\n"
            f'[[chains.ethereum.devnet.upstreams]]\nurl = "{anvil.url}"\n'
        )
        self.env = {
            **os.environ,
            "CHAINGATE_AUTH__PEPPER": secrets.token_hex(32),
            "CHAINGATE_OBSERVABILITY__ADMIN_TOKEN": "admin-" + secrets.token_hex(8),
        }
        self.logs = tmp / "stderr.log"
        self.ports = [free_port() for _ in range(processes)]
        self.processes: list[subprocess.Popen[bytes]] = []

    def command(self, *args: str, port: int | None = None) -> list[str]:
        return [sys.executable, "-m", "chaingate", *args]

    def create_key(self, plan: str = "free") -> str:
        result = subprocess.run(
            self.command(
                "keys", "--config", str(self.config), "create", "--email", "s@t", "--plan", plan
            ),
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return next(
            line.strip() for line in result.stdout.splitlines() if line.strip().startswith("svc_")
        )

    def start(self) -> None:
        for port in self.ports:
            env = {**self.env, "CHAINGATE_SERVER__PORT": str(port)}
            self.processes.append(
                subprocess.Popen(
                    self.command("serve", "--config", str(self.config)),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=self.logs.open("ab"),
                )
            )
        deadline = time.monotonic() + 30
        for port in self.ports:
            while True:
                try:
                    if (
                        httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code
                        == 200
                    ):
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "chaingate did not start"
                time.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=15)

    def drive(self, key: str, rate: float, seconds: float) -> dict[int, int]:
        """``rate`` requests per second for ``seconds``, spread over the processes in turn."""
        clients = [
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) for port in self.ports
        ]
        outcomes: dict[int, int] = {}
        start = time.monotonic()
        try:
            for i in range(int(rate * seconds)):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                client = clients[i % len(clients)]
                status = client.post(
                    "/v1/rpc/ethereum/devnet", json=CALL, headers={"X-API-Key": key}
                ).status_code
                outcomes[status] = outcomes.get(status, 0) + 1
        finally:
            for client in clients:
                client.close()
        return outcomes


@pytest.fixture
def cluster_factory(tmp_path: Path, anvil: AnvilProcess) -> Iterator[object]:
    made: list[Cluster] = []

    def make(redis_url: str, name: str) -> Cluster:
        directory = tmp_path / name
        directory.mkdir()
        cluster = Cluster(directory, anvil, redis_url, processes=2)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


def test_two_processes_sharing_redis_enforce_one_plan(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    _require_redis()
    # One Free plan (10 req/s, bursts of 10) driven at 30 req/s for 5 s over two processes:
    # one process alone would let 10 + 5 * 10 = 60 through.
    shared = cluster_factory(REDIS_URL, "shared")
    key = shared.create_key("free")
    shared.start()
    outcomes = shared.drive(key, rate=30, seconds=5)
    assert set(outcomes) <= {200, 429}, outcomes
    assert 60 * 0.9 <= outcomes[200] <= 60 * 1.1, outcomes

    # Control: without Redis each process enforces the plan alone — about twice as much gets
    # through, which is what the shared counters prevent.
    alone = cluster_factory("", "alone")
    key = alone.create_key("free")
    alone.start()
    outcomes = alone.drive(key, rate=30, seconds=5)
    assert outcomes[200] > 60 * 1.5, outcomes


def test_redis_down_keeps_serving_on_local_limits(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(f"redis://127.0.0.1:{free_port()}/0", "down")
    key = cluster.create_key("growth")
    cluster.start()
    outcomes = cluster.drive(key, rate=50, seconds=1)
    assert outcomes == {200: 50}
    token = cluster.env["CHAINGATE_OBSERVABILITY__ADMIN_TOKEN"]
    metrics = httpx.get(
        f"http://127.0.0.1:{cluster.ports[0]}/metrics", headers={"Authorization": f"Bearer {token}"}
    ).text
    assert "chaingate_shared_limits_up 0" in metrics
    assert "shared rate limits unavailable" in cluster.logs.read_text()


async def test_a_key_is_noted_once_per_sync_and_every_request_reaches_redis(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    """The gate tells the shared limits a key is in use at its first admission after each
    sync, not at every request (a Python call per request, on every keyed request of a
    several-worker deployment); each sync is one Redis round trip, the key counters and the
    day quotas' grants together (a coredis round trip is ~1,000 Python calls, 20 times a
    second in every worker); the key stays active and no admitted request goes uncounted."""
    _require_redis()
    settings = auth_settings(anvil, store_url, tmp_path, auth={"redis_url": REDIS_URL})
    stack = await start_auth(nursery, impl, settings)
    key, key_id = await stack.key(plan="enterprise")
    limits = stack.handle.gateway.keys.shared  # type: ignore[union-attr]
    assert isinstance(limits, SharedLimits)
    note, pipeline = (
        SharedLimits.note.__code__,
        coredis.patterns.pipeline.Pipeline.__init__.__code__,
    )
    notes = pipelines = 0

    def count(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal notes, pipelines
        if event == "call":
            notes += frame.f_code is note
            pipelines += frame.f_code is pipeline

    rounds, per_round = 5, 40
    async with stack.client(key) as client:
        syncs = limits.syncs
        sys.setprofile(count)
        try:
            for _ in range(rounds):
                for _ in range(per_round):
                    answer = await client.post("/v1/rpc/ethereum/devnet", json=CALL)
                    assert answer.status_code == 200, answer.text
                await trio.sleep(0.15)  # a few sync intervals (0.05 s): the counts are taken
        finally:
            sys.setprofile(None)
        synced = limits.syncs - syncs
    assert rounds <= notes <= synced + 1, (notes, synced)  # per request: 200
    assert synced >= rounds and pipelines <= synced + 1, (pipelines, synced)  # was 2 a sync
    assert any(principal.key_id == key_id for principal in limits._active)
    async with coredis.Redis.from_url(REDIS_URL, decode_responses=False) as redis:
        total = await redis.hget(b"cg:rl:" + key_id.encode(), b"r")
    assert total is not None and int(total) == rounds * per_round
