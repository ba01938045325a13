"""The JSON-RPC proxy of one chain/network: method table, usage, cache, coalescing, batches.

Most requests never reach this module's ``handle``: the edge's fast lane (``fastlane``, compiled)
answers them from the state this service owns and shares with it — the ``Route``: the method
table, the cache, the flights in the air and the counters — and hands this service the groups
of calls that need a node (``_dispatch``, landed by ``_land``).  ``handle`` answers what the
lane leaves to Python (what a key's allowlists refuse, eth_getLogs to refuse or split, routed
reads, WebSocket calls) by the same rules, which it asks the route for (``Route.classify``,
``Method.price``, ``Method.may_be_cached``, the route's -32601 and -32602 replies), in four
steps:

1. framing (compiled): split into calls, keeping ids and params as raw bytes;
2. classification (the route's): each call's method row and block tag, its compute units,
   whether it writes;
3. admission: the gate (auth/limits) sees the total cost before anything is dispatched;
4. dispatch: each call is answered from the cache, by joining an identical call already in
   flight, or by an upstream.  A batch's upstream calls travel as one upstream batch per
   retry class; replies go back in the order of the request.

Nothing is re-encoded: a node's ``result`` or ``error`` bytes reach the client as they came.
An answer is bounded (``rpc.max_answer_bytes``, answers.py): a reply that would pass the bound
becomes error -32005, and a batch over it stops waiting for the reads still in flight.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import trio

from chaingate.config import NetworkSettings, RpcSettings
from chaingate.config.network import Network
from chaingate.refusals import Rejection, refusal_error
from chaingate.rpc.answers import (
    ANSWER_TOO_LARGE,
    BUSY,
    FITS,
    OVERLOADED,
    REPLY_OVERHEAD,
    Assembly,
    answer_refusals,
    limit_error,
)
from chaingate.rpc.errors import (
    ABANDONED,
    INTERNAL_ERROR,
    UNAVAILABLE,
    UpstreamError,
    client_error,
    error_object,
)
from chaingate.rpc.future import Future
from chaingate.rpc.logranges import Limit, LogRanges, Split
from chaingate.rpc.methods import MethodTable, block_number
from chaingate.rpc.pool import Upstream, UpstreamPool
from chaingate.rpc.reply import LocalAnswer, Outcome, Principal, RpcReply, Usage
from chaingate.rpc.resultblocks import family_heads
from chaingate.rpc.stickiness import STICKY_METHODS, Stickiness
from chaingate.twins import Impl
from chaingate.twintypes.fastlane import AnswerBudget, Flight, Method, Route
from chaingate.twintypes.http1 import Response
from chaingate.twintypes.jsonrpc import JsonRpcModule, ParsedResponse, Reply


class Gate(Protocol):
    """What the proxy asks of the key gate (chaingate.auth implements it)."""

    def admit(
        self, principal: Principal, reads: bool, writes: bool, requests: int, cu: int, tcu: int
    ) -> Rejection | None:
        """Scopes and limits for ``requests`` calls costing ``cu``/``tcu`` units."""
        ...


log = logging.getLogger("chaingate.rpc")

__all__ = [
    "Gate",
    "RpcService",
]

METHOD_NOT_FOUND = -32601

# A call as the cache and the flights in the air know it: (method, raw params).
CacheKey = tuple[str, bytes]

# What the pool hands back for a group sent upstream: the answer, or why there is none.
GroupOutcome = tuple[Upstream, Response, ParsedResponse] | UpstreamError

_CANCELLED: Outcome = (None, error_object(INTERNAL_ERROR, "request cancelled", "cancelled"))
_MISSING = error_object(INTERNAL_ERROR, "upstream returned no reply for this call", "bad_response")
# Methods whose every result ``_note`` reads (besides results the cache may keep).
_WATCHED = frozenset({"eth_blockNumber", "eth_sendRawTransaction"})


# Route.land_replies's ``look`` (a result the service must see) and ``bad`` (the error of a
# reply with neither a result nor an error object), for answers of one upstream and status.
_Landers = tuple[Callable[[Flight, bytes], None], Callable[[], bytes]]

# A call of a batch on its way upstream: (position, call, its method's row in the route's
# table, raw block tag, billed units).
_Job = tuple[int, Any, Method, bytes | None, int]


class RpcService:
    def __init__(
        self,
        key: Network,
        settings: NetworkSettings,
        rpc: RpcSettings,
        methods: MethodTable,
        impl: Impl,
        gate: Gate,
        *,
        logs_range_of: Callable[[Any], int] | None = None,
    ) -> None:
        self.key = key
        self.chain, self.network = key.chain, key.network
        self.label = str(key)  # an exact str: the lane's label, usage and metric key
        self.settings = settings
        self._jsonrpc: JsonRpcModule = impl.jsonrpc
        self._gate = gate
        # A method for test networks only does not exist on the others: -32601 there, before
        # anything is counted or charged (methods.toml ``testnet_only``: Solana's faucet).
        self._methods = {
            name: spec
            for name, spec in methods.family(settings.family).items()
            if settings.testnet or not spec.testnet_only
        }
        self._max_batch = rpc.max_batch
        self._timeout = rpc.request_timeout
        self._coalesce = rpc.coalesce
        self._finality_depth = settings.finality_depth
        self._upstream_batch = min(u.max_batch for u in settings.upstreams)
        self._next_id = 1
        # What the lane is given to land a group answered by (upstream, HTTP status): the
        # ``look`` and ``bad`` of Route.land_replies, made once rather than per group.
        self._landers: dict[tuple[str, int], _Landers] = {}
        # The answer bound: a single call's payload plus its id may take this many bytes.
        self._max_answer = rpc.max_answer_bytes
        self._max_single = rpc.max_answer_bytes - REPLY_OVERHEAD
        refusals = answer_refusals(rpc.max_answer_bytes)
        self._too_large, self._too_large_write = refusals.too_large, refusals.too_large_write
        self._busy, self._busy_write = refusals.busy, refusals.busy_write
        # eth_getLogs ranges: the limit (per network and plan) and splitting (logranges.py).
        fastlane = impl.fastlane
        self.logs = LogRanges(settings.logs, fastlane) if settings.family == "evm" else None
        # The widest eth_getLogs range of a caller's plan (0: the network's own limit).
        self._logs_range_of = logs_range_of or (lambda principal: 0)
        # Read-your-writes (stickiness.py): a sender's reads follow its last write's upstream.
        ryw = settings.read_your_writes
        self.sticky = Stickiness(ryw) if ryw.enabled and settings.family == "evm" else None
        # Methods answered in process (methods.toml ``local = true``): the lane hands them to
        # ``handle`` like eth_getLogs, so the requests that do not use them never look.
        self._local: dict[str, LocalAnswer] = {}
        # So are the rows whose rules only the handler applies (a broadcast write, a price
        # by the answer's size, a bound of the method's own: MethodSpec.special).
        python_methods = {
            name for name, spec in self._methods.items() if spec.local or spec.special
        }
        # What this network shares with the edge's fast lane (compiled): the method table,
        # the cache, the calls in flight and every counter (see _pure/fastlane.py).  With
        # ranges looked at, the lane sends an eth_getLogs that fits one call itself and hands
        # ``handle`` those it must refuse or split (Route.logs_fit).
        logs = self.logs
        self.route: Route = fastlane.Route(
            self.label,
            settings.family,
            settings.testnet,
            self._methods,
            methods.passthrough if settings.passthrough else None,
            fastlane.ResponseCache(rpc.cache_max_entries, rpc.cache_max_bytes),
            impl.jsonrpc,
            max_batch=rpc.max_batch,
            max_answer=rpc.max_answer_bytes,
            coalesce=rpc.coalesce,
            upstream_batch=self._upstream_batch,
            refusals=refusals._asdict(),
            python_methods=frozenset(python_methods),
            sticky=None if self.sticky is None else self.sticky.routes,
            sticky_methods=STICKY_METHODS,
            logs=None if logs is None else (logs.max_block_range, logs.upstream_block_range),
            watched=_WATCHED,
        )
        self.route.dispatch = self._dispatch
        self.cache = self.route.cache
        # Reply bytes of batches being assembled; the gateway shares one budget among every
        # service (share_answers), and the edge reads it to refuse new work early.
        self.answers = self.route.budget = fastlane.AnswerBudget(rpc.max_assembling_bytes)
        self.refused: dict[str, int] = self.route.refused
        # Counters per method, plus the pseudo-methods "invalid" and "unknown".
        self.stats = self.route.stats
        self._invalid = self.route.invalid
        self._unknown = self.route.unknown
        # How the family's heads are probed, and the block a cacheable answer without a block
        # param is about, as its result says.
        probe, parse_head, self._result_block, reply_block = family_heads(
            settings.family, self._jsonrpc.result_block
        )
        self.pool = UpstreamPool(self.label, settings, rpc, impl, probe, parse_head)
        self.route.logs_head = self._head
        # What is final moves with the agreed head; the lane reads the bound, and shows us
        # only the results (receipts...) that may be final by it (Route._may_be_final).
        self.route.reply_block = reply_block
        self.pool.on_head = self._head_moved

    def _head_moved(self, head: int | None) -> None:
        """The agreed head moved: so does the highest block final (-1: none yet)."""
        self.route.finalized = -1 if head is None else head - self._finality_depth

    def _head(self) -> int | None:
        """The agreed head (the lane resolves an eth_getLogs range's tags with it)."""
        return self.pool.head

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.pool.run(task_status=task_status)

    @property
    def coalesced(self) -> int:
        """Calls answered by joining an identical call already in flight."""
        return self.route.coalesced

    def answer_locally(self, method: str, answer: LocalAnswer) -> None:
        """Serve ``method`` in process: it must be in the method table with ``local = true``
        (its price and scope are the table's, like any method's)."""
        spec = self._methods.get(method)
        if spec is None or not spec.local:
            raise ValueError(f"{self.label}: {method} is not a local method of the method table")
        self._local[method] = answer

    @staticmethod
    def share_answers(services: Iterable[RpcService], budget: AnswerBudget) -> AnswerBudget:
        """Make every service count its batches' replies in one process-wide budget."""
        for service in services:
            service.answers = service.route.budget = budget
        return budget

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def calls(self) -> dict[tuple[str, str], int]:
        """Call counts by (method, outcome)."""
        counts: dict[tuple[str, str], int] = {}
        for name, stats in self.stats.items():
            if stats.ok:
                counts[(name, "ok")] = stats.ok
            if stats.error:
                counts[(name, "error")] = stats.error
        return counts

    @property
    def cache_hits(self) -> dict[str, int]:
        return {name: stats.cache_hits for name, stats in self.stats.items() if stats.cache_hits}

    # --- entry point ------------------------------------------------------------------------

    async def handle(self, body: bytes, principal: Principal) -> RpcReply:
        jsonrpc = self._jsonrpc
        parsed = jsonrpc.parse_request(body, self._max_batch)
        if parsed.error:
            self._invalid.error += 1
            body = jsonrpc.error_reply(b"null", parsed.error, parsed.message)
            return RpcReply(body, b"MISS", "invalid", admitted=False)
        if parsed.batch:
            return await self._handle_batch(parsed.calls, principal)
        # A single call, inline: this is the path most requests take.  (Any: a valid call's
        # method is a str and an invalid one's id is bytes, which the Call type cannot say.)
        call: Any = parsed.calls[0]
        if call.error:
            self._invalid.error += 1
            body = jsonrpc.error_reply(call.id, call.error, call.message)
            return RpcReply(body, b"MISS", "invalid", admitted=False)
        method = call.method
        if principal.allow is not None:
            refused = principal.allow.call_refusal(method, call.params)
            if refused is not None:  # the key's method or contract allowlist: 403, not charged
                answer = jsonrpc.error_reply(call.id, *refused) if call.id is not None else None
                forbidden = Rejection(403, "forbidden", refused[1])
                return RpcReply(answer, b"MISS", "allowlist", forbidden)
        # The route's rules (the fast lane's): the method's row, its block tag, the price.
        route = self.route
        row, tag, valid = route.classify(call)
        if row is None:
            self._unknown.error += 1
            return RpcReply(route.not_found(call), b"MISS", "unknown", admitted=False)
        if not valid:
            self._invalid.error += 1
            return RpcReply(route.bad_tag(call), b"MISS", row.name, admitted=False)
        params = call.params
        is_local = row.spec.local
        local = self._local.get(method) if is_local else None
        if is_local and local is None:  # its subsystem is off here
            self._unknown.error += 1
            return RpcReply(self._not_served(call), b"MISS", "unknown", admitted=False)
        split: Split | None = None
        if method == "eth_getLogs" and self.logs is not None:
            limit = self.logs.limit(self._logs_range_of(principal))
            verdict = self.logs.plan(params, self.pool.head, limit)
            if isinstance(verdict, bytes):  # over the range limit: refused, not charged
                row.stats.error += 1
                refusal = jsonrpc.raw_error_reply(call.id, verdict) if call.id else None
                return RpcReply(refusal, b"MISS", row.name, admitted=False)
            split = verdict
        cu, tcu = row.price(tag)
        writes = row.write
        rejection = self._gate.admit(principal, not writes, writes, 1, cu, tcu)
        if rejection is not None:
            return self._refused(rejection, call.id or b"null", row.name)
        if local is not None:
            result, error = await local(params, principal)
            return self._single_reply(call, row, cu, result, error)
        if split is not None:
            result, error = await self._split_logs(split, limit)
            return self._single_reply(call, row, cu, result, error)
        if row.special and row.spec.special:
            result, error, units = await self._own_rules(method, params, row, cu)
            return self._single_reply(call, row, units, result, error)
        key = (method, params or b"")
        if row.may_be_cached(tag, params):
            hit = self.cache.get(key)
            if hit is not None:
                usage: Usage = []
                if call.id is not None and len(hit) + len(call.id) > self._max_single:
                    self._book(usage, row, cu, True)
                    refusal = self._refuse(ANSWER_TOO_LARGE, False)
                    answer = jsonrpc.raw_error_reply(call.id, refusal)
                    return RpcReply(answer, b"MISS", row.name, usage=usage)
                row.stats.cache_hits += 1
                self._book(usage, row, cu, False)
                reply = None if call.id is None else jsonrpc.result_reply(call.id, hit)
                return RpcReply(reply, b"HIT", row.name, usage=usage)
        result, error = await self._call(method, params, row, tag, key)
        return self._single_reply(call, row, cu, result, error)

    def _single_reply(
        self,
        call: Any,
        row: Method,
        cu: int,
        result: bytes | None,
        error: bytes | None,
    ) -> RpcReply:
        jsonrpc: Any = self._jsonrpc  # Any: exactly one of result and error is set
        if call.id is None:
            reply = None
        else:
            size = len(result) if result is not None else len(error or b"")
            if size + len(call.id) > self._max_single:
                result, error = None, self._refuse(ANSWER_TOO_LARGE, row.write)
            if result is not None:
                reply = jsonrpc.result_reply(call.id, result)
            else:
                reply = jsonrpc.raw_error_reply(call.id, error)
        usage: Usage = []
        self._book(usage, row, cu, error is not None)
        return RpcReply(reply, b"MISS", row.name, usage=usage)

    async def _handle_batch(self, calls: Sequence[Any], principal: Principal) -> RpcReply:
        jsonrpc = self._jsonrpc
        route = self.route
        replies: list[bytes | None] = [None] * len(calls)
        jobs: list[_Job] = []
        cu = tcu = 0
        reads = writes = False
        allow = principal.allow
        splits: dict[int, Split] = {}
        limit: Limit | None = None
        for index, call in enumerate(calls):
            if call.error:
                self._invalid.error += 1
                replies[index] = jsonrpc.error_reply(call.id, call.error, call.message)
                continue
            if allow is not None:
                # A call the key's lists forbid gets its own error; the batch's others run.
                refused = allow.call_refusal(call.method, call.params)
                if refused is not None:
                    if call.id is not None:
                        replies[index] = jsonrpc.error_reply(call.id, *refused)
                    continue
            row, tag, valid = route.classify(call)
            if row is None:
                self._unknown.error += 1
                replies[index] = route.not_found(call)
                continue
            if not valid:
                self._invalid.error += 1
                replies[index] = route.bad_tag(call)
                continue
            if row.spec.local and call.method not in self._local:
                self._unknown.error += 1
                replies[index] = self._not_served(call)
                continue
            if call.method == "eth_getLogs" and self.logs is not None:
                if limit is None:
                    limit = self.logs.limit(self._logs_range_of(principal))
                verdict = self.logs.plan(call.params, self.pool.head, limit)
                if isinstance(verdict, bytes):
                    row.stats.error += 1
                    if call.id is not None:
                        replies[index] = jsonrpc.raw_error_reply(call.id, verdict)
                    continue
                if verdict is not None:
                    splits[index] = verdict
            units, weight = row.price(tag)
            cu += units
            tcu += weight
            if row.write:
                writes = True
            else:
                reads = True
            jobs.append((index, call, row, tag, units))
        if jobs:
            rejection = self._gate.admit(principal, reads, writes, len(jobs), cu, tcu)
            if rejection is not None:
                return self._refused_batch(rejection, jobs, replies)
        assembly = Assembly(self._max_answer, self.answers)
        usage: Usage = []
        try:
            if splits:
                assert limit is not None
                return await self._dispatch_batch(
                    calls, jobs, replies, principal, usage, assembly, splits, limit
                )
            return await self._dispatch_batch(calls, jobs, replies, principal, usage, assembly)
        finally:
            assembly.release()

    async def _dispatch_batch(
        self,
        calls: Sequence[Any],
        jobs: list[_Job],
        replies: list[bytes | None],
        principal: Principal,
        usage: Usage,
        assembly: Assembly,
        splits: dict[int, Split] | None = None,
        limit: Limit | None = None,
    ) -> RpcReply:
        jsonrpc = self._jsonrpc
        hits = 0
        safe: list[_Job] = []
        unsafe: list[_Job] = []
        split_jobs: list[tuple[_Job, Split]] = []
        local_jobs: list[_Job] = []
        own_jobs: list[_Job] = []  # a broadcast, a call priced or bounded by its answer
        sticky: dict[str, list[_Job]] = {}  # reads that follow a write, by its upstream
        cache = self.cache
        for job in jobs:
            index, call, row, tag, units = job
            if splits and index in splits:
                split_jobs.append((job, splits[index]))
                continue
            if row.special:
                spec = row.spec
                if spec.local:
                    local_jobs.append(job)
                    continue
                if spec.special:
                    own_jobs.append(job)
                    continue
            if row.may_be_cached(tag, call.params):
                hit = cache.get((call.method, call.params or b""))
                if hit is not None:
                    if call.id is not None:
                        fits = assembly.admit(len(hit) + len(call.id) + REPLY_OVERHEAD)
                        if fits != FITS:
                            self._fail_all([job], self._refusal(fits, job), replies, usage)
                            continue
                        replies[index] = jsonrpc.result_reply(call.id, hit)
                    hits += 1
                    row.stats.cache_hits += 1
                    self._book(usage, row, units, False)
                    continue
            if self.sticky is not None and call.method in STICKY_METHODS:
                prefer = self.sticky.route(call.method, call.params, trio.current_time())
                if prefer is not None:
                    sticky.setdefault(prefer, []).append(job)
                    continue
            (safe if row.retry else unsafe).append(job)
        size = self._upstream_batch
        groups: list[tuple[list[_Job], str | None]] = [
            (safe[i : i + size], None) for i in range(0, len(safe), size)
        ]
        groups += [(unsafe[i : i + size], None) for i in range(0, len(unsafe), size)]
        for prefer, chosen in sticky.items():
            groups += [(chosen[i : i + size], prefer) for i in range(0, len(chosen), size)]
        if len(groups) == 1 and not split_jobs and not local_jobs and not own_jobs:
            group, prefer = groups[0]
            await self._send_group(group, replies, usage, assembly, prefer)
        elif groups or split_jobs or local_jobs or own_jobs:
            async with trio.open_nursery() as nursery:
                for group, prefer in groups:
                    nursery.start_soon(self._send_group, group, replies, usage, assembly, prefer)
                for job, split in split_jobs:
                    assert limit is not None
                    nursery.start_soon(
                        self._send_split, job, split, limit, replies, usage, assembly
                    )
                for job in local_jobs:
                    nursery.start_soon(self._answer_local, job, replies, principal, usage, assembly)
                for job in own_jobs:
                    nursery.start_soon(self._answer_own, job, replies, usage, assembly)
        parts = [reply for reply in replies if reply is not None]
        body = jsonrpc.join_batch(parts) if parts else None
        status = b"HIT" if hits == len(calls) else (b"MISS" if hits == 0 else b"PARTIAL")
        return RpcReply(body, status, "batch", admitted=bool(jobs), usage=usage)

    def _refused(self, rejection: Rejection, id_raw: bytes, label: str) -> RpcReply:
        """A call the gate refused.  The client still gets a JSON-RPC body (-32005 over a
        limit, -32002 for a scope the key lacks; with the call's id) so its JSON-RPC library
        can read it; the edge sends it with the gate's HTTP status (429, 403) so HTTP-level
        retry logic works too."""
        error = refusal_error(rejection.status, rejection.code, rejection.message)
        return RpcReply(self._jsonrpc.raw_error_reply(id_raw, error), b"MISS", label, rejection)

    def _refused_batch(
        self, rejection: Rejection, jobs: list[_Job], replies: list[bytes | None]
    ) -> RpcReply:
        """A refused batch: an array with each call's own reply — the refusal (-32005 over a
        limit) with its id for every call that would have gone upstream (notifications get
        none), the errors already decided for the others.  JSON-RPC clients match a batch's
        replies by id, and many cannot read a single object as a batch's answer."""
        error = refusal_error(rejection.status, rejection.code, rejection.message)
        for index, call, *_ in jobs:
            if call.id is not None:
                replies[index] = self._jsonrpc.raw_error_reply(call.id, error)
        answered = [reply for reply in replies if reply is not None]
        body = b"[" + b",".join(answered) + b"]" if answered else None
        return RpcReply(body, b"MISS", "batch", rejection)

    def _not_served(self, call: Any) -> bytes | None:
        """A local method whose subsystem this deployment does not run."""
        if call.id is None:
            return None
        message = f"{call.method[:64]} is not served on {self.label}: its subsystem is off"
        return self._jsonrpc.error_reply(call.id, METHOD_NOT_FOUND, message)

    # --- upstream calls ---------------------------------------------------------------------

    async def _call(
        self, method: str, params: bytes | None, row: Method, tag: bytes | None, key: CacheKey
    ) -> Outcome:
        """One call, joined to an identical one already in flight when that is safe."""
        if self.sticky is not None and method in STICKY_METHODS:
            prefer = self.sticky.route(method, params, trio.current_time())
            if prefer is not None:
                # Never joined to a call that may have left before the write did.
                return await self._send_one(method, params, row, tag, key, prefer)
        if not (self._coalesce and row.coalescible):
            return await self._send_one(method, params, row, tag, key)
        route = self.route
        flight = route.flights.get(key)
        if flight is not None:
            route.coalesced += 1
            if flight.future is None:
                flight.future = Future()
            result: Outcome = await flight.future.wait()
            return result
        flight = route.open_flight(key, params, row, tag)
        outcome = _CANCELLED
        try:
            outcome = await self._send_one(method, params, row, tag, key)
        finally:
            # Everyone who joined gets an answer even if this task is cancelled (they are
            # not), the fast lane's waiters included.
            route.land(flight, *outcome)
        return outcome

    def _dispatch(self, flights: list[Flight]) -> None:
        """The fast lane opened ``flights``: one upstream request for all of them (a batch
        unless it is one call); ``_land`` lands each with its own outcome."""
        jsonrpc = self._jsonrpc
        request_id = self._next_id
        count = len(flights)
        self._next_id += count
        first = flights[0]
        if count == 1:
            body = jsonrpc.upstream_request(request_id, first.method, first.params)
        else:
            body = jsonrpc.upstream_batch(request_id, flights)
        # A group of reads: when its answer comes and no batch waiting for it can still take
        # it (each over its answer bound), its body is dropped unread (Route.wants).  Writes
        # are always read.
        retry_safe = first.spec.retry
        wanted = None
        if retry_safe and count > 1:
            wanted = functools.partial(self.route.wants, flights)
        try:
            self.pool.submit(
                body,
                retry_safe=retry_safe,
                timeout=self._timeout,
                done=functools.partial(self._land, flights, request_id),
                wanted=wanted,
            )
        except Exception:
            # A bug of ours (or a pool already stopped): these calls fail, and nobody waits
            # on them forever, nor does an identical call join them later.
            log.exception("sending a group of calls upstream failed")
            self._land(flights, request_id, UpstreamError(UNAVAILABLE, "internal error", sent=True))

    def _land(self, flights: list[Flight], first_id: int, outcome: GroupOutcome) -> None:
        """Every flight of a group landed with its own outcome, whatever happens."""
        route = self.route
        try:
            self._land_outcome(flights, first_id, outcome)
        except Exception:
            log.exception("landing a group of calls failed")
        finally:
            for flight in flights:
                if not flight.done:
                    route.land(flight, *_CANCELLED)

    def _land_outcome(self, flights: list[Flight], first_id: int, outcome: GroupOutcome) -> None:
        """The group's answer (or failure) split into each flight's outcome."""
        route = self.route
        if isinstance(outcome, UpstreamError):
            failure = client_error(outcome, write=any(flight.spec.write for flight in flights))
            for flight in flights:
                route.land(flight, None, failure)
            return
        upstream, response, parsed = outcome
        response.body = b""  # parsed: a big answer's bytes are not kept while it lands
        if not parsed.batch and len(flights) > 1:  # batch first: a group answered, no len()
            # The node refused the batch as a whole (for example: too large); the pool saw
            # to it that this is an error object.
            for flight in flights:
                route.land(flight, None, parsed.replies[0].error)
            return
        # The pool checked the framing (a group of one: one reply, with a result or an error
        # object); the lane lands each reply, and shows us the results we must see.
        answered = (upstream.name, response.status)
        try:
            look, bad = self._landers[answered]
        except KeyError:
            look, bad = self._landers[answered] = self._landers_of(*answered)
        route.land_replies(flights, first_id, parsed.replies, look, bad, _MISSING)

    def _landers_of(self, upstream: str, status: int) -> _Landers:
        """``land_replies``'s ``look`` and ``bad`` for answers of ``upstream`` with ``status``."""
        return functools.partial(self._look, upstream), functools.partial(
            _bad_response, upstream, status
        )

    def _look(self, upstream: str, flight: Flight, result: bytes) -> None:
        """A result the lane landed that may be cached or says something (``_note``)."""
        self._note(flight.spec, flight.tag, flight.key, result, upstream)

    async def _send_one(
        self,
        method: str,
        params: bytes | None,
        row: Method,
        tag: bytes | None,
        key: CacheKey,
        prefer: str | None = None,
    ) -> Outcome:
        jsonrpc = self._jsonrpc
        request_id = self._next_id
        self._next_id += 1
        body = jsonrpc.upstream_request(request_id, method, params)
        deadline = trio.current_time() + self._timeout
        try:
            upstream, response, parsed = await self.pool.request_parsed(
                body, retry_safe=row.retry, deadline=deadline, prefer=prefer
            )
        except UpstreamError as exc:
            return None, client_error(exc, write=row.write)
        # The pool checked the framing: one reply, with a result or an error object.
        return self._outcome(parsed.replies[0], row, tag, key, upstream.name, response.status)

    async def _send_group(
        self,
        jobs: list[_Job],
        replies: list[bytes | None],
        usage: Usage,
        assembly: Assembly,
        prefer: str | None = None,
    ) -> None:
        """Send calls as one upstream batch and place each reply at its call's position."""
        if assembly.over:
            # The answer is already over its bound: these calls would only be refused.
            self._fail_all(jobs, self._refuse(ANSWER_TOO_LARGE, False, len(jobs)), replies, usage)
            return
        jsonrpc = self._jsonrpc
        by_id: dict[int, _Job] = {}
        parts = []
        request_id = self._next_id
        for job in jobs:
            by_id[request_id] = job
            call = job[1]
            parts.append(jsonrpc.upstream_request(request_id, call.method, call.params))
            request_id += 1
        self._next_id = request_id
        retry_safe = jobs[0][2].retry
        deadline = trio.current_time() + self._timeout
        # Reads are abandoned once the answer passes its bound; writes in flight never are.
        scope = trio.CancelScope()
        reserved = 0

        def wanted(length: int) -> bool:
            """Is this read's answer still wanted, its body of ``length`` bytes arriving?"""
            nonlocal reserved
            if scope.cancel_called:
                return False
            if not reserved:
                if not assembly.reserve(length):
                    return False
                reserved = max(length, 0) or -1
            return True

        if retry_safe:
            assembly.watch(scope)
        try:
            with scope:
                try:
                    upstream, response, parsed = await self.pool.request_parsed(
                        jsonrpc.join_batch(parts),
                        retry_safe=retry_safe,
                        deadline=deadline,
                        prefer=prefer,
                        wanted=wanted if retry_safe else None,
                    )
                except UpstreamError as exc:
                    failure = client_error(exc, write=any(job[2].write for job in jobs))
                    self._fail_all(jobs, failure, replies, usage)
                    return
            if scope.cancelled_caught:
                self._fail_all(
                    jobs, self._refuse(ANSWER_TOO_LARGE, False, len(jobs)), replies, usage
                )
                return
            if not parsed.batch:
                # The node refused the batch as a whole (for example: too large); the pool saw
                # to it that this is an error object.
                self._fail_all(jobs, parsed.replies[0].error, replies, usage)
                return
            self._place_group(by_id, replies, usage, assembly, upstream, response, parsed)
        finally:
            assembly.unreserve(max(reserved, 0))

    def _place_group(
        self,
        by_id: dict[int, _Job],
        replies: list[bytes | None],
        usage: Usage,
        assembly: Assembly,
        upstream: Upstream,
        response: Response,
        parsed: ParsedResponse,
    ) -> None:
        """A group's upstream answer: each reply placed at its call's position."""
        jsonrpc: Any = self._jsonrpc  # Any: exactly one of result and error is set
        response.body = b""  # parsed: a big answer's bytes are not kept while it is placed
        for reply in parsed.replies:
            request_id = _int_id(reply.id)
            if request_id not in by_id:
                continue
            job = by_id.pop(request_id)
            index, call, row, tag, units = job
            result, error = self._outcome(
                reply, row, tag, (call.method, call.params or b""), upstream.name, response.status
            )
            if call.id is not None:
                size = len(result) if result is not None else len(error or b"")
                fits = assembly.admit(size + len(call.id) + REPLY_OVERHEAD)
                if fits != FITS:
                    result, error = None, self._refusal(fits, job, sent=True)
                if result is not None:
                    replies[index] = jsonrpc.result_reply(call.id, result)
                else:
                    replies[index] = jsonrpc.raw_error_reply(call.id, error)
            self._book(usage, row, units, error is not None)
        if by_id:
            missing = error_object(
                INTERNAL_ERROR, "upstream returned no reply for this call", "bad_response"
            )
            self._fail_all(list(by_id.values()), missing, replies, usage)

    async def _split_logs(self, split: Split, limit: Limit) -> Outcome:
        """An eth_getLogs too wide for one upstream call, sent in parts (logranges.py)."""
        assert self.logs is not None
        methods = self.route.methods
        logs_row = methods["eth_getLogs"]

        async def send(method: str, params: bytes) -> Outcome:
            row = methods.get(method, logs_row)
            return await self._send_one(method, params, row, None, (method, params))

        result, error = await self.logs.fetch(split, send, limit, self._max_single, self._too_large)
        if error is self._too_large:
            self.refused[ANSWER_TOO_LARGE] += 1
        return result, error

    async def _send_split(
        self,
        job: _Job,
        split: Split,
        limit: Limit,
        replies: list[bytes | None],
        usage: Usage,
        assembly: Assembly,
    ) -> None:
        """A batch's eth_getLogs that is split: answered on its own, placed at its position."""
        result, error = await self._split_logs(split, limit)
        self._place(job, result, error, replies, usage, assembly)

    async def _answer_local(
        self,
        job: _Job,
        replies: list[bytes | None],
        principal: Principal,
        usage: Usage,
        assembly: Assembly,
    ) -> None:
        """A batch's call of a local method: answered in process, placed at its position."""
        call = job[1]
        result, error = await self._local[call.method](call.params, principal)
        self._place(job, result, error, replies, usage, assembly)

    async def _answer_own(
        self, job: _Job, replies: list[bytes | None], usage: Usage, assembly: Assembly
    ) -> None:
        """A batch's call under its method's own rules: answered on its own, placed at its
        position, metered at the units its answer cost."""
        index, call, row, tag, units = job
        result, error, units = await self._own_rules(call.method, call.params, row, units)
        self._place((index, call, row, tag, units), result, error, replies, usage, assembly)

    async def _own_rules(
        self, method: str, params: bytes | None, row: Method, cu: int
    ) -> tuple[bytes | None, bytes | None, int]:
        """A call whose method has rules of its own (MethodSpec.special): (result, error,
        units to meter).  A ``broadcast`` write goes to every upstream in rotation at once
        and is answered by the first success (pool.broadcast); a read with ``max_bytes`` is
        refused, unread, once its answer passes the bound; ``cu_per_kib`` adds units per
        started KiB of the answer."""
        spec = row.spec
        jsonrpc = self._jsonrpc
        request_id = self._next_id
        self._next_id += 1
        body = jsonrpc.upstream_request(request_id, method, params)
        deadline = trio.current_time() + self._timeout
        key = (method, params or b"")
        if spec.broadcast:
            try:
                upstream, response, parsed = await self.pool.broadcast(body, deadline=deadline)
            except UpstreamError as exc:
                return None, client_error(exc, write=True), cu
            reply = parsed.replies[0]
            return (*self._outcome(reply, row, None, key, upstream.name, response.status), cu)
        limit = min(spec.max_bytes or self._max_single, self._max_single)

        def wanted(length: int) -> bool:
            return length <= limit + REPLY_OVERHEAD + 64  # -1 (not declared): read, then judged

        try:
            upstream, response, parsed = await self.pool.request_parsed(
                body, retry_safe=row.retry, deadline=deadline, wanted=wanted
            )
        except UpstreamError as exc:
            if exc.kind == ABANDONED:
                return None, self._over_method_bound(method, limit), cu
            return None, client_error(exc, write=row.write), cu
        result, error = self._outcome(
            parsed.replies[0], row, None, key, upstream.name, response.status
        )
        if result is not None:
            if len(result) > limit:
                return None, self._over_method_bound(method, limit), cu
            if spec.cu_per_kib:
                cu += spec.cu_per_kib * -(-len(result) // 1024)
        return result, error, cu

    def _over_method_bound(self, method: str, limit: int) -> bytes:
        self.refused[ANSWER_TOO_LARGE] += 1
        message = (
            f"answer too large: {method[:64]} answers at most {limit} bytes here; narrow the "
            "query (getProgramAccounts: memcmp or dataSize filters, a dataSlice)"
        )
        return limit_error(message, ANSWER_TOO_LARGE, limit)

    def _place(
        self,
        job: _Job,
        result: bytes | None,
        error: bytes | None,
        replies: list[bytes | None],
        usage: Usage,
        assembly: Assembly,
    ) -> None:
        """A call answered on its own (a split eth_getLogs, a local method): its reply at its
        position within the answer's bound, counted and added to the usage."""
        index, call, row, _, units = job
        if call.id is not None:
            size = len(result) if result is not None else len(error or b"")
            fits = assembly.admit(size + len(call.id) + REPLY_OVERHEAD)
            if fits != FITS:
                result, error = None, self._refusal(fits, job)
            jsonrpc: Any = self._jsonrpc  # Any: exactly one of result and error is set
            if result is not None:
                replies[index] = jsonrpc.result_reply(call.id, result)
            else:
                replies[index] = jsonrpc.raw_error_reply(call.id, error)
        self._book(usage, row, units, error is not None)

    @staticmethod
    def _book(usage: Usage, row: Method, units: int, failed: bool) -> None:
        """One call answered: counted under its method, and added to its request's usage,
        which whoever answers the request meters once (the edge, the WebSocket session)."""
        if failed:
            row.stats.error += 1
        else:
            row.stats.ok += 1
        usage.append((row.name, 1, units, 1 if failed else 0))

    def _refusal(self, fits: int, job: _Job, *, sent: bool = False) -> bytes:
        """The error of a call whose reply did not fit (answer bound, or process budget)."""
        reason = OVERLOADED if fits == BUSY else ANSWER_TOO_LARGE
        return self._refuse(reason, sent and job[2].write)

    def _refuse(self, reason: str, executed: bool, calls: int = 1) -> bytes:
        """The error object for calls refused by an answer limit (counted for /metrics)."""
        self.refused[reason] += calls
        if reason == OVERLOADED:
            return self._busy_write if executed else self._busy
        return self._too_large_write if executed else self._too_large

    def _fail_all(
        self, jobs: list[_Job], error: bytes, replies: list[bytes | None], usage: Usage
    ) -> None:
        raw_error_reply = self._jsonrpc.raw_error_reply
        for index, call, row, _, units in jobs:
            self._book(usage, row, units, True)
            if call.id is not None:
                replies[index] = raw_error_reply(call.id, error)

    def _outcome(
        self,
        reply: Reply,
        row: Method,
        tag: bytes | None,
        key: CacheKey,
        upstream: str,
        status: int,
    ) -> Outcome:
        result = reply.result
        if reply.error is not None or result is None:
            if _is_object(reply.error):
                return None, reply.error
            return None, _bad_response(upstream, status)
        self._note(row, tag, key, result, upstream)
        return result, None

    def _note(
        self, row: Method, tag: bytes | None, key: CacheKey, result: bytes, upstream: str
    ) -> None:
        """What a result tells besides itself: the cache may keep it, a client's
        eth_blockNumber is a head seen, a write sets where its sender's reads go.  (The
        lane's ``Route.land_replies`` shows us exactly these: results the cache may keep
        and the ``watched`` methods'.)"""
        spec = row.spec
        if spec.cache != "none":
            self._maybe_cache(row, tag, key, result)
        elif spec.name == "eth_sendRawTransaction":
            if self.sticky is not None:
                self.sticky.note_send(key[1], result, upstream, trio.current_time())
        elif spec.name == "eth_blockNumber":
            head = block_number(result)
            if head is not None:
                self.pool.note_head(head)

    def _maybe_cache(self, row: Method, tag: bytes | None, key: CacheKey, result: bytes) -> None:
        if result == b"null" or not row.may_be_cached(tag, key[1]):
            return
        spec = row.spec
        if spec.cache == "static":
            self.cache.put(key, result)
            return
        finalized = self.route.finalized  # -1 before any head: nothing is final
        number = block_number(tag) if spec.block_param is not None else None
        if number is None:
            # A hash (or an EIP-1898 object) or no block param: the result may say which block
            # (a Solana transaction: its slot).
            number = self._result_block(result)
        if number is not None and number <= finalized:
            self.cache.put(key, result)


def _is_object(raw: bytes | None) -> bool:
    return raw is not None and raw[:1] == b"{"


def _int_id(raw: bytes | None) -> int:
    """Our own upstream ids are integers; anything else matches no call."""
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def _bad_response(upstream: str, status: int) -> bytes:
    return error_object(
        INTERNAL_ERROR,
        f"upstream {upstream} returned an invalid JSON-RPC response (HTTP {status})",
        "bad_response",
    )
