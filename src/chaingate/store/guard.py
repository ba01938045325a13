"""Writes that are right only while something holds: a leadership lease (chaingate.cluster).

A single writer's work runs under ``guarded(check)``; every write transaction it, or a task it
started, runs checks ``check()`` before it begins and again right before it commits, and is
refused (``Deposed``: nothing written) once the check fails.  A leader stalled past its lease
(a stopped process, a hung event loop) thus learns it is deposed before it writes, whichever
of its tasks runs first when it resumes.  The check is the caller's: the store knows nothing
of leases.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from chaingate.store.base import StoreError

Check = Callable[[], bool]

_guard: ContextVar[Check | None] = ContextVar("chaingate_write_guard", default=None)


class Deposed(StoreError):
    """A write refused: what it was made for (a leadership lease) no longer holds here."""


@contextlib.contextmanager
def guarded(check: Check) -> Iterator[None]:
    """Every write transaction in this context (tasks started from it included) first asks
    ``check``; it is called on the store's worker thread, so it must only read."""
    token = _guard.set(check)
    try:
        yield
    finally:
        _guard.reset(token)


def current_guard() -> Check | None:
    """The check of the calling task's context (None: unguarded)."""
    return _guard.get()


def require(check: Check | None) -> None:
    if check is not None and not check():
        raise Deposed("not written: this process no longer leads the role it wrote for")
