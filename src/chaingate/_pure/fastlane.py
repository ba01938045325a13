"""The RPC fast lane, sans-IO: the pure-Python twin of ``native/fastlane.pyx``.

The edge loop (``edgeloop``) hands every complete request on a JSON-RPC path to ``Lane.serve``,
which answers from memory what it can — the key check, scopes, compute units and token
buckets, the static and finality-aware cache, calls joined to identical calls already in
flight, JSON-RPC errors, 429s — and says ``HANDOFF`` for everything else: that request goes,
untouched, to the Python handler (``chaingate.edge.routes``), which answers every request the
lane does not know how to (see docs/decisions/edge.md for the list).  A request the lane keeps
is never handed off later: it decides before anything is counted or charged.

Calls that need a node become ``Flight``s: one per distinct call in flight, shared by every
request that asks the same coalescible call meanwhile (single calls and batch items alike).
New flights are grouped (by retry class, at most the upstream's batch size) and given to the
route's ``dispatch`` — the RPC service sends each group as one upstream request and calls
``Route.land`` with each flight's outcome.  Landing completes the answers waiting on it; a
finished answer goes to the lane's ``sink`` (the edge loop), which writes it.

This module is the specification: the compiled twin must answer every request with the same
bytes, count the same things and hand off the same requests (tests/test_fastlane.py).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import msgspec

from chaingate.framing_constants import (
    ADMITTED,
    DAY_QUOTA,
    JSON_HEADERS,
    NO_READ_SCOPE,
    NO_WRITE_SCOPE,
    RATE,
)
from chaingate.refusals import Rejection, refusal_error
from chaingate.twintypes import fastlane as twin
from chaingate.twintypes.http1 import Request
from chaingate.twintypes.jsonrpc import JsonRpcModule, Reply
from chaingate.twintypes.metering import UNTIMED

log = logging.getLogger("chaingate.edge")

__all__ = [
    "DEFER",
    "HANDOFF",
    "IMPLEMENTATION",
    "AnswerBudget",
    "Flight",
    "KeyAdmission",
    "Lane",
    "LatencyMeter",
    "Ledger",
    "MethodStats",
    "OpenAdmission",
    "RequestIds",
    "ResponseCache",
    "Route",
    "log_filter_ends",
    "logs_limit",
    "logs_verdict",
    "presented_key",
    "split_path_key",
]

IMPLEMENTATION = "pure"

# What ``Lane.serve`` answers when it does not answer with (status, headers, body).
HANDOFF = "handoff"  # not ours: the Python handler answers this request
DEFER = "defer"  # ours, waiting for flights: the answer goes to the sink when they land

# Bytes a reply adds beyond its id and payload: '{"jsonrpc":"2.0","id":' ',"result":' '}' and
# the comma that separates it from the next reply of a batch (rpc/answers.py says the same).
REPLY_OVERHEAD = 34
# Outcomes of an answer's admission of one more reply.
FITS, TOO_LARGE, BUSY = 0, 1, 2

INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
BAD_TAG_MESSAGE = (
    "invalid params: the block tag must be latest, pending, safe, finalized, earliest, "
    "a hex number, a block hash or an EIP-1898 object"
)
BAD_SLOT_MESSAGE = "invalid params: the slot must be a non-negative integer"
# The error of a call that could not be handed to the upstream side (a bug of ours).
UNSENT = b'{"code":-32603,"message":"internal error: the call was not sent; retry"}'
ANSWER_TOO_LARGE = "answer_too_large"
OVERLOADED = "overloaded"

JSON = JSON_HEADERS
_CACHE_HEADERS = {
    cache: JSON + b"X-Cache: " + cache + b"\r\n" for cache in (b"HIT", b"MISS", b"PARTIAL")
}
_NAMED_TAGS = frozenset({b'"latest"', b'"pending"', b'"safe"', b'"finalized"', b'"earliest"'})
_CURRENT_TAGS = frozenset({b'"latest"', b'"pending"', b'"safe"', b'"finalized"'})
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
SECONDS_PER_DAY = 86_400
# Bounds of a latency histogram the meter accepts (the compiled twin keeps them in a C array).
MAX_LATENCY_BOUNDS = 31
# A path segment that is an API key (auth/apikeys.py), not a name.
KEY_SHAPES = (b"svc_live_", b"svc_test_")

# Cache policies (MethodSpec.cache).
NO_CACHE, STATIC, FINALIZED = "none", "static", "finalized"
# A Solana call that names a commitment other than "finalized" (processed, confirmed, or an
# old alias of theirs) reads what may still change: never cached.  (In the params of the
# methods the cache may hold, the other strings are base58 signatures and names like "json" or
# "full": neither quoted word occurs by accident.)
COMMITMENT_KEY, FINALIZED_COMMITMENT = b'"commitment"', b'"finalized"'

# What becomes of an eth_getLogs block range (``logs_verdict``; rpc/logranges.py acts on it).
LOGS_FORWARD, LOGS_REFUSE, LOGS_SPLIT = 0, 1, 2
_HEAD_TAGS = frozenset({b'"latest"', b'"pending"', b'"safe"', b'"finalized"'})


def logs_limit(network_blocks: int, plan_blocks: int) -> int:
    """The widest eth_getLogs range a caller may ask for (0: no limit): the network's
    ``logs.max_block_range``, lowered (never raised) by the plan's ``logs_max_block_range``
    (0: none of its own)."""
    if plan_blocks and (not network_blocks or plan_blocks < network_blocks):
        return plan_blocks
    return network_blocks


def logs_verdict(low: int, high: int, limit_blocks: int, upstream_blocks: int) -> int:
    """The range rule of eth_getLogs, for blocks ``low`` to ``high`` (tags resolved):
    LOGS_FORWARD (one upstream call, untouched; an inverted range too: the node says what it
    thinks of it), LOGS_REFUSE (wider than ``limit_blocks``) or LOGS_SPLIT (wider than
    ``upstream_blocks``, the widest range sent to a node in one call; 0: never split)."""
    if high < low:
        return LOGS_FORWARD
    span = high - low + 1
    if limit_blocks and span > limit_blocks:
        return LOGS_REFUSE
    if not upstream_blocks or span <= upstream_blocks:
        return LOGS_FORWARD
    return LOGS_SPLIT


class _LogFilter(msgspec.Struct):
    """What the lane reads of an eth_getLogs filter: each member's raw JSON, empty when
    absent (a member present as null is ``null``)."""

    fromBlock: msgspec.Raw = msgspec.Raw()
    toBlock: msgspec.Raw = msgspec.Raw()
    blockHash: msgspec.Raw = msgspec.Raw()


_log_filter = msgspec.json.Decoder(tuple[_LogFilter])


def log_filter_ends(params: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The raw JSON of an eth_getLogs call's one filter's fromBlock, toBlock and blockHash
    (empty when absent), or None when the params are not one filter object.  (The compiled
    twin reads the usual filter in one scan and decodes anything else as here.)"""
    try:
        (query,) = _log_filter.decode(params)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return bytes(query.fromBlock), bytes(query.toBlock), bytes(query.blockHash)


