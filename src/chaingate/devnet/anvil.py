"""anvil, the local devnet node: installed from its pinned npm package, started on a free port.

Used by ``chaingate dev``, by the test fixtures and by the bench — one code path for all three.
The binary lands in ``~/.cache/chaingate/anvil-<version>`` (``CHAINGATE_CACHE_DIR`` moves it;
``CHAINGATE_ANVIL`` points at an existing binary instead).  Installing announces itself: the
first run downloads ~45 MB from the npm registry (``chaingate.devnet.npm`` does the installing).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from chaingate.devnet.npm import cache_root, npm_install

ANVIL_PACKAGE = "@foundry-rs/anvil-linux-amd64"
ANVIL_VERSION = "1.7.1"
DEVNET_CHAIN_ID = 31337
# Named, not anvil's moving default: Prague brings EIP-7702 (EntryPoint v0.8's EOA accounts),
# and the ERC-7562 tracer's opcode table is Prague's (Osaka's CLZ would be "unassigned").
DEVNET_HARDFORK = "prague"

__all__ = [
    "ANVIL_PACKAGE",
    "ANVIL_VERSION",
    "DEVNET_CHAIN_ID",
    "DEVNET_HARDFORK",
    "AnvilProcess",
    "anvil_argv",
    "anvil_binary",
    "cache_root",
    "free_port",
    "rpc_call",
    "wait_ready",
]


def anvil_binary(*, install: bool = True, announce: Callable[[str], None] = print) -> Path:
    """Path of the pinned anvil, installing it from npm on first use."""
    override = os.environ.get("CHAINGATE_ANVIL")
    if override:
        return Path(override)
    marker = Path("node_modules") / ANVIL_PACKAGE / "bin" / "anvil"
    target = npm_install(
        f"anvil-{ANVIL_VERSION}",
        [f"{ANVIL_PACKAGE}@{ANVIL_VERSION}"],
        str(marker),
        what=f"anvil {ANVIL_VERSION} ({ANVIL_PACKAGE}, ~45 MB)",
        install=install,
        announce=announce,
    )
    return target / marker


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def anvil_argv(
    binary: Path,
    port: int,
    *,
    chain_id: int = DEVNET_CHAIN_ID,
    block_time: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [
        str(binary),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chain-id",
        str(chain_id),
        "--silent",
    ]
    if "--hardfork" not in extra:  # a test may ask for an older one
        argv += ["--hardfork", DEVNET_HARDFORK]
    if block_time is not None:
        argv += ["--block-time", str(block_time)]
    return argv + list(extra)


def rpc_call(
    url: str, method: str, params: list[object] | None = None, timeout: float = 5.0
) -> object:
    """One JSON-RPC call with the standard library (fixtures and readiness checks)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an HTTP URL: {url}")
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}
    ).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        reply = json.loads(response.read())
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


def wait_ready(url: str, timeout: float = 15.0) -> None:
    """Block until the node at ``url`` answers ``eth_chainId``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            rpc_call(url, "eth_chainId", timeout=1.0)
            return
        except (OSError, urllib.error.URLError, RuntimeError, ValueError):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"anvil at {url} did not become ready in {timeout:.0f}s"
                ) from None
            time.sleep(0.05)


class AnvilProcess:
    """A running anvil for tests and benchmarks (synchronous; ``chaingate dev`` uses trio)."""

    def __init__(
        self, port: int | None = None, *, chain_id: int = DEVNET_CHAIN_ID, extra: Sequence[str] = ()
    ) -> None:
        self.port = port or free_port()
        self.chain_id = chain_id
        self._argv = anvil_argv(anvil_binary(), self.port, chain_id=chain_id, extra=extra)
        self._process: subprocess.Popen[bytes] | None = None
        # anvil keeps state it evicts from memory under ~/.foundry unless told otherwise; a
        # test node keeps it in a temporary directory of its own, removed when it stops.
        self._cache: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> AnvilProcess:
        self._cache = tempfile.TemporaryDirectory(prefix="anvil-cache-")
        self._process = subprocess.Popen(
            [*self._argv, "--cache-path", self._cache.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(self.url)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._drop_cache()

    def kill(self) -> None:
        """Die like a crashed node: SIGKILL, no goodbye."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        self._drop_cache()

    def _drop_cache(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            cache.cleanup()

    def __enter__(self) -> AnvilProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
