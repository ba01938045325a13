"""The servers under test: chaingate (one ``chaingate serve`` process) and nginx (one worker).

Both run in their own session so a Ctrl-C in the terminal reaches only the bench, which then
stops them in order.  ``stop()`` is idempotent and escalates to SIGKILL of the whole process
group, so no worker survives its master.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from chaingate.devnet.anvil import DEVNET_CHAIN_ID, free_port, rpc_call

LOOPBACK = "127.0.0.1"
API_KEY_HEADER = "X-API-Key"
# The bench's one key: enterprise is unlimited in config/plans.toml, so no limit binds; a test
# key is enough for ethereum/devnet, a testnet.
KEY_EMAIL = "bench@chaingate.localhost"
KEY_PLAN = "enterprise"
KEY_ENV = "test"
KEY_NAME = "bench"
_KEY_ID = re.compile(r"^key (\S+) for ", re.MULTILINE)  # keys create's first line


@dataclass(frozen=True)
class Allowlists:
    """The per-key allowlists ``--allowlists on`` gives the bench's key (empty: no list)."""

    ips: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    contracts: tuple[str, ...] = ()

    def cli_args(self) -> list[str]:
        args: list[str] = []
        for flag, values in (
            ("--allow-ip", self.ips),
            ("--allow-method", self.methods),
            ("--allow-contract", self.contracts),
        ):
            if values:
                args += [flag, ",".join(values)]
        return args

    def describe(self) -> str:
        parts = [
            f"{name} {', '.join(values)}"
            for name, values in (
                ("IPs", self.ips),
                ("methods", self.methods),
                ("contracts", self.contracts),
            )
            if values
        ]
        return "; ".join(parts) or "none"


class ServerFailed(Exception):
    """A server did not start or died; the message carries the tail of its log."""


