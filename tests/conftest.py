"""Shared fixtures: both framing implementations, real anvil nodes, an in-process gateway.

* ``impl`` is parametrized over the compiled and the pure twins, so every test that takes it
  (directly or through ``start_gateway``) runs against both.
* ``anvil`` is one real anvil for the whole session (installed from npm on first use);
  ``anvil_factory`` starts fresh ones a test may kill; ``devnet`` is one more, bootstrapped
  with every devnet contract, yielding ``(node, manifest)``.
* ``start_gateway`` runs a Gateway inside the test's nursery on a free port.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio
from hypothesis import HealthCheck, settings

from chaingate import config
from chaingate import twins as impl_module
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey
from chaingate.gateway import Gateway
from chaingate.store import Store, open_store
from tests.helpers import GatewayHandle

# py_ecc (which eth-account and web3 pull in) raises the interpreter's recursion limit to
# 100,000 when imported.  A JSON document nested 100,000 deep then overflows the C stack inside
# msgspec (a segfault) instead of raising RecursionError, as it does in chaingate's own
# process, which never imports py_ecc.  The tests run with the interpreter's default: py_ecc
# is imported first, here, so that its import cannot raise the limit again later.
with contextlib.suppress(ImportError):
    import py_ecc  # noqa: F401
sys.setrecursionlimit(1000)

# Hypothesis times each example (200 ms) and its data generation: checks of the machine's
# speed, not of a property, that fail when a busy machine deschedules the test.  The
# properties are what the tests assert; a hang is bounded by the suite's own timeouts.
settings.register_profile("chaingate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("chaingate")

IN_CI = os.environ.get("CI", "").lower() == "true"
PG_URL = os.environ.get("CHAINGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_UNREACHABLE = (
    "!!! PostgreSQL not reachable at 127.0.0.1:5432 — store tests on PostgreSQL SKIPPED !!!"
)


def _compiled_or_skip() -> impl_module.Impl:
    try:
        return impl_module.compiled()
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("compiled modules not built (run `pip install -e .`)")


@pytest.fixture(params=["compiled", "pure"])
def impl(request: pytest.FixtureRequest) -> impl_module.Impl:
    if request.param == "compiled":
        return _compiled_or_skip()
    return impl_module.pure()


@pytest.fixture(scope="session")
def anvil() -> Iterator[AnvilProcess]:
    with AnvilProcess() as node:
        yield node


@pytest.fixture
def anvil_factory() -> Iterator[Callable[..., AnvilProcess]]:
    started: list[AnvilProcess] = []

    def start(**kwargs: Any) -> AnvilProcess:
        node = AnvilProcess(**kwargs).start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


# The devnet paymaster's signer in tests: a fixed, test-only key, so the devnet state cached
# under it (the cache is keyed by the signer address) is reused from one session to the next.
DEVNET_SIGNER = PrivateKey(keccak256(b"chaingate tests: devnet paymaster signer"))


@pytest.fixture(scope="session")
def devnet() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """An anvil of its own bootstrapped like ``chaingate dev`` does, with its manifest."""
    with AnvilProcess() as node:
        yield node, bootstrap_devnet(node.url, paymaster_signer=DEVNET_SIGNER.address)


@pytest.fixture(scope="module")
def module_devnet() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """A bootstrapped devnet for one test module alone: for modules whose tests reorganise
    it, stop its mining or spend its paymasters' deposits."""
    with AnvilProcess() as node:
        yield (
            node,
            bootstrap_devnet(
                node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
            ),
        )


def make_settings(upstreams: list[str] | list[dict[str, Any]], **sections: Any) -> config.Settings:
    """Settings for one ``ethereum/devnet`` network served on a free port."""
    ups = [
        u if isinstance(u, dict) else {"url": u, "name": f"up{i}"} for i, u in enumerate(upstreams)
    ]
    network = {"chain_id": 31337, "testnet": True, "finality_depth": 2, "upstreams": ups}
    # The chain follower is off unless a test turns it on (tests/test_follower.py does).
    network["follower"] = {"enabled": False}
    network.update(sections.pop("network", {}))
    data: dict[str, Any] = {
        "server": {"port": 0, **sections.pop("server", {})},
        "rpc": {"probe_interval": 0.2, **sections.pop("rpc", {})},
        "observability": {"admin_token": "test-admin-token", **sections.pop("observability", {})},
        # API keys are off unless a test turns them on (tests/test_auth.py does).
        "auth": {"enabled": False, **sections.pop("auth", {})},
        "chains": {"ethereum": {"devnet": network}, **sections.pop("chains", {})},
    }
    data.update(sections)
    return config.from_mapping(data, environ={})


StartGateway = Callable[..., Awaitable[GatewayHandle]]


@pytest.fixture
def start_gateway(nursery: trio.Nursery, impl: impl_module.Impl, tmp_path: Path) -> StartGateway:
    started = 0

    async def start(upstreams: list[Any], **sections: Any) -> GatewayHandle:
        nonlocal started
        started += 1
        # Never the user's real data directory: each gateway gets its own unless told.
        sections.setdefault("data_dir", str(tmp_path / f"gateway-{started}"))
        settings = make_settings(upstreams, **sections)
        logs = io.BytesIO()
        gateway = Gateway(settings, impl=impl, access_stream=logs)
        await nursery.start(gateway.run)
        return GatewayHandle(gateway, logs)

    return start


@functools.cache
def _pg_error() -> str | None:
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip()
    return None


def _require_pg() -> None:
    error = _pg_error()
    if error is None:
        return
    if IN_CI:
        pytest.fail(f"{PG_UNREACHABLE} (CI=true, so this is a failure): {error}")
    pytest.skip(f"{PG_UNREACHABLE} ({error})")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL naming an empty database: a temp SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/store.db"
        return
    with pg_schema() as url:
        yield url


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> AsyncIterator[Store]:
    """A migrated store on ``store_url`` (SQLite, then PostgreSQL), closed after the test."""
    async with open_store(store_url, tmp_path) as opened:
        await opened.migrate()
        yield opened


@contextlib.contextmanager
def pg_schema() -> Iterator[str]:
    """A URL naming a fresh PostgreSQL schema, dropped on exit (skips without PostgreSQL)."""
    _require_pg()
    import psycopg
    from psycopg import sql

    schema = f"cg_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        joiner = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{joiner}options={quote(f'-c search_path={schema}')}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``alone`` count what a process does per request (Python calls, system
    calls): beside another test process, its load adds wake-ups to their counts (a whole
    suite in two processes measured 195 calls where alone 142).  A run of several processes
    leaves them out; the README's test command runs them afterwards in one (``-n 0 -m
    alone``)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1:
        return
    alone = [item for item in items if item.get_closest_marker("alone") is not None]
    if alone:
        config.hook.pytest_deselected(items=alone)
        items[:] = [item for item in items if item.get_closest_marker("alone") is None]
