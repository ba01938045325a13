"""Batched row I/O for the indexer's tables: lookups, upserts, deletes and inserts of many rows.

Two implementations of one small interface, chosen per transaction:

* **COPY** (PostgreSQL): rows stream in with ``COPY ... FROM STDIN`` — psycopg encodes rows in
  C, so a 100,000-row batch costs a fraction of a second, where a multi-row ``VALUES``
  statement spends seconds in parameter handling on both sides.  Inserts go straight into the
  table; lookups, upserts and deletes copy their keys or rows into a temporary table of the
  transaction (``ON COMMIT DROP``) and join it: ``SELECT ... JOIN``,
  ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``, ``DELETE ... USING``.
* **Statements** (SQLite, and PostgreSQL without COPY access): multi-row ``VALUES``
  statements of a few hundred rows; a lookup joins a ``VALUES`` list (an index lookup per key
  on both engines), a delete uses ``(cols) IN (SELECT ... FROM (VALUES ...))``.

Every statement is scoped to one (chain, network).  Table and column names come from the
constant ``Table`` definitions below, never from data.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from chaingate.store.tx import CopyTx, copying

# Bound parameters per statement: well under SQLite's 32,766 and PostgreSQL's 65,535.
MAX_PARAMS = 16_000
MAX_ROWS = 500


class Table(NamedTuple):
    name: str
    keys: tuple[str, ...]
    values: tuple[str, ...]


class Bulk(Protocol):
    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Rows of ``columns`` (chain and network first) into ``table``."""

    def lookup(self, table: Table, keys: Sequence[Sequence[object]]) -> list[tuple[Any, ...]]:
        """The rows (keys then values) whose keys are among ``keys``."""

    def upsert(self, table: Table, rows: Sequence[Sequence[object]]) -> None:
        """Insert or replace rows given as keys then values."""

    def delete(self, table: Table, keys: Sequence[Sequence[object]]) -> None:
        """Delete the rows with these keys."""


def bulk_for(tx: Any, where: tuple[str, str]) -> Bulk:
    """COPY where the transaction offers it, statements otherwise."""
    copier = copying(tx)
    if copier is not None:
        return _CopyBulk(copier, where)
    return _StatementBulk(tx, where)


# --- statements -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _values(columns: int, rows: int) -> str:
    row = "(" + ", ".join("?" * columns) + ")"
    return ", ".join([row] * rows)


