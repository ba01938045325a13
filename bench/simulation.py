"""Transaction simulation: a token transfer's asset changes, beside a plain eth_call, through
chaingate in the same run.

    python bench/simulation.py [--duration 10] [--connections 1,8] [--engine auto]
                               [--access-log on|off] [--out PATH] [--smoke]

Starts on loopback free ports: anvil, bootstrapped as the devnet ``chaingate dev`` serves,
then one ``chaingate serve`` process (API keys on: one unlimited enterprise key; the devnet
network with its manifest, the follower and the indexer, so the metadata service knows the
token; ``[simulation] engine`` from ``--engine``).  One simulation is checked first (the
transfer, with the token's symbol and decimals).  Then, with wrk (1 thread, keep-alive, the key
in ``X-API-Key``), at each of ``--connections``, one load right after the other:

* **eth_call** — ``balanceOf(holder)`` on the devnet's CGT token at ``latest`` (never cached:
  each one reaches anvil);
* **simulate** — ``chaingate_simulateAssetChanges`` of the holder sending 1 CGT: one node call
  (``eth_simulateV1``, or ``debug_traceCall`` with ``--engine trace_call``), the events read
  into changes, the token's facts from the metadata service (memory), the answer encoded.

req/s, p50, p90, p99, chaingate's CPU per request and errors (non-2xx, or a JSON-RPC
``"error"``: must be 0), then the ratios simulate/eth_call — the issue's target is a p50 at
most 3x the eth_call's.  Writes bench/results/<UTC time>-simulation.md and prints it.  Exit
status: 0 done; 1 some run had errors; 2 a server failed or answered wrongly; 3 wrk is missing;
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

import chaingate  # noqa: E402
from benchkit import procs, report, runner, threads, tools  # noqa: E402
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate.config.manifest import Manifest, dumps  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402
from chaingate.evm import abi  # noqa: E402
from chaingate.evm.keys import PrivateKey  # noqa: E402

LEVELS = (1, 8)
SMOKE_LEVELS = (1,)
ENGINES = ("auto", "simulate_v1", "trace_call")
WRK_TIMEOUT_S = 10
TARGET_P50_RATIO = 3.0


@dataclass(frozen=True)
class Options:
    duration: int
    warmup: int
    connections: tuple[int, ...]
    engine: str
    access_log: bool
    out: Path
    smoke: bool


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("connection counts must be at least 1")
    return levels


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--connections", type=_levels, default=None, help="default 1,8")
    parser.add_argument("--engine", choices=ENGINES, default="auto")
    parser.add_argument("--access-log", choices=("on", "off"), default="on")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC>-simulation.md")
    parser.add_argument("--smoke", action="store_true", help="1 s runs at 1 connection")
    args = parser.parse_args(argv)
    if args.smoke:
        args.duration = 1
    if args.connections is None:
        args.connections = SMOKE_LEVELS if args.smoke else LEVELS
    if args.duration < 1:
        parser.error("--duration must be at least 1")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        duration=args.duration,
        warmup=1 if args.smoke else 2,
        connections=args.connections,
        engine=args.engine,
        access_log=args.access_log == "on",
        out=args.out or BENCH_DIR / "results" / f"{stamp}-simulation.md",
        smoke=args.smoke,
    )


def say(text: str) -> None:
    print(text, flush=True)


class WrongAnswer(Exception):
    """chaingate answered a check wrongly."""


def configure(server: procs.ChaingateServer, manifest_path: Path, engine: str) -> None:
    """The devnet network gets its manifest, the follower and the indexer (the metadata
    service needs them); the simulation its engine."""
    text = server.config_path.read_text()
    anchor = "testnet = true\n"
    if text.count(anchor) != 1:
        raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
    network = f'{anchor}manifest = "{manifest_path}"\nfinality_depth = 2\nblock_time = 1.0\n'
    extra = f"""
[simulation]
engine = "{engine}"

