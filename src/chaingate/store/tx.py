"""The transaction protocol every query is written against (both backends provide it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

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


class Transactions(Protocol):
    """What runs a function inside one transaction (the engine, ``Store``)."""

    clock: Clock

    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T: ...

    def lock_migrations(self, tx: Tx) -> None: ...
