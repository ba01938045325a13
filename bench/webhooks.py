"""Signed webhooks: deliveries per second to a fast local receiver, and block-to-delivery
latency, with 1,000 webhooks watching 100,000 addresses.

    python bench/webhooks.py [--duration 20] [--rate 4000] [--paced-rate 1000]
                             [--block-interval 1.0] [--webhooks 1000] [--addresses 100]
                             [--per-tx 200] [--connections 16] [--urls distinct|shared]
                             [--set KEY=VALUE ...] [--store sqlite|postgresql] [--pg-url URL]
                             [--workers N] [--redis-url URL]
                             [--profile auto|on|off] [--py-spy PATH] [--out PATH] [--smoke]

Starts on loopback free ports: anvil (block gas limit raised, blocks mined on demand),
bootstrapped as the devnet ``chaingate dev`` serves; the receiver (``benchkit/hookreceiver.py``,
a process of its own: HTTP/1.1 keep-alive, answers 200 at once, records each request's arrival
time); one ``chaingate serve`` process (API keys on: one unlimited enterprise key; the store
SQLite, or PostgreSQL with ``--store postgresql``; the follower on ethereum/devnet polling
every 50 ms, the indexer off; ``[outbound] allow_cidrs = ["127.0.0.1/32"]`` and
``[webhooks] allow_http = true``, every other webhook setting its default).  Through the REST
API it creates ``--webhooks`` variant-A ``token_transfer`` webhooks of ``--addresses`` watched
addresses each (1,000 x 100 = 100,000; no address in two webhooks), each with its own URL on
the receiver (``/hooks/<n>``).  Then, with anvil mining a block when the bench says so:

1. **warm-up** — one block with one event for every webhook; every one must arrive, at its
   webhook's URL, and a few deliveries' signatures are checked (HMAC-SHA256 over
   ``<timestamp>.<body>`` with the secret the creation answered);
2. **throughput** — for ``--duration`` seconds, a block every ``--block-interval`` seconds
   carrying ``--rate`` x interval events (CGT ``airdrop`` transactions of ``--per-tx``
   recipients: one Transfer, hence one event, per watched recipient), more than chaingate
   delivers, so a backlog builds; then until every event arrived.  Deliveries per second:
   distinct events from the first arrival to the last;
3. **latency** — the same at ``--paced-rate`` events per second (lowered to half of the
   throughput measured when that is less than twice it, so the load is one chaingate keeps
   up with): each event's time from the block being mined (anvil's ``evm_mine`` returned)
   to its arrival at the receiver, p50/p90/p99/max;
4. **reference** — wrk POSTs one delivery the receiver got (its body and headers) straight to
   the receiver at ``--connections`` connections: the receiver's own capacity, and the ratio
   chaingate/direct.

``--workers N`` (N > 1, with ``--store postgresql``): the whole run is made twice, one after
the other, with one process and then with ``chaingate serve --workers N`` (``[server]
workers``, limits in Redis at ``--redis-url``: what N > 1 requires); the report starts with
both side by side, and every worker's CPU (and py-spy profile) is its own.

``--urls shared`` gives every webhook the same URL (one endpoint: at most 16 deliveries in
flight to it); ``--set max_per_endpoint=256`` (any ``[webhooks]`` setting, repeatable) tries
another setting.

Every load is checked event by event: each (block, recipient) must arrive once at least, at
the URL of the webhook watching the recipient, and nothing else may.  CPU of chaingate (event
loop thread and other threads), anvil, the receiver and the bench (with wrk) is read from
/proc per phase: they all share the machine's cores.  With ``--profile on`` (or ``auto``,
when a target is missed) py-spy samples chaingate while the throughput load runs again
(``pip install --target /tmp/pyspy py-spy``, then ``--py-spy /tmp/pyspy/bin/py-spy``).

Writes a markdown report to bench/results/<UTC time>-webhooks.md and prints it.  Exit status:
0 done (the targets are reported, not enforced); 1 some event was missing, unexpected or
misrouted, a signature did not verify, or wrk had errors; 2 a server failed or answered
wrongly; 3 wrk is missing; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import hashlib
import hmac
import http.client
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

import chaingate  # noqa: E402
from benchkit import hookprofile, procs, pyspy, report, runner, threads, tools  # noqa: E402
from benchkit.hookload import (  # noqa: E402
    ANVIL_ARGS,
    PAYMASTER_SIGNER,
    AirdropLoad,
    Delivered,
    ReceiverFailed,
    ReceiverProcess,
    Recipients,
    analyse,
    paced_blocks,
    percentile,
    watched_addresses,
)
from benchkit.wrkload import Wrk, WrkFailed, WrkResult  # noqa: E402
from chaingate.config.manifest import Manifest  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402

TARGET_RATE = 2000.0  # deliveries per second, one process
TARGET_P99_MS = 500.0  # block to delivery
CHAIN = "ethereum"  # the devnet is the chain's only network
EVENT_TYPE = "token_transfer"  # variant A
FOLLOWER_POLL = 0.05
WRK_TIMEOUT_S = 10
SIGNATURE_SAMPLES = 5
PROFILE_RATE = 100  # py-spy samples per second
# A phase's events must all arrive within this (plus a second per DRAIN_RATE events).
DRAIN_BASE_S = 60.0
DRAIN_RATE = 100.0


@dataclass(frozen=True)
class Options:
    duration: int
    rate: int
    paced_rate: int
    block_interval: float
    webhooks: int
    addresses: int
    per_tx: int
    connections: int
    shared_url: bool
    settings: tuple[str, ...]  # extra `key = value` lines of [webhooks]
    store: str
    pg_url: str
    workers: int  # >1: the run is made with 1 worker, then with this many
    redis_url: str
    profile: str
    py_spy: str | None
    out: Path
    smoke: bool

    @property
    def reference_seconds(self) -> int:
        return min(self.duration, 10)


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=int, default=20, help="seconds of each load")
    parser.add_argument("--rate", type=int, default=4000, help="throughput load, events/s")
    parser.add_argument("--paced-rate", type=int, default=1000, help="latency load, events/s")
    parser.add_argument("--block-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--webhooks", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=100, help="watched per webhook")
    parser.add_argument("--per-tx", type=int, default=200, help="recipients per airdrop")
    parser.add_argument("--connections", type=int, default=16, help="wrk's, for the reference")
    parser.add_argument(
        "--urls",
        choices=("distinct", "shared"),
        default="distinct",
        help="a URL per webhook (/hooks/<n>), or one for all (/hooks/shared)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [webhooks] setting of the serve config, as TOML (repeatable), e.g. "
        "max_per_endpoint=256",
    )
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="N > 1: `chaingate serve --workers N` (PostgreSQL and Redis limits), measured "
        "after one worker in the same run",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="with --workers")
    parser.add_argument("--profile", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--py-spy", help="the py-spy binary (default: on PATH or in the venv)")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC>-webhooks.md")
    parser.add_argument(
        "--smoke",
        "--quick",
        action="store_true",
        help="seconds: 20 webhooks of 10 addresses, 3 s loads of 200 and 100 events/s",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.duration, args.rate, args.paced_rate = 3, 200, 100
        args.webhooks, args.addresses, args.per_tx = 20, 10, 50
        args.block_interval = 0.5
        if args.profile == "auto":
            args.profile = "off"
    if min(args.duration, args.rate, args.paced_rate, args.webhooks, args.addresses) < 1:
        parser.error("--duration, --rate, --paced-rate, --webhooks and --addresses must be >= 1")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.workers > 1 and args.store != "postgresql":
        parser.error("--workers > 1 needs --store postgresql (workers share the outbox)")
    if args.per_tx < 1 or args.connections < 1 or args.block_interval <= 0:
        parser.error("--per-tx and --connections must be >= 1, --block-interval > 0")
    for setting in args.set:
        key, _, value = setting.partition("=")
        if not key.strip().isidentifier() or not value.strip() or key.strip() == "allow_http":
            parser.error(f"--set {setting!r}: not KEY=VALUE (allow_http is the bench's own)")
    per_block = max(args.rate, args.paced_rate) * args.block_interval
    if per_block > args.webhooks * args.addresses:
        parser.error("a block would need more recipients than there are watched addresses")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        duration=args.duration,
        rate=args.rate,
        paced_rate=args.paced_rate,
        block_interval=args.block_interval,
        webhooks=args.webhooks,
        addresses=args.addresses,
        per_tx=args.per_tx,
        connections=args.connections,
        shared_url=args.urls == "shared",
        settings=tuple(
            f"{key.strip()} = {value.strip()}"
            for key, _, value in (s.partition("=") for s in args.set)
        ),
        store=args.store,
        pg_url=args.pg_url,
        workers=args.workers,
        redis_url=args.redis_url,
        profile=args.profile,
        py_spy=args.py_spy,
        out=args.out or BENCH_DIR / "results" / f"{stamp}-webhooks.md",
        smoke=args.smoke,
    )


def say(text: str) -> None:
    print(text, flush=True)


class WrongAnswer(Exception):
    """chaingate answered a request wrongly (or not in time)."""


# --- chaingate ----------------------------------------------------------------------------


def configure(
    server: procs.ChaingateServer,
    store_url: str | None,
    settings: Sequence[str] = (),
    *,
    workers: int = 1,
    redis_url: str | None = None,
) -> None:
    """The generated config plus the webhook deployment: deliveries to the receiver's loopback
    address only, plain HTTP allowed, ``settings`` (``key = value`` lines of [webhooks]); the
    follower from the head, no indexer.  ``store_url`` replaces the SQLite store (the auth
    keys move with it); ``workers`` processes (``[server] workers``) and ``redis_url`` for the
    shared limits, which more than one worker needs."""
    text = server.config_path.read_text()
    for anchor, line in (
        ("shutdown_grace = 2.0\n", f"workers = {workers}\n"),
        ("[auth]\nenabled = true\n", f'redis_url = "{redis_url}"\n' if redis_url else ""),
    ):
        if text.count(anchor) != 1:
            raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
        text = text.replace(anchor, anchor + line)
    anchor = "testnet = true\n"
    if text.count(anchor) != 1:
        raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
    text = text.replace(anchor, f"{anchor}finality_depth = 2\nblock_time = 1.0\n")
    if store_url is not None:
        assert server.auth is not None
        old = f'url = "{server.auth.store_url}"\n'
        if text.count(old) != 1:
            raise RuntimeError("unexpected generated config: no single [store] url")
        text = text.replace(old, f'url = "{store_url}"\n')
    text = text.replace("# generated by bench/run.py", "# generated by bench/webhooks.py")
    server.config_path.write_text(
        text
        + f"""