def _needs_head(end: bytes) -> bool:
    """Is this end of a range the head (absent, or a head tag)?"""
    return not end or end in _HEAD_TAGS


def _logs_bound(raw: bytes, head: int | None) -> int:
    """The block one end of a range names, as the lane reads it: absent or a head tag (the
    head), ``earliest`` (0) or a hex quantity; -1 for anything else
    (the handler reads it: rpc/logranges.py).  At most 15 digits: a number the compiled
    twin holds in a C integer."""
    text = bytes(raw)
    if not text:
        return -1 if head is None else head
    if text[:3] == b'"0x' and 4 < len(text) <= 19 and text[-1:] == b'"':
        digits = text[3:-1]
        return int(digits, 16) if _HEX.issuperset(digits) else -1
    if text in _HEAD_TAGS:
        return -1 if head is None else head
    if text == b'"earliest"':
        return 0
    return -1


class MethodStats:
    """Call counters of one method on one network (read by /metrics)."""

    __slots__ = ("cache_hits", "error", "ok")

    def __init__(self) -> None:
        self.ok = 0
        self.error = 0
        self.cache_hits = 0


class AnswerBudget:
    """Reply bytes held by batches being assembled, all requests of the process together
    (``rpc.max_assembling_bytes``; see rpc/answers.py)."""

    __slots__ = ("held", "limit", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0  # replies refused because the budget was spent

    @property
    def exhausted(self) -> bool:
        return self.held >= self.limit

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            self.refused += 1
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held = max(0, self.held - size)


# Rough per-entry overhead (tuple, bytes headers, dict slot) counted against max_bytes.
_ENTRY_OVERHEAD = 160


class ResponseCache:
    """A bounded LRU of JSON-RPC results that can no longer change, keyed by
    ``(method, raw params)``; values are the raw ``result`` bytes as a node sent them.  Only
    the RPC service decides what may enter (static answers, facts about finalized blocks)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._entries: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, bytes]) -> bytes | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: tuple[str, bytes], value: bytes) -> None:
        size = len(value) + len(key[1]) + _ENTRY_OVERHEAD
        if size > self._max_bytes or self._max_entries <= 0:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old) + len(key[1]) + _ENTRY_OVERHEAD
        self._entries[key] = value
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            old_key, old_value = self._entries.popitem(last=False)
            self.bytes -= len(old_value) + len(old_key[1]) + _ENTRY_OVERHEAD
            self.evictions += 1


class RequestIds:
    """``X-Request-Id`` values: the client's own when it is sane (1 to 128 of ``[A-Za-z0-9._:-]``),
    else ``<process prefix>-<hex counter>``.  One per process, shared by the lane and the
    Python handler, so no two requests get the same id."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._counter = 0

    def take(self, supplied: bytes | None) -> bytes:
        if supplied is not None and 0 < len(supplied) <= 128 and _ID_CHARS.issuperset(supplied):
            return supplied
        self._counter += 1
        return b"%s-%x" % (self._prefix, self._counter)


def valid_block_tag(tag: bytes, family: str) -> bool:
    """A block reference a node can understand (``Route.classify`` asks).

    EVM: a named tag, a hex quantity, a 32-byte hash or an EIP-1898 object.  Solana: a slot,
    a non-negative integer."""
    if family == "solana":
        return tag.isdigit()
    if tag in _NAMED_TAGS or tag[:1] == b"{":
        return True
    if len(tag) < 5 or tag[:3] != b'"0x' or tag[-1:] != b'"':
        return False
    digits = tag[3:-1]
    return len(digits) <= 64 and all(c in _HEX for c in digits)


def _upstream_id(raw: bytes | None) -> int:
    """The id of an upstream reply as ours are spelled (decimal digits), else -1."""
    if raw is None or not raw.isdigit() or len(raw) > 18:
        return -1
    return int(raw)


def split_path_key(path: bytes) -> tuple[bytes, bytes | None]:
    """(endpoint path, key) of a path whose last segment is key-shaped (``…/{key}``, the form
    wallets and tools that take only a URL use), else (path, None)."""
    head, _, key = path.rpartition(b"/")
    if key.startswith(KEY_SHAPES) and not head.endswith(b"/"):
        return head, key
    return path, None


def presented_key(request: twin.Presenter, path_key: bytes | None = None) -> bytes | None:
    """The API key a request presents: ``X-API-Key``, else ``Authorization: Bearer``, else
    the key in its path (``path_key``, the form tools that take only a URL use), which a key
    in a header must then equal.  None: no key at all, or a header's key other than the
    path's (the gate says which, ``KeyGate.authenticate``)."""
    raw = request.api_key
    if raw is None:
        authorization = request.authorization
        if authorization is not None and authorization[:7].lower() == b"bearer ":
            raw = authorization[7:].strip()
    if path_key is None:
        return raw
    if raw is not None and raw != path_key:
        return None
    return path_key


class Method:
    """One row of the method table as the lane reads it (built from ``MethodSpec``)."""

    __slots__ = (
        "block_param",
        "cache",
        "coalescible",
        "commitment",
        "cu",
        "cu_historical",
        "name",
        "retry",
        "spec",
        "special",
        "stats",
        "tcu",
        "write",
    )

    def __init__(
        self, spec: twin.MethodSpec, stats: MethodStats, special: bool, solana: bool = False
    ) -> None:
        self.spec = spec  # the MethodSpec, for the service's side of a landing
        self.name: str = spec.name
        self.cu: int = spec.cu
        self.tcu: int = spec.tcu
        self.cu_historical: int | None = spec.cu_historical
        self.block_param: int | None = spec.block_param
        self.cache: str = spec.cache
        self.retry: bool = spec.retry
        self.write: bool = spec.scope == "rpc:write"
        self.coalescible: bool = self.retry and not self.write
        self.stats = stats
        # Answered by the Python handler whenever it is called (eth_getLogs range planning,
        # read-your-writes routing): see Route.python_methods.
        self.special = special
        # A Solana row cached once final: a call asking for an earlier commitment never is.
        self.commitment: bool = solana and spec.cache == FINALIZED

    def price(self, tag: bytes | None) -> tuple[int, int]:
        """(billed, throughput) units; a historical block tag scales both alike."""
        historical = self.cu_historical
        if historical is not None and tag is not None and tag not in _CURRENT_TAGS:
            return historical, self.tcu * historical // max(self.cu, 1)
        return self.cu, self.tcu

    def may_be_cached(self, tag: bytes | None, params: bytes | None = None) -> bool:
        """Could the cache hold this call's answer?  (A 'latest' answer never enters it, nor
        on Solana one read at a commitment short of finalized.)"""
        if self.cache == STATIC:
            return True
        if self.cache == NO_CACHE:
            return False
        if (
            self.commitment
            and params is not None
            and COMMITMENT_KEY in params
            and FINALIZED_COMMITMENT not in params
        ):
            return False
        return self.block_param is None or (tag is not None and tag not in _CURRENT_TAGS)


class Flight:
    """One upstream call in flight, and every answer waiting for it."""

    __slots__ = (
        "done",
        "error",
        "future",
        "key",
        "method",
        "params",
        "result",
        "spec",
        "tag",
        "waiters",
    )

    def __init__(
        self, key: tuple[str, bytes], params: bytes | None, spec: Method, tag: bytes | None
    ) -> None:
        self.key = key
        self.method: str = key[0]
        self.params = params
        self.spec = spec
        self.tag = tag
        self.done = False
        self.result: bytes | None = None
        self.error: bytes | None = None
        self.waiters: list[tuple[_Pending, int]] = []
        # A Python task waiting too (the handler's path): any object with set_result, set
        # by whoever waits (chaingate.rpc.future.Future), resolved with (result, error).
        self.future: twin.FlightWaiter | None = None


class Route:
    """One ``/v1/rpc/{chain}/{network}`` endpoint: its method table, cache, flights and
    counters.  Owned by the network's RPC service, which shares all of it with the lane."""

    def __init__(
        self,
        label: str,
        family: str,
        testnet: bool,
        methods: Mapping[str, twin.MethodSpec],
        passthrough: twin.MethodSpec | None,
        cache: ResponseCache,
        jsonrpc: JsonRpcModule,
        *,
        max_batch: int,
        max_answer: int,
        coalesce: bool,
        upstream_batch: int,
        refusals: dict[str, bytes],
        python_methods: frozenset[str] = frozenset(),
        sticky: twin.Sticky | None = None,
        sticky_methods: frozenset[str] = frozenset(),
        logs: tuple[int, int] | None = None,
        watched: frozenset[str] = frozenset(),
    ) -> None:
        self.label = label
        self.family = family
        self.testnet = testnet
        self.cache = cache
        self.jsonrpc = jsonrpc
        self.max_batch = max_batch
        self.max_answer = max_answer
        self.max_single = max_answer - REPLY_OVERHEAD
        self.coalesce = coalesce
        self.upstream_batch = max(1, upstream_batch)
        # The answer-bound errors, prebuilt by the service (keys: too_large, too_large_write,
        # busy, busy_write).
        self.refusals = refusals
        self.stats: defaultdict[str, MethodStats] = defaultdict(MethodStats)
        self.invalid = self.stats["invalid"]
        self.unknown = self.stats["unknown"]
        solana = family == "solana"
        self.methods = {
            name: Method(spec, self.stats[spec.name], name in python_methods, solana)
            for name, spec in methods.items()
        }
        self.passthrough = (
            Method(passthrough, self.stats[passthrough.name], False)
            if passthrough is not None
            else None
        )
        # Read-your-writes: while it remembers any write, its methods go to the handler.
        self.sticky = sticky
        self.sticky_methods = sticky_methods
        # eth_getLogs ranges (rpc/logranges.py): (logs.max_block_range,
        # logs.upstream_block_range), or None when ranges are not looked at.  The lane sends
        # a range that fits one call itself and hands the handler those it must refuse or
        # split; the service sets logs_head (the agreed head, for tags).  A caller's plan's
        # own limit (0: none) is its principal's logs_range.
        self.logs_method = self.methods.get("eth_getLogs") if logs is not None else None
        self.logs_blocks, self.logs_upstream = logs or (0, 0)
        self.logs_head: Callable[[], int | None] = lambda: None
        # Set by the service: the highest block known final (-1: none yet), and the family's
        # reader of the block a reply's result belongs to; a receipt above it skips the
        # service (_land_reply).
        self.finalized = -1
        self.reply_block: Callable[[Reply], int | None] | None = None
        # Methods whose every result the service looks at (land_replies): the head a
        # client's eth_blockNumber shows, the upstream a write went to.
        self.watched = watched
        self.flights: dict[tuple[str, bytes], Flight] = {}
        self.held: list[Flight] = []  # new reads' flights the lane holds (Lane.hold)
        self.coalesced = 0
        self.refused: dict[str, int] = {ANSWER_TOO_LARGE: 0, OVERLOADED: 0}
        self.budget = AnswerBudget(1 << 62)  # the service shares the process's budget
        # Set by the service: dispatch(group) sends a list of new flights upstream.
        self.dispatch: Any = None  # Callable[[list[Flight]], None], set before any request

    # --- flights --------------------------------------------------------------------------

    def open_flight(
        self, key: tuple[str, bytes], params: bytes | None, spec: Method, tag: bytes | None
    ) -> Flight:
        """A new flight; joinable by identical calls until it lands when it is coalescible."""
        flight = Flight(key, params, spec, tag)
        if self.coalesce and spec.coalescible:
            self.flights[key] = flight
        return flight

    def land(self, flight: Flight, result: bytes | None, error: bytes | None) -> None:
        """A flight's outcome (exactly one of result and error is set): every answer waiting
        for it gets its reply, and each one now complete goes to its sink."""
        if flight.done:
            return
        flight.done = True
        flight.result = result
        flight.error = error
        if self.flights.get(flight.key) is flight:
            del self.flights[flight.key]
        if flight.future is not None:
            flight.future.set_result((result, error))
        waiters, flight.waiters = flight.waiters, []
        for pending, index in waiters:
            try:
                pending.place(index, result, error)
            except Exception:
                # A bug of ours costs that request a 500, never the other waiters.
                log.exception("unhandled error in the fast lane")
                pending.fail()

    def land_replies(
        self,
        flights: Sequence[Flight],
        first_id: int,
        replies: Sequence[Reply],
        look: Callable[[Flight, bytes], None],
        bad: Callable[[], bytes],
        missing: bytes,
    ) -> None:
        """Land a group's upstream answer: each reply lands the flight whose upstream id it
        carries (``first_id`` + the flight's position; a group of one takes its one reply
        whatever its id) with its result or its error object.  ``look(flight, result)``
        first, for a result the service must see (one the cache may keep, a watched
        method's); ``bad()``, the error of a reply with neither a result nor an error
        object; ``missing``, of a flight no reply names."""
        count = len(flights)
        if count == 1 and len(replies) == 1:
            self._land_reply(flights[0], replies[0], look, bad)
        else:
            for reply in replies:
                index = _upstream_id(reply.id) - first_id
                if 0 <= index < count:
                    self._land_reply(flights[index], reply, look, bad)
        for flight in flights:
            if not flight.done:
                self.land(flight, None, missing)

    def _land_reply(
        self,
        flight: Flight,
        reply: Reply,
        look: Callable[[Flight, bytes], None],
        bad: Callable[[], bytes],
    ) -> None:
        if flight.done:
            return  # a second reply with the same id
        result, error = reply.result, reply.error
        if error is not None or result is None:
            self.land(flight, None, error if error is not None and error[:1] == b"{" else bad())
            return
        spec = flight.spec
        if (
            spec.cache != NO_CACHE
            and result != b"null"
            and spec.may_be_cached(flight.tag, flight.params)
            and self._may_be_final(spec, reply)
        ) or (flight.method in self.watched):
            look(flight, result)
        self.land(flight, result, None)

    def _may_be_final(self, spec: Method, reply: Reply) -> bool:
        """May the service find this cacheable result final?  No when it is about a block
        above the last final one: a receipt of a recent transaction does not go the service's
        way (``RpcService._maybe_cache``, which decides) only to be refused there."""
        if spec.cache == STATIC or spec.block_param is not None or self.reply_block is None:
            return True
        number = self.reply_block(reply)
        return number is not None and number <= self.finalized

    def wants(self, flights: list[Flight], length: int) -> bool:
        """Does anyone still want the answer of this group of flights, whose body of
        ``length`` bytes (-1: not declared) starts arriving?  A batch that holds replies
        already and could not take the whole body is over its bound: it gives up its reads
        here, before the body is read.  Wanted by nobody, the flights leave the table (no
        call joins them any more) and the body is dropped unread."""
        for flight in flights:
            spec = flight.spec
            if not flight.done and (
                flight.future is not None
                or (spec.cache != NO_CACHE and spec.may_be_cached(flight.tag, flight.params))
            ):
                return True
        for flight in flights:
            for pending, index in flight.waiters:
                if pending.units[index] is None:
                    continue
                if pending.batch and pending.used and pending.used + length > self.max_answer:
                    pending.over = True
                    pending.give_up_reads()
                    if pending.left == 0:
                        pending.lane.finish(pending)
                if pending.units[index] is not None:
                    return True  # still waited for (a write is never given up)
        for flight in flights:
            if self.flights.get(flight.key) is flight:
                del self.flights[flight.key]
        return False

    def _send(self, safe: list[Flight], unsafe: list[Flight]) -> None:
        """Hand new flights to the service, one group per retry class and upstream batch.  A
        group that cannot be handed over lands at once with an error: no flight stays in the
        air for identical calls to join forever."""
        size = self.upstream_batch
        for flights in (safe, unsafe):
            for start in range(0, len(flights), size):
                group = flights[start : start + size]
                try:
                    self.dispatch(group)
                except Exception:
                    log.exception("unhandled error sending calls upstream")
                    for flight in group:
                        self.land(flight, None, UNSENT)

    # --- the request rules, for the lane and for the Python handler alike ------------------

    def classify(self, call: Any) -> tuple[Method | None, bytes | None, bool]:
        """(method row, raw block tag, tag valid) of a well-formed call; no row: a method
        this network neither knows nor passes through (``not_found``); a tag not valid:
        ``bad_tag``.  Price (``Method.price``) and cacheability (``Method.may_be_cached``)
        follow from the row and the tag."""
        method = self.methods.get(call.method) or self.passthrough
        if method is None:
            return None, None, True
        tag = None
        if method.block_param is not None and call.params is not None:
            tag = self.jsonrpc.array_item(call.params, method.block_param)
        if tag is not None and not valid_block_tag(tag, self.family):
            return method, tag, False
        return method, tag, True

    def logs_fit(self, params: bytes | None, principal: Any) -> bool:
        """Does this eth_getLogs go upstream as it is — one filter, a range the lane reads
        (no blockHash; each end absent, a tag or a hex number) within the caller's limit and
        one upstream call?  False: the handler decides (refuses, splits, or forwards what
        the lane cannot read)."""
        if params is None:
            return False
        ends = log_filter_ends(params)
        if ends is None:
            return False
        first, last, block_hash = ends
        if block_hash:
            return False
        head = self.logs_head() if _needs_head(first) or _needs_head(last) else None
        low = _logs_bound(first, head)
        high = _logs_bound(last, head)
        if low < 0 or high < 0:
            return False
        limit = logs_limit(self.logs_blocks, principal.logs_range)
        return logs_verdict(low, high, limit, self.logs_upstream) == LOGS_FORWARD

    # --- answers the lane builds from this route's table ----------------------------------

    def refuse(self, reason: str, executed: bool, calls: int = 1) -> bytes:
        """The error object for calls refused by an answer limit (counted for /metrics)."""
        self.refused[reason] += calls
        if reason == OVERLOADED:
            return self.refusals["busy_write" if executed else "busy"]
        return self.refusals["too_large_write" if executed else "too_large"]

    def not_found(self, call: Any) -> bytes | None:
        if call.id is None:
            return None  # a notification gets no answer, not even an error
        message = f"method not found: {call.method[:64]}"
        return self.jsonrpc.error_reply(call.id, METHOD_NOT_FOUND, message)

    def bad_tag(self, call: Any) -> bytes | None:
        if call.id is None:
            return None  # a notification gets no answer, not even an error
        message = BAD_SLOT_MESSAGE if self.family == "solana" else BAD_TAG_MESSAGE
        return self.jsonrpc.error_reply(call.id, INVALID_PARAMS, message)


class OpenAdmission:
    """No keys, no limits (``[auth] enabled = false``): everyone is the anonymous principal."""

    shared: twin.SharedLimits[twin.Principal] | None = None

    def __init__(self, anonymous: twin.Principal) -> None:
        self.anonymous = anonymous

    def principal(
        self, request: Request, group: str, testnet: bool, key: bytes | None = None
    ) -> twin.Principal | None:
        return self.anonymous

    def admit(
        self, principal: twin.Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        return None

    def record(
        self,
        principal: twin.Principal,
        network: str,
        method: str,
        requests: int,
        cu: int,
        errors: int,
        seconds: float,
    ) -> None:
        return None

    def headers(self, principal: twin.Principal) -> bytes:
        return b""


class KeyAdmission:
    """API keys on the fast lane: the cache-hit path of ``KeyGate.authenticate`` and the
    admission rule of ``KeyGate.admit`` (which calls ``admit`` here: one copy of the rule).

    ``principal`` answers only the plain case — a key seen recently, not revoked, from an
    address with no failed-authentication debt — and None otherwise: the handler then
    authenticates (and refuses with the exact answer).  A key's allowlists the lane asks
    (``Lane.serve``): what they refuse it hands off."""

    def __init__(
        self,
        gate: twin.AdmissionGate,
        recent: Mapping[bytes, twin.Principal],
        failures: Mapping[str, twin.FailureBucket],
        used: set[str],
    ) -> None:
        self.gate = gate  # KeyGate: builds refusals (``rejection``), counts them
        self.recent = recent  # raw key -> principal, for keys seen recently
        self.failures = failures  # client address -> failed-authentication bucket
        self.used = used  # key ids used since the last touch of last_used_at
        self.meter = gate.meter
        self.latency = gate.latency
        self.shared: twin.SharedLimits[twin.Principal] | None = (
            None  # SharedLimits, when processes share limits (Redis)
        )

    def principal(
        self, request: Request, group: str, testnet: bool, key: bytes | None = None
    ) -> twin.Principal | None:
        """``key``: the key in the request's path (``…/{chain}/{network}/{key}``), which a key
        in a header must then equal."""
        failures = self.failures
        if failures:
            bucket = failures.get(group)
            if bucket is not None and bucket.remaining(time.monotonic()) < 1:
                return None
        raw = presented_key(request, key)
        if raw is None:
            return None  # no key, or two different ones: the handler refuses
        principal = self.recent.get(raw)
        if principal is None or principal.revoked:
            return None
        if not testnet and principal.environment == "test":
            return None
        self.used.add(principal.key_id)
        return principal

    def _take(
        self, principal: twin.Principal, reads: bool, writes: bool, requests: int, tcu: int
    ) -> tuple[float, float, int]:
        """Scopes, day quota and token buckets: (wait, epoch, why); why is ADMITTED or the
        reason of the refusal, which costs nothing."""
        epoch = time.time()
        scopes = principal.scopes
        if reads and "rpc:read" not in scopes:
            return 0.0, epoch, NO_READ_SCOPE
        if writes and "rpc:write" not in scopes:
            return 0.0, epoch, NO_WRITE_SCOPE
        day = int(epoch // SECONDS_PER_DAY)
        wait = principal.limiter.admit(time.monotonic(), day, requests, tcu, principal.quota)
        if wait < 0:
            shared = self.shared
            if shared is not None:
                shared.note(principal)  # a starved process keeps asking for units
            return wait, epoch, DAY_QUOTA
        if wait:
            return wait, epoch, RATE
        shared = self.shared
        if shared is not None:
            # Noted once per sync (the first admission since the sync took the counts), not
            # per request: the sync keeps a key with pending counts, and a key is "recently
            # used" to within one sync interval (SharedLimits.note).
            if not principal.pending_requests:
                shared.note(principal)
            principal.pending_requests += requests
            principal.pending_units += tcu
        return 0.0, epoch, ADMITTED

    def admit(
        self, principal: twin.Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        wait, epoch, why = self._take(principal, reads, writes, requests, tcu)
        if why == ADMITTED:
            return None
        return self.gate.rejection(why, wait, epoch)

    def record(
        self,
        principal: twin.Principal,
        network: str,
        method: str,
        requests: int,
        cu: int,
        errors: int,
        seconds: float,
    ) -> None:
        """One metering sample (``twintypes.metering``), both meters in the same minute: its
        usage row (unless it has nothing to count) under the caller's key, and its latency
        (unless untimed, ``seconds`` < 0) under the caller's account."""
        minute = int(time.time() // 60)
        if requests or cu or errors:
            self.meter.record(
                principal.key_id,
                principal.account_id,
                network,
                method,
                minute,
                requests,
                cu,
                errors,
            )
        if seconds >= 0.0:
            self.latency.observe(principal.account_id, network, method, minute, seconds)

    def headers(self, principal: twin.Principal) -> bytes:
        return principal.limiter.headers(time.monotonic(), time.time(), principal.limits_rps)


class LatencyMeter:
    """Answered requests' latencies per (account id, network, method, minute), counted in the
    buckets given (upper bounds in seconds, ascending; one more bucket above the last) and
    handed out by ``drain``.  Nested by account, network and method, so that a request finds
    its histogram without building a key; a histogram holds its current minute, and a sample
    of a later minute closes the earlier one."""

    __slots__ = ("_bounds", "_closed", "_current")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if len(bounds) > MAX_LATENCY_BOUNDS or list(bounds) != sorted(bounds):
            raise ValueError(f"at most {MAX_LATENCY_BOUNDS} ascending latency bounds")
        self._bounds = bounds
        self._current: dict[str, dict[str, dict[str, _Histogram]]] = {}
        self._closed: list[tuple[str, str, str, int, Sequence[int]]] = []

    def observe(
        self, account_id: str, network: str, method: str, minute: int, seconds: float
    ) -> None:
        """One answered request that took ``seconds``."""
        by_network = self._current.get(account_id)
        if by_network is None:
            by_network = self._current[account_id] = {}
        by_method = by_network.get(network)
        if by_method is None:
            by_method = by_network[network] = {}
        histogram = by_method.get(method)
        if histogram is None:
            histogram = by_method[method] = _Histogram(minute, len(self._bounds) + 1)
        elif histogram.minute != minute:
            self._closed.append((account_id, network, method, histogram.minute, histogram.counts))
            histogram.minute = minute
            histogram.counts = [0] * (len(self._bounds) + 1)
        histogram.counts[bisect.bisect_left(self._bounds, seconds)] += 1

    def add(
        self, account_id: str, network: str, method: str, minute: int, counts: Sequence[int]
    ) -> None:
        """Add bucket counts drained before (a write that failed gives them back)."""
        if len(counts) != len(self._bounds) + 1:
            raise ValueError(f"{len(self._bounds) + 1} bucket counts expected")
        self._closed.append((account_id, network, method, minute, list(counts)))

    def drain(self) -> list[tuple[str, str, str, int, tuple[int, ...]]]:
        """Every histogram since the last drain, as (account, network, method, minute, bucket
        counts), merged and sorted; the meter starts again from zero."""
        merged: dict[tuple[str, str, str, int], list[int]] = {}
        current, self._current = self._current, {}
        closed, self._closed = self._closed, []
        for account_id, by_network in current.items():
            for network, by_method in by_network.items():
                for method, histogram in by_method.items():
                    closed.append((account_id, network, method, histogram.minute, histogram.counts))
        for account_id, network, method, minute, counts in closed:
            slot = merged.get((account_id, network, method, minute))
            if slot is None:
                merged[(account_id, network, method, minute)] = list(counts)
            else:
                for i, count in enumerate(counts):
                    slot[i] += count
        return sorted((*key, tuple(counts)) for key, counts in merged.items())


class _Histogram:
    __slots__ = ("counts", "minute")

    def __init__(self, minute: int, size: int) -> None:
        self.minute = minute
        self.counts = [0] * size


class Ledger:
    """What every answered request leaves behind: its status count, its latency sample and
    its access-log line.  Shared by the lane and the edge loop (the handler keeps its own
    books with the same counters)."""

    def __init__(
        self,
        statuses: Mapping[str, MutableMapping[int, int]],
        latency: Mapping[str, twin.LatencySample],
        access_log: twin.AccessLogSink,
    ) -> None:
        self.statuses = statuses  # route -> status -> count
        self.latency = latency  # route -> LatencySeries
        self.access_log = access_log

    def note(
        self,
        route: str,
        status: int,
        request_id: bytes,
        peer: str,
        method: bytes,
        path: str,
        started: float,
        size: int,
        label: str,
        cache: bytes,
    ) -> float:
        """Count the answer; its latency in seconds."""
        elapsed = time.perf_counter() - started
        self.latency[route].observe(elapsed)
        self.statuses[route][status] += 1
        access_log = self.access_log
        if access_log.enabled:
            access_log.write_request(
                request_id.decode(),
                peer,
                method.decode("latin-1"),
                path,
                status,
                int(elapsed * 1_000_000),
                size,
                label,
                cache.decode(),
            )
        return elapsed


class _Pending:
    """One request's answer while flights it waits for are in the air."""

    __slots__ = (
        "batch",
        "calls",
        "conn",
        "cu",
        "errors",
        "hits",
        "label",
        "lane",
        "left",
        "over",
        "path",
        "peer",
        "principal",
        "replies",
        "request",
        "request_id",
        "requests",
        "route",
        "started",
        "taken",
        "tally",
        "units",
        "used",
    )

    def __init__(
        self,
        lane: Lane,
        conn: twin.ConnHandle,
        request: Request,
        peer: str,
        route: Route,
        principal: twin.Principal,
        request_id: bytes,
        started: float,
        calls: Sequence[Any],
        batch: bool,
    ) -> None:
        self.lane = lane
        self.conn = conn
        self.request = request
        self.peer = peer
        self.route = route
        self.principal = principal
        self.request_id = request_id
        self.started = started
        self.calls = calls
        self.batch = batch
        self.replies: list[bytes | None] = [None] * len(calls)
        # Per call position: (Method, billed units) of calls still waiting, else None.
        self.units: list[tuple[Method, int] | None] = [None] * len(calls)
        self.left = 0  # calls still waiting for a flight
        self.hits = 0
        self.used = 0  # reply bytes placed in the answer so far
        self.taken = 0  # of which taken from the process budget
        self.over = False  # the answer passed its bound: every later reply is refused
        self.path = ""
        self.label = "batch" if batch else ""
        # A single call's usage, booked with the answer's latency as one sample.
        self.requests = self.cu = self.errors = 0
        # A batch's usage so far, per method name: [calls, units, errors] (``book``).
        self.tally: dict[str, list[int]] = {}

    def admit_reply(self, size: int) -> int:
        """May a reply of ``size`` bytes join this batch's answer?  FITS, TOO_LARGE or BUSY."""
        if self.over or self.used + size > self.route.max_answer:
            self.over = True
            return TOO_LARGE
        if not self.route.budget.take(size):
            return BUSY
        self.used += size
        self.taken += size
        return FITS

    def wait_for(self, flight: Flight, index: int, method: Method, units: int) -> None:
        self.units[index] = (method, units)
        self.left += 1
        flight.waiters.append((self, index))

    def place(self, index: int, result: bytes | None, error: bytes | None) -> None:
        """The outcome of the call at ``index`` (a landing)."""
        waiting = self.units[index]
        if waiting is None:
            return  # already given up (the answer went over its bound)
        self.units[index] = None
        method, units = waiting
        call = self.calls[index]
        route = self.route
        # Any: exactly one of result and error is set, which the types cannot say.
        jsonrpc: Any = route.jsonrpc
        if call.id is not None:
            size = len(result) if result is not None else len(error or b"")
            if self.batch:
                fits = self.admit_reply(size + len(call.id) + REPLY_OVERHEAD)
                if fits != FITS:
                    reason = OVERLOADED if fits == BUSY else ANSWER_TOO_LARGE
                    result, error = None, route.refuse(reason, method.write)
            elif size + len(call.id) > route.max_single:
                result, error = None, route.refuse(ANSWER_TOO_LARGE, method.write)
            if result is not None:
                self.replies[index] = jsonrpc.result_reply(call.id, result)
            else:
                self.replies[index] = jsonrpc.raw_error_reply(call.id, error)
        self.book(method, units, error is not None)
        self.left -= 1
        if self.over:
            self.give_up_reads()
        if self.left == 0:
            self.lane.finish(self)

    def book(self, method: Method, units: int, failed: bool) -> None:
        """One call answered: counted under its method, and its usage metered for the caller:
        a single call's with the answer's latency, as the request's one sample (``_answer``);
        a batch's calls summed per method and metered once its answer is decided
        (``meter_batch``: one sample per method, not per call; the answer's sample then
        carries only the latency, under "batch")."""
        if failed:
            method.stats.error += 1
        else:
            method.stats.ok += 1
        if self.batch:
            tally = self.tally.get(method.name)
            if tally is None:
                self.tally[method.name] = [1, units, 1 if failed else 0]
            else:
                tally[0] += 1
                tally[1] += units
                tally[2] += 1 if failed else 0
        else:
            self.requests = 1
            self.cu = units
            self.errors = 1 if failed else 0

    def meter_batch(self) -> None:
        """The usage of a batch's calls booked so far: one sample per method."""
        tally, self.tally = self.tally, {}
        for name, (requests, cu, errors) in tally.items():
            self.meter(name, requests, cu, errors, UNTIMED)

    def meter(self, method: str, requests: int, cu: int, errors: int, seconds: float) -> None:
        """The lane's one call into the meters: a sample (``twintypes.metering``)."""
        self.lane.admission.record(
            self.principal, self.route.label, method, requests, cu, errors, seconds
        )

    def fail(self) -> None:
        """Answer 500 and wait for nothing more."""
        self.meter_batch()  # what was answered before is usage all the same
        self.units = [None] * len(self.units)
        self.left = 0
        self.route.budget.give_back(self.taken)
        self.taken = 0
        self.request.keep_alive = False
        body = self.lane.error_body(500, "internal error; retry with exponential backoff", None)
        headers = b"X-Request-Id: " + self.request_id + b"\r\n" + JSON
        self.lane.sink.deliver(self.conn, self.request, 500, headers, body)

    def give_up_reads(self) -> None:
        """Over its bound, a batch stops waiting for retry-safe reads (they could only be
        refused); calls that are not retry-safe are waited for, never abandoned."""
        route = self.route
        for index, waiting in enumerate(self.units):
            if waiting is None or not waiting[0].retry:
                continue
            method, units = waiting
            self.units[index] = None
            call = self.calls[index]
            if call.id is not None:
                error = route.refuse(ANSWER_TOO_LARGE, False)
                self.replies[index] = route.jsonrpc.raw_error_reply(call.id, error)
            self.book(method, units, True)
            self.left -= 1


class Lane:
    """Every JSON-RPC endpoint's fast path: ``serve`` one request at a time."""

    def __init__(
        self,
        routes: dict[bytes, Route],
        admission: twin.Admission[Any],
        ledger: Ledger,
        ids: RequestIds,
        cors: Callable[[bytes | None], bytes],
        error_body: twin.ErrorBody,
        log_path: Callable[[bytes], str],
    ) -> None:
        self.routes = routes  # the exact request path (with and without a trailing slash)
        self.admission = admission
        self.ledger = ledger
        self.ids = ids
        self.cors = cors  # origin -> CORS answer header lines (chaingate.edge.cors)
        self.error_body = error_body  # (status, message, code) -> the refusal's body
        self.log_path = log_path  # path -> as the access log shows it (chaingate.edge.paths)
        self.sink: Any = None  # the edge loop (a twin.Sink), set before any request
        self.served = 0  # requests the lane answered (or is answering)
        self._log_paths: dict[bytes, str] = {}
        self._holding = False
        self._held: list[Route] = []  # routes holding reads' flights (``hold``)

    def hold(self) -> None:
        """Until ``release``, the new retry-safe flights of single calls and batches wait: the
        edge loop holds them while it serves one readiness, so that distinct calls arriving
        together go upstream together, one upstream batch (of at most the route's upstream
        batch size) for many requests instead of one HTTP exchange each."""
        self._holding = True

    def release(self) -> None:
        """Send the flights held since ``hold`` (grouped like a batch's reads)."""
        self._holding = False
        held, self._held = self._held, []
        for route in held:
            flights, route.held = route.held, []
            route._send(flights, [])

    def serve(
        self, conn: twin.ConnHandle, request: Request, peer: str, group: str
    ) -> twin.Answer | str:
        """(status, headers, body) now, DEFER (the sink gets it later) or HANDOFF."""
        path = request.path
        route = self.routes.get(path)
        key = None
        if route is None:
            head, key = split_path_key(path)
            if key is not None:
                route = self.routes.get(head)
        if route is None or request.method != b"POST":
            return HANDOFF
        principal = self.admission.principal(request, group, route.testnet, key)
        if principal is None:
            return HANDOFF
        # A key's allowlists (auth/allowlists.py): what they refuse, the handler refuses.
        allow = principal.allow
        if allow is not None and not allow.admits(request.origin, peer):
            return HANDOFF
        started = time.perf_counter()
        jsonrpc = route.jsonrpc
        parsed = jsonrpc.parse_request(request.body, route.max_batch)
        calls: Sequence[Any] = parsed.calls  # a call without an error has a method (str)
        if not parsed.error:
            # Whatever the handler must answer, it answers whole: decided before anything
            # is counted or charged.
            for call in calls:
                if not call.error:
                    if allow is not None and allow.call_refusal(call.method, call.params):
                        return HANDOFF
                    method = route.methods.get(call.method)
                    if method is None:
                        continue
                    if method.special or self._sticky(route, call.method):
                        return HANDOFF
                    if method is route.logs_method and not route.logs_fit(call.params, principal):
                        return HANDOFF
        self.served += 1
        pending = _Pending(
            self,
            conn,
            request,
            peer,
            route,
            principal,
            self.ids.take(request.request_id),
            started,
            calls,
            parsed.batch,
        )
        pending.path = self._log_path(path)
        if parsed.error:
            route.invalid.error += 1
            body = jsonrpc.error_reply(b"null", parsed.error, parsed.message)
            return self._answer(pending, 200, body, b"MISS", "invalid", None, False)
        if parsed.batch:
            return self._batch(pending)
        return self._single(pending)

    @staticmethod
    def _sticky(route: Route, method: str) -> bool:
        sticky = route.sticky
        return sticky is not None and method in route.sticky_methods and len(sticky) > 0

    def _log_path(self, path: bytes) -> str:
        """The path as the access log shows it (a key in it redacted)."""
        shown = self._log_paths.get(path)
        if shown is None:
            shown = self.log_path(path)
            # The endpoints, and their first keyed paths: short values a client cannot grow.
            if len(self._log_paths) < 1024 and len(path) <= 256:
                self._log_paths[path] = shown
        return shown

    def _single(self, pending: _Pending) -> twin.Answer | str:
        route = pending.route
        jsonrpc = route.jsonrpc
        call = pending.calls[0]
        if call.error:
            route.invalid.error += 1
            body: bytes | None = jsonrpc.error_reply(call.id, call.error, call.message)
            return self._answer(pending, 200, body, b"MISS", "invalid", None, False)
        method, tag, valid = route.classify(call)
        if method is None:
            route.unknown.error += 1
            return self._answer(
                pending, 200, route.not_found(call), b"MISS", "unknown", None, False
            )
        if not valid:
            route.invalid.error += 1
            return self._answer(
                pending, 200, route.bad_tag(call), b"MISS", method.name, None, False
            )
        cu, tcu = method.price(tag)
        writes = method.write
        admission = self.admission
        rejection = admission.admit(pending.principal, not writes, writes, 1, cu, tcu)
        if rejection is not None:
            error = refusal_error(rejection.status, rejection.code, rejection.message)
            body = jsonrpc.raw_error_reply(call.id or b"null", error)
            return self._answer(pending, rejection.status, body, b"", method.name, rejection)
        stats = method.stats
        key = (call.method, call.params or b"")
        if method.cache != NO_CACHE and method.may_be_cached(tag, call.params):
            hit = route.cache.get(key)
            if hit is not None:
                if call.id is not None and len(hit) + len(call.id) > route.max_single:
                    pending.book(method, cu, True)
                    refusal = route.refuse(ANSWER_TOO_LARGE, False)
                    body = jsonrpc.raw_error_reply(call.id, refusal)
                    return self._answer(pending, 200, body, b"MISS", method.name, None)
                stats.cache_hits += 1
                pending.book(method, cu, False)
                body = None if call.id is None else jsonrpc.result_reply(call.id, hit)
                pending.hits = 1
                return self._answer(pending, 200, body, b"HIT", method.name, None)
        pending.label = method.name
        flight = route.flights.get(key)
        if flight is not None:
            route.coalesced += 1
            pending.wait_for(flight, 0, method, cu)
            return DEFER
        flight = route.open_flight(key, call.params, method, tag)
        pending.wait_for(flight, 0, method, cu)
        if not method.retry:
            route._send([], [flight])
        elif self._holding and route.upstream_batch > 1:
            self._hold(route, [flight])
        else:
            route._send([flight], [])
        return DEFER

    def _hold(self, route: Route, flights: list[Flight]) -> None:
        """Keep new retry-safe flights until ``release``."""
        if not route.held:
            self._held.append(route)
        route.held.extend(flights)

    def _batch(self, pending: _Pending) -> twin.Answer | str:
        route = pending.route
        jsonrpc = route.jsonrpc
        calls = pending.calls
        replies = pending.replies
        jobs: list[tuple[int, Any, Method, bytes | None, int]] = []
        cu = tcu = 0
        reads = writes = False
        for index, call in enumerate(calls):
            if call.error:
                route.invalid.error += 1
                replies[index] = jsonrpc.error_reply(call.id, call.error, call.message)
                continue
            method, tag, valid = route.classify(call)
            if method is None:
                route.unknown.error += 1
                replies[index] = route.not_found(call)
                continue
            if not valid:
                route.invalid.error += 1
                replies[index] = route.bad_tag(call)
                continue
            units, weight = method.price(tag)
            cu += units
            tcu += weight
            if method.write:
                writes = True
            else:
                reads = True
            jobs.append((index, call, method, tag, units))
        admission = self.admission
        if jobs:
            rejection = admission.admit(pending.principal, reads, writes, len(jobs), cu, tcu)
            if rejection is not None:
                return self._refused_batch(pending, rejection, jobs)
        cache = route.cache
        upstream: list[tuple[int, Any, Method, bytes | None, int]] = []
        for job in jobs:
            index, call, method, tag, units = job
            if method.cache != NO_CACHE and method.may_be_cached(tag, call.params):
                hit = cache.get((call.method, call.params or b""))
                if hit is not None:
                    stats = method.stats
                    if call.id is not None:
                        fits = pending.admit_reply(len(hit) + len(call.id) + REPLY_OVERHEAD)
                        if fits != FITS:
                            reason = OVERLOADED if fits == BUSY else ANSWER_TOO_LARGE
                            replies[index] = jsonrpc.raw_error_reply(
                                call.id, route.refuse(reason, False)
                            )
                            pending.book(method, units, True)
                            continue
                        replies[index] = jsonrpc.result_reply(call.id, hit)
                    pending.hits += 1
                    stats.cache_hits += 1
                    pending.book(method, units, False)
                    continue
            upstream.append(job)
        if pending.over:
            # Already over its bound: the rest could only be refused, so none is sent.
            for index, call, method, _tag, units in upstream:
                if call.id is not None:
                    error = route.refuse(ANSWER_TOO_LARGE, False)
                    replies[index] = jsonrpc.raw_error_reply(call.id, error)
                pending.book(method, units, True)
            return self._batch_answer(pending)
        safe: list[Flight] = []
        unsafe: list[Flight] = []
        flights = route.flights
        for index, call, method, tag, units in upstream:
            key = (call.method, call.params or b"")
            flight = flights.get(key)
            if flight is not None:
                route.coalesced += 1
            else:
                flight = route.open_flight(key, call.params, method, tag)
                (safe if method.retry else unsafe).append(flight)
            pending.wait_for(flight, index, method, units)
        # Decided before sending: a group may land at once (then finish() answers), and an
        # answer must be given once.
        waiting = pending.left > 0
        if safe and self._holding and route.upstream_batch > 1:
            # Held like single calls' reads (``hold``): the batches and calls of one readiness
            # share upstream batches, one HTTP exchange for several requests.
            self._hold(route, safe)
            safe = []
        if safe or unsafe:
            route._send(safe, unsafe)
        if waiting:
            return DEFER
        # A batch with nothing admitted (every call malformed, unknown or a bad tag) is
        # answered, not timed: none of it is usage.
        return self._batch_answer(pending, bool(jobs))

    def _refused_batch(
        self,
        pending: _Pending,
        rejection: Rejection,
        jobs: list[tuple[int, Any, Method, bytes | None, int]],
    ) -> twin.Answer:
        """A refused batch: each call that would have gone upstream gets the refusal (-32005
        over a limit) with its id (notifications nothing), the others keep the errors already
        decided."""
        replies = pending.replies
        raw_error_reply = pending.route.jsonrpc.raw_error_reply
        error = refusal_error(rejection.status, rejection.code, rejection.message)
        for index, call, *_ in jobs:
            if call.id is not None:
                replies[index] = raw_error_reply(call.id, error)
        answered = [reply for reply in replies if reply is not None]
        body = b"[" + b",".join(answered) + b"]" if answered else None
        return self._answer(pending, rejection.status, body, b"", "batch", rejection)

    def _batch_answer(self, pending: _Pending, timed: bool = True) -> twin.Answer:
        parts = [reply for reply in pending.replies if reply is not None]
        # Flights given up on still hold this _Pending until they land: not its replies.
        pending.replies = []
        body = pending.route.jsonrpc.join_batch(parts) if parts else None
        hits = pending.hits
        count = len(pending.calls)
        cache = b"HIT" if hits == count else (b"MISS" if hits == 0 else b"PARTIAL")
        pending.route.budget.give_back(pending.taken)
        pending.taken = 0
        pending.meter_batch()
        return self._answer(pending, 200, body, cache, "batch", None, timed)

    def finish(self, pending: _Pending) -> None:
        """The last flight a deferred answer waited for has landed: to the sink with it."""
        if pending.batch:
            status, headers, body = self._batch_answer(pending)
        else:
            reply = pending.replies[0]
            status, headers, body = self._answer(pending, 200, reply, b"MISS", pending.label, None)
        self.sink.deliver(pending.conn, pending.request, status, headers, body)

    def _answer(
        self,
        pending: _Pending,
        status: int,
        body: bytes | None,
        cache: bytes,
        label: str,
        rejection: Rejection | None,
        timed: bool = True,
    ) -> tuple[int, bytes, bytes]:
        """The answer's status, header lines and body, as the handler would frame it; and
        its books (status count, latency, access-log line).  An admitted request's latency is
        also the caller's, under its network and method (``label``: "batch" for a batch);
        ``timed`` False for what was never admitted (malformed, unknown method, bad tag)."""
        request = pending.request
        rate = self.admission.headers(pending.principal)
        if rejection is not None:
            if rejection.close:
                request.keep_alive = False
            headers = JSON + rejection.headers + rate
            if body is None:
                body = self.error_body(rejection.status, rejection.message, rejection.code)
        else:
            headers = _CACHE_HEADERS[cache] + rate if rate else _CACHE_HEADERS[cache]
            if body is None:
                status = 204
                body = b""
        origin = request.origin
        if origin is not None and (rejection is None or rejection.cors):
            headers += self.cors(origin)
        elapsed = self.ledger.note(
            "rpc",
            status,
            pending.request_id,
            pending.peer,
            request.method,
            pending.path,
            pending.started,
            len(body),
            label,
            cache,
        )
        if timed and rejection is None:
            pending.meter(label, pending.requests, pending.cu, pending.errors, elapsed)
        return status, b"X-Request-Id: " + pending.request_id + b"\r\n" + headers, body
