"""The fast lane's twins answer alike: the same requests, byte for byte, with the same books.

Each scenario runs on the compiled and the pure lane (``_native/fastlane`` and
``_pure/fastlane``) with real parts around them — requests framed by the http1 twin, the method
table of config/methods.toml, the key gate's admission with real token buckets, a real access
log — and a recorder where the edge loop (the sink) and the upstream (flights) would be.  What
each lane answered, delivered, sent upstream, counted and logged must be equal, and the
scenarios also check what that is, so that two twins wrong in the same way still fail.
"""

from __future__ import annotations

import functools
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate import twins as impl_module
from chaingate.auth import allowlists
from chaingate.auth.gate import Principal
from chaingate.auth.keygate import KeyGate
from chaingate.edge import cors
from chaingate.envelope import error_body
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import LatencyHistogram
from chaingate.obs.sink import LogSink
from chaingate.redaction import loggable_path
from chaingate.rpc import resultblocks
from chaingate.rpc.methods import MethodTable

PATH = b"/v1/rpc/ethereum/devnet"
METHODS = MethodTable.load(Path(__file__).resolve().parents[1] / "config" / "methods.toml")
KEY = b"svc_test_" + b"k" * 43
REFUSALS = {
    "too_large": b'{"code":-32005,"message":"too large"}',
    "too_large_write": b'{"code":-32005,"message":"too large, may have run"}',
    "busy": b'{"code":-32005,"message":"busy"}',
    "busy_write": b'{"code":-32005,"message":"busy, may have run"}',
}


def _twins() -> list[impl_module.Impl]:
    try:
        return [impl_module.compiled(), impl_module.pure()]
    except ImportError:
        pytest.skip("compiled modules not built (run `pip install -e .`)")


@dataclass
class Recorder:
    delivered: list[tuple[Any, int, bytes, bytes]] = field(default_factory=list)
    groups: list[list[Any]] = field(default_factory=list)

    def deliver(self, conn: Any, request: Any, status: int, headers: bytes, body: bytes) -> None:
        self.delivered.append((conn, status, headers, body))


class Lane:
    """One twin's lane with everything around it."""

    def __init__(
        self,
        impl: impl_module.Impl,
        *,
        keys: bool = False,
        rps: int = 0,
        max_answer: int = 1 << 20,
        budget: int = 1 << 30,
        scopes: frozenset[str] | None = None,
        sticky: Any = None,
        logs: tuple[int, int] | None = None,
        head: int | None = None,
        plan_blocks: int = 0,
    ) -> None:
        fastlane = impl.fastlane
        self.impl = impl
        self.recorder = Recorder()
        self.route = fastlane.Route(
            "ethereum/devnet",
            "evm",
            True,
            METHODS.family("evm"),
            None,
            fastlane.ResponseCache(1000, 1 << 20),
            impl.jsonrpc,
            max_batch=1000,
            max_answer=max_answer,
            coalesce=True,
            upstream_batch=10,
            refusals=REFUSALS,
            python_methods=frozenset() if logs is not None else frozenset({"eth_getLogs"}),
            sticky=sticky,
            sticky_methods=frozenset({"eth_getTransactionCount"}),
            logs=logs,
            watched=frozenset({"eth_blockNumber"}),
        )
        self.route.logs_head = lambda: head
        self.route.budget = fastlane.AnswerBudget(budget)
        self.route.dispatch = self.recorder.groups.append
        self.log_stream = io.BytesIO()
        self.access_log = AccessLog(sink=LogSink(self.log_stream))
        self.latency = LatencyHistogram()
        self.statuses: dict[str, Any] = {"rpc": _counter(), "other": _counter()}
        ledger = fastlane.Ledger(
            self.statuses, {"rpc": self.latency.series("rpc")}, self.access_log
        )
        self.principal = Principal(
            key_id="k1", account_id="a1", prefix="svc_test_k", logs_range=plan_blocks
        )
        if keys:
            limiter = impl.limiter
            self.principal = Principal(
                key_id="k1",
                account_id="a1",
                prefix="svc_test_k",
                environment="test",
                scopes=scopes if scopes is not None else frozenset({"rpc:read", "rpc:write"}),
                limiter=limiter.KeyLimiter(rps, 0, 0.0),
                quota=limiter.DayQuota(0, 0),
                limits_rps=rps,
                logs_range=plan_blocks,
            )
            registry = SimpleNamespace(recent={KEY: self.principal}, used=set())
            self.gate = KeyGate(registry, impl.limiter, fastlane)  # type: ignore[arg-type]
            admission = self.gate.admission
        else:
            admission = fastlane.OpenAdmission(self.principal)
        self.lane = fastlane.Lane(
            {PATH: self.route, PATH + b"/": self.route},
            admission,
            ledger,
            fastlane.RequestIds(b"test"),
            cors.answer_headers,
            error_body,
            loggable_path,
        )
        self.lane.sink = self.recorder
        self.timed: dict[tuple[str, str, str], int] = {}  # drained latency samples

    def timed_requests(self) -> dict[tuple[str, str, str], int]:
        """Requests timed per (account, network, method) so far (bucket placement depends
        on the clock; their number does not)."""
        if hasattr(self, "gate"):
            for account, network, method, _minute, counts in self.gate.latency.drain():
                key = (account, network, method)
                self.timed[key] = self.timed.get(key, 0) + sum(counts)
        return dict(self.timed)

    def request(self, body: bytes | Any, headers: bytes = b"", path: bytes = PATH) -> Any:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        parser = self.impl.http1.RequestParser()
        parser.feed(
            b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path, len(body), headers, body)
        )
        return parser.next_event()

    def serve(
        self, body: bytes | Any, headers: bytes = b"", conn: Any = "c1", path: bytes = PATH
    ) -> Any:
        request = self.request(body, headers, path)
        answer = self.lane.serve(conn, request, "127.0.0.1", "127.0.0.1")
        if isinstance(answer, tuple):
            status, head, payload = answer
            return status, _scrub(head), payload
        return answer

    def land_all(self, outcome: Any) -> None:
        """Land every flight sent so far: ``outcome(flight) -> (result, error)``."""
        groups, self.recorder.groups[:] = list(self.recorder.groups), []
        for group in groups:
            for flight in group:
                self.route.land(flight, *outcome(flight))

    def books(self) -> dict[str, Any]:
        self.access_log.sync()
        lines = [_scrub_line(line) for line in self.log_stream.getvalue().splitlines()]
        stats = {
            name: (s.ok, s.error, s.cache_hits)
            for name, s in self.route.stats.items()
            if s.ok or s.error or s.cache_hits
        }
        return {
            "statuses": {k: dict(v) for k, v in self.statuses.items()},
            "latency_samples": sum(self.latency.series("rpc").counts),
            "timed": self.timed_requests(),
            "stats": stats,
            "coalesced": self.route.coalesced,
            "refused": dict(self.route.refused),
            "log": lines,
            "budget": self.route.budget.held,
            "delivered": [
                (conn, status, _scrub(head), body)
                for conn, status, head, body in self.recorder.delivered
            ],
        }


