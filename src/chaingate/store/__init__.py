"""The store engine — transactions, migrations — on SQLite (embedded default) or PostgreSQL.

    store = open_store(settings.store.url, Path(settings.data_dir).expanduser())
    async with store:
        await store.migrate()
        account = await AuthRows(store).create_account("ada@example.com", "free")

Each subsystem's rows live beside it (``AuthRows`` in ``chaingate.auth.store``, ...).

Every operation is async and runs on a worker thread; nothing blocks the trio event loop.
"""

from __future__ import annotations

from pathlib import Path

from chaingate.store.base import (
    Clock,
    DuplicateKey,
    Store,
    StoreError,
    Tx,
    UnknownAccount,
    new_id,
    now_ms,
)
from chaingate.store.migrate import AppliedMigration, Migration, MigrationError

__all__ = [
    "AppliedMigration",
    "Clock",
    "DuplicateKey",
    "Migration",
    "MigrationError",
    "Store",
    "StoreError",
    "Tx",
    "UnknownAccount",
    "default_url",
    "new_id",
    "now_ms",
    "open_store",
]

DB_FILE = "chaingate.db"


def default_url(data_dir: Path) -> str:
    return f"sqlite://{data_dir.expanduser().absolute() / DB_FILE}"


def open_store(url: str, data_dir: Path, *, pool_size: int = 8, clock: Clock = now_ms) -> Store:
    """The store a URL names, not yet connected (``async with`` it, or ``await .open()``).

    * ``""`` — ``sqlite:///<data_dir>/chaingate.db`` (the directory is created on open);
    * ``sqlite:///abs/path.db`` — that file (file-URL rules: the path after ``sqlite://`` is
      absolute; SQLAlchemy's four-slash spelling works too); ``sqlite:///:memory:`` for tests;
    * ``postgresql://...`` or ``postgres://...`` — any libpq URL, pooled ``pool_size`` wide.
    """
    url = url or default_url(data_dir)
    scheme, sep, rest = url.partition("://")
    if scheme == "sqlite" and sep:
        from chaingate.store.sqlite import MEMORY, SqliteStore

        if rest == f"/{MEMORY}":
            return SqliteStore(MEMORY, clock=clock)
        if not rest.startswith("/") or rest == "/":
            raise StoreError("a sqlite URL is sqlite:///absolute/path.db or sqlite:///:memory:")
        return SqliteStore("/" + rest.lstrip("/"), clock=clock)
    if scheme in ("postgresql", "postgres") and sep:
        # Imported here so the embedded default never loads psycopg.
        from chaingate.store.postgres import PostgresStore

        return PostgresStore(url, pool_size=pool_size, clock=clock)
    # Only the scheme: the rest of a URL may hold a password.
    raise StoreError(f"unsupported store URL scheme {scheme!r} (use sqlite:/// or postgresql://)")
