"""``chaingate serve --workers N``: refused without shared state, N processes on one port,
a dead worker replaced, all stopped by one SIGTERM."""

from __future__ import annotations

import os
import signal
import ssl
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import trio

from chaingate import cli
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import pg_schema
from tests.serve_process import ServeProcess


def _children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(p) for p in text.split()}


def _health_by_worker(base: str, tries: int = 60) -> dict[int, list[str]]:
    """Each answering worker's ``leads``, asked over fresh connections (the kernel spreads
    connections, not requests)."""
    seen = {}
    for _ in range(tries):
        with httpx.Client(timeout=5) as client:
            body = client.get(f"{base}/v1/health").json()
            seen[body["worker"]] = body["leads"]
    return seen


def _workers_answering(base: str, tries: int = 60) -> set[int]:
    return set(_health_by_worker(base, tries))


def test_more_than_one_worker_refuses_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve = ServeProcess(tmp_path, "http://127.0.0.1:1")
    assert cli.main(["serve", "--config", str(serve.config), "--workers", "2"]) == 2
    out = capsys.readouterr().out
    assert "server.workers = 2 needs the store on PostgreSQL" in out
    assert "store.url" in out


def test_more_than_one_worker_refuses_per_process_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pg_schema() as url:
        serve = ServeProcess(tmp_path, "http://127.0.0.1:1", keys=True, store_url=url)
        os.environ["CHAINGATE_AUTH__PEPPER"] = serve.env["CHAINGATE_AUTH__PEPPER"]
        try:
            assert cli.main(["serve", "--config", str(serve.config), "--workers", "2"]) == 2
        finally:
            del os.environ["CHAINGATE_AUTH__PEPPER"]
    assert "auth.redis_url" in capsys.readouterr().out


def test_workers_share_the_port_and_a_dead_one_is_replaced(
    tmp_path: Path, anvil: AnvilProcess
) -> None:
    with pg_schema() as url:
        serve = ServeProcess(
            tmp_path, anvil.url, server="workers = 2\n", follow=True, store_url=url
        )
        with open(tmp_path / "serve.log", "wb") as log, serve.start(stderr=log):
            assert serve.process is not None
            parent = serve.process.pid
            deadline = time.monotonic() + 60
            while len(_children(parent)) < 2 or len(_workers_answering(serve.base, 10)) < 2:
                assert time.monotonic() < deadline, "two workers never answered"
                time.sleep(0.2)
            workers = _children(parent)
            assert _workers_answering(serve.base) == workers

            # Every role of the network is led by exactly one of them.
            deadline = time.monotonic() + 30
            while True:
                answers = _health_by_worker(serve.base, 30)
                leads = [lead for found in answers.values() for lead in found]
                if (
                    len(answers) == 2
                    and "follower:ethereum/devnet" in leads
                    and all(answers.values())
                ):
                    break
                assert time.monotonic() < deadline, answers
                time.sleep(0.5)
            assert len(leads) == len(set(leads))

            victim = min(workers)
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while True:
                now = _children(parent)
                if len(now) == 2 and victim not in now:
                    break
                assert time.monotonic() < deadline, "the dead worker was not replaced"
                time.sleep(0.1)
            deadline = time.monotonic() + 60
            while _workers_answering(serve.base, 10) != now:
                assert time.monotonic() < deadline, "the new worker never answered"
                time.sleep(0.2)

            serve.process.send_signal(signal.SIGTERM)
            assert serve.process.wait(timeout=30) == 0
            for pid in now:
                assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        log_text = (tmp_path / "serve.log").read_text()
        assert "worker died; starting another" in log_text


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_workers_stop_with_their_parent(tmp_path: Path, anvil: AnvilProcess) -> None:
    """A parent killed outright leaves no worker behind."""
    with pg_schema() as url:
        serve = ServeProcess(tmp_path, anvil.url, server="workers = 2\n", store_url=url)
        with serve.start():
            assert serve.process is not None
            deadline = time.monotonic() + 60
            while len(_children(serve.process.pid)) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            workers = _children(serve.process.pid)
            serve.process.kill()
            serve.process.wait(timeout=10)
            deadline = time.monotonic() + 20
            while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in workers):
                assert time.monotonic() < deadline, "workers outlived their parent"
                time.sleep(0.2)


