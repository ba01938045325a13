"""REST data plane: the balances of an address holding 1,000 token contracts, and what the REST
plane costs beside the JSON-RPC path.

    python bench/data_plane.py [--tokens 1000] [--duration 10] [--connections 1,10,32,100]
                               [--limit 100] [--rest-connections 32] [--profile auto|on|off]
                               [--access-log on|off] [--out PATH] [--smoke]

Starts on loopback free ports: anvil, bootstrapped as the devnet ``chaingate dev`` serves (its
price feeds given a fresh round), then ``--tokens`` DevToken ERC-20s (distinct names, symbols,
6/8/18 decimals) deployed through the deterministic deployer and each minted to one holder
(anvil's second account, which also holds the demo tokens, odd ones included), 100 tokens
per stage with automine off.  Then one ``chaingate serve`` process (API keys on: one unlimited
enterprise key; the devnet network with its manifest, the follower from block 0 polling every
100 ms, the indexer, metadata with the outbound fetcher kept off the internet) and waits
until the index holds the head, then pages through every balance once (metadata cache warm)
and checks every bench token's entry.  Then, with wrk (1 thread, keep-alive, the key in
``X-API-Key``):

* **balances** — ``GET /v1/tokens/ethereum-devnet/balances/<holder>?limit=100`` at each of
  ``--connections`` (1: one request's own latency; the last, 100, is the target's): req/s,
  p50, p90, p99, bytes and chaingate CPU per request; the last level's p99 against the 20 ms
  target;
* **REST vs JSON-RPC** — a cached ``GET /v1/tokens/ethereum-devnet/metadata/<token>`` and the
  cached JSON-RPC path (``eth_chainId``, answered from chaingate's static cache) at
  ``--rest-connections``: req/s, latency, CPU per request and the ratios REST/RPC;
* **profile** (``--profile on``, or ``auto`` when the balances p99 misses the target) — py-spy
  samples chaingate while the balances load, then the metadata load, runs again; the samples
  are split into edge, Quart/ASGI, store query, metadata, handler and encoding, checksums,
  auth, logging, trio (with CPU µs per request each), event-loop thread against worker
  threads, and the hottest functions are listed.  py-spy is not a dependency:
  ``pip install --target /tmp/pyspy py-spy`` and pass ``--py-spy /tmp/pyspy/bin/py-spy``
  (or have it on PATH).

Writes a markdown report to bench/results/<UTC time>-data.md and prints it.  Exit status: 0
done (the target is reported, not enforced); 1 some run had errors; 2 a server failed or
answered wrongly; 3 wrk is missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

import chaingate  # noqa: E402
from benchkit import procs, pyspy, report, runner, scenarios, threads, tools  # noqa: E402
from benchkit.wrkget import WrkGet  # noqa: E402
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate.config.manifest import Manifest, save_manifest  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary, rpc_call  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet, default_cache_dir, load_artifacts  # noqa: E402
from chaingate.devnet.deploy import Tx, TxRunner, create2_tx, manual_mining  # noqa: E402
from chaingate.devnet.keeper import refresh_price_feeds  # noqa: E402
from chaingate.devnet.rpc import DevnetRpc  # noqa: E402
from chaingate.evm import abi  # noqa: E402
from chaingate.evm.addresses import checksum_address  # noqa: E402

P99_TARGET_MS = 20.0
LEVELS = (1, 10, 32, 100)  # balances concurrency; the last is the target's
SMOKE_LEVELS = (1, 10)  # a 1 s run at 100 connections may see no answer at all
SMOKE_TOKENS = 50
CHAIN = "ethereum-devnet"  # the {chain} spelling of ethereum/devnet in REST paths
STAGE_TOKENS = 100  # tokens per TxRunner stage (a deployment and a mint each)
DEPLOY_GAS = 1_000_000  # DevToken's deployment uses ~650k
MINT_GAS = 100_000
BLOCK_GAS_LIMIT = 1_000_000_000  # a whole stage fits in one block
DECIMALS = (18, 6, 8)
FOLLOWER_POLL = 0.1
PROFILE_RATE = 200  # py-spy samples per second
PAYMASTER_SIGNER = "0x" + "5a" * 20  # nothing here signs for the paymaster


@dataclass(frozen=True)
class Options:
    tokens: int
    duration: int
    warmup: int
    connections: tuple[int, ...]
    rest_connections: int
    limit: int
    access_log: bool
    profile: str  # auto | on | off
    py_spy: str | None
    out: Path
    smoke: bool


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=1000, help="token contracts held")
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument(
        "--connections",
        type=tools.connection_levels,
        default=None,
        help="balances concurrency levels, default 1,10,32,100 (--smoke: 1,10); the highest "
        "is judged against the target",
    )
    parser.add_argument("--rest-connections", type=int, default=32, help="metadata vs RPC")
    parser.add_argument("--limit", type=int, default=100, help="balances page size (max 100)")
    parser.add_argument("--access-log", choices=("on", "off"), default="on")
    parser.add_argument(
        "--profile",
        choices=("auto", "on", "off"),
        default="auto",
        help="py-spy profiles of the balances and metadata loads (auto: when the balances "
        "p99 misses the target)",
    )
    parser.add_argument("--py-spy", help="the py-spy binary (default: on PATH or in the venv)")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC time>-data.md")
    parser.add_argument(
        "--smoke", action="store_true", help="50 tokens, 1 s runs at 1 and 10 connections"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.duration = min(args.tokens, SMOKE_TOKENS), 1
    if args.connections is None:
        args.connections = SMOKE_LEVELS if args.smoke else LEVELS
    if args.tokens < 1 or args.duration < 1 or args.rest_connections < 1:
        parser.error("--tokens, --duration and --rest-connections must be at least 1")
    if not 1 <= args.limit <= 100:
        parser.error("--limit must be 1..100 (the API's page limit)")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        tokens=args.tokens,
        duration=args.duration,
        warmup=1 if args.smoke else 2,
        connections=args.connections,
        rest_connections=args.rest_connections,
        limit=args.limit,
        access_log=args.access_log == "on",
        profile=args.profile,
        py_spy=args.py_spy,
        out=args.out or BENCH_DIR / "results" / f"{stamp}-data.md",
        smoke=args.smoke,
    )


def say(text: str) -> None:
    print(text, flush=True)


# --- the devnet ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchToken:
    address: str  # EIP-55
    name: str
    symbol: str
    decimals: int
    balance: int  # raw units held by the holder


def _salt(index: int) -> bytes:
    return b"chaingate-bench-data".ljust(24, b"\0") + index.to_bytes(8, "big")


def plan_tokens(count: int) -> list[tuple[str, str, int, int]]:
    """(name, symbol, decimals, balance) of each bench token; balances are not round."""
    planned = []
    for i in range(count):
        decimals = DECIMALS[i % len(DECIMALS)]
        balance = (i + 1) * 10**decimals + 12_345 * (i + 1)
        planned.append((f"Bench Token {i:04d}", f"BT{i:04d}", decimals, balance))
    return planned


def deploy_tokens(url: str, manifest: Manifest, holder: str, count: int) -> list[BenchToken]:
    """Deploy ``count`` DevTokens through the deterministic deployer and mint each to
    ``holder``, ``STAGE_TOKENS`` per stage (one sender: a token's mint follows its deployment
    in nonce order), automine off."""
    artifact = load_artifacts(default_cache_dir(), announce=_quiet)["DevToken"]
    owner = manifest.deployer
    tokens: list[BenchToken] = []
    with DevnetRpc(url) as rpc, manual_mining(rpc):
        runner = TxRunner(rpc, receipt_timeout=120.0)
        planned = plan_tokens(count)
        for first in range(0, count, STAGE_TOKENS):
            stage: list[Tx] = []
            for i in range(first, min(count, first + STAGE_TOKENS)):
                name, symbol, decimals, balance = planned[i]
                init = artifact.bytecode + abi.encode(
                    ["string", "string", "uint8", "address"], [name, symbol, decimals, owner]
                )
                tx, address = create2_tx(f"deploy {symbol}", owner, _salt(i), init, DEPLOY_GAS)
                mint = abi.encode_call("mint(address,uint256)", holder, balance)
                stage += [tx, Tx(f"mint {symbol}", owner, address, mint, gas=MINT_GAS)]
                tokens.append(
                    BenchToken(checksum_address(address), name, symbol, decimals, balance)
                )
            runner.run(stage)
        codes = rpc.batch([("eth_getCode", [t.address, "latest"]) for t in tokens])
    empty = [t.symbol for t, code in zip(tokens, codes, strict=True) if code in ("0x", "")]
    if empty:
        raise RuntimeError(f"no code where bench tokens should be: {', '.join(empty[:10])}")
    return tokens


def _quiet(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- chaingate ----------------------------------------------------------------------------


def configure(server: procs.ChaingateServer, manifest_path: Path) -> None:
    """The devnet network of the generated config gets its manifest, the follower from block 0,
    the indexer and metadata kept on loopback (``.localhost`` gateways are refused by the
    outbound policy before any lookup: the demo NFTs' documents are never fetched)."""
    text = server.config_path.read_text()
    anchor = "testnet = true\n"
    if text.count(anchor) != 1:
        raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
    network = f'{anchor}manifest = "{manifest_path}"\nfinality_depth = 2\nblock_time = 1.0\n'
    extra = f"""
[chains.ethereum.devnet.follower]
start_block = 0
poll_interval = {FOLLOWER_POLL}

[chains.ethereum.devnet.indexer]
enabled = true

[chains.ethereum.devnet.metadata]
ipfs_gateways = ["http://ipfs.localhost"]
arweave_gateway = "http://arweave.localhost"
"""
    text = text.replace("# generated by bench/run.py", "# generated by bench/data_plane.py")
    server.config_path.write_text(text.replace(anchor, network) + extra)


class WrongAnswer(Exception):
    """chaingate answered a check wrongly (or not in time)."""


def get_json(url: str, headers: Mapping[str, str], timeout: float = 10.0) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, body.decode(errors="replace")


@dataclass
class Holdings:
    total: int = 0
    block_number: int | None = None
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # by contract (EIP-55)


def balances_url(base: str, holder: str, limit: int, page: int = 1) -> str:
    return f"{base}/v1/tokens/{CHAIN}/balances/{holder}?limit={limit}&page={page}"


def wait_indexed(
    base: str, headers: Mapping[str, str], holder: str, head: int, count: int, timeout: float
) -> Holdings:
    """Until the index's block is the head and the holder has at least ``count`` balances."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        status, body = get_json(balances_url(base, holder, 1), headers)
        last = body
        if status == 200 and (body.get("block_number") or -1) >= head and body["total"] >= count:
            return Holdings(total=int(body["total"]), block_number=body["block_number"])
        time.sleep(0.2)
    raise WrongAnswer(f"the index did not reach block {head} in {timeout:.0f}s: {last!s:.300}")


def read_all(base: str, headers: Mapping[str, str], holder: str, total: int) -> Holdings:
    """Every balance of ``holder``, page by page (100 a page)."""
    held = Holdings(total=total)
    for page in range(1, math.ceil(total / 100) + 1):
        status, body = get_json(balances_url(base, holder, 100, page), headers)
        if status != 200:
            raise WrongAnswer(f"balances page {page}: HTTP {status}: {body!s:.300}")
        held.block_number = body["block_number"]
        for entry in body["tokens"]:
            held.entries[entry["contract"]] = entry
    return held


def token_problems(held: Holdings, tokens: list[BenchToken]) -> list[str]:
    problems = []
    for token in tokens:
        entry = held.entries.get(token.address)
        want = {
            "name": token.name,
            "symbol": token.symbol,
            "decimals": token.decimals,
            "balance": str(token.balance),
        }
        got = {key: entry.get(key) for key in want} if entry else None
        if got != want:
            problems.append(f"{token.symbol}: {got} (expected {want})")
    return problems


def warm(
    base: str, headers: Mapping[str, str], holder: str, total: int, tokens: list[BenchToken]
) -> Holdings:
    """Page through every balance until every bench token shows its metadata (the metadata
    cache is then warm for all of them)."""
    deadline = time.monotonic() + 120.0
    while True:
        held = read_all(base, headers, holder, total)
        problems = token_problems(held, tokens)
        if not problems:
            return held
        if time.monotonic() > deadline:
            raise WrongAnswer(
                f"{len(problems)} bench token(s) wrong after 120 s: " + "; ".join(problems[:5])
            )
        time.sleep(0.5)


# --- measurements --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    label: str
    connections: int
    result: WrkResult
    main_cpu_us: float | None  # chaingate's event-loop (main) thread, CPU per request
    others_cpu_us: float | None  # its other threads (SQL, log writer), CPU per request
    bytes_per_response: float | None
    upstream_requests: int  # chaingate -> anvil during the run (head polling included)
    busy_after_s: float  # chaingate still busy after wrk stopped (abandoned requests)
    warmup_errors: int = 0

    @property
    def errors(self) -> int:
        return self.result.errors + self.warmup_errors

    @property
    def cpu_us(self) -> float | None:
        if self.main_cpu_us is None or self.others_cpu_us is None:
            return None
        return self.main_cpu_us + self.others_cpu_us


Load = Callable[[int], tuple[WrkResult, float | None]]  # seconds -> result, bytes/response


class Bench:
    """Each run: a warm-up, chaingate left to finish what the warm-up abandoned, then the
    measured run with chaingate's CPU (per thread) and upstream requests around it, then the
    time chaingate stays busy after wrk stopped."""

    def __init__(
        self, opts: Options, wrk_binary: str, workdir: Path, server: procs.ChaingateServer
    ) -> None:
        self.opts = opts
        self.server = server
        self.pid = server.process.pid or 0
        headers = tuple(server.headers.items())
        # A balances page at 100 connections may wait seconds: no timeout short of that.
        self.get = WrkGet(wrk_binary, workdir, threads=1, timeout_s=30, headers=headers)
        self.post = Wrk(wrk_binary, workdir, threads=1, headers=headers)

    def _upstream(self) -> int:
        return report.total(self.server.metrics(), "chaingate_upstream_requests_total")

    def _run(self, label: str, connections: int, load: Load) -> Run:
        warmup, _ = load(self.opts.warmup)
        threads.settle(self.pid)
        upstream, cpu = self._upstream(), threads.split_cpu(self.pid)
        result, size = load(self.opts.duration)
        used = threads.split_cpu(self.pid) - cpu
        upstream = self._upstream() - upstream
        run = Run(
            label,
            connections,
            result,
            _per_request(used.main, result),
            _per_request(used.others, result),
            size,
            upstream,
            threads.settle(self.pid),
            warmup.errors,
        )
        _progress(run)
        return run

    def get_run(self, label: str, url: str, connections: int) -> Run:
        wrk = replace(self.get, connections=connections)

        def load(seconds: int) -> tuple[WrkResult, float | None]:
            got = wrk.run(url, seconds)
            return got.result, got.bytes_per_response

        return self._run(label, connections, load)

    def rpc_run(self, label: str, body: bytes, connections: int) -> Run:
        wrk = replace(self.post, connections=connections)

        def load(seconds: int) -> tuple[WrkResult, float | None]:
            return wrk.run(self.server.rpc_url, body, seconds), None

        return self._run(label, connections, load)


def _per_request(seconds: float, result: WrkResult) -> float | None:
    return seconds / result.requests * 1e6 if result.requests else None


def _progress(run: Run) -> None:
    r = run.result
    flag = f"  {report.FLAG} {run.errors} errors" if run.errors else ""
    say(
        f"[{run.label} c={run.connections}] {r.rps:8.0f} req/s  p50 {r.p50_ms:.2f} ms  "
        f"p99 {r.p99_ms:.2f} ms  CPU {_num(run.main_cpu_us)}+{_num(run.others_cpu_us)} "
        f"µs/req  busy {run.busy_after_s:.1f} s after{flag}"
    )


# --- profile --------------------------------------------------------------------------------


def profile_load(
    bench: Bench, binary: str, label: str, url: str, connections: int, raw_path: Path
) -> pyspy.Profile:
    """py-spy samples chaingate while wrk runs the load again (the figures under the sampler
    are the profile's, never the table's)."""
    seconds = bench.opts.duration
    threads.settle(bench.pid)
    cpu = threads.split_cpu(bench.pid)
    with pyspy.Sampler(binary, bench.pid, seconds, raw_path, rate=PROFILE_RATE) as sampler:
        got = replace(bench.get, connections=connections).run(url, seconds)
    used = threads.split_cpu(bench.pid) - cpu
    threads.settle(bench.pid)
    if sampler.failure:
        return pyspy.Profile(label=label, note=sampler.failure)
    profile = pyspy.parse_collapsed(raw_path.read_text())
    profile.label = label
    profile.rate = PROFILE_RATE
    profile.requests = got.result.requests
    profile.main_cpu_us = _per_request(used.main, got.result)
    profile.others_cpu_us = _per_request(used.others, got.result)
    profile.raw_path = raw_path
    return profile


# --- report ---------------------------------------------------------------------------------


@dataclass
class Results:
    header: dict[str, str]
    balances: list[Run] = field(default_factory=list)
    metadata: Run | None = None
    rpc: Run | None = None
    profiles: list[pyspy.Profile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return [*self.balances, *(r for r in (self.metadata, self.rpc) if r is not None)]

    @property
    def flagged(self) -> list[Run]:
        return [run for run in self.runs if run.errors]

    def target_run(self) -> Run | None:
        return self.balances[-1] if self.balances else None

    def target_met(self) -> bool | None:
        run = self.target_run()
        if run is None:
            return None
        return run.result.p99_ms <= P99_TARGET_MS and not run.errors


def _errors_cell(run: Run) -> str:
    if not run.errors:
        return "0"
    text = f"{report.FLAG} **{run.result.errors}** ({run.result.error_detail()})"
    return text + (f" +{run.warmup_errors} in warm-up" if run.warmup_errors else "")


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def render(res: Results) -> str:
    lines = [f"# chaingate data plane benchmark, {res.header.get('date', '')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.header.items() if k != "date"]
    lines += ["", "## Token balances (`GET /v1/tokens/{chain}/balances/{address}`)", ""]
    lines += [
        "| connections | req/s | p50 ms | p90 ms | p99 ms | max ms | KiB/response "
        "| event loop CPU µs/req | other threads CPU µs/req | busy after stop s "
        "| upstream requests | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in res.balances:
        r = run.result
        size = None if run.bytes_per_response is None else run.bytes_per_response / 1024
        lines.append(
            f"| {run.connections} | {r.rps:.0f} | {r.p50_ms:.2f} | {r.p90_ms:.2f} "
            f"| {r.p99_ms:.2f} | {r.max_ms:.2f} | {_num(size, '.1f')} "
            f"| {_num(run.main_cpu_us)} | {_num(run.others_cpu_us)} "
            f"| {run.busy_after_s:.1f} | {run.upstream_requests} | {_errors_cell(run)} |"
        )
    lines += [
        "",
        "CPU per request from /proc: chaingate's main thread (the event loop, which every "
        "request needs) and its other threads (the SQLite store's queries, the log writer).  "
        "Busy after stop: how long chaingate kept computing after wrk closed its connections "
        "(a closed connection does not cancel a request already being computed); it is "
        "waited out before the next measurement.",
    ]
    target = res.target_run()
    if target is not None:
        verdict = "MET" if res.target_met() else "NOT MET"
        needed = target.connections / (P99_TARGET_MS / 1000)
        lines += [
            "",
            f"**p99 at {target.connections} connections: {target.result.p99_ms:.2f} ms; "
            f"target <= {P99_TARGET_MS:.0f} ms: {verdict}** "
            f"({target.result.p99_ms / P99_TARGET_MS:.2f}x the target).",
            "",
            f"Each of wrk's {target.connections} connections sends its next request as soon as "
            f"the last is answered, so the mean latency is {target.connections} / req/s "
            f"(Little's law): a p99 <= {P99_TARGET_MS:.0f} ms needs more than {needed:,.0f} "
            f"req/s, i.e. at most ~{1e6 / needed:.0f} µs of chaingate's event-loop thread per "
            "request.  The 1-connection row is one request's own latency.",
        ]
    lines += ["", "## The REST plane's cost: cached metadata GET beside cached JSON-RPC", ""]
    lines += [
        "| request | connections | req/s | p50 ms | p99 ms | event loop CPU µs/req "
        "| other threads CPU µs/req | upstream requests | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for plane in (p for p in (res.metadata, res.rpc) if p is not None):
        r = plane.result
        lines.append(
            f"| {plane.label} | {plane.connections} | {r.rps:.0f} | {r.p50_ms:.3f} "
            f"| {r.p99_ms:.3f} | {_num(plane.main_cpu_us, '.1f')} "
            f"| {_num(plane.others_cpu_us, '.1f')} | {plane.upstream_requests} "
            f"| {_errors_cell(plane)} |"
        )
    if res.metadata is not None and res.rpc is not None and res.rpc.result.rps:
        meta, rpc = res.metadata, res.rpc
        ratio = meta.result.rps / rpc.result.rps
        cpu = "n/a"
        if meta.cpu_us and rpc.cpu_us:
            cpu = f"{meta.cpu_us / rpc.cpu_us:.2f} (+{meta.cpu_us - rpc.cpu_us:.0f} µs)"
        loop = "n/a"
        if meta.main_cpu_us and rpc.main_cpu_us:
            loop = f"{meta.main_cpu_us / rpc.main_cpu_us:.2f}"
        lines += [
            "",
            f"**req/s REST/RPC: {ratio:.2f}**; CPU per request REST/RPC: {cpu}, on the event "
            f"loop's thread alone: {loop}.",
            "",
            "Both answered from memory by the same process under the same key gate: the "
            "difference is what the REST plane adds (the ASGI app, typed input, the metadata "
            "service's lookups, the response model's encoding).  Upstream requests are "
            "chaingate's own during the run (head polling, the 15 s total-supply re-read).",
        ]
    for profile in res.profiles:
        lines += ["", *pyspy.render(profile)]
    if res.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in res.notes)]
    return "\n".join(lines) + "\n"


# --- the run ----------------------------------------------------------------------------------


def bench(
    opts: Options, wrk_binary: str, stack: contextlib.ExitStack, busy: float | None
) -> Results:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-data-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    anvil = AnvilProcess(extra=["--gas-limit", str(BLOCK_GAS_LIMIT)])
    stack.callback(anvil.stop)
    anvil.start()
    anvil_version = tools.anvil_version(anvil_binary(install=False))
    say(f"anvil {anvil_version} on :{anvil.port}")
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=PAYMASTER_SIGNER, announce=say)
    refresh_price_feeds(anvil.url, manifest)  # prices fresh by the feeds' own clock
    holder = manifest.accounts[1]
    started = time.monotonic()
    tokens = deploy_tokens(anvil.url, manifest, holder, opts.tokens)
    head = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    say(
        f"{len(tokens)} tokens deployed and minted to {holder} in "
        f"{time.monotonic() - started:.1f}s (head {head})"
    )
    manifest_path = save_manifest(manifest, workdir / "devnet-manifest.json")

    auth = procs.Auth.fresh(workdir / "chaingate.db")
    server = procs.ChaingateServer(
        workdir, "chaingate", anvil.url, access_log=opts.access_log, coalesce=True, auth=auth
    )
    configure(server, manifest_path)
    server.create_key()
    stack.callback(server.stop)
    server.start(timeout=60.0)
    impl = server.impl()
    say(f"chaingate on :{server.port} (impl {impl})")
    started = time.monotonic()
    indexed = wait_indexed(server.base, server.headers, holder, head, len(tokens), 300.0)
    say(
        f"index at block {indexed.block_number} with {indexed.total} balances after "
        f"{time.monotonic() - started:.1f}s"
    )
    held = warm(server.base, server.headers, holder, indexed.total, tokens)
    say(f"every balance read once ({len(held.entries)} tokens with metadata shown)")

    balances = balances_url(server.base, holder, opts.limit)
    status, body = get_json(balances, server.headers)
    if status != 200 or len(body["tokens"]) != min(opts.limit, indexed.total):
        raise WrongAnswer(f"balances page: HTTP {status}, {str(body)[:300]}")
    target = tokens[len(tokens) // 2]
    metadata = f"{server.base}/v1/tokens/{CHAIN}/metadata/{target.address}"
    status, body = get_json(metadata, server.headers)
    if status != 200 or (body.get("symbol"), body.get("decimals")) != (
        target.symbol,
        target.decimals,
    ):
        raise WrongAnswer(f"metadata of {target.symbol}: HTTP {status}, {str(body)[:300]}")
    chain_id_body = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}'
    answer = scenarios.post(server.rpc_url, chain_id_body, server.headers)
    if answer.get("result") != hex(anvil.chain_id):
        raise WrongAnswer(f"eth_chainId answered {answer}")

    demo = indexed.total - len(tokens)
    res = Results(
        header(opts, impl, busy, anvil_version, tools.wrk_version(wrk_binary)),
    )
    res.header["data"] = (
        f"holder {holder}: {indexed.total} balances in the index ({len(tokens)} bench "
        f"DevTokens + {demo} demo tokens, odd ones included), index at block "
        f"{indexed.block_number}; pages of `limit={opts.limit}` "
        f"({len(tokens)} tokens with names, symbols, 6/8/18 decimals; no price feed for "
        "the bench tokens, the demo ones priced by their devnet feeds)"
    )
    runner = Bench(opts, wrk_binary, workdir, server)
    for connections in opts.connections:
        res.balances.append(runner.get_run("balances", balances, connections))
    res.metadata = runner.get_run(
        f"metadata GET ({target.symbol})", metadata, opts.rest_connections
    )
    res.rpc = runner.rpc_run("eth_chainId JSON-RPC (static cache)", chain_id_body,
                             opts.rest_connections)  # fmt: skip
    want_profile = opts.profile == "on" or (opts.profile == "auto" and not res.target_met())
    if want_profile:
        binary = pyspy.find(opts.py_spy)
        if binary is None:
            res.profiles.append(
                pyspy.Profile(
                    label="balances",
                    note="py-spy not found: `pip install --target /tmp/pyspy py-spy`, then "
                    "`--py-spy /tmp/pyspy/bin/py-spy` (or put py-spy on PATH)",
                )
            )
        else:
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            loads = (
                ("balances", balances, opts.connections[-1]),
                (f"metadata GET ({target.symbol})", metadata, opts.rest_connections),
            )
            for label, url, connections in loads:
                raw = opts.out.with_name(f"{opts.out.stem}-profile-{label.split()[0]}.txt")
                say(f"profiling {label} at {connections} connections with {binary} ...")
                res.profiles.append(profile_load(runner, binary, label, url, connections, raw))
    return res


def header(
    opts: Options, impl: str, busy: float | None, anvil_version: str, wrk_version: str
) -> dict[str, str]:
    pure = os.environ.get("CHAINGATE_PURE")
    runs = f"{opts.duration} s per measurement after a {opts.warmup} s warm-up"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "chaingate": (
            f"{chaingate.__version__}, impl **{impl}** (CHAINGATE_PURE="
            f"{pure if pure is not None else 'unset'}), one `chaingate serve` process, "
            "SQLite store, follower + indexer + metadata on ethereum/devnet"
        ),
        "access_log": f"**{str(opts.access_log).lower()}**",
        "auth": "**on**: one enterprise (unlimited) test key in X-API-Key on every request",
        "load": f"wrk -t1, keep-alive, {runs}; GETs time out after 30 s, POSTs after 5 s"
        + (" (--smoke)" if opts.smoke else ""),
        "versions": f"anvil {anvil_version}, wrk {wrk_version}, Python {platform.python_version()}",
        "caveat": (
            f"wrk, chaingate and anvil share this machine's {os.cpu_count()} cores: every "
            "number includes contention with the load generator"
        ),
    }


def write(res: Results, out: Path) -> None:
    text = render(res)
    say("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    say(f"report written to {out}")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        wrk_binary = tools.require_tools(("wrk",))["wrk"]
    except tools.MissingTool as exc:
        say(f"error: {exc}")
        return 3
    outcome = runner.guarded(
        lambda stack, busy: bench(opts, wrk_binary, stack, busy),
        (procs.ServerFailed, WrongAnswer, scenarios.WrongAnswer, WrkFailed, RuntimeError, OSError),
    )
    if isinstance(outcome, int):
        return outcome
    res = outcome.result
    res.header["background"] = outcome.background
    res.notes.append(f"whole run took {outcome.seconds:.0f} s")
    write(res, opts.out)
    if res.flagged:
        say(f"{report.FLAG} {len(res.flagged)} run(s) had errors; see the errors column")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
