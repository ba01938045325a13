"""Versioned schema migrations: ``NNNN_name.sql`` files, applied in order, once each.

Each subsystem keeps the migrations of the tables it owns beside it
(``chaingate/<subsystem>/migrations/``); the versions are one global sequence across packages
(a later table may name an earlier one of another subsystem), checked here: each number once,
1..n without gaps.  A migration is recorded by its version and name, as before the files
moved, so a database migrated from one folder goes on from the same version.

The same files run on SQLite and PostgreSQL, so they are written in portable SQL.  Each
migration runs in its own transaction that first takes the backend's migration lock
(``pg_advisory_xact_lock`` on PostgreSQL; ``BEGIN IMMEDIATE`` already serializes writers on
SQLite) and then re-checks ``schema_migrations``: of two processes migrating at once, the
second waits, sees the version recorded, and skips it.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.abc import Traversable

import msgspec
import trio

from chaingate.store.tx import Transactions, Tx

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations"
    " (version INTEGER PRIMARY KEY, name TEXT, applied_at BIGINT)"
)


class MigrationError(Exception):
    """The migration files themselves are wrong (bad name, duplicate or missing version), or
    the database recorded a version under another name than its file's."""


class Migration(msgspec.Struct, frozen=True):
    version: int
    name: str
    sql: str


class AppliedMigration(msgspec.Struct, frozen=True):
    version: int
    name: str
    applied_at: int  # epoch milliseconds


def migration_folders() -> list[Traversable]:
    """Every ``chaingate/<package>/migrations`` folder (found without importing a package)."""
    root = resources.files("chaingate")
    return [
        child / "migrations"
        for child in sorted(root.iterdir(), key=lambda c: c.name)
        if child.is_dir() and (child / "migrations").is_dir()
    ]


def load_migrations(directory: Traversable | None = None) -> list[Migration]:
    """The migration files of every package (or of ``directory`` alone), by version.
    Versions must run 1, 2, 3... without gaps, each in one file only."""
    found: dict[int, Migration] = {}
    where: dict[int, str] = {}
    for folder in [directory] if directory is not None else migration_folders():
        for entry in folder.iterdir():
            if not entry.name.endswith(".sql"):
                continue
            match = _FILE_NAME.match(entry.name)
            if match is None:
                raise MigrationError(f"migration file name must be NNNN_name.sql: {entry.name}")
            version = int(match[1])
            if version in found:
                raise MigrationError(
                    f"two migration files for version {version}: {where[version]}, {entry.name}"
                )
            found[version] = Migration(version, match[2], entry.read_text(encoding="utf-8"))
            where[version] = entry.name
    versions = sorted(found)
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, found {versions}")
    return [found[v] for v in versions]


def split_statements(script: str) -> list[str]:
    """Split a SQL script on the semicolons outside quotes and comments.

    Needed because sqlite3 runs one statement per execute() and its executescript() commits
    first, which would break the one-transaction-per-migration rule.  Portable SQL has no
    dollar-quoting or trigger bodies, so quotes and comments are all there is to skip.
    """
    statements: list[str] = []
    start = i = 0
    n = len(script)
    while i < n:
        c = script[i]
        if c in "'\"":
            end = script.find(c, i + 1)
            # A doubled quote is an escaped quote inside the literal: keep scanning.
            while end != -1 and script.startswith(c, end + 1):
                end = script.find(c, end + 2)
            i = n if end == -1 else end + 1
        elif script.startswith("--", i):
            end = script.find("\n", i)
            i = n if end == -1 else end + 1
        elif script.startswith("/*", i):
            end = script.find("*/", i + 2)
            i = n if end == -1 else end + 2
        elif c == ";":
            statements.append(script[start:i])
            i += 1
            start = i
        else:
            i += 1
    statements.append(script[start:])
    return [s.strip() for s in statements if _has_code(s)]


def _has_code(statement: str) -> bool:
    """False for a fragment made only of whitespace and comments."""
    text = re.sub(r"/\*.*?\*/", "", statement, flags=re.DOTALL)
    text = re.sub(r"--[^\n]*", "", text)
    return bool(text.strip())


async def apply_pending(
    store: Transactions, migrations: list[Migration] | None = None
) -> list[int]:
    """Apply the migrations not yet recorded; return the versions applied by this call."""
    if migrations is None:
        migrations = await trio.to_thread.run_sync(load_migrations)  # file reads
    applied: list[int] = []
    for migration in migrations:

        def step(tx: Tx, migration: Migration = migration) -> bool:
            store.lock_migrations(tx)
            tx.execute(_CREATE_TABLE)
            done = tx.query(
                "SELECT name FROM schema_migrations WHERE version = ?", (migration.version,)
            )
            if done:
                # A version once applied from another file (a branch's placeholder, since
                # renumbered) would hide this one for ever: refused, loudly.
                if done[0][0] != migration.name:
                    raise MigrationError(
                        f"migration {migration.version:04d}: the database applied"
                        f" {done[0][0]!r}, the file is {migration.name!r}; this database ran"
                        " another version of the schema: recreate it or migrate it by hand"
                    )
                return False
            for statement in split_statements(migration.sql):
                tx.execute(statement)
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, store.clock()),
            )
            return True

        if await store.run_transaction(step):
            applied.append(migration.version)
    return applied


async def applied(store: Transactions) -> list[AppliedMigration]:
    """What ``schema_migrations`` records, by version."""

    def select(tx: Tx) -> list[AppliedMigration]:
        # Creating the table under the lock keeps two first-time callers from racing on it.
        store.lock_migrations(tx)
        tx.execute(_CREATE_TABLE)
        rows = tx.query("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
        return [AppliedMigration(*row) for row in rows]

    return await store.run_transaction(select)
