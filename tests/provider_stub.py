"""Stubs of node behaviour that cannot run here, each in front of a real anvil.

``RangeLimitedRelay`` is a stub of a hosted provider's ``eth_getLogs`` policy;
``FaultyNodeStub`` is a stub of a misbehaving node (HTML answers, a lying head).

anvil answers any block range; hosted providers refuse wide ones (Alchemy, Infura and
QuickNode each cap the range or the result count, with differing messages).  That policy
cannot run here, so this relay imitates it: it forwards every request to anvil unchanged,
except an ``eth_getLogs`` whose ``fromBlock..toBlock`` spans more than ``max_range`` blocks,
which it refuses the way Infura does (-32005, "query returned more than ... results").
Everything else — blocks, logs, hashes — is the real node's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import httpx
import trio


class RangeLimitedRelay:
    def __init__(self, target_url: str, max_range: int, *, failed_header_batches: int = 0) -> None:
        self.target_url = target_url
        self.max_range = max_range
        # Batches of eth_getBlockByNumber to answer with an error before forwarding any.
        self.failed_header_batches = failed_header_batches
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
        try:
            await self._exchange(stream, client)
        except trio.BrokenResourceError:
            # The client gave up on this connection (its request timeout, on a loaded
            # machine): the connection ends, as with a real node; the server goes on.
            return

    async def _exchange(self, stream: trio.SocketStream, client: httpx.AsyncClient) -> None:
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
        if (
            self.failed_header_batches > 0
            and isinstance(call, list)
            and all(item.get("method") == "eth_getBlockByNumber" for item in call)
        ):
            self.failed_header_batches -= 1
            error = {"code": -32603, "message": "internal error (the stub's)"}
            return json.dumps(
                [{"jsonrpc": "2.0", "id": item.get("id"), "error": error} for item in call]
            ).encode()
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


class FaultyNodeStub:
    """A stub of a misbehaving node, in front of a real anvil.  Modes (switchable live):

    * ``pass`` — every request is forwarded to anvil unchanged;
    * ``html`` — every request is answered ``200`` with an HTML page (a provider's proxy or
      captive portal that lost its backend), nothing is forwarded;
    * ``head`` — a single ``eth_blockNumber`` call is answered with ``head`` (any string: a
      liar's ``0xffffffff``, a 5,000-digit value), everything else is forwarded to anvil.

    Such nodes cannot run here, so this is a stub; every other answer is the real node's.
    ``forwarded`` counts requests that reached anvil; ``faked`` those answered by the stub.
    """

    HTML = b"<html><head><title>502 Bad Gateway</title></head><body>bad gateway</body></html>"

    def __init__(self, target_url: str, mode: str = "pass", head: str = "0x0") -> None:
        self.target_url = target_url
        self.mode = mode
        self.head = head
        self.port = 0
        self.forwarded = 0
        self.faked = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:
            task_status.started(self.port)

            async def handle(stream: trio.SocketStream) -> None:
                await serve_h11(stream, lambda body: self._answer(body, client))

            await trio.serve_listeners(handle, listeners, handler_nursery=nursery)

    async def _answer(self, body: bytes, client: httpx.AsyncClient) -> tuple[bytes, bytes]:
        if self.mode == "html":
            self.faked += 1
            return b"text/html", self.HTML
        if self.mode == "head":
            call: Any = json.loads(body)
            if isinstance(call, dict) and call.get("method") == "eth_blockNumber":
                self.faked += 1
                reply = {"jsonrpc": "2.0", "id": call.get("id"), "result": self.head}
                return b"application/json", json.dumps(reply).encode()
        self.forwarded += 1
        response = await client.post(
            self.target_url, content=body, headers={"Content-Type": "application/json"}
        )
        return b"application/json", response.content


async def serve_h11(
    stream: trio.SocketStream, answer: Callable[[bytes], Awaitable[tuple[bytes, bytes]]]
) -> None:
    """Serve keep-alive HTTP/1.1 requests on ``stream``, each answered 200 by ``answer``."""
    conn = h11.Connection(h11.SERVER)
    body = b""
    async with stream:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                content_type, content = await answer(body)
                body = b""
                headers = [("Content-Type", content_type), ("Content-Length", str(len(content)))]
                try:
                    await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
                    await stream.send_all(conn.send(h11.Data(data=content)))
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return


class MissingMethodsStub(RangeLimitedRelay):
    """A stub of a node without some methods or tracers (geth before 1.14.9 has no
    ``eth_simulateV1``; many hosted nodes keep ``debug_*`` off; anvil has every one), in front
    of a real anvil: a call to a method in ``missing`` is answered -32601 the way geth does, a
    ``debug_traceCall`` with a tracer in ``missing_tracers`` -32602 "unsupported tracer";
    everything else, batches included, is the real node's answer.  ``asked`` counts calls by
    method (the stub's answers included)."""

    def __init__(
        self, target_url: str, missing: set[str], missing_tracers: set[str] | None = None
    ) -> None:
        super().__init__(target_url, max_range=1 << 62)
        self.missing = missing
        self.missing_tracers = missing_tracers or set()
        self.asked: dict[str, int] = {}

    def _refusal(self, call: Any) -> dict[str, Any] | None:
        method = call.get("method")
        self.asked[method] = self.asked.get(method, 0) + 1
        if method in self.missing:
            message = f"the method {method} does not exist/is not available"
            return {
                "jsonrpc": "2.0",
                "id": call.get("id"),
                "error": {"code": -32601, "message": message},
            }
        params = call.get("params") or []
        config = params[2] if method == "debug_traceCall" and len(params) > 2 else {}
        if isinstance(config, dict) and config.get("tracer") in self.missing_tracers:
            error = {"code": -32602, "message": "unsupported tracer type"}
            return {"jsonrpc": "2.0", "id": call.get("id"), "error": error}
        return None

    async def _answer(self, body: bytes, client: httpx.AsyncClient) -> bytes:
        call: Any = json.loads(body)
        calls = call if isinstance(call, list) else [call]
        refusals = [self._refusal(item) for item in calls]
        rest = [item for item, refused in zip(calls, refusals, strict=True) if refused is None]
        answers: list[Any] = []
        if rest:
            forwarded = json.dumps(rest if isinstance(call, list) else rest[0]).encode()
            response = await client.post(
                self.target_url, content=forwarded, headers={"Content-Type": "application/json"}
            )
            answers = response.json() if isinstance(call, list) else [response.json()]
        by_id = {answer.get("id"): answer for answer in answers}
        replies = [
            r if r is not None else by_id.get(c.get("id"))
            for c, r in zip(calls, refusals, strict=True)
        ]
        return json.dumps(replies if isinstance(call, list) else replies[0]).encode()
