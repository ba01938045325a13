"""Which upstream can simulate what, and the calls that ask it.

Three features decide how a simulation runs (docs/decisions/simulation.md):

* ``simulate_v1`` — ``eth_simulateV1`` with ``traceTransfers`` (geth 1.14.9+, reth, anvil,
  erigon 3);
* ``call_tracer`` — ``debug_traceCall`` with ``callTracer`` and ``withLog`` (geth, reth,
  anvil, erigon, nethermind; many hosted nodes keep the debug namespace off);
* ``prestate_diff`` — ``debug_traceCall`` with ``prestateTracer`` in ``diffMode``: what a
  bundle needs on a node without ``eth_simulateV1``.

Each upstream is asked once, with a probe of each feature in one batch sent to that upstream
first (``prefer``); the answers are kept.  An upstream that never answered the probe is asked
again on the next simulation; one that answered "no such method" again after
``RECHECK_SECONDS`` (nodes get upgraded).  A call that meets "no such method" where the probe
said yes marks the feature missing there and the simulation picks again.

The answers are read with msgspec from the raw body (``pool.request``, which does not hold a
trace to the proxy's framing depth), bounded by ``max_bytes``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec
import trio

from chaingate.rpc.errors import BAD_RESPONSE, UpstreamError
from chaingate.rpc.pool import UpstreamPool
from chaingate.simulation.execution import MAX_DEPTH

__all__ = [
    "FEATURES",
    "Capabilities",
    "Feature",
    "Node",
    "NodeError",
    "TooDeepAnswer",
    "TooLargeAnswer",
    "Unsupported",
]

log = logging.getLogger("chaingate.simulation")

Feature = Literal["simulate_v1", "call_tracer", "prestate_diff"]
FEATURES: tuple[Feature, ...] = ("simulate_v1", "call_tracer", "prestate_diff")
RECHECK_SECONDS = 600.0
PROBE_SECONDS = 5.0

_ZERO = "0x" + "00" * 20
_PROBES: dict[Feature, tuple[str, list[Any]]] = {
    "simulate_v1": ("eth_simulateV1", [{"blockStateCalls": [{"calls": []}]}, "latest"]),
    "call_tracer": (
        "debug_traceCall",
        [{"to": _ZERO}, "latest", {"tracer": "callTracer", "tracerConfig": {"withLog": True}}],
    ),
    "prestate_diff": (
        "debug_traceCall",
        [{"to": _ZERO}, "latest", {"tracer": "prestateTracer", "tracerConfig": {"diffMode": True}}],
    ),
}
# What nodes answer for a method or tracer they do not have: -32601 (geth, reth, anvil),
# -32004 (EIP-1474 "method not supported"), and messages to that effect from the others.
# Never a bare "not found": that is what a node says of an unknown block ("header not found",
# "Resource not found"), and any client can name one: it must not switch a feature off.
_MISSING_CODES = frozenset({-32601, -32004})
_MISSING_WORDS = re.compile(
    r"not (?:supported|available|enabled|allowed)|(?:method|tracer) not found|does not exist|"
    r"unsupported|unknown (?:method|tracer)|no such method|disabled",
    re.IGNORECASE,
)


class NodeError(Exception):
    """The node answered the call with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(f"{code} {message}")
        self.code = code
        self.message = message
        self.data = data

    @property
    def missing(self) -> bool:
        """The node does not have the method (or tracer) at all."""
        return self.code in _MISSING_CODES or _MISSING_WORDS.search(self.message) is not None


class Unsupported(Exception):
    """The upstream that answered lacks ``feature``."""

    def __init__(self, upstream: str, feature: Feature) -> None:
        super().__init__(f"{upstream} does not support {feature}")
        self.upstream = upstream
        self.feature = feature


