"""Chain follower backfill throughput: blocks/s and logs/s, against a raw fetch of the same data.

    python bench/follower_backfill.py [--logs 100000] [--per-tx 500] [--gap 50] [--smoke]

Builds a devnet (``chaingate.devnet``: the same bootstrap as ``chaingate dev``) on a fresh
anvil, then makes history: ``--logs`` ERC-20 Transfer logs from airdrops of ``--per-tx``
recipients each, with ``--gap`` empty blocks mined after every airdrop.  Then, in the same
run and against the same node:

* **reference** — the least work that reads the same data: one keep-alive connection,
  ``eth_getLogs`` over 2,000-block ranges and the headers in JSON-RPC batches of 100, decoded
  with msgspec and thrown away;
* **chaingate** — the real follower inside a Gateway (SQLite store, one consumer draining
  its event stream) backfilling from block 0 until it reaches the head.

Prints both rates, the follower's CPU per block and the ratio.  The ratio is the number to
read: both sides share the same node, machine and moment.
"""

from __future__ import annotations

import argparse
import http.client
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import trio

from chaingate import config
from chaingate.chain.events import Apply
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from chaingate.gateway import Gateway

RANGE = 2000
HEADER_BATCH = 100


class Counts(msgspec.Struct):
    blocks: int = 0
    logs: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def make_history(url: str, token: str, sender: str, logs: int, per_tx: int, gap: int) -> None:
    recipients = [f"0x{i + 1:040x}" for i in range(per_tx)]
    data = "0x" + abi.encode_call("airdrop(address[],uint256)", recipients, 1).hex()
    for sent in range(0, logs, per_tx):
        count = min(per_tx, logs - sent)
        call = data
        if count != per_tx:
            call = "0x" + abi.encode_call("airdrop(address[],uint256)", recipients[:count], 1).hex()
        tx = {"from": sender, "to": token, "data": call, "gas": hex(30_000 * count + 100_000)}
        rpc_call(url, "eth_sendTransaction", [tx], timeout=60)
        if gap:
            rpc_call(url, "anvil_mine", [hex(gap)])


class RawFetcher:
    """JSON-RPC over one keep-alive connection: the reference's whole transport."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
        self.next_id = 1

    def post(self, payload: Any) -> Any:
        body = msgspec.json.encode(payload)
        self.conn.request("POST", "/", body, {"Content-Type": "application/json"})
        return msgspec.json.decode(self.conn.getresponse().read())

    def call(self, method: str, params: list[Any]) -> Any:
        self.next_id += 1
        return self.post(
            {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        )["result"]

    def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        payload = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)
        ]
        replies = self.post(payload)
        return [r["result"] for r in sorted(replies, key=lambda r: r["id"])]


def reference(url: str, head: int) -> Counts:
    fetch = RawFetcher(url)
    counts = Counts()
    started, cpu = time.perf_counter(), time.process_time()
    for first in range(0, head + 1, RANGE):
        last = min(head, first + RANGE - 1)
        counts.logs += len(
            fetch.call("eth_getLogs", [{"fromBlock": hex(first), "toBlock": hex(last)}])
        )
        for start in range(first, last + 1, HEADER_BATCH):
            numbers = range(start, min(last, start + HEADER_BATCH - 1) + 1)
            counts.blocks += len(
                fetch.batch([("eth_getBlockByNumber", [hex(n), False]) for n in numbers])
            )
    counts.seconds = time.perf_counter() - started
    counts.cpu_seconds = time.process_time() - cpu
    return counts


def backfill_settings(
    url: str,
    data_dir: str,
    *,
    store_url: str | None = None,
    indexer: dict[str, Any] | None = None,
    others: bool = True,
) -> config.Settings:
    """A gateway following the devnet at ``url`` from block 0 (no keys, no access log);
    ``others=False``: without the follower's other consumers (webhooks, wallets, bundler)."""
    mapping: dict[str, Any] = {
        "server": {"port": 0},
        "auth": {"enabled": False},
        "observability": {"access_log": False},
        "data_dir": data_dir,
        "chains": {
            "ethereum": {
                "devnet": {
                    "chain_id": 31337,
                    "testnet": True,
                    "finality_depth": 2,
                    "upstreams": [{"url": url, "name": "anvil"}],
                    "follower": {"start_block": 0, "max_log_range": RANGE},
                    "indexer": indexer or {},
                }
            }
        },
    }
    if store_url is not None:
        mapping["store"] = {"url": store_url}
    if not others:
        mapping["webhooks"] = {"enabled": False}
        devnet = mapping["chains"]["ethereum"]["devnet"]
        devnet["wallets"] = {"enabled": False}
        devnet["bundler"] = {"enabled": False}
    return config.from_mapping(mapping, environ={})


