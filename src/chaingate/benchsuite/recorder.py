"""Every request's outcome and latency, per target, per second and per request name.

One ``Recorder`` per process.  A locust worker drains its recorder into each report it sends
the master, which absorbs them: the master's recorder then holds the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chaingate.benchsuite import outcomes
from chaingate.benchsuite.histogram import Histogram

SAMPLES_KEPT = 5  # example messages kept per (target, outcome) for the report
CHECKS_KEPT = 200  # distinct check results kept (a failing scenario repeats itself)


@dataclass
class Tally:
    """Requests of one slice (a second, or a request name) of one target."""

    requests: int = 0
    calls: int = 0  # JSON-RPC calls: a batch of 20 is one request and 20 calls
    outcomes: dict[str, int] = field(default_factory=dict)
    latency: Histogram = field(default_factory=Histogram)  # answered requests (OK) only

    def add(self, outcome: str, ms: float, calls: int) -> None:
        self.requests += 1
        self.calls += calls
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if outcome == outcomes.OK:
            self.latency.add(ms)

    def merge(self, other: Tally) -> None:
        self.requests += other.requests
        self.calls += other.calls
        for kind, n in other.outcomes.items():
            self.outcomes[kind] = self.outcomes.get(kind, 0) + n
        self.latency.merge(other.latency)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "calls": self.calls,
            "outcomes": dict(self.outcomes),
            "latency": self.latency.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tally:
        return cls(
            requests=int(data["requests"]),
            calls=int(data["calls"]),
            outcomes={str(k): int(v) for k, v in data["outcomes"].items()},
            latency=Histogram.from_dict(data["latency"]),
        )


@dataclass
class TargetRecord:
    seconds: dict[int, Tally] = field(default_factory=dict)  # by wall-clock second
    names: dict[str, Tally] = field(default_factory=dict)  # by request name (method, route)
    samples: dict[str, list[str]] = field(default_factory=dict)  # failure messages, by outcome
    setup_requests: int = 0  # sent before the load (sampling, preflight checks)
    setup_calls: int = 0

    def merge(self, other: TargetRecord) -> None:
        for second, tally in other.seconds.items():
            self.seconds.setdefault(second, Tally()).merge(tally)
        for name, tally in other.names.items():
            self.names.setdefault(name, Tally()).merge(tally)
        for kind, messages in other.samples.items():
            kept = self.samples.setdefault(kind, [])
            kept.extend(messages[: SAMPLES_KEPT - len(kept)])
        self.setup_requests += other.setup_requests
        self.setup_calls += other.setup_calls

    def total(self) -> Tally:
        whole = Tally()
        for tally in self.names.values():
            whole.merge(tally)
        return whole


class Recorder:
    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self.targets: dict[str, TargetRecord] = {}
        self.checks: list[dict[str, Any]] = []  # correctness checks made before the load
        self.notes: dict[str, str] = {}  # what the scenario found (parameters drawn, skips)
        # Setup requests are per process; a distributed run's workers each make their own:
        # (requests, calls) by source, then target, as each source last reported them.
        self.setup_by_source: dict[str, dict[str, tuple[int, int]]] = {}

    def record(
        self, target: str, name: str, outcome: str, ms: float, calls: int = 1, detail: str = ""
    ) -> None:
        record = self.targets.setdefault(target, TargetRecord())
        second = int(self._clock())
        record.seconds.setdefault(second, Tally()).add(outcome, ms, calls)
        record.names.setdefault(name, Tally()).add(outcome, ms, calls)
        if outcome != outcomes.OK and detail:
            kept = record.samples.setdefault(outcome, [])
            if len(kept) < SAMPLES_KEPT:
                kept.append(f"{name}: {detail}"[:300])

    def setup_request(self, target: str, calls: int = 1) -> None:
        record = self.targets.setdefault(target, TargetRecord())
        record.setup_requests += 1
        record.setup_calls += calls

    def check(self, check: str, target: str, ok: bool, detail: str = "") -> None:
        entry = {"check": check, "target": target, "ok": ok, "detail": detail[:300]}
        if entry not in self.checks and len(self.checks) < CHECKS_KEPT:
            self.checks.append(entry)

    def drain(self) -> dict[str, Any]:
        """Everything recorded since the last drain, as plain data; the recorder starts over
        (except the setup counts, which are sent again and taken once per source)."""
        data = {
            "targets": {name: _record_to_dict(record) for name, record in self.targets.items()},
            "checks": self.checks,
            "notes": self.notes,
        }
        self.checks = []
        for record in self.targets.values():
            record.seconds.clear()
            record.names.clear()
            record.samples.clear()
        return data

    def absorb(self, source: str, data: Mapping[str, Any]) -> None:
        for note, text in data["notes"].items():
            self.notes.setdefault(note, text)
        for check in data["checks"]:  # every worker makes the same checks: kept once
            self.check(check["check"], check["target"], check["ok"], check["detail"])
        for name, raw in data["targets"].items():
            record = _record_from_dict(raw)
            setup = (record.setup_requests, record.setup_calls)
            self.setup_by_source.setdefault(source, {})[name] = setup
            record.setup_requests = record.setup_calls = 0
            self.targets.setdefault(name, TargetRecord()).merge(record)

    def setup(self, target: str) -> tuple[int, int]:
        """(requests, calls) sent before the load by every process (this one, each worker)."""
        record = self.targets.get(target, TargetRecord())
        requests, calls = record.setup_requests, record.setup_calls
        for counts in self.setup_by_source.values():
            more = counts.get(target, (0, 0))
            requests, calls = requests + more[0], calls + more[1]
        return requests, calls


def _record_to_dict(record: TargetRecord) -> dict[str, Any]:
    return {
        "seconds": {str(s): t.to_dict() for s, t in record.seconds.items()},
        "names": {n: t.to_dict() for n, t in record.names.items()},
        "samples": {k: list(v) for k, v in record.samples.items()},
        "setup_requests": record.setup_requests,
        "setup_calls": record.setup_calls,
    }


def _record_from_dict(data: Mapping[str, Any]) -> TargetRecord:
    return TargetRecord(
        seconds={int(s): Tally.from_dict(t) for s, t in data["seconds"].items()},
        names={str(n): Tally.from_dict(t) for n, t in data["names"].items()},
        samples={str(k): [str(m) for m in v] for k, v in data["samples"].items()},
        setup_requests=int(data["setup_requests"]),
        setup_calls=int(data["setup_calls"]),
    )