def _counter() -> Any:
    from collections import defaultdict

    return defaultdict(int)


def _scrub(headers: bytes) -> bytes:
    """Header lines with what depends on the clock made constant."""
    return re.sub(rb"X-RateLimit-Reset: \d+", b"X-RateLimit-Reset: T", headers)


def _scrub_line(line: bytes) -> bytes:
    line = re.sub(rb'"ts":"[^"]+"', b'"ts":"T"', line)
    return re.sub(rb'"duration_us":\d+', b'"duration_us":D', line)


def _call(method: str, params: list[Any] | None = None, id: Any = 1) -> dict[str, Any]:
    call: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or []}
    if id is not None:
        call["id"] = id
    return call


def _both(scenario: Any, **options: Any) -> tuple[Any, Any]:
    """Run ``scenario(lane)`` on both twins; their results and books must be equal."""
    compiled, pure = (Lane(impl, **options) for impl in _twins())
    result_c, result_p = scenario(compiled), scenario(pure)
    assert result_c == result_p
    assert compiled.books() == pure.books()
    return result_c, compiled.books()


def _result(flight: Any) -> tuple[bytes | None, bytes | None]:
    return b'"r:' + flight.method.encode() + b'"', None


def test_a_static_answer_is_served_from_the_cache() -> None:
    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"0x7a69"')
        return lane.serve(_call("eth_chainId", id=7))

    (status, headers, body), books = _both(scenario)
    assert status == 200 and body == b'{"jsonrpc":"2.0","id":7,"result":"0x7a69"}'
    assert b"X-Cache: HIT\r\n" in headers and headers.startswith(b"X-Request-Id: test-1\r\n")
    assert books["stats"] == {"eth_chainId": (1, 0, 1)}
    assert books["statuses"]["rpc"] == {200: 1} and books["latency_samples"] == 1
    assert books["log"] == [
        b'{"ts":"T","level":"info","msg":"request","request_id":"test-1","peer":"127.0.0.1",'
        b'"method":"POST","path":"/v1/rpc/ethereum/devnet","status":200,"duration_us":D,'
        b'"bytes":42,"rpc":"eth_chainId","cache":"HIT"}'
    ]


def test_identical_calls_share_one_flight_and_land_together() -> None:
    def scenario(lane: Lane) -> Any:
        first = lane.serve(_call("eth_blockNumber", id=1), conn="a")
        second = lane.serve(_call("eth_blockNumber", id="x"), conn="b")
        sent = [[(f.method, f.params) for f in group] for group in lane.recorder.groups]
        lane.land_all(lambda flight: (b'"0x10"', None))
        return first, second, sent

    (first, second, sent), books = _both(scenario)
    assert first == second == "defer"
    assert sent == [[("eth_blockNumber", b"[]")]]
    assert books["coalesced"] == 1
    bodies = [(conn, body) for conn, _, _, body in books["delivered"]]
    assert bodies == [
        ("a", b'{"jsonrpc":"2.0","id":1,"result":"0x10"}'),
        ("b", b'{"jsonrpc":"2.0","id":"x","result":"0x10"}'),
    ]


def test_every_call_waiting_for_one_flight_gets_its_answer_in_turn() -> None:
    """A flight waited for by calls of several requests (its first waiter, then the others:
    twice in one batch, a single call, a second batch) answers each of them, in the order
    they came, each with its own id; a batch over its bound stops waiting for reads while its
    flight is asked whether anyone still wants it (``Route.wants``)."""
    balance = ["0x" + "11" * 20, "latest"]

    def scenario(lane: Lane) -> Any:
        first = lane.serve(
            [
                _call("eth_getBalance", balance, id=10),
                _call("eth_chainId", id=11),
                _call("eth_getBalance", balance, id=12),
            ],
            conn="a",
        )
        second = lane.serve(_call("eth_getBalance", balance, id=13), conn="b")
        third = lane.serve([_call("eth_getBalance", balance, id=14)], conn="c")
        groups = [[f.method for f in group] for group in lane.recorder.groups]
        flight = lane.recorder.groups[0][0]
        wanted = lane.route.wants([flight], 10)
        lane.land_all(_result)
        return first, second, third, groups, wanted

    (first, second, third, groups, wanted), books = _both(scenario)
    assert (first, second, third) == ("defer", "defer", "defer")
    assert groups == [["eth_getBalance", "eth_chainId"]]
    assert wanted is True
    assert books["coalesced"] == 3
    answers = [(conn, json.loads(body)) for conn, _, _, body in books["delivered"]]
    assert [conn for conn, _ in answers] == ["b", "c", "a"]  # the batch of "a" waits for both
    result = "r:eth_getBalance"
    assert answers[0][1] == {"jsonrpc": "2.0", "id": 13, "result": result}
    assert [r["id"] for r in answers[1][1]] == [14]
    assert [(r["id"], r["result"]) for r in answers[2][1]] == [
        (10, result),
        (11, "r:eth_chainId"),
        (12, result),
    ]