[outbound]
allow_cidrs = ["{procs.LOOPBACK}/32"]

[webhooks]
allow_http = true
{"".join(line + chr(10) for line in settings)}
[chains.ethereum.devnet.follower]
poll_interval = {FOLLOWER_POLL}

[chains.ethereum.devnet.indexer]
enabled = false
"""
    )


class Api:
    """JSON requests to chaingate over one keep-alive connection, the key in every one."""

    def __init__(self, server: procs.ChaingateServer) -> None:
        self.conn = http.client.HTTPConnection(procs.LOOPBACK, server.port, timeout=30)
        self.headers = {"Content-Type": "application/json", **server.headers}

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, data, self.headers)
        response = self.conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class Webhooks:
    ids: list[str]
    secrets: dict[str, str]  # webhook id -> signing secret
    owner: dict[str, int]  # watched address -> webhook index
    path_of: dict[int, str]  # webhook index -> its URL path
    groups: list[list[str]]
    seconds: float


def create_webhooks(
    server: procs.ChaingateServer, receiver: ReceiverProcess, opts: Options
) -> Webhooks:
    groups = watched_addresses(opts.webhooks, opts.addresses)
    api = Api(server)
    ids: list[str] = []
    secrets: dict[str, str] = {}
    owner: dict[str, int] = {}
    path_of: dict[int, str] = {}
    started = time.monotonic()
    try:
        for index, group in enumerate(groups):
            path = "/hooks/shared" if opts.shared_url else f"/hooks/{index}"
            status, created = api.request(
                "POST",
                "/v1/webhooks",
                {
                    "url": receiver.base + path,
                    "chain": CHAIN,
                    "event_type": EVENT_TYPE,
                    "config": {"addresses": group},
                },
            )
            if status != 201 or not isinstance(created, dict):
                raise WrongAnswer(f"create webhook {index}: HTTP {status}: {created!s:.300}")
            if created.get("status") != "active" or len(created["config"]["addresses"]) != len(
                group
            ):
                raise WrongAnswer(f"webhook {index} created wrongly: {created!s:.300}")
            ids.append(str(created["id"]))
            secrets[str(created["id"])] = str(created["signing_secret"])
            path_of[index] = path
            owner.update((address, index) for address in group)
            if (index + 1) % 200 == 0:
                say(f"  {index + 1} webhooks created")
    finally:
        api.close()
    return Webhooks(ids, secrets, owner, path_of, groups, time.monotonic() - started)


def check_signatures(samples: Sequence[Mapping[str, Any]], secrets: Mapping[str, str]) -> int:
    """Variant A's signature of each sampled delivery, by hand: HMAC-SHA256 with the webhook's
    secret over ``<X-Service-Timestamp>.<raw body>``, and the timestamp within 300 s."""
    if not samples:
        raise WrongAnswer("the receiver kept no delivery to check")
    for sample in samples:
        headers = {str(k).lower(): str(v) for k, v in sample["headers"]}
        try:
            webhook_id = json.loads(sample["body"]).get("webhook_id")
        except ValueError:
            webhook_id = None
        secret = secrets.get(str(webhook_id))
        timestamp = headers.get("x-service-timestamp", "")
        if secret is None or not timestamp.isdigit():
            raise WrongAnswer(f"a delivery without its webhook or timestamp: {sample!s:.300}")
        signed = f"{timestamp}.".encode() + str(sample["body"]).encode()
        expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        offered = headers.get("x-service-signature", "").split(",")
        if not any(hmac.compare_digest(expected, s.strip()) for s in offered):
            raise WrongAnswer(f"a delivery's signature does not verify: {sample!s:.300}")
        if abs(time.time() - int(timestamp)) > 300:
            raise WrongAnswer(f"a delivery's timestamp is {timestamp}, not now")
    return len(samples)


# --- measurements -------------------------------------------------------------------------


@dataclass(frozen=True)
class Cpu:
    """CPU seconds used so far by each part sharing the machine."""

    at: float  # monotonic
    loop: float  # chaingate's event loop (main) threads, every worker together
    others: float  # chaingate's other threads (the store's SQL, the log writer)
    anvil: float
    receiver: float
    bench: float  # this process and its reaped children (wrk)
    postgres: float = 0.0  # every PostgreSQL process (the server is on this machine)
    workers: tuple[float, ...] = ()  # each chaingate worker's CPU (all its threads)
    parent: float = 0.0  # the supervisor of ``--workers N``

    def __sub__(self, before: Cpu) -> Cpu:
        return Cpu(
            self.at - before.at,
            self.loop - before.loop,
            self.others - before.others,
            self.anvil - before.anvil,
            self.receiver - before.receiver,
            self.bench - before.bench,
            self.postgres - before.postgres,
            tuple(a - b for a, b in zip(self.workers, before.workers, strict=False)),
            self.parent - before.parent,
        )

    def parts(self) -> dict[str, float]:
        return {
            "chaingate event loop": self.loop,
            "chaingate other threads": self.others,
            "anvil": self.anvil,
            "receiver": self.receiver,
            "bench (+ wrk)": self.bench,
            "PostgreSQL": self.postgres,
        }


def postgres_pids() -> list[int]:
    """Every process named postgres (the server and its backends), when PostgreSQL runs here."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == "postgres":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class Machine:
    """The processes sharing the cores: chaingate's workers (and their supervisor when there
    are several), anvil, the receiver, PostgreSQL (backends come and go: read at each look)."""

    def __init__(self, workers: Sequence[int], anvil: int, receiver: int, parent: int = 0) -> None:
        self.workers = tuple(workers)
        self.parent = parent
        self.pids = (self.workers[0], anvil, receiver)
        self.anvil = anvil
        self.receiver = receiver
        self.with_postgres = False

    def settle(self) -> None:
        for pid in self.workers:
            threads.settle(pid)

    def cpu(self) -> Cpu:
        splits = [threads.split_cpu(pid) for pid in self.workers]
        own = os.times()
        return Cpu(
            time.monotonic(),
            sum(split.main for split in splits),
            sum(split.others for split in splits),
            tools.process_cpu_seconds([self.anvil]),
            tools.process_cpu_seconds([self.receiver]),
            own.user + own.system + own.children_user + own.children_system,
            tools.process_cpu_seconds(postgres_pids()) if self.with_postgres else 0.0,
            tuple(split.main + split.others for split in splits),
            tools.process_cpu_seconds([self.parent]) if self.parent else 0.0,
        )


