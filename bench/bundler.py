"""ERC-4337 bundlers: accepted operations per second and submit-to-receipt latency, against Alto.

    python bench/bundler.py [--ops 200] [--latency-ops 40] [--concurrency 32]
                            [--versions 0.6,0.7,0.8] [--target chaingate-safe]
                            [--target chaingate-unsafe] [--target alto-unsafe]
                            [--target alto-safe] [--no-alto] [--deploy] [--warmup N]
                            [--chaingate-url URL --node URL --manifest PATH [--api-key KEY]]
                            [--out PATH] [--smoke]

Starts anvil on a loopback free port, bootstrapped as the devnet ``chaingate dev`` serves
(EntryPoint v0.6, v0.7 and v0.8 at their canonical addresses, a SimpleAccountFactory each), then
measures each target in turn on that same anvil:

* **alto-unsafe** / **alto-safe** (both unless ``--target`` names one) — Alto (npm
  ``@pimlico/alto``, pinned in ``benchkit/alto.py``) run with Node, ``--safe-mode
  false|true``, its own funded executor key, its defaults otherwise (auto bundling every
  100-1000 ms) and ``--log-level warn``;
* **chaingate-safe** / **chaingate-unsafe** (``--target``, repeatable) — one
  ``chaingate serve`` process with the devnet's manifest, the follower (50 ms polls), a funded
  bundler key in a key file and ``[bundler] safe_mode`` (and the network's
  ``[chains.ethereum.devnet.bundler] safe_mode``) true or false, API keys off; the bundler is
  ``POST /v1/bundler/ethereum/devnet``.  With ``--chaingate-url`` the bench uses that URL
  instead, and the node and manifest it fronts (``--node``, ``--manifest``).

For every target and EntryPoint version: a fresh set of SimpleAccounts of one owner key (one
per operation: distinct senders, so no per-sender limit binds), deployed beforehand through the
factory (``--deploy``: each operation deploys its own) and funded with ``anvil_setBalance``;
with ``--deploy`` every operation names the devnet's one (unstaked) factory, which ERC-7562
(UREP-020) lets hold 10 operations in a mempool plus its inclusions: a chaingate the bench
starts is given a factory with a record first (``debug_bundler_setReputation``: 10,000 seen,
10,000 included — any factory in production use has one), or it would refuse all but ten of
the load (Alto's unsafe mode applies no reputation);
their first operations (send 1 wei), built and signed in Python with ``chaingate.aa``.  Then:

1. **probe** — one operation; if the target refuses it, its refusal is reported and the
   version is not measured on that target (Alto's safe mode refuses every operation on
   anvil 1.7.1: see docs/decisions/bundler.md, "ERC-7562 tracing");
   with ``--warmup N``, N more operations are then sent as the load is and their receipts
   awaited, unmeasured: the target's first measured version is warm as its later ones are
   (Node's JIT: Alto's first version measured costs 2-3x the CPU per operation of its
   second, whichever version is first — without a warm-up the ratios follow the order);
2. **throughput** — ``--ops`` operations sent with ``eth_sendUserOperation`` by
   ``--concurrency`` keep-alive connections at once: accepted operations per second (answers
   carrying the locally computed userOpHash, from the first request to the last answer), the
   answer time p50/p99, the server's CPU per operation; then every accepted operation's
   receipt is awaited (``eth_getUserOperationReceipt``): included, failed, and how long after
   the last answer the last one arrived;
3. **latency** — ``--latency-ops`` operations by ``--latency-workers`` clients, each sending
   one and polling its receipt every 20 ms before the next: submit-to-receipt p50/p99.

Prints a markdown report (also written to bench/results/<UTC time>-bundler.md) with the
ratios chaingate/Alto.  Exit status: 0 done; 1 a measured target refused or lost operations;
2 a server failed; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # benchkit, also when run from another directory

from benchkit import alto, bundlerload, procs, report, runner, tools  # noqa: E402
from benchkit.bundlerops import TAGS, BuiltOp, build_ops  # noqa: E402
from chaingate.aa.userop import Version, require_version  # noqa: E402
from chaingate.config.manifest import Manifest, dumps, load_manifest  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, anvil_binary, rpc_call  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402
from chaingate.evm.keys import PrivateKey, load_or_create_key  # noqa: E402

ALTO_TARGETS = ("alto-unsafe", "alto-safe")
CHAINGATE_TARGETS = ("chaingate-safe", "chaingate-unsafe")
FOLLOWER_POLL = 0.05
RECEIPT_TIMEOUT = 60.0
BUNDLER_FUNDS = 10**21  # 1,000 ETH for the bundler EOAs


@dataclass(frozen=True)
class Options:
    ops: int
    latency_ops: int
    concurrency: int
    latency_workers: int
    versions: tuple[Version, ...]
    targets: tuple[str, ...]
    deploy: bool
    chaingate_url: str | None
    node: str | None
    manifest: Path | None
    api_key: str | None
    out: Path
    smoke: bool
    warmup: int = 0


def _versions(text: str) -> tuple[Version, ...]:
    try:
        found = tuple(require_version(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not found:
        raise argparse.ArgumentTypeError("no EntryPoint version given")
    return tuple(dict.fromkeys(found))


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=None, help="throughput load (default 200)")
    parser.add_argument("--latency-ops", type=int, default=None, help="default 40")
    parser.add_argument("--concurrency", type=int, default=None, help="default 32")
    parser.add_argument("--latency-workers", type=int, default=None, help="default 4")
    parser.add_argument("--versions", type=_versions, default=("0.6", "0.7", "0.8"))
    parser.add_argument(
        "--target",
        action="append",
        choices=CHAINGATE_TARGETS + ALTO_TARGETS,
        default=[],
        help="a bundler to measure (repeatable); naming no Alto target measures both beside",
    )
    parser.add_argument("--no-alto", action="store_true", help="measure only --target ones")
    parser.add_argument("--deploy", action="store_true", help="operations deploy their account")
    parser.add_argument("--chaingate-url", help="a running chaingate's bundler URL")
    parser.add_argument("--node", help="the devnet node that chaingate fronts (with the URL)")
    parser.add_argument("--manifest", type=Path, help="that devnet's manifest (with the URL)")
    parser.add_argument("--api-key", help="X-API-Key for --chaingate-url")
    parser.add_argument("--out", type=Path, help="default: bench/results/<UTC>-bundler.md")
    parser.add_argument("--smoke", action="store_true", help="a few operations per target")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="unmeasured operations per target and version after the probe (default 0)",
    )
    args = parser.parse_args(argv)
    defaults = (4, 2, 2, 1) if args.smoke else (200, 40, 32, 4)
    ops, latency_ops, concurrency, workers = (
        given if given is not None else default
        for given, default in zip(
            (args.ops, args.latency_ops, args.concurrency, args.latency_workers),
            defaults,
            strict=True,
        )
    )
    if min(ops, concurrency, workers) < 1 or latency_ops < 0:
        parser.error("--ops, --concurrency and --latency-workers must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    named_alto = any(t in ALTO_TARGETS for t in args.target)
    alto_default = [] if args.no_alto or named_alto else list(ALTO_TARGETS)
    targets = tuple(dict.fromkeys(alto_default + args.target))
    if not targets:
        parser.error("no target: --no-alto needs at least one --target")
    external = (args.chaingate_url, args.node, args.manifest)
    if any(external) and not all(external):
        parser.error("--chaingate-url, --node and --manifest go together")
    if args.chaingate_url and len(args.target) != 1:
        parser.error("--chaingate-url is one bundler: give exactly one --target (its mode)")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        ops=ops,
        latency_ops=latency_ops,
        concurrency=concurrency,
        latency_workers=workers,
        versions=args.versions,
        targets=targets,
        deploy=args.deploy,
        chaingate_url=args.chaingate_url,
        node=args.node,
        manifest=args.manifest,
        api_key=args.api_key,
        out=args.out or BENCH_DIR / "results" / f"{stamp}-bundler.md",
        smoke=args.smoke,
        warmup=args.warmup,
    )


def say(text: str) -> None:
    print(text, flush=True)


# --- the bundlers under test ------------------------------------------------------------------


class Target:
    """A bundler to measure: its URL, headers, the process to charge CPU to, and stop()."""

    def __init__(self, name: str, url: str, pid: int | None, stop: contextlib.ExitStack) -> None:
        self.name = name
        self.url = url
        self.pid = pid
        self.headers: dict[str, str] = {}
        self.stack = stop
        # chaingate's upstream requests so far (its /metrics), None where not known (Alto)
        self.node_requests: Callable[[], int] | None = None

    def cpu_seconds(self) -> float | None:
        if self.pid is None:
            return None
        return tools.process_cpu_seconds(tools.process_tree(self.pid))

    def stop(self) -> None:
        self.stack.close()


def fund(node: str, address: str) -> None:
    rpc_call(node, "anvil_setBalance", [address, hex(BUNDLER_FUNDS)])


def start_alto(name: str, node: str, manifest: Manifest, workdir: Path) -> Target:
    executor = PrivateKey.generate()
    fund(node, executor.address)
    server = alto.AltoServer(
        workdir,
        name,
        node,
        [manifest.address(f"entry_point_{TAGS[v]}") for v in TAGS],
        safe=name == "alto-safe",
        executor=executor,
    )
    stack = contextlib.ExitStack()
    stack.callback(server.stop)
    try:
        server.start()
    except BaseException:
        stack.close()
        raise
    return Target(name, server.url, server.process.pid, stack)


def configure_chaingate(
    server: procs.ChaingateServer, manifest_path: Path, key_file: Path, safe: bool
) -> None:
    """The devnet network gets its manifest, the follower (fast polls: receipts come from it)
    and the bundler in the target's mode; the bundler key is read from ``key_file``.

    The mode is written in the file, not as CHAINGATE_BUNDLER__SAFE_MODE: the bench's child
    environment drops CHAINGATE_<SECTION>__<KEY> overrides so the generated file rules."""
    text = server.config_path.read_text()
    anchor = "testnet = true\n"
    if text.count(anchor) != 1:
        raise RuntimeError(f"unexpected generated config: no single {anchor!r}")
    mode = str(safe).lower()
    network = f'{anchor}manifest = "{manifest_path}"\nfinality_depth = 2\n'
    extra = f"""