def test_a_watched_methods_results_are_shown_however_its_flight_was_opened() -> None:
    """``look`` sees every watched method's result: a flight the lane opened, one the service
    opened (``open_flight``), one made by its constructor; a method the table does not know
    (the passthrough row) by its name."""

    def scenario(lane: Lane) -> Any:
        impl = lane.impl
        route = lane.route
        lane.serve([_call("eth_blockNumber", id=1), _call("eth_gasPrice", id=2)])
        (group,) = lane.recorder.groups
        row = route.methods["eth_blockNumber"]
        group = [
            *group,
            route.open_flight(("eth_blockNumber", b"[1]"), b"[1]", row, None),
            impl.fastlane.Flight(("eth_blockNumber", b"[2]"), b"[2]", row, None),
        ]
        looked: list[tuple[str, bytes]] = []
        replies = [impl.jsonrpc.Reply(b"%d" % (100 + i), b'"0x%d"' % i, None) for i in range(4)]
        route.land_replies(
            group,
            100,
            replies,
            lambda flight, result: looked.append((flight.method, result)),
            lambda: b"{}",
            b"{}",
        )
        return looked

    looked, _ = _both(scenario, keys=False)
    assert looked == [
        ("eth_blockNumber", b'"0x0"'),
        ("eth_blockNumber", b'"0x2"'),
        ("eth_blockNumber", b'"0x3"'),
    ]


def test_a_batch_mixes_cache_flights_errors_and_keeps_its_order() -> None:
    batch = [
        _call("eth_chainId", id=1),
        _call("eth_blockNumber", id=2),
        _call("eth_noSuchMethod", id=3),
        _call("eth_getBalance", ["0x" + "11" * 20, "0xzz"], id=4),  # a bad block tag
        {"jsonrpc": "2.0", "id": 5},  # no method
        _call("eth_blockNumber", id=6),  # joins the flight of id 2
        _call("eth_getBalance", ["0x" + "11" * 20, "latest"], id=None),  # a notification
        _call("eth_sendRawTransaction", ["0xdead"], id=8),
    ]

    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"0x7a69"')
        answer = lane.serve(batch)
        sent = [[f.method for f in group] for group in lane.recorder.groups]
        lane.land_all(
            lambda f: (
                (None, b'{"code":-32000,"message":"nonce too low"}') if f.spec.write else _result(f)
            )
        )
        return answer, sent

    (answer, sent), books = _both(scenario)
    assert answer == "defer"
    assert sent == [["eth_blockNumber", "eth_getBalance"], ["eth_sendRawTransaction"]]
    ((_, status, headers, body),) = books["delivered"]
    assert status == 200 and b"X-Cache: PARTIAL" in headers
    replies = json.loads(body)
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4, 5, 6, 8]
    assert replies[0]["result"] == "0x7a69" and replies[1]["result"] == "r:eth_blockNumber"
    assert replies[2]["error"]["code"] == -32601 and replies[3]["error"]["code"] == -32602
    assert replies[4]["error"]["code"] == -32600 and replies[5] == replies[1] | {"id": 6}
    assert replies[6]["error"]["message"] == "nonce too low"
    assert books["coalesced"] == 1
    assert books["stats"]["eth_sendRawTransaction"] == (0, 1, 0)


def test_handler_only_calls_hand_the_whole_request_off_before_counting_anything() -> None:
    class Sticky:
        def __len__(self) -> int:
            return 1

    def scenario(lane: Lane) -> Any:
        return (
            lane.serve(_call("eth_getLogs", [{}])),
            lane.serve([_call("eth_chainId"), _call("eth_getLogs", [{}], id=2)]),
            lane.serve(_call("eth_getTransactionCount", ["0x" + "22" * 20, "latest"])),
            lane.serve(_call("eth_chainId"), path=b"/v1/rpc/ethereum/other"),
        )

    answers, books = _both(scenario, sticky=Sticky())
    assert answers == ("handoff",) * 4
    assert books["stats"] == {} and books["log"] == [] and books["statuses"]["rpc"] == {}


def _logs(first: Any = None, last: Any = None, **more: Any) -> dict[str, Any]:
    query = dict(more)
    if first is not None:
        query["fromBlock"] = first
    if last is not None:
        query["toBlock"] = last
    return _call("eth_getLogs", [query])


def test_each_access_log_line_names_its_own_http_method() -> None:
    """The compiled ledger keeps the method it logged last: a line after another method's
    still names its own."""
    methods = [b"POST", b"GET", b"GET", b"OPTIONS", b"POST", b"PO\xd6ST"]

    def scenario(lane: Lane) -> None:
        for method in methods:
            lane.lane.ledger.note("rpc", 200, b"r1", "127.0.0.1", method, "/x", 0.0, 5, "", b"")

    _, books = _both(scenario)
    logged = [re.search(rb'"method":("[^"]*")', line) for line in books["log"]]
    assert [json.loads(found.group(1)) for found in logged if found] == [
        method.decode("latin-1") for method in methods
    ]


def test_an_eth_getlogs_range_that_fits_one_call_goes_upstream_from_the_lane() -> None:
    """Limit 1,000 (the plan's, under the network's 10,000), 500 blocks per upstream call,
    head 0x1000: what fits one call is sent; what must be refused, split or read by the
    handler is handed off whole, before anything is counted."""

    def scenario(lane: Lane) -> Any:
        answers = [
            lane.serve(_logs("0x10", "0x20")),  # 17 blocks
            lane.serve(_logs("0xff0", "latest")),  # 17 blocks to the head
            lane.serve(_logs("0xf00")),  # toBlock absent: the head, 257 blocks
            lane.serve(_logs("earliest", "0x1f3")),  # 500 blocks: one call
            lane.serve(_logs("0x20", "0x10")),  # inverted: the node answers it
            lane.serve([_logs("0x1", "0x2"), _call("eth_chainId", id=2)]),
            lane.serve(_logs("0x0", "0x1f4")),  # 501 blocks: split
            lane.serve(_logs("0x0", "0x3e8")),  # 1,001 blocks: refused (the plan's limit)
            lane.serve(_logs("0x0", "0x1", blockHash="0x" + "ab" * 32)),
            lane.serve(_logs("0X10", "0x20")),  # what the lane does not read: the handler
            lane.serve(_logs("0x10", "0x" + "1" * 16)),
            lane.serve(_logs(16, "0x20")),
            lane.serve(_logs("0x1", "0x2", address=["0x" + "11" * 20])),  # other members: fine
            lane.serve([_call("eth_chainId"), _logs("0x0", "0x3e8")]),
            lane.serve(_call("eth_getLogs", [{"fromBlock": "0x1"}, {}])),
            lane.serve(_call("eth_getLogs")),  # no filter: the handler
        ]
        lane.land_all(lambda flight: (b"[]", None))
        return answers

    answers, books = _both(scenario, logs=(10_000, 500), head=0x1000, plan_blocks=1_000)
    assert answers == ["defer"] * 6 + ["handoff"] * 6 + ["defer"] + ["handoff"] * 3
    assert books["stats"]["eth_getLogs"] == (7, 0, 0)
    assert len(books["delivered"]) == 7


