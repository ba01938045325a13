"""Alto (npm ``@pimlico/alto``, pinned), Pimlico's TypeScript ERC-4337 bundler, run with Node.

Installed once into chaingate's npm cache (``chaingate.devnet.npm``), like anvil.  One
``AltoServer`` is one ``alto`` process in front of a node: its own funded executor key (so two
instances on one anvil never share a nonce), the devnet's canonical EntryPoints, safe mode on
or off.  Alto deploys its simulation contracts through the deterministic deployer at start-up,
which is what its utility key pays for.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from benchkit import procs
from chaingate.devnet.anvil import free_port, rpc_call
from chaingate.devnet.npm import npm_install
from chaingate.evm.keys import PrivateKey

ALTO_VERSION = "0.0.20"
PACKAGE = "@pimlico/alto"
ENTRY = Path("node_modules/@pimlico/alto/esm/cli/alto.js")
RPC_PATH = "/rpc"


def install(announce: bool = True) -> Path:
    """The installed ``alto.js`` (npm install on first use)."""
    root = npm_install(
        f"alto-{ALTO_VERSION}",
        [f"{PACKAGE}@{ALTO_VERSION}"],
        f"node_modules/{PACKAGE}/package.json",
        what=f"Alto {ALTO_VERSION}",
        announce=print if announce else (lambda _: None),
    )
    return root / ENTRY


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        raise procs.ServerFailed("Node.js is needed to run Alto: install Node.js 20+")
    return node


class AltoServer:
    """``alto --safe-mode <safe>`` on a free loopback port, in front of ``node_url``."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        node_url: str,
        entry_points: list[str],
        *,
        safe: bool,
        executor: PrivateKey,
        log_level: str = "warn",
    ) -> None:
        self.name = name
        self.safe = safe
        self.port = free_port()
        self.node_url = node_url
        self.executor = executor
        key = executor.hex()  # a throwaway key of the run (on the command line: Alto wants it so)
        argv = [
            node_binary(),
            str(install()),
            "--entrypoints", ",".join(entry_points),
            "--executor-private-keys", key,
            "--utility-private-key", key,
            "--rpc-url", node_url,
            "--port", str(self.port),
            "--safe-mode", str(safe).lower(),
            "--json",
            "--log-level", log_level,
        ]  # fmt: skip
        self.argv = argv
        self.process = procs.ManagedProcess(
            name, argv, workdir / f"{name}.log", {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        )

    @property
    def url(self) -> str:
        # Alto listens on every interface; the bench talks to it over loopback.
        return f"http://{procs.LOOPBACK}:{self.port}{RPC_PATH}"

    def start(self, timeout: float = 60.0) -> AltoServer:
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self.process.alive():
                raise procs.ServerFailed(
                    f"{self.name} exited at start-up:\n{self.process.log_tail()}"
                )
            try:
                rpc_call(self.url, "eth_supportedEntryPoints", timeout=1.0)
                return self
            except (OSError, RuntimeError, ValueError) as exc:
                if time.monotonic() > deadline:
                    raise procs.ServerFailed(
                        f"{self.name} not ready after {timeout:.0f}s ({exc}):\n"
                        f"{self.process.log_tail()}"
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.stop()
