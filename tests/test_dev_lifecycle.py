"""``chaingate dev`` run as a user runs it, across restarts: the chain and the keys continue, a
new chain resets what the store derived from the old one, a second one on the same data dir is
refused, and a killed anvil is restarted once, then chaingate dev stops cleanly.

Every run has a temporary HOME and data dir: no test touches the user's real data dir.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaingate.devnet import chainfile
from chaingate.devnet.anvil import AnvilProcess, free_port, rpc_call
from chaingate.devnet.npm import cache_root
from tests.conftest import DEVNET_SIGNER

FINALITY = 2  # config/dev.toml


def dev_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``chaingate dev`` under test: a temporary home, the real cache
    (anvil, solc and the contracts come from npm once; the devnet state cache is shared with
    the ``devnet`` fixture), no CHAINGATE_* setting of the developer's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "home" / ".local" / "share"),
        CHAINGATE_CACHE_DIR=str(cache_root()),
        PYTHONUNBUFFERED="1",
    )
    return env


class Dev:
    """One ``chaingate dev`` process; every line it prints is kept (read by a thread, so the
    pipe never fills)."""

    def __init__(self, tmp_path: Path, data_dir: Path, anvil_port: int = 0) -> None:
        self.port = free_port()
        self.anvil_port = anvil_port or free_port()
        key_file = tmp_path / "signer.key"
        key_file.write_text(DEVNET_SIGNER.hex())
        self.data_dir = data_dir
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chaingate",
                "dev",
                "--port",
                str(self.port),
                "--anvil-port",
                str(self.anvil_port),
                "--data-dir",
                str(data_dir),
                "--paymaster-key",
                str(key_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dev_env(tmp_path),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    @property
    def said(self) -> list[str]:
        """What it said to the user (the JSON log lines left out)."""
        return [line.rstrip("\n") for line in self.lines if not line.startswith("{")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def anvil_url(self) -> str:
        return f"http://127.0.0.1:{self.anvil_port}"

    def wait_for(self, pattern: str, limit: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text, re.MULTILINE)
            if match:
                return match
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in:\n{self.text}")

    def up(self) -> tuple[str, str]:
        """Wait for the banner; the test and live keys it shows."""
        self.wait_for(r"^Ctrl-C stops", limit=120)
        test_key = self.wait_for(r"test key\s+(svc_test_\w+)").group(1)
        live_key = self.wait_for(r"live key\s+(svc_live_\w+)").group(1)
        return test_key, live_key

    def rpc(self, key: str, method: str, params: list[Any] | None = None) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
        result = subprocess.run(
            [
                *("curl", "-s", f"{self.url}/v1/rpc/ethereum/devnet"),
                *("-H", f"X-API-Key: {key}", "-H", "Content-Type: application/json"),
                *("-d", body),
            ],
            capture_output=True,
            text=True,
            timeout=15,
        )
        return json.loads(result.stdout)

    def health(self) -> dict[str, Any]:
        result = subprocess.run(
            ["curl", "-s", f"{self.url}/v1/health"], capture_output=True, text=True, timeout=15
        )
        network: dict[str, Any] = json.loads(result.stdout)["networks"][0]
        return network

    def index_at(self, key: str, block: int, limit: float = 30) -> None:
        """Until the token index has committed ``block`` (it trails the follower by a batch)."""
        deadline = time.monotonic() + limit
        at = None
        while time.monotonic() < deadline:
            result = subprocess.run(
                [
                    *("curl", "-s", f"{self.url}/v1/tokens/ethereum/balances/0x{'0' * 40}"),
                    *("-H", f"X-API-Key: {key}"),
                ],
                capture_output=True,
                text=True,
                timeout=15,
            )
            at = json.loads(result.stdout).get("block_number")
            if at is not None and at >= block:
                return
            time.sleep(0.1)
        raise AssertionError(f"the index never reached block {block} (at {at})\n{self.text}")

    def follower_at(self, block: int, limit: float = 20) -> dict[str, Any]:
        """The follower's health once it has applied ``block``."""
        deadline = time.monotonic() + limit
        follower: dict[str, Any] = {}
        while time.monotonic() < deadline:
            follower = self.health().get("follower") or {}
            if follower.get("block") == block:
                return follower
            time.sleep(0.05)
        raise AssertionError(f"follower never reached block {block}: {follower}\n{self.text}")

    def anvil_pids(self) -> list[int]:
        found = subprocess.run(
            ["pgrep", "-f", f"anvil.*--port {self.anvil_port}"], capture_output=True, text=True
        )
        return [int(pid) for pid in found.stdout.split()]

    def stop(self, signum: int = signal.SIGINT) -> int:
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(timeout=5)
        return code

    def kill_dev_only(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        self.kill_dev_only()
        for pid in self.anvil_pids():  # an anvil of this test's port, orphaned by the kill
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Callable[[], Dev]]:
    started: list[Dev] = []
    data_dir = tmp_path / "data"

    def start() -> Dev:
        run = Dev(tmp_path, data_dir)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill()