def _chunks(rows: Sequence[Sequence[object]]) -> Iterable[Sequence[Sequence[object]]]:
    if not rows:
        return
    size = max(1, min(MAX_ROWS, MAX_PARAMS // len(rows[0])))
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _flat(rows: Sequence[Sequence[object]]) -> list[object]:
    return [value for row in rows for value in row]


class _StatementBulk:
    def __init__(self, tx: Any, where: tuple[str, str]) -> None:
        self.tx = tx
        self.where = where

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES"
        for chunk in _chunks(rows):
            self.tx.execute(f"{head} {_values(len(chunk[0]), len(chunk))}", _flat(chunk))

    def lookup(self, table: Table, keys: Sequence[Sequence[object]]) -> list[tuple[Any, ...]]:
        picks = ", ".join(f"t.{c}" for c in (*table.keys, *table.values))
        joins = " AND ".join(f"t.{c} = k.column{i + 1}" for i, c in enumerate(table.keys))
        found: list[tuple[Any, ...]] = []
        for chunk in _chunks(keys):
            values = _values(len(table.keys), len(chunk))
            sql = (
                f"SELECT {picks} FROM (VALUES {values}) AS k JOIN {table.name} t"  # noqa: S608
                f" ON {joins} AND t.chain = ? AND t.network = ?"
            )
            found.extend(self.tx.query(sql, [*_flat(chunk), *self.where]))
        return found

    def upsert(self, table: Table, rows: Sequence[Sequence[object]]) -> None:
        columns = ("chain", "network", *table.keys, *table.values)
        head = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES"
        tail = f"ON CONFLICT (chain, network, {', '.join(table.keys)}) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in table.values
        )
        full = [(*self.where, *row) for row in rows]
        for chunk in _chunks(full):
            self.tx.execute(f"{head} {_values(len(columns), len(chunk))} {tail}", _flat(chunk))

    def delete(self, table: Table, keys: Sequence[Sequence[object]]) -> None:
        names = ", ".join(table.keys)
        picks = ", ".join(f"column{i + 1}" for i in range(len(table.keys)))
        for chunk in _chunks(keys):
            self.tx.execute(
                f"DELETE FROM {table.name} WHERE chain = ? AND network = ?"  # noqa: S608
                f" AND ({names}) IN (SELECT {picks} FROM"
                f" (VALUES {_values(len(table.keys), len(chunk))}) AS k)",
                [*self.where, *_flat(chunk)],
            )


# --- COPY (PostgreSQL) ------------------------------------------------------------------------


class _CopyBulk:
    def __init__(self, tx: CopyTx, where: tuple[str, str]) -> None:
        self.tx = tx
        self.where = where
        self._staged: set[str] = set()

    def _copy(self, target: str, rows: Iterable[Sequence[object]]) -> None:
        # Rows are encoded in psycopg's C extension: faster than any formatting in Python.
        self.tx.copy_rows(target, rows)

    def _stage(self, name: str, select: str) -> None:
        """An empty temporary table shaped like ``select``, dropped at commit."""
        if name in self._staged:
            self.tx.execute(f"TRUNCATE {name}")
            return
        self.tx.execute(f"CREATE TEMP TABLE {name} ON COMMIT DROP AS {select} WITH NO DATA")
        self._staged.add(name)

    def _stage_keys(self, table: Table, keys: Sequence[Sequence[object]]) -> str:
        name = f"stage_keys_{table.name}"
        keys_list = ", ".join(table.keys)
        self._stage(name, f"SELECT {keys_list} FROM {table.name}")  # noqa: S608
        self._copy(f"{name} ({keys_list})", keys)
        return name

    def insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        if rows:
            self._copy(f"{table} ({', '.join(columns)})", rows)

    def lookup(self, table: Table, keys: Sequence[Sequence[object]]) -> list[tuple[Any, ...]]:
        if not keys:
            return []
        stage = self._stage_keys(table, keys)
        picks = ", ".join(f"t.{c}" for c in (*table.keys, *table.values))
        joins = " AND ".join(f"t.{c} = k.{c}" for c in table.keys)
        rows: list[tuple[Any, ...]] = self.tx.query(
            f"SELECT {picks} FROM {stage} k JOIN {table.name} t"  # noqa: S608
            f" ON t.chain = ? AND t.network = ? AND {joins}",
            self.where,
        )
        return rows

    def upsert(self, table: Table, rows: Sequence[Sequence[object]]) -> None:
        if not rows:
            return
        columns = ", ".join(("chain", "network", *table.keys, *table.values))
        stage = f"stage_rows_{table.name}"
        self._stage(stage, f"SELECT {columns} FROM {table.name}")  # noqa: S608
        self._copy(f"{stage} ({columns})", ((*self.where, *row) for row in rows))
        self.tx.execute(
            f"INSERT INTO {table.name} ({columns}) SELECT {columns} FROM {stage}"  # noqa: S608
            f" ON CONFLICT (chain, network, {', '.join(table.keys)}) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in table.values)
        )

    def delete(self, table: Table, keys: Sequence[Sequence[object]]) -> None:
        if not keys:
            return
        stage = self._stage_keys(table, keys)
        joins = " AND ".join(f"t.{c} = k.{c}" for c in table.keys)
        self.tx.execute(
            f"DELETE FROM {table.name} t USING {stage} k"  # noqa: S608
            f" WHERE t.chain = ? AND t.network = ? AND {joins}",
            self.where,
        )