class ManagedProcess:
    """One child process in its own session, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        try:
            if process is not None:
                _terminate(process, sig, timeout)
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


def _terminate(process: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
    if process.poll() is None:
        try:
            process.send_signal(sig)
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    # The group id is the pid (start_new_session); this also reaps stray workers.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _child_env() -> dict[str, str]:
    """The environment minus CHAINGATE_<SECTION>__<KEY> overrides: the generated file rules."""
    return {
        key: value
        for key, value in os.environ.items()
        if not (key.startswith("CHAINGATE_") and ("__" in key or key == "CHAINGATE_DATA_DIR"))
    }


def chaingate_command() -> list[str]:
    """The ``chaingate`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "chaingate"
    if script.is_file():
        return [str(script)]
    found = shutil.which("chaingate")
    return [found] if found else [sys.executable, "-m", "chaingate"]


@dataclass(frozen=True)
class Auth:
    """``[auth] enabled = true`` with this pepper, keys in this SQLite store.

    chaingate servers given the same ``Auth`` share the pepper and the store, hence the keys.
    """

    pepper: str
    db_path: Path

    @classmethod
    def fresh(cls, db_path: Path) -> Auth:
        return cls(pepper=secrets.token_hex(32), db_path=db_path.resolve())

    @property
    def store_url(self) -> str:
        return f"sqlite:///{self.db_path}"  # sqlite:/// + an absolute path


@dataclass(frozen=True)
class Shared:
    """What ``serve --workers N`` (N > 1) requires: the store on PostgreSQL (a schema of the
    bench's own) and, with keys on, the rate limits in Redis."""

    store_url: str
    redis_url: str


def _auth_toml(auth: Auth | None, shared: Shared | None = None) -> str:
    store = f'\n[store]\nurl = "{shared.store_url}"\n' if shared is not None else ""
    if auth is None:
        return "\n[auth]\nenabled = false\n" + store
    redis = f'redis_url = "{shared.redis_url}"\n' if shared is not None else ""
    return f"""
[auth]
enabled = true
pepper = "{auth.pepper}"
{redis}""" + (store or f'\n[store]\nurl = "{auth.store_url}"\n')


# The network a generated config serves: the EVM devnet (anvil) or a Solana one (the devnet's
# Solana node); its path under /v1/rpc, and the call that proves a server ready through it.
EVM, SOLANA = "evm", "solana"
NETWORK_PATH = {EVM: "ethereum/devnet", SOLANA: "solana/devnet"}
READY_METHOD = {EVM: "eth_chainId", SOLANA: "getHealth"}


def _network_toml(family: str, upstream: str, upstream_extra: str) -> str:
    if family == SOLANA:
        # As config/dev.toml: the probe's getSlot answers the finalized slot, so no depth.
        return f"""[chains.solana.devnet]
family = "solana"
testnet = true
finality_depth = 0
block_time = 0.4
max_head_lag = 128

[[chains.solana.devnet.upstreams]]
name = "solana"
url = "{upstream}"
{upstream_extra}"""
    return f"""[chains.ethereum.devnet]
family = "evm"
chain_id = {DEVNET_CHAIN_ID}
testnet = true

[[chains.ethereum.devnet.upstreams]]
name = "anvil"
url = "{upstream}"
{upstream_extra}"""


def chaingate_toml(
    *,
    port: int,
    upstream: str,
    data_dir: Path,
    access_log: bool,
    coalesce: bool,
    token: str,
    auth: Auth | None,
    upstream_extra: str = "",
    workers: int = 1,
    shared: Shared | None = None,
    family: str = EVM,
) -> str:
    """``upstream_extra``: more TOML lines for the upstream (e.g. ``ca_file``); ``workers``:
    ``[server] workers`` (more than one needs ``shared``); ``family``: ``evm`` serves
    ``ethereum/devnet``, ``solana`` ``solana/devnet``."""
    return f"""# generated by bench/run.py
data_dir = "{data_dir}"

[server]
host = "{LOOPBACK}"
port = {port}
{f"workers = {workers}" if workers > 1 else "# one process (a --baseline may predate workers)"}
shutdown_grace = 2.0

[rpc]
coalesce = {str(coalesce).lower()}

[observability]
access_log = {str(access_log).lower()}
log_level = "info"
admin_token = "{token}"
{_auth_toml(auth, shared)}
{_network_toml(family, upstream, upstream_extra)}"""


class ChaingateServer:
    """``chaingate serve --config <generated toml>`` with one network, ``ethereum/devnet``
    (or ``solana/devnet`` with ``family="solana"``).

    With ``auth`` every RPC request needs an API key: ``create_key()`` makes one in the store
    (before ``start()``), or pass ``api_key`` when another server sharing ``auth`` made it.
    """

    def __init__(
        self,
        workdir: Path,
        name: str,
        upstream: str,
        *,
        access_log: bool,
        coalesce: bool,
        auth: Auth | None,
        api_key: str | None = None,
        pythonpath: Path | None = None,
        upstream_extra: str = "",
        workers: int = 1,
        shared: Shared | None = None,
        family: str = EVM,
    ) -> None:
        """``pythonpath``: run the chaingate found there (another checkout's ``src``, built)
        instead of this environment's — the bench's ``--baseline``.  ``upstream_extra``: more
        TOML lines for the upstream.  ``workers``: ``chaingate serve --workers`` (the config's
        ``[server] workers``); more than one needs ``shared``."""
        if workers > 1 and shared is None:
            raise ValueError("more than one worker needs the store on PostgreSQL (shared)")
        self.workers = workers
        self.family = family
        self.port = free_port()
        self._env = _child_env()
        if pythonpath is not None:
            self._env["PYTHONPATH"] = str(pythonpath)
        self.token = "bench-" + secrets.token_urlsafe(12)
        self.access_log = access_log
        self.coalesce = coalesce
        self.auth = auth
        self.api_key = api_key
        self.key_id: str | None = None  # set by create_key()
        data_dir = workdir / f"{name}-data"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{name}.toml"
        self.config_path.write_text(
            chaingate_toml(
                port=self.port,
                upstream=upstream,
                data_dir=data_dir,
                access_log=access_log,
                coalesce=coalesce,
                token=self.token,
                auth=auth,
                upstream_extra=upstream_extra,
                workers=workers,
                shared=shared,
                family=family,
            )
        )
        argv = [*chaingate_command(), "serve", "--config", str(self.config_path)]
        self.process = ManagedProcess(name, argv, workdir / f"{name}.log", self._env)

    @property
    def base(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def rpc_url(self) -> str:
        return f"{self.base}/v1/rpc/{NETWORK_PATH[self.family]}"

    @property
    def headers(self) -> dict[str, str]:
        """What every client request carries: the API key when auth is on."""
        return {API_KEY_HEADER: self.api_key} if self.api_key else {}

    def _keys(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """``chaingate keys --config <ours> ARGS`` in this server's environment."""
        argv = [*chaingate_command(), "keys", "--config", str(self.config_path), *args]
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self._env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ServerFailed(
                f"chaingate keys {args[0]} did not finish in {timeout:.0f}s"
            ) from None

    def create_key(self, timeout: float = 60.0, *, plan: str = KEY_PLAN, keep: bool = True) -> str:
        """One key with ``chaingate keys create`` on this server's config; kept as api_key
        (and its id, from the same output, as key_id) unless ``keep`` is False (another key,
        of another ``plan``, beside it)."""
        if self.auth is None:
            raise ValueError("auth is off: no key to create")
        done = self._keys(
            [
                "create",
                "--email", f"{plan}-{KEY_EMAIL}" if plan != KEY_PLAN else KEY_EMAIL,
                "--plan", plan,
                "--env", KEY_ENV,
                "--name", KEY_NAME,
            ],
            timeout,
        )  # fmt: skip
        prefix = f"  svc_{KEY_ENV}_"
        keys = [line.strip() for line in done.stdout.splitlines() if line.startswith(prefix)]
        ids = _KEY_ID.findall(done.stdout)
        if done.returncode != 0 or len(keys) != 1:
            raise ServerFailed(
                f"chaingate keys create exited {done.returncode} without one key:\n"
                f"{done.stdout}{done.stderr}"
            )
        if not keep:
            return keys[0]
        self.api_key = keys[0]
        self.key_id = ids[0] if len(ids) == 1 else None  # only set_allowlists needs it
        return self.api_key

    def set_allowlists(self, lists: Allowlists, timeout: float = 60.0) -> str | None:
        """``chaingate keys update <key id> --allow-...`` for the key of create_key().

        Returns what the CLI said, or None when this build's CLI has no ``keys update`` (a
        baseline from before allowlists).  Servers read allowlists from the store (within a
        second), so set them before start().
        """
        if self.key_id is None:
            raise ServerFailed("no key id: create_key() first (its output names the id)")
        done = self._keys(["update", self.key_id, *lists.cli_args()], timeout)
        if done.returncode != 0 and "invalid choice: 'update'" in done.stderr:
            return None
        if done.returncode != 0:
            raise ServerFailed(
                f"chaingate keys update exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout.strip()

    def start(self, timeout: float = 20.0) -> ChaingateServer:
        if self.auth is not None and not self.api_key:
            raise ValueError("auth is on: create_key() first, or pass api_key")
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self.process.alive():
                raise ServerFailed(f"chaingate exited at start-up:\n{self.process.log_tail()}")
            try:
                # An RPC call through the key gate: also proves the key is accepted.
                _probe(self.rpc_url, self.headers, READY_METHOD[self.family])
                if _workers_seen(self.base) >= self.workers:
                    return self
                raise RuntimeError(f"fewer than {self.workers} workers answer yet")
            except (OSError, RuntimeError, ValueError) as exc:
                if time.monotonic() > deadline:
                    raise ServerFailed(
                        f"chaingate not ready after {timeout:.0f}s ({exc}):\n"
                        f"{self.process.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.stop(signal.SIGTERM, timeout=10.0)

    def impl(self, timeout: float = 5.0) -> str:
        """The framing implementation chaingate reported at start-up (compiled or pure).  Its
        log is written by a thread of its own, so the line may land a moment after the server
        first answered: it is waited for up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                lines = self.process.log_path.read_text(errors="replace").splitlines()
            except OSError:
                lines = []
            for line in lines:
                if '"chaingate listening"' in line:
                    try:
                        return str(json.loads(line).get("impl", "unknown"))
                    except ValueError:
                        return "unknown"
            if time.monotonic() > deadline:
                return "unknown"
            time.sleep(0.05)

    def metrics(self) -> str:
        request = urllib.request.Request(
            f"{self.base}/metrics", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.read().decode())


def _probe(
    url: str, headers: Mapping[str, str], method: str = "eth_chainId", timeout: float = 1.0
) -> None:
    """One ``method`` call (no params) with these headers; raises unless it gets a result."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": []}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    if not isinstance(reply, dict) or "result" not in reply:
        raise RuntimeError(f"{method} answered {str(reply)[:200]}")


def _workers_seen(base: str, tries: int = 20) -> int:
    """How many distinct workers answered ``tries`` health checks (1 for one process): each
    check is a new connection, which any worker may accept."""
    seen: set[object] = set()
    for _ in range(tries):
        with urllib.request.urlopen(f"{base}/v1/health", timeout=1.0) as response:
            seen.add(json.loads(response.read()).get("worker"))
    return len(seen)


def nginx_conf(workdir: Path, port: int, upstream_port: int) -> str:
    return f"""# generated by bench/run.py
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {workdir}/nginx-client-body;
    proxy_temp_path {workdir}/nginx-proxy;
    fastcgi_temp_path {workdir}/nginx-fastcgi;
    uwsgi_temp_path {workdir}/nginx-uwsgi;
    scgi_temp_path {workdir}/nginx-scgi;
    # nginx closes a keep-alive connection after 1000 requests by default, client and upstream
    # side; wrk and chaingate do not, so lift the limit for a like-for-like comparison.
    keepalive_requests 1000000;

    upstream node {{
        server {LOOPBACK}:{upstream_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}

    server {{
        listen {LOOPBACK}:{port};
        location / {{
            proxy_pass http://node;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


class NginxServer:
    """nginx with one worker, reverse-proxying to the node over a keep-alive upstream pool."""

    def __init__(
        self, binary: str, workdir: Path, upstream_port: int, ready_method: str = "eth_chainId"
    ) -> None:
        """``ready_method``: the call (no params) that proves nginx and the node answer."""
        self.ready_method = ready_method
        self.port = free_port()
        self.config_path = workdir / "nginx.conf"
        self.config_path.write_text(nginx_conf(workdir, self.port, upstream_port))
        if os.geteuid() == 0:
            workdir.chmod(0o755)  # root's nginx runs its worker as nobody: it must reach workdir
        argv = [
            binary,
            "-p", str(workdir),
            "-e", str(workdir / "nginx-error.log"),
            "-c", str(self.config_path),
        ]  # fmt: skip
        self.process = ManagedProcess("nginx", argv, workdir / "nginx.log", dict(os.environ))

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/"

    def start(self, timeout: float = 10.0) -> NginxServer:
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self.process.alive():
                raise ServerFailed(f"nginx exited at start-up:\n{self._errors()}")
            try:
                rpc_call(self.url, self.ready_method, timeout=1.0)
                return self
            except (OSError, urllib.error.URLError, RuntimeError, ValueError):
                if time.monotonic() > deadline:
                    raise ServerFailed(
                        f"nginx not ready after {timeout:.0f}s:\n{self._errors()}"
                    ) from None
                time.sleep(0.05)

    def _errors(self) -> str:
        error_log = self.config_path.parent / "nginx-error.log"
        try:
            tail = error_log.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            tail = []
        return "\n".join([self.process.log_tail(), *tail])

    def stop(self) -> None:
        # SIGQUIT would wait for idle keep-alive clients; SIGTERM is nginx's fast shutdown.
        self.process.stop(signal.SIGTERM, timeout=10.0)
