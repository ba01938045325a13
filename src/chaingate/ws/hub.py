"""One hub per EVM chain/network: the single source of every push, fanned out to all clients.

The hub reads the chain follower's event stream (one stream, whatever the number of clients)
and owns the two pollers of ``chaingate.ws.sources``.  Fan-out is synchronous: each event is
encoded once, framed once per kind (every subscription id has the same length, so every
frame has the same header), and handed to each subscriber's connection without waiting —
a connection that cannot take it drops itself (see ``Session.push``).  So the hub drains the
follower promptly and one slow client never delays the others.

Reorgs follow geth: ``Revert`` events (newest first) are collected until the new branch
starts, then every log of the orphaned blocks is pushed again with ``"removed": true``,
oldest block first, before the ``Apply`` of the new branch brings its heads and logs.  Only
blocks that were pushed live are ever "removed" (history the follower backfilled was never
announced, so it is not retracted either).

``logs`` subscriptions are matched through ``LogIndex``: a log meets only the filters filed
under its address or one of its topics (and the few all-wildcard ones), so the cost of a
block grows with the logs and the subscriptions that could match them, not with their
product.  Every fan-out yields to the loop by work done — candidates examined and pushes
made — so neither a block of many logs nor a crowd of subscribers stalls HTTP traffic.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import msgspec
import trio

from chaingate.chain.client import ChainClient
from chaingate.chain.events import Apply, Block, ChainEvent, Finalized, Log, Revert
from chaingate.obs.metrics import LatencySeries
from chaingate.rpc.pool import UpstreamPool
from chaingate.store.tx import Tx
from chaingate.ws.caps import WsCaps
from chaingate.ws.filters import (
    DEFAULT_ADDRESSES,
    DEFAULT_TOPICS,
    FilterError,
    log_key,
    parse_log_filter,
)
from chaingate.ws.logindex import LogIndex
from chaingate.ws.protocol import Push, encode
from chaingate.ws.registry import KINDS, Registry, Sink, Subscription
from chaingate.ws.sources import PendingSource, SyncingSource

# Reverts are held until the new branch starts; if it does not come this soon (a chain that
# only got shorter), the removed logs go out anyway.
REVERT_HOLD = 0.05
ANNOUNCED_BLOCKS = 1024  # hashes of blocks pushed live, remembered for reorgs
# Pushes between two checkpoints: a fan-out to many thousands of sockets must not stall the
# edge's HTTP traffic for its whole length (each push is one send system call).
FANOUT_SLICE = 64
# The logs fan-out counts its work instead: a log looked up or a candidate filter checked is
# one unit, a push PUSH_WORK units (a send system call); it yields every WORK_SLICE units
# (~0.2 ms), pushes or not.
WORK_SLICE = 512
PUSH_WORK = WORK_SLICE // FANOUT_SLICE
FANOUT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class SubscribeError(Exception):
    """An ``eth_subscribe`` the hub cannot serve: JSON-RPC code and message for the client."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Hub:
    push_method = "eth_subscription"  # how pushed units appear in usage

    def __init__(
        self,
        label: str,
        pool: UpstreamPool,
        pending_interval: float,
        syncing_interval: float,
    ) -> None:
        self.label = label
        self.pool = pool
        self.registry = Registry()
        self.registry.changed = self._changed
        self._events: trio.MemoryReceiveChannel[ChainEvent] | None = None
        self._client: ChainClient | None = None
        self._announced: OrderedDict[str, None] = OrderedDict()
        self.logs = LogIndex()
        self._full_pending = 0
        self.pending = PendingSource(
            pool,
            pending_interval,
            lambda: self.registry.count("newPendingTransactions") > 0,
            lambda: self._full_pending > 0,
            self.push_pending,
        )
        self._syncing_interval = syncing_interval
        self.syncing: SyncingSource | None = None
        # Observability: the newest head's arrival (wall clock) and number, pushes by kind,
        # and how long one event's fan-out took.
        self.head_arrival = 0.0
        self.head_number = -1
        self.pushes: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.fanout = LatencySeries(FANOUT_BUCKETS)

    def attach(
        self, events: trio.MemoryReceiveChannel[ChainEvent] | None, client: ChainClient
    ) -> None:
        """Connect the follower's stream (None: no follower, so no newHeads/logs) and the
        client used for ``eth_syncing``.  Called once, before ``run``."""
        self._events = events
        self._client = client
        self.syncing = SyncingSource(
            client,
            self._syncing_interval,
            lambda: self.registry.count("syncing") > 0,
            self.push_syncing,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.pending.run)
            if self.syncing is not None:
                nursery.start_soon(self.syncing.run)
            task_status.started()
            if self._events is not None:
                await self.follow(self._events)

    # --- subscriptions ---------------------------------------------------------------------

    def prepare(
        self, kind: object, args: list[Any], sink: Sink, caps: WsCaps | None = None
    ) -> Subscription:
        """A subscription for ``eth_subscribe(kind, *args)``, not yet live; or SubscribeError.
        A logs filter over ``caps`` (per filter: addresses, topics) is -32602."""
        if kind == "newHeads" or kind == "logs":
            if self._events is None:
                raise SubscribeError(
                    -32002, f"{kind} needs the chain follower, which is off for {self.label}"
                )
            if kind == "newHeads":
                return Subscription(kind, sink)
            addresses = caps.filter_addresses if caps is not None else DEFAULT_ADDRESSES
            topics = caps.filter_topics if caps is not None else DEFAULT_TOPICS
            try:
                log_filter = parse_log_filter(args[0] if args else None, addresses, topics)
            except FilterError as exc:
                data = None
                if exc.limit is not None:
                    data = {"limit": exc.limit.name, "value": exc.limit.value}
                raise SubscribeError(-32602, str(exc), data) from None
            return Subscription(kind, sink, log_filter=log_filter)
        if kind == "newPendingTransactions":
            full = args[0] if args else False
            if not isinstance(full, bool):
                raise SubscribeError(-32602, "newPendingTransactions takes one boolean (full)")
            return Subscription(kind, sink, full=full)
        if kind == "syncing":
            return Subscription(kind, sink)
        shown = kind if isinstance(kind, str) else type(kind).__name__
        raise SubscribeError(
            -32602, f"unsupported subscription {shown[:64]!r}; supported: {', '.join(KINDS)}"
        )

    def add(self, subscription: Subscription) -> None:
        if subscription.kind == "logs":
            self.logs.add(subscription)
        elif subscription.full:
            self._full_pending += 1
        self.registry.add(subscription)

    def remove(self, subscription: Subscription) -> bool:
        removed = self.registry.remove(subscription)
        if removed:
            if subscription.kind == "logs":
                self.logs.remove(subscription)
            elif subscription.full:
                self._full_pending -= 1
        return removed

    def welcome(self, subscription: Subscription) -> None:
        """What a new subscription is told at once, after its acknowledgement: the current
        sync state for ``syncing`` (if known; else it comes with the first poll)."""
        if subscription.kind == "syncing" and self.syncing is not None:
            current = self.syncing.current
            if current is not None:
                push = Push(encode(current))
                subscription.sink.push(push.frame(subscription.prefix), push.cu)

    def _changed(self, kind: str) -> None:
        if kind == "newPendingTransactions":
            self.pending.changed()
        elif kind == "syncing" and self.syncing is not None:
            self.syncing.changed()

    # --- fan-out -------------------------------------------------------------------------

    async def _fan(self, kind: str, subscriptions: list[Subscription], push: Push) -> None:
        for n, subscription in enumerate(subscriptions, 1):
            subscription.sink.push(push.frame(subscription.prefix), push.cu)
            if n % FANOUT_SLICE == 0:
                await trio.lowlevel.checkpoint()
        self.pushes[kind] += len(subscriptions)

    async def push_heads(self, block: Block) -> None:
        subscribers = list(self.registry.of_kind("newHeads").values())
        if subscribers:
            await self._fan("newHeads", subscribers, Push(encode(block.header.fields)))

    async def push_logs(self, logs: list[Log]) -> None:
        index = self.logs
        if not logs or not index.subscriptions:
            return
        checkpoint = trio.lowlevel.checkpoint
        work = count = 0
        for entry in logs:
            work += 1
            key = log_key(entry)
            if key is None:
                continue
            address, topics = key
            push: Push | None = None
            for group in index.candidates(address, topics):
                work += 1
                if group.filter.accepts(address, topics):
                    if push is None:
                        push = Push(encode(entry))
                    for subscription in tuple(group.members):
                        subscription.sink.push(push.frame(subscription.prefix), push.cu)
                        count += 1
                        work += PUSH_WORK
                        if work >= WORK_SLICE:
                            await checkpoint()
                            work = 0
                elif work >= WORK_SLICE:
                    await checkpoint()
                    work = 0
            if work >= WORK_SLICE:
                await checkpoint()
                work = 0
        self.pushes["logs"] += count

    async def push_pending(self, tx_hash: str, tx: Tx) -> None:
        subscribers = self.registry.of_kind("newPendingTransactions")
        if not subscribers:
            return
        by_hash: Push | None = None
        whole: Push | None = None
        count = 0
        for subscription in list(subscribers.values()):
            if subscription.full:
                if tx is None:
                    continue  # the node no longer knows it (mined or dropped): nothing to send
                whole = whole or Push(encode(tx))
                push = whole
            else:
                by_hash = by_hash or Push(encode(tx_hash))
                push = by_hash
            subscription.sink.push(push.frame(subscription.prefix), push.cu)
            count += 1
            if count % FANOUT_SLICE == 0:
                await trio.lowlevel.checkpoint()
        self.pushes["newPendingTransactions"] += count

    async def push_syncing(self, state: object) -> None:
        subscribers = list(self.registry.of_kind("syncing").values())
        if subscribers:
            await self._fan("syncing", subscribers, Push(encode(state)))

    # --- the follower's stream -------------------------------------------------------------

    async def follow(self, events: trio.MemoryReceiveChannel[ChainEvent]) -> None:
        """Consume chain events until the stream ends."""
        reverted: list[Block] = []
        async with events:
            while True:
                try:
                    if reverted:
                        with trio.move_on_after(REVERT_HOLD) as hold:
                            event = await events.receive()
                        if hold.cancelled_caught:
                            await self._retract(reverted)
                            reverted = []
                            continue
                    else:
                        event = await events.receive()
                except trio.EndOfChannel:
                    await self._retract(reverted)
                    return
                if isinstance(event, Revert):
                    reverted.append(event.block)
                    continue
                if reverted:
                    await self._retract(reverted)
                    reverted = []
                if isinstance(event, Apply):
                    if event.live:
                        await self._announce(event.block)
                elif isinstance(event, Finalized):
                    pass  # nothing to tell subscribers: finality is not part of eth_subscribe

    async def _announce(self, block: Block) -> None:
        started = time.perf_counter()
        self.head_arrival = time.time()
        self.head_number = block.header.number
        announced = self._announced
        announced[block.header.hash] = None
        if len(announced) > ANNOUNCED_BLOCKS:
            announced.popitem(last=False)
        await self.push_heads(block)
        await self.push_logs(block.logs)
        self.fanout.observe(time.perf_counter() - started)

    async def _retract(self, reverted: list[Block]) -> None:
        """Removed logs of orphaned blocks, oldest block first (geth's order)."""
        announced = self._announced
        for block in reversed(reverted):
            if block.header.hash in announced:
                del announced[block.header.hash]
                await self.push_logs(
                    [msgspec.structs.replace(entry, removed=True) for entry in block.logs]
                )
