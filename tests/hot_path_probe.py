"""The hot path's budget, counted rather than timed: timing on a shared machine is noise, counts
are not.

In a process of its own (nothing else of the test session in it), a gateway with API keys on
runs on the compiled twins; one client process sends requests on one keep-alive connection,
one after the other or ``depth`` at a time (or on ten connections, one request on each, sent
together), so every request costs the same whatever the machine is doing.  Per request, on
the event loop's thread only, it counts:

* Python-level calls (``sys.setprofile``: functions entered, C functions called from Python);
* system calls (``strace -c`` attached to that thread alone), without ``futex``: lock hand-offs
  between the loop and the log writer's thread depend on timing, the rest is the work.

What runs on its own meanwhile (timers) is counted in an idle window as long as the loaded one
and taken off.  Each count must stay under the budget written in tests/test_hot_path_costs.py;
a budget is raised only on purpose, with the reason in the commit that raises it.

    python -m tests.hot_path_probe ANVIL_URL KIND WORKDIR     # prints one JSON line
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from chaingate import twins as impl_module
from tests.test_auth import auth_settings, start_auth

RPC = "/v1/rpc/ethereum/devnet"
REQUESTS = 500


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


def _balance(i: int) -> dict[str, Any]:
    """eth_getBalance of the i-th address at "latest": never cached, never joined."""
    return {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance",
            "params": ["0x" + f"{i:040x}", "latest"]}  # fmt: skip


def _logs(i: int) -> dict[str, Any]:
    """eth_getLogs of the i-th address's Transfers to the i-th holder over blocks 0-1, as the
    bench's distinct-logs asks (a range the lane reads; never cached, never joined)."""
    topics = ["0x" + "dd" * 32, None, "0x" + f"{i:064x}"]
    span = {"fromBlock": "0x0", "toBlock": "0x1", "address": "0x" + f"{i:040x}"}
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "eth_getLogs",
        "params": [{**span, "topics": topics}],
    }


DISTINCT_BATCH = 20  # calls per batch of the distinct-batch kind


def _distinct(count: int) -> bytes:
    """``count`` single calls, no two alike (one a line: the client sends them in turn)."""
    return b"\n".join(json.dumps(_balance(i)).encode() for i in range(1, count + 1))


def _distinct_batches(count: int) -> bytes:
    """``count`` batches of DISTINCT_BATCH calls, no two calls alike."""
    size = DISTINCT_BATCH
    return b"\n".join(
        json.dumps([_balance(b * size + i) for i in range(1, size + 1)]).encode()
        for b in range(count)
    )


BODIES = {
    "chainid": b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}',
    "block": b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}',
    "batch": _batch(),
    "distinct": _distinct(REQUESTS),
    "distinct-logs": b"\n".join(json.dumps(_logs(i)).encode() for i in range(1, REQUESTS + 1)),
    "distinct-batch": _distinct_batches(REQUESTS),
}
# What one request of a kind counts as: a distinct batch's counts are per call.
PER_REQUEST = {"distinct-batch": DISTINCT_BATCH, "distinct-batch-parallel": DISTINCT_BATCH}


CLIENT = r"""
import re, socket, sys
port, key, count, depth = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[5])
width = int(sys.argv[6])  # connections, each sent ``depth`` requests per turn
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(width)]
for sock in socks:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
# The go signal (the counting has begun): the bodies, one a line, sent in turn.
requests = [
    b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    b"X-API-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
    % (sys.argv[4].encode(), key, len(body), body)
    for body in sys.stdin.buffer.read().split(b"\n")
]
data = [b""] * width
sent = 0
for turn in range(count // (depth * width)):
    # ``depth`` requests pipelined on each connection, then their answers
    for sock in socks:
        sock.sendall(b"".join(requests[(sent + i) % len(requests)] for i in range(depth)))
        sent += depth
    for n, sock in enumerate(socks):
        answered = 0
        while answered < depth:
            head = data[n].find(b"\r\n\r\n")
            length = head >= 0 and re.search(rb"(?i)content-length: *(\d+)", data[n][:head])
            if not length or len(data[n]) < head + 4 + int(length.group(1)):
                data[n] += sock.recv(65536)
                continue
            if not data[n].startswith(b"HTTP/1.1 200"):
                sys.exit(data[n][:300])
            data[n] = data[n][head + 4 + int(length.group(1)) :]
            answered += 1
"""


async def _client(port: int, key: str, body: bytes, count: int, depth: int = 1) -> None:
    """``count`` requests on one keep-alive connection, ``depth`` at a time (pipelined),
    from a process of its own: its work, and its share of an interpreter, are not counted."""
    await trio.run_process(
        [sys.executable, "-c", CLIENT, str(port), key, str(count), RPC, str(depth), "1"],
        stdin=body,
    )


async def _started_client(port: int, key: str, count: int, depth: int, width: int) -> Any:
    """The client process, started and connected (``width`` connections), waiting for its
    body on stdin."""
    return await trio.lowlevel.open_process(
        [sys.executable, "-c", CLIENT, str(port), key, str(count), RPC, str(depth), str(width)],
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
        """The number of system calls made meanwhile, lock hand-offs (futex) left out."""
        self._process.send_signal(signal.SIGINT)
        _, err = self._process.communicate(timeout=30)
        # "% time  seconds  usecs/call  calls  [errors]  syscall"
        rows = [line.split() for line in err.splitlines() if line[:1] in " 0123456789"]
        counts = {row[-1]: int(row[3]) for row in rows if len(row) >= 5 and row[3].isdigit()}
        return counts["total"] - counts.get("futex", 0)


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


async def _probe(anvil_url: str, kind: str, workdir: Path) -> dict[str, float]:
    settings = auth_settings(
        SimpleNamespace(url=anvil_url),  # type: ignore[arg-type]
        f"sqlite:///{workdir / 'keys.db'}",
        workdir,
        # Nothing on a timer that need not be.
        auth={"refresh_interval": 3600, "usage_flush_interval": 3600},
        rpc={"probe_interval": 3600},
        bundler={"enabled": False},
        webhooks={"enabled": False},
    )
    async with trio.open_nursery() as nursery:
        stack = await start_auth(nursery, impl_module.compiled(), settings)
        key, _ = await stack.key(plan="enterprise")  # unlimited: nothing is throttled
        port = stack.handle.gateway.port
        body = BODIES.get(kind) or BODIES[kind.removesuffix("-parallel").removesuffix("-pipelined")]
        per = REQUESTS * PER_REQUEST.get(kind, 1)
        depth = 10 if kind.endswith("-pipelined") else 1
        # "-parallel": one request at a time on each of ten connections, sent together.
        width = 10 if kind.endswith("-parallel") else 1
        await _client(port, key, body, 50)  # warm: the cache, the upstream connections
        tasks = stack.handle.gateway.front.dashboard_tasks
        if tasks is not None:  # its prune at start: done before the counting
            await tasks.sampler.pruned.wait()
        client = await _started_client(port, key, REQUESTS, depth, width)

        async def run() -> None:
            assert client.stdin is not None
            await client.stdin.send_all(body)
            await client.stdin.aclose()
            assert await client.wait() == 0

        loaded, seconds = await _counted(run)

        async def idle_for_as_long() -> None:
            await trio.sleep(seconds)

        idle, _ = await _counted(idle_for_as_long)
        nursery.cancel_scope.cancel()
    return {
        "calls": (loaded[0] - idle[0]) / per,
        "syscalls": (loaded[1] - idle[1]) / per,
    }


if __name__ == "__main__":
    url, which, where = sys.argv[1:4]
    print(json.dumps(trio.run(_probe, url, which, Path(where))))