def node(url: str, method: str, *params: Any) -> Any:
    return rpc_call(url, method, list(params))


def head_of(url: str) -> tuple[int, str]:
    block = node(url, "eth_getBlockByNumber", "latest", False)
    return int(block["number"], 16), block["hash"]


def gone(run: Dev) -> bool:
    time.sleep(0.2)
    return not run.anvil_pids()


def test_dev_continues_its_chain_and_its_keys_across_restarts(
    dev: Callable[[], Dev], tmp_path: Path
) -> None:
    first = dev()
    keys = first.up()
    assert "chaingate dev is up." in first.text
    kept = first.data_dir / "dev-keys.json"
    assert json.loads(kept.read_text()) == {"test": keys[0], "live": keys[1]}
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    node(first.anvil_url, "anvil_mine", "0x5")
    node(first.anvil_url, "anvil_setBalance", DEVNET_SIGNER.address, "0xabc")
    head = head_of(first.anvil_url)
    first.follower_at(head[0])
    # Stopped right away: only the save on stop can have these blocks and that balance.
    assert first.stop(signal.SIGTERM) == 0
    assert gone(first), "anvil outlived chaingate dev"
    saved = chainfile.load(first.data_dir / chainfile.CHAIN_FILE)
    assert (saved.head, saved.head_hash) == head
    assert stat.S_IMODE((first.data_dir / chainfile.CHAIN_FILE).stat().st_mode) == 0o600

    second = dev()
    assert second.up() == keys  # the same keys: pasted curl lines keep working
    assert f"devnet: continuing the chain saved in {second.data_dir}" in second.text
    assert f"(block {head[0]})" in second.text
    assert "new chain" not in second.text
    block = second.rpc(keys[0], "eth_getBlockByNumber", [hex(head[0]), False])["result"]
    assert block["hash"] == head[1]
    balance = second.rpc(keys[1], "eth_getBalance", [DEVNET_SIGNER.address, "latest"])
    assert balance["result"] == "0xabc"
    # The follower resumes where it stopped: the same chain, no reorg, finality below the head.
    follower = second.follower_at(head[0])
    assert follower["finalized"] == head[0] - FINALITY
    node(second.anvil_url, "anvil_mine", "0x1")
    assert second.follower_at(head[0] + 1)["finalized"] == head[0] + 1 - FINALITY
    assert "reorg" not in second.text
    # SIGHUP (its terminal closed) saves and stops too.
    assert second.stop(signal.SIGHUP) == 0
    assert gone(second)
    assert chainfile.load(second.data_dir / chainfile.CHAIN_FILE).head == head[0] + 1
    assert "Traceback" not in first.text + second.text


def test_a_new_chain_resets_what_the_store_derived_from_the_old_one(
    dev: Callable[[], Dev],
) -> None:
    first = dev()
    test_key, _ = first.up()
    node(first.anvil_url, "anvil_mine", hex(30))
    head = head_of(first.anvil_url)
    first.follower_at(head[0])
    first.index_at(test_key, head[0] - FINALITY)  # the index has rows of its own to reset
    assert first.stop() == 0
    (first.data_dir / chainfile.CHAIN_FILE).unlink()  # the saved chain is lost

    second = dev()
    second.up()
    reset = second.wait_for(r"^devnet: this is a new chain .*$").group(0)
    assert reset.startswith(
        f"devnet: this is a new chain (no saved chain in {second.data_dir / chainfile.CHAIN_FILE}"
        "); reset what the store derived from the previous one (1 row of chain_cursors, "
    )
    # The follower's rows, and the index's and the metadata's: no balance of the old chain
    # survives it (the index's tables are known to the reset before any indexer exists).
    for derived in ("rows of chain_blocks", "1 row of idx_cursors", "rows of idx_balances"):
        assert derived in reset, (derived, reset)
    assert [line for line in second.said if "new chain" in line] == [reset]
    new_head = head_of(second.anvil_url)
    assert new_head[0] < head[0]
    follower = second.follower_at(new_head[0])
    assert follower["finalized"] == new_head[0] - FINALITY  # not the old chain's
    assert "reorg deeper" not in second.text
    assert second.stop() == 0

    # An unreadable saved chain (cut short): set aside, said so, and reset again.
    path = second.data_dir / chainfile.CHAIN_FILE
    path.write_text(path.read_text()[:50])
    third = dev()
    third.up()
    assert (second.data_dir / f"{chainfile.CHAIN_FILE}.unusable").exists()
    assert third.wait_for(r"^devnet: .* is not a saved chain.*starting a new chain$")
    assert third.wait_for(r"^devnet: this is a new chain \(the saved chain was unusable")
    assert third.follower_at(head_of(third.anvil_url)[0])["finalized"] >= -1
    assert third.stop() == 0
    assert "Traceback" not in first.text + second.text + third.text


