"""WebSocket subscriptions end to end: real clients (websockets, web3.py) against real anvil."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle
from tests.ws_clients import Client, deploy_logger, emit, topic

FOLLOW = {"follower": {"enabled": True, "poll_interval": 0.05}}
HEX_FIELDS = ("number", "hash", "parentHash", "timestamp", "gasUsed", "gasLimit", "baseFeePerGas")


def ws_url(handle: GatewayHandle, network: str = "devnet", query: str = "") -> str:
    return f"ws://127.0.0.1:{handle.port}/v1/ws/ethereum/{network}{query}"


async def mine(url: str, blocks: int = 1) -> None:
    for _ in range(blocks):
        await trio.to_thread.run_sync(rpc_call, url, "evm_mine")


async def following(handle: GatewayHandle) -> None:
    """Wait until the follower is live (its first head announced to the hub)."""
    follower = handle.gateway.followers["ethereum/devnet"]
    with trio.fail_after(10):
        while follower.head is None:
            await trio.sleep(0.02)


async def test_new_heads(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    await following(handle)
    client = await Client.open(ws_url(handle))
    sub = await client.subscribe("newHeads")
    assert sub.startswith("0x") and len(sub) == 34
    await mine(anvil.url, 2)
    heads = [await client.recv() for _ in range(2)]
    for push in heads:
        assert push["method"] == "eth_subscription"
        assert push["params"]["subscription"] == sub
        for field in HEX_FIELDS:
            assert push["params"]["result"][field].startswith("0x"), field
    first, second = (int(p["params"]["result"]["number"], 16) for p in heads)
    assert second == first + 1
    assert heads[1]["params"]["result"]["parentHash"] == heads[0]["params"]["result"]["hash"]
    await client.close()