def test_an_eth_getlogs_range_of_head_tags_needs_a_known_head() -> None:
    def scenario(lane: Lane) -> Any:
        return lane.serve(_logs("0x1", "latest")), lane.serve(_logs("0x1", "0x2"))

    answers, _ = _both(scenario, logs=(10_000, 500), head=None)
    assert answers == ("handoff", "defer")


@given(
    low=st.integers(0, 1 << 20),
    high=st.integers(0, 1 << 20),
    network=st.sampled_from([0, 1, 1_000, 10_000]),
    plan=st.sampled_from([0, 1, 500, 20_000]),
    upstream=st.sampled_from([0, 1, 2_000]),
)
def test_the_range_rule_twins_agree(
    low: int, high: int, network: int, plan: int, upstream: int
) -> None:
    compiled, pure = (impl.fastlane for impl in _twins())
    limit = pure.logs_limit(network, plan)
    assert compiled.logs_limit(network, plan) == limit
    assert limit <= max(network, plan) and (not network or limit <= network)
    verdict = pure.logs_verdict(low, high, limit, upstream)
    assert compiled.logs_verdict(low, high, limit, upstream) == verdict
    span = high - low + 1
    if high < low or ((not limit or span <= limit) and (not upstream or span <= upstream)):
        assert verdict == pure.LOGS_FORWARD
    elif limit and span > limit:
        assert verdict == pure.LOGS_REFUSE
    else:
        assert verdict == pure.LOGS_SPLIT


# eth_getLogs filters as clients and others write them: the compiled twin scans the usual
# ones itself and decodes the rest; both twins must read the same ends from any of them.
_FILTER_KEYS = st.sampled_from(
    ['"fromBlock"', '"toBlock"', '"blockHash"', '"address"', '"topics"', '"from\\u0042lock"',
     '"to\\u0042lock"', '"\u00e9"', '"fromblock"', '""']
)  # fmt: skip
_FILTER_VALUES = st.one_of(
    st.sampled_from(
        ['"0x10"', '"0x"', '"0X10"', '"latest"', '"safe"', '"earliest"', '"pending"', "null",
         "nul", "nullx", "16", "-1", "1e3", "true", "{}", '{"a":"0x1"}', "[]", "[null]",
         '["0xab",null,["0x1","0x2"]]', "[[[[[]]]]]", "[[[[[[]]]]]]", '["0x1",]', '"a\\"b"',
         '"\\u0030x1"', '"\u00e9"', '"\x01"', '"0x' + "f" * 15 + '"', '"0x' + "f" * 16 + '"',
         '"0x1"', '"0x64"', '"0x3e8"', '"finalized"']
    ),
    # Long strings, each byte of which the compiled twin's scan must judge as the decoder
    # would (sixteen at a time): DEL is plain, a byte >= 0x80, a control byte, an escape not.
    st.builds(
        lambda at, odd: '"0x' + ("ab" * 24)[:at] + odd + "cd" * 8 + '"',
        st.integers(0, 48),
        st.sampled_from(["", "\x7f", "\u00e9", "\x1f", '\\"', "\\\\", '"', "\x00"]),
    ),
    st.text(alphabet="0x123abcdefl\"[],{}: \\", max_size=12),
)  # fmt: skip
_WHITESPACE = st.sampled_from(["", " ", "\n", "\t", "\r\n  "])


@st.composite
def _filter_texts(draw: st.DrawFn) -> bytes:
    members = draw(st.lists(st.tuples(_FILTER_KEYS, _FILTER_VALUES, _WHITESPACE), max_size=6))
    ws = draw(_WHITESPACE)
    body = ",".join(f"{w}{key}{w}:{w}{value}{w}" for key, value, w in members)
    text = f"{ws}[{ws}{{{body}}}{ws}{draw(st.sampled_from(['', ',{}', ',1', ' ']))}]{ws}"
    text += draw(st.sampled_from(["", "", " ", "x", "]", "\x00"]))
    raw = text.encode()
    cut = draw(st.sampled_from([None, None, None, draw(st.integers(0, len(raw)))]))
    return raw if cut is None else raw[:cut]


@settings(max_examples=2000)
@given(params=_filter_texts())
def test_the_log_filter_twins_read_the_same_ends(params: bytes) -> None:
    compiled, pure = (impl.fastlane for impl in _twins())
    assert compiled.log_filter_ends(params) == pure.log_filter_ends(params)


_RANGE_LANES: dict[Any, tuple[Lane, Lane]] = {}
_ENDS = st.sampled_from(
    ['"0x1"', '"0x10"', '"0x64"', '"0x3e8"', '"0xfff"', '"latest"', '"finalized"', '"earliest"',
     "null", '"0X10"', "16"]
)  # fmt: skip
_OTHERS = st.sampled_from(
    ['"address":"0x' + "12" * 20 + '"', '"topics":["0x' + "ab" * 32 + '",null,["0x1"]]',
     '"address":["0x' + "12" * 20 + '\u0030"]', '"topics":[]']
)  # fmt: skip


@st.composite
def _range_filters(draw: st.DrawFn) -> bytes:
    """Filters with ranges the lane reads (and some it does not), a blockHash or not, other
    members around them, in any order."""
    members = [f'"{key}":{draw(_ENDS)}' for key in ("fromBlock", "toBlock") if draw(st.booleans())]
    if draw(st.integers(0, 3)) == 0:
        members.append('"blockHash":' + draw(st.sampled_from(["null", '"0x' + "ab" * 32 + '"'])))
    members += draw(st.lists(_OTHERS, max_size=2))
    members = draw(st.permutations(members))
    return f"[{{{','.join(members)}}}]".encode()


