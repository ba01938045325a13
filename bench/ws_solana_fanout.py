"""Solana WebSocket fan-out: N ``slotSubscribe`` clients on one chaingate process.

    python bench/ws_solana_fanout.py [--connections 1000] [--seconds 30] [--slot 0.4] [--smoke]

Starts the devnet's Solana node (LiteSVM, its slot clock at ``--slot`` seconds) in a process of
its own and one ``chaingate serve`` process in front of it (API keys on, one unlimited
enterprise key, ``solana/devnet`` with the node's PubSub as ``ws_url``), then, from this
process, N raw WebSocket clients through chaingate each ``slotSubscribe`` (all sharing one
upstream subscription — checked on ``/metrics``), plus one **reference** client connected to
the node's PubSub directly.

For every slot the reference client hears during ``--seconds``: each chaingate client's
receive time minus the reference client's (same loop, same clock) is the **push delay
chaingate adds** (its upstream read, the fan-out to N sockets, the kernel; and this client's
own loop over N sockets, so it errs on the slow side); a slot a client never got is **lost**.
Prints a markdown report; exit status 1 when a target is missed, 2 when a server failed.
Targets: p99 delay <= 50 ms, 0 lost.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

from benchkit import procs  # noqa: E402
from benchkit import wsfanout as ws  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402

P99_TARGET_MS = 50.0

# The node, in a process of its own: its URLs on the first line of stdout.
NODE_SCRIPT = """
import json, sys, time, trio
from functools import partial
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.server import serve

async def main():
    ledger = Ledger(genesis_time=time.time())
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(partial(serve, ledger, slot_seconds=float(sys.argv[1])))
        print(json.dumps({"http": urls.http, "ws": urls.ws}), flush=True)

trio.run(main)
"""

SOLANA_TOML = """
[chains.solana.devnet]
family = "solana"
testnet = true
finality_depth = 32

[[chains.solana.devnet.upstreams]]
name = "devnet-solana"
url = "{http}"
ws_url = "{ws}"

[ws]
ping_interval = 30.0
"""

SLOT_KEY = b'"slot":'

# --http-load: keep-alive HTTP clients in a process of their own, each sending eth_chainId
# through chaingate one after the other for as long as it runs (argv: port, key, clients).
HTTP_LOAD_SCRIPT = """
import selectors, socket, sys
port, key, clients = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}'
request = (
    b"POST /v1/rpc/ethereum/devnet HTTP/1.1\\r\\nHost: bench\\r\\nX-API-Key: " + key.encode()
    + b"\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body)
    + body
)
selector = selectors.DefaultSelector()
for _ in range(clients):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(request)
    selector.register(sock, selectors.EVENT_READ)
while True:
    for ready, _ in selector.select():
        data = ready.fileobj.recv(65536)
        if not data:
            sys.exit(1)
        for _ in range(data.count(b"HTTP/1.1 ")):  # one new request per answer
            ready.fileobj.sendall(request)
