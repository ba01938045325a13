"""WebSocket fan-out: N ``newHeads`` subscribers on one chaingate process.

    python bench/ws_fanout.py [--connections 1000] [--blocks 30] [--interval 1.0] [--smoke]

Starts anvil and one ``chaingate serve`` process in front of it (API keys on, one unlimited
enterprise key, the chain follower polling every 50 ms), then, from this process:

1. **memory** — chaingate's RSS (``/proc/<pid>/status``) before and after opening N WebSocket
   connections, and again after each subscribed to ``newHeads``: the delta per connection;
2. **delivery delay** — mines ``--blocks`` blocks, one every ``--interval`` seconds.  For each
   block, every client's receive time (wall clock, taken when ``recv`` returns, before any
   decoding) minus the time the block reached chaingate's WebSocket hub (the gauge
   ``chaingate_ws_head_arrival_seconds`` on ``/metrics``, same machine, same clock).  The
   delay includes chaingate's fan-out to all N sockets, the kernel, and this client's own
   single-threaded loop over N sockets (so it errs on the slow side).

The clients are raw non-blocking sockets under one ``selectors`` loop (a WebSocket client
this small costs little CPU, so it measures chaingate rather than itself).  Prints a markdown
report; exit status 1 when a target is missed or a push is lost, 2 when a server failed.
Targets: p99 delay <= 50 ms, <= 64 KiB per idle connection.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import selectors
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

from benchkit import procs  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, rpc_call  # noqa: E402

P99_TARGET_MS = 50.0
MEMORY_TARGET_KIB = 64.0
FOLLOWER_POLL = 0.05
EXTRA_TOML = f"""
[chains.ethereum.devnet.follower]
poll_interval = {FOLLOWER_POLL}

[ws]
ping_interval = 30.0
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


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
    heads: dict[int, float] = field(default_factory=dict)  # block number -> receive time
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


def subscribe(client: WsClient) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]}
    client.sock.sendall(masked_frame(json.dumps(call).encode()))
    while True:
        for opcode, payload in client.frames():
            if opcode == 0x1 and json.loads(payload).get("id") == 1:
                return
        chunk = client.sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed while subscribing")
        client.buffer += chunk


NUMBER_KEY = b'"number":"0x'


def head_number(payload: bytes) -> int | None:
    """The block number of a newHeads push, without decoding the JSON: this loop reads N
    sockets one after the other, so its own cost per message delays the last ones."""
    if not payload.startswith(b'{"jsonrpc":"2.0","method":"eth_subscription"'):
        return None
    start = payload.find(NUMBER_KEY)
    if start < 0:
        return None
    start += len(NUMBER_KEY)
    return int(payload[start : payload.index(b'"', start)], 16)


def drain(selector: selectors.BaseSelector, until: float) -> None:
    """Read every ready socket until ``until`` (monotonic); record each head's arrival."""
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
                    number = head_number(payload)
                    if number is not None:
                        client.heads.setdefault(number, received)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError(f"{name} not in /metrics")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Result:
    connections: int
    blocks: int
    rss_base_kib: int
    rss_open_kib: int
    rss_subscribed_kib: int
    delays_ms: list[float]
    missing: int
    fanout_mean_ms: float

    @property
    def per_connection_kib(self) -> float:
        return (self.rss_subscribed_kib - self.rss_base_kib) / self.connections

    @property
    def per_open_kib(self) -> float:
        return (self.rss_open_kib - self.rss_base_kib) / self.connections


def run(connections: int, blocks: int, interval: float, workdir: Path) -> Result:
    with AnvilProcess() as node:
        auth = procs.Auth.fresh(workdir / "keys.db")
        server = procs.ChaingateServer(
            workdir, "chaingate", node.url, access_log=True, coalesce=True, auth=auth
        )
        with server.config_path.open("a") as config:
            config.write(EXTRA_TOML)
        key = server.create_key()
        try:
            server.start()  # inside: a server that never got ready is stopped too
            return measure(server, node, key, connections, blocks, interval)
        finally:
            server.stop()


