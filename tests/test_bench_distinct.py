"""The bench's real-traffic scenarios (``bench/run.py --scenarios distinct-...``): what they send.

The templates are built from a chain description (no node needed); the Lua script is run by the
real wrk against a small HTTP server that records what it receives, for one second.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import run  # noqa: E402
from benchkit import distinct  # noqa: E402
from benchkit.wrkload import Wrk, WrkResult  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"


def _chain(transfers: int = 2_000) -> distinct.Chain:
    holders = tuple(distinct.holder(i) for i in range(distinct.HOLDERS))
    made = tuple(
        distinct.Transfer("0x" + f"{i:064x}", 100 + i // distinct.PER_BLOCK, holders[i])
        for i in range(transfers)
    )
    return distinct.Chain(holders, ("0x" + "aa" * 20, "0x" + "bb" * 20), made)


def _calls(template: str, first_id: int = 1) -> list[dict[str, Any]]:
    request = json.loads(distinct.render(template, first_id))
    return request if isinstance(request, list) else [request]


def test_every_request_of_a_kind_differs() -> None:
    chain = _chain()
    for kind, count in (("balance", 10_000), ("call", 10_000), ("receipt", 2_000), ("logs", 2_000)):
        lines = distinct.templates(chain, kind)
        assert len(lines) == count
        params = [json.dumps(_calls(line)[0]["params"]) for line in lines]
        assert len(set(params)) == count, f"{kind}: some requests are alike"
    logs = [_calls(line)[0]["params"][0] for line in distinct.templates(chain, "logs")]
    spans = {int(f["toBlock"], 16) - int(f["fromBlock"], 16) for f in logs}
    assert spans <= set(range(7)) and len(spans) > 3, f"log ranges not varied: {spans}"


def test_the_mix_keeps_its_weights_and_batches_hold_twenty_ids() -> None:
    chain = _chain()
    methods = collections.Counter(
        _calls(line)[0]["method"] for line in distinct.templates(chain, "mix")
    )
    total = sum(distinct.MIX_WEIGHTS.values())
    by_method = dict(
        zip(distinct.MIX_WEIGHTS, ("eth_getBalance", "eth_call", "eth_getTransactionReceipt",
                                   "eth_getLogs"), strict=True)
    )  # fmt: skip
    for kind, weight in distinct.MIX_WEIGHTS.items():
        share = methods[by_method[kind]] / 10_000
        assert abs(share - weight / total) < 0.02, f"{kind}: {share:.3f} of the mix"
    batches = distinct.templates(chain, "batch")
    assert len(batches) == 500
    calls = _calls(batches[0], 41)
    assert [call["id"] for call in calls] == list(range(41, 61))
    assert len({json.dumps(call["params"]) for call in calls}) == distinct.BATCH_SIZE


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without TCP_NODELAY the second waits for the client's
    # delayed ACK (~40 ms), and an unpaced load would look paced.
    disable_nagle_algorithm = True
    seen: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(body)
        request = json.loads(body)
        # The 7th request's answer is null: the script must count it as an error.
        result = None if len(self.seen) == 7 else "0x1"
        answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        assert request

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[bytes]]]:
    seen: list[bytes] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _wrk() -> str:
    """wrk's path; a missing wrk skips the test (fails it under CI)."""
    binary = shutil.which("wrk")
    if binary is None:
        if IN_CI:
            pytest.fail("wrk missing (CI=true: a missing tool is a broken CI image)")
        pytest.skip("!!! wrk missing; install with `apt-get install -y wrk` !!!")
    return binary


@pytest.mark.bench
def test_wrk_sends_the_templates_in_turn_each_with_its_own_id(
    tmp_path: Path, recorder: tuple[str, list[bytes]]
) -> None:
    binary = _wrk()
    url, seen = recorder
    lines = distinct.templates(_chain(transfers=3), "receipt")
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    wrk = Wrk(binary, tmp_path, connections=1, headers=(("X-API-Key", "k"),))
    result = wrk.run(url, b"", 1, requests=path)
    assert result.requests >= 7 and len(seen) >= result.requests
    assert result.rpc_errors == 1, "a null result must count as an error"
    calls = [json.loads(body) for body in seen[: result.requests]]
    # wrk builds one request before the load (to learn whether the script's are all alike),
    # so the first sent may be the second: ids and templates go on in turn from there.
    first = calls[0]["id"]
    assert [call["id"] for call in calls] == list(range(first, first + len(calls)))
    known = [t.tx_hash for t in _chain(transfers=3).transfers]
    turns = [known.index(call["params"][0]) for call in calls]
    assert turns == [(turns[0] + k) % 3 for k in range(len(calls))]


