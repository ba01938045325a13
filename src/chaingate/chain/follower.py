"""The chain follower: one per EVM chain/network, turning the node's head into ordered events.

How it works (every step restartable, state in the store):

1. **Start**: load the cursor and the window of recent blocks from the store.  On a first
   start, begin at ``follower.start_block`` (backfill) or at the current head.  The first
   block this deployment follows is claimed as the network's **origin** (once, by whichever
   process knows it first): where a consumer that has stored nothing begins
   (``chaingate.chain.catchup``).
2. **Backfill** while the head is far ahead: ``eth_getLogs`` over block ranges (split in half
   whenever a node refuses a range, grown again after successes) plus the ranges' headers in
   JSON-RPC batches.  Only blocks already ``finality_depth`` deep are backfilled this way.
3. **Live**: poll ``eth_getBlockByNumber("latest")``; walk from the new head down its parents
   to a block the window holds (``window.find_fork``); emit ``Revert`` for every held block
   above that ancestor (newest first), then fetch the new branch's logs by block hash and emit
   ``Apply`` for each new block (oldest first); emit ``Finalized`` as blocks pass the depth.
4. After every subscriber has taken a block's events, the cursor and window are saved in one
   transaction (per block when live, per range when backfilling).

Two kinds of consumer (see ``chaingate.chain.events`` for the ordering guarantees):

* ``subscribe()``: an async stream of ``ChainEvent`` with a bounded buffer; when such a
  consumer falls behind, the follower waits for it (backpressure).  For consumers that keep
  no position and are never slow: the gas oracle, the WebSocket hub (which drains its stream
  into its own per-client queues).
* ``tap()``: for a consumer run in terms that keeps its own position (the indexer, the
  webhook matcher, the wallets' and bundler's trackers): a queue the follower offers every
  event to and never waits for; a consumer that falls behind catches up by itself from the
  window or the node (``chaingate.chain.feed``), so it holds back neither the follower nor
  the other consumers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec
import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import (
    Apply,
    Block,
    BlockHeader,
    ChainEvent,
    Finalized,
    Log,
    Revert,
    header_from_rpc,
    transaction_hashes,
)
from chaingate.chain.heads import HeadNotifier
from chaingate.chain.ranges import RangeFetcher
from chaingate.chain.store import ChainCursor, StoredBlock
from chaingate.chain.tap import Tap
from chaingate.chain.window import BrokenLink, DeepReorg, Window, find_fork
from chaingate.config import FollowerSettings
from chaingate.config.network import Network
from chaingate.rpc.errors import BAD_RESPONSE, TIMEOUT, UpstreamError

log = logging.getLogger("chaingate.follower")

_encode_block = msgspec.json.Encoder().encode
_decode_block = msgspec.json.Decoder(Block).decode

MAX_BACKOFF = 5.0
# Finality depth's default for the window when none is configured bigger.
MIN_KEEP = 8


class Inconsistent(Exception):
    """The node's answers disagree with each other (a reorg while we were reading): retry."""


class ChainStore(Protocol):
    """What the follower needs from the store (``chaingate.chain.store.ChainRows`` provides it)."""

    async def load_chain(
        self, chain: str, network: str
    ) -> tuple[ChainCursor | None, list[StoredBlock]]: ...

    async def save_chain(
        self,
        chain: str,
        network: str,
        cursor: ChainCursor,
        added: Sequence[StoredBlock],
        *,
        keep_from: int,
        expect: tuple[int, str] | None,
    ) -> bool: ...

    async def chain_cursor(self, chain: str, network: str) -> tuple[int, str] | None: ...

    async def chain_origin(self, chain: str, network: str) -> int | None: ...

    async def claim_origin(self, chain: str, network: str, number: int) -> int: ...


