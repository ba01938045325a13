"""The fast lane's reads spread over an upstream's connections.

A node answers one HTTP/1.1 connection's requests in order, one after the other (anvil and
the usual nodes alike), so a read pipelined behind a slow one waits for it, and the node's
other cores serve only other connections.  So a group of reads the lane sends goes on an idle
connection when there is one; else on the least loaded while another one opens
(``Upstream.ready(spread=True)``).  A real anvil behind an HTTP relay (tests/http_relay.py, a
fault injector) that holds one address's balance: the reads sent while it is held are answered
at once.  Both twins (``impl`` through ``start_gateway``).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import trio

from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import StartGateway
from tests.http_relay import HttpRelay

RPC = "/v1/rpc/ethereum/devnet"
SLOW = "0x" + "5a" * 20
HELD = 0.8


def _held(body: bytes) -> float:
    return HELD if SLOW[2:].encode() in body else 0.0


async def _balance(client: httpx.AsyncClient, address: str) -> float:
    """Seconds until ``address``'s balance came back."""
    started = time.perf_counter()
    call = {"jsonrpc": "2.0", "id": 1, "method": "eth_getBalance", "params": [address, "latest"]}
    response = await client.post(RPC, json=call)
    assert response.json()["result"].startswith("0x"), response.text
    return time.perf_counter() - started


async def test_reads_do_not_queue_behind_a_slow_read_on_one_connection(
    nursery: trio.Nursery, start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    relay = HttpRelay(anvil.port, delay=_held)
    await nursery.start(relay.serve)
    handle = await start_gateway(
        [{"url": f"http://127.0.0.1:{relay.port}", "name": "r", "max_connections": 4}]
    )
    seconds: dict[str, float] = {}

    async def timed(name: str, address: str) -> None:
        async with handle.client() as client:  # a client connection of its own
            seconds[name] = await _balance(client, address)

    async with handle.client() as client:
        await _balance(client, "0x" + "01" * 20)  # the upstream's first connection is open
    async with trio.open_nursery() as calls:
        calls.start_soon(timed, "slow", SLOW)
        await trio.sleep(0.15)  # held on the only connection, which is now busy
        calls.start_soon(timed, "behind", "0x" + "02" * 20)  # least loaded: that one
        await trio.sleep(0.15)  # meanwhile another connection opened
        calls.start_soon(timed, "spread", "0x" + "03" * 20)
    assert seconds["slow"] >= HELD
    assert seconds["behind"] >= HELD - 0.3  # pipelined behind the held answer
    assert seconds["spread"] < HELD / 4, seconds  # on the other connection
    upstream: Any = handle.gateway.chain.services["ethereum/devnet"].pool.upstreams[0]
    assert 2 <= len(upstream.connections) <= 4
