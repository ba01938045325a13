"""A single-assignment future for trio tasks, cheaper than ``trio.Event`` plus a result slot.

Many tasks may wait on one future (coalesced calls share an upstream answer).  Waiting is
cancellable: a cancelled waiter is simply removed.  Setting a result reschedules the waiters
directly with ``trio.lowlevel.reschedule`` — no parking lot, no extra checkpoint — which matters
on the proxy's hot path where every request waits on exactly one of these.

(Code that would rather be called than wait — the fast lane's upstream groups, no task per
group — hands the connection an object of its own instead: ``connection.Settle``.)
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Generic, TypeVar

import outcome
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

T = TypeVar("T")


class _Unset(Enum):
    """No result yet (an enum member, so that ``is _UNSET`` narrows the value's type)."""

    UNSET = 0


_UNSET: Final = _Unset.UNSET


class Future(Generic[T]):
    __slots__ = ("_error", "_value", "_waiters")

    def __init__(self) -> None:
        self._value: T | _Unset = _UNSET
        self._error: BaseException | None = None
        self._waiters: list[Task] = []

    @property
    def done(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    def set_result(self, value: T) -> None:
        if self._value is not _UNSET or self._error is not None:  # done (no property call)
            return
        self._value = value
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            reschedule(task, outcome.Value(value))

    def set_exception(self, error: BaseException) -> None:
        if self._value is not _UNSET or self._error is not None:
            return
        self._error = error
        waiters, self._waiters = self._waiters, []
        for task in waiters:
            reschedule(task, outcome.Error(error))

    def result(self) -> T:
        """The result of a done future, or its exception raised."""
        if self._error is not None:
            raise self._error
        if self._value is _UNSET:
            raise RuntimeError("the future is not done")
        return self._value

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
