"""The store layer on both backends: migrations, every operation, concurrency, no key in clear.

The ``store`` fixture runs each test on SQLite (a temp file) and on PostgreSQL (a fresh schema
per test, dropped afterwards).  Without a reachable PostgreSQL the PostgreSQL half is skipped
loudly — and fails under ``CI=true``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from chaingate import config
from chaingate.auth.store import AuthRows, KeyRow, UsageDelta, UsageRow
from chaingate.chain.store import CHAIN_TABLES, ChainCursor, ChainRows, StoredBlock
from chaingate.store import (
    DuplicateKey,
    Migration,
    MigrationError,
    Store,
    StoreError,
    Tx,
    UnknownAccount,
    base,
    open_store,
)
from chaingate.store.base import ChainClaim, network_tables, register_network_table
from chaingate.store.migrate import apply_pending, load_migrations, split_statements
from chaingate.store.postgres import redact, to_pyformat

T0 = 1_700_000_000_000  # ms
# Every shipped migration's version, and the next free one (for test-only migrations).
VERSIONS = [m.version for m in load_migrations()]
NEXT = VERSIONS[-1] + 1
DAY = 1440  # minutes
M0 = 28_333_440  # a minute that starts a UTC day (2023-11-13T00:00Z)


class FakeClock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int = 1) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock, tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(store_url, tmp_path, clock=clock) as opened:
        await opened.migrate()
        yield opened


def _key(account_id: str, secret: str, **fields: object) -> KeyRow:
    """What a caller hands the store: the hash and a display prefix, never ``secret``."""
    values: dict[object, object] = {
        "account_id": account_id,
        "name": "default",
        "prefix": secret[:13],
        "key_hash": hashlib.sha256(secret.encode()).hexdigest(),
        "environment": "test",
        "scopes": "rpc:read rpc:write",
    }
    values.update(fields)
    return KeyRow(**values)  # type: ignore[arg-type]


# --- migrations ------------------------------------------------------------------------------


async def test_migrations_apply_once_and_are_recorded(store_url: str, tmp_path: Path) -> None:
    clock = FakeClock()
    async with open_store(store_url, tmp_path, clock=clock) as first:
        assert await first.migrate() == VERSIONS
        assert await first.migrate() == []
        recorded = await first.applied_migrations()
    assert [(m.version, m.name, m.applied_at) for m in recorded][:3] == [
        (1, "initial", T0),
        (2, "chain_follower", T0),
        (3, "chain_identity", T0),
    ]
    shipped = [(m.version, m.name) for m in load_migrations()]
    assert [(m.version, m.name) for m in recorded] == shipped
    # A new process (store object) finds the schema current.
    async with open_store(store_url, tmp_path, clock=clock) as second:
        assert await second.migrate() == []
        assert [m.version for m in await second.applied_migrations()] == VERSIONS


def _extra_migrations() -> list[Migration]:
    return [
        *load_migrations(),
        Migration(
            NEXT, "widgets", "CREATE TABLE widgets (id TEXT PRIMARY KEY, n BIGINT NOT NULL);"
        ),
        Migration(NEXT + 1, "widget_index", "CREATE INDEX widgets_n ON widgets (n);"),
    ]


async def test_concurrent_migrations_apply_each_version_exactly_once(
    store_url: str, tmp_path: Path
) -> None:
    migrations = _extra_migrations()
    results: list[list[int]] = []
    stores = [open_store(store_url, tmp_path) for _ in range(4)]
    for s in stores:
        await s.open()
    try:

        async def migrate(s: Store) -> None:
            results.append(await apply_pending(s, migrations))

        async with trio.open_nursery() as nursery:
            for s in stores:
                nursery.start_soon(migrate, s)
        recorded = await stores[0].applied_migrations()
    finally:
        for s in stores:
            await s.aclose()
    applied = sorted(v for result in results for v in result)
    assert applied == [*VERSIONS, NEXT, NEXT + 1]
    assert [m.version for m in recorded] == [*VERSIONS, NEXT, NEXT + 1]


async def test_failed_migration_rolls_back_whole(store_url: str, tmp_path: Path) -> None:
    broken = Migration(
        NEXT, "broken", "CREATE TABLE half (x BIGINT);\nINSERT INTO no_such_table VALUES (1);"
    )
    async with open_store(store_url, tmp_path) as s:
        assert await s.migrate() == VERSIONS
        with pytest.raises(Exception, match="no_such_table"):
            await apply_pending(s, [*load_migrations(), broken])
        assert [m.version for m in await s.applied_migrations()] == VERSIONS
        # Its first statement was undone with the rest: the migration can simply be rerun.
        fixed = Migration(NEXT, "fixed", "CREATE TABLE half (x BIGINT);")
        assert await apply_pending(s, [*load_migrations(), fixed]) == [NEXT]


async def test_a_version_recorded_under_another_name_is_refused(
    store_url: str, tmp_path: Path
) -> None:
    """A database that applied another file as version NEXT (a branch's placeholder, since
    renumbered) is refused, not silently left without the real one."""
    placeholder = Migration(NEXT, "reserved", "CREATE TABLE placeholder (x BIGINT);")
    real = Migration(NEXT, "widgets", "CREATE TABLE widgets (id TEXT PRIMARY KEY);")
    async with open_store(store_url, tmp_path) as s:
        assert await apply_pending(s, [*load_migrations(), placeholder]) == [*VERSIONS, NEXT]
        with pytest.raises(MigrationError, match=f"{NEXT:04d}.*'reserved'.*'widgets'"):
            await apply_pending(s, [*load_migrations(), real])
        recorded = await s.applied_migrations()
        assert (recorded[-1].version, recorded[-1].name) == (NEXT, "reserved")
        # The same file again is simply already applied.
        assert await apply_pending(s, [*load_migrations(), placeholder]) == []


def test_split_statements_respects_quotes_and_comments() -> None:
    script = """
    -- a comment; with a semicolon
    CREATE TABLE a (x TEXT DEFAULT 'it''s; fine');
    /* block; comment */
    INSERT INTO a VALUES ('--not a comment');
    -- trailing comment only
    """
    assert split_statements(script) == [
        "-- a comment; with a semicolon\n    CREATE TABLE a (x TEXT DEFAULT 'it''s; fine')",
        "/* block; comment */\n    INSERT INTO a VALUES ('--not a comment')",
    ]


def test_migration_files_are_checked(tmp_path: Path) -> None:
    (tmp_path / "0001_one.sql").write_text("SELECT 1;")
    (tmp_path / "0003_three.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="without gaps"):
        load_migrations(tmp_path)
    (tmp_path / "0003_three.sql").unlink()
    (tmp_path / "2_bad.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="NNNN_name"):
        load_migrations(tmp_path)
    (tmp_path / "2_bad.sql").unlink()
    assert [m.name for m in load_migrations(tmp_path)] == ["one"]


def test_migration_sql_is_portable() -> None:
    """The shared files avoid the dialect-only spellings the two engines disagree on."""
    for migration in load_migrations():
        text = migration.sql.upper()
        for banned in ("SERIAL", "AUTOINCREMENT", "NOW()", "CURRENT_TIMESTAMP", "JSONB"):
            assert banned not in text, (migration.name, banned)


# --- accounts --------------------------------------------------------------------------------


async def test_accounts(store: Store, clock: FakeClock) -> None:
    account = await AuthRows(store).create_account("ada@example.com", "free")
    assert account.id.startswith("acct_") and len(account.id) == 25
    assert account.id[5:].isalnum() and account.id[5:].isascii()
    assert (account.created_at, account.updated_at, account.limits) == (T0, T0, None)
    assert await AuthRows(store).get_account(account.id) == account
    assert await AuthRows(store).get_account("acct_missing") is None
    assert await AuthRows(store).find_account_by_email("ada@example.com") == account
    assert await AuthRows(store).find_account_by_email("ADA@example.com") is None

    clock.advance(5)
    limits = '{"requests_per_second": 500}'
    assert await AuthRows(store).set_plan(account.id, "enterprise", limits)
    assert not await AuthRows(store).set_plan("acct_missing", "growth", None)
    updated = await AuthRows(store).get_account(account.id)
    assert updated is not None
    assert (updated.plan, updated.limits, updated.updated_at) == ("enterprise", limits, T0 + 5)
    assert updated.created_at == T0


async def test_unicode_emails(store: Store) -> None:
    emails = ["zoë.ünïcødé@例え.jp", "пользователь@пример.рф", "emoji🦀@example.com"]
    created = [await AuthRows(store).create_account(email, "free") for email in emails]
    for email, account in zip(emails, created, strict=True):
        found = await AuthRows(store).find_account_by_email(email)
        assert found == account and found.email == email


async def test_accounts_changed_since(store: Store, clock: FakeClock) -> None:
    a = await AuthRows(store).create_account("a@example.com", "free")
    clock.advance(10)
    b = await AuthRows(store).create_account("b@example.com", "free")
    clock.advance(10)
    await AuthRows(store).set_plan(a.id, "growth", None)
    changed = await AuthRows(store).accounts_changed_since(T0 + 10)
    assert [(x.id, x.updated_at) for x in changed] == [(b.id, T0 + 10), (a.id, T0 + 20)]
    assert await AuthRows(store).accounts_changed_since(T0 + 21) == []


# --- API keys --------------------------------------------------------------------------------


async def test_insert_and_list_keys(store: Store, clock: FakeClock) -> None:
    alice = await AuthRows(store).create_account("alice@example.com", "free")
    bob = await AuthRows(store).create_account("bob@example.com", "free")
    k1 = await AuthRows(store).insert_key(_key(alice.id, "svc_test_" + "a" * 32, name="first"))
    clock.advance()
    k2 = await AuthRows(store).insert_key(_key(bob.id, "svc_live_" + "b" * 32, environment="live"))
    clock.advance()
    k3 = await AuthRows(store).insert_key(_key(alice.id, "svc_test_" + "c" * 32, scopes=""))
    assert k1.id.startswith("key_") and len(k1.id) == 24
    assert (k1.created_at, k1.updated_at, k1.last_used_at, k1.revoked_at) == (T0, T0, None, None)
    assert await AuthRows(store).list_keys() == [k1, k2, k3]
    assert await AuthRows(store).list_keys(alice.id) == [k1, k3]
    assert await AuthRows(store).list_keys("acct_nobody") == []
    assert k3.scopes == "" and k2.environment == "live" and k1.name == "first"


async def test_duplicate_key_hash_is_a_clear_error(store: Store) -> None:
    account = await AuthRows(store).create_account("a@example.com", "free")
    await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "x" * 32))
    with pytest.raises(DuplicateKey, match="key_hash"):
        await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "x" * 32, name="again"))
    assert len(await AuthRows(store).list_keys()) == 1


async def test_key_for_unknown_account(store: Store) -> None:
    with pytest.raises(UnknownAccount):
        await AuthRows(store).insert_key(_key("acct_nobody", "svc_test_" + "y" * 32))


async def test_revocation_is_seen_by_keys_changed_since(store: Store, clock: FakeClock) -> None:
    account = await AuthRows(store).create_account("a@example.com", "free")
    kept = await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "k" * 32))
    doomed = await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "d" * 32))
    # Same updated_at: ties are ordered by id.
    initial = await AuthRows(store).keys_changed_since(0)
    assert [k.id for k in initial] == sorted([kept.id, doomed.id])
    cursor = max(k.updated_at for k in initial) + 1

    clock.advance(1000)
    assert await AuthRows(store).revoke_key(doomed.id, clock.now)
    assert not await AuthRows(store).revoke_key(doomed.id, clock.now + 5)  # already revoked
    assert not await AuthRows(store).revoke_key("key_missing", clock.now)
    changed = await AuthRows(store).keys_changed_since(cursor)
    assert [(k.id, k.revoked_at, k.updated_at) for k in changed] == [
        (doomed.id, T0 + 1000, T0 + 1000)
    ]
    # The cursor is inclusive: a poller re-reading from the last updated_at sees it again.
    assert [k.id for k in await AuthRows(store).keys_changed_since(T0 + 1000)] == [doomed.id]
    assert await AuthRows(store).keys_changed_since(T0 + 1001) == []


async def test_revoke_key_uses_the_clock_by_default(store: Store, clock: FakeClock) -> None:
    account = await AuthRows(store).create_account("a@example.com", "free")
    key = await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "r" * 32))
    clock.advance(7)
    assert await AuthRows(store).revoke_key(key.id)
    [row] = await AuthRows(store).list_keys()
    assert row.revoked_at == row.updated_at == T0 + 7


async def test_touch_keys_last_used(store: Store, clock: FakeClock) -> None:
    account = await AuthRows(store).create_account("a@example.com", "free")
    k1 = await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "1" * 32))
    k2 = await AuthRows(store).insert_key(_key(account.id, "svc_test_" + "2" * 32))
    await AuthRows(store).touch_keys_last_used({})
    await AuthRows(store).touch_keys_last_used({k1.id: T0 + 50, k2.id: T0 + 60, "key_gone": T0})
    await AuthRows(store).touch_keys_last_used({k1.id: T0 + 40})  # older: ignored
    rows = {k.id: k for k in await AuthRows(store).list_keys()}
    assert rows[k1.id].last_used_at == T0 + 50
    assert rows[k2.id].last_used_at == T0 + 60
    # Use is not a change the key caches need to reload.
    assert rows[k1.id].updated_at == T0
    assert await AuthRows(store).keys_changed_since(T0 + 1) == []


# --- usage -----------------------------------------------------------------------------------


async def test_add_usage_accumulates(store: Store) -> None:
    def delta(minute: int, requests: int, cu: int, errors: int = 0) -> UsageDelta:
        return UsageDelta("key_a", "acct_a", "eth_call", minute, requests, cu, errors)

    await AuthRows(store).add_usage([])
    await AuthRows(store).add_usage([delta(M0, 1, 10), delta(M0, 2, 20, 1), delta(M0 + 1, 5, 50)])
    await AuthRows(store).add_usage([delta(M0, 3, 30, 2)])
    assert await AuthRows(store).usage("acct_a", M0, M0 + 2) == [
        UsageRow(M0, "eth_call", 6, 60, 3),
        UsageRow(M0 + 1, "eth_call", 5, 50, 0),
    ]


async def test_concurrent_add_usage_loses_nothing(store_url: str, tmp_path: Path) -> None:
    tasks, rounds = 20, 10
    stores = [open_store(store_url, tmp_path, pool_size=4) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        await stores[0].migrate()

        async def flush(s: Store, n: int) -> None:
            for _ in range(rounds):
                # Overlapping rows in different orders: the store must neither lose an
                # increment nor deadlock.
                batch = [
                    UsageDelta(f"key_{k}", "acct_a", method, M0 + minute, 1, 3, n % 2)
                    for k in (range(3) if n % 2 else reversed(range(3)))
                    for method in ("eth_call", "eth_getLogs")
                    for minute in (0, 1)
                ]
                await AuthRows(s).add_usage(batch)

        async with trio.open_nursery() as nursery:
            for n in range(tasks):
                nursery.start_soon(flush, stores[n % 2], n)
        rows = await AuthRows(stores[1]).usage("acct_a", M0, M0 + 2, "hour")
    finally:
        for s in stores:
            await s.aclose()
    per_row = tasks * rounds * 3 * 2  # keys x minutes folded into one hour, per method
    assert rows == [
        UsageRow(M0, "eth_call", per_row, 3 * per_row, per_row // 2),
        UsageRow(M0, "eth_getLogs", per_row, 3 * per_row, per_row // 2),
    ]


async def test_usage_bucketing(store: Store) -> None:
    rows = [
        # (key, method, minute offset, requests, cu, errors)
        ("key_a", "eth_call", 0, 1, 10, 0),
        ("key_a", "eth_call", 59, 2, 20, 1),
        ("key_b", "eth_call", 59, 4, 40, 0),
        ("key_a", "eth_call", 60, 8, 80, 0),
        ("key_a", "eth_getLogs", 61, 16, 320, 2),
        ("key_a", "eth_call", DAY - 1, 32, 320, 0),
        ("key_a", "eth_call", DAY, 64, 640, 0),
        ("key_a", "eth_call", 2 * DAY + 5, 128, 1280, 0),
    ]
    await AuthRows(store).add_usage(
        [UsageDelta(k, "acct_a", m, M0 + o, r, c, e) for k, m, o, r, c, e in rows]
    )
    await AuthRows(store).add_usage(
        [UsageDelta("key_z", "acct_other", "eth_call", M0, 1000, 1000, 0)]
    )

    assert await AuthRows(store).usage("acct_a", M0, M0 + 61, "minute") == [
        UsageRow(M0, "eth_call", 1, 10, 0),
        UsageRow(M0 + 59, "eth_call", 6, 60, 1),
        UsageRow(M0 + 60, "eth_call", 8, 80, 0),
    ]
    assert await AuthRows(store).usage("acct_a", M0, M0 + DAY + 1, "hour") == [
        UsageRow(M0, "eth_call", 7, 70, 1),
        UsageRow(M0 + 60, "eth_call", 8, 80, 0),
        UsageRow(M0 + 60, "eth_getLogs", 16, 320, 2),
        UsageRow(M0 + DAY - 60, "eth_call", 32, 320, 0),
        UsageRow(M0 + DAY, "eth_call", 64, 640, 0),
    ]
    assert await AuthRows(store).usage("acct_a", M0, M0 + 3 * DAY, "day") == [
        UsageRow(M0, "eth_call", 47, 470, 1),
        UsageRow(M0, "eth_getLogs", 16, 320, 2),
        UsageRow(M0 + DAY, "eth_call", 64, 640, 0),
        UsageRow(M0 + 2 * DAY, "eth_call", 128, 1280, 0),
    ]
    # A range starting mid-period still labels rows with the period's start.
    assert await AuthRows(store).usage("acct_a", M0 + 30, M0 + 60, "hour") == [
        UsageRow(M0, "eth_call", 6, 60, 1)
    ]
    assert await AuthRows(store).usage("acct_nobody", M0, M0 + DAY, "day") == []


async def test_day_totals(store: Store) -> None:
    await AuthRows(store).add_usage(
        [
            UsageDelta("key_a", "acct_a", "eth_call", M0 - 1, 100, 100, 0),  # yesterday
            UsageDelta("key_a", "acct_a", "eth_call", M0, 1, 10, 0),
            UsageDelta("key_a", "acct_a", "eth_getLogs", M0 + 600, 2, 40, 1),
            UsageDelta("key_b", "acct_a", "eth_call", M0 + DAY - 1, 4, 40, 0),
            UsageDelta("key_c", "acct_b", "eth_call", M0 + 5, 8, 80, 0),
            UsageDelta("key_c", "acct_b", "eth_call", M0 + DAY, 1000, 1000, 0),  # tomorrow
        ]
    )
    assert await AuthRows(store).day_totals(M0) == {"acct_a": (7, 90), "acct_b": (8, 80)}
    assert await AuthRows(store).day_totals(M0 + 10 * DAY) == {}


# --- secrets ---------------------------------------------------------------------------------


def _read_db_files(data_dir: Path) -> bytes:
    """The database with its WAL and shared-memory files: wherever SQLite may have written."""
    files = [p for p in data_dir.iterdir() if p.name.startswith("chaingate.db")]
    return b"".join(p.read_bytes() for p in files)


async def test_sqlite_file_holds_no_key_in_clear(tmp_path: Path) -> None:
    secret = "svc_test_Ab12" + secrets.token_urlsafe(32)
    async with open_store("", tmp_path) as s:
        await s.migrate()
        account = await AuthRows(s).create_account("a@example.com", "free")
        await AuthRows(s).insert_key(_key(account.id, secret, prefix=secret[:13]))
        await AuthRows(s).touch_keys_last_used({k.id: T0 for k in await AuthRows(s).list_keys()})
        while_open = _read_db_files(tmp_path)  # recent writes still in the WAL file
    after_close = _read_db_files(tmp_path)  # closing checkpointed them into chaingate.db
    for data in (while_open, after_close):
        assert secret[:13].encode() in data  # the display prefix is stored...
        assert secret.encode() not in data  # ...the key never is
        assert secret[13:].encode() not in data


# --- opening ---------------------------------------------------------------------------------


async def test_default_url_is_sqlite_under_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "not" / "yet"
    store = open_store("", data_dir)
    assert store.backend == "sqlite"
    assert store.display_url == f"sqlite://{data_dir}/chaingate.db"
    async with store:
        assert await store.migrate() == VERSIONS
    with sqlite3.connect(data_dir / "chaingate.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [
            (v,) for v in VERSIONS
        ]


def _listdir(path: Path) -> list[Path]:
    return list(path.iterdir())


async def test_memory_and_four_slash_urls(tmp_path: Path) -> None:
    async with open_store("sqlite:///:memory:", tmp_path) as memory:
        assert await memory.migrate() == VERSIONS
        await AuthRows(memory).create_account("a@example.com", "free")
    assert not _listdir(tmp_path)
    four = open_store(f"sqlite:///{tmp_path}/x.db", tmp_path)
    assert four.display_url == f"sqlite://{tmp_path}/x.db"


def test_bad_urls() -> None:
    with pytest.raises(StoreError, match="'mysql'") as info:
        open_store("mysql://root:hunter2@db/x", Path())
    assert "hunter2" not in str(info.value)
    with pytest.raises(StoreError, match="absolute"):
        open_store("sqlite://relative.db", Path())


async def test_closed_store_refuses(tmp_path: Path) -> None:
    store = open_store("sqlite:///:memory:", tmp_path)
    with pytest.raises(StoreError, match="not open"):
        await AuthRows(store).get_account("acct_x")


async def test_unreachable_postgres_is_a_clear_error(tmp_path: Path) -> None:
    store = open_store("postgresql://u:hunter2@127.0.0.1:1/db", tmp_path)
    with pytest.raises(StoreError, match="cannot connect") as info:
        await store.open()
    assert "hunter2" not in str(info.value)


def test_pg_placeholders_and_redaction() -> None:
    assert to_pyformat("SELECT ? WHERE a LIKE 'x%?' AND b = ?") == (
        "SELECT %s WHERE a LIKE 'x%%?' AND b = %s"
    )
    assert to_pyformat("SELECT 5 % ?") == "SELECT 5 %% %s"
    assert redact("postgresql://u:pw@h:5432/db?password=pw") == "postgresql://u:***@h:5432/db"


def test_store_settings() -> None:
    settings = config.from_mapping({}, environ={})
    assert (settings.store.url, settings.store.pool_size) == ("", 8)
    env = {"CHAINGATE_STORE__URL": "postgresql://db/x", "CHAINGATE_STORE__POOL_SIZE": "3"}
    settings = config.from_mapping({}, environ=env)
    assert (settings.store.url, settings.store.pool_size) == ("postgresql://db/x", 3)
    with pytest.raises(config.ConfigError, match=r"store\.url"):
        config.from_mapping({"store": {"url": "mysql://u:pw@h/x"}}, environ={})
    with pytest.raises(config.ConfigError, match="pool_size"):
        config.from_mapping({"store": {"pool_size": 0}}, environ={})


# --- the CLI ---------------------------------------------------------------------------------


def _chaingate(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaingate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_migrate(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")},
        "HOME": str(tmp_path),
        "CHAINGATE_DATA_DIR": str(data_dir),
    }
    first = _chaingate("migrate", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"store: sqlite://{data_dir}/chaingate.db" in first.stdout
    assert "0001 initial: applied now" in first.stdout
    assert f"schema at version {NEXT - 1} ({len(VERSIONS)} applied now)" in first.stdout
    with sqlite3.connect(data_dir / "chaingate.db") as conn:
        assert conn.execute("SELECT version, name FROM schema_migrations").fetchall() == [
            (m.version, m.name) for m in load_migrations()
        ]

    again = _chaingate("migrate", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0001 initial: already applied" in again.stdout

    other = tmp_path / "other"
    config_file = tmp_path / "chaingate.toml"
    config_file.write_text(f'data_dir = "{other}"\n[store]\npool_size = 2\n')
    env.pop("CHAINGATE_DATA_DIR")
    from_file = _chaingate("migrate", "--config", str(config_file), env=env)
    assert from_file.returncode == 0, from_file.stdout + from_file.stderr
    assert (other / "chaingate.db").is_file()


# --- chain follower state --------------------------------------------------------------------


async def test_chain_window_saves_prunes_and_rewinds(store_url: str, tmp_path: Path) -> None:
    def block(n: int, tag: str = "a") -> StoredBlock:
        return StoredBlock(n, f"0x{tag}{n}", f"0x{tag}{n - 1}", f'{{"n":{n}}}')

    async with open_store(store_url, tmp_path) as s:
        await s.migrate()
        assert await ChainRows(s).load_chain("ethereum", "mainnet") == (None, [])
        assert await ChainRows(s).save_chain(
            "ethereum", "mainnet", ChainCursor(5, "0xa5", 3), [block(n) for n in range(1, 6)],
            keep_from=2, expect=None,
        )  # fmt: skip
        cursor, rows = await ChainRows(s).load_chain("ethereum", "mainnet")
        assert cursor == ChainCursor(5, "0xa5", 3)
        assert [r.number for r in rows] == [2, 3, 4, 5]  # block 1 fell out of the window
        assert rows[-1] == block(5)
        # A reorg to a shorter branch: 4' replaces 4, 5 goes, in one save.
        assert await ChainRows(s).save_chain(
            "ethereum", "mainnet", ChainCursor(4, "0xb4", 3), [block(4, "b")], keep_from=2,
            expect=(5, "0xa5"),
        )  # fmt: skip
        cursor, rows = await ChainRows(s).load_chain("ethereum", "mainnet")
        assert cursor == ChainCursor(4, "0xb4", 3)
        assert [(r.number, r.hash) for r in rows] == [(2, "0xa2"), (3, "0xa3"), (4, "0xb4")]
        # Another network's state is its own.
        assert await ChainRows(s).load_chain("ethereum", "sepolia") == (None, [])


async def test_a_chain_save_from_a_cursor_no_longer_stored_changes_nothing(
    store_url: str, tmp_path: Path
) -> None:
    """A saver that lost the follower role (another process saved since) neither moves the
    cursor back nor deletes the blocks above its own cursor."""

    def block(n: int, tag: str = "a") -> StoredBlock:
        return StoredBlock(n, f"0x{tag}{n}", f"0x{tag}{n - 1}", f'{{"n":{n}}}')

    async with open_store(store_url, tmp_path) as s:
        await s.migrate()
        rows = ChainRows(s)
        assert await rows.save_chain(
            "ethereum", "devnet", ChainCursor(3, "0xa3", 1), [block(n) for n in range(1, 4)],
            keep_from=0, expect=None,
        )  # fmt: skip
        # The new leader saves on from 3 to 6.
        assert await rows.save_chain(
            "ethereum", "devnet", ChainCursor(6, "0xa6", 4), [block(n) for n in range(4, 7)],
            keep_from=0, expect=(3, "0xa3"),
        )  # fmt: skip
        # The old leader's late save, from the cursor it last wrote, and a first save racing.
        assert not await rows.save_chain(
            "ethereum", "devnet", ChainCursor(4, "0xb4", 1), [block(4, "b")], keep_from=0,
            expect=(3, "0xa3"),
        )  # fmt: skip
        assert not await rows.save_chain(
            "ethereum", "devnet", ChainCursor(2, "0xa2", 1), [], keep_from=0, expect=None
        )
        cursor, stored = await rows.load_chain("ethereum", "devnet")
        assert cursor == ChainCursor(6, "0xa6", 4)
        assert [(r.number, r.hash) for r in stored] == [(n, f"0xa{n}") for n in range(1, 7)]
        assert await rows.chain_cursor("ethereum", "devnet") == (6, "0xa6")


async def test_claiming_another_chain_resets_only_that_networks_derived_state(
    store_url: str, tmp_path: Path
) -> None:
    def block(n: int) -> StoredBlock:
        return StoredBlock(n, f"0xa{n}", f"0xa{n - 1}", f'{{"n":{n}}}')

    async with open_store(store_url, tmp_path) as s:
        await s.migrate()
        for network in ("devnet", "sepolia"):
            await ChainRows(s).save_chain(
                "ethereum", network, ChainCursor(5, "0xa5", 3), [block(n) for n in range(1, 6)],
                keep_from=2, expect=None,
            )  # fmt: skip
        account = await AuthRows(s).create_account("ada@example.com", "free")
        # Rows kept before identities were recorded: they may come from any chain.
        first = await s.claim_chain("ethereum", "devnet", "0xgenesis:one")
        assert first == ChainClaim(None, True, {"chain_cursors": 1, "chain_blocks": 4})
        assert await ChainRows(s).load_chain("ethereum", "devnet") == (None, [])
        assert await s.chain_identity("ethereum", "devnet") == "0xgenesis:one"
        # The same chain again: nothing happens to what the follower stores from now on.
        await ChainRows(s).save_chain(
            "ethereum", "devnet", ChainCursor(1, "0xa1", -1), [block(1)], keep_from=0, expect=None
        )
        assert await s.claim_chain("ethereum", "devnet", "0xgenesis:one") == ChainClaim(
            "0xgenesis:one", False, {}
        )
        assert (await ChainRows(s).load_chain("ethereum", "devnet"))[0] == ChainCursor(
            1, "0xa1", -1
        )
        # Another chain: reset, and recorded.
        again = await s.claim_chain("ethereum", "devnet", "0xgenesis:two")
        assert again == ChainClaim("0xgenesis:one", True, {"chain_cursors": 1, "chain_blocks": 1})
        assert await ChainRows(s).load_chain("ethereum", "devnet") == (None, [])
        assert await s.chain_identity("ethereum", "devnet") == "0xgenesis:two"
        # A new identity on an empty network still says it reset (the chain changed).
        assert await s.claim_chain("ethereum", "devnet", "0xgenesis:three") == ChainClaim(
            "0xgenesis:two", True, {}
        )
        # Other networks and everything not derived from a chain are untouched.
        cursor, rows = await ChainRows(s).load_chain("ethereum", "sepolia")
        assert cursor == ChainCursor(5, "0xa5", 3) and len(rows) == 4
        assert await AuthRows(s).get_account(account.id) == account
        assert await s.chain_identity("ethereum", "sepolia") is None
        # reset_network on its own: every registered table, counted.
        assert await s.reset_network("ethereum", "sepolia") == {
            "chain_cursors": 1,
            "chain_blocks": 4,
        }
        assert await ChainRows(s).load_chain("ethereum", "sepolia") == (None, [])
        assert await s.reset_network("ethereum", "sepolia") == {}


async def test_registered_network_tables_are_reset_too(store_url: str, tmp_path: Path) -> None:
    """The contract later subsystems rely on: a registered table with chain/network columns
    is emptied for the network being reset, and only for it."""
    assert set(CHAIN_TABLES) <= set(network_tables())
    with pytest.raises(ValueError, match="not a table name"):
        register_network_table("x; DROP TABLE accounts")
    migrations = [
        *load_migrations(),
        Migration(
            NEXT,
            "derived",
            "CREATE TABLE test_derived (chain TEXT NOT NULL, network TEXT NOT NULL, n BIGINT);",
        ),
    ]
    register_network_table("test_derived")
    try:
        async with open_store(store_url, tmp_path) as s:
            await apply_pending(s, migrations)

            def fill(tx: Tx) -> None:
                tx.executemany(
                    "INSERT INTO test_derived (chain, network, n) VALUES (?, ?, ?)",
                    [("ethereum", "devnet", 1), ("ethereum", "devnet", 2), ("ethereum", "x", 3)],
                )

            await s.run_transaction(fill)
            assert await s.reset_network("ethereum", "devnet") == {"test_derived": 2}

            def left(tx: Tx) -> list[tuple[object, ...]]:
                return tx.query("SELECT chain, network, n FROM test_derived")

            assert await s.run_transaction(left, write=False) == [("ethereum", "x", 3)]
    finally:
        base._NETWORK_TABLES.remove("test_derived")
