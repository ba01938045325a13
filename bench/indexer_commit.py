"""The index's store writes alone: ``commit_index`` on synthetic blocks, per statement.

    python bench/indexer_commit.py [--logs 100000] [--per-block 500] [--gap 50]
                                   [--batch-transfers 20000] [--store both|postgresql|sqlite]
                                   [--explain MS] [--pg-url URL]

No node, no follower, no decoding: blocks shaped like ``bench/indexer_backfill.py``'s history
(one airdrop of ``--per-block`` ERC-20 transfers to distinct new holders, then ``--gap`` empty
blocks) are committed in batches the way the indexer batches them, into a fresh store.  For
each store it prints the transfers/s of the commits, the process CPU they took, and where the
wall time went: each statement (by its first words) and each COPY, summed over the run, and
the rest ("python": building rows, the ledger's plan).  ``--explain MS`` (PostgreSQL) loads
``auto_explain`` in the session and prints the plan, with ``ANALYZE`` and ``BUFFERS``, of
every statement of the last batch that took longer than MS milliseconds (superuser only).
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
import trio

from chaingate.data.store import IndexCursor, IndexRows
from chaingate.data.transfers import ZERO_ADDRESS, DecodedBlock, Transfer
from chaingate.store import open_store
from chaingate.store.base import Store, Tx
from chaingate.store.tx import copying

T = TypeVar("T")

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
TOKEN = "0x" + "11" * 20
DEPLOYER = "0x" + "de" * 20


def history(logs: int, per_block: int, gap: int) -> list[DecodedBlock]:
    blocks: list[DecodedBlock] = []
    number = 0
    sent = 0
    parent = "0x" + "00" * 32

    def add(transfers: list[Transfer]) -> None:
        nonlocal number, parent
        block_hash = f"0x{number:064x}"
        blocks.append(
            DecodedBlock(
                number, block_hash, parent, 1_700_000_000 + number, transfers, [], len(transfers), 0
            )
        )
        parent = block_hash
        number += 1

    # The deployer's mint first, as on the devnet.
    add(
        [
            Transfer(
                0, 0, "0x" + "aa" * 32, 0, 0, "ERC20", TOKEN, ZERO_ADDRESS, DEPLOYER, None, 10**30
            )
        ]
    )
    while sent < logs:
        count = min(per_block, logs - sent)
        tx = f"0x{number:064x}"
        add(
            [
                Transfer(
                    number, i, tx, 0, i, "ERC20", TOKEN, DEPLOYER, f"0x{sent + i + 1:040x}", None, 1
                )
                for i in range(count)
            ]
        )
        sent += count
        for _ in range(gap):
            add([])
    return blocks


def batches(
    blocks: list[DecodedBlock], batch_blocks: int, batch_transfers: int
) -> Iterator[list[DecodedBlock]]:
    batch: list[DecodedBlock] = []
    transfers = 0
    for b in blocks:
        batch.append(b)
        transfers += len(b.transfers)
        if len(batch) >= batch_blocks or transfers >= batch_transfers:
            yield batch
            batch, transfers = [], 0
    if batch:
        yield batch


_WORDS = re.compile(r"\s+")


_TARGET = re.compile(r"(?:INSERT INTO|UPDATE|DELETE FROM) (\w+)")


def label(sql: str) -> str:
    text = _WORDS.sub(" ", sql).strip()
    if text.startswith("WITH"):
        # A merge: named by the tables it writes.
        return "merge → " + ", ".join(dict.fromkeys(_TARGET.findall(text)))
    return " ".join(text.split(" ")[:4])[:48]


class Timings:
    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: defaultdict[str, int] = defaultdict(int)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds
        self.calls[name] += 1


class TimedTx:
    """A Tx that times every statement and COPY it forwards (the driver and the server)."""

    def __init__(self, inner: Any, timings: Timings) -> None:
        self._inner = inner
        self._timings = timings
        if copying(inner) is not None:
            self.copy_rows = self._copy_rows_of(inner)

    def _copy_rows_of(self, inner: Any) -> Callable[[str, Iterable[Sequence[object]]], None]:
        def copy_rows(target: str, rows: Iterable[Sequence[object]]) -> None:
            started = time.perf_counter()
            inner.copy_rows(target, rows)
            self._timings.add(label(f"COPY {target} FROM STDIN"), time.perf_counter() - started)

        return copy_rows

    def _timed(self, fn: Callable[..., T], sql: str, *args: Any) -> T:
        started = time.perf_counter()
        try:
            return fn(sql, *args)
        finally:
            self._timings.add(label(sql), time.perf_counter() - started)

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return int(self._timed(self._inner.execute, sql, params))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._timed(self._inner.executemany, sql, rows)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._timed(self._inner.query, sql, params)


def timed(store: Store, timings: Timings) -> None:
    """Every transaction of ``store`` through a TimedTx."""
    run = store.run_transaction

    async def run_transaction(fn: Callable[[Tx], T], *, write: bool = True) -> T:
        return await run(lambda tx: fn(TimedTx(tx, timings)), write=write)

    store.run_transaction = run_transaction  # type: ignore[method-assign]


async def commit_all(
    url: str, data_dir: Path, blocks: list[DecodedBlock], args: argparse.Namespace
) -> None:
    store = open_store(url, data_dir, pool_size=2)
    timings = Timings()
    async with store:
        await store.migrate()
        timed(store, timings)
        rows = IndexRows(store)
        expect: IndexCursor | None = None
        all_batches = list(batches(blocks, args.batch_blocks, args.batch_transfers))
        wall = cpu = 0.0
        transfers = 0
        for n, batch in enumerate(all_batches):
            if n == len(all_batches) - 1 and args.explain is not None and "postgres" in url:
                await explain_on(store, args.explain)
            cursor = IndexCursor(batch[-1].number, batch[-1].hash)
            started, cpu_started = time.perf_counter(), time.process_time()
            await rows.commit_index(
                "ethereum",
                "devnet",
                expect=expect,
                cursor=cursor,
                blocks=batch,
                keep_from=cursor.number - 4096 + 1,
            )
            wall += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
            transfers += sum(len(b.transfers) for b in batch)
            expect = cursor
    measured = sum(timings.seconds.values())
    print(f"\n### {store.backend}: {len(all_batches)} commits, {transfers:,} transfers\n")
    print(f"{transfers / wall:,.0f} transfers/s; wall {wall:.2f} s, process CPU {cpu:.2f} s\n")
    print("| where | calls | seconds | share |")
    print("|---|---:|---:|---:|")
    for name, seconds in sorted(timings.seconds.items(), key=lambda kv: -kv[1]):
        print(f"| `{name}` | {timings.calls[name]} | {seconds:.3f} | {seconds / wall:.0%} |")
    rest = wall - measured
    print(f"| python (rows, plan) and thread hand-off | - | {rest:.3f} | {rest / wall:.0%} |")


async def explain_on(store: Store, threshold_ms: float) -> None:
    """auto_explain on every pooled connection, its plans printed as notices."""
    pool = store._pool  # type: ignore[attr-defined]

    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.add_notice_handler(lambda d: print(f"\n```\n{d.message_primary}\n```"))
        conn.execute("LOAD 'auto_explain'")
        for name, value in (
            ("log_min_duration", str(threshold_ms)),
            ("log_analyze", "on"),
            ("log_buffers", "on"),
            ("log_level", "notice"),
        ):
            conn.execute(f"SET auto_explain.{name} = {value}")

    def each() -> None:
        for _ in range(2):
            with pool.connection() as conn:
                configure(conn)

    await trio.to_thread.run_sync(each)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=int, default=100_000)
    parser.add_argument("--per-block", type=int, default=500)
    parser.add_argument("--gap", type=int, default=50)
    parser.add_argument("--batch-blocks", type=int, default=2000)
    parser.add_argument("--batch-transfers", type=int, default=20_000)
    parser.add_argument("--store", choices=("both", "postgresql", "sqlite"), default="both")
    parser.add_argument("--explain", type=float, help="ms: plans of the last batch's statements")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    args = parser.parse_args(argv)
    blocks = history(args.logs, args.per_block, args.gap)
    with tempfile.TemporaryDirectory() as tmp:
        if args.store in ("both", "postgresql"):
            schema = f"cg_commit_{secrets.token_hex(4)}"
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            try:
                joiner = "&" if "?" in args.pg_url else "?"
                url = f"{args.pg_url}{joiner}options={quote(f'-c search_path={schema}')}"
                trio.run(commit_all, url, Path(tmp), blocks, args)
            finally:
                with psycopg.connect(args.pg_url, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")
        if args.store in ("both", "sqlite"):
            trio.run(commit_all, f"sqlite://{tmp}/commit.db", Path(tmp), blocks, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
