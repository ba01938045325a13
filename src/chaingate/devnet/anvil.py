"""anvil, the local devnet node: installed from its pinned npm package, started on a free port.

Used by ``chaingate dev``, by the test fixtures and by the bench — one code path for all three.
The binary lands in ``~/.cache/chaingate/anvil-<version>`` (``CHAINGATE_CACHE_DIR`` moves it;
``CHAINGATE_ANVIL`` points at an existing binary instead).  Installing announces itself: the
first run downloads ~45 MB from the npm registry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

ANVIL_PACKAGE = "@foundry-rs/anvil-linux-amd64"
ANVIL_VERSION = "1.7.1"
DEVNET_CHAIN_ID = 31337


def cache_root() -> Path:
    override = os.environ.get("CHAINGATE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "chaingate"


@contextlib.contextmanager
def _install_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".anvil-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def anvil_binary(*, install: bool = True, announce: Callable[[str], None] = print) -> Path:
    """Path of the pinned anvil, installing it from npm on first use."""
    override = os.environ.get("CHAINGATE_ANVIL")
    if override:
        return Path(override)
    root = cache_root()
    target = root / f"anvil-{ANVIL_VERSION}"
    binary = target / "node_modules" / ANVIL_PACKAGE / "bin" / "anvil"
    if binary.is_file():
        return binary
    if not install:
        raise FileNotFoundError(f"anvil {ANVIL_VERSION} is not installed at {binary}")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install anvil: install Node.js 20+ (it brings npm)")
    with _install_lock(root):
        if binary.is_file():  # another process installed it while we waited
            return binary
        announce(
            f"Installing anvil {ANVIL_VERSION} from npm ({ANVIL_PACKAGE}) into {target} "
            "(first run only, ~45 MB)..."
        )
        staging = Path(tempfile.mkdtemp(dir=root, prefix=".anvil-staging-"))
        try:
            subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--prefix",
                    str(staging),
                    f"{ANVIL_PACKAGE}@{ANVIL_VERSION}",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            staged = staging / "node_modules" / ANVIL_PACKAGE / "bin" / "anvil"
            if not staged.is_file():
                raise RuntimeError(f"npm installed {ANVIL_PACKAGE} but {staged} is missing")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        announce(f"anvil {ANVIL_VERSION} installed.")
    return binary


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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> AnvilProcess:
        self._process = subprocess.Popen(
            self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(self.url)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """Die like a crashed node: SIGKILL, no goodbye."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __enter__(self) -> AnvilProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
