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
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

from benchkit import procs  # noqa: E402
from benchkit import wsfanout as ws  # noqa: E402
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


def subscribe(client: ws.WsClient) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]}
    client.sock.sendall(ws.masked_frame(json.dumps(call).encode()))
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
    with AnvilProcess() as node, ws.serving(workdir, node.url, EXTRA_TOML) as (server, key):
        return measure(server, node, key, connections, blocks, interval)


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
    warm = ws.connect(server.port, path)
    subscribe(warm)
    warm.sock.close()
    time.sleep(1.0)
    base = rss_kib(pid)
    clients = [ws.connect(server.port, path) for _ in range(connections)]
    time.sleep(1.0)
    opened = rss_kib(pid)
    for client in clients:
        subscribe(client)
    time.sleep(1.0)
    subscribed = rss_kib(pid)
    selector = ws.listen(clients)
    ws.drain(selector, time.monotonic() + 0.5, head_number)  # anything already on its way
    found: list[float] = []
    missing = 0
    for _ in range(blocks):
        rpc_call(node.url, "evm_mine")
        number = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
        deadline = time.monotonic() + max(interval, 5.0)
        while time.monotonic() < deadline:
            ws.drain(selector, min(deadline, time.monotonic() + 0.05), head_number)
            if all(number in c.heads or c.closed for c in clients):
                break
        text = server.metrics()
        if int(ws.metric(text, "chaingate_ws_head_number")) != number:
            raise RuntimeError(f"the hub's newest head is not block {number}")
        arrival = ws.metric(text, "chaingate_ws_head_arrival_seconds")
        block_delays, block_missing = ws.delays({number: arrival}, [number], clients)
        found += block_delays
        missing += block_missing
        ws.drain(selector, time.monotonic() + max(0.0, interval - 0.2), head_number)
    fanout_ms = ws.fanout_mean_ms(server.metrics(), "chaingate_ws_fanout")
    for client in clients:
        client.sock.close()
    return Result(connections, blocks, base, opened, subscribed, found, missing, fanout_ms)


def report(result: Result) -> str:
    lines = [
        f"## WebSocket fan-out: {result.connections:,} newHeads subscribers, "
        f"{result.blocks} blocks\n",
        *ws.TABLE_HEAD,
        *ws.delay_rows("delivery", "hub arrival -> client recv", result.delays_ms, P99_TARGET_MS),
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
    result = ws.run_in_tmp(
        "cg-ws-bench-", lambda tmp: run(args.connections, args.blocks, args.interval, tmp)
    )
    if result is None:
        return 2
    print(report(result))
    ok = (
        result.missing == 0
        and ws.percentile(result.delays_ms, 0.99) <= P99_TARGET_MS
        and result.per_connection_kib <= MEMORY_TARGET_KIB
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
