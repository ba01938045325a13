"""A real ``chaingate serve`` process for tests that need a whole process: its stderr, its
file-descriptor limit, its memory.  Configured by a TOML file written to a tmp dir."""

from __future__ import annotations

import os
import resource
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
        self, tmp: Path, upstream_url: str, *, server: str = "", observability: str = ""
    ) -> None:
        """``server`` and ``observability``: extra TOML lines for those sections."""
        self.tmp = tmp
        self.port = free_port()
        self.config = tmp / "chaingate.toml"
        self.config.write_text(
            f'data_dir = "{tmp}"\n'
            f"[server]\nport = {self.port}\n{server}"
            "[auth]\nenabled = false\n"
            f'[observability]\nadmin_token = "{ADMIN_TOKEN}"\n{observability}'
            "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\n"
            "[chains.ethereum.devnet.follower]\nenabled = false\n"
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
            env={**os.environ, **(env or {})},
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