[chains.ethereum.devnet.follower]
poll_interval = 0.1
"""
    text = text.replace("# generated by bench/run.py", "# generated by bench/simulation.py")
    server.config_path.write_text(text.replace(anchor, network) + extra)


def rpc_body(method: str, params: list[Any]) -> bytes:
    call = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return json.dumps(call, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Requests:
    call: bytes
    simulate: bytes
    holder: str
    token: str


def requests_for(manifest: Manifest) -> Requests:
    holder, token = manifest.accounts[2], manifest.address("erc20_cgt")
    balance = abi.encode_call("balanceOf(address)", holder)
    call = rpc_body("eth_call", [{"to": token, "data": "0x" + balance.hex()}, "latest"])
    send = abi.encode_call("transfer(address,uint256)", manifest.deployer, 10**18)
    tx = {"from": holder, "to": token, "data": "0x" + send.hex()}
    return Requests(call, rpc_body("chaingate_simulateAssetChanges", [tx]), holder, token)


def post(url: str, headers: dict[str, str], body: bytes) -> Any:
    request = urllib.request.Request(
        url, body, {**headers, "Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def check(server: procs.ChaingateServer, requests: Requests, timeout: float = 60.0) -> str:
    """Until the simulation names the token by its symbol (the indexer's metadata), then the
    engine that answered it."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        reply = post(server.rpc_url, server.headers, requests.simulate)
        changes = reply.get("result", {}).get("changes") or [{}]
        change = changes[0]
        if change.get("symbol") == "CGT" and change.get("amount") == "1":
            expected = (requests.holder.lower(), "ERC20", "TRANSFER")
            got = (change["from"], change["assetType"], change["changeType"])
            if got != expected or reply["result"]["error"] is not None:
                raise WrongAnswer(f"simulation: {reply!s:.400}")
            for line in server.metrics().splitlines():
                if line.startswith("chaingate_simulation_engine_total{") and not line.endswith(
                    " 0"
                ):
                    return line.split('engine="')[1].split('"')[0]
            raise WrongAnswer("no engine counted in /metrics")
        last = reply
        time.sleep(0.3)
    raise WrongAnswer(f"the simulation never carried the token's facts: {last!s:.400}")


@dataclass(frozen=True)
class Run:
    kind: str  # eth_call | simulate
    connections: int
    result: WrkResult
    cpu_us: float | None
    warmup_errors: int

    @property
    def errors(self) -> int:
        return self.result.errors + self.warmup_errors


def measure(
    opts: Options, wrk: Wrk, server: procs.ChaingateServer, kind: str, body: bytes, level: int
) -> Run:
    pid = server.process.pid or 0
    load = replace(wrk, connections=level)
    warmup = load.run(server.rpc_url, body, opts.warmup)
    threads.settle(pid)
    cpu = threads.split_cpu(pid)
    result = load.run(server.rpc_url, body, opts.duration)
    used = threads.split_cpu(pid) - cpu
    threads.settle(pid)
    per = (used.main + used.others) / result.requests * 1e6 if result.requests else None
    run = Run(kind, level, result, per, warmup.errors)
    flag = f"  {report.FLAG} {run.errors} errors" if run.errors else ""
    say(
        f"[{kind} c={level}] {result.rps:8.0f} req/s  p50 {result.p50_ms:.2f} ms  "
        f"p99 {result.p99_ms:.2f} ms  CPU {per or 0:.0f} µs/req{flag}"
    )
    return run


@dataclass
class Results:
    header: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def find(self, kind: str, level: int) -> Run | None:
        return next((r for r in self.runs if r.kind == kind and r.connections == level), None)


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


def render(res: Results) -> str:
    lines = [f"# chaingate simulation benchmark, {res.header.get('date', '')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.header.items() if k != "date"]
    lines += [
        "",
        "## A token transfer's simulation beside a plain eth_call, through chaingate",
        "",
        "| request | connections | req/s | p50 ms | p90 ms | p99 ms | max ms "
        "| chaingate CPU µs/req | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in res.runs:
        r = run.result
        errors = str(run.errors) if not run.errors else f"{report.FLAG} **{run.errors}**"
        cpu = "n/a" if run.cpu_us is None else f"{run.cpu_us:.0f}"
        lines.append(
            f"| {run.kind} | {run.connections} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p90_ms:.2f} "
            f"| {r.p99_ms:.2f} | {r.max_ms:.2f} | {cpu} | {errors} |"
        )
    lines += [
        "",
        f"## Ratios simulate/eth_call (target: p50 at most {TARGET_P50_RATIO:g}x)",
        "",
        "| connections | p50 | p99 | req/s | CPU per request |",
        "|---:|---:|---:|---:|---:|",
    ]
    for level in sorted({run.connections for run in res.runs}):
        sim, call = res.find("simulate", level), res.find("eth_call", level)
        if sim is None or call is None:
            continue
        p50 = _ratio(sim.result.p50_ms, call.result.p50_ms)
        if p50 != "n/a" and float(p50) > TARGET_P50_RATIO:
            p50 = f"{report.FLAG} {p50}"
        lines.append(
            f"| {level} | {p50} | {_ratio(sim.result.p99_ms, call.result.p99_ms)} "
            f"| {_ratio(sim.result.rps, call.result.rps)} | {_ratio(sim.cpu_us, call.cpu_us)} |"
        )
    lines += [
        "",
        "Both loads hit the same process under the same key gate, one right after the other: "
        "the ratio is what a simulation costs beyond an eth_call (the node's simulation or "
        "trace instead of a call, the events read into changes, the token's metadata, the "
        "answer encoded in Python rather than relayed as the node's bytes).",
    ]
    if res.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in res.notes)]
    return "\n".join(lines) + "\n"


def header(
    opts: Options, impl: str, engine: str, busy: float | None, versions: str
) -> dict[str, str]:
    pure = os.environ.get("CHAINGATE_PURE")
    levels = ", ".join(str(c) for c in opts.connections)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "chaingate": (
            f"{chaingate.__version__}, impl **{impl}** (CHAINGATE_PURE="
            f"{pure if pure is not None else 'unset'}), one `chaingate serve` process, "
            f"follower and indexer on ethereum/devnet; simulation engine `{opts.engine}`, "
            f"answered by **{engine}**"
        ),
        "access_log": f"**{str(opts.access_log).lower()}**",
        "auth": "**on**: one enterprise (unlimited) test key in X-API-Key on every request",
        "how measured": (
            f"wrk -t1 at {levels} connection(s), keep-alive, {opts.duration} s per measurement "
            f"after a {opts.warmup} s warm-up, requests time out after {WRK_TIMEOUT_S} s; on "
            f"{os.cpu_count()} cores shared by wrk, chaingate and anvil"
            + (" (--smoke)" if opts.smoke else "")
        ),
        "versions": versions,
    }