[bundler]
key_file = "{key_file}"
safe_mode = {mode}

[chains.ethereum.devnet.follower]
poll_interval = {FOLLOWER_POLL}

[chains.ethereum.devnet.indexer]
enabled = false

[chains.ethereum.devnet.bundler]
safe_mode = {mode}
"""
    extra = extra.replace("[bundler]\n", "[bundler]\ndebug = true\n", 1)
    text = text.replace("# generated by bench/run.py", "# generated by bench/bundler.py")
    server.config_path.write_text(text.replace(anchor, network) + extra)


def start_chaingate(name: str, node: str, manifest_path: Path, workdir: Path) -> Target:
    key_file = workdir / f"{name}-bundler.key"
    fund(node, load_or_create_key(key_file).address)
    server = procs.ChaingateServer(workdir, name, node, access_log=True, coalesce=True, auth=None)
    configure_chaingate(server, manifest_path, key_file, safe=name == "chaingate-safe")
    stack = contextlib.ExitStack()
    stack.callback(server.stop)
    try:
        server.start(timeout=60.0)
    except BaseException:
        stack.close()
        raise
    target = Target(name, f"{server.base}/v1/bundler/ethereum/devnet", server.process.pid, stack)
    target.node_requests = lambda: report.total(
        server.metrics(), "chaingate_upstream_requests_total"
    )
    return target


def give_record(target: Target, factory: str, entry_point: str) -> None:
    """A factory with a track record, as in production: UREP-020 then allows it more than
    the 10 operations of an unknown unstaked factory (see the module's docstring)."""
    conn = bundlerload.Connection(target.url, target.headers)
    try:
        record = [{"address": factory, "opsSeen": 10_000, "opsIncluded": 10_000}]
        reply = conn.call("debug_bundler_setReputation", [record, entry_point])
    finally:
        conn.close()
    if reply.get("result") != "ok":
        raise RuntimeError(f"debug_bundler_setReputation: {reply}")


def external_chaingate(name: str, url: str, api_key: str | None) -> Target:
    target = Target(name, url, None, contextlib.ExitStack())
    if api_key:
        target.headers[procs.API_KEY_HEADER] = api_key
    return target


# --- measurements ---------------------------------------------------------------------------


@dataclass
class Measured:
    target: str
    version: Version
    probe_error: str | None = None
    send: bundlerload.SendResult | None = None
    cpu_s: float | None = None
    node_cpu_s: float | None = None  # the node's (anvil's) CPU during the load
    node_requests: int | None = None  # the bundler's requests to the node then (chaingate's)
    receipts: bundlerload.Receipts | None = None
    last_receipt_after_s: float | None = None
    latency: bundlerload.Latency | None = None

    @property
    def accepted(self) -> int:
        return 0 if self.send is None else len(self.send.accepted)

    @property
    def included(self) -> int:
        return 0 if self.receipts is None else len(self.receipts.seen)

    @property
    def failed_receipts(self) -> int:
        if self.receipts is None:
            return 0
        return sum(1 for ok in self.receipts.success.values() if not ok)

    @property
    def problems(self) -> list[str]:
        """What went wrong once the probe passed (a refused probe is a finding, not this)."""
        found = []
        if self.send is not None and self.send.errors:
            found.append(f"{sum(self.send.errors.values())} refused")
        if self.send is not None and self.included < self.accepted:
            found.append(f"{self.accepted - self.included} accepted but never included")
        if self.failed_receipts:
            found.append(f"{self.failed_receipts} receipts with success=false")
        if self.latency is not None:
            if self.latency.refused:
                found.append(f"{sum(self.latency.refused.values())} refused in the latency run")
            if self.latency.no_receipt or self.latency.failed:
                found.append("latency run: missing or failed receipts")
        return found


def _node_cpu(pid: int | None) -> float | None:
    return None if pid is None else tools.process_cpu_seconds(tools.process_tree(pid))


def measure(
    target: Target,
    version: Version,
    ops: list[BuiltOp],
    opts: Options,
    entry_point: str,
    node_pid: int | None = None,
) -> Measured:
    result = Measured(target.name, version)
    warm_end = 1 + opts.warmup
    probe, warm = ops[0], ops[1:warm_end]
    load, timed = ops[warm_end : warm_end + opts.ops], ops[warm_end + opts.ops :]
    conn = bundlerload.Connection(target.url, target.headers)
    try:
        sent = bundlerload.send_one(conn, probe, entry_point)
    finally:
        conn.close()
    if sent.error is not None:
        result.probe_error = sent.error
        say(f"[{target.name} v{version}] probe refused: {sent.error}")
        return result
    if warm:
        warmed = bundlerload.send_all(
            target.url, target.headers, warm, entry_point, opts.concurrency
        )
        bundlerload.poll_receipts(
            target.url,
            target.headers,
            [s.op.hash for s in warmed.accepted],
            timeout=RECEIPT_TIMEOUT,
        )
    requests = None if target.node_requests is None else target.node_requests()
    cpu, node_cpu = target.cpu_seconds(), _node_cpu(node_pid)
    result.send = bundlerload.send_all(
        target.url, target.headers, load, entry_point, opts.concurrency
    )
    after, node_after = target.cpu_seconds(), _node_cpu(node_pid)
    if target.node_requests is not None and requests is not None:
        result.node_requests = target.node_requests() - requests
    result.cpu_s = None if cpu is None or after is None else after - cpu
    if node_cpu is not None and node_after is not None:
        result.node_cpu_s = node_after - node_cpu
    hashes = [probe.hash] + [s.op.hash for s in result.send.accepted]
    result.receipts = bundlerload.poll_receipts(
        target.url, target.headers, hashes, timeout=RECEIPT_TIMEOUT
    )
    last_answer = max((s.answered for s in result.send.sent), default=None)
    if result.receipts.seen and last_answer is not None:
        result.last_receipt_after_s = max(result.receipts.seen.values()) - last_answer
    if timed:
        result.latency = bundlerload.latency_run(
            target.url,
            target.headers,
            timed,
            entry_point,
            workers=opts.latency_workers,
            timeout=RECEIPT_TIMEOUT,
        )
    _progress(result)
    return result


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f}"