@settings(max_examples=2000)
@given(
    params=st.one_of(_filter_texts(), _range_filters()),
    head=st.sampled_from([None, 0x10, 0x1000]),
)
def test_the_range_twins_judge_any_filter_alike(params: bytes, head: int | None) -> None:
    """``Route.logs_fit``: the compiled twin reads the usual filter where it lies (nothing
    decoded, nothing allocated) and must still judge every filter as the pure twin does."""
    if head not in _RANGE_LANES:
        _RANGE_LANES[head] = tuple(  # type: ignore[assignment]
            Lane(impl, logs=(1_000, 100), head=head, plan_blocks=500) for impl in _twins()
        )
    compiled, pure = _RANGE_LANES[head]
    fits = pure.route.logs_fit(params, pure.principal)
    assert compiled.route.logs_fit(params, compiled.principal) is fits


def test_the_usual_log_filters_are_read_to_their_ends() -> None:
    compiled, pure = (impl.fastlane for impl in _twins())
    topics = '["0xddf2",null,"0x0000000000000000000000001111111111111111111111111111111111111111"]'
    usual = {
        f'[{{"fromBlock":"0x1f","toBlock":"0x22","address":"0xabcd","topics":{topics}}}]': (
            b'"0x1f"',
            b'"0x22"',
            b"",
        ),
        '[ { "address": ["0x1", "0x2"], "toBlock": "latest" } ]': (b"", b'"latest"', b""),
        '[{"blockHash":"0x' + "ab" * 32 + '"}]': (b"", b"", b'"0x' + b"ab" * 32 + b'"'),
        '[{"fromBlock":null}]': (b"null", b"", b""),
        "[{}]": (b"", b"", b""),
        '[{"fromBlock":"0x1","fromBlock":"0x2"}]': (b'"0x2"', b"", b""),
        '[{"from\\u0042lock":"0x3"}]': (b'"0x3"', b"", b""),
    }
    for text, ends in usual.items():
        assert (
            compiled.log_filter_ends(text.encode()) == pure.log_filter_ends(text.encode()) == ends
        )
    for text in ("", "[]", "[{}, {}]", '{"fromBlock":"0x1"}', "[{]", '[{"fromBlock":"0x1"}] x'):
        assert (
            compiled.log_filter_ends(text.encode()) is pure.log_filter_ends(text.encode()) is None
        )


# Params as clients write them, and stranger: the compiled lane reads the usual block tags
# itself (flat items up to the tag) and asks jsonrpc's array_item for the rest.
_PARAM_ITEMS = st.one_of(
    st.sampled_from(
        ['"latest"', '"earliest"', '"pending"', '"safe"', '"finalized"', '"Latest"', '"0x1f"',
         '"0x' + "ab" * 20 + '"', "null", "true", "false", "0", "-1.5e3",
         "{}", '{"blockHash":"0x' + "cd" * 32 + '"}', '{"blockNumber":"0x1","x":null}',
         '{"to":"0x' + "11" * 20 + '","data":"0x70a08231"}', '{"a":1}', '{"a":{"b":"c"}}',
         '{"a":["b"]}', '{"a":"\\u0041"}', '"\\u006c atest"', '"\u00e9"', "[]", '["0x1"]',
         '"\x7f"', '{ "to" : "0x1" , "gas" : null }']
    ),
    st.text(alphabet='0x1f"latesnu\\ ', max_size=10).map(json.dumps),
)  # fmt: skip


@st.composite
def _param_texts(draw: st.DrawFn) -> str:
    ws = draw(_WHITESPACE)
    items = draw(st.lists(_PARAM_ITEMS, max_size=5))
    text = f"{ws}[{ws}" + f"{ws},{ws}".join(items) + f"{ws}]{ws}"
    return draw(st.sampled_from([text, text, "{}", '{"a":"latest"}', " [ ] "]))


@settings(max_examples=1500)
@given(
    params=_param_texts(),
    method=st.sampled_from(
        ["eth_getBalance", "eth_call", "eth_getStorageAt", "eth_getBlockByNumber", "eth_chainId"]
    ),
)
def test_the_twins_read_the_same_block_tag(params: str, method: str) -> None:
    """The same tag, validity, price and cacheability from any params, in both twins."""
    body = f'{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}'.encode()
    answers: list[tuple[Any, ...]] = []
    for impl in _twins():
        (call,) = impl.jsonrpc.parse_request(body, 10).calls
        row, tag, valid = Lane(impl).route.classify(call)
        if row is None:
            answers.append((None, tag, valid))
        else:  # the tag's price and whether its answer may be cached: the same rule
            priced = row.price(tag), row.may_be_cached(tag, call.params)
            answers.append((row.name, tag, valid, *priced))
    assert answers[0] == answers[1]


def test_a_key_with_allowlists_is_served_by_the_lane_within_them() -> None:
    """The lane asks the key's lists (auth/allowlists.py): what they allow it answers, what
    they refuse — an origin, a method, a contract, anywhere in a batch — the handler
    refuses, so the whole request is handed off before anything is counted."""
    token = "0x" + "11" * 20
    other = "0x" + "22" * 20
    policy = allowlists.Policy(
        allowlists.build(
            origins=["https://app.example.com"],
            methods=["eth_chainId", "eth_getBalance", "eth_call"],
            contracts=[token],
        )
    )
    keyed = b"X-API-Key: " + KEY + b"\r\n"
    good = keyed + b"Origin: https://app.example.com\r\n"

    def scenario(lane: Lane) -> Any:
        lane.principal.allow = policy
        answers = [
            lane.serve(_call("eth_chainId"), good),
            lane.serve(_call("eth_call", [{"to": token, "data": "0x"}, "latest"]), good),
            lane.serve([_call("eth_chainId"), _call("eth_getBalance", [other, "latest"], 2)], good),
            lane.serve(_call("eth_chainId"), keyed),  # no Origin
            lane.serve(_call("eth_chainId"), keyed + b"Origin: https://evil.example\r\n"),
            lane.serve(_call("eth_blockNumber"), good),  # not on the method list
            lane.serve(_call("eth_call", [{"to": other, "data": "0x"}, "latest"]), good),
            lane.serve([_call("eth_chainId"), _call("eth_gasPrice", id=2)], good),
        ]
        lane.land_all(lambda flight: (b'"0x1"', None))
        return answers

    answers, books = _both(scenario, keys=True)
    assert [a if isinstance(a, str) else a[0] for a in answers] == (["defer"] * 3 + ["handoff"] * 5)
    assert books["stats"]["eth_call"] == (1, 0, 0)
    assert books["statuses"]["rpc"] == {200: 3}