def bench(
    opts: Options, wrk_binary: str, stack: contextlib.ExitStack, busy: float | None
) -> Results:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-simulation-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    anvil = AnvilProcess()
    stack.callback(anvil.stop)
    anvil.start()
    anvil_version = tools.anvil_version(anvil_binary(install=False))
    say(f"anvil {anvil_version} on :{anvil.port}")
    manifest = bootstrap_devnet(
        anvil.url, paymaster_signer=PrivateKey.generate().address, announce=say
    )
    manifest_path = workdir / "devnet-manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    auth = procs.Auth.fresh(workdir / "chaingate.db")
    server = procs.ChaingateServer(
        workdir, "chaingate", anvil.url, access_log=opts.access_log, coalesce=True, auth=auth
    )
    configure(server, manifest_path, opts.engine)
    server.create_key()
    stack.callback(server.stop)
    server.start(timeout=60.0)
    impl = server.impl()
    requests = requests_for(manifest)
    engine = check(server, requests)
    say(f"chaingate on :{server.port} (impl {impl}); simulations answered by {engine}")
    versions = (
        f"anvil {anvil_version}, wrk {tools.wrk_version(wrk_binary)}, "
        f"Python {platform.python_version()}"
    )
    res = Results(header(opts, impl, engine, busy, versions))
    res.header["requests"] = (
        f"eth_call: `balanceOf({requests.holder})` on CGT at latest; simulate: "
        f"`chaingate_simulateAssetChanges` of {requests.holder} sending 1 CGT"
    )
    headers = tuple(server.headers.items())
    wrk = Wrk(wrk_binary, workdir, threads=1, timeout_s=WRK_TIMEOUT_S, headers=headers)
    for level in opts.connections:
        res.runs.append(measure(opts, wrk, server, "eth_call", requests.call, level))
        res.runs.append(measure(opts, wrk, server, "simulate", requests.simulate, level))
    return res


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        wrk_binary = tools.require_tools(("wrk",))["wrk"]
    except tools.MissingTool as exc:
        say(f"error: {exc}")
        return 3
    outcome = runner.guarded(
        lambda stack, busy: bench(opts, wrk_binary, stack, busy),
        (procs.ServerFailed, WrongAnswer, WrkFailed, RuntimeError, OSError),
    )
    if isinstance(outcome, int):
        return outcome
    res = outcome.result
    res.header["background"] = outcome.background
    res.notes.append(f"whole run took {outcome.seconds:.0f} s")
    text = render(res)
    say("\n" + text)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(text)
    say(f"report written to {opts.out}")
    if any(run.errors for run in res.runs):
        say(f"{report.FLAG} some run(s) had errors; see the errors column")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
