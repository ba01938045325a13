"""The bundler across two ``chaingate serve`` processes on one PostgreSQL: operations sent to
the process that does not lead ``bundler:ethereum/devnet`` are bundled once by the one that
does, their status readable where they were sent; after ``kill -9`` of the leader the other
takes the role and bundles what it is sent — each operation once on chain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm.keys import PrivateKey
from tests.conftest import pg_schema
from tests.test_bundler_restart import (
    Server,
    check_once_on_chain,
    rpc,
    send_operations,
    wait_all_included,
)

ROLE = "bundler:ethereum/devnet"


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


async def leads(server: Server) -> set[str]:
    async with httpx.AsyncClient(timeout=5) as client:
        body = (await client.get(f"http://127.0.0.1:{server.port}/v1/health")).json()
    return set(body["leads"])


async def test_operations_sent_anywhere_are_bundled_once_by_the_leader(
    module_devnet: tuple[AnvilProcess, Manifest], pg_url: str, tmp_path: Path
) -> None:
    node, manifest = module_devnet
    key = PrivateKey.generate()  # both processes bundle with it (one at a time)
    rpc(node, "anvil_setBalance", key.address, hex(100 * 10**18))
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(Server(tmp_path / name, node, manifest, pg_url, key))
    try:
        first_block = int(rpc(node, "eth_blockNumber"), 16) + 1
        for s in servers:
            await s.start("auto")
        with trio.fail_after(30):
            while True:
                held = [await leads(s) for s in servers]
                if all(held) and sum(ROLE in h for h in held) == 1:
                    break
                await trio.sleep(0.1)
        leader = servers[0] if ROLE in held[0] else servers[1]
        other = servers[1] if leader is servers[0] else servers[0]

        sent = await send_operations(other)
        await wait_all_included(other, list(sent))  # statuses asked where they were sent
        check_once_on_chain(leader, sent, first_block)

        leader.kill()
        with trio.fail_after(5):
            while ROLE not in await leads(other):
                await trio.sleep(0.05)
        more = await send_operations(other)
        await wait_all_included(other, list(more))
        check_once_on_chain(other, {**sent, **more}, first_block)
    finally:
        for s in servers:
            s.stop()
