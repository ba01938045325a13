"""The transaction protocol every query is written against (both backends provide it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar, cast

T = TypeVar("T")

# Milliseconds since the epoch; injectable so tests control time.
Clock = Callable[[], int]


class Tx(Protocol):
    """One open transaction, used from the worker thread that runs it."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run one statement; return the number of rows it changed."""
        ...

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...


class CopyTx(Tx, Protocol):
    """A transaction whose backend streams rows in with ``COPY`` (PostgreSQL)."""

    def copy_rows(self, target: str, rows: Iterable[Sequence[object]]) -> None:
        """``COPY target FROM STDIN`` (``target``: a table and its columns, constants only):
        the rows stream in, no statement per row."""
        ...


def copying(tx: Tx) -> CopyTx | None:
    """The transaction, if its backend offers ``COPY``; None otherwise (SQLite)."""
    return cast(CopyTx, tx) if callable(getattr(tx, "copy_rows", None)) else None


class Transactions(Protocol):
    """What runs a function inside one transaction (the engine, ``Store``)."""

    clock: Clock

    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T: ...

    def lock_migrations(self, tx: Tx) -> None: ...
