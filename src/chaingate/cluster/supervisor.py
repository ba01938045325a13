"""The parent of ``chaingate serve --workers N``: N worker processes on one port.

The parent binds the port first with SO_REUSEPORT and keeps that socket (bound, never
listening: the kernel hands connections only to listening sockets), which both checks the
address once with a clear error and holds the port — a resolved ``port = 0`` too — while
workers come and go.  Each worker is an ordinary ``chaingate serve`` of one process, told by
the environment to listen with SO_REUSEPORT on that port; the kernel spreads connections
over the workers' listeners.

A worker that dies is started again (after a pause that grows while it keeps dying at once);
one that exits with code 2 (its configuration is refused) stops them all.  SIGINT or SIGTERM:
each worker gets SIGTERM and drains as ``chaingate serve`` does; a second signal, or
``server.shutdown_grace`` + a margin passed, kills what is left.  Workers run in a session of
their own (a Ctrl-C reaches them through the parent only, once) and stop by themselves when
the parent is gone (``watch_parent``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence

import trio

log = logging.getLogger("chaingate.supervisor")

# Environment of a worker: the parent's pid (a worker stops when its parent is gone) and
# its slot (for logs).
PARENT_ENV = "CHAINGATE_SUPERVISOR_PID"
SLOT_ENV = "CHAINGATE_WORKER_SLOT"
CONFIG_EXIT = 2
QUICK_DEATH = 5.0  # a worker that dies sooner than this after its start is restarted later
MAX_PAUSE = 10.0
STOP_MARGIN = 5.0  # beyond shutdown_grace before the remaining workers are killed
PARENT_POLL = 1.0


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT, not listening."""
    family, type_, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def restart_pause(quick_deaths: int) -> float:
    """Pause before starting a worker again: none after one that ran a while, then growing."""
    return 0.0 if quick_deaths == 0 else min(MAX_PAUSE, 0.5 * 2 ** (quick_deaths - 1))


class Supervisor:
    def __init__(
        self,
        config_path: str,
        count: int,
        port: int,
        *,
        shutdown_grace: float,
        command: Sequence[str] | None = None,
    ) -> None:
        self.config_path = config_path
        self.count = count
        self.port = port
        self.stop_after = shutdown_grace + STOP_MARGIN
        self.command = list(command or [sys.executable, "-m", "chaingate", "serve"])
        self.workers: dict[int, trio.Process] = {}  # slot -> process
        self.restarts = 0
        self.exit_code = 0
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        self._exited = trio.Event()  # set (and replaced) whenever a worker exits

    def _environment(self, slot: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "CHAINGATE_SERVER__WORKERS": "1",
                "CHAINGATE_SERVER__PORT": str(self.port),
                "CHAINGATE_SERVER__REUSE_PORT": "true",
                PARENT_ENV: str(os.getpid()),
                SLOT_ENV: str(slot),
            }
        )
        return env

    async def run(self) -> int:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for slot in range(self.count):
                    nursery.start_soon(self._keep, slot)
                log.info(
                    "supervising workers",
                    extra={"fields": {"workers": self.count, "port": self.port}},
                )
                async for signum in signals:
                    if self._stopping:
                        self._signal_all(signal.SIGKILL)
                        continue
                    log.info(
                        "stopping workers",
                        extra={"fields": {"signal": signal.Signals(signum).name}},
                    )
                    nursery.start_soon(self.stop, nursery.cancel_scope)
        return self.exit_code

    async def stop(self, scope: trio.CancelScope) -> None:
        """SIGTERM to every worker; SIGKILL to those still there after the grace."""
        if self._stopping:
            return
        self._stopping = True
        self._signal_all(signal.SIGTERM)
        with trio.move_on_after(self.stop_after):
            await self._all_gone()
        if self.workers:
            log.warning("workers did not stop in time; killing them")
            self._signal_all(signal.SIGKILL)
            await self._all_gone()
        scope.cancel()

    async def _all_gone(self) -> None:
        while self.workers:
            await self._exited.wait()

    def _signal_all(self, signum: int) -> None:
        for process in self.workers.values():
            if process.returncode is None:
                process.send_signal(signum)

    async def _keep(self, slot: int) -> None:
        """One worker slot: start, wait, start again, until stopping."""
        quick_deaths = 0
        while not self._stopping:
            started = time.monotonic()
            process = await trio.lowlevel.open_process(
                [*self.command, "--config", self.config_path],
                env=self._environment(slot),
                start_new_session=True,
            )
            self.workers[slot] = process
            if self._stopping:  # started while the others were told to stop
                process.send_signal(signal.SIGTERM)
            log.info("worker started", extra={"fields": {"slot": slot, "pid": process.pid}})
            try:
                with trio.CancelScope(shield=True):  # a stopping parent still reaps it
                    code = await process.wait()
            finally:
                del self.workers[slot]
                self._exited.set()
                self._exited = trio.Event()
            if self._stopping:
                return
            if code == CONFIG_EXIT:
                log.error("a worker refused the configuration; stopping all")
                self.exit_code = CONFIG_EXIT
                assert self._nursery is not None
                self._nursery.start_soon(self.stop, self._nursery.cancel_scope)
                return
            quick_deaths = quick_deaths + 1 if time.monotonic() - started < QUICK_DEATH else 0
            self.restarts += 1
            pause = restart_pause(quick_deaths)
            log.warning(
                "worker died; starting another",
                extra={"fields": {"slot": slot, "pid": process.pid, "code": code, "pause": pause}},
            )
            await trio.sleep(pause)


async def watch_parent(parent_pid: int) -> None:
    """Returns when the supervising parent is gone (a worker then shuts down)."""
    while True:
        await trio.sleep(PARENT_POLL)
        if os.getppid() != parent_pid:
            return
