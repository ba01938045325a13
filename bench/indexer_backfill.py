"""Indexer backfill throughput: logs/s into PostgreSQL and into SQLite, against a raw fetch.

    python bench/indexer_backfill.py [--logs 100000] [--per-tx 500] [--gap 50]
                                     [--holders distinct|N] [--pg-url URL] [--smoke]
                                     [--baseline OTHER/src] [--keep-node | --node URL,TOKEN]

Builds a devnet (the same bootstrap as ``chaingate dev``) on a fresh anvil, then makes
history: ``--logs`` ERC-20 Transfer logs from airdrops of ``--per-tx`` recipients each, with
``--gap`` empty blocks after every airdrop.  Recipients are all distinct by default (every
transfer creates a holder: the balance table grows with the logs — the hard case), or cycle
through ``--holders N`` addresses.  Then, in the same run and against the same node:

* **reference** — the least work that reads the same data: one keep-alive connection,
  ``eth_getLogs`` over 2,000-block ranges and the headers in JSON-RPC batches of 100, decoded
  with msgspec and thrown away (what any indexer must at least do);
* **chaingate → PostgreSQL** and **chaingate → SQLite** — a real Gateway (follower and indexer,
  nothing else: the follower waits for its slowest consumer, so the webhook matcher and the
  wallet and bundler trackers are off unless ``--all-consumers``) backfilling from block 0
  into a fresh store until the index's cursor is the head: decoding, balances, holders,
  supplies, every transfer row, committed in batches.

``--baseline OTHER/src`` (a worktree of another commit, e.g. ``git worktree add /tmp/before
main``) indexes the same history into each store a second time, in a subprocess importing
chaingate from that tree: before/after against the same node, in the same run.

Making the history is most of a run (anvil slows down as its state grows: ~16 minutes for
100,000 logs to distinct holders): ``--keep-node`` makes it, prints ``--node URL,TOKEN`` and
keeps the node until interrupted; runs given that ``--node`` (and the same ``--logs``) only
measure.

Prints seconds, logs/s and transfers/s for each, and each one's throughput as a ratio to the
reference (reference seconds / its seconds): both share the node, the machine and the moment.
The index is checked at the end (transfer rows and holder count).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import trio

try:
    from chaingate.data.store import IndexRows
except ImportError:  # a --baseline tree from before the store split
    IndexRows = None  # type: ignore[assignment,misc]
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from chaingate.gateway import Gateway

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.latency import LatencyRelay
from follower_backfill import Counts, backfill_settings, reference

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


class Result(msgspec.Struct):
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    logs: int = 0
    transfers: int = 0
    holders: int = 0
    rows: int = 0


def make_history(
    url: str, token: str, sender: str, logs: int, per_tx: int, gap: int, holders: int
) -> None:
    for sent in range(0, logs, per_tx):
        count = min(per_tx, logs - sent)
        if holders:
            recipients = [f"0x{(sent + i) % holders + 1:040x}" for i in range(count)]
        else:
            recipients = [f"0x{sent + i + 1:040x}" for i in range(count)]
        call = "0x" + abi.encode_call("airdrop(address[],uint256)", recipients, 1).hex()
        tx = {"from": sender, "to": token, "data": call, "gas": hex(40_000 * count + 100_000)}
        rpc_call(url, "eth_sendTransaction", [tx], timeout=600)
        if gap:
            rpc_call(url, "anvil_mine", [hex(gap)], timeout=600)


async def index(
    url: str,
    head: int,
    store_url: str,
    data_dir: str,
    token: str,
    limit: float,
    indexer_settings: dict[str, Any] | None = None,
    others: bool = False,
) -> Result:
    # Only the follower and its indexer: the follower waits for its slowest consumer, so the
    # webhook matcher, the wallet and bundler trackers (off unless --all-consumers) would
    # measure themselves; no gas oracle either (its stream is closed, so the follower drops
    # it instead of waiting for it).
    settings = backfill_settings(
        url, data_dir, store_url=store_url, indexer=indexer_settings, others=others
    )
    gateway = Gateway(settings, access_stream=io.BytesIO())
    gas = getattr(gateway, "gas", None)  # a baseline tree from before the service objects
    streams = gas.streams if gas is not None else gateway._gas_streams  # type: ignore[attr-defined]
    for stream in streams.values():
        stream.close()
    gateway.gas.oracles.clear()
    assert gateway.data is not None
    # Found by its text: a baseline tree keys its indexers by text, this one by Network.
    indexer = next(ix for key, ix in gateway.data.indexers.items() if key == "ethereum/devnet")
    result = Result()
    async with trio.open_nursery() as nursery:
        started, cpu = time.perf_counter(), time.process_time()
        await nursery.start(gateway.run)
        with trio.fail_after(limit):
            while indexer.cursor is None or indexer.cursor.number < head:  # noqa: ASYNC110
                await trio.sleep(0.01)
        result.seconds = time.perf_counter() - started
        result.cpu_seconds = time.process_time() - cpu
        result.logs = indexer.stats["logs"]
        result.transfers = indexer.stats["transfers"]
        assert gateway.store is not None
        rows: Any = IndexRows(gateway.store) if IndexRows is not None else gateway.store
        contract = await rows.index_contract("ethereum", "devnet", token.lower())
        result.holders = contract[1].holders if contract[1] is not None else -1

        def count(tx: Any) -> int:
            return int(tx.query("SELECT COUNT(*) FROM idx_transfers")[0][0])

        result.rows = await gateway.store.run_transaction(count, write=False)
        nursery.cancel_scope.cancel()
    return result


def pg_schema(pg_url: str) -> tuple[str, str] | None:
    """A fresh schema and the URL that uses it; None when PostgreSQL is not reachable."""
    import psycopg

    schema = f"cg_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.Error as exc:
        print(f"PostgreSQL not reachable ({exc}); skipping it", file=sys.stderr)
        return None
    joiner = "&" if "?" in pg_url else "?"
    return schema, f"{pg_url}{joiner}options={quote(f'-c search_path={schema}')}"


def drop_schema(pg_url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=100_000)
    parser.add_argument("--per-tx", type=int, default=500)
    parser.add_argument("--gap", type=int, default=50, help="empty blocks after each airdrop")
    parser.add_argument(
        "--holders", default="distinct", help="'distinct' or how many recipients to cycle"
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--batch-blocks", type=int, default=0, help="indexer setting (0: default)")
    parser.add_argument("--batch-transfers", type=int, default=0, help="indexer setting")
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="index runs per store")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per store, seconds")
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks the harness")
    parser.add_argument("--baseline", help="another tree's src/: indexed again from it")
    parser.add_argument(
        "--keep-node", action="store_true", help="make the history, print --node, wait"
    )
    parser.add_argument("--node", help="URL,TOKEN of a node --keep-node left running")
    parser.add_argument(
        "--all-consumers",
        action="store_true",
        help="keep the webhook matcher and the wallet and bundler trackers on",
    )
    parser.add_argument(
        "--node-latency",
        type=float,
        default=0.0,
        help="ms added to every request to the node (a relay: a node far away)",
    )
    parser.add_argument("--index-one", help=argparse.SUPPRESS)  # a baseline's subprocess
    args = parser.parse_args(argv)
    if args.index_one:
        job = json.loads(args.index_one)
        print(msgspec.json.encode(trio.run(index, *job)).decode())
        return 0
    if args.smoke:
        args.logs, args.per_tx, args.gap, args.timeout = 1_000, 100, 20, 120.0
    holders = 0 if args.holders == "distinct" else int(args.holders)
    batch = {
        k: v
        for k, v in (("batch_blocks", args.batch_blocks), ("batch_transfers", args.batch_transfers))
        if v
    }
    if args.node:
        # A node that already holds the history (--keep-node): measure only.
        url, token = args.node.split(",")
        with tempfile.TemporaryDirectory() as tmp:
            return measure(args, url, token, tmp, holders, batch)
    with (
        AnvilProcess(extra=["--gas-limit", "100000000"]) as node,
        tempfile.TemporaryDirectory() as tmp,
    ):
        manifest = bootstrap_devnet(
            node.url, paymaster_signer="0x" + "5a" * 20, cache_dir=None, announce=_quiet
        )
        token = manifest.contracts["erc20_cgt"].address
        print(f"making history: {args.logs:,} Transfer logs ...", file=sys.stderr)
        made = time.perf_counter()
        make_history(node.url, token, manifest.deployer, args.logs, args.per_tx, args.gap, holders)
        head = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
        print(f"  {head:,} blocks in {time.perf_counter() - made:.1f}s", file=sys.stderr)
        if args.keep_node:
            # Making 100,000 logs of history takes minutes: keep the node for later runs.
            print(f"--node {node.url},{token}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
            return 0
        return measure(args, node.url, token, tmp, holders, batch)


def measure(
    args: argparse.Namespace, url: str, token: str, tmp: str, holders: int, batch: dict[str, Any]
) -> int:
    head = int(str(rpc_call(url, "eth_blockNumber")), 16)
    with contextlib.ExitStack() as stack:
        if args.node_latency:
            # Every reader talks to the node through the same delaying relay: a node far away.
            url = stack.enter_context(LatencyRelay(url, args.node_latency)).url
        ref: Counts = reference(url, head)
        runs: list[tuple[str, Result]] = []
        for _ in range(args.repeat):
            runs += index_all(args, url, head, token, tmp, batch)
    return print_report(args, head, holders, ref, runs)


def index_all(
    args: argparse.Namespace, url: str, head: int, token: str, tmp: str, batch: dict[str, Any]
) -> list[tuple[str, Result]]:
    """One indexing run into each store, each from scratch (and one from the baseline)."""
    runs: list[tuple[str, Result]] = []
    others = args.all_consumers
    trees: list[tuple[str, str | None]] = [("", None)]
    if args.baseline:
        trees.insert(0, (" (baseline)", args.baseline))
    for suffix, src in trees:
        tag = secrets.token_hex(3)
        if not args.no_pg:
            found = pg_schema(args.pg_url)
            if found is not None:
                schema, pg_url = found
                job = [url, head, pg_url, f"{tmp}/pg-{tag}", token, args.timeout, batch, others]
                try:
                    runs.append((f"PostgreSQL{suffix}", index_with(src, job)))
                finally:
                    drop_schema(args.pg_url, schema)
        if not args.no_sqlite:
            sqlite_url = f"sqlite://{tmp}/index-{tag}.db"
            job = [url, head, sqlite_url, f"{tmp}/sq-{tag}", token, args.timeout, batch, others]
            runs.append((f"SQLite{suffix}", index_with(src, job)))
    return runs


def index_with(src: str | None, job: list[Any]) -> Result:
    """``index(*job)`` here, or in a subprocess importing chaingate from ``src``."""
    if src is None:
        return trio.run(index, *job)
    done = subprocess.run(
        [sys.executable, __file__, "--index-one", json.dumps(job)],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        check=True,
        timeout=float(job[5]) + 120,
    )
    return msgspec.json.decode(done.stdout.splitlines()[-1], type=Result)


def print_report(
    args: argparse.Namespace,
    head: int,
    holders: int,
    ref: Counts,
    runs: list[tuple[str, Result]],
) -> int:
    """The table; 2 when a run's index does not hold what the history made."""
    print("\n## Indexer backfill (blocks 0..head into a fresh store, one anvil, same run)\n")
    delay = args.node_latency
    away = f", every request to the node delayed {delay:g} ms" if delay else ""
    print(f"history: {head + 1:,} blocks, {ref.logs:,} logs{away}\n")
    print("| reader | seconds | logs/s | transfers/s | CPU s | vs reference |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| reference (raw fetch) | {ref.seconds:.2f} | {rate(ref.logs, ref.seconds)} | - |"
        f" {ref.cpu_seconds:.2f} | 1.00 |"
    )
    status = 0
    airdropped = args.logs
    for name, r in runs:
        ratio = ref.seconds / r.seconds if r.seconds else 0.0
        print(
            f"| chaingate → {name} | {r.seconds:.2f} | {rate(r.logs, r.seconds)} |"
            f" {rate(r.transfers, r.seconds)} | {r.cpu_seconds:.2f} | {ratio:.2f} |"
        )
        if r.logs != ref.logs or r.rows < airdropped:
            print(f"MISMATCH ({name}): {r.logs} logs, {r.rows} transfer rows", file=sys.stderr)
            status = 2
        expected_holders = (holders or airdropped) + 1  # + the deployer
        if r.holders < min(expected_holders, airdropped):
            print(f"MISMATCH ({name}): {r.holders} holders", file=sys.stderr)
            status = 2
    return status


def _quiet(message: str) -> None:
    print(message, file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