def _progress(m: Measured) -> None:
    send = m.send
    if send is None:
        return
    answer_times = sorted(s.answered - s.started for s in send.sent)
    lat = m.latency.samples if m.latency is not None else []
    flag = f"  {report.FLAG} " + "; ".join(m.problems) if m.problems else ""
    say(
        f"[{m.target} v{m.version}] {m.accepted}/{len(send.sent)} accepted, "
        f"{send.rate:.1f} ops/s, answer p50 {_ms(bundlerload.percentile(answer_times, 0.5))} ms, "
        f"{m.included} included; latency p50 {_ms(bundlerload.percentile(lat, 0.5))} ms "
        f"p99 {_ms(bundlerload.percentile(lat, 0.99))} ms{flag}"
    )


# --- report ---------------------------------------------------------------------------------


@dataclass
class Results:
    header: dict[str, str]
    rows: list[Measured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def find(self, target: str, version: Version) -> Measured | None:
        return next((m for m in self.rows if m.target == target and m.version == version), None)

    @property
    def flagged(self) -> list[Measured]:
        return [m for m in self.rows if m.problems]


def _first_error(m: Measured) -> str:
    """The refusal in a table cell (no pipe: it would split the cell)."""
    if m.probe_error is not None:
        return f"probe refused: `{m.probe_error[:120]}`".replace("|", "/")
    if m.send is not None and m.send.errors:
        text, count = m.send.errors.most_common(1)[0]
        return f"{report.FLAG} {count} x `{text[:120]}`".replace("|", "/")
    return "-"


def render(res: Results) -> str:
    lines = [f"# chaingate bundler benchmark, {res.header.get('date', '')}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in res.header.items() if k != "date"]
    lines += [
        "",
        "## Accepted operations per second (eth_sendUserOperation, full validation)",
        "",
        "| target | EntryPoint | sent | accepted | accepted ops/s | answer p50 ms "
        "| answer p99 ms | server CPU ms/op | node CPU ms/op | node requests/op | included "
        "| failed receipts | last receipt after s | refused |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in res.rows:
        if m.send is None:
            lines.append(
                f"| {m.target} | v{m.version} | 1 | 0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a "
                f"| n/a | n/a | {_first_error(m)} |"
            )
            continue
        requests = (
            "n/a"
            if m.node_requests is None or not m.send.sent
            else f"{m.node_requests / len(m.send.sent):.2f}"
        )
        answers = sorted(s.answered - s.started for s in m.send.sent)
        cpu, node_cpu = (
            "n/a" if spent is None or not m.send.sent else f"{spent / len(m.send.sent) * 1000:.2f}"
            for spent in (m.cpu_s, m.node_cpu_s)
        )
        after = "n/a" if m.last_receipt_after_s is None else f"{m.last_receipt_after_s:.2f}"
        lines.append(
            f"| {m.target} | v{m.version} | {len(m.send.sent)} | {m.accepted} "
            f"| {m.send.rate:.1f} | {_ms(bundlerload.percentile(answers, 0.5))} "
            f"| {_ms(bundlerload.percentile(answers, 0.99))} | {cpu} | {node_cpu} | {requests} "
            f"| {m.included} "
            f"| {m.failed_receipts} | {after} | {_first_error(m)} |"
        )
    lines += [
        "",
        "Accepted ops/s: answers carrying the userOpHash computed locally, divided by the time "
        "from the first request to the last answer.  Server CPU: the bundler process (Alto's "
        "node, chaingate's process) during the load, per operation sent; node CPU: the node's "
        "(anvil, n/a for an external one) in the same window, its work for the bundler and "
        "for any other client.  Node requests: chaingate's upstream requests in that window "
        "(its /metrics; a batch counts once; the follower's polls and bundling's included), "
        "per operation sent; n/a for Alto.  Included: receipts "
        "found by `eth_getUserOperationReceipt` (probe operation included); last receipt after: "
        "from the last answer to the last receipt seen.",
        "",
        "## Submit-to-receipt latency",
        "",
        "| target | EntryPoint | samples | p50 ms | p99 ms | max ms | refused | no receipt |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in res.rows:
        if m.latency is None:
            continue
        s = m.latency.samples
        lines.append(
            f"| {m.target} | v{m.version} | {len(s)} | {_ms(bundlerload.percentile(s, 0.5))} "
            f"| {_ms(bundlerload.percentile(s, 0.99))} | {_ms(s[-1] if s else None)} "
            f"| {sum(m.latency.refused.values())} | {m.latency.no_receipt} |"
        )
    lines += ["", _ratios(res)]
    if res.notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in res.notes)]
    return "\n".join(lines) + "\n"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if not a or not b else f"{a / b:.2f}"


_pct = bundlerload.percentile


def _ratios(res: Results) -> str:
    lines = [
        "## Ratios chaingate/Alto",
        "",
        "| chaingate | Alto | EntryPoint | accepted ops/s | latency p50 | latency p99 |",
        "|---|---|---|---:|---:|---:|",
    ]
    verdicts = []
    for ours in CHAINGATE_TARGETS:
        for theirs in ALTO_TARGETS:
            for version in TAGS:
                a, b = res.find(ours, version), res.find(theirs, version)
                if a is None or b is None:
                    continue
                rate_a = a.send.rate if a.send else None
                rate_b = b.send.rate if b.send else None
                lat_a = a.latency.samples if a.latency else []
                lat_b = b.latency.samples if b.latency else []
                p50 = _ratio(_pct(lat_a, 0.5), _pct(lat_b, 0.5))
                p99 = _ratio(_pct(lat_a, 0.99), _pct(lat_b, 0.99))
                lines.append(
                    f"| {ours} | {theirs} | v{version} | {_ratio(rate_a, rate_b)} | {p50} | {p99} |"
                )
                if ours == "chaingate-safe" and theirs == "alto-unsafe" and rate_a and rate_b:
                    met = "MET" if rate_a >= rate_b else "NOT MET"
                    verdicts.append(
                        f"v{version}: chaingate safe {rate_a:.1f} ops/s, Alto unsafe "
                        f"{rate_b:.1f} ops/s: **{met}**"
                    )
    if not verdicts and len(lines) == 4:
        lines.append("| no chaingate target measured (`--target chaingate-safe`) | | | | | |")
    lines += [
        "",
        "Accepted ops/s above 1: chaingate accepts more operations per second; latency below "
        "1: chaingate's operations reach a receipt sooner.  n/a: a side was not measured (or "
        "refused the probe operation).",
    ]
    if verdicts:
        lines += [
            "",
            "Target (chaingate safe mode accepts at least as many operations per second as "
            "Alto's unsafe mode): " + "; ".join(verdicts) + ".",
        ]
    return "\n".join(lines)


# --- the run ----------------------------------------------------------------------------------


def bench(opts: Options, stack: contextlib.ExitStack, busy: float | None) -> Results:
    workdir = Path(tempfile.mkdtemp(prefix="chaingate-bench-bundler-"))
    stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    node_pid: int | None = None  # the node whose CPU is reported: ours, not an external one
    if opts.node is not None and opts.manifest is not None:
        node, manifest = opts.node, load_manifest(opts.manifest)
        manifest_path = opts.manifest
        anvil_version = "external node"
    else:
        anvil = AnvilProcess()
        stack.callback(anvil.stop)
        anvil.start()
        node_pid = anvil.pid
        anvil_version = tools.anvil_version(anvil_binary(install=False))
        say(f"anvil {anvil_version} on :{anvil.port}")
        node = anvil.url
        manifest = bootstrap_devnet(
            node, paymaster_signer=PrivateKey.generate().address, announce=say
        )
        manifest_path = workdir / "devnet-manifest.json"
        manifest_path.write_bytes(dumps(manifest))
    chain_id = int(str(rpc_call(node, "eth_chainId")), 16)
    if any(t in ALTO_TARGETS for t in opts.targets):
        alto.install()
    owner = PrivateKey.generate()
    res = Results(header(opts, busy, anvil_version))
    for name in opts.targets:
        ops = {
            version: build_ops(
                node,
                manifest,
                version,
                owner,
                [
                    secrets.randbits(128)
                    for _ in range(1 + opts.warmup + opts.ops + opts.latency_ops)
                ],
                deploy=opts.deploy,
                chain_id=chain_id,
            )
            for version in opts.versions
        }
        if name in ALTO_TARGETS:
            target = start_alto(name, node, manifest, workdir)
        elif opts.chaingate_url:
            target = external_chaingate(name, opts.chaingate_url, opts.api_key)
        else:
            target = start_chaingate(name, node, manifest_path, workdir)
        say(f"{name} at {target.url}")
        try:
            for version in opts.versions:
                entry_point = manifest.address(f"entry_point_{TAGS[version]}")
                if opts.deploy and name in CHAINGATE_TARGETS and not opts.chaingate_url:
                    factory = manifest.address(f"simple_account_factory_{TAGS[version]}")
                    give_record(target, factory, entry_point)
                res.rows.append(measure(target, version, ops[version], opts, entry_point, node_pid))
        finally:
            target.stop()
    refused = [m for m in res.rows if m.probe_error is not None]
    for m in refused:
        res.notes.append(f"{m.target} refused v{m.version}'s probe operation: {m.probe_error}")
    return res


def header(opts: Options, busy: float | None, anvil_version: str) -> dict[str, str]:
    kind = "deploys its account (initCode)" if opts.deploy else "of an account deployed before"
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": tools.machine_summary(),
        "background": report.quietness(busy),
        "targets": ", ".join(opts.targets),
        "Alto": f"@pimlico/alto {alto.ALTO_VERSION} (Node {_node_version()}), defaults but "
        "`--log-level warn`, one executor key",
        "chaingate": (
            f"`{opts.chaingate_url}` (external)"
            if opts.chaingate_url
            else "one `chaingate serve` process, API keys off, follower polling every "
            f"{FOLLOWER_POLL * 1000:.0f} ms, `[bundler] safe_mode` per target"
        ),
        "operations": f"SimpleAccount, one distinct sender per operation, each the first "
        f"operation {kind}, sending 1 wei; gas limits fixed, fees 2 x base fee + 2 gwei"
        + (
            "; the factory given a record in chaingate first (10,000 seen and included: "
            "UREP-020 allows an unknown unstaked factory 10 operations)"
            if opts.deploy and not opts.chaingate_url
            else ""
        ),
        "how measured": (
            f"per target and EntryPoint ({', '.join('v' + v for v in opts.versions)}): 1 probe, "
            + (f"{opts.warmup} unmeasured (warm-up), " if opts.warmup else "")
            + f"{opts.ops} operations at concurrency {opts.concurrency}, then {opts.latency_ops} "
            f"by {opts.latency_workers} sequential clients polling receipts every "
            f"{bundlerload.POLL_INTERVAL * 1000:.0f} ms; on {os.cpu_count()} cores shared by "
            "the client, the bundler and anvil" + (" (--smoke)" if opts.smoke else "")
        ),
        "versions": f"anvil {anvil_version}, Python {platform.python_version()}",
    }


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "missing"
    return tools._first_line([node, "--version"]).lstrip("v")


def write(res: Results, out: Path) -> None:
    text = render(res)
    say("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    say(f"report written to {out}")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    started = time.monotonic()
    outcome = runner.guarded(
        lambda stack, busy: bench(opts, stack, busy),
        (procs.ServerFailed, RuntimeError, OSError),
    )
    if isinstance(outcome, int):
        return outcome
    res = outcome.result
    res.header["background"] = outcome.background
    res.notes.append(f"whole run took {time.monotonic() - started:.0f} s")
    write(res, opts.out)
    if res.flagged:
        say(f"{report.FLAG} {len(res.flagged)} measurement(s) lost or refused operations")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
