"""A TCP relay that holds every client-to-server chunk for a fixed time: a node far away.

    python bench/benchkit/latency.py --to 127.0.0.1:8545 --delay-ms 20

prints the port it listens on and relays until killed.  Each chunk the client sends leaves
``delay`` after it arrived (in order, so a request waits one round trip's worth, however
many are pipelined); answers come back at once.  Run as its own process, so the relay's work
is never on the measured process's core.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import trio

CHUNK = 65536


async def _delayed(source: trio.SocketStream, sink: trio.SocketStream, delay: float) -> None:
    send, receive = trio.open_memory_channel[tuple[float, bytes]](1024)

    async def forward() -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                await sink.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward)
        async with send:
            while data := await source.receive_some(CHUNK):
                await send.send((trio.current_time() + delay, data))
        # The client closed: what it sent still goes out, then the relay ends.


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    while data := await source.receive_some(CHUNK):
        await sink.send_all(data)


async def _serve(client: trio.SocketStream, host: str, port: int, delay: float) -> None:
    async with client:
        try:
            server = await trio.open_tcp_stream(host, port)
        except OSError:
            return
        async with server, trio.open_nursery() as nursery:
            nursery.start_soon(_delayed, client, server, delay)
            try:
                await _pump(server, client)
            except trio.BrokenResourceError:
                pass
            nursery.cancel_scope.cancel()


async def relay(host: str, port: int, delay: float) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _serve(stream, host, port, delay)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    await trio.serve_listeners(handle, listeners)


class LatencyRelay:
    """The relay as a child process: ``url`` is the delayed way to ``target``."""

    def __init__(self, target: str, delay_ms: float) -> None:
        hostport = target.split("://", 1)[-1].split("/", 1)[0]
        self._args = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--to",
            hostport,
            "--delay-ms",
            str(delay_ms),
        ]
        self._process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> LatencyRelay:
        self._process = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self._process.stdout.readline())}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--to", required=True, help="HOST:PORT of the node")
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    host, port = args.to.rsplit(":", 1)
    trio.run(relay, host, int(port), args.delay_ms / 1000)


if __name__ == "__main__":
    main()