"""


def slot_of(payload: bytes) -> int | None:
    """The slot of a slotNotification, without decoding the JSON (this loop reads N sockets
    one after the other: its own cost per message delays the last ones)."""
    if b'"method":"slotNotification"' not in payload[:64]:
        return None
    start = payload.find(SLOT_KEY)
    if start < 0:
        return None
    start += len(SLOT_KEY)
    end = start
    while payload[end : end + 1].isdigit():
        end += 1
    return int(payload[start:end])


def subscribe(client: ws.WsClient) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "slotSubscribe"}
    client.sock.sendall(ws.masked_frame(json.dumps(call).encode()))
    while True:
        for opcode, payload in client.frames():
            if opcode == 0x1:
                message = json.loads(payload)
                if message.get("id") == 1:
                    if "result" not in message:
                        raise RuntimeError(f"slotSubscribe refused: {message}")
                    return
        chunk = client.sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed while subscribing")
        client.buffer += chunk


@dataclass
class Result:
    connections: int
    slots: int
    delays_ms: list[float]
    lost: int
    upstream_subscriptions: float
    closed: int
    fanout_mean_ms: float
    http_load: int = 0  # keep-alive HTTP clients loading chaingate meanwhile


def run(connections: int, seconds: float, slot: float, workdir: Path, http_load: int = 0) -> Result:
    node = subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, str(slot)],
        stdout=subprocess.PIPE,
        env=procs._child_env(),
    )
    try:
        assert node.stdout is not None
        urls = json.loads(node.stdout.readline())
        with AnvilProcess() as anvil:  # the bench server's ethereum/devnet (its readiness probe)
            return serve_and_measure(anvil, urls, connections, seconds, workdir, http_load)
    finally:
        node.terminate()
        node.wait(10)


def serve_and_measure(
    anvil: AnvilProcess,
    urls: dict[str, str],
    connections: int,
    seconds: float,
    workdir: Path,
    http_load: int = 0,
) -> Result:
    with ws.serving(workdir, anvil.url, SOLANA_TOML.format(**urls)) as (server, key):
        return measure(server, urls["ws"], key, connections, seconds, http_load)


def measure(
    server: procs.ChaingateServer,
    node_ws: str,
    key: str,
    connections: int,
    seconds: float,
    http_load: int = 0,
) -> Result:
    path = f"/v1/ws/solana/devnet?apiKey={key}"
    clients = [ws.connect(server.port, path) for _ in range(connections)]
    for client in clients:
        subscribe(client)
    port = node_ws.rsplit(":", 1)[1]
    reference = ws.connect(int(port), "/")
    subscribe(reference)
    upstream = ws.metric(server.metrics(), "chaingate_ws_solana_upstream_subscriptions")
    selector = ws.listen([reference, *clients])
    load = None
    if http_load:
        load = subprocess.Popen(
            [sys.executable, "-c", HTTP_LOAD_SCRIPT, str(server.port), key, str(http_load)],
            env=procs._child_env(),
        )
    try:
        ws.drain(
            selector, time.monotonic() + 1.0, slot_of
        )  # the first slots: everyone is listening
        start = max(reference.heads, default=0) + 1
        ws.drain(selector, time.monotonic() + seconds, slot_of)
        end = max(reference.heads, default=0) - 2  # the last ones may still be on their way
    finally:
        if load is not None:
            load.terminate()
            load.wait(10)
    ws.drain(selector, time.monotonic() + 1.0, slot_of)
    slots = [s for s in sorted(reference.heads) if start <= s <= end]
    found, lost = ws.delays(reference.heads, slots, clients)
    closed = sum(client.closed for client in clients)
    text = server.metrics()
    if http_load and not _http_answered(text):
        raise RuntimeError("--http-load: chaingate answered no HTTP request")
    fanout_ms = ws.fanout_mean_ms(text, "chaingate_ws_solana_fanout")
    for client in [reference, *clients]:
        client.sock.close()
    return Result(connections, len(slots), found, lost, upstream, closed, fanout_ms, http_load)


def _http_answered(metrics_text: str) -> bool:
    """Whether any RPC request got a 200 (the HTTP load ran)."""
    return any(
        line.startswith("chaingate_http_requests_total{")
        and 'status="200"' in line
        and "rpc" in line
        and float(line.rsplit(" ", 1)[1]) > 0
        for line in metrics_text.splitlines()
    )


def report(result: Result) -> str:
    d = result.delays_ms or [0.0]
    lines = [
        f"## Solana WebSocket fan-out: {result.connections:,} slotSubscribe clients, "
        f"{result.slots} slots"
        + (f", {result.http_load} HTTP clients loading it meanwhile" if result.http_load else "")
        + "\n",
        *ws.TABLE_HEAD,
        *ws.delay_rows("push", "node-direct client -> chaingate client", d, P99_TARGET_MS),
        f"| chaingate fan-out per slot (mean, in process) | {result.fanout_mean_ms:.1f} ms | |",
        f"| notifications lost | {result.lost} | 0 |",
        f"| upstream subscriptions for {result.connections:,} clients | "
        f"{result.upstream_subscriptions:.0f} | 1 |",
        f"| connections closed by chaingate | {result.closed} | 0 |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--slot", type=float, default=0.4, help="the node's slot time")
    parser.add_argument("--smoke", action="store_true", help="50 connections, 3 seconds")
    parser.add_argument(
        "--http-load",
        type=int,
        default=0,
        metavar="N",
        help="N keep-alive HTTP clients sending eth_chainId through chaingate meanwhile "
        "(the fan-out beside HTTP traffic and its access log)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.connections, args.seconds = 50, 3.0
    result = ws.run_in_tmp(
        "cg-ws-solana-bench-",
        lambda tmp: run(args.connections, args.seconds, args.slot, tmp, args.http_load),
    )
    if result is None:
        return 2
    print(report(result))
    ok = (
        result.lost == 0
        and result.closed == 0
        and result.upstream_subscriptions == 1
        and ws.percentile(result.delays_ms or [0.0], 0.99) <= P99_TARGET_MS
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
