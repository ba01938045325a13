"""The markdown report: header, results table, ratios, the latency target, chaingate counters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from benchkit import tools
from benchkit.scenarios import (
    BASELINE,
    CHAINGATE,
    DIRECT,
    LATENCY_TARGET_MS,
    NGINX,
    PACED_TOLERANCE,
    Scenario,
)
from benchkit.wrkload import WrkResult

FLAG = "⚠"
BUSY_WARNING = 0.10  # share of CPU busy (before or during a run) above which a report warns


def quietness(before: float | None, during: float | None = None) -> str:
    """How much CPU other people's work took, before the bench started and while it ran."""
    parts = [
        "before start: " + ("unknown" if before is None else f"{before:.0%} CPU busy over 1 s"),
        "during the run: "
        + (
            "not measured yet"
            if during is None
            else f"{during:.0%} of all CPU used by processes outside the bench"
        ),
        f"load average at the end {tools.load_average()}",
    ]
    text = "; ".join(parts)
    if max(before or 0.0, during or 0.0) > BUSY_WARNING:
        text = f"{FLAG} **{text}: other work was running, numbers are unreliable**"
    return text


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    target: str
    result: WrkResult
    warmup_errors: int = 0
    # CPU time the serving process (chaingate; nginx's master+worker; anvil for "direct")
    # spent per request: the per-core cost, robust to what else shares the machine.
    cpu_us: float | None = None

    @property
    def errors(self) -> int:
        return self.result.errors + self.warmup_errors

    def errors_cell(self) -> str:
        if not self.errors:
            return "0"
        text = f"{FLAG} **{self.result.errors}** ({self.result.error_detail()})"
        if self.warmup_errors:
            text += f" +{self.warmup_errors} in warm-up"
        return text


@dataclass(frozen=True)
class Paced:
    """One paced scenario's runs: its rate is a share of chaingate's ``peak`` row."""

    scenario: Scenario
    peak: Row
    target_rps: float
    rows: dict[str, Row]  # by target: chaingate (the baseline), nginx and direct
    pace_ms: dict[str, float]


@dataclass(frozen=True)
class Traffic:
    """What chaingate did during one measured run (deltas of its /metrics counters)."""

    label: str
    client_requests: int
    rpc_calls: int
    upstream_requests: int
    coalesced: int
    cache_hits: int


@dataclass
class Report:
    header: dict[str, str]
    rows: list[Row] = field(default_factory=list)
    paced: list[Paced] = field(default_factory=list)
    traffic: list[Traffic] = field(default_factory=list)
    metrics: dict[str, str] = field(default_factory=dict)  # process name -> filtered /metrics
    notes: list[str] = field(default_factory=list)
    workers: dict[str, int] = field(default_factory=dict)  # chaingate target -> its workers

    def find(self, key: str, target: str) -> Row | None:
        return next((r for r in self.rows if r.scenario.key == key and r.target == target), None)

    @property
    def flagged(self) -> list[Row]:
        return [row for row in self.rows if row.errors]

    def render(self) -> str:
        parts = [
            _header(self.header),
            _table(self.rows),
            _ratios(self),
            _workers(self),
            _paced(self.paced),
            _traffic(self.traffic),
            _metrics(self.metrics),
        ]
        if self.notes:
            parts.append("## Notes\n\n" + "\n".join(f"- {note}" for note in self.notes))
        return "\n\n".join(part for part in parts if part) + "\n"


def _header(header: dict[str, str]) -> str:
    lines = [f"# chaingate benchmark, {header.get('date', '')}", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in header.items() if key != "date"]
    return "\n".join(lines)


