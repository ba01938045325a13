"""A single-assignment future for trio tasks, cheaper than ``trio.Event`` plus a result slot.

Many tasks may wait on one future (coalesced calls share an upstream answer).  Waiting is
cancellable: a cancelled waiter is simply removed.  Setting a result reschedules the waiters
directly with ``trio.lowlevel.reschedule`` — no parking lot, no extra checkpoint — which matters
on the proxy's hot path where every request waits on exactly one of these.

Code that would rather be called than wait (the fast lane's upstream groups: no task per
group) adds a callback; callbacks run in whoever sets the result, right then, so they must be
short and must not raise (one that does is logged and the others still run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import Final, Generic, TypeVar

import outcome
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

log = logging.getLogger("chaingate.rpc")

T = TypeVar("T")


class _Unset(Enum):
    """No result yet (an enum member, so that ``is _UNSET`` narrows the value's type)."""

    UNSET = 0


_UNSET: Final = _Unset.UNSET


class Future(Generic[T]):
    __slots__ = ("_callbacks", "_error", "_value", "_waiters")

    def __init__(self) -> None:
        self._value: T | _Unset = _UNSET
        self._error: BaseException | None = None
        self._waiters: list[Task] = []
        self._callbacks: list[Callable[[Future[T]], None]] | None = None

    @property
    def done(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    def set_result(self, value: T) -> None:
        if self.done:
            return
        self._value = value
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            reschedule(task, outcome.Value(value))
        if self._callbacks is not None:
            self._call_back()

    def set_exception(self, error: BaseException) -> None:
        if self.done:
            return
        self._error = error
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            reschedule(task, outcome.Error(error))
        if self._callbacks is not None:
            self._call_back()

    def add_done_callback(self, callback: Callable[[Future[T]], None]) -> None:
        """Call ``callback(self)`` once the future is done (at once if it is)."""
        if self.done:
            callback(self)
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def result(self) -> T:
        """The result of a done future, or its exception raised."""
        if self._error is not None:
            raise self._error
        if self._value is _UNSET:
            raise RuntimeError("the future is not done")
        return self._value

    def _call_back(self) -> None:
        callbacks, self._callbacks = self._callbacks or [], None
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a future's callback failed")

    async def wait(self) -> T:
        """The result, waiting for it if needed.  Does not checkpoint when already done."""
        if self._error is not None:
            raise self._error
        if self._value is not _UNSET:
            return self._value
        task = current_task()
        self._waiters.append(task)

        def abort(_: object) -> Abort:
            self._waiters.remove(task)
            return Abort.SUCCEEDED

        result: T = await wait_task_rescheduled(abort)
        return result
