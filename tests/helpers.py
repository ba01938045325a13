"""Test helpers: a handle on an in-process gateway, raw HTTP exchanges checked by h11, and a
fault-injecting TCP relay.

h11 is the oracle for "is this a valid HTTP/1.1 response": chaingate's own parser must never
judge chaingate's own output.

``FaultyRelay`` is not a fake node: it forwards bytes to a real anvil and injects the network
faults a real deployment sees (a connection that dies after the node executed a call, a
provider answering 429).  A provider that rate-limits cannot run here, so the 429 mode is a
stub of one, named as such where it is used.
"""

from __future__ import annotations

import io
import json
import socket
import time
from typing import Any

import h11
import httpx
import trio

from chaingate.gateway import Gateway
from tests.openapi_check import check_response


class GatewayHandle:
    def __init__(self, gateway: Gateway, logs: io.BytesIO) -> None:
        self.gateway = gateway
        self._logs = logs

    @property
    def port(self) -> int:
        return self.gateway.port

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rpc_url(self, chain: str = "ethereum", network: str = "devnet") -> str:
        return f"{self.base}/v1/rpc/{chain}/{network}"

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An HTTP client whose every REST answer is checked against the OpenAPI document."""
        hooks = kwargs.pop("event_hooks", {})
        hooks.setdefault("response", []).append(check_response)
        return httpx.AsyncClient(base_url=self.base, timeout=10, event_hooks=hooks, **kwargs)

    async def rpc(self, method: str, params: list[Any] | None = None, id: Any = 1) -> Any:
        body = {"jsonrpc": "2.0", "id": id, "method": method, "params": params or []}
        async with self.client() as client:
            response = await client.post("/v1/rpc/ethereum/devnet", json=body)
        return response.json()

    def log_lines(self) -> list[dict[str, Any]]:
        self.gateway.front.access_log.sync()
        return [json.loads(line) for line in self._logs.getvalue().splitlines() if line.strip()]

    def raw_logs(self) -> bytes:
        self.gateway.front.access_log.sync()
        return self._logs.getvalue()


def rpc_body(method: str, params: list[Any] | None = None, id: Any = 1) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": id, "method": method, "params": params or []}
    ).encode()


def post_bytes(path: str, body: bytes, extra: bytes = b"", host: bytes = b"test") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), host, len(body), extra, body)
    )


async def exchange(
    port: int, data: bytes, *, limit: float = 10.0, half_close: bool = False
) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with trio.fail_after(limit):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(data)
            if half_close:
                await stream.send_eof()
            chunks = []
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)


class ParsedResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def parse_responses(data: bytes, methods: list[str]) -> list[ParsedResponse]:
    """Parse a byte stream of responses to requests made with ``methods``, strictly, with h11.

    Raises if the stream is not exactly that many valid HTTP/1.1 responses (an interim
    100 Continue is skipped).
    """
    conn = h11.Connection(h11.CLIENT)
    out: list[ParsedResponse] = []
    conn.receive_data(data)
    for method in methods:
        conn.send(h11.Request(method=method, target="/", headers=[("Host", "test")]))
        conn.send(h11.EndOfMessage())
        status = 0
        headers: dict[str, str] = {}
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(b"")  # the stream is complete: a truncated response fails here
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError("connection closed before a complete response")
        out.append(ParsedResponse(status, headers, body))
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            break
        conn.start_next_cycle()
    return out


class FaultyRelay:
    """A TCP relay to a real node that can fail on command.

    Modes: ``pass`` relays both ways; ``swallow_response`` relays a request to the node, waits
    for the node's answer and then drops the client connection without relaying it (the
    node executed the call, the caller never learns the outcome); ``stub_429`` is a stub of a
    rate-limiting provider: it answers every request with HTTP 429 without forwarding it;
    ``delay`` holds each answer of the node for ``delay_seconds`` before relaying it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "pass"
        self.port = 0
        self.requests_seen = 0
        self.responses_swallowed = 0
        self.delay_seconds = 0.0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, client: trio.SocketStream) -> None:
        # The mode is read per request, so a switch applies to connections already open.
        async with client:
            try:
                node = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                return
            async with node, trio.open_nursery() as nursery:
                nursery.start_soon(self._node_to_client, node, client, nursery.cancel_scope)
                try:
                    while True:
                        data = await client.receive_some(65536)
                        if not data:
                            break
                        self.requests_seen += 1
                        if self.mode == "stub_429":
                            await client.send_all(
                                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\n"
                                b"Content-Length: 0\r\n\r\n"
                            )
                            continue
                        await node.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

    async def _node_to_client(
        self, node: trio.SocketStream, client: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                data = await node.receive_some(65536)
                if not data:
                    break
                if self.mode == "delay":
                    await trio.sleep(self.delay_seconds)
                if self.mode == "swallow_response":
                    self.responses_swallowed += 1
                    # Reset, not FIN: the caller sees the connection die mid-exchange.
                    client.socket.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
                    break
                await client.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()


def request_fields(r: Any) -> tuple[Any, ...]:
    """Every observable field of a parsed request (either twin), for comparisons."""
    return (
        r.method,
        r.target,
        r.path,
        r.query,
        r.version,
        r.keep_alive,
        r.body,
        list(r.headers),
        r.host,
        r.content_type,
        r.api_key,
        r.authorization,
        r.request_id,
        r.upgrade,
        r.origin,
        r.accept_encoding,
        r.content_encoding,
        r.expect_continue,
    )


def call_fields(call: Any) -> tuple[Any, ...]:
    """Every field of a parsed JSON-RPC call (either twin), for comparisons."""
    return (call.id, call.method, call.params, call.error, call.message)


def read_dev_banner(process: Any, limit: float = 60.0) -> str:
    """What a running ``chaingate dev`` printed, up to the end of its banner (or ``limit`` s)."""
    assert process.stdout is not None
    output: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if line.startswith("Ctrl-C stops"):
            break
    return "".join(output)
