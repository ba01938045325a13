"""``kill -9`` of a real ``chaingate serve`` in the middle of a COPY batch (PostgreSQL).

The process is frozen (SIGSTOP) while the server reports a COPY into ``idx_transfers`` in
progress on its connection — some rows in, the rest not sent — then killed.  The index must
hold no part of the batch: its state at its cursor equals the recomputation over the
canonical chain up to that block, and a restart brings it to the head exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.bootstrap import bootstrap_devnet
from tests.conftest import DEVNET_SIGNER, PG_URL, pg_schema
from tests.test_indexer_oracle import (
    Node,
    assert_index_matches,
    canonical,
    compare,
    open_index_store,
    recompute,
    snapshot,
    wait_until_indexed,
)
from tests.test_indexer_restart import config_text, make_history, wait_for_health

# Batches of ~6,000 transfers: COPYs long enough to be caught in the middle.
FOLLOWER = "max_log_range = 5000\n"
INDEXER = "batch_blocks = 2000\nbatch_transfers = 6000\nbatch_seconds = 5\n"


def serve(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``chaingate serve``, its log kept (a failed restart says why)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "chaingate", "serve", "--config", str(config)],
            stdout=out,
            stderr=out,
        )


def server_state(schema: str) -> str:
    """What the server's sessions and the stored cursors say (for a failure's message)."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT pid, state, wait_event_type, wait_event, now() - xact_start,"
            " left(query, 100) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND state <> 'idle' AND pid <> pg_backend_pid()"
        ).fetchall()
        cursors = [
            conn.execute(f"SELECT * FROM {schema}.{table}").fetchall()
            for table in ("idx_cursors", "chain_cursors", "webhook_cursors")
        ]
    return f"sessions: {sessions}\ncursors: {cursors}"


def copy_in_progress(conn: psycopg.Connection[Any], schema_relid: str) -> tuple[int, int] | None:
    """(backend pid, rows processed) of a COPY into the index's transfers under way."""
    row = conn.execute(
        "SELECT pid, tuples_processed FROM pg_stat_progress_copy"
        " WHERE relid = %s::regclass AND tuples_processed > 0",
        (schema_relid,),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else None


def freeze_mid_copy(pid: int, schema: str, limit: float) -> tuple[int, int]:
    """SIGSTOP ``pid`` while its COPY into the transfers is under way, once a first batch is
    committed (retrying on the next batch when the COPY finished in between); the COPY's
    (backend pid, rows) as it stands frozen."""
    table = f"{schema}.idx_transfers"
    deadline = time.monotonic() + limit
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        while not conn.execute(f"SELECT 1 FROM {schema}.idx_cursors").fetchall():
            assert time.monotonic() < deadline, "no batch was committed"
            time.sleep(0.001)
        while time.monotonic() < deadline:
            if copy_in_progress(conn, table) is None:
                time.sleep(0.0005)
                continue
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)  # the server takes what was already sent
            frozen = copy_in_progress(conn, table)
            if frozen is not None:
                return frozen
            os.kill(pid, signal.SIGCONT)  # the COPY ended first: catch the next one
    raise AssertionError("no COPY into idx_transfers was caught in progress")


@pytest.mark.slow
async def test_kill_9_in_the_middle_of_a_copy_leaves_no_partial_block(
    anvil_factory: Callable[..., AnvilProcess], tmp_path: Path
) -> None:
    anvil = anvil_factory(extra=["--gas-limit", "100000000"])
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    await make_history(node, manifest, logs=16_000, per_tx=1_000, gap=60)
    head, _ = await node.head()
    port = free_port()
    with pg_schema() as store_url:
        schema = store_url.rsplit("search_path%3D", 1)[-1]
        config = tmp_path / "chaingate.toml"
        config.write_text(config_text(tmp_path, port, anvil.url, store_url, FOLLOWER, INDEXER))
        store = open_index_store(store_url, tmp_path)
        async with store:
            process = serve(config, tmp_path / "serve.log")
            try:
                await wait_for_health(port, process)
                _, rows = await trio.to_thread.run_sync(freeze_mid_copy, process.pid, schema, 120.0)
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=10)
            assert rows > 0, "the COPY had rows in when the process died"
            # The server rolled the batch back: nothing of it, and everything before it.
            cursor, got, _ = await snapshot(store)
            assert cursor is not None
            number = int(cursor[0])
            assert number < head, "the kill must land before the head"
            logs, natives = await canonical(node, number)
            assert compare(got, recompute(logs, natives)) == []
            assert all(t[0] <= number for t in got.transfers)
            # A restart indexes the rest, each block once, while the chain moves on (as in
            # test_indexer_restart; a quiet chain is its own test there).
            a = manifest.accounts
            await node.send({"from": a[1], "to": a[2], "value": hex(10**16)})
            process = serve(config, tmp_path / "serve.log")
            try:
                await wait_for_health(port, process)
                try:
                    await wait_until_indexed(store, node, limit=180)  # a shared machine is slow
                except trio.TooSlowError:
                    tail = (tmp_path / "serve.log").read_text(errors="replace")[-3000:]
                    raise AssertionError(
                        f"the restart did not reach the head:\n{tail}\n{server_state(schema)}"
                    ) from None
                await assert_index_matches(store, node, manifest)
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except Exception:
                    process.kill()
                    process.wait(timeout=5)
    await node.aclose()