def test_calls_served_while_held_go_upstream_together() -> None:
    """While the edge loop serves one readiness (``hold`` .. ``release``), distinct reads —
    single calls' and batches' alike — wait and leave as groups of at most the upstream
    batch size (10 here); a write leaves at once, alone; identical calls still share a
    flight.  Every answer is the one it would have been."""

    def balance(i: int) -> dict[str, Any]:
        return _call("eth_getBalance", ["0x" + f"{i:040x}", "latest"], id=i)

    def scenario(lane: Lane) -> Any:
        lane.lane.hold()
        answers = [lane.serve(balance(i), conn=f"c{i}") for i in range(1, 13)]
        answers.append(lane.serve(balance(1), conn="c13"))  # joins the first's flight
        answers.append(lane.serve(_call("eth_sendRawTransaction", ["0x00"], id=14), conn="w"))
        answers.append(lane.serve([balance(20), balance(21)], conn="b"))
        sent_while_held = [[f.method for f in group] for group in lane.recorder.groups]
        lane.lane.release()
        groups = [len(group) for group in lane.recorder.groups]
        lane.land_all(lambda flight: (b'"' + flight.params.hex().encode() + b'"', None))
        return answers, sent_while_held, groups

    (answers, sent_while_held, groups), books = _both(scenario)
    assert answers == ["defer"] * 15
    assert sent_while_held == [["eth_sendRawTransaction"]]
    assert groups == [1, 10, 4]  # 12 single calls' reads and the batch's two
    assert books["coalesced"] == 1
    delivered = {conn: json.loads(body) for conn, _, _, body in books["delivered"]}
    assert len(delivered) == 15
    assert delivered["c13"] == delivered["c1"]
    for i in range(1, 13):
        params = json.dumps(["0x" + f"{i:040x}", "latest"])  # as the request spells them
        assert delivered[f"c{i}"] == {"jsonrpc": "2.0", "id": i, "result": params.encode().hex()}
    assert [reply["id"] for reply in delivered["b"]] == [20, 21]


def test_a_groups_replies_land_on_the_flights_their_ids_name() -> None:
    """``Route.land_replies``: each reply lands the flight its upstream id names, in any
    order; an error object is the call's error, a reply with neither a result nor an error
    object gets ``bad()``, a flight no reply names (a duplicate or a foreign id does not
    count) ``missing``; the service is shown the results it must see (``look``): those the
    cache may keep and the watched methods' — nothing else.  (Each twin is given its own
    jsonrpc's replies, as its service gives it: the compiled lane reads their fields as C
    members.)"""

    def scenario(lane: Lane) -> Any:
        reply: Any = lane.impl.jsonrpc.Reply
        calls = [
            _call("eth_getBalance", ["0x" + "11" * 20, "latest"], id=1),  # not cacheable
            _call("eth_getBalance", ["0x" + "11" * 20, "0x1"], id=2),  # cacheable
            _call("eth_blockNumber", id=3),  # watched
            _call("eth_getCode", ["0x" + "11" * 20, "latest"], id=4),  # a node's error
            _call("eth_gasPrice", id=5),  # neither result nor error object
            _call("eth_getBalance", ["0x" + "22" * 20, "latest"], id=6),  # no reply
        ]
        lane.serve(calls)
        (group,) = lane.recorder.groups
        looked: list[tuple[str, bytes]] = []
        replies = [
            reply(b"106", b'"0xb"', None),  # no flight of this group
            reply(b"101", b'"0xa"', None),
            reply(b"102", b'"0x3"', None),
            reply(b"102", b'"0x4"', None),  # the same id again: ignored
            reply(b"103", None, b'{"code":-32000,"message":"nope"}'),
            reply(b"104", None, b'"not an object"'),
            reply(b'"100"', b'"0x1"', None),  # not our spelling
            reply(b"100", b'"0x0"', None),
        ]
        lane.route.land_replies(
            group,
            100,
            replies,
            lambda flight, result: looked.append((flight.method, result)),
            lambda: b'{"code":-32603,"message":"bad"}',
            b'{"code":-32603,"message":"missing"}',
        )
        return looked

    looked, books = _both(scenario, keys=False)
    assert looked == [("eth_getBalance", b'"0xa"'), ("eth_blockNumber", b'"0x3"')]
    ((_, status, _, body),) = books["delivered"]
    assert status == 200
    assert [r.get("result", r.get("error")) for r in json.loads(body)] == [
        "0x0",
        "0xa",
        "0x3",
        {"code": -32000, "message": "nope"},
        {"code": -32603, "message": "bad"},
        {"code": -32603, "message": "missing"},
    ]


def test_only_results_that_may_be_final_are_shown_to_the_service() -> None:
    """A cacheable result about a block (a receipt, a transaction, a block by hash) is shown
    to the service (``look``, where ``RpcService._maybe_cache`` decides) only when its block is
    at or below the lane's ``finalized`` bound; one above it, or one the family's
    ``result_block`` cannot place, would only be refused there (each twin's replies, parsed from
    the node's answer: the compiled one reads the block while it scans the response).  Results
    whose finality comes from their block tag are shown as before (the service reads the
    tag)."""

    def receipt(number: int) -> bytes:
        return (
            b'{"logs":[{"blockNumber":"0x999"}],"transactionHash":"0x%s",'
            b'"blockNumber":"%s","status":"0x1"}' % (b"ab" * 32, hex(number).encode())
        )

    def scenario(lane: Lane, finalized: int) -> Any:
        lane.route.reply_block = resultblocks.reply_evm_block
        lane.route.finalized = finalized
        calls = [
            _call("eth_getTransactionReceipt", ["0x" + f"{i:02x}" * 32], id=i) for i in range(1, 6)
        ] + [_call("eth_getBalance", ["0x" + "11" * 20, "0x1"], id=6)]
        lane.serve(calls)
        (group,) = lane.recorder.groups
        looked: list[tuple[str, bytes]] = []
        results = [receipt(9), receipt(10), receipt(11), b'{"status":"0x1"}', b"null", b'"0x5"']
        answer = b"[%s]" % b",".join(
            b'{"jsonrpc":"2.0","id":%d,"result":%s}' % (100 + i, result)
            for i, result in enumerate(results)
        )
        parsed = lane.impl.jsonrpc.parse_response(answer)
        assert parsed is not None
        lane.route.land_replies(
            group,
            100,
            list(parsed.replies),
            lambda flight, result: looked.append((flight.method, result)),
            lambda: b'{"code":-32603,"message":"bad"}',
            b'{"code":-32603,"message":"missing"}',
        )
        return looked

    for finalized, shown in ((10, [0, 1]), (11, [0, 1, 2]), (-1, []), (8, [])):
        looked, books = _both(functools.partial(scenario, finalized=finalized), keys=False)
        assert looked == [("eth_getTransactionReceipt", receipt(9 + i)) for i in shown] + [
            ("eth_getBalance", b'"0x5"')
        ]
        ((_, status, _, body),) = books["delivered"]
        assert status == 200 and len(json.loads(body)) == 6