def _table(rows: list[Row]) -> str:
    lines = [
        "## Results",
        "",
        "| scenario | target | req/s | p50 ms | p99 ms | server CPU µs/req | errors |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        r = row.result
        cpu = "n/a" if row.cpu_us is None else f"{row.cpu_us:.1f}"
        lines.append(
            f"| {row.scenario.label} | {row.target} | {r.rps:.0f} | {r.p50_ms:.3f} "
            f"| {r.p99_ms:.3f} | {cpu} | {row.errors_cell()} |"
        )
    flagged = [row for row in rows if row.errors]
    if flagged:
        lines += [
            "",
            f"{FLAG} {len(flagged)} row(s) had errors: their req/s counts failed requests too "
            "and must not be compared.",
        ]
    lines += [
        "",
        "server CPU µs/req: CPU time of the process answering (chaingate alone; nginx alone, "
        "not the node behind it; anvil for direct) divided by the requests answered.",
    ]
    lines += ["", "Scenario notes:", ""]
    seen: set[str] = set()
    for row in rows:
        if row.scenario.key not in seen and row.scenario.note:
            seen.add(row.scenario.key)
            lines.append(f"- {row.scenario.label}: {row.scenario.note}")
    return "\n".join(lines)


def _ratio(chaingate: Row | None, other: Row | None) -> str:
    if chaingate is None or other is None or not other.result.rps:
        return "n/a"
    text = f"{chaingate.result.rps / other.result.rps:.2f}"
    return f"{FLAG} {text} (errors)" if chaingate.errors or other.errors else text


def _cpu_ratio(chaingate: Row | None, other: Row | None) -> str:
    if chaingate is None or other is None or not chaingate.cpu_us or not other.cpu_us:
        return "n/a"
    return f"{chaingate.cpu_us / other.cpu_us:.2f}"


def _workers(report: Report) -> str:
    """--workers with more than one count: each chaingate against nginx and the node."""
    if len(report.workers) < 2:
        return ""
    lines = [
        "## Workers",
        "",
        "| scenario | chaingate | workers | req/s | req/s /nginx | req/s /direct "
        "| CPU µs/req | CPU per request /nginx |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    seen: list[Scenario] = []
    for row in report.rows:
        if row.scenario not in seen and row.target in report.workers:
            seen.append(row.scenario)
    for scenario in seen:
        nginx, direct = report.find(scenario.key, NGINX), report.find(scenario.key, DIRECT)
        for target, count in report.workers.items():
            ours = report.find(scenario.key, target)
            if ours is None:
                continue
            cpu = "n/a" if ours.cpu_us is None else f"{ours.cpu_us:.1f}"
            lines.append(
                f"| {scenario.label} | {target} | {count} | {ours.result.rps:.0f} "
                f"| {_ratio(ours, nginx)} | {_ratio(ours, direct)} | {cpu} "
                f"| {_cpu_ratio(ours, nginx)} |"
            )
    lines += [
        "",
        "CPU µs/req of a chaingate with several workers: its whole process tree (the "
        "supervisor and every worker) divided by the requests answered.",
    ]
    return "\n".join(lines)


def _ratios(report: Report) -> str:
    lines = [
        "## Ratios",
        "",
        "| scenario | req/s chaingate/nginx | req/s chaingate/direct "
        "| CPU per request chaingate/nginx |",
        "|---|---:|---:|---:|",
    ]
    seen: list[Scenario] = []
    for row in report.rows:
        if row.scenario not in seen and row.scenario.paces is None:
            seen.append(row.scenario)
    for scenario in seen:
        ours = report.find(scenario.key, CHAINGATE)
        # (a') has no nginx/direct rows of its own: it is compared with (a)'s.
        base = "block" if scenario.key == "block-nocoalesce" else scenario.key
        nginx, direct = report.find(base, NGINX), report.find(base, DIRECT)
        lines.append(
            f"| {scenario.label} | {_ratio(ours, nginx)} | {_ratio(ours, direct)} "
            f"| {_cpu_ratio(ours, nginx)} |"
        )
    lines += [
        "",
        "Above 1: chaingate serves more requests per second than that target with the same "
        "wrk load; below 1: fewer.  chaingate/direct above 1 is possible only where chaingate "
        "answers without asking the node for every request (cache, coalescing).  CPU per "
        "request below 1: chaingate spends less CPU than nginx to answer one request.",
    ]
    against = [
        (scenario, report.find(scenario.key, CHAINGATE), report.find(scenario.key, BASELINE))
        for scenario in seen
    ]
    if any(theirs is not None for _, _, theirs in against):
        lines += [
            "",
            f"## Against the baseline ({report.header.get('baseline', 'another build')})",
            "",
            "| scenario | req/s chaingate/baseline | CPU per request chaingate/baseline "
            "| req/s chaingate/nginx | req/s baseline/nginx |",
            "|---|---:|---:|---:|---:|",
        ]
        for scenario, ours, theirs in against:
            if theirs is None:
                continue
            nginx = report.find(scenario.key, NGINX)
            lines.append(
                f"| {scenario.label} | {_ratio(ours, theirs)} | {_cpu_ratio(ours, theirs)} "
                f"| {_ratio(ours, nginx)} | {_ratio(theirs, nginx)} |"
            )
        lines += [
            "",
            "Both builds answer the same wrk load in the same run, one right after the other; "
            "each one's ratio to nginx (measured in the same scenario) shows how much of a "
            "difference between them is the machine's drift.",
        ]
    return "\n".join(lines)


def _paced(paced: list[Paced]) -> str:
    if not paced:
        return ""
    lines = ["## Latency target: p99 added latency over direct <= 1 ms at half of chaingate's peak"]
    for one in paced:
        lines += ["", _paced_one(one)]
    return "\n".join(lines)


def _paced_one(paced: Paced) -> str:
    peak = paced.peak
    share = paced.target_rps / peak.result.rps if peak.result.rps else 0.0
    lines = [
        f"### {paced.scenario.label}",
        "",
        f"Target rate: {paced.target_rps:.0f} req/s ({share:.0%} of chaingate's "
        f"{peak.scenario.label} peak, {peak.result.rps:.0f} req/s).",
        "",
        "| target | achieved req/s | vs target | mean delay/conn ms | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for target, row in paced.rows.items():
        r = row.result
        off = r.rps / paced.target_rps - 1 if paced.target_rps else 0.0
        mark = f" {FLAG}" if abs(off) > PACED_TOLERANCE else ""
        lines.append(
            f"| {target} | {r.rps:.0f} | {off:+.1%}{mark} | {paced.pace_ms[target]:.2f} "
            f"| {r.p50_ms:.3f} | {r.p99_ms:.3f} | {row.errors_cell()} |"
        )
    ours, direct = paced.rows.get(CHAINGATE), paced.rows.get(DIRECT)
    if ours and direct:
        added = ours.result.p99_ms - direct.result.p99_ms
        added50 = ours.result.p50_ms - direct.result.p50_ms
        verdict = (
            "MET"
            if added <= LATENCY_TARGET_MS and not (ours.errors or direct.errors)
            else "NOT MET"
        )
        lines += [
            "",
            f"**p99 added latency: {added:+.3f} ms** (p50 added: {added50:+.3f} ms); "
            f"target <= {LATENCY_TARGET_MS:.0f} ms: **{verdict}**.",
        ]
        others = [
            f"{name} {other.result.p99_ms - direct.result.p99_ms:+.3f} ms "
            f"(p50 {other.result.p50_ms - direct.result.p50_ms:+.3f} ms)"
            for name in (BASELINE, NGINX)
            if (other := paced.rows.get(name)) is not None
        ]
        if others:
            lines += ["", "p99 added at the same rate by " + ", ".join(others) + "."]
    return "\n".join(lines)


def _traffic(traffic: list[Traffic]) -> str:
    if not traffic:
        return ""
    lines = [
        "## What chaingate did per measured run (/metrics deltas)",
        "",
        "| run | HTTP requests | JSON-RPC calls | upstream requests | coalesced | cache hits |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {t.label} | {t.client_requests} | {t.rpc_calls} | {t.upstream_requests} "
        f"| {t.coalesced} | {t.cache_hits} |"
        for t in traffic
    ]
    lines += [
        "",
        "Upstream requests include chaingate's own head probes (one per second); a batch sent "
        "upstream counts once.",
    ]
    return "\n".join(lines)


def _metrics(metrics: dict[str, str]) -> str:
    if not metrics:
        return ""
    lines = ["## chaingate counters at the end (/metrics)"]
    for name, text in metrics.items():
        lines += ["", f"{name}:", "", "```", text.rstrip(), "```"]
    return "\n".join(lines)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
RECORDED = (
    "chaingate_rpc_cache_hits_total",
    "chaingate_rpc_cache_lookups_total",
    "chaingate_rpc_coalesced_total",
    "chaingate_upstream_requests_total",
    "chaingate_upstream_errors_total",
    "chaingate_http_requests_total",
)


def samples(text: str) -> list[tuple[str, str, float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            found.append((match.group(1), match.group(2) or "", float(match.group(3))))
    return found


def total(text: str, name: str, label_filter: str = "") -> int:
    return int(sum(v for n, labels, v in samples(text) if n == name and label_filter in labels))


def recorded_metrics(text: str) -> str:
    """The counters worth keeping in the report, plus every call that ended in an error."""
    keep = []
    for name, labels, value in samples(text):
        errors = name == "chaingate_rpc_calls_total" and 'outcome="error"' in labels
        if name in RECORDED or errors:
            number = int(value) if value.is_integer() else value
            keep.append(f"{name}{labels} {number}")
    return "\n".join(keep)
