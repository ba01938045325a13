"""A key in the URL, as the tools that take only a URL use it: Foundry's ``cast`` (npm, pinned)
and viem (npm, pinned, run with Node), against a real gateway with keys on and anvil behind.

Both must get answers through ``/v1/rpc/{chain}/{network}/{key}`` and, for a wrong key, show
the refusal's reason (its JSON-RPC body), not "invalid response".
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import trio

from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.npm import npm_install
from chaingate.twins import Impl
from tests.node_clients import run_script
from tests.test_auth import auth_settings, start_auth

CAST_PACKAGE = "@foundry-rs/cast-linux-amd64"
CAST_VERSION = "1.7.1"  # the anvil release chaingate pins
RPC = "/v1/rpc/ethereum/devnet"
WRONG = "svc_test_" + "W" * 43


def cast_binary() -> Path:
    marker = Path("node_modules") / CAST_PACKAGE / "bin" / "cast"
    root = npm_install(
        f"cast-{CAST_VERSION}",
        [f"{CAST_PACKAGE}@{CAST_VERSION}"],
        str(marker),
        what=f"cast {CAST_VERSION} ({CAST_PACKAGE})",
        announce=lambda _: None,
    )
    return root / marker


def cast(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cast_binary()), *args], capture_output=True, text=True, timeout=60, check=False
    )


async def test_cast_takes_the_key_in_the_url(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    )
    key, _ = await stack.key()
    base = f"http://127.0.0.1:{stack.handle.port}{RPC}"
    expected = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    done = await trio.to_thread.run_sync(cast, "block-number", "--rpc-url", f"{base}/{key}")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) >= expected
    chain = await trio.to_thread.run_sync(cast, "chain-id", "--rpc-url", f"{base}/{key}")
    assert chain.stdout.strip() == "31337", chain.stderr
    refused = await trio.to_thread.run_sync(cast, "block-number", "--rpc-url", f"{base}/{WRONG}")
    assert refused.returncode != 0
    assert "invalid API key" in refused.stderr, refused.stderr  # the JSON-RPC body's message
    logs = stack.handle.raw_logs()
    assert key.encode() not in logs and b"[redacted]" in logs


async def test_viem_given_only_a_url(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    )
    key, _ = await stack.key()
    base = f"http://127.0.0.1:{stack.handle.port}{RPC}"
    result = await trio.to_thread.run_sync(
        run_script, "url_key_viem.mjs", [f"{base}/{key}", f"{base}/{WRONG}"], tmp_path / "node"
    )
    assert int(result["blockNumber"]) >= 0 and result["chainId"] == 31337
    assert result["refusal"] is not None
    assert result["refusal"]["status"] == 401
    assert "invalid API key" in result["refusal"]["message"]
