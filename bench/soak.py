"""Memory over time: minutes of mixed traffic against a real chaingate, its RSS and open file
descriptors sampled all along.

    python bench/soak.py [--minutes 30] [--sample-every 10] [--settle 150] [--out PATH]

Starts on loopback free ports: anvil (a block a second), the webhook receiver
(``benchkit/hookreceiver.py``, a process of its own) and one ``chaingate serve`` process (API
keys on, SQLite store, the follower on ethereum/devnet, loopback webhooks allowed: the config
``bench/webhooks.py`` writes).  Then, for ``--minutes``, threads of this process send:

* **proxy** — single calls (block number, chain id, balances and nonces of random addresses,
  ``eth_call``, the latest block; one in 50 an ``eth_call`` answering 0.6 MB), over one
  keep-alive connection;
* **batch** — 20-call batches of distinct reads (one in 5 of ``eth_call``s answering 64 KiB
  each), a new connection every 10 batches;
* **rest** — health, usage, gas prices and policies, the webhook list, token balances of
  random addresses, and 404s;
* **ws** — WebSocket churn: connect, subscribe to new heads (and to a logs filter of random
  addresses), wait for a head, unsubscribe or not, close — half of them by dropping the socket;
* **webhooks** — ``address_activity`` webhooks created and deleted (at most 10 live), while a
  transfer a second to a watched address is delivered to the receiver;
* **refused** — a wrong key, no key, and bursts of a Free-plan key past its 10 requests/s;
* **malformed** — invalid JSON, a body nested 200 deep, a broken request line, an oversized
  header, a request cut off mid-body, raw on fresh connections.

Every ``--sample-every`` seconds the server's RSS and open descriptors are read from /proc.
When the traffic stops (every client closed), the descriptors are followed each second for up
to ``--settle`` seconds (the upstream pool closes connections idle for 60 s).  The verdicts:

* **flat** — after warm-up (the first third), the RSS stays within +10% of where it stood at
  the start of the last two thirds;
* **fds** — the descriptors come back to what they were before the traffic.

Report: Markdown with the verdicts, the traffic each kind sent (by status), the samples and an
SVG chart of RSS and descriptors, at ``--out`` (default ``bench/results/soak-<UTC>.md``), and
the same data as JSON beside it (``.json``).  Exit status 0 when both verdicts pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import httpx  # noqa: E402
from websockets.exceptions import WebSocketException  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from benchkit import procs  # noqa: E402
from chaingate.benchsuite import svg  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, rpc_call  # noqa: E402
from webhooks import configure  # noqa: E402

RPC = "/v1/rpc/ethereum/devnet"
WS = "/v1/ws/ethereum/devnet"
DEV_ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"  # anvil's first, unlocked
WATCHED = [f"0x{0x50A4 + n:040x}" for n in range(20)]  # addresses the webhooks watch
MAX_WEBHOOKS = 10
BIG_ANSWER = 300_000  # bytes an eth_call returns, now and then: 0.6 MB of hex
FLAT_TOLERANCE = 0.10
KINDS = ("proxy", "batch", "rest", "ws", "webhooks", "refused", "malformed")


@dataclass
class Sample:
    t: float  # seconds since the traffic started (negative: before it)
    rss_mib: float
    fds: int
    phase: str  # "before", "traffic" or "settle"


@dataclass
class Tally:
    """What each kind of traffic sent, by outcome (an HTTP status, or a name)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, outcome: object) -> None:
        with self.lock:
            self.counts[(kind, str(outcome))] += 1

    def by_kind(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        with self.lock:
            for (kind, outcome), n in sorted(self.counts.items()):
                out[kind][outcome] = n
        return out


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def proc_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def random_address() -> str:
    return "0x" + random.randbytes(20).hex()


def call(method: str, params: list[Any], call_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}


def big_call(size: int, call_id: int = 1) -> dict[str, Any]:
    """An ``eth_call`` answered with ``size`` zero bytes (``2 * size`` hex digits): code given
    by a state override returns them.  Distinct calldata, so none joins another."""
    code = "0x62" + size.to_bytes(3, "big").hex() + "6000f3"  # PUSH3 size PUSH1 0 RETURN
    target = random_address()
    params = [{"to": target, "data": f"0x{random.getrandbits(64):016x}"}, "latest"]
    return call("eth_call", [*params, {target: {"code": code}}], call_id)


def proxy_call() -> dict[str, Any]:
    return random.choice(
        [
            call("eth_blockNumber", []),
            call("eth_chainId", []),
            call("eth_getBalance", [random_address(), "latest"]),
            call("eth_getTransactionCount", [random_address(), "latest"]),
            call("eth_call", [{"to": random_address(), "data": "0x"}, "latest"]),
            call("eth_getBlockByNumber", ["latest", False]),
        ]
    )


class Traffic:
    """The load: one thread per kind, each paced, until ``stop`` is set."""

    def __init__(self, base: str, key: str, free_key: str, hooks_url: str, anvil_url: str) -> None:
        self.base = base
        self.key = key
        self.free_key = free_key
        self.hooks_url = hooks_url
        self.anvil_url = anvil_url
        self.port = int(base.rsplit(":", 1)[1])
        self.stop = threading.Event()
        self.tally = Tally()

    def threads(self) -> list[threading.Thread]:
        loops: dict[str, Callable[[], None]] = {
            "proxy": self._proxy,
            "batch": self._batch,
            "rest": self._rest,
            "ws": self._ws,
            "webhooks": self._webhooks,
            "transfers": self._transfers,
            "refused": self._refused,
            "malformed": self._malformed,
        }
        return [
            threading.Thread(target=self._guarded, args=(name, loop), name=name, daemon=True)
            for name, loop in loops.items()
        ]

    def _guarded(self, name: str, loop: Callable[[], None]) -> None:
        """A kind's loop; a client-side failure is counted and the loop goes on."""
        while not self.stop.is_set():
            try:
                loop()
            except (httpx.HTTPError, OSError, WebSocketException, ValueError, RuntimeError) as exc:
                self.tally.add(name if name in KINDS else "webhooks", type(exc).__name__)
                self.stop.wait(0.5)

    def _client(self, key: str | None = None) -> httpx.Client:
        headers = {procs.API_KEY_HEADER: key} if key else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=30)

    def _proxy(self) -> None:
        with self._client(self.key) as client:
            while not self.stop.is_set():
                # One call in 50 answers 0.6 MB: big buffers come and go all along.
                body = big_call(BIG_ANSWER) if random.random() < 0.02 else proxy_call()
                response = client.post(RPC, json=body)
                self.tally.add("proxy", response.status_code)
                self.stop.wait(0.02)

    def _batch(self) -> None:
        with self._client(self.key) as client:
            for _ in range(10):
                if self.stop.is_set():
                    return
                if random.random() < 0.2:  # 20 calls of 64 KiB: a 2.6 MB answer
                    batch = [big_call(BIG_ANSWER // 10, i) for i in range(20)]
                else:
                    batch = [proxy_call() | {"id": i} for i in range(20)]
                response = client.post(RPC, json=batch)
                self.tally.add("batch", response.status_code)
                self.stop.wait(0.2)

    def _rest(self) -> None:
        paths: dict[str, Callable[[], str]] = {
            "health": lambda: "/v1/health",
            "usage": lambda: "/v1/usage",
            "gas": lambda: "/v1/gas/ethereum-devnet/prices",
            "policies": lambda: "/v1/gas/policies",
            "webhooks": lambda: "/v1/webhooks",
            "balances": lambda: f"/v1/tokens/ethereum-devnet/balances/{random_address()}",
            "unknown": lambda: f"/v1/no-such-resource/{random.randrange(1 << 30)}",
        }
        names = list(paths)
        with self._client(self.key) as client:
            while not self.stop.is_set():
                name = random.choice(names)
                response = client.get(paths[name]())
                self.tally.add("rest", f"{name} {response.status_code}")
                self.stop.wait(0.1)

    def _ws(self) -> None:
        url = self.base.replace("http://", "ws://") + WS
        with connect(url, additional_headers={procs.API_KEY_HEADER: self.key}) as ws:
            ws.send(json.dumps(call("eth_subscribe", ["newHeads"])))
            head_id = json.loads(ws.recv(timeout=10)).get("result")
            filter_ = {"address": [random_address() for _ in range(5)]}
            ws.send(json.dumps(call("eth_subscribe", ["logs", filter_], 2)))
            ws.recv(timeout=10)
            with contextlib.suppress(TimeoutError):
                ws.recv(timeout=3)  # a head (a block a second)
            self.tally.add("ws", "subscribed")
            if random.random() < 0.5:
                ws.send(json.dumps(call("eth_unsubscribe", [head_id], 3)))
                self.tally.add("ws", "unsubscribed")
                ws.close()
            else:
                ws.socket.shutdown(socket.SHUT_RDWR)  # dropped: no close handshake
                self.tally.add("ws", "dropped")
        self.stop.wait(0.2)

    def _webhooks(self) -> None:
        live: list[str] = []
        with self._client(self.key) as client:
            while not self.stop.is_set():
                body = {
                    "url": f"{self.hooks_url}/hooks/{random.randrange(1000)}",
                    "chain": "ethereum",
                    "event_type": "address_activity",
                    "config": {"addresses": random.sample(WATCHED, 3)},
                }
                created = client.post("/v1/webhooks", json=body)
                self.tally.add("webhooks", f"create {created.status_code}")
                if created.status_code == 201:
                    live.append(created.json()["id"])
                while len(live) > MAX_WEBHOOKS:
                    deleted = client.delete(f"/v1/webhooks/{live.pop(0)}")
                    self.tally.add("webhooks", f"delete {deleted.status_code}")
                self.stop.wait(2.0)
            for webhook in live:
                client.delete(f"/v1/webhooks/{webhook}")

    def _transfers(self) -> None:
        while not self.stop.is_set():
            tx = {"from": DEV_ACCOUNT, "to": random.choice(WATCHED), "value": "0x1"}
            rpc_call(self.anvil_url, "eth_sendTransaction", [tx])
            self.tally.add("webhooks", "transfer")
            self.stop.wait(1.0)

    def _refused(self) -> None:
        for key in ("svc_test_" + "x" * 40, None):
            with self._client(key) as client:
                response = client.post(RPC, json=call("eth_blockNumber", []))
                self.tally.add("refused", response.status_code)
        with self._client(self.free_key) as client:
            for _ in range(20):  # the Free plan allows 10 a second
                response = client.post(RPC, json=call("eth_chainId", []))
                self.tally.add("refused", response.status_code)
        self.stop.wait(1.0)

    def _malformed(self) -> None:
        key = self.key.encode()
        deep = b"[" * 200 + b"]" * 200
        requests = [
            _post(b"{not json", key),
            _post(deep, key),
            b"GET /\x00 HTTP/1.1\r\n\r\n",
            b"GET /v1/health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
            _post(b'{"jsonrpc":"2.0"', key)[:-5],  # cut off mid-body, then closed
        ]
        for raw in requests:
            self.tally.add("malformed", self._raw(raw))
        self.stop.wait(0.2)

    def _raw(self, data: bytes) -> str:
        """Send bytes on a fresh connection; the answer's status (or what happened)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                answer = sock.recv(64)
            except OSError as exc:
                return type(exc).__name__
        parts = answer.split(b" ", 2)
        return parts[1].decode("latin-1") if len(parts) > 1 else "closed"


def _post(body: bytes, key: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: t\r\nX-API-Key: %s\r\nContent-Type: application/json\r\n"
    return head % (RPC.encode(), key) + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


@contextlib.contextmanager
def receiver(workdir: Path) -> Iterator[str]:
    """The webhook receiver, a process of its own; yields its base URL."""
    script = BENCH_DIR / "benchkit" / "hookreceiver.py"
    argv = [sys.executable, str(script), "--out", str(workdir / "hooks.tsv")]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the receiver did not start: {line!r}")
        yield f"http://{procs.LOOPBACK}:{int(line.split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def received(hooks_url: str) -> int:
    with httpx.Client(timeout=10) as client:
        return int(client.get(f"{hooks_url}/stats").json().get("requests", 0))


def flat_verdict(samples: list[Sample], duration: float) -> dict[str, Any]:
    """After warm-up, the RSS within +10% of where the last two thirds started."""
    window = [s for s in samples if s.phase == "traffic" and s.t >= duration / 3]
    if len(window) < 2:
        return {"ok": False, "reason": "too few samples after warm-up", "samples": len(window)}
    start = window[0].rss_mib
    peak = max(s.rss_mib for s in window)
    growth = peak / start - 1
    return {
        "ok": growth <= FLAT_TOLERANCE,
        "start_mib": round(start, 1),
        "peak_mib": round(peak, 1),
        "end_mib": round(window[-1].rss_mib, 1),
        "growth": round(growth, 4),
        "tolerance": FLAT_TOLERANCE,
    }


def chart(samples: list[Sample]) -> str:
    rss = [(s.t, s.rss_mib) for s in samples]
    fds = [(s.t, float(s.fds)) for s in samples]
    return svg.line_chart(
        "chaingate's RSS (MiB) and open descriptors over the soak",
        [svg.Line("RSS MiB", rss, svg.color(0)), svg.Line("open fds", fds, svg.color(1))],
        "seconds since the traffic started",
        "MiB / descriptors",
    )


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def report_text(data: dict[str, Any], samples: list[Sample]) -> str:
    flat, fds = data["verdicts"]["flat"], data["verdicts"]["fds"]
    lines = [
        "# chaingate soak",
        "",
        f"{data['started']} · {data['minutes']} min of traffic · commit `{data['commit']}` · "
        f"framing `{data['impl']}` · load average before {data['load_before']}, "
        f"after {data['load_after']} (2 cores, shared)",
        "",
        "| verdict | result | figures |",
        "|---|---|---|",
        f"| flat after warm-up (+{FLAT_TOLERANCE:.0%} at most) | "
        f"{'pass' if flat['ok'] else 'FAIL'} | "
        + (
            f"{flat['start_mib']} → peak {flat['peak_mib']}, end {flat['end_mib']} MiB "
            f"({flat['growth']:+.1%})"
            if "growth" in flat
            else flat.get("reason", "")
        )
        + " |",
        f"| descriptors back to baseline | {'pass' if fds['ok'] else 'FAIL'} | "
        f"{fds['baseline']} before, {fds['peak']} at most, {fds['after']} after "
        f"{fds['settle_seconds']} s |",
        "",
        f"RSS: {data['rss_before_mib']} MiB before the traffic, "
        f"{samples[-1].rss_mib:.1f} MiB at the end.  Webhook deliveries received: "
        f"{data['deliveries']}.",
        "",
        "## Traffic",
        "",
        "| kind | outcomes |",
        "|---|---|",
    ]
    for kind, outcomes in data["traffic"].items():
        shown = ", ".join(f"{outcome}: {n}" for outcome, n in outcomes.items()) or "none"
        lines.append(f"| {kind} | {shown} |")
    lines += ["", "## Samples", "", chart(samples), "", "| t (s) | phase | RSS MiB | fds |"]
    lines.append("|---:|---|---:|---:|")
    lines += [f"| {s.t:.0f} | {s.phase} | {s.rss_mib:.1f} | {s.fds} |" for s in samples]
    return "\n".join(lines) + "\n"


def git_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    duration = args.minutes * 60
    begun = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit()
    with (
        AnvilProcess(extra=["--block-time", "1"]) as anvil,
        receiver(workdir) as hooks_url,
    ):
        server = procs.ChaingateServer(
            workdir, "soak", anvil.url, access_log=True, coalesce=True,
            auth=procs.Auth.fresh(workdir / "keys.db"),
        )  # fmt: skip
        configure(server, None)
        key = server.create_key()
        free_key = server.create_key(plan="free", keep=False)
        server.start(timeout=180)
        try:
            pid = server.process.pid
            assert pid is not None
            time.sleep(2)  # the follower's first rounds, the probes
            samples = [Sample(-1.0, proc_rss_mib(pid), proc_fds(pid), "before")]
            traffic = Traffic(server.base, key, free_key, hooks_url, anvil.url)
            load_before = load_average()
            threads = traffic.threads()
            started = time.monotonic()
            for thread in threads:
                thread.start()
            next_sample = args.sample_every
            while (now := time.monotonic() - started) < duration:
                time.sleep(max(0.0, min(next_sample, duration) - now))
                now = time.monotonic() - started
                samples.append(Sample(now, proc_rss_mib(pid), proc_fds(pid), "traffic"))
                last = samples[-1]
                print(f"{now:7.0f}s  RSS {last.rss_mib:7.1f} MiB  fds {last.fds}", flush=True)
                next_sample += args.sample_every
            traffic.stop.set()
            for thread in threads:
                thread.join(timeout=60)
            stopped = time.monotonic()
            baseline = samples[0].fds
            while True:
                now = time.monotonic() - started
                samples.append(Sample(now, proc_rss_mib(pid), proc_fds(pid), "settle"))
                if samples[-1].fds <= baseline or time.monotonic() - stopped > args.settle:
                    break
                time.sleep(1.0)
            impl = server.impl()
            deliveries = received(hooks_url)
        finally:
            server.stop()
    fds_verdict = {
        "ok": samples[-1].fds <= baseline,
        "baseline": baseline,
        "peak": max(s.fds for s in samples),
        "after": samples[-1].fds,
        "settle_seconds": round(time.monotonic() - stopped, 1),
    }
    return {
        "started": begun,
        "minutes": args.minutes,
        "commit": commit,
        "impl": impl,
        "load_before": load_before,
        "load_after": load_average(),
        "rss_before_mib": round(samples[0].rss_mib, 1),
        "deliveries": deliveries,
        "verdicts": {"flat": flat_verdict(samples, duration), "fds": fds_verdict},
        "traffic": traffic.tally.by_kind(),
        "samples": [vars(s) for s in samples],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds")
    parser.add_argument("--settle", type=float, default=150.0, help="seconds, at most")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.minutes > 0 and args.sample_every > 0 and args.settle >= 0):
        parser.error("--minutes and --sample-every must be positive, --settle not negative")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out: Path = args.out or BENCH_DIR / "results" / f"soak-{stamp}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chaingate-soak-") as tmp:
        data = soak(args, Path(tmp))
    samples = [Sample(**s) for s in data["samples"]]
    out.write_text(report_text(data, samples))
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    verdicts = data["verdicts"]
    print(f"report: {out}")
    print(f"flat: {verdicts['flat']}\nfds: {verdicts['fds']}")
    return 0 if verdicts["flat"]["ok"] and verdicts["fds"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
