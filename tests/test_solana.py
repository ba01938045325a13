"""Solana networks: routed by family, with the Solana method table.

A Solana validator cannot run here, so the node is a STUB: a minimal JSON-RPC server that
answers a handful of Solana methods with fixed data.  It stands in for the chain, never for
any part of chaingate.
"""

from __future__ import annotations

import json
from typing import Any

import h11
import trio

from tests.conftest import StartGateway

GENESIS = "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d"
SIGNATURE = (
    "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"
)


class StubSolanaNode:
    """Stub of a Solana RPC node: getSlot, getBalance, getGenesisHash, sendTransaction."""

    def __init__(self) -> None:
        self.port = 0
        self.slot = 1000
        self.calls: list[str] = []

    def answer(self, call: dict[str, Any]) -> dict[str, Any]:
        method = call.get("method")
        self.calls.append(str(method))
        results: dict[str, Any] = {
            "getSlot": self.slot,
            "getBalance": {"context": {"slot": self.slot}, "value": 5000},
            "getGenesisHash": GENESIS,
            "sendTransaction": SIGNATURE,
        }
        if method in results:
            return {"jsonrpc": "2.0", "id": call.get("id"), "result": results[method]}
        return {
            "jsonrpc": "2.0",
            "id": call.get("id"),
            "error": {"code": -32601, "message": "Method not found"},
        }

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                request = json.loads(body)
                reply = (
                    [self.answer(c) for c in request]
                    if isinstance(request, list)
                    else self.answer(request)
                )
                payload = json.dumps(reply).encode()
                headers = [
                    ("Content-Type", "application/json"),
                    ("Content-Length", str(len(payload))),
                ]
                await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
                await stream.send_all(conn.send(h11.Data(data=payload)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
                body = b""
            elif isinstance(event, h11.ConnectionClosed):
                return


async def test_solana_network_uses_the_solana_table(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    node = StubSolanaNode()
    await nursery.start(node.serve)
    gw = await start_gateway(
        ["http://127.0.0.1:1"],  # the EVM devnet of the helper, unused here
        chains={
            "solana": {
                "devnet": {
                    "family": "solana",
                    "testnet": True,
                    "finality_depth": 32,
                    "upstreams": [{"url": f"http://127.0.0.1:{node.port}", "name": "stub"}],
                }
            }
        },
    )
    url = "/v1/rpc/solana/devnet"
    async with gw.client() as client:
        balance = (
            await client.post(
                url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "getBalance",
                    "params": ["Vote111111111111111111111111111111111111111"],
                },
            )
        ).json()
        evm_method = (
            await client.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber"})
        ).json()
        first = await client.post(url, json={"jsonrpc": "2.0", "id": 3, "method": "getGenesisHash"})
        second = await client.post(
            url, json={"jsonrpc": "2.0", "id": 4, "method": "getGenesisHash"}
        )
    assert balance["result"]["value"] == 5000
    assert evm_method["error"]["code"] == -32601
    assert "eth_blockNumber" not in node.calls
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "HIT")
    assert second.json()["result"] == GENESIS
    service = gw.gateway.chain.services["solana/devnet"]
    with trio.fail_after(3):
        while service.pool.head != node.slot:
            await trio.sleep(0.05)
    assert "getSlot" in node.calls  # the probe speaks Solana
