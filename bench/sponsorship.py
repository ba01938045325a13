"""Gas sponsorship: signed sponsorships per second and their latency, beside a cached GET.

    python bench/sponsorship.py [--duration 10] [--connections 50] [--access-log on|off]
                                [--out PATH] [--smoke]

Starts on loopback free ports: anvil, bootstrapped as the devnet ``chaingate dev`` serves
(its VerifyingPaymasters' signer a key generated for the run, the price feeds given a fresh
round), then one ``chaingate serve`` process (API keys on: one unlimited enterprise key; the
devnet network with its manifest and the follower, polling every 100 ms; the indexer off; the
paymaster key in a 0600 key file, ``[paymaster] key_file``).  Through the API it creates one
smart wallet (SimpleAccount, EntryPoint v0.7, counterfactual) and a policy whose one rule,
``max_gas_usd = 1000``, never refuses but makes every sponsorship price its worst case in USD
from the ETH/USD feed; one sponsorship is checked (200, the devnet's v0.7 paymaster, a USD
cost, and a paymaster signature that recovers to the run's key).  Then, with wrk (1 thread,
keep-alive, the key in ``X-API-Key``), at each of ``--connections``:

* **sponsor** — ``POST /v1/gas/sponsor`` of one fixed UserOperation (the wallet's first,
  initCode filled from chaingate's records): each request checks the policy, prices the
  worst case, signs the paymaster hash (secp256k1) and reserves a row in the store (SQLite,
  WAL, in the bench's temporary directory) in one transaction;
* **cached GET** — ``GET /v1/gas/ethereum-devnet/prices`` (answered from memory);

req/s, p50, p90, p99, chaingate's CPU per request (event loop thread and other threads, from
/proc) and the non-2xx count (must be 0), then the ratios sponsor/GET.

Writes a markdown report to bench/results/<UTC time>-sponsorship.md and prints it.  Exit
status: 0 done; 1 some run had errors; 2 a server failed or answered wrongly; 3 wrk is
missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

import chaingate  # noqa: E402
from benchkit import procs, report, runner, threads, tools, wallets  # noqa: E402
from benchkit.wrkget import WrkGet  # noqa: E402
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate.aa.userop import Version  # noqa: E402
from chaingate.config.manifest import Manifest, dumps  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402
from chaingate.devnet.keeper import refresh_price_feeds  # noqa: E402
from chaingate.evm.keys import PrivateKey, load_or_create_key  # noqa: E402

LEVELS = (50,)
SMOKE_LEVELS = (1, 10)
CHAIN = "ethereum-devnet"  # the {chain} spelling of ethereum/devnet in REST paths
VERSION: Version = "0.7"  # the EntryPoint of the bench wallet (the API's default)
FOLLOWER_POLL = 0.1
WRK_TIMEOUT_S = 10
POLICY_RULES = {"max_gas_usd": "1000"}  # a USD rule: every request prices its worst case


@dataclass(frozen=True)
class Options:
    duration: int
    warmup: int
    connections: tuple[int, ...]
    access_log: bool
    out: Path
    smoke: bool


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument(
        "--connections",
        type=tools.connection_levels,
        default=None,
        help="concurrency levels, comma-separated; default 50 (--smoke: 1,10)",
    )
    parser.add_argument("--access-log", choices=("on", "off"), default="on")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC>-sponsorship.md")
    parser.add_argument("--smoke", action="store_true", help="1 s runs at 1 and 10 connections")
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
        access_log=args.access_log == "on",
        out=args.out or BENCH_DIR / "results" / f"{stamp}-sponsorship.md",
        smoke=args.smoke,
    )


def say(text: str) -> None:
    print(text, flush=True)


def _quiet(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- chaingate ----------------------------------------------------------------------------


def configure(server: procs.ChaingateServer, manifest_path: Path, key_file: Path) -> None:
    """The devnet network of the generated config gets its manifest and the follower (from
    the head), not the indexer; the paymaster signs with the key in ``key_file``.

    The key goes in a file because ``CHAINGATE_PAYMASTER__KEY`` is not read by chaingate's
    config (``paymaster`` is missing from ``ENV_SECTIONS``; and a bare 0x-hex value would be
    coerced to a TOML integer), and the bench's child environment drops such variables anyway.
    """
    text = server.config_path.read_text()
    anchor = "testnet = true\n"
    if text.count(anchor) != 1:
        raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
    network = f'{anchor}manifest = "{manifest_path}"\nfinality_depth = 2\nblock_time = 1.0\n'
    extra = f"""
