"""One ``chaingate dev`` per data dir: an exclusive lock held for the process's life.

``flock`` on ``<data dir>/chaingate-dev.lock``: the kernel drops it when the process exits,
however it exits, so a crash never leaves a stale lock behind.  The holder writes its pid into
the file, so a second ``chaingate dev`` can say who has the data dir.  The descriptor is not
inherited by children (Python's default), so an anvil that outlives a killed ``chaingate dev``
does not keep the data dir locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "chaingate-dev.lock"


class DataDirBusy(Exception):
    """Another process holds the data dir."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(
            f"the data dir {data_dir} is in use by another chaingate dev ({holder}); "
            "stop that one first, or give this one another --data-dir"
        )
        self.data_dir = data_dir
        self.pid = pid


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        """Take the lock or raise ``DataDirBusy`` at once (never waits)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirBusy(self.data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no pid of a process that no longer holds it
            os.close(fd)  # closing the descriptor releases the lock

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None  # the holder is between locking and writing its pid
