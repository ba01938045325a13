"""Both twins of every hot-path module offer what ``chaingate.twintypes`` declares.

mypy checks callers against the module Protocols and the pure twins (where it can) against
them; it cannot read the compiled modules.  Here each twin is checked at run time: every name a
module Protocol declares exists, functions and methods take the declared parameters (names,
kinds, defaults) wherever their signature is inspectable, each class is built with keyword
arguments named as declared (a compiled constructor's signature is not inspectable, its
keywords are), and each object built offers every member of its Protocol.
"""

from __future__ import annotations

import inspect
import socket
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pytest

from chaingate import twins as impl_module
from chaingate.auth.gate import ANONYMOUS, Principal
from chaingate.auth.keygate import KeyGate
from chaingate.edge import cors
from chaingate.edge.responses import DateHeader
from chaingate.envelope import error_body
from chaingate.obs.logs import AccessLog
from chaingate.obs.metrics import LatencyHistogram
from chaingate.redaction import loggable_path
from chaingate.rpc.methods import MethodTable
from chaingate.twintypes import edgeloop as edgeloop_types
from chaingate.twintypes import fastlane as fastlane_types
from chaingate.twintypes import http1 as http1_types
from chaingate.twintypes import jsonrpc as jsonrpc_types
from chaingate.twintypes import limiter as limiter_types

METHODS = MethodTable.load(Path(__file__).resolve().parents[1] / "config" / "methods.toml")
PATH = b"/v1/rpc/ethereum/devnet"

MODULE_PROTOCOLS: dict[str, type[Any]] = {
    "http1": http1_types.Http1Module,
    "jsonrpc": jsonrpc_types.JsonRpcModule,
    "limiter": limiter_types.LimiterModule,
    "fastlane": fastlane_types.FastlaneModule,
    "edgeloop": edgeloop_types.EdgeloopModule,
}


def _twin(name: str) -> impl_module.Impl:
    if name == "pure":
        return impl_module.pure()
    try:
        return impl_module.compiled()
    except ImportError:
        pytest.skip("compiled modules not built (run `pip install -e .`)")


@pytest.fixture(params=["compiled", "pure"])
def twin(request: pytest.FixtureRequest) -> impl_module.Impl:
    return _twin(request.param)


def _members(protocol: type[Any]) -> dict[str, Any]:
    """Every member a Protocol declares (its bases' too): name -> function, property or
    annotation."""
    members: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        for name, annotation in inspect.get_annotations(klass).items():
            members[name] = annotation
        for name, value in klass.__dict__.items():
            if name.startswith("__") and name not in ("__len__",):
                continue
            if name.startswith("_"):
                continue
            if callable(value) or isinstance(value, property):
                members[name] = value
    return members


