"""An HTTP/1.1 relay in front of a real node that injects faults per request.

A fault injector, not a fake: every answer a client gets comes from the node, byte for byte.
Per request (by its JSON-RPC body) it can hold the node's answer (``delay``: a slow node or a
congested path) or, as a stub of a provider's rate limit, answer 429 without forwarding
(``refuse``).  Requests of one connection are answered in order, as HTTP/1.1 requires, so a
held answer also holds the ones pipelined behind it, like a real slow node.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

_LIMIT = 64 << 20


async def _read_message(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    """One HTTP/1.1 message with a Content-Length body (None at EOF between messages)."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
        if len(buffer) > _LIMIT:
            raise ValueError("message too large")
    end = buffer.index(b"\r\n\r\n") + 4
    length = 0
    for line in bytes(buffer[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
        if name.strip().lower() == b"transfer-encoding":
            raise ValueError("chunked messages are not relayed")
    while len(buffer) < end + length:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    message = bytes(buffer[: end + length])
    del buffer[: end + length]
    return message


class HttpRelay:
    def __init__(
        self,
        target_port: int,
        *,
        delay: Callable[[bytes], float] | None = None,
        refuse: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.target_port = target_port
        self.delay = delay
        self.refuse = refuse
        self.port = 0
        self.requests = 0
        self.delayed = 0
        self.refused = 0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            try:
                node = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                return
            async with node:
                inbound, outbound = bytearray(), bytearray()
                try:
                    while (request := await _read_message(client, inbound)) is not None:
                        self.requests += 1
                        body = request[request.index(b"\r\n\r\n") + 4 :]
                        if self.refuse is not None and self.refuse(body):
                            self.refused += 1
                            await client.send_all(
                                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\n"
                                b"Content-Length: 0\r\n\r\n"
                            )
                            continue
                        await node.send_all(request)
                        response = await _read_message(node, outbound)
                        if response is None:
                            return
                        seconds = self.delay(body) if self.delay is not None else 0.0
                        if seconds > 0:
                            self.delayed += 1
                            await trio.sleep(seconds)
                        await client.send_all(response)
                except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
                    return
