"""A stub of a hosted provider's ``eth_getLogs`` policy, in front of a real anvil.

anvil answers any block range; hosted providers refuse wide ones (Alchemy, Infura and
QuickNode each cap the range or the result count, with differing messages).  That policy
cannot run here, so this relay imitates it: it forwards every request to anvil unchanged,
except an ``eth_getLogs`` whose ``fromBlock..toBlock`` spans more than ``max_range`` blocks,
which it refuses the way Infura does (-32005, "query returned more than ... results").
Everything else — blocks, logs, hashes — is the real node's.
"""

from __future__ import annotations

import json
from typing import Any

import h11
import httpx
import trio


class RangeLimitedRelay:
    def __init__(self, target_url: str, max_range: int) -> None:
        self.target_url = target_url
        self.max_range = max_range
        self.port = 0
        self.refused = 0
        self.forwarded = 0
        self.log_ranges: list[tuple[int, int]] = []  # ranges that were answered

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            task_status.started(self.port)

            async def handle(stream: trio.SocketStream) -> None:
                await self._connection(stream, client)

            await trio.serve_listeners(handle, listeners, handler_nursery=nursery)

    async def _connection(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
        conn = h11.Connection(h11.SERVER)
        body = b""
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    answer = await self._answer(body, client)
                    body = b""
                    headers = [
                        ("Content-Type", "application/json"),
                        ("Content-Length", str(len(answer))),
                    ]
                    await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
                    await stream.send_all(conn.send(h11.Data(data=answer)))
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return

    async def _answer(self, body: bytes, client: httpx.AsyncClient) -> bytes:
        call: Any = json.loads(body)
        if isinstance(call, dict) and call.get("method") == "eth_getLogs":
            span = _span(call["params"][0])
            if span is not None and span[1] - span[0] + 1 > self.max_range:
                self.refused += 1
                error = {
                    "code": -32005,
                    "message": "query returned more than 10000 results; "
                    f"max {self.max_range} blocks per query",
                }
                return json.dumps({"jsonrpc": "2.0", "id": call.get("id"), "error": error}).encode()
            if span is not None:
                self.log_ranges.append(span)
        self.forwarded += 1
        response = await client.post(
            self.target_url, content=body, headers={"Content-Type": "application/json"}
        )
        return response.content


def _span(query: dict[str, Any]) -> tuple[int, int] | None:
    start, end = query.get("fromBlock"), query.get("toBlock")
    if not (isinstance(start, str) and isinstance(end, str)):
        return None
    if not (start.startswith("0x") and end.startswith("0x")):
        return None
    return int(start, 16), int(end, 16)
