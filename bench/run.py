"""chaingate benchmark: the same wrk load against chaingate, nginx and the node itself.

    python bench/run.py [--duration 10] [--connections 32] [--smoke] [--out PATH]
                        [--scenarios block,chainid,...] [--access-log on|off] [--auth on|off]
                        [--baseline OTHER_CHECKOUT/src] [--allowlists on|off]
                        [--accept-encoding VALUE] [--workers N[,M...]]

Starts on loopback free ports: anvil (the node), one ``chaingate serve`` process in front of
it (API keys on by default: one unlimited key, sent by every request to every target), and
nginx with one worker in front of it too; then drives each scenario's request with
wrk against every target and prints (and writes) a markdown report.  With ``--baseline``,
a second chaingate built from another checkout answers every scenario too, right after this
one: before/after figures from one run.  The ``distinct-...`` scenarios send requests no two
alike (real traffic) on a bootstrapped devnet; ``paced`` and each ``paced-distinct-...``
send one scenario's requests at half of chaingate's peak for them, to chaingate and the node,
for the p99 chaingate adds; ``--workers`` runs chaingate as ``chaingate serve --workers N``.
See bench/README.md.

Exit status: 0 all good; 1 some run had errors (flagged in the report); 2 a server failed or
a target answered wrongly; 3 nginx or wrk is missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

import chaingate  # noqa: E402
from benchkit import distinct, evm, procs, report, scenarios, solana, tools  # noqa: E402
from benchkit.report import Paced, Report, Row, Traffic  # noqa: E402
from benchkit.scenarios import (  # noqa: E402
    BASELINE,
    CHAINGATE,
    DIRECT,
    NGINX,
    PACED_FRACTION,
    PACED_TOLERANCE,
    Scenario,
)
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary, rpc_call  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

DISTINCT = tuple(f"distinct-{kind}" for kind in scenarios.DISTINCT_NOTES)
PACED_DISTINCT = tuple(f"paced-{key}" for key in DISTINCT)  # after theirs: peaks measured first
SCENARIO_ORDER = (
    "block",
    "block-nocoalesce",
    "chainid",
    "batch",
    "call",
    "paced",
    *DISTINCT,
    *PACED_DISTINCT,
    *solana.SCENARIO_KEYS,
)
TRANSFERS, SMOKE_TRANSFERS = 2_000, 200  # receipts the distinct scenarios read
# The devnet's paymaster signer: no key is needed, and a fixed one reuses the cached state.
PAYMASTER_SIGNER = "0x" + "11" * 20
PG_URL = os.environ.get("CHAINGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CHAINGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CALIBRATION_TRIALS = 3
CALIBRATION_TOLERANCE = 0.05  # calibration stops once a trial is this close to the target


@dataclass(frozen=True)
class Options:
    duration: int
    warmup: int
    connections: int
    access_log: bool
    auth: bool
    out: Path
    scenarios: tuple[str, ...]
    smoke: bool
    baseline: Path | None = None
    allowlists: bool = False
    accept_encoding: str | None = None
    workers: tuple[int, ...] = (1,)  # the main chaingate's, then one more chaingate each
    pg_url: str = PG_URL
    redis_url: str = REDIS_URL
    rounds: int = 1  # each non-paced scenario's targets measured this many times: the median

    @property
    def shared(self) -> bool:
        """Every chaingate of the run on PostgreSQL and Redis (some has several workers)."""
        return max(self.workers) > 1


# --allowlists on: the client IP ranges of the key's list (wrk and the check come from loopback).
ALLOWED_IPS = ("127.0.0.0/8", "::1/128")
PROBE_METHOD = "eth_chainId"  # every server's readiness probe calls it through the key gate
OFF_LIST_METHOD = "web3_clientVersion"  # no scenario calls it: the method list must refuse it


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--smoke", action="store_true", help="1 s runs, for CI")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC timestamp>.md")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIO_ORDER),
        help=f"comma-separated subset of: {', '.join(SCENARIO_ORDER)}",
    )
    parser.add_argument(
        "--access-log",
        choices=("on", "off"),
        default="on",
        help="chaingate's observability.access_log (default on, the production default)",
    )
    parser.add_argument(
        "--auth",
        choices=("on", "off"),
        default="on",
        help="chaingate's auth.enabled (default on, the production default): on, every request "
        "to every target carries X-API-Key with one enterprise-plan (unlimited) key",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="the src directory of another chaingate checkout (its extensions built): it "
        "answers every scenario too, as target 'baseline', for before/after in one run",
    )
    parser.add_argument(
        "--allowlists",
        choices=("on", "off"),
        default="off",
        help="on (needs --auth on): the bench's key gets IP, method and contract allowlists "
        "(chaingate keys update) that admit exactly the chosen scenarios' requests, so every "
        "list is checked on every request; also on the baseline if its CLI has keys update",
    )
    parser.add_argument(
        "--accept-encoding",
        metavar="VALUE",
        help="send 'Accept-Encoding: VALUE' with every request to every target (wrk and the "
        "check), e.g. 'gzip, deflate, br, zstd'; default: no such header",
    )
    parser.add_argument(
        "--workers",
        default="1",
        metavar="N[,M...]",
        help="chaingate serve --workers N for the target 'chaingate'; each further count one "
        "more chaingate (target 'chaingate xM') measured right after it.  Above 1, every "
        "chaingate of the run has its store in a fresh PostgreSQL schema (--pg-url) and, keys "
        "on, its limits in Redis (--redis-url); default 1",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="measure each scenario's targets N times, chaingate and the other builds "
        "(--baseline, --workers) in alternating order (ours first, then theirs first...), and "
        "report each target's median run by req/s: for before/after ratios on a noisy machine; "
        "default 1",
    )
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL for --workers above 1")
    parser.add_argument("--redis-url", default=REDIS_URL, help="Redis for --workers above 1")
    args = parser.parse_args(argv)
    try:
        workers = tuple(int(n) for n in args.workers.split(","))
    except ValueError:
        parser.error(f"--workers {args.workers}: give counts, e.g. 2 or 1,2")
    if not workers or min(workers) < 1 or len(set(workers)) != len(workers):
        parser.error(f"--workers {args.workers}: distinct counts of at least 1")
    if args.baseline is not None and workers != (1,):
        parser.error("--baseline and --workers: one at a time")
    if args.allowlists == "on" and args.auth == "off":
        parser.error("--allowlists on needs --auth on: allowlists belong to the API key")
    accept = args.accept_encoding
    if accept is not None and (not accept.strip() or any(c in accept for c in "\r\n\0")):
        parser.error("--accept-encoding: give a non-empty header value on one line")
    if args.baseline is not None and not (args.baseline / "chaingate" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline}: no chaingate package there")
    chosen = tuple(name.strip() for name in args.scenarios.split(",") if name.strip())
    unknown = [name for name in chosen if name not in SCENARIO_ORDER]
    if unknown or not chosen:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIO_ORDER)}")
    if args.duration < 1 or args.connections < 1 or args.rounds < 1:
        parser.error("--duration, --connections and --rounds must be at least 1")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        duration=1 if args.smoke else args.duration,
        warmup=1 if args.smoke else 2,
        connections=args.connections,
        access_log=args.access_log == "on",
        auth=args.auth == "on",
        out=args.out or BENCH_DIR / "results" / f"{stamp}.md",
        scenarios=tuple(name for name in SCENARIO_ORDER if name in chosen),
        smoke=args.smoke,
        baseline=args.baseline.resolve() if args.baseline is not None else None,
        allowlists=args.allowlists == "on",
        accept_encoding=accept.strip() if accept is not None else None,
        workers=workers,
        pg_url=args.pg_url,
        redis_url=args.redis_url,
        rounds=1 if args.smoke else args.rounds,
    )


def say(text: str) -> None:
    print(text, flush=True)


def client_headers(opts: Options, server: procs.ChaingateServer) -> dict[str, str]:
    """What every request of the load and of the check carries: the server's API key (auth
    on) and, with --accept-encoding, that header."""
    extra = {"Accept-Encoding": opts.accept_encoding} if opts.accept_encoding else {}
    return {**server.headers, **extra}


def check_refused(url: str, headers: dict[str, str]) -> str:
    """Proof that the lists are in force: a method off the list is refused with 403."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": OFF_LIST_METHOD, "params": []})
    request = urllib.request.Request(
        url, body.encode(), {"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raise RuntimeError(
                f"--allowlists on: {OFF_LIST_METHOD} (off the list) got HTTP {response.status}"
            )
    except urllib.error.HTTPError as exc:
        if exc.code != 403:
            raise RuntimeError(
                f"--allowlists on: {OFF_LIST_METHOD} (off the list) got HTTP {exc.code}"
            ) from None
        return f"{OFF_LIST_METHOD} (off the list) refused with 403"


def allowlists_for(chosen: tuple[str, ...], catalogue: dict[str, Scenario]) -> procs.Allowlists:
    """Lists that admit exactly the chosen scenarios' requests (and the readiness probe)."""
    picked = [catalogue[key] for key in chosen if key in catalogue]
    methods = {PROBE_METHOD}.union(*(scenarios.methods(s) for s in picked))
    if any(key in solana.SCENARIO_KEYS for key in chosen):
        methods |= solana.METHODS
    targets: set[str] = set().union(*(scenarios.call_targets(s) for s in picked))
    return procs.Allowlists(ALLOWED_IPS, tuple(sorted(methods)), tuple(sorted(targets)))


class Bench:
    """Runs the measurements; every result lands in ``self.report``."""

    def __init__(
        self,
        opts: Options,
        wrk: Wrk,
        urls: dict[str, str],
        main: procs.ChaingateServer,
        rep: Report,
        pids: dict[str, int],
        auth: procs.Auth | None,
        shared: procs.Shared | None = None,
    ) -> None:
        self.opts = opts
        self.wrk = wrk
        self.urls = urls
        self.main = main
        self.auth = auth
        # The API key (auth on) and Accept-Encoding (if given) on every request to every target
        self.headers = client_headers(opts, main)
        self.report = rep
        self.pids = pids  # target -> pid of the process answering it
        self.baseline: tuple[procs.ChaingateServer, Wrk] | None = None
        self.shared = shared  # --workers above 1: every chaingate's store and limits
        self.others: dict[str, procs.ChaingateServer] = {}  # --workers M: target -> server

    def _cpu(self, target: str, pid: int | None = None) -> float:
        root = pid if pid is not None else self.pids.get(target)
        return tools.process_cpu_seconds(tools.process_tree(root)) if root else 0.0

    @staticmethod
    def _per_request(before: float, after: float, result: WrkResult) -> float | None:
        return (after - before) / result.requests * 1e6 if result.requests and after else None

    def run(
        self,
        scenario: Scenario,
        target: str,
        url: str,
        gateway: procs.ChaingateServer | None,
        wrk: Wrk | None = None,
    ) -> Row:
        pid = gateway.process.pid if gateway is not None else None
        wrk = wrk or self.wrk
        warm = wrk.run(url, scenario.body, self.opts.warmup, requests=scenario.requests)
        # Each worker of several has its own /metrics, and a scrape reaches any one of them:
        # their deltas would mix workers, so only a one-process chaingate's are shown.
        gateway = gateway if gateway is None or gateway.workers == 1 else None
        before = gateway.metrics() if gateway else ""
        cpu_before = self._cpu(target, pid)
        result = wrk.run(url, scenario.body, self.opts.duration, requests=scenario.requests)
        cpu = self._per_request(cpu_before, self._cpu(target, pid), result)
        if gateway is not None:
            self._traffic(f"{scenario.label} / {target}", before, gateway.metrics())
        row = Row(scenario, target, result, warmup_errors=warm.errors, cpu_us=cpu)
        self.report.rows.append(row)
        _progress(scenario.key, target, result, row.errors)
        return row

    def _traffic(self, label: str, before: str, after: str) -> None:
        def delta(name: str, label_filter: str = "") -> int:
            return report.total(after, name, label_filter) - report.total(
                before, name, label_filter
            )

        self.report.traffic.append(
            Traffic(
                label=label,
                client_requests=delta("chaingate_http_requests_total", 'route="rpc"'),
                rpc_calls=delta("chaingate_rpc_calls_total"),
                upstream_requests=delta("chaingate_upstream_requests_total"),
                coalesced=delta("chaingate_rpc_coalesced_total"),
                cache_hits=delta("chaingate_rpc_cache_hits_total"),
            )
        )

    @staticmethod
    def _check(
        scenario: Scenario, urls: dict[str, str], expected: object, headers: dict[str, str]
    ) -> object:
        if scenario.requests is not None:  # distinct-...: a sample of its requests
            return scenarios.check_distinct(scenario, urls, headers)
        return scenarios.check(scenario, urls, expected, headers)

    def scenario(self, scenario: Scenario, expected: object = None) -> None:
        answer = self._check(scenario, self.urls, expected, self.headers)
        say(f"[{scenario.key}] every target answers alike: {str(answer)[:80]}")
        for other in self.others.values():
            urls = {**self.urls, CHAINGATE: other.rpc_url}
            self._check(scenario, urls, expected, self.headers)
        if self.baseline is not None:
            urls = {**self.urls, CHAINGATE: self.baseline[0].rpc_url}
            self._check(scenario, urls, expected, client_headers(self.opts, self.baseline[0]))
        first = len(self.report.rows)
        for turn in range(self.opts.rounds):
            for target in scenario.targets:
                if target == CHAINGATE:
                    self._builds(scenario, ours_first=turn % 2 == 0)
                else:
                    self.run(scenario, target, self.urls[target], None)
        if self.opts.rounds > 1:
            self.report.rows[first:] = _medians(self.report.rows[first:])

    def _builds(self, scenario: Scenario, *, ours_first: bool) -> None:
        """chaingate and the other builds (--workers, --baseline), one right after the other
        under the same conditions; ``ours_first`` False: theirs first (--rounds alternates)."""
        runs: list[Callable[[], Row]] = [
            lambda: self.run(scenario, CHAINGATE, self.urls[CHAINGATE], self.main)
        ]
        for name, other in self.others.items():
            runs.append(functools.partial(self.run, scenario, name, other.rpc_url, other))
        if self.baseline is not None:
            server, wrk = self.baseline
            runs.append(
                functools.partial(self.run, scenario, BASELINE, server.rpc_url, server, wrk)
            )
        for run in runs if ours_first else runs[1:] + runs[:1]:
            run()

    def no_coalesce(self, scenario: Scenario, workdir: Path, upstream: str) -> None:
        server = procs.ChaingateServer(
            workdir,
            "chaingate-nocoalesce",
            upstream,
            access_log=self.opts.access_log,
            coalesce=False,
            auth=self.auth,  # the same pepper and store as the main server: the same key
            api_key=self.main.api_key,
            shared=self.shared,
        )
        try:
            server.start()
            urls = {**self.urls, CHAINGATE: server.rpc_url}
            scenarios.check(scenario, urls, None, self.headers)
            say(f"[{scenario.key}] second chaingate on :{server.port} with coalesce = false")
            self.run(scenario, CHAINGATE, server.rpc_url, server)
            self.report.metrics["chaingate (coalesce = false)"] = report.recorded_metrics(
                server.metrics()
            )
        finally:
            server.stop()

    def solana(self, found: dict[str, str], workdir: Path, stack: contextlib.ExitStack) -> None:
        """The Solana scenarios chosen: the devnet's Solana node, a chaingate serving
        ``solana/devnet`` in front of it (the same key) and an nginx, measured like the rest."""
        chosen = [key for key in self.opts.scenarios if key in solana.SCENARIO_KEYS]
        if not chosen:
            return
        node = solana.SolanaNode(workdir)
        stack.callback(node.stop)
        node.start()
        account, slot = solana.fund(node.url, say)
        catalogue = solana.build(account, slot)
        server = procs.ChaingateServer(
            workdir,
            "chaingate-solana",
            node.url,
            access_log=self.opts.access_log,
            coalesce=True,
            auth=self.auth,  # the same pepper and store as the main server: the same key
            api_key=self.main.api_key,
            shared=self.shared,
            family=procs.SOLANA,
        )
        stack.callback(server.stop)
        server.start()
        own = workdir / "solana-nginx"  # nginx's pid file and logs apart from the first one's
        own.mkdir()
        nginx = procs.NginxServer(found["nginx"], own, node.port, "getHealth")
        stack.callback(nginx.stop)
        nginx.start()
        version = node.version()
        say(
            f"[solana] node {version} on :{node.port}, chaingate (solana/devnet) on "
            f":{server.port}, nginx on :{nginx.port}"
        )
        self.report.header["solana"] = (
            f"the devnet's Solana node (chaingate.devnet.solana: LiteSVM, solana-core {version} "
            "RPC), a process of its own, a slot every 400 ms; chaingate `serve` with one network "
            "`solana/devnet` in front of it (the same key); nginx as above in front of it; "
            "`direct` = wrk straight to the node"
        )
        urls = {CHAINGATE: server.rpc_url, NGINX: nginx.url, DIRECT: node.url}
        pids = {CHAINGATE: server.process.pid, NGINX: nginx.process.pid, DIRECT: node.process.pid}
        runner = SolanaBench(
            self.opts,
            self.wrk,
            urls,
            server,
            self.report,
            {target: pid for target, pid in pids.items() if pid is not None},
            self.auth,
            self.shared,
        )
        for key in chosen:
            runner.scenario(catalogue[key])
        self.report.metrics["chaingate (solana/devnet)"] = report.recorded_metrics(server.metrics())

    def paced(self, scenario: Scenario) -> None:
        """``scenario``'s requests (those of ``scenario.paces``: eth_blockNumber, a distinct
        load) at PACED_FRACTION of chaingate's peak for them, against each of its targets."""
        of = scenario.paces
        if of is None:
            raise ValueError(f"{scenario.key} is not a paced scenario")
        answer = self._check(scenario, self.urls, None, self.headers)
        say(f"[{scenario.key}] every target answers alike: {str(answer)[:80]}")
        peak = self.report.find(of.key, CHAINGATE)
        if peak is None:  # its own scenario was not selected: measure chaingate's peak now
            prefix = scenario.label.split(" ", 1)[0]
            alone = dataclasses.replace(of, targets=(CHAINGATE,), note=f"peak for {prefix}")
            peak = self.run(alone, CHAINGATE, self.urls[CHAINGATE], self.main)
        rate = peak.result.rps * PACED_FRACTION
        say(
            f"[{scenario.key}] target {rate:.0f} req/s = {PACED_FRACTION:.0%} of "
            f"{peak.result.rps:.0f}"
        )
        rows: dict[str, Row] = {}
        paces: dict[str, float] = {}
        for target in scenario.targets:
            rows[target], paces[target] = self._paced_run(scenario, target, rate)
            if target == CHAINGATE and self.baseline is not None:
                server, wrk = self.baseline  # right after ours, at the same rate
                urls = {**self.urls, CHAINGATE: server.rpc_url}
                self._check(scenario, urls, None, client_headers(self.opts, server))
                rows[BASELINE], paces[BASELINE] = self._paced_run(
                    scenario, BASELINE, rate, server, wrk
                )
        self.report.paced.append(Paced(scenario, peak, rate, rows, paces))

    def _calibrate(self, scenario: Scenario, url: str, rate: float, wrk: Wrk) -> tuple[float, int]:
        """Per-connection mean delay (ms) that yields ``rate``, found on short warm-up runs.

        A connection's cycle is its delay plus the answer's latency and wrk's own overhead;
        each trial measures that overhead and takes it off the delay.  Returns the delay and
        the errors seen while calibrating.
        """
        ideal = wrk.connections / rate * 1000
        pace, errors = ideal, 0
        for _ in range(CALIBRATION_TRIALS):
            trial = wrk.run(
                url, scenario.body, self.opts.warmup, pace_ms=pace, requests=scenario.requests
            )
            errors += trial.errors
            if not trial.rps or abs(trial.rps / rate - 1) <= CALIBRATION_TOLERANCE:
                break
            pace = self._corrected(pace, trial.rps, rate)
        return pace, errors

    def _corrected(self, pace: float, achieved: float, rate: float) -> float:
        overhead = self.wrk.connections / achieved * 1000 - pace
        return max(0.0, self.wrk.connections / rate * 1000 - overhead)

    def _paced_run(
        self,
        scenario: Scenario,
        target: str,
        rate: float,
        server: procs.ChaingateServer | None = None,
        wrk: Wrk | None = None,
    ) -> tuple[Row, float]:
        """Calibrate the delay, then measure; measure again once if the rate was far off.
        ``server`` and ``wrk``: another chaingate's (the baseline), not the target's own."""
        url = server.rpc_url if server is not None else self.urls[target]
        wrk = wrk or self.wrk
        pace, errors = self._calibrate(scenario, url, rate, wrk)
        gateway = server or (self.main if target == CHAINGATE else None)
        pid = server.process.pid if server is not None else None
        for attempt in range(2):
            before = gateway.metrics() if gateway else ""
            cpu_before = self._cpu(target, pid)
            result = wrk.run(
                url, scenario.body, self.opts.duration, pace_ms=pace, requests=scenario.requests
            )
            cpu = self._per_request(cpu_before, self._cpu(target, pid), result)
            off = abs(result.rps / rate - 1) if rate else 0.0
            if attempt or off <= PACED_TOLERANCE or not result.rps:
                break
            say(
                f"[{scenario.key}] {target}: {result.rps:.0f} req/s is {off:.0%} off target; "
                "measuring again"
            )
            errors += result.errors
            pace = self._corrected(pace, result.rps, rate)
        if gateway is not None:
            self._traffic(f"{scenario.label} / {target}", before, gateway.metrics())
        row = Row(scenario, target, result, warmup_errors=errors, cpu_us=cpu)
        self.report.rows.append(row)
        extra = f" (target {rate:.0f}, delay {pace:.2f} ms)"
        _progress(scenario.key, target, result, row.errors, extra)
        return row, pace


def _medians(rows: list[Row]) -> list[Row]:
    """Per target, in the order first measured, its median run by req/s (of an even count,
    the lower of the middle two)."""
    by_target: dict[str, list[Row]] = {}
    for row in rows:
        by_target.setdefault(row.target, []).append(row)
    return [
        sorted(runs, key=lambda row: row.result.rps)[(len(runs) - 1) // 2]
        for runs in by_target.values()
    ]


class SolanaBench(Bench):
    """The Solana scenarios: one chaingate, nginx and the node (no --baseline, no --workers
    variants: those build EVM-only configs); answers checked modulo the moving head."""

    @staticmethod
    def _check(
        scenario: Scenario, urls: dict[str, str], expected: object, headers: dict[str, str]
    ) -> object:
        return solana.check(scenario, urls, expected, headers)


def _progress(key: str, target: str, r: WrkResult, errors: int, extra: str = "") -> None:
    flag = f"  {report.FLAG} {errors} errors" if errors else ""
    say(
        f"[{key}] {target:<9} {r.rps:9.0f} req/s  p50 {r.p50_ms:.3f} ms  "
        f"p99 {r.p99_ms:.3f} ms{extra}{flag}"
    )


def header(
    opts: Options, wrk: Wrk, impl: str, versions: dict[str, str], busy: float | None
) -> dict[str, str]:
    pure = os.environ.get("CHAINGATE_PURE")
    runs = f"{opts.duration} s per measurement after a {opts.warmup} s warm-up per target"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "chaingate": (
            f"{chaingate.__version__}, impl **{impl}** (CHAINGATE_PURE="
            f"{pure if pure is not None else 'unset'}), "
            + (
                "one `chaingate serve` process"
                if not opts.shared
                else "`chaingate serve --workers "
                + "`, `--workers ".join(str(n) for n in opts.workers)
                + "` (one chaingate each); every chaingate's store in a fresh PostgreSQL "
                "schema, its limits (keys on) in Redis"
            )
        ),
        "access_log": f"**{str(opts.access_log).lower()}**"
        + (" (production default)" if opts.access_log else " (turned off with --access-log off)"),
        "auth": (
            f"**{'on' if opts.auth else 'off'}**"
            + (
                " (production default): one `chaingate keys create --plan enterprise --env test` "
                "key, unlimited in config/plans.toml so no limit binds; every request to every "
                "target (chaingate, nginx, direct) carries it in X-API-Key; SQLite store"
                if opts.auth
                else " (turned off with --auth off): no key checked, no header sent"
            )
        ),
        "allowlists": (
            "**on**: the key's IP, method and contract lists set with `chaingate keys update`, "
            "checked on every request (no origin list: wrk sends no Origin)"
            if opts.allowlists
            else "**off** (--allowlists on sets the key's IP, method and contract lists)"
        ),
        "accept_encoding": (
            f"**`{opts.accept_encoding}`** on every request to every target"
            if opts.accept_encoding
            else "**none** (no Accept-Encoding header sent; --accept-encoding VALUE sets one)"
        ),
        "load": f"{wrk.describe()}; {runs}" + (" (--smoke)" if opts.smoke else ""),
        "nginx": f"{versions['nginx']}, 1 worker, upstream keepalive 64, access_log off",
        "node": f"anvil {versions['anvil']}; target `direct` = wrk straight to anvil",
        "versions": f"wrk {versions['wrk']}, Python {platform.python_version()}",
        "caveat": (
            f"wrk, chaingate, nginx and anvil all share this machine's {os.cpu_count()} cores: "
            "every number includes contention with the load generator and the node"
        ),
    }


def bench(
    opts: Options, found: dict[str, str], stack: contextlib.ExitStack, busy: float | None
) -> Report:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    anvil = AnvilProcess()
    stack.callback(anvil.stop)
    anvil.start()
    versions = {
        "anvil": tools.anvil_version(anvil_binary(install=False)),
        "nginx": tools.nginx_version(found["nginx"]),
        "wrk": tools.wrk_version(found["wrk"]),
    }
    say(f"anvil {versions['anvil']} on :{anvil.port}")
    chain = distinct_chain(opts, anvil.url)
    contract = evm.deploy(anvil.url)
    say(f"contract at {contract.address}: eth_call returns {contract.expected}")
    accounts = rpc_call(anvil.url, "eth_accounts")
    if not isinstance(accounts, list):
        raise RuntimeError(f"eth_accounts answered {accounts!r}")

    catalogue = scenarios.build([str(a) for a in accounts], contract)
    if chain is not None:
        catalogue.update(scenarios.build_distinct(chain, workdir))
    lists = allowlists_for(opts.scenarios, catalogue) if opts.allowlists else None
    auth = procs.Auth.fresh(workdir / "chaingate.db") if opts.auth else None
    shared = shared_state(opts, stack) if opts.shared else None
    main = procs.ChaingateServer(
        workdir,
        "chaingate",
        anvil.url,
        access_log=opts.access_log,
        coalesce=True,
        auth=auth,
        workers=opts.workers[0],
        shared=shared,
    )
    if auth is not None:
        key = main.create_key()
        say(f"API key {key[:13]}... ({procs.KEY_PLAN} plan: unlimited) in {auth.db_path.name}")
    if lists is not None:
        if main.set_allowlists(lists) is None:
            raise RuntimeError("--allowlists on: this chaingate's CLI has no `keys update`")
        say(f"allowlists on the key: {lists.describe()}")
    stack.callback(main.stop)
    main.start()
    nginx = procs.NginxServer(found["nginx"], workdir, anvil.port)
    stack.callback(nginx.stop)
    nginx.start()
    impl = main.impl()
    if lists is not None:
        say(f"allowlists in force on chaingate: {check_refused(main.rpc_url, main.headers)}")
    say(
        f"chaingate on :{main.port} (impl {impl}, access_log {str(opts.access_log).lower()}, "
        f"auth {'on' if opts.auth else 'off'}), "
        f"nginx {versions['nginx']} on :{nginx.port}"
    )

    wrk = Wrk(
        found["wrk"],
        workdir,
        threads=1,
        connections=opts.connections,
        headers=tuple(client_headers(opts, main).items()),
    )
    rep = Report(header(opts, wrk, impl, versions, busy))
    if opts.rounds > 1:
        rep.header["rounds"] = (
            f"{opts.rounds}: each scenario's targets measured {opts.rounds} times, chaingate "
            "and the other builds in alternating order; each row is its target's median run "
            "by req/s"
        )
    if lists is not None:
        rep.header["allowlists"] += f": {lists.describe()}"
    say(f"load: {rep.header['load']}")
    urls = {CHAINGATE: main.rpc_url, NGINX: nginx.url, DIRECT: anvil.url}
    pids = {
        target: pid
        for target, pid in (
            (CHAINGATE, main.process.pid),
            (NGINX, nginx.process.pid),
            (DIRECT, anvil.pid),
        )
        if pid is not None
    }
    runner = Bench(opts, wrk, urls, main, rep, pids, auth, shared)
    rep.workers[CHAINGATE] = opts.workers[0]
    if max(opts.workers) > 1:
        rep.notes.append(
            "a chaingate with several workers has no /metrics deltas: each worker counts its "
            "own, and a scrape reaches any one of them"
        )
    for count in opts.workers[1:]:
        name = f"{CHAINGATE} x{count}"
        other = procs.ChaingateServer(
            workdir,
            f"chaingate-w{count}",
            anvil.url,
            access_log=opts.access_log,
            coalesce=True,
            auth=auth,  # the same pepper and store: the same key
            api_key=main.api_key,
            workers=count,
            shared=shared,
        )
        stack.callback(other.stop)
        other.start(timeout=60.0)
        runner.others[name] = other
        rep.workers[name] = count
        say(f"{name}: chaingate serve --workers {count} on :{other.port}")
    if opts.baseline is not None:
        runner.baseline, baseline_lists = start_baseline(
            opts, opts.baseline, workdir, anvil.url, found, stack, lists
        )
        rep.header["baseline"] = f"chaingate from {opts.baseline}" + (
            f"; allowlists: {baseline_lists}" if lists is not None else ""
        )
        if lists is not None:
            say(f"baseline allowlists: {baseline_lists}")
            if "not set" not in baseline_lists:
                server = runner.baseline[0]
                say(f"... in force: {check_refused(server.rpc_url, server.headers)}")
        say(f"baseline chaingate (from {opts.baseline}) on :{runner.baseline[0].port}")
    expected = {"call": contract.expected, "chainid": hex(anvil.chain_id)}
    actions: dict[str, Callable[[Scenario], None]] = {
        "block-nocoalesce": lambda s: runner.no_coalesce(s, workdir, anvil.url),
    }
    for key in opts.scenarios:
        if key in solana.SCENARIO_KEYS:
            continue  # after the EVM ones, with their own node, chaingate and nginx
        scenario = catalogue[key]
        action = actions.get(key)
        if action is not None:
            action(scenario)
        elif scenario.paces is not None:
            runner.paced(scenario)
        else:
            runner.scenario(scenario, expected.get(key))
    rep.metrics["chaingate"] = report.recorded_metrics(main.metrics())
    runner.solana(found, workdir, stack)
    return rep


def distinct_chain(opts: Options, url: str) -> distinct.Chain | None:
    """The devnet the distinct-... scenarios read, when one of them is chosen."""
    if not any(key in DISTINCT or key in PACED_DISTINCT for key in opts.scenarios):
        return None
    manifest = bootstrap_devnet(url, paymaster_signer=PAYMASTER_SIGNER, announce=say)
    return distinct.prepare(url, manifest, SMOKE_TRANSFERS if opts.smoke else TRANSFERS, say)


def shared_state(opts: Options, stack: contextlib.ExitStack) -> procs.Shared:
    """A fresh PostgreSQL schema (dropped at the end) and Redis, for --workers above 1."""
    import psycopg  # only this option needs it

    schema = f"cg_bench_{secrets.token_hex(4)}"
    with psycopg.connect(opts.pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a fresh random name, no user input

    def drop() -> None:
        with psycopg.connect(opts.pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    stack.callback(drop)
    say(f"--workers {','.join(map(str, opts.workers))}: store in PostgreSQL schema {schema}")
    return procs.Shared(f"{opts.pg_url}?options=-c%20search_path%3D{schema}", opts.redis_url)


def start_baseline(
    opts: Options,
    src: Path,
    workdir: Path,
    upstream: str,
    found: dict[str, str],
    stack: contextlib.ExitStack,
    lists: procs.Allowlists | None = None,
) -> tuple[tuple[procs.ChaingateServer, Wrk], str]:
    """The other build, configured like ours; its own key store (its migrations may differ),
    so its own key and its own wrk headers.  With ``lists``, its key gets them too when its
    CLI can set them.  Returns the server and its wrk, and what became of the lists."""
    auth = procs.Auth.fresh(workdir / "baseline.db") if opts.auth else None
    server = procs.ChaingateServer(
        workdir,
        BASELINE,
        upstream,
        access_log=opts.access_log,
        coalesce=True,
        auth=auth,
        pythonpath=src,
    )
    if auth is not None:
        server.create_key()
    applied = "not asked (--allowlists off)"
    if lists is not None:
        said = server.set_allowlists(lists)
        applied = (
            "**not set**: this build's CLI has no `keys update` (it predates allowlists), so "
            "its key has none"
            if said is None
            else "the same lists, set with its own `chaingate keys update`"
        )
    stack.callback(server.stop)
    server.start()
    wrk = Wrk(
        found["wrk"],
        workdir,
        threads=1,
        connections=opts.connections,
        headers=tuple(client_headers(opts, server).items()),
    )
    return (server, wrk), applied


def write(rep: Report, out: Path) -> None:
    text = rep.render()
    say("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    say(f"report written to {out}")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        found = tools.require_tools()
    except tools.MissingTool as exc:
        say(f"error: {exc}")
        return 3
    # Ctrl-C and SIGTERM both unwind through the ExitStack, which stops every server.  SIGINT
    # is set explicitly: a shell without job control starts background jobs with it ignored.
    previous = signal.signal(signal.SIGTERM, tools.raise_interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    busy = tools.background_busy()
    if busy is not None and busy > report.BUSY_WARNING:
        say(f"{report.FLAG} the machine is already {busy:.0%} busy: results will be noisy")
    started = time.monotonic()
    others = tools.CpuAccount()
    others.start()
    try:
        with contextlib.ExitStack() as stack:
            rep = bench(opts, found, stack, busy)
            say("stopping servers...")
    except KeyboardInterrupt:
        say("\ninterrupted: servers stopped")
        return 130
    except (procs.ServerFailed, scenarios.WrongAnswer, WrkFailed, RuntimeError, OSError) as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    during = others.share()  # every server is stopped and reaped by now
    rep.header["background"] = report.quietness(busy, during)
    if during is not None and during > report.BUSY_WARNING:
        say(f"{report.FLAG} other processes used {during:.0%} of the CPU during the run")
    rep.notes.append(f"whole run took {time.monotonic() - started:.0f} s")
    write(rep, opts.out)
    if rep.flagged:
        say(f"{report.FLAG} {len(rep.flagged)} run(s) had errors; see the errors column")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
