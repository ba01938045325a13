"""A bench's outer run, written once: Ctrl-C and SIGTERM unwind the ExitStack that holds its
servers, the machine's own load is measured before and during the run, and a failure becomes
an exit status with one line saying why."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from benchkit import report, tools

T = TypeVar("T")

INTERRUPTED = 130
FAILED = 2


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Finished(Generic[T]):
    result: T
    background: str  # report.quietness of the run
    seconds: float


def guarded(
    run: Callable[[contextlib.ExitStack, float | None], T],
    failures: tuple[type[BaseException], ...],
) -> Finished[T] | int:
    """``run(stack, busy)`` with its servers in ``stack``; what it returned, or the exit
    status (INTERRUPTED, FAILED on one of ``failures``)."""
    # SIGINT is set explicitly: a shell without job control starts background jobs with it
    # ignored.
    previous = signal.signal(signal.SIGTERM, tools.raise_interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    busy = tools.background_busy()
    if busy is not None and busy > report.BUSY_WARNING:
        say(f"{report.FLAG} the machine is already {busy:.0%} busy: results will be noisy")
    started = time.monotonic()
    others = tools.CpuAccount()
    others.start()
    try:
        with contextlib.ExitStack() as stack:
            result = run(stack, busy)
            say("stopping servers...")
    except KeyboardInterrupt:
        say("\ninterrupted: servers stopped")
        return INTERRUPTED
    except failures as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return Finished(result, report.quietness(busy, others.share()), time.monotonic() - started)