def test_refusals_over_a_limit_are_json_rpc_with_their_ids() -> None:
    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"0x7a69"')
        return [
            lane.serve(_call("eth_chainId", id=1), b"X-API-Key: " + KEY + b"\r\n"),
            lane.serve(_call("eth_chainId", id=2), b"X-API-Key: " + KEY + b"\r\n"),
            lane.serve(
                [_call("eth_chainId", id=3), _call("eth_nope", id=4)],
                b"Authorization: Bearer " + KEY + b"\r\n",
            ),
            lane.serve(_call("eth_chainId", id=5)),  # no key: the handler answers 401
        ]

    answers, books = _both(scenario, keys=True, rps=1)
    assert answers[0][0] == 200
    status, headers, body = answers[1]
    assert status == 429 and b"Retry-After: 1\r\n" in headers
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {
            "code": -32005,
            "message": "rate limit exceeded (requests or compute units per second)",
        },
    }
    assert [r["id"] for r in json.loads(answers[2][2])] == [3, 4]
    assert answers[3] == "handoff"
    assert books["statuses"]["rpc"] == {200: 1, 429: 2}


def test_each_admitted_request_is_timed_for_its_account_network_and_method() -> None:
    """Latency per account: an answered request counts once under its method ("batch" for a
    batch, once however many calls it has), after its last flight landed; what was never
    admitted (malformed, unknown method, bad block tag, over a limit) is not timed."""
    keyed = b"X-API-Key: " + KEY + b"\r\n"

    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"0x7a69"')
        lane.serve(_call("eth_chainId"), keyed)  # a cache hit
        lane.serve(_call("eth_blockNumber"), keyed)  # waits for its flight
        before_landing = lane.timed_requests()
        lane.land_all(_result)
        lane.serve([_call("eth_chainId", id=1), _call("eth_blockNumber", id=2)], keyed)
        lane.land_all(_result)
        lane.serve(b"{not json", keyed)
        lane.serve(_call("eth_nope"), keyed)
        lane.serve(_call("eth_getBalance", ["0x" + "11" * 20, "yesterday"]), keyed)
        for _ in range(3):
            lane.serve(_call("eth_chainId"), keyed)  # a burst of 5: the 2nd and 3rd over it
        return before_landing

    before_landing, books = _both(scenario, keys=True, rps=5)
    assert before_landing == {("a1", "ethereum/devnet", "eth_chainId"): 1}
    assert books["timed"] == {
        ("a1", "ethereum/devnet", "eth_chainId"): 2,
        ("a1", "ethereum/devnet", "eth_blockNumber"): 1,
        ("a1", "ethereum/devnet", "batch"): 1,
    }
    assert books["statuses"]["rpc"][429] == 2


def test_the_latency_meter_closes_a_minute_when_the_next_begins() -> None:
    for impl in _twins():
        meter = impl.fastlane.LatencyMeter((0.001, 0.01, 0.1))
        # bisect_left: a sample on a bound counts in that bound's bucket; above the last,
        # the last bucket.
        for seconds in (0.0, 0.001, 0.0011, 0.05, 0.1, 7.0):
            meter.observe("a", "eth/main", "eth_call", 5, seconds)
        meter.observe("a", "eth/main", "eth_call", 6, 0.002)  # closes minute 5
        meter.observe("a", "eth/main", "eth_call", 6, 0.002)
        meter.observe("a", "eth/test", "batch", 5, 0.002)
        meter.observe("b", "eth/main", "eth_call", 5, 0.002)
        assert meter.drain() == [
            ("a", "eth/main", "eth_call", 5, (2, 1, 2, 1)),
            ("a", "eth/main", "eth_call", 6, (0, 2, 0, 0)),
            ("a", "eth/test", "batch", 5, (0, 1, 0, 0)),
            ("b", "eth/main", "eth_call", 5, (0, 1, 0, 0)),
        ], impl.name
        assert meter.drain() == []
        # What a failed write gives back adds to what came since.
        meter.observe("a", "eth/main", "eth_call", 5, 0.5)
        meter.add("a", "eth/main", "eth_call", 5, (2, 1, 2, 1))
        meter.add("c", "", "rest:tokens", 5, [1, 0, 0, 0])
        assert meter.drain() == [
            ("a", "eth/main", "eth_call", 5, (2, 1, 2, 2)),
            ("c", "", "rest:tokens", 5, (1, 0, 0, 0)),
        ]
        with pytest.raises(ValueError, match="4 bucket counts"):
            meter.add("a", "eth/main", "eth_call", 5, (1, 2))
        with pytest.raises(ValueError, match="ascending"):
            impl.fastlane.LatencyMeter((0.1, 0.01))
        with pytest.raises(ValueError, match="ascending"):
            impl.fastlane.LatencyMeter(tuple(float(i) for i in range(32)))


@settings(max_examples=200)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(["a", "b"]),
                st.sampled_from(["eth/main", "eth/test"]),
                st.sampled_from(["eth_call", "batch"]),
                st.integers(0, 2),
                st.floats(0, 1, allow_nan=False),
            ),
            st.just("drain"),
        ),
        max_size=60,
    )
)
def test_the_latency_meter_twins_agree(steps: list[Any]) -> None:
    compiled, pure = (impl.fastlane for impl in _twins())
    bounds = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
    a, b = compiled.LatencyMeter(bounds), pure.LatencyMeter(bounds)
    for step in steps:
        if step == "drain":
            assert a.drain() == b.drain()
        else:
            a.observe(*step)
            b.observe(*step)
    assert a.drain() == b.drain()