class TooLargeAnswer(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the node's answer has {size} bytes, more than {limit}")
        self.size = size
        self.limit = limit


class TooDeepAnswer(TooLargeAnswer):
    """An answer nested deeper than the interpreter reads (a trace of calls nested that far
    is past MAX_DEPTH anyway)."""

    def __init__(self) -> None:
        Exception.__init__(self, f"the node's answer nests deeper than {MAX_DEPTH} calls")
        self.size = 0
        self.limit = MAX_DEPTH


_ABSENT = msgspec.Raw(b"")


class _Reply(msgspec.Struct):
    id: int | None = None
    result: msgspec.Raw = _ABSENT  # raw JSON, "null" included; empty when absent
    error: dict[str, Any] | None = None


_encode = msgspec.json.Encoder().encode
_decode_one = msgspec.json.Decoder(_Reply).decode
_decode_many = msgspec.json.Decoder(list[_Reply]).decode


def _outcome(reply: _Reply) -> bytes | NodeError:
    if reply.error is not None:
        error = reply.error
        code = error.get("code")
        return NodeError(
            code if isinstance(code, int) else 0, str(error.get("message", ""))[:500],
            error.get("data"),
        )  # fmt: skip
    if not reply.result:
        return NodeError(0, "the node answered without a result")
    return bytes(reply.result)


class Node:
    """One network's upstreams, as the simulations call them."""

    def __init__(self, pool: UpstreamPool, max_bytes: int) -> None:
        self.pool = pool
        self.max_bytes = max_bytes
        self._next_id = 1

    def ranked(self) -> list[str]:
        return [upstream.name for upstream in self.pool.ranked()]

    async def batch(
        self, calls: Sequence[tuple[str, Sequence[Any]]], deadline: float, prefer: str | None
    ) -> tuple[str, list[bytes | NodeError]]:
        """(the upstream that answered, each call's raw result or NodeError), in call order.
        UpstreamError when no upstream answered; TooLargeAnswer past ``max_bytes``."""
        first = self._next_id
        self._next_id += len(calls)
        single = len(calls) == 1
        items = [
            {"jsonrpc": "2.0", "id": first + i, "method": method, "params": params}
            for i, (method, params) in enumerate(calls)
        ]
        body = _encode(items[0] if single else items)
        # An idle connection: a simulation is slow next to the proxied calls a pipeline holds.
        upstream, response = await self.pool.request(
            body, retry_safe=True, deadline=deadline, prefer=prefer, prefer_idle=True
        )
        raw = response.body
        if len(raw) > self.max_bytes:
            raise TooLargeAnswer(len(raw), self.max_bytes)
        try:
            replies = [_decode_one(raw)] if single else _decode_many(raw)
        except msgspec.DecodeError:
            raise UpstreamError(
                BAD_RESPONSE, "the answer is not JSON-RPC", sent=True, upstream=upstream.name
            ) from None
        except RecursionError:  # nested deeper than any answer chaingate can read
            raise TooDeepAnswer() from None
        if single:
            return upstream.name, [_outcome(replies[0])]
        by_id = {reply.id: reply for reply in replies}
        out: list[bytes | NodeError] = []
        for offset in range(len(calls)):
            reply = by_id.get(first + offset)
            out.append(_outcome(reply) if reply else NodeError(0, "the node skipped this call"))
        return upstream.name, out


class Capabilities:
    """What each upstream of one network can do (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self.known: dict[str, dict[Feature, bool]] = {}
        self._checked: dict[str, float] = {}
        self._probing: trio.Event | None = None

    def note(self, upstream: str, feature: Feature, supported: bool) -> None:
        self.known.setdefault(upstream, {})[feature] = supported
        self._checked[upstream] = self._clock()

    def _due(self, ranked: Sequence[str]) -> list[str]:
        now = self._clock()
        due = []
        for upstream in ranked:
            features = self.known.get(upstream)
            unknown = features is None or len(features) < len(FEATURES)
            stale = now - self._checked.get(upstream, now) > RECHECK_SECONDS
            if unknown or (features is not None and not all(features.values()) and stale):
                due.append(upstream)
        return due

    async def ensure(self, node: Node) -> None:
        """Probe the upstreams not known yet (one probe round at a time; others wait)."""
        while self._probing is not None:
            await self._probing.wait()
        due = self._due(node.ranked())
        if not due:
            return
        self._probing = done = trio.Event()
        try:
            with trio.move_on_after(PROBE_SECONDS):
                async with trio.open_nursery() as nursery:
                    for upstream in due:
                        nursery.start_soon(self._probe, node, upstream)
        finally:
            self._probing = None
            done.set()

    async def _probe(self, node: Node, upstream: str) -> None:
        calls = [_PROBES[feature] for feature in FEATURES]
        deadline = trio.current_time() + PROBE_SECONDS
        try:
            answered, outcomes = await node.batch(calls, deadline, prefer=upstream)
        except (UpstreamError, TooLargeAnswer) as exc:
            log.info(
                "simulation capability probe failed",
                extra={"fields": {"upstream": upstream, "error": str(exc)}},
            )
            return
        for feature, outcome in zip(FEATURES, outcomes, strict=True):
            supported = not (isinstance(outcome, NodeError) and outcome.missing)
            self.note(answered, feature, supported)
        fields: dict[str, Any] = {"upstream": answered}
        for feature, supported in self.known.get(answered, {}).items():
            fields[feature] = supported
        log.info("simulation capabilities", extra={"fields": fields})
