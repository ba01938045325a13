"""What a subsystem's rows stand on: the engine's transactions, its clock and its backend.

Each subsystem keeps its tables' SQL beside it (``chaingate.<subsystem>.store``) in a class
derived from ``Rows`` and built from the engine (``BundlerRows(store)``): it reaches the
database only through ``run_transaction`` and never sees another subsystem's queries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from chaingate.store.base import Store
from chaingate.store.tx import Clock, Tx

T = TypeVar("T")


class Rows:
    """One subsystem's queries over a shared engine (``chaingate.store.Store``)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def backend(self) -> str:
        return self.store.backend

    @property
    def clock(self) -> Clock:
        return self.store.clock

    async def run_transaction(self, fn: Callable[[Tx], T], *, write: bool = True) -> T:
        return await self.store.run_transaction(fn, write=write)