@dataclass(frozen=True)
class Phase:
    name: str
    label: str
    events_per_block: int
    delivered: Delivered
    cpu: Cpu  # used during the phase (load and drain)
    connections: int  # accepted by the receiver during the phase
    max_open: int  # the most connections open at once so far
    reverted: int  # airdrops of the phase that reverted (asked only when events are missing)


@dataclass(frozen=True)
class Reference:
    connections: int
    result: WrkResult
    receiver_cpu_us: float | None
    cpu: Cpu


class Bench:
    def __init__(
        self,
        opts: Options,
        server: procs.ChaingateServer,
        receiver: ReceiverProcess,
        load: AirdropLoad,
        hooks: Webhooks,
        machine: Machine,
    ) -> None:
        self.opts = opts
        self.server = server
        self.receiver = receiver
        self.load = load
        self.hooks = hooks
        self.machine = machine
        self.recipients = Recipients(hooks.groups)
        self.expected_total = 0  # distinct events every phase so far called for

    def phase(self, name: str, label: str, events_per_block: int, duration: float) -> Phase:
        self.machine.settle()
        before_stats = self.receiver.stats()
        cpu = self.machine.cpu()
        if duration <= 0:
            blocks = [self.load.block(self.recipients.take(events_per_block))]
        else:
            blocks = paced_blocks(
                self.load,
                self.recipients,
                events_per_block=events_per_block,
                interval=self.opts.block_interval,
                duration=duration,
            )
        expected = sum(len(b.recipients) for b in blocks)
        self.expected_total += expected
        say(f"[{label}] {len(blocks)} blocks, {expected} events mined; waiting for deliveries")
        stats = self.receiver.wait_for(
            self.expected_total, timeout=DRAIN_BASE_S + expected / DRAIN_RATE
        )
        used = self.machine.cpu() - cpu
        delivered = analyse(blocks, self.receiver.records(), self.hooks.owner, self.hooks.path_of)
        # Distinct events are counted across phases: one missing here stays missing later.
        self.expected_total -= delivered.missing
        phase = Phase(
            name,
            label,
            events_per_block,
            delivered,
            used,
            stats["connections"] - before_stats["connections"],
            stats["max_open"],
            self.load.failed_transactions(blocks) if delivered.missing else 0,
        )
        _progress(phase)
        return phase

    def reference(self, wrk_binary: str, workdir: Path, sample: Mapping[str, Any]) -> Reference:
        """wrk POSTs one delivery (body and signed headers) straight to the receiver."""
        skip = {"host", "content-length", "content-type", "connection", "user-agent"}
        headers = tuple(
            (str(name), str(value))
            for name, value in sample["headers"]
            if str(name).lower() not in skip
        )
        wrk = Wrk(
            wrk_binary,
            workdir,
            threads=1,
            connections=self.opts.connections,
            timeout_s=WRK_TIMEOUT_S,
            headers=headers,
        )
        url = f"{self.receiver.base}/direct/0"
        body = str(sample["body"]).encode()
        wrk.run(url, body, 1)  # warm-up
        requests = self.receiver.stats()["requests"]
        cpu = self.machine.cpu()
        result = wrk.run(url, body, self.opts.reference_seconds)
        used = self.machine.cpu() - cpu
        answered = self.receiver.stats()["requests"] - requests
        ref = Reference(
            self.opts.connections,
            result,
            used.receiver / answered * 1e6 if answered else None,
            used,
        )
        flag = f"  {report.FLAG} {result.errors} errors" if result.errors else ""
        say(
            f"[direct POST c={ref.connections}] {result.rps:8.0f} req/s  p50 "
            f"{result.p50_ms:.2f} ms  p99 {result.p99_ms:.2f} ms{flag}"
        )
        return ref