def _parameters(function: Any, drop_first: bool) -> list[tuple[str, Any, bool]] | None:
    """(name, kind, has a default) of each parameter; None when not inspectable."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if drop_first:
        parameters = parameters[1:]
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None  # a slot wrapper: says nothing
    return [(p.name, p.kind, p.default is not p.empty) for p in parameters]


def _check_callable(declared: Callable[..., Any], actual: Any, where: str) -> None:
    """``actual`` (a module's function or a bound method) takes the parameters ``declared``
    (a Protocol's method) declares."""
    expected = _parameters(declared, drop_first=True)
    got = _parameters(actual, drop_first=False)
    if got is not None:
        assert got == expected, f"{where}: {got} != declared {expected}"


def _check_object(obj: Any, protocol: type[Any], where: str) -> None:
    for name, declared in _members(protocol).items():
        assert hasattr(obj, name), f"{where} lacks {name}"
        if inspect.isfunction(declared):
            _check_callable(declared, getattr(obj, name), f"{where}.{name}")


def _keywords(module_protocol: type[Any], name: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` under the parameter names the module Protocol declares for ``name``
    (every value must be named there, so a renamed parameter fails here)."""
    declared = _parameters(_members(module_protocol)[name], drop_first=True)
    assert declared is not None
    names = {parameter for parameter, _, _ in declared}
    assert set(values) <= names, (name, set(values) - names)
    return values


def _build(module_protocol: type[Any], module: Any, name: str, **values: Any) -> Any:
    """``module.name(**values)``, the keywords checked against the declaration first."""
    return getattr(module, name)(**_keywords(module_protocol, name, values))


@pytest.mark.parametrize("name", sorted(MODULE_PROTOCOLS))
def test_each_module_offers_every_declared_name(twin: impl_module.Impl, name: str) -> None:
    module = getattr(twin, name)
    for member, declared in _members(MODULE_PROTOCOLS[name]).items():
        where = f"{twin.name} {name}.{member}"
        assert hasattr(module, member), f"{where} is missing"
        value = getattr(module, member)
        if inspect.isfunction(declared) and not isinstance(value, type):
            _check_callable(declared, value, where)
        if isinstance(declared, property) and isinstance(value, type):
            assert isinstance(value, type), where  # a class, for isinstance and construction


def test_every_exported_name_is_declared() -> None:
    """What a twin exports is in its module Protocol: nothing reaches callers untyped."""
    pure = impl_module.pure()
    for name, protocol in MODULE_PROTOCOLS.items():
        exported = set(getattr(pure, name).__all__)
        declared = set(_members(protocol))
        # Classes only the twin itself builds are declared as instances, not constructors.
        internal = {"fastlane": {"Flight"}, "edgeloop": {"Conn"}}.get(name, set())
        assert exported - internal <= declared, (name, exported - declared)


class World:
    """One twin's objects, each built with keywords named as declared."""

    def __init__(self, twin: impl_module.Impl) -> None:
        http1, jsonrpc, limiter, fastlane = twin.http1, twin.jsonrpc, twin.limiter, twin.fastlane
        h, li, f = (
            http1_types.Http1Module,
            limiter_types.LimiterModule,
            fastlane_types.FastlaneModule,
        )
        limits = {"max_line": 8192, "max_header_bytes": 16384, "max_headers": 100}
        self.parser = _build(h, http1, "RequestParser", **limits, max_body=1 << 20)
        self.parser.feed(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}" % PATH)
        self.request = self.parser.next_event()
        self.response_parser = _build(h, http1, "ResponseParser", **limits, max_body=1 << 20)
        self.response_parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        self.response = self.response_parser.next_event()
        broken = http1.RequestParser()
        broken.feed(b"NOT HTTP\r\n\r\n")
        self.http_error = broken.next_event()
        assert isinstance(self.http_error, http1.HttpError)

        self.parsed = jsonrpc.parse_request(b'[{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}]', 9)
        self.call = self.parsed.calls[0]
        parsed_response = jsonrpc.parse_response(b'{"jsonrpc":"2.0","id":1,"result":"0x1"}')
        assert parsed_response is not None
        self.parsed_response = parsed_response
        self.reply = parsed_response.replies[0]

        self.key_limiter = _build(li, limiter, "KeyLimiter", rps=1.0, cu_rate=1.0, now=0.0)
        self.day_quota = _build(li, limiter, "DayQuota", limit=10, day=0, used=0)
        self.usage_meter = _build(li, limiter, "UsageMeter")

        self.method_stats = _build(f, fastlane, "MethodStats")
        self.budget = _build(f, fastlane, "AnswerBudget", limit=1 << 20)
        self.cache = _build(f, fastlane, "ResponseCache", max_entries=10, max_bytes=1 << 16)
        self.ids = _build(f, fastlane, "RequestIds", prefix=b"t")
        self.latency = _build(f, fastlane, "LatencyMeter", bounds=(0.1, 1.0))
        self.route = _build(
            f,
            fastlane,
            "Route",
            label="ethereum/devnet",
            family="evm",
            testnet=True,
            methods=METHODS.family("evm"),
            passthrough=None,
            cache=self.cache,
            jsonrpc=jsonrpc,
            max_batch=10,
            max_answer=1 << 20,
            coalesce=True,
            upstream_batch=10,
            refusals={},
            python_methods=frozenset(),
            sticky=None,
            sticky_methods=frozenset(),
        )
        self.method = self.route.methods["eth_chainId"]
        self.flight = self.route.open_flight(("eth_chainId", b""), None, self.method, None)
        self.open_admission = _build(f, fastlane, "OpenAdmission", anonymous=ANONYMOUS)
        gate = KeyGate(SimpleNamespace(recent={}, used=set()), limiter, fastlane)  # type: ignore[arg-type]
        self.key_admission = _build(
            f, fastlane, "KeyAdmission", gate=gate, recent={}, failures={}, used=set()
        )
        histogram = LatencyHistogram()
        self.ledger = _build(
            f,
            fastlane,
            "Ledger",
            statuses={"rpc": defaultdict(int)},
            latency={"rpc": histogram.series("rpc")},
            access_log=AccessLog(enabled=False),
        )
        self.lane = _build(
            f,
            fastlane,
            "Lane",
            routes={PATH: self.route},
            admission=self.open_admission,
            ledger=self.ledger,
            ids=self.ids,
            cors=cors.answer_headers,
            error_body=error_body,
            log_path=loggable_path,
        )

        self.loop = _build(
            edgeloop_types.EdgeloopModule,
            twin.edgeloop,
            "Loop",
            http1=http1,
            lane=self.lane,
            limits=(8192, 16384, 100, 1 << 20),
            max_unsent_bytes=1 << 20,
            max_auth_failures=10,
            compress_min=1 << 20,
            budget=self.budget,
            date=DateHeader(),
            error_body=error_body,
            handoff=lambda conn, request: None,
            encode=lambda conn, status, headers, body: None,
            closed=lambda conn: None,
        )

    def objects(self) -> Iterator[tuple[str, Any, type[Any]]]:
        yield "Request", self.request, http1_types.Request
        yield "Response", self.response, http1_types.Response
        yield "HttpError", self.http_error, http1_types.HttpError
        yield "RequestParser", self.parser, http1_types.RequestParser
        yield "ResponseParser", self.response_parser, http1_types.ResponseParser
        yield "ParsedRequest", self.parsed, jsonrpc_types.ParsedRequest
        yield "Call", self.call, jsonrpc_types.Call
        yield "ParsedResponse", self.parsed_response, jsonrpc_types.ParsedResponse
        yield "Reply", self.reply, jsonrpc_types.Reply
        yield "KeyLimiter", self.key_limiter, limiter_types.KeyLimiter
        yield "DayQuota", self.day_quota, limiter_types.DayQuota
        yield "UsageMeter", self.usage_meter, limiter_types.UsageMeter
        yield "MethodStats", self.method_stats, fastlane_types.MethodStats
        yield "AnswerBudget", self.budget, fastlane_types.AnswerBudget
        yield "ResponseCache", self.cache, fastlane_types.ResponseCache
        yield "RequestIds", self.ids, fastlane_types.RequestIds
        yield "LatencyMeter", self.latency, fastlane_types.LatencyMeter
        yield "Route", self.route, fastlane_types.Route
        yield "Method", self.method, fastlane_types.Method
        yield "Flight", self.flight, fastlane_types.Flight
        yield "OpenAdmission", self.open_admission, fastlane_types.Admission
        yield "KeyAdmission", self.key_admission, fastlane_types.Admission
        yield "Ledger", self.ledger, fastlane_types.Ledger
        yield "Lane", self.lane, fastlane_types.Lane
        yield "Loop", self.loop, edgeloop_types.Loop


def test_every_object_offers_its_protocol(twin: impl_module.Impl) -> None:
    world = World(twin)
    try:
        for name, obj, protocol in world.objects():
            _check_object(obj, protocol, f"{twin.name} {name}")
        left, right = socket.socketpair()
        try:
            conn = world.loop.register(left, "127.0.0.1", "127.0.0.1")
            _check_object(conn, edgeloop_types.Conn, f"{twin.name} Conn")
            world.loop.close(conn)
        finally:
            right.close()
    finally:
        world.loop.close_loop()


def test_what_the_lane_asks_of_auth_is_what_auth_offers() -> None:
    """The key gate's principal and gate offer what the lane's Protocols declare."""
    twin = impl_module.pure()
    principal = Principal(
        key_id="k",
        limiter=twin.limiter.KeyLimiter(1.0, 1.0, 0.0),
        quota=twin.limiter.DayQuota(1, 0),
    )
    _check_object(principal, fastlane_types.Principal, "Principal")
    gate = KeyGate(SimpleNamespace(recent={}, used=set()), twin.limiter, twin.fastlane)  # type: ignore[arg-type]
    _check_object(gate, fastlane_types.AdmissionGate, "KeyGate")
    _check_object(METHODS.family("evm")["eth_chainId"], fastlane_types.MethodSpec, "MethodSpec")
