"""The README's first command, run as a user would run it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from chaingate.devnet.anvil import free_port
from chaingate.devnet.npm import cache_root
from tests.helpers import read_dev_banner


def _pids_matching(pattern: str) -> list[int]:
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def dev_env(tmp_path: Path) -> dict[str, str]:
    """A home of its own: a run must never touch the user's data dir (it would revoke the keys
    of their running ``chaingate dev`` and rewrite its manifest).  The cache stays the real one
    (anvil, solc and the contracts come from npm, once)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "home" / ".local" / "share"),
        CHAINGATE_CACHE_DIR=str(cache_root()),
        PYTHONUNBUFFERED="1",
    )
    return env


def test_chaingate_dev_serves_prints_working_curl_lines_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    anvil_port = free_port()
    env = dev_env(tmp_path)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chaingate",
            "dev",
            "--port",
            str(port),
            "--anvil-port",
            str(anvil_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        text = read_dev_banner(process)
        assert "chaingate dev is up." in text, text
        assert _pids_matching(f"anvil.*--port {anvil_port}"), "anvil should be running"
        # Paste the first curl command exactly as printed.
        match = re.search(r"(curl -s \S+/v1/rpc/ethereum/devnet.*?-d '[^']*')", text, re.DOTALL)
        assert match, text
        command = match.group(1).replace("\\\n", " ")
        assert "X-API-Key: svc_test_" in command
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=10)
        reply = json.loads(result.stdout)
        assert reply["jsonrpc"] == "2.0" and reply["result"].startswith("0x")
        # The dev keys have no limits (a Growth key allows 100 requests a second): 900 calls
        # in three batches, all answered.
        assert "no rate or compute-unit limits" in text, text
        key = re.search(r"X-API-Key: (svc_test_\S+?)'", command)
        assert key, command
        burst = [{"jsonrpc": "2.0", "id": i, "method": "eth_blockNumber"} for i in range(300)]
        for _ in range(3):
            answered = httpx.post(
                f"http://127.0.0.1:{port}/v1/rpc/ethereum/devnet",
                json=burst,
                headers={"X-API-Key": key.group(1)},
                timeout=30,
            )
            assert answered.status_code == 200, answered.text
            assert all("result" in item for item in answered.json()), answered.text[:300]
        # The key in the URL, as the banner prints it, for tools that take only a URL.
        keyed = re.search(r"^ {12}(http://\S+/v1/rpc/ethereum/devnet/svc_test_\S+)$", text, re.M)
        assert keyed, text
        by_url = httpx.post(
            keyed.group(1), json={"jsonrpc": "2.0", "id": 9, "method": "eth_chainId"}, timeout=10
        )
        assert by_url.json() == {"jsonrpc": "2.0", "id": 9, "result": "0x7a69"}, by_url.text
        health = subprocess.run(
            ["curl", "-s", f"http://127.0.0.1:{port}/v1/health"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert json.loads(health.stdout)["status"] == "ok"
        # The dashboard's one-time sign-in link: it signs in once.
        link = re.search(r"^  dashboard (http://\S+/dashboard/signin/link/\S+)$", text, re.M)
        assert link, text

        def use_link(url: str) -> httpx.Response:
            # Opening it shows a button (it uses nothing); the button POSTs with CSRF.
            with httpx.Client(timeout=10) as browser:
                opened = browser.get(url)
                assert opened.status_code == 200
                token = re.search(r'name="csrf" value="([^"]+)"', opened.text)
                assert token, opened.text
                return browser.post(url, data={"csrf": token[1]})

        signed = use_link(link.group(1))
        assert signed.status_code == 303 and "cg_session=" in signed.headers["set-cookie"]
        overview = httpx.get(
            f"http://127.0.0.1:{port}/dashboard/", cookies=signed.cookies, timeout=10
        )
        assert overview.status_code == 200 and "Overview" in overview.text
        assert use_link(link.group(1)).status_code == 400
        # Every one-line command it prints answers JSON, as pasted (the data plane included;
        # the wallet it creates is new: 201).
        lines = re.findall(r"^  (curl -s [^\\\n]*?)(?:\s{2,}\(.*\))?$", text, re.MULTILINE)
        gets = [line for line in lines if "/metrics" not in line and "/rpc/" not in line]
        assert any("/v1/tokens/" in line for line in gets), text
        for line in gets:
            pasted = subprocess.run(
                ["bash", "-c", line + " -w '\\n%{http_code}'"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            body, _, status = pasted.stdout.rpartition("\n")
            assert status == ("201" if "/wallets/create" in line else "200"), (line, pasted.stdout)
            json.loads(body)
        # Token 2 of the devnet collection names its metadata by ipfs://: chaingate dev serves
        # it from a loopback gateway (no public gateway has it).
        (nft,) = [line for line in gets if "/v1/nfts/ethereum/metadata/" in line]
        second = re.sub(r"/1(?=\s|$)", "/2", nft, count=1)
        assert second != nft
        deadline = time.monotonic() + 30
        while True:
            shown = json.loads(subprocess.run(["bash", "-c", second], capture_output=True).stdout)
            if shown.get("name") == "Devnet #2" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert shown.get("name") == "Devnet #2", shown
        assert shown["description"] == "Metadata on IPFS.", shown
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0
    time.sleep(0.2)
    assert not _pids_matching(f"anvil.*--port {anvil_port}"), "anvil outlived chaingate dev"
    # Everything it keeps went under the temporary home, named in the banner.
    data_dir = tmp_path / "home" / ".local" / "share" / "chaingate" / "dev"
    assert f"manifest  {data_dir}/devnet-manifest.json" in text
    assert {p.name for p in data_dir.iterdir()} >= {
        "chaingate.db",
        "dev-keys.json",
        "devnet-chain.json",
        "devnet-manifest.json",
        "paymaster-signer.key",
        "pepper",
    }


def test_serve_reports_a_missing_config_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chaingate", "serve", "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "config file not found" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_serve_runs_a_config_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "c.toml"
    path.write_text(
        f"[server]\nport = {port}\n[chains.ethereum.mainnet]\nchain_id = 1\n"
        f'[[chains.ethereum.mainnet.upstreams]]\nurl = "http://127.0.0.1:{free_port()}"\n'
    )
    env = {**os.environ, "CHAINGATE_AUTH__PEPPER": "test-pepper-" + "x" * 32}
    env["CHAINGATE_DATA_DIR"] = str(tmp_path / "data")
    # Its output goes to a file: a pipe nobody reads fills up, and a server blocked writing
    # its log neither answers nor stops.
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "chaingate", "serve", "--config", str(path)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        reply = None
        # Until it answers or exits; the deadline only keeps a hung server from hanging CI.
        deadline = time.monotonic() + 120
        while reply is None and process.poll() is None and time.monotonic() < deadline:
            result = subprocess.run(
                ["curl", "-s", f"http://127.0.0.1:{port}/v1/health"], capture_output=True, text=True
            )
            if result.stdout:
                reply = json.loads(result.stdout)
            else:
                time.sleep(0.1)
        # The only upstream is down: the service still answers, and says it is degraded.
        assert reply is not None and reply["status"] == "degraded", log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log.read_text()


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`chaingate keys list | head -1`: the pipe's reader is gone before chaingate writes."""
    env = dev_env(tmp_path) | {
        "CHAINGATE_DATA_DIR": str(tmp_path / "data"),
        "CHAINGATE_AUTH__PEPPER": "a-pepper-for-this-test",
    }
    chaingate = [sys.executable, "-m", "chaingate", "keys"]
    made = subprocess.run(
        [*chaingate, "create", "--email", "a@example.com"], env=env, capture_output=True, timeout=60
    )
    assert made.returncode == 0, made.stdout + made.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as after `head` has exited
    try:
        listed = subprocess.run(
            [*chaingate, "list"], env=env, stdout=write_end, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write_end)
    assert listed.stderr == b""
    assert listed.returncode == 141