def _progress(phase: Phase) -> None:
    d = phase.delivered
    lat = d.latencies_ms
    flag = "" if d.correct else f"  {report.FLAG} missing {d.missing}, unexpected {d.unexpected}"
    say(
        f"[{phase.label}] {d.delivered}/{d.expected} delivered, {d.rate:8.0f} events/s "
        f"(offered {d.offered_per_s:.0f}/s), latency p50 {percentile(lat, 50):.0f} ms "
        f"p99 {percentile(lat, 99):.0f} ms, {phase.connections} new connections{flag}"
    )


# --- report ---------------------------------------------------------------------------------


@dataclass
class Results:
    header: dict[str, str]
    phases: list[Phase] = field(default_factory=list)
    reference: Reference | None = None
    signatures: int = 0
    metrics: str = ""
    profiles: list[WorkerProfile] = field(default_factory=list)
    workers: int = 1
    notes: list[str] = field(default_factory=list)

    def find(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def flagged(self) -> list[str]:
        problems = [p.label for p in self.phases if not p.delivered.correct]
        if self.reference is not None and self.reference.result.errors:
            problems.append("direct POST")
        return problems

    def targets_met(self) -> bool:
        throughput, paced = self.find("throughput"), self.find("paced")
        return (
            throughput is not None
            and throughput.delivered.rate >= TARGET_RATE
            and paced is not None
            and percentile(paced.delivered.latencies_ms, 99) <= TARGET_P99_MS
        )


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"


def _verdict(met: bool) -> str:
    return "MET" if met else "NOT MET"


def _share(seconds: float, wall: float) -> str:
    return f"{seconds / wall:.0%}" if wall > 0 else "n/a"


def render(res: Results) -> str:
    lines = [f"# chaingate webhook delivery benchmark, {res.header.get('date', '')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.header.items() if k != "date"]
    lines += ["", *_throughput(res), "", *_latency(res), "", *_correctness(res)]
    lines += ["", *_cpu(res)]
    for worker in res.profiles:
        lines += ["", *hookprofile.render(worker.profile)]
    if res.metrics:
        lines += ["", "## chaingate's webhook counters at the end (/metrics)", "", "```"]
        lines += [res.metrics.rstrip(), "```"]
    if res.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in res.notes)]
    return "\n".join(lines) + "\n"