class Follower:
    def __init__(
        self,
        chain: str,
        network: str,
        client: ChainClient,
        store: ChainStore,
        settings: FollowerSettings,
        *,
        finality_depth: int,
        block_time: float,
        ws_urls: Sequence[str] = (),
    ) -> None:
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))
        self.client = client
        self._store = store
        self._settings = settings
        self.finality_depth = max(0, finality_depth)
        self.window = Window(max(settings.keep_blocks, self.finality_depth + 1, MIN_KEEP))
        self.poll_interval = settings.poll_interval or max(0.05, block_time / 4)
        # While an upstream pushes new heads, polling is only a safety net.
        self.safety_poll_interval = max(self.poll_interval, block_time, 1.0)
        self.notifier = HeadNotifier(list(ws_urls), self.label) if ws_urls else None
        self._log_range = max(1, settings.max_log_range)
        self._consumers: list[tuple[str, trio.MemorySendChannel[ChainEvent]]] = []
        self._taps: list[Tap] = []
        # Set once the stored cursor and window are loaded; that cursor (None: none stored).
        self.loaded = trio.Event()
        self._loaded_cursor: tuple[int, str] | None = None
        # The network's origin (see ``origin``), and an event set once it is known.
        self._origin: int | None = None
        self._origin_known = trio.Event()
        self._pushed = trio.Event()  # set (and replaced) when a block joins the window
        self._finalized = -1
        # Set when the stored window could not be used: where to resume instead.
        self._resume_at: int | None = None
        # Transaction hashes of fetched headers, until their block is built.
        self._txs: dict[str, list[str]] = {}
        # Blocks applied since the last save, and whether a save is owed (reverts too).
        self._unsaved: list[Block] = []
        self._dirty = False
        # (tip, finalized) as of the last block fully applied: the tip is pushed before its
        # Apply is delivered and finality follows after, so reading the two live between
        # those awaits would show a tip whose finalized blocks were not yet announced.
        self._progress: tuple[int | None, int] = (None, -1)
        self.live = False
        self.stats: Counter[str] = Counter()
        # Whether this process saves the cursor and window (it leads the network's
        # ``follower`` role, chaingate.cluster), held while a save is on its way; every
        # process follows, for its WebSocket feed.
        self.may_save: Callable[[], contextlib.AbstractContextManager[bool]] = lambda: (
            contextlib.nullcontext(True)
        )
        # The stored cursor as this process last loaded or wrote it: a save moves it from
        # there (compare-and-set).  ``_adopt``: read it again first (a new leadership term,
        # or a save that found another process had saved).
        self._expect: tuple[int, str] | None = None
        self._adopt = False
        # The cursor of a save cut short (cancelled, or its answer lost): it may have been
        # committed all the same, and is then where the next save moves from.
        self._unsure: tuple[int, str] | None = None

    # --- the consumer interface ----------------------------------------------------------

    def subscribe(
        self, name: str, buffer: int | None = None
    ) -> trio.MemoryReceiveChannel[ChainEvent]:
        """A new ordered stream of every event from now on.  Close it to unsubscribe."""
        size = self._settings.consumer_buffer if buffer is None else buffer
        send, receive = trio.open_memory_channel[ChainEvent](size)
        self._consumers.append((name, send))
        return receive

    def tap(self, name: str, size: int | None = None) -> Tap:
        """A queue of this follower's events for a consumer run in terms, that the follower
        never waits for (``chaingate.chain.feed``; ``size``: ``consumer_buffer``)."""
        tap = Tap(name, self._settings.consumer_buffer if size is None else size)
        self._taps.append(tap)
        return tap

    def _offer(self, event: ChainEvent) -> None:
        """To every tap, in the same step as the window's change (``chaingate.chain.feed``)."""
        for tap in self._taps:
            tap.offer(event)

    async def origin(self) -> int:
        """The first block this deployment followed on the network: stored, or claimed on
        the first start (``follower.start_block``, else the head minus the finality depth
        then).  Waits until it is known (a first start knows it once the node answers)."""
        await self._origin_known.wait()
        assert self._origin is not None
        return self._origin

    async def started_at(self) -> tuple[int, str] | None:
        """The last block followed on the network before this process began (its stored
        cursor, as loaded); None when nothing was (the deployment's first start)."""
        await self.loaded.wait()
        return self._loaded_cursor

    async def wait_tip(self) -> None:
        """Returns once the window holds a block: the stored one loaded, or a first block
        applied (a first start, or a rewind that emptied it)."""
        await self.loaded.wait()
        while self.window.tip is None:
            await self._pushed.wait()

    def range_fetcher(self) -> RangeFetcher:
        """Blocks by number range from this network's node, sized as the follower's own."""
        return RangeFetcher(self.client, self._settings.max_log_range)

    @property
    def head(self) -> BlockHeader | None:
        tip = self.window.tip
        return tip.header if tip is not None else None

    @property
    def finalized(self) -> int:
        return self._finalized

    @property
    def progress(self) -> tuple[int | None, int]:
        """The tip's number and the finalized height, taken together between steps."""
        return self._progress

    def _publish(self) -> None:
        tip = self.window.tip
        self._progress = (tip.header.number if tip is not None else None, self._finalized)

    # --- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow until cancelled; started once the stored state is loaded."""
        await self._load()
        self.loaded.set()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                if self.notifier is not None:
                    nursery.start_soon(self.notifier.run)
                await self._loop()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._save()
            for _, send in self._consumers:
                send.close()
            for tap in self._taps:
                tap.end()

    async def _loop(self) -> None:
        failures = 0
        while True:
            try:
                progressed = await self._step()
                if not progressed and self._dirty:
                    # Kept while another process saved, and this one leads now: saved at
                    # once, not at the next block (a quiet chain may not have one soon).
                    await self._save()
                failures = 0
            except (UpstreamError, RpcCallError, Inconsistent, BrokenLink) as exc:
                failures += 1
                self.stats["errors"] += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "follower step failed; retrying",
                        extra={"fields": {"network": self.label, "error": str(exc), "n": failures}},
                    )
                await trio.sleep(self._backoff(failures))
                continue
            except Exception:
                # A bug must not take the whole gateway down with this network's follower:
                # log it loudly and retry, as for any other failed step.
                failures += 1
                self.stats["bugs"] += 1
                log.exception("follower step crashed", extra={"fields": {"network": self.label}})
                await trio.sleep(self._backoff(failures))
                continue
            if not progressed:
                await self._wait_for_head()

    def _backoff(self, failures: int) -> float:
        return min(MAX_BACKOFF, self.poll_interval * float(2 ** min(failures, 16)))

    async def _wait_for_head(self) -> None:
        notifier = self.notifier
        if notifier is None:
            await trio.sleep(self.poll_interval)
            return
        if notifier.take():
            return
        interval = self.safety_poll_interval if notifier.connected else self.poll_interval
        with trio.move_on_after(interval):
            await notifier.wake.wait()
        notifier.take()

    async def _load(self) -> None:
        cursor, stored = await self._store.load_chain(self.chain, self.network)
        origin = await self._store.chain_origin(self.chain, self.network)
        if origin is not None:
            self._know_origin(origin)
        if cursor is None:
            return
        self._expect = self._loaded_cursor = (cursor.number, cursor.hash)
        try:
            for row in stored:
                if row.number <= cursor.number:
                    self.window.push(_decode_block(row.body))
        except (BrokenLink, msgspec.DecodeError):
            self.window.clear()
        tip = self.window.tip
        if tip is None or tip.header.hash != cursor.hash:
            # The window is saved with the cursor in one transaction, so this means the rows
            # were edited by hand: start over from the cursor rather than trust them.
            log.error("stored chain window disagrees with its cursor; resuming without it")
            self.window.clear()
            self._resume_at = cursor.number + 1
        self._finalized = cursor.finalized
        self._publish()
        if origin is None:
            # Saved before origins were: the history the consumers have seen begins, as far
            # as anyone knows, with the stored window.
            base = self.window.base
            await self._claim_origin(base if base is not None else cursor.number + 1)

    async def _claim_origin(self, number: int) -> None:
        if not self._origin_known.is_set():
            self._know_origin(await self._store.claim_origin(self.chain, self.network, number))

    def _know_origin(self, number: int) -> None:
        self._origin = number
        self._origin_known.set()

    # --- one step --------------------------------------------------------------------------

    async def _step(self) -> bool:
        """Catch up once; False when there was nothing new."""
        head = self._header(await self.client.call("eth_getBlockByNumber", ["latest", False]))
        tip = self.window.tip
        if tip is None:
            return await self._first_block(head)
        if head.hash == tip.header.hash:
            # Applied already: its transactions were taken then.  Left in ``_txs``, every
            # block's list stayed until 10,000 had piled up (soak: issue 39).
            self._txs.pop(head.hash, None)
            self.live = True
            return False
        if head.number < tip.header.number and self.window.holds(head):
            # An upstream behind the one we last read (or a rewind with nothing mined since):
            # nothing to do until a block we do not hold appears.
            self._txs.pop(head.hash, None)
            return False
        safe = head.number - self.finality_depth
        if safe - tip.header.number > self.window.keep:
            await self._check_tip_canonical()
            await self._backfill(tip.header.number + 1, safe)
            return True
        await self._follow_to(head)
        self.live = True
        return True

    async def _first_block(self, head: BlockHeader) -> bool:
        start = self._resume_at
        if start is None:
            start = self._settings.start_block
        if start is None or start > head.number:
            # "From the head" starts with the blocks that may still be reorganised, so a reorg
            # of the head finds its ancestor in the window.
            start = max(0, head.number - self.finality_depth)
        # Backfill from ``start``: the first block's parent is not checked (nothing before it).
        # Nothing below ``start`` is announced as finalized, and nothing above it yet: a value
        # kept from a chain that is gone (a deep rewind emptied the window) must not survive.
        await self._claim_origin(start)
        self._resume_at = None
        self._finalized = start - 1
        end = max(start, head.number - self.finality_depth)
        await self._backfill(start, end)
        return True

    async def _check_tip_canonical(self) -> None:
        """Before backfilling past our tip, make sure the tip itself was not reorganised away."""
        tip = self.window.tip
        assert tip is not None
        canonical = self._header(
            await self.client.call("eth_getBlockByNumber", [hex(tip.header.number), False])
        )
        if canonical.hash != tip.header.hash:
            await self._follow_to(canonical)

    async def _follow_to(self, head: BlockHeader) -> None:
        """Make ``head`` the tip: revert what it orphans, apply its new branch."""
        tip = self.window.tip
        assert tip is not None
        known: dict[str, BlockHeader] = {}
        gap = head.number - tip.header.number - 1
        if 0 < gap <= self.window.keep:
            # Usually the head just extends us by a few blocks: fetch them in one batch.
            numbers = range(tip.header.number + 1, head.number)
            for header in await self._headers(numbers):
                known[header.hash] = header
        while True:
            try:
                fork = find_fork(self.window, head, known)
            except DeepReorg as exc:
                await self._deep_reorg(head, str(exc))
                return
            if fork.missing is None:
                break
            parent = await self.client.call("eth_getBlockByHash", [fork.missing, False])
            if parent is None:
                raise Inconsistent(f"parent {fork.missing} is unknown to the node")
            header = self._header(parent)
            known[header.hash] = header
        assert fork.ancestor is not None
        branch = list(reversed(fork.branch))
        blocks = await self._blocks_with_logs(branch)
        if self.window.tip is not None and self.window.tip.header.number > fork.ancestor:
            self.stats["reorgs"] += 1
            log.info(
                "reorg",
                extra={
                    "fields": {
                        "network": self.label,
                        "ancestor": fork.ancestor,
                        "reverted": self.window.tip.header.number - fork.ancestor,
                        "applied": len(blocks),
                    }
                },
            )
        while self.window.tip is not None and self.window.tip.header.number > fork.ancestor:
            block = self.window.tip
            await self._emit(Revert(block))
            self.window.pop()
            self._offer(Revert(block))
            self._unsaved = [b for b in self._unsaved if b.header.number < block.header.number]
            self._dirty = True
            self.stats["reverted"] += 1
        for block in blocks:
            await self._apply(block, live=True)
        await self._save()

    async def _deep_reorg(self, head: BlockHeader, why: str) -> None:
        """The chain changed below our window: revert all of it, then refill from its base."""
        self.stats["deep_reorgs"] += 1
        base = self.window.base
        assert base is not None
        log.error(
            "reorg deeper than the window", extra={"fields": {"network": self.label, "why": why}}
        )
        reverted = self.window.clear()
        for block in reverted:
            self._offer(Revert(block))
        for block in reverted:
            self.stats["reverted"] += 1
            await self._emit(Revert(block))
        self._unsaved = []
        self._dirty = True
        if head.number < base:
            # The node's chain ends below everything we held (restarted from scratch, or
            # rewound that far): there is nothing to refill from, so start over as on a first
            # start.  The blocks it finalized were reverted with the rest.
            self._finalized = -1
            self._publish()
            return
        # Finalized blocks were reverted too: their heights are announced again on this chain.
        self._finalized = min(self._finalized, base - 1)
        numbers = range(base, head.number + 1)
        headers = await self._headers(numbers)
        await self._apply_branch(headers, live=True)

    async def _apply_branch(self, headers: list[BlockHeader], *, live: bool) -> None:
        for block in await self._blocks_with_logs(headers):
            await self._apply(block, live=live)
        await self._save()

    # --- backfill ----------------------------------------------------------------------------

    async def _backfill(self, first: int, last: int) -> None:
        """Apply blocks ``first..last`` from ranged eth_getLogs plus batched headers.

        The next range is fetched while this one's blocks go to the consumers (one range
        ahead, no more): the node works while the consumers do, and neither waits for the
        other.  Backfilled blocks are ``finality_depth`` deep, so reading ahead is safe; the
        ranges are applied in order and each is checked to extend the one before."""
        send, receive = trio.open_memory_channel[list[Block]](0)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._fetch_ranges, first, last, send)
                async with receive:
                    async for blocks in receive:
                        for block in blocks:
                            await self._apply(block, live=False)
                        self.stats["log_ranges"] += 1
                        await self._save()
        except BaseExceptionGroup as group:
            # One side failed and the other was cancelled: the failure itself, so the loop
            # counts and retries a node's error as such rather than as a crash.
            raise _sole(group) from None

    async def _fetch_ranges(
        self, first: int, last: int, ranges: trio.MemorySendChannel[list[Block]]
    ) -> None:
        """The blocks of ``first..last``, a range at a time, into ``ranges`` (unbuffered: the
        range being fetched is the only one ahead of the consumers)."""
        async with ranges:
            number = first
            while number <= last:
                span = min(self._log_range, last - number + 1)
                to = number + span - 1
                try:
                    # Decoded straight into Log structs: a range's logs are most of its bytes.
                    logs = await self.client.call_as(
                        "eth_getLogs", [{"fromBlock": hex(number), "toBlock": hex(to)}], list[Log]
                    )
                except msgspec.ValidationError as exc:
                    raise Inconsistent(f"malformed logs from the node: {exc}") from None
                except RpcCallError as exc:
                    if span == 1:
                        raise
                    self._shrink(span, exc)
                    continue
                except UpstreamError as exc:
                    if span == 1 or exc.kind not in (TIMEOUT, BAD_RESPONSE):
                        raise
                    self._shrink(span, exc)
                    continue
                if logs is None:
                    raise Inconsistent(f"eth_getLogs {number}..{to} answered null")
                self._grow(span)
                headers = await self._headers(range(number, to + 1))
                # Taken now: by the time the range is applied, other walks may have come and
                # gone through ``_txs``.
                txs = [self._txs.pop(header.hash, []) for header in headers]
                by_number: dict[int, list[Log]] = {}
                for entry in logs:
                    by_number.setdefault(int(entry.block_number, 16), []).append(entry)
                blocks = []
                for header, hashes in zip(headers, txs, strict=True):
                    block_logs = by_number.pop(header.number, [])
                    if any(entry.block_hash != header.hash for entry in block_logs):
                        raise Inconsistent(f"logs of block {header.number} name another block")
                    blocks.append(Block(header, block_logs, hashes))
                if by_number:
                    raise Inconsistent("eth_getLogs returned logs outside the range asked")
                await ranges.send(blocks)
                number = to + 1

    def _shrink(self, span: int, exc: Exception) -> None:
        self._log_range = max(1, span // 2)
        self.stats["log_range_splits"] += 1
        log.info(
            "eth_getLogs range refused; splitting",
            extra={"fields": {"network": self.label, "span": span, "error": str(exc)[:200]}},
        )

    def _grow(self, span: int) -> None:
        if span == self._log_range:
            self._log_range = min(self._settings.max_log_range, math.ceil(span * 1.25))

    # --- fetching ------------------------------------------------------------------------

    def _header(self, result: object) -> BlockHeader:
        self._trim_txs()
        return self._parse_header(result)

    def _trim_txs(self) -> None:
        if len(self._txs) > 4 * self.window.keep + 10_000:
            self._txs.clear()  # headers fetched for walks that were abandoned

    def _parse_header(self, result: object) -> BlockHeader:
        if not isinstance(result, dict):
            raise Inconsistent(f"expected a block object, got {type(result).__name__}")
        try:
            header = header_from_rpc(result)
        except (KeyError, TypeError, ValueError) as exc:
            raise Inconsistent(f"malformed block object: {exc!r}") from None
        self._txs[header.hash] = transaction_hashes(result)
        return header

    async def _headers(self, numbers: range) -> list[BlockHeader]:
        results = await self.client.batch(
            [("eth_getBlockByNumber", [hex(n), False]) for n in numbers]
        )
        headers = []
        self._trim_txs()  # before the batch, never in its middle
        for number, result in zip(numbers, results, strict=True):
            if isinstance(result, RpcCallError):
                raise result
            if result is None:
                raise Inconsistent(f"block {number} is not known to the node yet")
            headers.append(self._parse_header(result))
        for previous, header in itertools.pairwise(headers):
            if header.parent_hash != previous.hash:
                raise Inconsistent(f"block {header.number} does not extend {previous.number}")
        return headers

    async def _blocks_with_logs(self, headers: list[BlockHeader]) -> list[Block]:
        """Each header's logs, fetched by block hash (EIP-234) so a reorg cannot mix blocks."""
        if not headers:
            return []
        results = await self.client.batch(
            [("eth_getLogs", [{"blockHash": header.hash}]) for header in headers]
        )
        blocks = []
        for header, result in zip(headers, results, strict=True):
            if isinstance(result, RpcCallError):
                # Most often "unknown block": it was reorganised away while we read.
                raise Inconsistent(f"logs of block {header.number}: {result}")
            logs = _logs(result)
            if any(entry.block_hash != header.hash for entry in logs):
                raise Inconsistent(f"logs of block {header.number} name another block")
            blocks.append(Block(header, logs, self._txs.pop(header.hash, [])))
        return blocks

    # --- emitting and saving -------------------------------------------------------------

    async def _apply(self, block: Block, *, live: bool) -> None:
        self.window.push(block)
        self._offer(Apply(block, live))
        self._pushed.set()
        self._pushed = trio.Event()
        try:
            await self._emit(Apply(block, live))
        except BaseException:
            # Cancelled before every consumer had it: not applied, so not saved; the next
            # run applies it again (consumers that did get it see it twice: at least once).
            self.window.pop()
            raise
        self._unsaved.append(block)
        self._dirty = True
        self.stats["applied"] += 1
        self.stats["logs"] += len(block.logs)
        ready = block.header.number - self.finality_depth
        while self._finalized < ready:
            final = self.window.get(self._finalized + 1)
            if final is not None:
                # Not offered to taps: no consumer run in terms uses it, and a backfill's
                # every block would take two places in their queues.
                await self._emit(Finalized(final.header))
            self._finalized += 1
        self._publish()

    async def _emit(self, event: ChainEvent) -> None:
        for consumer in list(self._consumers):
            name, send = consumer
            try:
                await send.send(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.info(
                    "consumer left", extra={"fields": {"network": self.label, "consumer": name}}
                )
                self._consumers.remove(consumer)

    async def _save(self) -> None:
        tip = self.window.tip
        if not self._dirty or tip is None:
            return
        with self.may_save() as leads:
            if not leads:
                # Another process saves: keep what joined (within the window) for when this
                # one leads, and save it all then, from wherever that one left the cursor.
                self._unsaved = [b for b in self._unsaved if self.window.holds(b.header)]
                self._adopt = True
                return
            if self._adopt or self._unsure is not None:
                stored = await self._store.chain_cursor(self.chain, self.network)
                if self._adopt or stored == self._unsure:
                    self._expect = stored
                self._adopt, self._unsure = False, None
            added = [
                StoredBlock(
                    b.header.number, b.header.hash, b.header.parent_hash, _encode_block(b).decode()
                )
                for b in self._unsaved
                if self.window.holds(b.header)
            ]
            cursor = ChainCursor(tip.header.number, tip.header.hash, self._finalized)
            keep_from = tip.header.number - self.window.keep + 1
            try:
                saved = await self._store.save_chain(
                    self.chain,
                    self.network,
                    cursor,
                    added,
                    keep_from=keep_from,
                    expect=self._expect,
                )
            except BaseException:
                self._unsure = (cursor.number, cursor.hash)
                raise
        if not saved:
            # Another process saved since this one last did (it led the network meanwhile):
            # nothing was written.  Kept for the next save, which starts from its cursor.
            self.stats["stale_saves"] += 1
            log.warning(
                "follower: the stored cursor moved under this process; not saved",
                extra={"fields": {"network": self.label, "expected": self._expect}},
            )
            self._unsaved = [b for b in self._unsaved if self.window.holds(b.header)]
            self._adopt = True
            return
        self._expect = (cursor.number, cursor.hash)
        self._unsaved = []
        self._dirty = False
        self._publish()


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception of ``group`` that is not a cancellation (the group itself when
    there are several, or none)."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        elif not isinstance(exc, trio.Cancelled):
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


def _logs(result: object) -> list[Log]:
    try:
        return msgspec.convert(result, list[Log])
    except msgspec.ValidationError as exc:
        raise Inconsistent(f"malformed logs from the node: {exc}") from None
