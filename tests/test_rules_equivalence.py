"""The fast lane and the Python handler apply the same request rules: same answers, same books.

One real gateway (API keys on, a SQLite store, anvil behind it) per twin, running in a thread of
its own so that hypothesis can drive it example by example.  Each example is one request —
a single call or a batch of calls of every method in config/methods.toml, unknown methods,
malformed calls, bad and historical block tags — sent by one of several keys (all scopes, read
only, write only, a method allowlist, none, an unknown one), presented as ``X-API-Key``, as
``Authorization: Bearer``, in the path, or in both; to a testnet or a mainnet endpoint.

The request is sent twice over a real connection: on the endpoint's own path, where the fast
lane answers what it can, then on the same path with a percent-encoded letter, which the lane
(it matches request targets exactly) hands to the handler and the handler (it decodes a path
once, ``chaingate.edge.paths``) routes to the same endpoint.  Status, body, usage rows (key,
network, method, requests, compute units, errors), latency samples and method counters must
be equal.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.rpc.methods import MethodTable
from chaingate.twins import Impl
from tests.conftest import StartGateway
from tests.helpers import parse_responses, post_bytes, rpc_body
from tests.test_auth import AuthStack, auth_settings, start_auth

T = TypeVar("T")

EVM = MethodTable.load(Path(__file__).resolve().parents[1] / "config" / "methods.toml").family(
    "evm"
)
# Filters are numbered by the node: asking twice gives two answers, whichever path asks.
NUMBERED = {"eth_newFilter", "eth_newBlockFilter", "eth_newPendingTransactionFilter"}
NAMES = sorted(set(EVM) - NUMBERED)
ENDPOINTS = {"devnet": b"devne%74", "mainnet": b"mainne%74"}  # the handler's spelling
ADDRESS = "0x" + "00" * 19 + "01"
HASH = "0x" + "ab" * 32
GOOD_TAGS = ["latest", "earliest", "safe", "finalized", "0x0", "0x1", HASH, {"blockNumber": "0x0"}]
BAD_TAGS = ["LATEST", "0x", "0xzz", "0x" + "1" * 65, 7, "tomorrow", None, [1]]
UNKNOWN = ["eth_doesNotExist", "chaingate_nothing", "x" * 100]
# Weighted toward what the lane answers itself (the others it hands off on either path).
KEYS = ("full", "full", "full", "live", "read", "write", "allowlisted", "none", "unknown")
PRESENTATIONS = ["header", "header", "bearer", "bearer-lower", "path", "path", "path+header"]
PRESENTATIONS += ["path+other"]
NETWORKS = ("devnet", "devnet", "devnet", "mainnet")


@st.composite
def calls(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["known"] * 6 + ["unknown", "malformed"]))
    if kind == "malformed":
        return draw(
            st.sampled_from(
                [
                    {"jsonrpc": "1.0", "id": 1, "method": "eth_chainId"},
                    {"jsonrpc": "2.0", "id": 2},
                    {"jsonrpc": "2.0", "id": 3, "method": 5},
                    7,
                    "call",
                ]
            )
        )
    if kind == "unknown":
        method = draw(st.sampled_from(UNKNOWN))
        params: list[Any] = []
    else:
        method = draw(st.sampled_from(NAMES))
        spec = EVM[method]
        if spec.block_param is not None:
            params = [ADDRESS for _ in range(spec.block_param)]
            if draw(st.booleans()) or spec.block_param == 0:
                params.append(draw(st.sampled_from(GOOD_TAGS) | st.sampled_from(BAD_TAGS)))
        else:
            params = draw(st.sampled_from([[], [ADDRESS], [HASH]]))
    call: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    identity = draw(st.sampled_from(["int", "str", "null", "absent"]))
    if identity == "int":
        call["id"] = draw(st.integers(-5, 2**40))
    elif identity == "str":
        call["id"] = draw(st.text("abc-1", max_size=4))
    elif identity == "null":
        call["id"] = None
    return call


bodies = st.one_of(
    calls().map(lambda call: json.dumps(call).encode()),
    st.lists(calls(), min_size=1, max_size=4).map(lambda batch: json.dumps(batch).encode()),
    st.sampled_from([b"{", b"[]", b'{"jsonrpc":"2.0"', b"null"]),
)


class Gateway:
    """A gateway with keys on, running in a trio loop of its own thread."""

    def __init__(self, impl: Impl, anvil: AnvilProcess, tmp_path: Path) -> None:
        self._impl = impl
        self._anvil = anvil
        self._tmp = tmp_path
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self.keys: dict[str, str] = {}
        self.examples = 0
        self._stats: Counter[tuple[str, str, str]] = Counter()

    def __enter__(self) -> Gateway:
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(120)
        if self._failure is not None:
            raise self._failure
        assert self._ready.is_set(), "the gateway did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)

    def run(self, function: Callable[[], Awaitable[T]]) -> T:
        return trio.from_thread.run(function, trio_token=self._token)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to the test by __enter__
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        settings = auth_settings(
            self._anvil,
            f"sqlite://{self._tmp}/store.db",
            self._tmp,
            # The test drains the usage meter itself: no writer takes the rows first.
            auth={"usage_flush_interval": 3600.0},
        )
        async with trio.open_nursery() as nursery:
            self.stack = await start_auth(nursery, self._impl, settings)
            await self._make_keys(self.stack)
            self.gateway = self.stack.handle.gateway
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _make_keys(self, stack: AuthStack) -> None:
        self.keys["full"], _ = await stack.key(plan="enterprise")
        self.keys["live"], _ = await stack.key(plan="enterprise", env="live")
        self.keys["read"], _ = await stack.key(plan="enterprise", scopes="rpc:read")
        self.keys["write"], _ = await stack.key(plan="enterprise", scopes="rpc:write")
        key, key_id = await stack.key(plan="enterprise")
        lists = {"methods": ["eth_chainId", "eth_blockNumber", "eth_getBalance", "eth_call"]}
        await admin.update_allowlists(AuthRows(stack.store), key_id, lists, set())
        await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
        self.keys["allowlisted"] = key
        self.keys["unknown"] = "svc_test_" + "Z" * 43

    def books(self) -> dict[str, Any]:
        """What was metered and counted since the last call (the meters are drained)."""
        gate: Any = self.gateway.gate
        usage: Counter[tuple[Any, ...]] = Counter()
        for key, account, network, method, _minute, requests, units, errors in gate.meter.drain():
            usage[(key, account, network, method, "requests")] += requests
            usage[(key, account, network, method, "cu")] += units
            usage[(key, account, network, method, "errors")] += errors
        timed: Counter[tuple[str, str, str]] = Counter()
        for account, network, method, _minute, counts in gate.latency.drain():
            timed[(account, network, method)] += sum(counts)
        stats: Counter[tuple[str, str, str]] = Counter()
        for label, service in self.gateway.chain.services.items():
            for name, counts in service.stats.items():
                stats[(label, name, "ok")] += counts.ok
                stats[(label, name, "error")] += counts.error
        since, self._stats = stats - self._stats, stats
        return {"usage": +usage, "timed": +timed, "stats": since}


@pytest.fixture
def gateway(impl: Impl, anvil: AnvilProcess, tmp_path: Path) -> Iterator[Gateway]:
    with Gateway(impl, anvil, tmp_path) as running:
        yield running


def _request(
    keys: dict[str, str], who: str, presentation: str, endpoint: bytes
) -> tuple[bytes, bytes]:
    """(path, header lines) of a request by ``who`` presenting its key as ``presentation``."""
    path = b"/v1/rpc/ethereum/" + endpoint
    key = keys.get(who, "").encode()
    if who == "none":
        return path, b""
    if presentation == "header":
        return path, b"X-API-Key: " + key + b"\r\n"
    if presentation == "bearer":
        return path, b"Authorization: Bearer " + key + b"\r\n"
    if presentation == "bearer-lower":
        return path, b"Authorization: bearer  " + key + b"\r\n"
    if presentation == "path":
        return path + b"/" + key, b""
    if presentation == "path+header":
        return path + b"/" + key, b"X-API-Key: " + key + b"\r\n"
    return path + b"/" + key, b"X-API-Key: " + keys["live"].encode() + b"\r\n"  # path+other


async def exchange(port: int, data: bytes, source: str) -> bytes:
    """Send one request from the loopback address ``source``; read until the server closes.
    (Failed authentications are limited per client address: each example has its own.)"""
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
        async with stream:
            await stream.send_all(data)
            chunks = []
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
            return b"".join(chunks)


_VOLATILE = {"date", "x-request-id", "x-cache", "x-ratelimit-remaining", "x-ratelimit-reset"}


@settings(
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=bodies,
    who=st.sampled_from(KEYS),
    presentation=st.sampled_from(PRESENTATIONS),
    network=st.sampled_from(NETWORKS),
)
def test_the_lane_and_the_handler_answer_and_meter_alike(
    gateway: Gateway, body: bytes, who: str, presentation: str, network: str
) -> None:
    async def both() -> list[tuple[Any, ...]]:
        lane = gateway.gateway.front.lane
        gateway.examples += 1
        source = f"127.1.{gateway.examples // 250}.{gateway.examples % 250 + 1}"
        outcomes = []
        for endpoint in (network.encode(), ENDPOINTS[network]):
            path, headers = _request(gateway.keys, who, presentation, endpoint)
            served = lane.served
            raw = await exchange(
                gateway.gateway.port,
                post_bytes(path.decode(), body, headers + b"Connection: close\r\n"),
                source,
            )
            if endpoint == ENDPOINTS[network]:
                assert lane.served == served, "the encoded path was answered by the lane"
            (response,) = parse_responses(raw, ["POST"])
            shown = {k: v for k, v in response.headers.items() if k not in _VOLATILE}
            outcomes.append((response.status, response.body, shown, gateway.books()))
        return outcomes

    by_lane, by_handler = gateway.run(both)
    assert by_lane == by_handler


async def test_with_keys_off_two_keys_are_ignored_on_both_paths(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    """Keys off: a key in the path and another in a header identify no one, so neither the
    lane nor the handler refuses them (the handler used to answer 400 where the lane served)."""
    handle = await start_gateway([anvil.url])
    path_key, header_key = b"svc_test_" + b"A" * 43, b"svc_test_" + b"B" * 43
    for endpoint in (b"devnet", ENDPOINTS["devnet"]):
        path = b"/v1/rpc/ethereum/" + endpoint + b"/" + path_key
        raw = await exchange(
            handle.port,
            post_bytes(
                path.decode(),
                rpc_body("eth_chainId"),
                b"X-API-Key: " + header_key + b"\r\nConnection: close\r\n",
            ),
            "127.0.0.1",
        )
        (response,) = parse_responses(raw, ["POST"])
        assert (response.status, response.json()["result"]) == (200, "0x7a69"), endpoint