async def follow(url: str, head: int, data_dir: str) -> Counts:
    # The follower alone: the token indexer (on by default) would share its CPU.
    settings = backfill_settings(url, data_dir, indexer={"enabled": False})
    gateway = Gateway(settings, access_stream=io.BytesIO())
    # Found by its text: a baseline tree keys its followers by text, this one by Network.
    follower = next(f for key, f in gateway.chain.followers.items() if key == "ethereum/devnet")
    events = follower.subscribe("bench")
    counts = Counts()
    done = trio.Event()

    async def consume() -> None:
        async for event in events:
            if isinstance(event, Apply):
                counts.blocks += 1
                counts.logs += len(event.block.logs)
                if event.block.header.number >= head:
                    done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        started, cpu = time.perf_counter(), time.process_time()
        await nursery.start(gateway.run)
        await done.wait()
        counts.seconds = time.perf_counter() - started
        counts.cpu_seconds = time.process_time() - cpu
        nursery.cancel_scope.cancel()
    return counts


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=100_000)
    parser.add_argument("--per-tx", type=int, default=500)
    parser.add_argument("--gap", type=int, default=50, help="empty blocks after each airdrop")
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks the harness")
    args = parser.parse_args(argv)
    if args.smoke:
        args.logs, args.per_tx, args.gap = 1_000, 100, 20
    with (
        AnvilProcess(extra=["--gas-limit", "100000000"]) as node,
        tempfile.TemporaryDirectory() as tmp,
    ):
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=manifest_signer(), cache_dir=None, announce=_quiet
        )
        token = manifest.contracts["erc20_cgt"].address
        print(f"making history: {args.logs:,} Transfer logs ...", file=sys.stderr)
        made = time.perf_counter()
        make_history(node.url, token, manifest.deployer, args.logs, args.per_tx, args.gap)
        head = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
        print(f"  {head:,} blocks in {time.perf_counter() - made:.1f}s", file=sys.stderr)
        ref = reference(node.url, head)
        ours = trio.run(follow, node.url, head, str(Path(tmp) / "data"))
    print("\n## Follower backfill (blocks 0..head, one anvil, same run)\n")
    print(f"history: {head + 1:,} blocks, {ref.logs:,} logs\n")
    print("| reader | seconds | blocks/s | logs/s | CPU µs/block |")
    print("|---|---:|---:|---:|---:|")
    for name, c in (("reference (raw fetch)", ref), ("chaingate follower", ours)):
        cpu = c.cpu_seconds / c.blocks * 1e6 if c.blocks else 0.0
        print(
            f"| {name} | {c.seconds:.2f} | {rate(c.blocks, c.seconds)} | "
            f"{rate(c.logs, c.seconds)} | {cpu:.0f} |"
        )
    if ours.seconds > 0:
        print(f"\nchaingate / reference throughput: {ref.seconds / ours.seconds:.2f}")
    if ours.logs != ref.logs or ours.blocks != head + 1:
        print(f"MISMATCH: follower saw {ours.blocks} blocks, {ours.logs} logs", file=sys.stderr)
        return 2
    return 0


def manifest_signer() -> str:
    # Any address will do for a benchmark: nothing here signs for the paymaster.
    return "0x" + "5a" * 20


def _quiet(message: str) -> None:
    print(message, file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
