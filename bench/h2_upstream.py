"""chaingate's two upstream transports in one run: chaingate → nginx (TLS, HTTP/2) → anvil
against chaingate → nginx (TLS, HTTP/1.1) → anvil.

    python bench/h2_upstream.py [--duration 10] [--connections 32] [--rounds 2] [--smoke]
                                [--out PATH]

Starts on loopback: anvil; one nginx worker terminating TLS in front of it (a trustme
certificate; HTTP/2 and HTTP/1.1 offered by ALPN, as a hosted provider's edge); two
``chaingate serve`` processes whose only difference is the upstream's ``http_version`` (``h2``
or ``http1``), both with coalescing off so that every client request is an upstream request,
API keys and the access log off so that the transport is what differs.  wrk drives each
scenario against both, alternating which goes first, ``--rounds`` times; every run's req/s,
p99 and CPU per request (chaingate's, and nginx's: HTTP/2 costs the server too) is reported,
with the means and the h2 / http1 ratios.  Each chaingate's /metrics must show the transport
it was told to use (``chaingate_upstream_http2_connections``).

Then the transport alone: the pool's ``Upstream.send`` in this process (no edge, no wrk),
``eth_blockNumber`` from 32 concurrent callers to the same nginx, calls/s and this process's
CPU per call, for both transports, alternating, ``--rounds`` times.

Exit status: 0 all good; 1 some run had errors; 2 a server failed or answered wrongly;
3 nginx or wrk is missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import trio

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

from benchkit import procs, report, tools  # noqa: E402
from benchkit.tlsnginx import TlsNginx  # noqa: E402
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate import twins  # noqa: E402
from chaingate.config import UpstreamSettings  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary  # noqa: E402
from chaingate.rpc.pool import Upstream  # noqa: E402

Transport = Literal["h2", "http1"]
TRANSPORTS: tuple[Transport, Transport] = ("h2", "http1")
BIG_ANSWER_BYTES = 32 << 10
TARGET = "0x" + "ab" * 20


def _call(method: str, params: list[Any], call_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}


def _encode(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    body: bytes


SCENARIOS = (
    Scenario("block", "eth_blockNumber", _encode(_call("eth_blockNumber", []))),
    Scenario(
        "batch",
        "batch of 20 eth_getBalance",
        _encode([_call("eth_getBalance", [f"0x{i:040x}", "latest"], i) for i in range(1, 21)]),
    ),
    Scenario(
        "big",
        "eth_call answering 32 KiB",
        _encode(
            _call(
                "eth_call",
                [
                    {"to": TARGET, "data": "0x"},
                    "latest",
                    {TARGET: {"code": f"0x62{BIG_ANSWER_BYTES:06x}6000f3"}},  # RETURN(0, n)
                ],
            )
        ),
    ),
)


@dataclass
class Run:
    scenario: Scenario
    transport: str
    result: WrkResult
    chaingate_us: float | None
    nginx_us: float | None


class Failed(Exception):
    """A server failed or answered wrongly (exit 2)."""


def say(message: str) -> None:
    print(message, flush=True)


def post(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def check_answers(node: AnvilProcess, servers: dict[str, procs.ChaingateServer]) -> None:
    """Every scenario: each chaingate answers exactly what the node answers."""
    for scenario in SCENARIOS:
        expected = post(node.url, scenario.body)
        for transport, server in servers.items():
            got = post(server.rpc_url, scenario.body)
            if got != expected:
                raise Failed(
                    f"{scenario.key} via {transport}: {str(got)[:200]} != {str(expected)[:200]}"
                )


def check_transport(servers: dict[str, procs.ChaingateServer]) -> None:
    for transport, server in servers.items():
        http2 = report.total(server.metrics(), "chaingate_upstream_http2_connections")
        if (http2 > 0) != (transport == "h2"):
            raise Failed(f"chaingate ({transport}) has {http2} HTTP/2 upstream connections")


def measure(
    wrk: Wrk,
    scenario: Scenario,
    transport: str,
    server: procs.ChaingateServer,
    nginx: TlsNginx,
    duration: int,
    warmup: int,
) -> Run:
    wrk.run(server.rpc_url, scenario.body, warmup)
    pids = {"chaingate": server.process.pid, "nginx": nginx.pid}
    trees = {name: tools.process_tree(pid) if pid else [] for name, pid in pids.items()}
    before = {name: tools.process_cpu_seconds(tree) for name, tree in trees.items()}
    result = wrk.run(server.rpc_url, scenario.body, duration)
    after = {name: tools.process_cpu_seconds(tree) for name, tree in trees.items()}

    def per_request(name: str) -> float | None:
        if not result.requests:
            return None
        return (after[name] - before[name]) / result.requests * 1e6

    run = Run(scenario, transport, result, per_request("chaingate"), per_request("nginx"))
    say(
        f"[{scenario.key}] {transport:5}: {result.rps:8.0f} req/s, p99 {result.p99_ms:.2f} ms, "
        f"CPU/req chaingate {_us(run.chaingate_us)} nginx {_us(run.nginx_us)}"
        + (f", ERRORS {result.error_detail()}" if result.errors else "")
    )
    return run


def transport_alone(nginx: TlsNginx, transport: Transport, calls: int) -> tuple[float, float]:
    """``calls`` eth_blockNumber through ``Upstream.send`` from 32 concurrent callers in this
    process: (calls/s, CPU µs per call)."""
    body = SCENARIOS[0].body
    settings = UpstreamSettings(url=nginx.url, ca_file=str(nginx.ca_file), http_version=transport)

    async def run() -> tuple[float, float]:
        async with trio.open_nursery() as nursery:
            upstream = Upstream(settings, twins.select(), nursery)
            await upstream.send(body, trio.current_time() + 10)  # connected before the clock
            left = calls

            async def caller() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    answer = await upstream.send(body, trio.current_time() + 10)
                    if answer.status != 200:
                        raise Failed(f"{transport}: HTTP {answer.status} from nginx")

            wall, cpu = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as callers:
                for _ in range(32):
                    callers.start_soon(caller)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            upstream.close()
            nursery.cancel_scope.cancel()
        return calls / wall, cpu / calls * 1e6

    rate, cpu_us = trio.run(run)
    say(f"[transport alone] {transport:5}: {rate:8.0f} calls/s, {cpu_us:.1f} µs CPU/call")
    return rate, cpu_us


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} µs"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def render(
    runs: list[Run],
    alone: list[tuple[str, float, float]],
    opts: argparse.Namespace,
    versions: dict[str, str],
) -> str:
    lines = [
        "# chaingate upstream transports: HTTP/2 vs HTTP/1.1 (both over TLS, through nginx)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"- machine: {tools.machine_summary()}; load average before: {versions['load']}",
        f"- chain: wrk -t1 -c{opts.connections} → chaingate (one process, compiled, auth and "
        "access log off, coalesce off) → nginx "
        f"{versions['nginx']} (one worker, TLS, HTTP/2 and HTTP/1.1 by ALPN) → anvil "
        f"{versions['anvil']}",
        f"- {opts.duration} s per run after {opts.warmup} s of warm-up, {opts.rounds} rounds, "
        "the two transports alternating which goes first",
        "",
        "## Means over the rounds",
        "",
        "| scenario | transport | req/s | p99 ms | chaingate CPU µs/req | nginx CPU µs/req |",
        "|---|---|---:|---:|---:|---:|",
    ]
    means: dict[tuple[str, str], tuple[float, float | None, float | None]] = {}
    for scenario in SCENARIOS:
        for transport in TRANSPORTS:
            mine = [r for r in runs if r.scenario is scenario and r.transport == transport]
            if not mine:
                continue
            rps = statistics.fmean(r.result.rps for r in mine)
            p99 = statistics.fmean(r.result.p99_ms for r in mine)
            cg = _mean([r.chaingate_us for r in mine])
            ng = _mean([r.nginx_us for r in mine])
            means[(scenario.key, transport)] = (rps, cg, ng)
            lines.append(
                f"| {scenario.label} | {transport} | {rps:.0f} | {p99:.2f} | "
                f"{_fmt(cg)} | {_fmt(ng)} |"
            )
    lines += [
        "",
        "## h2 / http1",
        "",
        "| scenario | req/s | chaingate CPU/req | nginx CPU/req |",
        "|---|---:|---:|---:|",
    ]
    for scenario in SCENARIOS:
        h2, h1 = means.get((scenario.key, "h2")), means.get((scenario.key, "http1"))
        if h2 is None or h1 is None:
            continue
        lines.append(
            f"| {scenario.label} | {_ratio(h2[0], h1[0])} | {_ratio(h2[1], h1[1])} | "
            f"{_ratio(h2[2], h1[2])} |"
        )
    lines += [
        "",
        "## The transport alone (Upstream.send → nginx, in process, 32 callers)",
        "",
        "| transport | calls/s | CPU µs/call | runs |",
        "|---|---:|---:|---|",
    ]
    alone_means: dict[str, tuple[float, float]] = {}
    for transport in TRANSPORTS:
        measured = [(rate, cpu) for name, rate, cpu in alone if name == transport]
        if not measured:
            continue
        rate = statistics.fmean(r for r, _ in measured)
        cpu = statistics.fmean(c for _, c in measured)
        alone_means[transport] = (rate, cpu)
        each = ", ".join(f"{r:.0f}/s {c:.0f} µs" for r, c in measured)
        lines.append(f"| {transport} | {rate:.0f} | {cpu:.1f} | {each} |")
    if len(alone_means) == 2:
        (h2_rate, h2_cpu), (h1_rate, h1_cpu) = alone_means["h2"], alone_means["http1"]
        lines.append(f"| h2 / http1 | {_ratio(h2_rate, h1_rate)} | {_ratio(h2_cpu, h1_cpu)} | |")
    lines += [
        "",
        "## Every run",
        "",
        "| scenario | transport | req/s | p50 ms | p99 ms | chaingate µs/req | nginx µs/req "
        "| errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.scenario.label} | {r.transport} | {r.result.rps:.0f} | "
            f"{r.result.p50_ms:.2f} | {r.result.p99_ms:.2f} | {_fmt(r.chaingate_us)} | "
            f"{_fmt(r.nginx_us)} | {r.result.errors} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--rounds", type=int, default=2, help="runs per scenario and transport")
    parser.add_argument("--smoke", action="store_true", help="1 s runs, one round")
    parser.add_argument(
        "--calls", type=int, default=5000, help="calls per transport-alone measurement"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-h2-upstream.md"))
    opts = parser.parse_args(argv)
    opts.warmup = 1 if opts.smoke else 2
    if opts.smoke:
        opts.duration, opts.rounds, opts.calls = 1, 1, 300
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, tools.raise_interrupt)
    try:
        binaries = tools.require_tools()
    except tools.MissingTool as exc:
        say(str(exc))
        return 3
    load = tools.load_average()
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-h2-bench-"))
    servers: dict[str, procs.ChaingateServer] = {}
    nginx: TlsNginx | None = None
    runs: list[Run] = []
    alone: list[tuple[str, float, float]] = []
    try:
        with AnvilProcess() as node:
            nginx = TlsNginx(binaries["nginx"], workdir / "nginx", node.port).start()
            for transport in TRANSPORTS:
                servers[transport] = procs.ChaingateServer(
                    workdir,
                    f"chaingate-{transport}",
                    nginx.url,
                    access_log=False,
                    coalesce=False,
                    auth=None,
                    upstream_extra=(f'ca_file = "{nginx.ca_file}"\nhttp_version = "{transport}"\n'),
                ).start()
            check_answers(node, servers)
            check_transport(servers)
            wrk = Wrk(binaries["wrk"], workdir, connections=opts.connections)
            for round_index in range(opts.rounds):
                order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
                for scenario in SCENARIOS:
                    for transport in order:
                        server = servers[transport]
                        run = measure(
                            wrk, scenario, transport, server, nginx, opts.duration, opts.warmup
                        )
                        runs.append(run)
            check_transport(servers)
            for server in servers.values():
                server.stop()  # the transport alone gets the machine to itself
            for round_index in range(opts.rounds):
                order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
                for transport in order:
                    alone.append((transport, *transport_alone(nginx, transport, opts.calls)))
            versions = {
                "nginx": tools.nginx_version(binaries["nginx"]),
                "anvil": tools.anvil_version(anvil_binary()),
                "load": load,
            }
    except (procs.ServerFailed, Failed) as exc:
        say(f"FAILED: {exc}")
        return 2
    except WrkFailed as exc:
        say(f"wrk failed: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        for server in servers.values():
            server.stop()
        if nginx is not None:
            nginx.stop()
    text = render(runs, alone, opts, versions)
    opts.out.write_text(text)
    say(f"\nreport written to {opts.out}\n")
    say(text)
    return 1 if any(r.result.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