def _throughput(res: Results) -> list[str]:
    lines = [
        "## Deliveries per second",
        "",
        "| run | requests | seconds | req/s | offered events/s | backlog at load end "
        "| receiver connections | receiver CPU µs/req | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    phase = res.find("throughput")
    if phase is not None:
        d = phase.delivered
        span = d.last_arrival - d.first_arrival
        per_req = phase.cpu.receiver / d.delivered * 1e6 if d.delivered else math.nan
        errors = "0" if d.correct else f"{report.FLAG} {d.missing + d.unexpected} (see below)"
        lines.append(
            f"| chaingate → receiver (deliveries) | {d.delivered} | {span:.1f} | {d.rate:.0f} "
            f"| {d.offered_per_s:.0f} | {d.backlog_at_end} | {phase.connections} "
            f"| {_ms(per_req)} | {errors} |"
        )
    ref = res.reference
    if ref is not None:
        r = ref.result
        errors = "0" if not r.errors else f"{report.FLAG} **{r.errors}** ({r.error_detail()})"
        cpu = "n/a" if ref.receiver_cpu_us is None else f"{ref.receiver_cpu_us:.0f}"
        lines.append(
            f"| wrk → receiver (direct POST, c={ref.connections}) | {r.requests} "
            f"| {r.duration_s:.1f} | {r.rps:.0f} | - | - | {ref.connections} | {cpu} | {errors} |"
        )
    if phase is not None:
        rate = phase.delivered.rate
        ratio = f"{rate / ref.result.rps:.3f}" if ref is not None and ref.result.rps else "n/a"
        lines += [
            "",
            f"**chaingate deliveries/s: {rate:.0f}; target >= {TARGET_RATE:,.0f}: "
            f"{_verdict(rate >= TARGET_RATE)}.  chaingate/direct: {ratio}.**",
            "",
            "Deliveries: distinct events that arrived at the receiver, from the first arrival "
            "to the last, while blocks kept coming and then while the backlog drained "
            f"(during the load alone: {phase.delivered.during_load_rate:.0f} events/s).  "
            "Backlog at load end: events mined but not yet delivered when the last block was "
            "mined — above a block's worth, the load exceeded what chaingate delivers and the "
            "rate is chaingate's capacity, not the load's.  Direct: the same receiver's "
            "capacity for the same request (a delivery it got, body and signed headers, "
            "replayed by wrk over keep-alive connections).  Receiver connections: TCP "
            "connections it accepted during the run (chaingate's keep-alive pool reuses them; "
            "many more than its concurrency means connections were opened per delivery).",
        ]
        if phase.delivered.backlog_at_end <= phase.events_per_block:
            lines += [
                "",
                f"{report.FLAG} chaingate kept up with the offered load: its capacity is at "
                "least this, raise `--rate` to find it.",
            ]
    return lines


def _latency(res: Results) -> list[str]:
    lines = [
        "## Block-to-delivery latency",
        "",
        "| load | blocks | events/block | offered events/s | events | p50 ms | p90 ms | p99 ms "
        "| max ms | block's first event p50 ms | block's last event p50 ms "
        "| block's last event max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in res.phases:
        d = phase.delivered
        lat = d.latencies_ms
        lines.append(
            f"| {phase.label} | {d.blocks} | {phase.events_per_block} | {d.offered_per_s:.0f} "
            f"| {d.delivered} | {_ms(percentile(lat, 50))} | {_ms(percentile(lat, 90))} "
            f"| {_ms(percentile(lat, 99))} | {_ms(lat[-1] if lat else math.nan)} "
            f"| {_ms(percentile(d.block_first_ms, 50))} | {_ms(percentile(d.block_done_ms, 50))} "
            f"| {_ms(d.block_done_ms[-1] if d.block_done_ms else math.nan)} |"
        )
    paced = res.find("paced")
    if paced is not None:
        p99 = percentile(paced.delivered.latencies_ms, 99)
        mine = percentile(paced.delivered.mine_ms, 50)
        lines += [
            "",
            f"**p99 block-to-delivery at {paced.delivered.offered_per_s:.0f} events/s: "
            f"{_ms(p99)} ms; target <= {TARGET_P99_MS:.0f} ms: "
            f"{_verdict(p99 <= TARGET_P99_MS)}.**",
            "",
            "From the moment anvil's `evm_mine` returned (the block is the node's head) to the "
            "moment the receiver had read the delivery, on the same clock.  It includes the "
            f"follower's polling (every {FOLLOWER_POLL * 1000:.0f} ms), fetching the block's "
            "logs, matching against 100,000 addresses, writing the outbox, the claim, signing "
            "and the POST; a block's events go out one after another, so its last event waits "
            "for the others (the block's last event column).  Mining itself (`evm_mine`, which "
            f"executes the block's transactions) took {_ms(mine)} ms at the median and is not "
            "counted.  The saturating load's latency only shows the backlog.",
        ]
    return lines


def _correctness(res: Results) -> list[str]:
    lines = [
        "## Delivered as the chain called for",
        "",
        "| load | blocks | events called for | delivered | missing | unexpected | misrouted "
        "| repeated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase in res.phases:
        d = phase.delivered
        lines.append(
            f"| {phase.label} | {d.blocks} | {d.expected} | {d.delivered} | {d.missing} "
            f"| {d.unexpected} | {d.misrouted} | {d.repeated} |"
        )
        if phase.reverted:
            lines.append(f"| ({phase.reverted} airdrop transactions reverted) | | | | | | | |")
    lines += [
        "",
        "An event per (block, recipient) of the airdrops; delivered: it arrived at least once; "
        "misrouted: it arrived at another webhook's URL than that of the webhook watching the "
        "recipient; repeated: requests beyond the first for the same event id (delivery is "
        "at least once).",
        "",
        f"Signatures: {res.signatures} deliveries checked by hand (HMAC-SHA256 with the "
        "webhook's secret over `<X-Service-Timestamp>.<raw body>`, the timestamp within "
        "300 s): all valid.",
    ]
    return lines


def _cpu(res: Results) -> list[str]:
    cores = os.cpu_count() or 1
    lines = [
        f"## CPU: how the {cores} cores were shared",
        "",
        "| phase | seconds | chaingate event loop | chaingate other threads | anvil | receiver "
        f"| bench (+ wrk) | PostgreSQL | all, of {cores} cores | chaingate CPU µs per delivery "
        "| chaingate per worker |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows: list[tuple[str, Cpu, int]] = [(p.label, p.cpu, p.delivered.delivered) for p in res.phases]
    if res.reference is not None:
        rows.append((f"direct POST (c={res.reference.connections})", res.reference.cpu, 0))
    for label, cpu, delivered in rows:
        wall = cpu.at
        parts = cpu.parts()
        total = sum(parts.values())
        per = (cpu.loop + cpu.others) / delivered * 1e6 if delivered else math.nan
        lines.append(
            f"| {label} | {wall:.1f} | "
            + " | ".join(_share(seconds, wall) for seconds in parts.values())
            + f" | {_share(total, wall * cores)} | {_ms(per)} "
            f"| {' + '.join(_share(w, wall) for w in cpu.workers)} |"
        )
    lines += [
        "",
        "Shares of one core over the phase (load and drain), from /proc: every process "
        f"runs unpinned on the same {cores} cores, so what one uses the others cannot.  "
        "chaingate's event loop thread runs the follower, the matcher and the dispatcher "
        "(claims, signing, the HTTP exchanges); its other threads run the store's "
        "transactions and the log writer.  The receiver is a process of its own (one "
        "thread); anvil executes the airdrops when a block is mined.  PostgreSQL: every "
        "postgres process on the machine (when the store is PostgreSQL).  With several "
        "workers the chaingate columns add up every worker; the last column splits them.",
    ]
    return lines


# --- the run ----------------------------------------------------------------------------------


def webhook_counters(text: str) -> str:
    keep = []
    for name, labels, value in report.samples(text):
        if name.startswith("chaingate_webhook") and not name.endswith(("_bucket", "_created")):
            number = int(value) if value.is_integer() else value
            keep.append(f"{name}{labels} {number}")
    return "\n".join(keep)


def pg_schema(pg_url: str, stack: contextlib.ExitStack) -> str:
    """A fresh schema (dropped at the end) and the URL whose search_path is it."""
    import secrets
    from urllib.parse import quote

    import psycopg

    schema = f"cg_bench_hooks_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    stack.callback(drop)
    joiner = "&" if "?" in pg_url else "?"
    return f"{pg_url}{joiner}options={quote(f'-c search_path={schema}')}"


def bench(
    opts: Options, wrk_binary: str, stack: contextlib.ExitStack, busy: float | None
) -> Results:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-hooks-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    anvil = AnvilProcess(extra=ANVIL_ARGS)
    stack.callback(anvil.stop)
    anvil.start()
    anvil_version = tools.anvil_version(anvil_binary(install=False))
    say(f"anvil {anvil_version} on :{anvil.port}")
    manifest: Manifest = bootstrap_devnet(
        anvil.url, paymaster_signer=PAYMASTER_SIGNER, announce=say
    )

    receiver = ReceiverProcess(workdir, samples=SIGNATURE_SAMPLES)
    stack.callback(receiver.stop)
    receiver.start()
    say(f"receiver on :{receiver.port} (pid {receiver.pid})")

    store_url = pg_schema(opts.pg_url, stack) if opts.store == "postgresql" else None
    auth = procs.Auth.fresh(workdir / "chaingate.db")
    server = procs.ChaingateServer(
        workdir, "chaingate", anvil.url, access_log=True, coalesce=True, auth=auth
    )
    configure(
        server,
        store_url,
        opts.settings,
        workers=opts.workers,
        redis_url=opts.redis_url if opts.store == "postgresql" and opts.workers > 1 else None,
    )
    server.create_key()
    stack.callback(server.stop)
    server.start(timeout=60.0)
    workers = wait_for_workers(server, opts.workers)
    impl = server.impl()
    say(
        f"chaingate on :{server.port} (impl {impl}), store {opts.store}, "
        f"{opts.workers} worker(s): pids {', '.join(map(str, workers))}"
    )

    hooks = create_webhooks(server, receiver, opts)
    say(
        f"{len(hooks.ids)} webhooks watching {len(hooks.owner)} addresses created in "
        f"{hooks.seconds:.1f} s"
    )
    res = Results(header(opts, impl, busy, anvil_version, tools.wrk_version(wrk_binary)))
    res.header["webhooks"] = (
        f"{len(hooks.ids)} variant-A `{EVENT_TYPE}` webhooks created through "
        f"`POST /v1/webhooks` ({hooks.seconds:.1f} s), {opts.addresses} watched addresses "
        f"each: {len(hooks.owner):,} addresses, none in two webhooks; "
        + (
            f"**one URL for all** (`http://{procs.LOOPBACK}:<port>/hooks/shared`, --urls shared)"
            if opts.shared_url
            else f"each webhook its own URL on the receiver "
            f"(`http://{procs.LOOPBACK}:<port>/hooks/<n>`)"
        )
        + "; the enterprise plan (no daily quota)"
    )
    parent = server.process.pid or 0
    machine = Machine(workers, anvil.pid or 0, receiver.pid, parent if opts.workers > 1 else 0)
    machine.with_postgres = opts.store == "postgresql"
    token, sender = manifest.address("erc20_cgt"), manifest.deployer
    with AirdropLoad(anvil.url, token, sender, opts.per_tx) as load:
        runs = Bench(opts, server, receiver, load, hooks, machine)
        res.phases.append(runs.phase("warmup", "warm-up (an event per webhook)", opts.webhooks, 0))
        res.signatures = check_signatures(receiver.samples(), hooks.secrets)
        rate_block = round(opts.rate * opts.block_interval)
        throughput = runs.phase(
            "throughput", f"throughput ({opts.rate} events/s offered)", rate_block, opts.duration
        )
        res.phases.append(throughput)
        paced_rate = opts.paced_rate
        if throughput.delivered.rate < 2 * paced_rate:
            paced_rate = max(1, int(throughput.delivered.rate / 2))
            res.notes.append(
                f"the latency load was lowered from {opts.paced_rate} to {paced_rate} events/s, "
                "half of the throughput measured, so that chaingate keeps up with it"
            )
        paced_block = max(1, round(paced_rate * opts.block_interval))
        res.phases.append(
            runs.phase("paced", f"paced ({paced_rate} events/s)", paced_block, opts.duration)
        )
        res.reference = runs.reference(wrk_binary, workdir, receiver.samples()[0])
        res.metrics = webhook_counters(server.metrics())
        want = opts.profile == "on" or (opts.profile == "auto" and not res.targets_met())
        if want:
            res.profiles = profile(opts, runs, rate_block, math.ceil(throughput.cpu.at) + 2)
    stats = receiver.stats()
    res.header["receiver"] = (
        f"`benchkit/hookreceiver.py`, its own process (Python, one thread, epoll): answers "
        f"200 at once, keep-alive; {stats['connections']} connections accepted in all, at most "
        f"{stats['max_open']} open at once, {stats['refused']} requests refused"
    )
    return res


def wait_for_workers(server: procs.ChaingateServer, count: int, timeout: float = 60.0) -> list[int]:
    """The pids of chaingate's workers once ``count`` of them answer ``/v1/health`` (asked
    over fresh connections: the kernel spreads connections over the workers)."""
    parent = server.process.pid or 0
    if count == 1:
        return [parent]
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        if time.monotonic() > deadline:
            raise procs.ServerFailed(
                f"{len(seen)} of {count} workers answered:\n{server.process.log_tail()}"
            )
        conn = http.client.HTTPConnection(procs.LOOPBACK, server.port, timeout=5)
        try:
            conn.request("GET", "/v1/health")
            seen.add(int(json.loads(conn.getresponse().read())["worker"]))
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
        finally:
            conn.close()
    children = children_of(parent)
    if seen != set(children):
        raise procs.ServerFailed(f"workers {sorted(seen)} answered, children are {children}")
    return sorted(seen)


def children_of(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (any of its threads may have started them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class WorkerProfile:
    pid: int
    profile: hookprofile.Profile


def profile(opts: Options, runs: Bench, events_per_block: int, seconds: int) -> list[WorkerProfile]:
    """py-spy samples each chaingate worker for ``seconds`` (the throughput phase's length,
    load and drain) while the throughput load runs again; its figures are the profile's
    only."""
    binary = pyspy.find(opts.py_spy)
    if binary is None:
        return [
            WorkerProfile(
                0,
                hookprofile.Profile(
                    label="throughput load",
                    note="py-spy not found: `pip install --target /tmp/pyspy py-spy`, then "
                    "`--py-spy /tmp/pyspy/bin/py-spy` (or put py-spy on PATH)",
                ),
            )
        ]
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    say(f"profiling the throughput load with {binary} ...")
    runs.machine.settle()
    raws = {
        pid: opts.out.with_name(f"{opts.out.stem}-profile-{pid}.txt")
        for pid in runs.machine.workers
    }
    with contextlib.ExitStack() as sampling:
        samplers = {
            pid: sampling.enter_context(pyspy.Sampler(binary, pid, seconds, raw, rate=PROFILE_RATE))
            for pid, raw in raws.items()
        }
        phase = runs.phase(
            "profiled",
            f"throughput under py-spy ({opts.rate} events/s)",
            events_per_block,
            opts.duration,
        )
    found = []
    for index, (pid, sampler) in enumerate(samplers.items()):
        if sampler.failure:
            found.append(
                WorkerProfile(pid, hookprofile.Profile(label=phase.label, note=sampler.failure))
            )
            continue
        # Each worker's CPU from /proc (its share of the phase's), the deliveries split by
        # the same share: the sampler cannot tell which worker sent what.
        share = phase.cpu.workers[index] / sum(phase.cpu.workers) if sum(phase.cpu.workers) else 1
        cpu = PerWorkerCpu(phase.cpu, share)
        label = (
            phase.label
            if len(samplers) == 1
            else f"{phase.label}, worker {pid} (its deliveries estimated from its CPU share)"
        )
        found.append(
            WorkerProfile(
                pid,
                hookprofile.parse(
                    raws[pid], label, PROFILE_RATE, cpu, round(phase.delivered.delivered * share)
                ),
            )
        )
    return found


@dataclass(frozen=True)
class PerWorkerCpu:
    """One worker's part of a phase's CPU, for its profile (loop and other threads scaled
    alike: /proc splits them per process, the report keeps only the sums)."""

    whole: Cpu
    share: float

    @property
    def loop(self) -> float:
        return self.whole.loop * self.share

    @property
    def others(self) -> float:
        return self.whole.others * self.share


def header(
    opts: Options, impl: str, busy: float | None, anvil_version: str, wrk_version: str
) -> dict[str, str]:
    pure = os.environ.get("CHAINGATE_PURE")
    store = (
        "SQLite (WAL) file in the bench's temporary directory, fresh for the run"
        if opts.store == "sqlite"
        else "PostgreSQL, a fresh schema dropped at the end"
    )
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "chaingate": (
            f"{chaingate.__version__}, impl **{impl}** (CHAINGATE_PURE="
            f"{pure if pure is not None else 'unset'}), "
            + (
                "one `chaingate serve` process: the "
                if opts.workers == 1
                else f"**`chaingate serve --workers {opts.workers}`** (limits in Redis; every "
                "worker follows the network and delivers, one leads the matcher): the "
            )
            + f"follower on ethereum/devnet (polling every {FOLLOWER_POLL * 1000:.0f} ms), the "
            "webhook matcher and dispatcher; indexer off (so no token symbol in payloads)"
        ),
        "webhook settings": (
            "**" + ", ".join(opts.settings) + "**, the rest default"
            if opts.settings
            else "the defaults (256 deliveries in flight, 16 per URL, claims of 1000)"
        ),
        "store": store,
        "auth": "**on**: one enterprise (unlimited) test key",
        "load": (
            f"a block every {opts.block_interval:g} s for {opts.duration} s per load, each "
            f"holding CGT `airdrop(address[],uint256)` transactions of up to {opts.per_tx} "
            "watched recipients (one Transfer each), sent by the deployer, mined with "
            "`evm_mine` (automine off)" + (" (--smoke)" if opts.smoke else "")
        ),
        "versions": f"anvil {anvil_version}, wrk {wrk_version}, Python {platform.python_version()}",
    }


def write(runs: Sequence[Results], out: Path) -> None:
    text = render(runs[0]) if len(runs) == 1 else render_compared(runs)
    say("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    say(f"report written to {out}")


def render_compared(runs: Sequence[Results]) -> str:
    """1 worker against N, measured one after the other in one run: a summary, then each
    run's full report."""
    cores = os.cpu_count() or 1
    lines = [
        "# chaingate webhook delivery benchmark: 1 worker against "
        f"{runs[-1].workers}, {runs[0].header.get('date', '')}",
        "",
        "Each row is a full run of its own (fresh anvil, receiver, PostgreSQL schema and "
        "webhooks), one after the other; the reports follow.  CPU: shares of one core over "
        "the throughput phase (load and drain), from /proc; the PostgreSQL column is every "
        "postgres process on the machine (other users' queries included).",
        "",
        "| workers | deliveries/s | target >= 2,000 | paced events/s | p99 ms | target <= 500 "
        "| chaingate per worker | parent | PostgreSQL | receiver | anvil | bench (+wrk) "
        f"| all, of {cores} cores |",
        "|---:|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for res in runs:
        throughput, paced = res.find("throughput"), res.find("paced")
        if throughput is None or paced is None:
            lines.append(f"| {res.workers} | (not measured) |||||||||||")
            continue
        rate = throughput.delivered.rate
        p99 = percentile(paced.delivered.latencies_ms, 99)
        cpu = throughput.cpu
        wall = cpu.at
        per_worker = " + ".join(_share(w, wall) for w in cpu.workers) or "n/a"
        total = sum(cpu.parts().values()) + cpu.parent
        lines.append(
            f"| {res.workers} | {rate:.0f} | {_verdict(rate >= TARGET_RATE)} "
            f"| {paced.delivered.offered_per_s:.0f} | {_ms(p99)} "
            f"| {_verdict(p99 <= TARGET_P99_MS)} "
            f"| {per_worker} | {_share(cpu.parent, wall)} | {_share(cpu.postgres, wall)} "
            f"| {_share(cpu.receiver, wall)} | {_share(cpu.anvil, wall)} "
            f"| {_share(cpu.bench, wall)} | {_share(total, wall * cores)} |"
        )
    first, last = runs[0].find("throughput"), runs[-1].find("throughput")
    if first is not None and last is not None and first.delivered.rate:
        lines += [
            "",
            f"**{runs[-1].workers} workers / 1 worker: "
            f"{last.delivered.rate / first.delivered.rate:.2f}x deliveries/s.**",
        ]
    for res in runs:
        lines += ["", "---", "", render(res).replace("\n# ", "\n## ", 1)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        wrk_binary = tools.require_tools(("wrk",))["wrk"]
    except tools.MissingTool as exc:
        say(f"error: {exc}")
        return 3
    counts = [1, opts.workers] if opts.workers > 1 else [1]
    runs: list[Results] = []
    for count in counts:
        run_opts = dataclasses.replace(opts, workers=count)
        say(f"=== {count} worker(s) ===")
        outcome = runner.guarded(
            lambda stack, busy, o=run_opts: bench(o, wrk_binary, stack, busy),  # type: ignore[misc]
            (procs.ServerFailed, WrongAnswer, ReceiverFailed, WrkFailed, RuntimeError, OSError),
        )
        if isinstance(outcome, int):
            return outcome
        res = outcome.result
        res.workers = count
        res.header["background"] = outcome.background
        res.notes.append(f"whole run took {outcome.seconds:.0f} s")
        runs.append(res)
    write(runs, opts.out)
    flagged = [f"{res.workers} worker(s): {label}" for res in runs for label in res.flagged]
    if flagged:
        say(f"{report.FLAG} wrong deliveries or errors in: {', '.join(flagged)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