def test_every_demo_nft_shows_its_metadata_data_ipfs_and_https(dev: Callable[[], Dev]) -> None:
    """The banner's holder's NFTs and the collection's token 3 name their documents by
    ``data:``, ``ipfs://`` and ``https://`` (the devnet's host, the items' ``{id}`` template, the
    updatable collection's base URI): under chaingate dev every one is served, none failed."""
    run = dev()
    key, _ = run.up()
    owned_line = run.wait_for(r"curl -s (\S+/v1/nfts/ethereum/owned/0x[0-9a-fA-F]{40})").group(1)
    collection = run.wait_for(r"/v1/nfts/ethereum/collection/(0x[0-9a-fA-F]{40})").group(1)
    headers = {"X-API-Key": key}
    deadline = time.monotonic() + 30
    while True:
        nfts = httpx.get(owned_line, headers=headers, timeout=10).json()["nfts"]
        statuses = {(n["contract"], n["token_id"]): n["metadata_status"] for n in nfts}
        if "pending" not in statuses.values() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(statuses) == 4 and set(statuses.values()) == {"ok"}, nfts
    names = {n["name"] for n in nfts}
    assert {"Devnet #1", "Devnet #2", "Devnet item 2", "Updatable #2"} == names, names
    third = httpx.get(
        f"{run.url}/v1/nfts/ethereum/metadata/{collection}/3", headers=headers, timeout=10
    ).json()
    assert (third["metadata_status"], third["name"]) == ("ok", "Devnet #3"), third
    assert third["token_uri"] == "https://metadata.chaingate.localhost/devnet/collection/3.json"
    assert run.stop() == 0


def test_a_second_dev_on_the_same_data_dir_is_refused(dev: Callable[[], Dev]) -> None:
    first = dev()
    keys = first.up()
    manifest = (first.data_dir / "devnet-manifest.json").read_bytes()
    second = dev()
    assert second.process.wait(timeout=60) == 1
    second._reader.join(timeout=5)
    assert second.said == [
        f"error: the data dir {first.data_dir} is in use by another chaingate dev "
        f"(pid {first.process.pid}); stop that one first, or give this one another --data-dir"
    ]
    assert not second.anvil_pids()
    # The first one is untouched: its keys still work, its manifest is the same file.
    assert first.rpc(keys[0], "eth_chainId")["result"] == "0x7a69"
    assert (first.data_dir / "devnet-manifest.json").read_bytes() == manifest
    assert first.stop() == 0


def test_a_killed_anvil_is_restarted_once_then_dev_stops_cleanly(dev: Callable[[], Dev]) -> None:
    run = dev()
    keys = run.up()
    node(run.anvil_url, "anvil_mine", "0x3")
    head = head_of(run.anvil_url)
    path = run.data_dir / chainfile.CHAIN_FILE
    deadline = time.monotonic() + 10
    while chainfile.load(path).head != head[0]:  # the periodic save
        assert time.monotonic() < deadline, "the chain was not saved while running"
        time.sleep(0.1)
    [pid] = run.anvil_pids()
    os.kill(pid, signal.SIGKILL)
    run.wait_for(
        rf"^anvil \(pid {pid}\) died \(killed by SIGKILL\); restarting it with the chain saved "
        rf"at block {head[0]}$"
    )
    restarted = int(run.wait_for(r"^anvil restarted \(pid (\d+)\)").group(1))
    assert run.anvil_pids() == [restarted] != [pid]
    # The same chain, served again through the same gateway, and followed on.
    deadline = time.monotonic() + 15
    while (reply := run.rpc(keys[0], "eth_getBlockByNumber", ["latest", False])).get(
        "result"
    ) is None:
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)
    assert (int(reply["result"]["number"], 16), reply["result"]["hash"]) == head
    assert run.rpc(keys[0], "anvil_mine", ["0x1"])["result"] is None
    assert run.follower_at(head[0] + 1)["finalized"] == head[0] + 1 - FINALITY
    # Restarted from its saved state: never an empty chain in between, so no reorg either.
    assert "reorg" not in run.text
    # Dead again at once: no restart loop, a clear line, status 1, no traceback.
    os.kill(restarted, signal.SIGKILL)
    assert run.process.wait(timeout=40) == 1
    run._reader.join(timeout=5)
    assert run.said[-1].startswith(
        f"error: anvil (pid {restarted}) died (killed by SIGKILL) again within 60 s of its "
        f"restart; stopping. The chain is saved in {path}"
    )
    assert "Traceback" not in run.text
    assert not run.anvil_pids()
    assert chainfile.load(path).head >= head[0]


def test_dev_refuses_an_anvil_port_another_node_answers_on(
    tmp_path: Path, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    """That node would be taken for the devnet, bootstrapped and saved as its chain."""
    other = anvil_factory()
    before = head_of(other.url)
    run = Dev(tmp_path, tmp_path / "data", anvil_port=other.port)
    try:
        assert run.process.wait(timeout=60) == 1
    finally:
        run.kill_dev_only()
    run._reader.join(timeout=5)
    assert run.said == [
        f"error: cannot start anvil: 127.0.0.1:{other.port} is in use (another anvil?); "
        "stop it or give another --anvil-port"
    ]
    assert head_of(other.url) == before  # nothing was deployed onto it
    assert not (tmp_path / "data" / chainfile.CHAIN_FILE).exists()
