"""anvil under ``chaingate dev``: started, its chain saved, restarted if it dies, stopped last.

* anvil runs in a session of its own, so the terminal's Ctrl-C reaches only chaingate, which
  saves the chain while anvil still runs and only then stops it (SIGTERM, then SIGKILL).
* Once tracked (``track``), the chain is saved to the data dir every ``SAVE_INTERVAL`` seconds
  when a new block has come (less often when a save is slow: a save takes at most a fifth of
  the time), and on every stop (Ctrl-C, SIGTERM, SIGHUP, a failure elsewhere): a crash of
  chaingate or anvil loses at most the last few seconds.
* When anvil dies under us: one line says so, and it is started again on the same port from
  the last saved chain (the gateway's upstream comes back by itself; blocks mined since that
  save are gone, which the follower sees as a reorg).  A second death within
  ``RESTART_WINDOW`` seconds gives up: ``failure`` says why and ``run`` returns.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import subprocess
import urllib.error
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import trio

from chaingate.devnet import anvil, persist, statedump
from chaingate.devnet.chainfile import SavedChain
from chaingate.devnet.rpc import RpcError

log = logging.getLogger("chaingate.devnet")

SAVE_INTERVAL = 2.0
RESTART_WINDOW = 60.0
READY_TIMEOUT = 15.0
# A save on stop finishes, or is given up, within this many seconds.
STOP_SAVE_TIMEOUT = 30.0
TERMINATE_GRACE = 5.0
RESTART_STATE_FILE = ".devnet-restart-state.json"

# What a save can fail with while anvil is dying or gone.
SAVE_ERRORS = (
    OSError,
    RpcError,
    RuntimeError,
    ValueError,
    KeyError,
    persist.RestoreError,
    statedump.DumpError,
)


class NodeFailed(RuntimeError):
    """anvil did not come up."""


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class DevNode:
    def __init__(
        self,
        argv: Sequence[str],
        url: str,
        chain_path: Path,
        *,
        say: Callable[[str], None],
        save_interval: float = SAVE_INTERVAL,
        restart_window: float = RESTART_WINDOW,
    ) -> None:
        self.argv = list(argv)
        self.url = url
        self.chain_path = chain_path
        self.save_interval = save_interval
        self.restart_window = restart_window
        self._say = say
        self.saved: SavedChain | None = None  # the chain as last saved, once tracked
        self.failure: str | None = None  # why it gave up
        self.restarts = 0
        self._process: trio.Process | None = None
        # Held by every save and by a restart: a save never dumps a node being restored.
        self._lock = trio.Lock()
        self._tracking = trio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def track(self, saved: SavedChain) -> None:
        """The node now serves ``saved``'s chain: save it from now on, restart into it."""
        self.saved = saved
        self._tracking.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start anvil (started() once it answers) and look after it until cancelled."""
        try:
            self._check_port_free()
            self._process = await self._spawn()
            await self._wait_ready(self._process)  # NodeFailed: raised from nursery.start()
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._save_periodically)
                await self._watch()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop()

    # --- saving --------------------------------------------------------------------------

    async def save(self, *, if_moved: bool = False) -> bool:
        """Save the running chain now; False when there was nothing (new) to save."""
        async with self._lock:
            current, process = self.saved, self._process
            if current is None or process is None or process.returncode is not None:
                return False
            new = await trio.to_thread.run_sync(
                lambda: persist.save(self.url, self.chain_path, current, if_moved=if_moved)
            )
            if new is None:
                return False
            self.saved = new
            return True

    async def _save_periodically(self) -> None:
        await self._tracking.wait()
        failures = 0
        took = 0.0
        while True:
            # A big chain takes a while to dump: never spend more than a fifth of the time on it.
            await trio.sleep(max(self.save_interval, 4 * took))
            started = trio.current_time()
            try:
                if await self.save(if_moved=True):
                    took = trio.current_time() - started
                failures = 0
            except SAVE_ERRORS as exc:
                # Most often anvil dying under the save: the watcher says so.  Otherwise say it
                # once, not every interval.
                failures += 1
                if failures == 1:
                    log.warning("devnet save failed", extra={"fields": {"error": str(exc)}})

    # --- the process ---------------------------------------------------------------------

    def _check_port_free(self) -> None:
        """Another node answering on our port would be taken for ours (and its chain saved as
        the devnet's): refuse to start instead."""
        parts = urlsplit(self.url)
        with socket.socket() as probe:
            # As anvil binds: connections of an earlier run in TIME_WAIT do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((parts.hostname or "127.0.0.1", parts.port or 80))
            except OSError:
                raise NodeFailed(
                    f"{parts.hostname}:{parts.port} is in use (another anvil?); "
                    "stop it or give another --anvil-port"
                ) from None

    async def _spawn(self, *extra: str) -> trio.Process:
        return await trio.lowlevel.open_process(
            [*self.argv, *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is ours to handle, not anvil's
        )

    async def _wait_ready(self, process: trio.Process) -> None:
        with trio.move_on_after(READY_TIMEOUT):
            while process.returncode is None:
                try:
                    await trio.to_thread.run_sync(
                        anvil.rpc_call, self.url, "eth_chainId", None, 1.0
                    )
                    return
                except (OSError, urllib.error.URLError, RuntimeError, ValueError):
                    await trio.sleep(0.05)
            code = process.returncode
            assert code is not None
            raise NodeFailed(f"anvil (pid {process.pid}) exited at start ({describe_exit(code)})")
        raise NodeFailed(f"anvil at {self.url} did not answer within {READY_TIMEOUT:.0f} s")

    async def _watch(self) -> None:
        """Wait for anvil to die; restart it, or give up (``failure``) and return."""
        last_restart = -math.inf
        while True:
            process = self._process
            assert process is not None
            code = await process.wait()
            async with self._lock:  # a renew in progress finishes first
                if self._process is not process:
                    continue  # replaced on purpose (renew)
            what = f"anvil (pid {process.pid}) died ({describe_exit(code)})"
            saved = self.saved
            if saved is None:
                self.failure = f"{what} while the devnet was starting"
                return
            if trio.current_time() - last_restart < self.restart_window:
                self.failure = (
                    f"{what} again within {self.restart_window:.0f} s of its restart; stopping. "
                    f"The chain is saved in {self.chain_path} (block {saved.head})"
                )
                return
            self._say(f"{what}; restarting it with the chain saved at block {saved.head}")
            last_restart = trio.current_time()
            try:
                await self._restart()
            except (NodeFailed, persist.RestoreError, OSError, RpcError, RuntimeError) as exc:
                self.failure = f"could not restart anvil: {exc}"
                # Whatever this anvil serves is not the saved chain: never save it over it.
                self._tracking = trio.Event()
                return
            self.restarts += 1

    async def renew(self) -> None:
        """Replace anvil with a fresh one on the same port (an empty chain, nothing loaded)."""
        async with self._lock:
            old = self._process
            if old is not None and old.returncode is None:
                old.terminate()
                await old.wait()
            self._process = await self._spawn()
            await self._wait_ready(self._process)

    async def _restart(self) -> None:
        async with self._lock:
            saved = self.saved
            assert saved is not None
            # Started from the saved state (--load-state), not loaded into it afterwards: the
            # gateway and its follower never see an empty chain in between.
            state_file = self.chain_path.with_name(RESTART_STATE_FILE)
            await trio.to_thread.run_sync(persist.write_state_file, saved, state_file)
            try:
                self._process = await self._spawn("--load-state", str(state_file))
                await self._wait_ready(self._process)
            finally:
                await trio.to_thread.run_sync(lambda: state_file.unlink(missing_ok=True))
            await trio.to_thread.run_sync(persist.check_loaded, self.url, saved)
        self._say(
            f"anvil restarted (pid {self._process.pid}); the chain continues from block "
            f"{saved.head}"
        )

    async def _stop(self) -> None:
        """Save (when the chain is tracked and anvil alive), then stop anvil.  Shielded."""
        process = self._process
        if process is None:
            return
        if process.returncode is None and self._tracking.is_set():
            with trio.move_on_after(STOP_SAVE_TIMEOUT) as scope:
                try:
                    await self.save()
                except Exception as exc:  # whatever it was, anvil must still be stopped
                    self._say(f"warning: could not save the devnet chain on stop: {exc}")
            if scope.cancelled_caught:
                self._say("warning: saving the devnet chain on stop timed out")
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(TERMINATE_GRACE):
                await process.wait()
            if process.returncode is None:
                process.kill()
        await process.wait()