REDIS_URL = os.environ.get("CHAINGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CALL = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
# One TLS context for every probe (all plain HTTP): a client of its own loads the CA bundle,
# ~30 ms of CPU per probe, which on a busy machine is what bounds the probes' rate.
TLS = ssl.create_default_context()


def _probe(base: str, key: str) -> tuple[int, int]:
    """(worker, status of an RPC call with ``key``), both on one new connection."""
    with httpx.Client(base_url=base, timeout=5, verify=TLS) as client:
        worker = client.get("/v1/health").json()["worker"]
        status = client.post(
            "/v1/rpc/ethereum/devnet", json=CALL, headers={"X-API-Key": key}
        ).status_code
    return worker, status


async def test_a_revoked_key_is_refused_by_every_worker_within_a_second(
    tmp_path: Path, anvil: AnvilProcess
) -> None:
    from chaingate.auth import admin
    from chaingate.store import open_store

    with pg_schema() as url:
        serve = ServeProcess(
            tmp_path,
            anvil.url,
            server="workers = 2\n",
            keys=True,
            store_url=url,
            auth=f'redis_url = "{REDIS_URL}"\n',
        )
        # The default revocation delay, not the tests' 0.1 s.
        with serve.start(env={"CHAINGATE_AUTH__REFRESH_INTERVAL": "0.25"}):
            async with open_store(url, tmp_path) as store:
                account = await admin.ensure_account(AuthRows(store), "revoke@workers", "growth")
                pepper = serve.env["CHAINGATE_AUTH__PEPPER"].encode()
                key, row = await admin.create_key(AuthRows(store), pepper, account.id, "k", "test")
                deadline = time.monotonic() + 60
                admitted: set[int] = set()
                while len(admitted) < 2:
                    worker, status = _probe(serve.base, key)
                    if status == 200:
                        admitted.add(worker)
                    assert time.monotonic() < deadline, "the key never worked on both workers"
                assert await AuthRows(store).revoke_key(row.id)
                revoked = time.monotonic()
            refused_at: dict[int, float] = {}
            while len(refused_at) < 2:
                worker, status = _probe(serve.base, key)
                if status == 401:
                    refused_at.setdefault(worker, time.monotonic() - revoked)
                else:
                    # Still a key there (a 429: its rate limit, which probes on a fast machine
                    # reach now that each is cheap): refused only once it stays refused.
                    assert status in (200, 429), status
                    refused_at.pop(worker, None)
                assert time.monotonic() - revoked < 5, refused_at
            assert max(refused_at.values()) <= 1.0, refused_at
            print(f"\nrevocation refused by each worker after {refused_at} s")


async def _probe_async(base: str, key: str) -> tuple[int, int]:
    """``_probe`` for concurrent probes."""
    async with httpx.AsyncClient(base_url=base, timeout=5, verify=TLS) as client:
        worker = (await client.get("/v1/health")).json()["worker"]
        response = await client.post(
            "/v1/rpc/ethereum/devnet", json=CALL, headers={"X-API-Key": key}
        )
    return worker, response.status_code


async def test_one_plan_holds_across_workers(tmp_path: Path, anvil: AnvilProcess) -> None:
    """A Free key (10 req/s, bursts of 10) offered 30 req/s over new connections, which the
    kernel spreads over both workers: about 10 + 10 per second get through, not twice as many
    (each worker's buckets pay for the other's use, through Redis)."""
    from chaingate.auth import admin
    from chaingate.store import open_store

    rate, offered, probes = 10, 30, 150
    with pg_schema() as url:
        serve = ServeProcess(
            tmp_path,
            anvil.url,
            server="workers = 2\n",
            keys=True,
            store_url=url,
            auth=f'redis_url = "{REDIS_URL}"\n',
        )
        with serve.start():
            async with open_store(url, tmp_path) as store:
                account = await admin.ensure_account(AuthRows(store), "limits@workers", "free")
                pepper = serve.env["CHAINGATE_AUTH__PEPPER"].encode()
                key, _ = await admin.create_key(AuthRows(store), pepper, account.id, "k", "test")
            await trio.sleep(0.5)  # the keys' refresh
            outcomes: Counter[tuple[int, int]] = Counter()
            # Concurrent probes, each at its time: one after the other, a busy machine answers
            # fewer than the plan's rate, and the limit is never put to the test.
            concurrent = trio.CapacityLimiter(8)
            start = last = time.monotonic()

            async def probe(i: int) -> None:
                nonlocal last
                await trio.sleep(max(0.0, start + i / offered - time.monotonic()))
                async with concurrent:
                    outcomes[await _probe_async(serve.base, key)] += 1
                last = max(last, time.monotonic())

            async with trio.open_nursery() as nursery:
                for i in range(probes):
                    nursery.start_soon(probe, i)
            elapsed = last - start
    statuses = Counter(status for (_, status), n in outcomes.items() for _ in range(n))
    per_worker = Counter(worker for (worker, _), n in outcomes.items() for _ in range(n))
    print(f"\none plan: {dict(statuses)} in {elapsed:.2f} s; probes per worker {dict(per_worker)}")
    assert len(per_worker) == 2, outcomes
    assert set(statuses) <= {200, 429}, outcomes
    # The plan's allowance over the time the probes took; each worker alone would let through
    # up to that allowance of what it was offered.  Unless that breaks the upper bound, the
    # probes proved nothing about sharing the plan.
    allowed = rate + rate * elapsed
    alone = sum(min(n, allowed) for n in per_worker.values())
    assert alone > allowed * 1.15, ("too few probes to tell", outcomes, elapsed)
    assert allowed * 0.85 <= statuses[200] <= allowed * 1.15, (outcomes, elapsed)