def test_workers_option() -> None:
    assert run.parse_args(["--workers", "1,2"]).workers == (1, 2)
    assert run.parse_args(["--workers", "2"]).shared
    assert not run.parse_args([]).shared
    for bad in ("0", "2,2", "x"):
        with pytest.raises(SystemExit):
            run.parse_args(["--workers", bad])


def test_rounds_option_keeps_each_targets_median_run(tmp_path: Path) -> None:
    from benchkit import scenarios

    assert run.parse_args(["--rounds", "3"]).rounds == 3
    assert run.parse_args(["--rounds", "3", "--smoke"]).rounds == 1
    for bad in ("0", "x"):
        with pytest.raises(SystemExit):
            run.parse_args(["--rounds", bad])
    scenario = scenarios.build_distinct(_chain(), tmp_path)["distinct-balance"]
    rows = [
        run.Row(scenario, target, WrkResult(requests, 1.0, 0, 0, 0, 0, 0, 0, 0, 0))
        for target, requests in [
            ("chaingate", 30), ("baseline", 10), ("nginx", 5),
            ("baseline", 20), ("chaingate", 10), ("nginx", 7),
            ("chaingate", 20), ("baseline", 30), ("nginx", 6),
            ("chaingate", 40),
        ]
    ]  # fmt: skip
    medians = run._medians(rows)
    # One row per target, in the order first measured; of four runs, the lower middle one.
    assert [(row.target, row.result.requests) for row in medians] == [
        ("chaingate", 20),
        ("baseline", 20),
        ("nginx", 6),
    ]


@pytest.mark.bench
def test_a_paced_distinct_load_waits_between_its_distinct_requests(
    tmp_path: Path, recorder: tuple[str, list[bytes]]
) -> None:
    """The paced-distinct-... scenarios: the same templates in turn, each id its own, but each
    connection waits its delay (mean 100 ms) before each: a dozen requests in a second where an
    unpaced connection sends hundreds."""
    binary = _wrk()
    url, seen = recorder
    chain = _chain(transfers=3)
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(distinct.templates(chain, "receipt")) + "\n")
    wrk = Wrk(binary, tmp_path, connections=1)
    result = wrk.run(url, b"", 1, pace_ms=100.0, requests=path)
    assert 3 <= result.requests <= 40, f"{result.requests} requests in 1 s at 100 ms apart"
    calls = [json.loads(body) for body in seen[: result.requests]]
    first = calls[0]["id"]
    assert [call["id"] for call in calls] == list(range(first, first + len(calls)))
    known = [t.tx_hash for t in chain.transfers]
    turns = [known.index(call["params"][0]) for call in calls]
    assert turns == [(turns[0] + k) % 3 for k in range(len(calls))]


def test_each_distinct_scenario_has_a_paced_twin(tmp_path: Path) -> None:
    from benchkit import scenarios

    catalogue = scenarios.build_distinct(_chain(), tmp_path)
    for key in run.DISTINCT:
        paced, of = catalogue[f"paced-{key}"], catalogue[key]
        assert paced.paces == of and of.paces is None
        assert paced.requests == of.requests and paced.body == of.body
        assert paced.targets == scenarios.PACED_TARGETS
        prefix = of.label.split(" ", 1)[0]
        assert paced.label.startswith(f"(e-{prefix[1:]}") and f"of {prefix} peak" in paced.label
    # A paced scenario runs after its own, whose chaingate row gives the peak.
    chosen = run.parse_args(["--scenarios", "paced-distinct-mix,distinct-mix"]).scenarios
    assert chosen == ("distinct-mix", "paced-distinct-mix")