def measure(
    server: procs.ChaingateServer,
    node: AnvilProcess,
    key: str,
    connections: int,
    blocks: int,
    interval: float,
) -> Result:
    pid = server.process.pid
    assert pid is not None
    path = f"/v1/ws/ethereum/devnet?apiKey={key}"
    # Warm up: the first session loads code and fills caches that are not per connection.
    warm = connect(server.port, path)
    subscribe(warm)
    warm.sock.close()
    time.sleep(1.0)
    base = rss_kib(pid)
    clients = [connect(server.port, path) for _ in range(connections)]
    time.sleep(1.0)
    opened = rss_kib(pid)
    for client in clients:
        subscribe(client)
    time.sleep(1.0)
    subscribed = rss_kib(pid)
    selector = selectors.DefaultSelector()
    for client in clients:
        client.sock.setblocking(False)
        selector.register(client.sock, selectors.EVENT_READ, client)
    drain(selector, time.monotonic() + 0.5)  # anything already on its way
    delays: list[float] = []
    missing = 0
    for _ in range(blocks):
        rpc_call(node.url, "evm_mine")
        number = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
        deadline = time.monotonic() + max(interval, 5.0)
        while time.monotonic() < deadline:
            drain(selector, min(deadline, time.monotonic() + 0.05))
            if all(number in c.heads or c.closed for c in clients):
                break
        text = server.metrics()
        if int(metric(text, "chaingate_ws_head_number")) != number:
            raise RuntimeError(f"the hub's newest head is not block {number}")
        arrival = metric(text, "chaingate_ws_head_arrival_seconds")
        for client in clients:
            at = client.heads.get(number)
            if at is None:
                missing += 1
            else:
                delays.append((at - arrival) * 1000)
        drain(selector, time.monotonic() + max(0.0, interval - 0.2))
    text = server.metrics()
    fanouts = metric(text, "chaingate_ws_fanout_total")
    fanout_ms = metric(text, "chaingate_ws_fanout_seconds_sum") / fanouts * 1000 if fanouts else 0
    for client in clients:
        client.sock.close()
    return Result(connections, blocks, base, opened, subscribed, delays, missing, fanout_ms)


def report(result: Result) -> str:
    d = result.delays_ms
    p50, p99 = percentile(d, 0.50), percentile(d, 0.99)
    lines = [
        f"## WebSocket fan-out: {result.connections:,} newHeads subscribers, "
        f"{result.blocks} blocks\n",
        "| measure | value | target |",
        "|---|---:|---:|",
        f"| delivery delay p50 (hub arrival -> client recv) | {p50:.1f} ms | |",
        f"| delivery delay p99 | {p99:.1f} ms | <= {P99_TARGET_MS:.0f} ms |",
        f"| delivery delay max | {max(d):.1f} ms | |",
        f"| chaingate fan-out per block (mean, in process) | {result.fanout_mean_ms:.1f} ms | |",
        f"| pushes lost | {result.missing} | 0 |",
        f"| RSS per open connection (no subscription) | {result.per_open_kib:.1f} KiB | |",
        f"| RSS per idle subscribed connection | {result.per_connection_kib:.1f} KiB "
        f"| <= {MEMORY_TARGET_KIB:.0f} KiB |",
        f"| RSS before / open / subscribed | {result.rss_base_kib / 1024:.1f} / "
        f"{result.rss_open_kib / 1024:.1f} / {result.rss_subscribed_kib / 1024:.1f} MiB | |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between blocks")
    parser.add_argument("--smoke", action="store_true", help="50 connections, 3 blocks")
    args = parser.parse_args(argv)
    if args.smoke:
        args.connections, args.blocks, args.interval = 50, 3, 0.5
    with tempfile.TemporaryDirectory(prefix="cg-ws-bench-") as tmp:
        try:
            result = run(args.connections, args.blocks, args.interval, Path(tmp))
        except procs.ServerFailed as exc:
            print(f"server failed: {exc}", file=sys.stderr)
            return 2
    print(report(result))
    ok = (
        result.missing == 0
        and percentile(result.delays_ms, 0.99) <= P99_TARGET_MS
        and result.per_connection_kib <= MEMORY_TARGET_KIB
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
