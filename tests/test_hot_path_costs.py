"""The hot path's budget, counted rather than timed: timing on a shared machine is noise, counts
are not.

Through the compiled edge with API keys on, one client on one keep-alive connection sends its
requests one after the other (so every request costs the same, whatever the machine is doing),
and for each kind of request the test counts, per request, on the event loop's thread only:

* Python-level calls (``sys.setprofile``: functions entered, C functions called from Python);
* system calls (``strace -c`` attached to that thread alone, not to the client's).

Each count must stay under the budget written below.  A budget is raised only on purpose,
with the reason in the commit that raises it; the figures measured when each was last set
are beside it (a sequential client pays one whole turn of trio's scheduler per request, which
is most of the Python calls of a cache hit).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate import impl as impl_module
from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import IN_CI
from tests.test_auth import auth_settings, start_auth

RPC = "/v1/rpc/ethereum/devnet"
REQUESTS = 500

# (Python calls, system calls) per request.  Measured when set (2026-11-26), less what ran on
# its own meanwhile: chainid 61 / 5.1, chainid-pipelined 10 / 0.57, block 279 / 11.1, batch
# 376 / 11.0.  The edge before the native loop, in the same test: 119 / 4.1, 64 / 1.4,
# 283 / 9.1, 751 / 9.1.  (One request at a time on one connection, the loop pays one more
# epoll_wait and trio's re-arming of it per turn; answers that wait together leave in one
# send.  A proxied call still costs trio several turns: see rpc/service.py, send_flights.)
BUDGETS = {
    "chainid": (70, 5.6),
    "chainid-pipelined": (15, 0.8),
    "block": (310, 12.2),
    "batch": (420, 12.2),
}


def _batch() -> bytes:
    account = "0x" + "11" * 20
    calls = [
        ("eth_blockNumber", []),
        ("eth_chainId", []),
        ("eth_gasPrice", []),
        ("net_version", []),
    ]
    calls += [("eth_getBalance", [account, "latest"])] * 2
    calls += [
        ("eth_getTransactionCount", [account, "latest"]),
        ("eth_getCode", [account, "latest"]),
    ]
    calls += [("eth_getBalance", ["0x" + f"{i:040x}", "latest"]) for i in range(1, 11)]
    calls += [("eth_blockNumber", []), ("eth_chainId", [])]
    return json.dumps(
        [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls, 1)]
    ).encode()


BODIES = {
    "chainid": b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}',
    "block": b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}',
    "batch": _batch(),
}


CLIENT = r"""
import re, socket, sys
port, key, count, depth = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[5])
with socket.create_connection(("127.0.0.1", port)) as sock:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = sys.stdin.buffer.read()  # the go signal: the counting has begun
    request = (
        b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"X-API-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (sys.argv[4].encode(), key, len(body), body)
    )
    data = b""
    for _ in range(count // depth):
        sock.sendall(request * depth)  # ``depth`` requests pipelined, then their answers
        answered = 0
        while answered < depth:
            head = data.find(b"\r\n\r\n")
            length = head >= 0 and re.search(rb"(?i)content-length: *(\d+)", data[:head])
            if not length or len(data) < head + 4 + int(length.group(1)):
                data += sock.recv(65536)
                continue
            if not data.startswith(b"HTTP/1.1 200"):
                sys.exit(data[:300])
            data = data[head + 4 + int(length.group(1)) :]
            answered += 1
"""


async def _client(port: int, key: str, body: bytes, count: int, depth: int = 1) -> None:
    """``count`` requests on one keep-alive connection, ``depth`` at a time (pipelined),
    from a process of its own: its work, and its share of an interpreter, are not counted."""
    await trio.run_process(
        [sys.executable, "-c", CLIENT, str(port), key, str(count), RPC, str(depth)], stdin=body
    )


async def _started_client(port: int, key: str, count: int, depth: int) -> Any:
    """The client process, started and connected, waiting for its body on stdin."""
    return await trio.lowlevel.open_process(
        [sys.executable, "-c", CLIENT, str(port), key, str(count), RPC, str(depth)],
        stdin=subprocess.PIPE,
    )


class _Strace:
    """``strace -c`` on one thread (the event loop's), summary read when it stops."""

    def __init__(self, tid: int) -> None:
        self._process = subprocess.Popen(
            ["strace", "-c", "-p", str(tid)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert self._process.stderr is not None
        line = self._process.stderr.readline()  # "strace: Process N attached"
        assert "attached" in line, line

    def stop(self) -> int:
        """The number of system calls made meanwhile."""
        self._process.send_signal(signal.SIGINT)
        _, err = self._process.communicate(timeout=30)
        # "% time  seconds  usecs/call  calls  [errors]  total"
        (total,) = [line.split() for line in err.splitlines() if line.endswith(" total")]
        return int(total[3])


def _strace_or_skip() -> None:
    if shutil.which("strace") is None:
        if IN_CI:
            pytest.fail("strace is missing (CI installs it: .ci/run)")
        pytest.skip("strace not installed (apt-get install strace)")


async def _counted(work: Any) -> tuple[tuple[int, int], float]:
    """((Python calls, system calls) of the event loop's thread while ``work`` ran, and how
    long that took)."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    tracer = _Strace(threading.get_native_id())
    started = trio.current_time()
    try:
        sys.setprofile(profile)
        try:
            await work()
        finally:
            sys.setprofile(None)
    finally:
        syscalls = tracer.stop()
    return (calls, syscalls), trio.current_time() - started


@pytest.fixture
def compiled() -> impl_module.Impl:
    try:
        return impl_module.compiled()
    except ImportError:
        if IN_CI:
            raise
        pytest.skip("compiled modules not built (run `pip install -e .`)")


@pytest.mark.parametrize("kind", sorted(BUDGETS))
async def test_the_hot_path_stays_within_its_budget(
    nursery: trio.Nursery,
    compiled: impl_module.Impl,
    anvil: AnvilProcess,
    tmp_path: Path,
    kind: str,
) -> None:
    _strace_or_skip()
    pipelined = kind.endswith("-pipelined")
    # Nothing on a timer that need not be: what runs on its own meanwhile is measured in an
    # idle window as long as the loaded one, and taken off.
    settings = auth_settings(
        anvil,
        f"sqlite:///{tmp_path / 'keys.db'}",
        tmp_path,
        auth={"refresh_interval": 3600, "usage_flush_interval": 3600},
        rpc={"probe_interval": 3600},
        bundler={"enabled": False},
        webhooks={"enabled": False},
    )
    stack = await start_auth(nursery, compiled, settings)
    key, _ = await stack.key(plan="enterprise")  # unlimited: nothing is throttled
    port = stack.handle.gateway.port
    body = BODIES[kind.split("-")[0]]
    depth = 10 if pipelined else 1
    await _client(port, key, body, 50)  # warm: the cache, the upstream connections

    client = await _started_client(port, key, REQUESTS, depth)
    assert client.stdin is not None

    async def run() -> None:
        assert client.stdin is not None
        await client.stdin.send_all(body)
        await client.stdin.aclose()
        assert await client.wait() == 0

    loaded, seconds = await _counted(run)

    async def idle_for_as_long() -> None:
        await trio.sleep(seconds)

    idle, _ = await _counted(idle_for_as_long)
    calls, syscalls = loaded[0] - idle[0], loaded[1] - idle[1]
    per_call, per_syscall = calls / REQUESTS, syscalls / REQUESTS
    budget_calls, budget_syscalls = BUDGETS[kind]
    print(f"{kind}: {per_call:.1f} Python calls, {per_syscall:.2f} system calls per request")
    assert per_call <= budget_calls, (kind, per_call)
    assert per_syscall <= budget_syscalls, (kind, per_syscall)
