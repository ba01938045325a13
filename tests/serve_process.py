"""A real ``chaingate serve`` process for tests that need a whole process: its stderr, its
file-descriptor limit, its memory.  Configured by a TOML file written to a tmp dir."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

from chaingate.devnet.anvil import free_port

ADMIN_TOKEN = "serve-process-admin-token"


class ServeProcess:
    def __init__(
        self,
        tmp: Path,
        upstream_url: str,
        *,
        server: str = "",
        observability: str = "",
        keys: bool = False,
        follow: bool = False,
        store_url: str = "",
        auth: str = "",
    ) -> None:
        """``server`` and ``observability``: extra TOML lines for those sections; ``keys``:
        API keys on (``create_key`` makes one); ``follow``: the devnet's chain follower on;
        ``store_url``: the store (else SQLite under ``tmp``); ``auth``: extra [auth] lines."""
        self.tmp = tmp
        self.port = free_port()
        self.config = tmp / "chaingate.toml"
        self.env = {"CHAINGATE_AUTH__PEPPER": "serve-process-pepper-" + "p" * 32}
        auth = ("[auth]\nrefresh_interval = 0.1\n" if keys else "[auth]\nenabled = false\n") + auth
        follower = "poll_interval = 0.05\n" if follow else "enabled = false\n"
        self.config.write_text(
            f'data_dir = "{tmp}"\n'
            f"[server]\nport = {self.port}\n{server}"
            f"{auth}"
            f'[store]\nurl = "{store_url}"\n'
            f'[observability]\nadmin_token = "{ADMIN_TOKEN}"\n{observability}'
            "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\nblock_time = 1.0\n"
            f"[chains.ethereum.devnet.follower]\n{follower}"
            f'[[chains.ethereum.devnet.upstreams]]\nurl = "{upstream_url}"\nname = "anvil"\n'
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(
        self,
        *,
        stderr: int | IO[bytes] = subprocess.DEVNULL,
        fd_limit: int | None = None,
        env: dict[str, str] | None = None,
    ) -> ServeProcess:
        preexec: Callable[[], None] | None = None
        if fd_limit is not None:
            limit = fd_limit

            def preexec() -> None:  # runs in the child before exec
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.process = subprocess.Popen(
            [sys.executable, "-m", "chaingate", "serve", "--config", str(self.config)],
            env={**os.environ, **self.env, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=preexec,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.base}/v1/health", timeout=1).status_code in (200, 503):
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise AssertionError(f"chaingate serve exited with {self.process.returncode}")
            assert time.monotonic() < deadline, "chaingate serve did not start"
            time.sleep(0.1)

    def create_key(self, plan: str = "growth", env: str = "test", scopes: str = "") -> str:
        """A new API key (``chaingate keys create``), visible to the server within 0.1 s."""
        args = ["--email", f"{plan}-{time.monotonic_ns()}@t", "--plan", plan, "--env", env]
        if scopes:
            args += ["--scopes", scopes]
        command = [sys.executable, "-m", "chaingate", "keys", "--config", str(self.config)]
        result = subprocess.run(
            [*command, "create", *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        key = next(
            line.strip() for line in result.stdout.splitlines() if line.strip().startswith("svc_")
        )
        time.sleep(0.3)
        return key

    def metrics(self) -> str:
        response = httpx.get(
            f"{self.base}/metrics",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return response.text

    def metric(self, name: str, labels: str = "") -> float:
        line = f"{name}{{{labels}}} " if labels else f"{name} "
        for row in self.metrics().splitlines():
            if row.startswith(line):
                return float(row.split()[-1])
        raise AssertionError(f"metric {line!r} not found")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class KillableServe:
    """A ``chaingate serve --config`` process started and killed (``kill -9``) at will, its
    stderr appended to ``log``: for crash tests, which restart it on the same data."""

    def __init__(self, config: Path, env: dict[str, str], log: Path) -> None:
        self.config = config
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "chaingate", "serve", "--config", str(self.config)],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        return self.process

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
