"""What the WebSocket fan-out benches share: raw WebSocket clients under one ``selectors``
loop, chaingate started in front of a node, the delay statistics and the report's table.

The clients are raw non-blocking sockets (a WebSocket client this small costs little CPU, so a
bench measures chaingate rather than itself); each records, per push number (a block or a
slot), the wall-clock time ``recv`` returned, before any decoding.
"""

from __future__ import annotations

import base64
import os
import selectors
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from benchkit import procs

R = TypeVar("R")
TABLE_HEAD = ["| measure | value | target |", "|---|---:|---:|"]


def masked_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@dataclass
class WsClient:
    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    heads: dict[int, float] = field(default_factory=dict)  # push number -> receive time
    closed: bool = False

    def frames(self) -> list[tuple[int, bytes]]:
        """Complete server frames taken from the buffer: (opcode, payload)."""
        out = []
        buf = self.buffer
        while len(buf) >= 2:
            n, start = buf[1] & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, start = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, start = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < start + n:
                break
            out.append((buf[0] & 0x0F, bytes(buf[start : start + n])))
            del buf[: start + n]
        return out


def connect(port: int, path: str) -> WsClient:
    sock = socket.create_connection((procs.LOOPBACK, port), timeout=10)
    key = base64.b64encode(os.urandom(16))
    sock.sendall(
        b"GET " + path.encode() + b" HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key
        + b"\r\n\r\n"
    )  # fmt: skip
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("connection closed during the handshake")
        head += chunk
    status, _, rest = head.partition(b"\r\n\r\n")
    if not status.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"upgrade refused: {status[:200]!r}")
    client = WsClient(sock)
    client.buffer += rest
    return client


def listen(clients: list[WsClient]) -> selectors.BaseSelector:
    """One selector over the clients' sockets, made non-blocking (each key's data: its client)."""
    selector = selectors.DefaultSelector()
    for client in clients:
        client.sock.setblocking(False)
        selector.register(client.sock, selectors.EVENT_READ, client)
    return selector


def drain(
    selector: selectors.BaseSelector, until: float, number_of: Callable[[bytes], int | None]
) -> None:
    """Read every ready socket until ``until`` (monotonic); record each push's arrival under
    ``number_of(payload)`` (None: not a push)."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return
        for key, _ in selector.select(min(left, 0.05)):
            client: WsClient = key.data
            try:
                chunk = client.sock.recv(65536)
            except BlockingIOError:
                continue
            received = time.time()
            if not chunk:
                client.closed = True
                selector.unregister(client.sock)
                continue
            client.buffer += chunk
            for opcode, payload in client.frames():
                if opcode == 0x9:  # ping: answer it, or chaingate drops us
                    client.sock.sendall(masked_frame(payload, 0xA))
                elif opcode == 0x1:
                    number = number_of(payload)
                    if number is not None:
                        client.heads.setdefault(number, received)


@contextmanager
def serving(
    workdir: Path, upstream: str, extra_toml: str
) -> Iterator[tuple[procs.ChaingateServer, str]]:
    """One ``chaingate serve`` (API keys on, access log, coalescing) in front of ``upstream``,
    ``extra_toml`` appended to its config: (the server, an unlimited key); stopped on exit."""
    auth = procs.Auth.fresh(workdir / "keys.db")
    server = procs.ChaingateServer(
        workdir, "chaingate", upstream, access_log=True, coalesce=True, auth=auth
    )
    with server.config_path.open("a") as config:
        config.write(extra_toml)
    key = server.create_key()
    try:
        server.start()  # inside: a server that never got ready is stopped too
        yield server, key
    finally:
        server.stop()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError(f"{name} not in /metrics")


def fanout_mean_ms(text: str, prefix: str) -> float:
    """chaingate's mean time per fan-out (``<prefix>_seconds_sum / <prefix>_total``), in ms."""
    fanouts = metric(text, prefix + "_total")
    return metric(text, prefix + "_seconds_sum") / fanouts * 1000 if fanouts else 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def delays(
    sent: dict[int, float], numbers: list[int], clients: list[WsClient]
) -> tuple[list[float], int]:
    """For each push number, every client's receive time minus ``sent[number]``, in ms; and how
    many (client, number) pushes never arrived."""
    found: list[float] = []
    lost = 0
    for number in numbers:
        at_sent = sent[number]
        for client in clients:
            at = client.heads.get(number)
            if at is None:
                lost += 1
            else:
                found.append((at - at_sent) * 1000)
    return found, lost


def delay_rows(name: str, measured: str, delays_ms: list[float], target_ms: float) -> list[str]:
    """The report's delay rows: p50 (saying what was ``measured``), p99 against the target, max."""
    return [
        f"| {name} delay p50 ({measured}) | {percentile(delays_ms, 0.50):.1f} ms | |",
        f"| {name} delay p99 | {percentile(delays_ms, 0.99):.1f} ms | <= {target_ms:.0f} ms |",
        f"| {name} delay max | {max(delays_ms):.1f} ms | |",
    ]


def run_in_tmp(prefix: str, run: Callable[[Path], R]) -> R | None:
    """``run`` in a fresh temporary directory (``prefix``); None, said on stderr, when a server
    failed."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            return run(Path(tmp))
        except procs.ServerFailed as exc:
            print(f"server failed: {exc}", file=sys.stderr)
            return None