[paymaster]
key_file = "{key_file}"

[chains.ethereum.devnet.follower]
poll_interval = {FOLLOWER_POLL}

[chains.ethereum.devnet.indexer]
enabled = false
"""
    text = text.replace("# generated by bench/run.py", "# generated by bench/sponsorship.py")
    server.config_path.write_text(text.replace(anchor, network) + extra)


class WrongAnswer(Exception):
    """chaingate answered a check wrongly (or not in time)."""


def wait_prices(base: str, headers: dict[str, str], timeout: float) -> None:
    """Until the gas oracle has its first estimate (it is computed on the follower's block)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        status, body = wallets.request_json("GET", prices_url(base), headers)
        if status == 200 and isinstance(body, dict):
            return
        last = (status, body)
        time.sleep(0.2)
    raise WrongAnswer(f"no gas price estimate after {timeout:.0f}s: {last!s:.300}")


def prices_url(base: str) -> str:
    return f"{base}/v1/gas/{CHAIN}/prices"


@dataclass(frozen=True)
class Fixture:
    wallet: str
    policy_id: str
    operation: dict[str, str]
    body: bytes  # the sponsor request, as wrk sends it
    sponsored_gas_usd: str


def prepare(
    server: procs.ChaingateServer, manifest: Manifest, signer: PrivateKey, chain_id: int
) -> Fixture:
    """One wallet, one policy, one checked sponsorship."""
    base, headers = server.base, server.headers
    owner = manifest.accounts[1]
    status, created = wallets.request_json(
        "POST", f"{base}/v1/wallets/create", headers, {"owner": owner, "chain": CHAIN}
    )
    if status not in (200, 201) or not isinstance(created, dict) or "address" not in created:
        raise WrongAnswer(f"create wallet: HTTP {status}: {created!s:.300}")
    if created.get("entry_point_version") not in (None, VERSION):
        raise WrongAnswer(f"the wallet is not EntryPoint v{VERSION}'s: {created!s:.300}")
    wallet = str(created["address"])
    status, policy = wallets.request_json(
        "POST",
        f"{base}/v1/gas/policies",
        headers,
        {"name": "bench", "chain": CHAIN, "rules": POLICY_RULES},
    )
    if status != 201 or not isinstance(policy, dict) or "id" not in policy:
        raise WrongAnswer(f"create policy: HTTP {status}: {policy!s:.300}")
    policy_id = str(policy["id"])
    op = wallets.user_operation(wallet, wallets.execute_call(manifest.accounts[2]))
    request = {"chain": CHAIN, "policy_id": policy_id, "user_operation": op}
    status, answer = wallets.request_json("POST", f"{base}/v1/gas/sponsor", headers, request)
    if status != 200 or not isinstance(answer, dict) or not answer.get("paymasterData"):
        raise WrongAnswer(f"sponsor: HTTP {status}: {answer!s:.300}")
    check_sponsorship(op, answer, manifest, signer, chain_id)
    return Fixture(
        wallet=wallet,
        policy_id=policy_id,
        operation=op,
        body=_json_bytes(request),
        sponsored_gas_usd=str(answer["sponsored_gas_usd"]),
    )


def check_sponsorship(
    op: dict[str, str],
    answer: dict[str, Any],
    manifest: Manifest,
    signer: PrivateKey,
    chain_id: int,
) -> None:
    paymaster = manifest.address("verifying_paymaster_v07")
    problems = []
    if answer.get("paymaster") != paymaster:
        problems.append(f"paymaster {answer.get('paymaster')}, not the devnet's {paymaster}")
    try:
        if float(answer.get("sponsored_gas_usd") or 0) <= 0:
            problems.append(f"no USD cost ({answer.get('sponsored_gas_usd')!r})")
    except ValueError:
        problems.append(f"a USD cost that is no number: {answer.get('sponsored_gas_usd')!r}")
    if not answer.get("factory"):
        problems.append("no factory filled in for the undeployed wallet")
    try:
        recovered = wallets.paymaster_signer_of(op, answer, chain_id=chain_id, version=VERSION)
    except (ValueError, KeyError) as exc:
        problems.append(f"paymaster data unreadable: {exc}")
    else:
        if recovered != signer.address:
            problems.append(f"paymaster signature by {recovered}, not {signer.address}")
    if problems:
        raise WrongAnswer("sponsorship: " + "; ".join(problems) + f": {answer!s:.300}")


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def store_rows(db_path: Path) -> int | None:
    """Sponsorship rows in the store (read-only, beside the running server)."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
        ) as conn:
            row = conn.execute("SELECT count(*) FROM sponsorships").fetchone()
    except sqlite3.Error:
        return None
    return int(row[0])


# --- measurements --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    kind: str  # sponsor | get
    label: str
    connections: int
    result: WrkResult
    main_cpu_us: float | None  # chaingate's event-loop (main) thread, CPU per request
    others_cpu_us: float | None  # its other threads (SQL, log writer), CPU per request
    upstream_requests: int  # chaingate -> anvil during the run (head polling included)
    busy_after_s: float  # chaingate still busy after wrk stopped (abandoned requests)
    rows_before: int | None = None  # sponsorship rows in the store before the measured run
    rows_added: int | None = None  # ... and reserved during it (and its wind-down)
    warmup_errors: int = 0

    @property
    def errors(self) -> int:
        return self.result.errors + self.warmup_errors

    @property
    def cpu_us(self) -> float | None:
        if self.main_cpu_us is None or self.others_cpu_us is None:
            return None
        return self.main_cpu_us + self.others_cpu_us


Load = Callable[[int], WrkResult]  # seconds -> result


class Bench:
    """Each run: a warm-up, chaingate left to finish what the warm-up abandoned, then the
    measured run with chaingate's CPU (per thread) and upstream requests around it, then the
    time chaingate stays busy after wrk stopped."""

    def __init__(
        self,
        opts: Options,
        wrk_binary: str,
        workdir: Path,
        server: procs.ChaingateServer,
        db_path: Path,
    ) -> None:
        self.opts = opts
        self.server = server
        self.db_path = db_path
        self.pid = server.process.pid or 0
        headers = tuple(server.headers.items())
        self.get = WrkGet(wrk_binary, workdir, threads=1, timeout_s=WRK_TIMEOUT_S, headers=headers)
        self.post = Wrk(wrk_binary, workdir, threads=1, timeout_s=WRK_TIMEOUT_S, headers=headers)

    def _upstream(self) -> int:
        return report.total(self.server.metrics(), "chaingate_upstream_requests_total")

    def _run(self, kind: str, label: str, connections: int, load: Load) -> Run:
        warmup = load(self.opts.warmup)
        threads.settle(self.pid)
        rows = store_rows(self.db_path) if kind == "sponsor" else None
        upstream, cpu = self._upstream(), threads.split_cpu(self.pid)
        result = load(self.opts.duration)
        used = threads.split_cpu(self.pid) - cpu
        upstream = self._upstream() - upstream
        busy = threads.settle(self.pid)
        after = store_rows(self.db_path) if kind == "sponsor" else None
        run = Run(
            kind,
            label,
            connections,
            result,
            _per_request(used.main, result),
            _per_request(used.others, result),
            upstream,
            busy,
            rows,
            None if rows is None or after is None else after - rows,
            warmup.errors,
        )
        _progress(run)
        return run

    def sponsor_run(self, body: bytes, connections: int) -> Run:
        wrk = replace(self.post, connections=connections)
        url = f"{self.server.base}/v1/gas/sponsor"
        return self._run("sponsor", "sponsor", connections, lambda s: wrk.run(url, body, s))

    def get_run(self, url: str, connections: int) -> Run:
        wrk = replace(self.get, connections=connections)
        return self._run("get", "cached GET", connections, lambda s: wrk.run(url, s).result)


def _per_request(seconds: float, result: WrkResult) -> float | None:
    return seconds / result.requests * 1e6 if result.requests else None


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _progress(run: Run) -> None:
    r = run.result
    flag = f"  {report.FLAG} {run.errors} errors" if run.errors else ""
    say(
        f"[{run.label} c={run.connections}] {r.rps:8.0f} req/s  p50 {r.p50_ms:.2f} ms  "
        f"p99 {r.p99_ms:.2f} ms  CPU {_num(run.main_cpu_us)}+{_num(run.others_cpu_us)} "
        f"µs/req  busy {run.busy_after_s:.1f} s after{flag}"
    )


# --- report ---------------------------------------------------------------------------------


@dataclass
class Results:
    header: dict[str, str]
    runs: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[Run]:
        return [run for run in self.runs if run.errors]

    def find(self, kind: str, connections: int) -> Run | None:
        return next((r for r in self.runs if r.kind == kind and r.connections == connections), None)

    def levels(self) -> list[int]:
        return sorted({run.connections for run in self.runs})


def _errors_cell(run: Run) -> str:
    if not run.errors:
        return "0"
    text = f"{report.FLAG} **{run.result.errors}** ({run.result.error_detail()})"
    return text + (f" +{run.warmup_errors} in warm-up" if run.warmup_errors else "")


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


def render(res: Results) -> str:
    lines = [f"# chaingate gas sponsorship benchmark, {res.header.get('date', '')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.header.items() if k != "date"]
    lines += [
        "",
        "## Sponsorship beside a cached GET (`POST /v1/gas/sponsor`, "
        f"`GET /v1/gas/{CHAIN}/prices`)",
        "",
        "| request | connections | req/s | p50 ms | p90 ms | p99 ms | max ms "
        "| event loop CPU µs/req | other threads CPU µs/req | CPU µs/req "
        "| busy after stop s | upstream requests | store rows before | rows added | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in res.runs:
        r = run.result
        lines.append(
            f"| {run.label} | {run.connections} | {r.rps:.0f} | {r.p50_ms:.2f} "
            f"| {r.p90_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.2f} "
            f"| {_num(run.main_cpu_us)} | {_num(run.others_cpu_us)} | {_num(run.cpu_us)} "
            f"| {run.busy_after_s:.1f} | {run.upstream_requests} "
            f"| {_count(run.rows_before)} | {_count(run.rows_added)} "
            f"| {_errors_cell(run)} |"
        )
    lines += [
        "",
        "CPU per request from /proc: chaingate's main thread (the event loop, which every "
        "request needs) and its other threads (the SQLite store's transactions, the log "
        'writer).  Errors: non-2xx answers, 2xx answers carrying an `"error"` (POST) and '
        "socket errors.  Rows added: sponsorships reserved in the store during the measured "
        "run, requests abandoned at its end included.  Busy after stop: how long chaingate "
        "kept computing after wrk closed its connections; waited out before the next "
        "measurement.",
    ]
    lines += [
        "",
        "## Ratios sponsor/GET",
        "",
        "| connections | req/s sponsor/GET | CPU per request sponsor/GET "
        "| event loop CPU per request sponsor/GET |",
        "|---:|---:|---:|---:|",
    ]
    for level in res.levels():
        sponsor, get = res.find("sponsor", level), res.find("get", level)
        if sponsor is None or get is None:
            continue
        rps = _ratio(sponsor.result.rps, get.result.rps)
        if sponsor.errors or get.errors:
            rps = f"{report.FLAG} {rps} (errors)"
        lines.append(
            f"| {level} | {rps} | {_ratio(sponsor.cpu_us, get.cpu_us)} "
            f"| {_ratio(sponsor.main_cpu_us, get.main_cpu_us)} |"
        )
    top = max(res.levels(), default=None)
    sponsor = None if top is None else res.find("sponsor", top)
    if sponsor is not None:
        r = sponsor.result
        lines += [
            "",
            f"**sponsor at {top} connections: {r.rps:.0f} req/s, p99 {r.p99_ms:.2f} ms, "
            f"{_num(sponsor.cpu_us)} µs of chaingate CPU per request**.",
            "",
            f"Upstream requests per sponsorship: {_ratio(sponsor.upstream_requests, r.requests)} "
            "(chaingate to anvil during the run, head polling included: the sponsor path "
            "reads the undeployed sender's code from the node on every request).",
            "",
            "Both loads hit the same process under the same key gate, one right after the "
            "other: the ratio is what a sponsorship costs beyond serving a request at all "
            "(the body's decoding and checks, the policy read, the USD price, the paymaster "
            "hash and its secp256k1 signature, the reservation's store transaction).",
        ]
    if res.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in res.notes)]
    return "\n".join(lines) + "\n"


# --- the run ----------------------------------------------------------------------------------


def bench(
    opts: Options, wrk_binary: str, stack: contextlib.ExitStack, busy: float | None
) -> Results:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-sponsor-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    signer = load_or_create_key(workdir / "paymaster.key")  # a fresh key, mode 0600
    anvil = AnvilProcess()
    stack.callback(anvil.stop)
    anvil.start()
    anvil_version = tools.anvil_version(anvil_binary(install=False))
    say(f"anvil {anvil_version} on :{anvil.port}")
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=signer.address, announce=say)
    refresh_price_feeds(anvil.url, manifest)  # prices fresh by the feeds' own clock
    manifest_path = workdir / "devnet-manifest.json"
    manifest_path.write_bytes(dumps(manifest))

    db_path = workdir / "chaingate.db"
    auth = procs.Auth.fresh(db_path)
    server = procs.ChaingateServer(
        workdir, "chaingate", anvil.url, access_log=opts.access_log, coalesce=True, auth=auth
    )
    configure(server, manifest_path, workdir / "paymaster.key")
    server.create_key()
    stack.callback(server.stop)
    server.start(timeout=60.0)
    impl = server.impl()
    say(f"chaingate on :{server.port} (impl {impl}), paymaster signer {signer.address}")
    wait_prices(server.base, server.headers, 60.0)
    fixture = prepare(server, manifest, signer, anvil.chain_id)
    say(
        f"wallet {fixture.wallet}, policy {fixture.policy_id}: one sponsorship checked "
        f"(worst case ${fixture.sponsored_gas_usd}, signature recovered to the signer)"
    )

    res = Results(header(opts, impl, busy, anvil_version, tools.wrk_version(wrk_binary)))
    res.header["requests"] = (
        f"sponsor: one fixed UserOperation of wallet {fixture.wallet} (SimpleAccount, "
        f"EntryPoint v{VERSION}, undeployed: initCode from chaingate's records) under a "
        f"policy whose one rule is `max_gas_usd = {POLICY_RULES['max_gas_usd']}` (never "
        "refuses; prices the worst case from the ETH/USD feed); "
        f"cached GET: `/v1/gas/{CHAIN}/prices`"
    )
    runner = Bench(opts, wrk_binary, workdir, server, db_path)
    prices = prices_url(server.base)
    for connections in opts.connections:
        res.runs.append(runner.sponsor_run(fixture.body, connections))
        res.runs.append(runner.get_run(prices, connections))
    return res


def header(
    opts: Options, impl: str, busy: float | None, anvil_version: str, wrk_version: str
) -> dict[str, str]:
    pure = os.environ.get("CHAINGATE_PURE")
    runs = f"{opts.duration} s per measurement after a {opts.warmup} s warm-up"
    levels = ", ".join(str(c) for c in opts.connections)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "chaingate": (
            f"{chaingate.__version__}, impl **{impl}** (CHAINGATE_PURE="
            f"{pure if pure is not None else 'unset'}), one `chaingate serve` process, "
            "follower on ethereum/devnet (indexer off), paymaster key from a key file"
        ),
        "store": "SQLite (WAL) file in the bench's temporary directory, fresh for the run; "
        "each sponsorship reserves one row in it",
        "access_log": f"**{str(opts.access_log).lower()}**",
        "auth": "**on**: one enterprise (unlimited) test key in X-API-Key on every request",
        "how measured": (
            f"wrk -t1 at {levels} connection(s), keep-alive, {runs}, requests time out after "
            f"{WRK_TIMEOUT_S} s; sponsor and GET loads one after the other at each level, "
            f"on {os.cpu_count()} cores shared by wrk, chaingate and anvil"
            + (" (--smoke)" if opts.smoke else "")
        ),
        "versions": f"anvil {anvil_version}, wrk {wrk_version}, Python {platform.python_version()}",
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
        (procs.ServerFailed, WrongAnswer, WrkFailed, RuntimeError, OSError),
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