def test_a_scope_the_key_lacks_is_refused() -> None:
    def scenario(lane: Lane) -> Any:
        return lane.serve(_call("eth_sendRawTransaction", ["0x00"]), b"X-API-Key: " + KEY + b"\r\n")

    (status, _, body), _ = _both(scenario, keys=True, scopes=frozenset({"rpc:read"}))
    assert status == 403 and b"rpc:write" in body


def test_answers_over_their_bound_are_refused_and_writes_say_they_may_have_run() -> None:
    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"' + b"x" * 200 + b'"')
        single = lane.serve(_call("eth_chainId"))
        batch = lane.serve(
            [_call("eth_blockNumber", id=1), _call("eth_sendRawTransaction", ["0x01"], id=2)]
        )
        lane.land_all(lambda f: (b'"' + b"y" * 300 + b'"', None))
        return single, batch

    (single, batch), books = _both(scenario, max_answer=150)
    assert b"too large" in single[2]
    ((_, _, _, body),) = books["delivered"]
    replies = json.loads(body)
    assert replies[0]["error"]["message"] == "too large"
    assert replies[1]["error"]["message"] == "too large, may have run"
    assert books["budget"] == 0


def test_the_process_budget_refuses_replies_as_busy() -> None:
    def scenario(lane: Lane) -> Any:
        answer = lane.serve([_call("eth_blockNumber", id=1), _call("eth_gasPrice", id=2)])
        lane.land_all(_result)
        return answer

    _, books = _both(scenario, budget=60)
    ((_, _, _, body),) = books["delivered"]
    replies = json.loads(body)
    assert "result" in replies[0] and replies[1]["error"]["message"] == "busy"
    assert books["budget"] == 0


def test_malformed_json_is_a_parse_error() -> None:
    (status, _, body), books = _both(lambda lane: lane.serve(b"{nope"))
    assert status == 200 and json.loads(body)["error"]["code"] == -32700
    assert books["stats"] == {"invalid": (0, 1, 0)}


_METHOD_NAMES = [
    "eth_chainId",
    "eth_blockNumber",
    "eth_gasPrice",
    "eth_getBalance",
    "eth_call",
    "eth_sendRawTransaction",
    "eth_noSuch",
    "net_version",
]
_calls = st.builds(
    lambda method, tag, ident: _call(
        method,
        ["0x" + "33" * 20, tag] if method in ("eth_getBalance", "eth_call") else [],
        ident,
    ),
    st.sampled_from(_METHOD_NAMES),
    st.sampled_from(["latest", "0x1", "0xzz", "earliest"]),
    st.one_of(st.none(), st.integers(-5, 5), st.text("ab", max_size=3)),
)


@settings(max_examples=60)
@given(
    requests=st.lists(st.one_of(_calls, st.lists(_calls, min_size=1, max_size=12)), max_size=6),
    max_answer=st.sampled_from([200, 1 << 20]),
    fail=st.booleans(),
)
def test_any_requests_get_the_same_answers_from_both_twins(
    requests: list[Any], max_answer: int, fail: bool
) -> None:
    def scenario(lane: Lane) -> Any:
        lane.route.cache.put(("eth_chainId", b"[]"), b'"0x7a69"')
        answers = [lane.serve(request, conn=i) for i, request in enumerate(requests)]
        lane.land_all((lambda f: (None, b'{"code":-32000,"message":"down"}')) if fail else _result)
        return answers

    _both(scenario, max_answer=max_answer)


@pytest.mark.parametrize("which", [0, 1], ids=["compiled", "pure"])
def test_a_batch_whose_flights_land_during_serve_is_answered_once(which: int) -> None:
    lane = Lane(_twins()[which])

    def land_now(group: list[Any]) -> None:  # a dispatch that lands at once
        for flight in group:
            lane.route.land(flight, *_result(flight))

    lane.route.dispatch = land_now
    answer = lane.serve([_call("eth_blockNumber", id=1), _call("eth_gasPrice", id=2)])
    assert answer == "defer" and len(lane.recorder.delivered) == 1


@pytest.mark.parametrize("which", [0, 1], ids=["compiled", "pure"])
def test_a_group_that_cannot_be_sent_fails_its_calls_and_poisons_nothing(which: int) -> None:
    lane = Lane(_twins()[which])
    sent: list[list[Any]] = []

    def broken_once(group: list[Any]) -> None:
        sent.append(group)
        if len(sent) == 1:
            raise RuntimeError("simulated: the service could not take it")

    lane.route.dispatch = broken_once
    assert lane.serve(_call("eth_blockNumber", id=1), conn="c1") == "defer"
    ((conn, status, _, body),) = lane.recorder.delivered
    assert conn == "c1" and status == 200 and b"was not sent" in body
    # The next identical call is sent again, not joined to a flight that never left.
    assert lane.serve(_call("eth_blockNumber", id=2), conn="c2") == "defer"
    assert (len(sent) == 2 and not lane.route.flights) or len(lane.route.flights) == 1


def test_request_ids_twins_agree() -> None:
    """Our own X-Request-Id is ``<prefix>-<hex counter>`` (the compiled twin writes the hex
    itself): the same ids from both twins, past every digit boundary up to 0x1001, and a sane
    client id kept as it is."""
    compiled, pure = (impl.fastlane.RequestIds(b"gw1") for impl in _twins())
    ids = [(compiled.take(None), pure.take(None)) for _ in range(0x1001)]
    assert all(a == b for a, b in ids)
    assert [ids[i][0] for i in (0, 14, 15, 255, 0x1000)] == [
        b"gw1-1",
        b"gw1-f",
        b"gw1-10",
        b"gw1-100",
        b"gw1-1001",
    ]
    assert compiled.take(b"client.id-1") == pure.take(b"client.id-1") == b"client.id-1"
    assert compiled.take(b"bad id") == pure.take(b"bad id") == b"gw1-1002"
