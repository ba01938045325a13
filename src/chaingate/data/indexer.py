"""The indexer service: one per followed EVM network, consuming the follower's event stream.

State in the store (``chaingate.data.store``): the index's own **cursor** (number and
hash of the last block whose effects it holds), the hashes of the last ``keep`` blocks, every
transfer, and the balances and counters derived from them.  Effects and cursor are committed
in one transaction, and the cursor moves by compare-and-set, so a crash never loses or
doubles a block and two processes indexing one network never both apply one.

How events are handled (delivery from the follower is ordered and at least once):

* ``Apply(block)`` that extends the tip (the last block committed or waiting in the batch):
  added to the batch.  While the follower backfills (``live=False``) the batch is committed
  every ``batch_blocks`` blocks, ``batch_transfers`` logs or ``batch_seconds``; a live block is
  committed at once.
* ``Apply`` of a block already held (same hash at that height): a replay, ignored.
* ``Apply`` that does not extend the tip — a height held with another hash, a gap above the
  tip (the index starts lower than the follower, or the follower saved a cursor the index had
  not committed before a crash), a parent that is not the tip — is **reconciled**: blocks
  held above the block's parent are undone, missing blocks are fetched from the node, and a
  tip the node no longer has is rewound to the highest recent block the node agrees with.
* ``Revert(block)`` of a block held: it and everything above it are undone, the cursor moves
  to its parent.  Undoing reads the blocks' stored transfers back and applies them negated —
  the same records decoding the block's logs gives, so the undo is exact, and it works for
  blocks the follower no longer holds.  Reverts of blocks not held are ignored.
* ``Finalized``: nothing to do.

Native transfers need the blocks' transactions: they are fetched per batch, just before it
is committed (``chaingate.data.fetch``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, Protocol, TypeVar

import msgspec
import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Apply, Block, ChainEvent, EventStream, Revert
from chaingate.config import ConfigError, IndexerSettings
from chaingate.config.network import Network
from chaingate.data.fetch import (
    BlockUnavailable,
    FetchError,
    RangeFetcher,
    canonical_hashes,
    fetch_natives,
)
from chaingate.data.ledger import ContractRow
from chaingate.data.reader import IndexReader
from chaingate.data.store import IndexConflict, IndexCursor, IndexRows, IndexState
from chaingate.data.transfers import DecodedBlock, MetadataUpdate, NativeTransfer, decode_block
from chaingate.rpc.errors import UpstreamError
from chaingate.store.base import Store, StoreError

log = logging.getLogger("chaingate.indexer")

P = ParamSpec("P")
T = TypeVar("T")

MAX_BACKOFF = 5.0
MIN_KEEP = 4096


class IndexStore(Protocol):
    """What the indexer needs from the store (``chaingate.data.store.IndexRows``)."""

    async def load_index(self, chain: str, network: str) -> IndexState: ...

    async def commit_index(
        self,
        chain: str,
        network: str,
        *,
        expect: IndexCursor | None,
        cursor: IndexCursor,
        blocks: Sequence[DecodedBlock] = (),
        undo_above: int | None = None,
        keep_from: int = 0,
    ) -> list[ContractRow]: ...


class IndexCommit(msgspec.Struct, frozen=True):
    """What one commit added that others may want to know (token metadata refresh)."""

    chain: str
    network: str
    cursor: IndexCursor
    live: bool
    contracts: list[ContractRow]  # token contracts seen for the first time
    metadata: list[MetadataUpdate]  # ERC-4906 / ERC-1155 URI events in the committed blocks


Listener = Callable[[IndexCommit], Awaitable[None]]


class _Restart(Exception):
    """The stored state changed under us (IndexConflict): handle the event again from it."""


class Indexer:
    def __init__(
        self,
        chain: str,
        network: str,
        store: Store,
        client: ChainClient | None,
        settings: IndexerSettings,
        *,
        finality_depth: int = 0,
        max_log_range: int = 2000,
    ) -> None:
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))
        _check(settings, chain, network)
        self._store: IndexStore = IndexRows(store)
        self._client = client
        self.settings = settings
        self.keep = settings.keep_blocks or max(MIN_KEEP, finality_depth + 1)
        self._fetcher = (
            RangeFetcher(client, settings.max_log_range or max_log_range) if client else None
        )
        self.reader = IndexReader(store, chain, network)
        self._listeners: list[Listener] = []
        self.cursor: IndexCursor | None = None  # committed
        # Bumped when a commit starts and again when it ends: never repeats, so a reader that
        # noted it before reading knows whether the index moved since (the REST cache does).
        self.generation = 0
        self._recent: dict[int, str] = {}  # committed heights -> hashes (the last ``keep``)
        self._pending: list[Block] = []  # blocks extending the cursor, not committed yet
        self._pending_logs = 0
        self._deadline = math.inf
        # The batch being committed in the background, and how that commit ended.
        self._inflight: list[DecodedBlock] = []
        self._inflight_done: trio.Event | None = None
        self._inflight_error: Exception | None = None
        self._nursery: trio.Nursery | None = None
        self.live = False
        self.stats: Counter[str] = Counter()
        self._moved = trio.Event()  # set (and replaced) whenever the cursor moves

    # --- the interface ---------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """Called after each commit that saw new token contracts or metadata updates (at least
        once: a commit that is repeated after a crash is announced again)."""
        self._listeners.append(listener)

    @property
    def start_block(self) -> int | None:
        """The first block to index when nothing is indexed yet (None: the network's origin,
        ``chaingate.chain.catchup``)."""
        return self.settings.start_block

    async def resume_point(self) -> tuple[int, str] | None:
        """The last block the index holds, as stored: where a term of it goes on from."""
        state = await self._store.load_index(self.chain, self.network)
        cursor = state.cursor
        return (cursor.number, cursor.hash) if cursor is not None else None

    async def wait_indexed(self, number: int) -> None:
        """Returns once the index has committed block ``number`` (or a later one)."""
        while self.cursor is None or self.cursor.number < number:
            await self._moved.wait()

    async def run(
        self, events: EventStream, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Index until cancelled or until the follower closes the stream (a term's feed,
        ``chaingate.cluster.rolestream``: it begins after the stored cursor, or at the start)."""
        await self._reload()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery, contextlib.aclosing(events):
                self._nursery = nursery
                while True:
                    try:
                        event = await self._receive(events)
                    except trio.EndOfChannel:
                        break
                    await self._guarded(event)
                await self._guarded(None)
                await self._drain()
        finally:
            self._nursery = None
            # A graceful stop commits what the batch holds, so a restart repeats nothing.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await self._commit_batch(wait=True, retry=False)
                except (_Restart, StoreError, FetchError, UpstreamError, RpcCallError):
                    pass

    # --- the loop ----------------------------------------------------------------------------

    async def _receive(self, events: EventStream) -> ChainEvent | None:
        """The next event; None when the batch is due for a commit first."""
        if not self._pending:
            return await events.receive()
        try:
            # In a backfill the next event is usually there: no timed wait (a cancel scope
            # per event) to take it.
            event = events.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            return event
        with trio.move_on_after(max(0.0, self._deadline - trio.current_time())):
            return await events.receive()
        return None

    async def _guarded(self, event: ChainEvent | None) -> None:
        failures = 0
        while True:
            try:
                if event is None:
                    await self._commit_batch()
                else:
                    await self._handle(event)
                return
            except _Restart:
                continue
            except Exception:
                # A bug must not take the gateway down with this network's index: log it,
                # start again from the stored state, retry the event.
                failures += 1
                self.stats["bugs"] += 1
                log.exception("indexer step crashed", extra={"fields": {"network": self.label}})
                await trio.sleep(self._backoff(failures))
                await self._reload()

    async def _handle(self, event: ChainEvent) -> None:
        if isinstance(event, Apply):
            await self._on_apply(event.block, event.live)
        elif isinstance(event, Revert):
            await self._on_revert(event.block)

    async def _on_apply(self, block: Block, live: bool) -> None:
        number = block.header.number
        tip = self._tip()
        if tip is None:
            start = self.settings.start_block
            if start is not None and number < start:
                self.stats["below_start"] += 1
                return
            if start is not None and number > start:
                await self._fill_gap(start, block)
            else:
                self._push(block)
        elif number == tip.number + 1 and block.header.parent_hash == tip.hash:
            self._push(block)
        elif number <= tip.number and self._hash_at(number) == block.header.hash:
            self.stats["replayed"] += 1
            return
        else:
            await self._reconcile(block)
        if live:
            self.live = True
            await self._commit_batch(live=True, wait=True)
        elif len(self._pending) >= self.settings.batch_blocks or (
            self._pending_logs >= self.settings.batch_transfers
        ):
            await self._commit_batch()

    async def _on_revert(self, block: Block) -> None:
        tip = self._tip()
        number = block.header.number
        if tip is None or number > tip.number or self._hash_at(number) != block.header.hash:
            self.stats["reverts_ignored"] += 1
            return
        await self._rewind(number - 1, block.header.parent_hash)

    # --- the batch -------------------------------------------------------------------------

    def _tip(self) -> IndexCursor | None:
        if self._pending:
            header = self._pending[-1].header
            return IndexCursor(header.number, header.hash)
        if self._inflight:
            return IndexCursor(self._inflight[-1].number, self._inflight[-1].hash)
        return self.cursor

    def _hash_at(self, number: int) -> str | None:
        if self._pending and number >= self._pending[0].header.number:
            index = number - self._pending[0].header.number
            if index < len(self._pending):
                return self._pending[index].header.hash
        if self._inflight and number >= self._inflight[0].number:
            index = number - self._inflight[0].number
            if index < len(self._inflight):
                return self._inflight[index].hash
        return self._recent.get(number)

    def _push(self, block: Block) -> None:
        if not self._pending:
            self._deadline = trio.current_time() + self.settings.batch_seconds
        self._pending.append(block)
        self._pending_logs += len(block.logs)

    async def _commit_batch(
        self, *, live: bool = False, wait: bool = False, retry: bool = True
    ) -> None:
        """Commit the batch.  Unless ``wait``, the commit runs in the background while the
        next batch gathers (one commit in flight at most); ``_drain`` waits for it."""
        if not self._pending:
            if wait:
                await self._drain()
            return
        blocks = self._pending
        natives = await self._natives(blocks)
        decoded = [decode_block(b, natives.get(b.header.hash, ())) for b in blocks]
        await self._drain()  # the previous commit: this one's expected cursor
        if blocks is not self._pending:
            raise _Restart  # the state was reloaded meanwhile
        self._pending = []
        self._pending_logs = 0
        self._inflight = decoded
        if wait or self._nursery is None:
            try:
                await self._commit_decoded(decoded, live, retry)
            finally:
                self._inflight = []
            return
        done = trio.Event()
        self._inflight_done = done

        async def commit() -> None:
            try:
                await self._commit_decoded(decoded, live, retry)
            except Exception as exc:
                self._inflight_error = exc
            except BaseException:
                # Cancelled (shutdown) perhaps before the batch was written: what follows it
                # must not be committed on top, nor must _drain report success.
                self._inflight_error = _Restart()
                raise
            finally:
                self._inflight = []
                done.set()

        self._nursery.start_soon(commit)

    async def _drain(self) -> None:
        """Wait for the commit in flight; its failure is raised here."""
        done = self._inflight_done
        if done is None:
            return
        await done.wait()
        self._inflight_done = None
        error, self._inflight_error = self._inflight_error, None
        if error is not None:
            raise error

    async def _commit_decoded(self, decoded: list[DecodedBlock], live: bool, retry: bool) -> None:
        last = decoded[-1]
        cursor = IndexCursor(last.number, last.hash)
        contracts = await self._commit(cursor, decoded, retry=retry)
        for d in decoded:
            self.stats["logs"] += d.logs
            self.stats["transfers"] += len(d.transfers)
            self.stats["ignored_logs"] += d.ignored
        self.stats["blocks"] += len(decoded)
        metadata = [m for d in decoded for m in d.metadata]
        if (contracts or metadata) and self._listeners:
            commit = IndexCommit(self.chain, self.network, cursor, live, contracts, metadata)
            for listener in list(self._listeners):
                try:
                    await listener(commit)
                except Exception:
                    log.exception(
                        "index listener failed", extra={"fields": {"network": self.label}}
                    )

    async def _commit(
        self,
        cursor: IndexCursor,
        blocks: Sequence[DecodedBlock] = (),
        *,
        undo_above: int | None = None,
        retry: bool = True,
    ) -> list[ContractRow]:
        """Commit and adopt the new cursor; store failures are retried, a conflict reloads."""
        keep_from = cursor.number - self.keep + 1
        self.generation += 1
        try:
            return await self._commit_once(cursor, blocks, undo_above, keep_from, retry)
        finally:
            self.generation += 1

    async def _commit_once(
        self,
        cursor: IndexCursor,
        blocks: Sequence[DecodedBlock],
        undo_above: int | None,
        keep_from: int,
        retry: bool,
    ) -> list[ContractRow]:
        failures = 0
        while True:
            try:
                contracts = await self._store.commit_index(
                    self.chain,
                    self.network,
                    expect=self.cursor,
                    cursor=cursor,
                    blocks=blocks,
                    undo_above=undo_above,
                    keep_from=keep_from,
                )
                break
            except IndexConflict as exc:
                self.stats["conflicts"] += 1
                log.warning(
                    "index changed under this indexer; reloading",
                    extra={"fields": {"network": self.label, "error": str(exc)}},
                )
                await self._reload()
                raise _Restart from None
            except StoreError as exc:
                failures += 1
                self.stats["store_errors"] += 1
                if not retry:
                    raise
                self._warn("index commit failed; retrying", exc, failures)
                await trio.sleep(self._backoff(failures))
        self.stats["commits"] += 1
        if undo_above is not None:
            reverted = [n for n in self._recent if n > undo_above]
            self.stats["reverted_blocks"] += len(reverted)
            for n in reverted:
                del self._recent[n]
        for block in blocks:
            self._recent[block.number] = block.hash
        for n in [n for n in self._recent if n < keep_from]:
            del self._recent[n]
        self._move(cursor)
        return contracts

    async def _reload(self) -> None:
        failures = 0
        while True:
            try:
                state = await self._store.load_index(self.chain, self.network)
                break
            except StoreError as exc:
                failures += 1
                self._warn("index state could not be loaded; retrying", exc, failures)
                await trio.sleep(self._backoff(failures))
        self._move(state.cursor)
        self._recent = dict(state.recent)
        self._pending = []
        self._pending_logs = 0

    def _move(self, cursor: IndexCursor | None) -> None:
        self.cursor = cursor
        self._moved.set()
        self._moved = trio.Event()

    # --- rewinding and filling ---------------------------------------------------------------

    async def _rewind(self, number: int, block_hash: str) -> None:
        """Undo every block above ``number``; the cursor becomes (number, block_hash)."""
        await self._drain()
        self._drop_pending_above(number)
        if self.cursor is None or self.cursor.number <= number:
            return
        await self._commit_batch(wait=True)  # what is left of it lies at or below ``number``
        assert self.cursor is not None
        if self.cursor.number <= number:
            return
        self.stats["rewinds"] += 1
        await self._commit(IndexCursor(number, block_hash), undo_above=number)

    def _drop_pending_above(self, number: int) -> None:
        kept = [b for b in self._pending if b.header.number <= number]
        if len(kept) != len(self._pending):
            self.stats["reverted_blocks"] += len(self._pending) - len(kept)
            self._pending = kept
            self._pending_logs = sum(len(b.logs) for b in kept)

    async def _reconcile(self, block: Block) -> None:
        """Make ``block`` applicable: undo what it replaces, fetch what it skips."""
        self.stats["reconciles"] += 1
        await self._commit_batch(wait=True)
        header = block.header
        failures = 0
        while True:
            tip = self.cursor
            assert tip is not None
            if header.number <= tip.number:
                if self._recent.get(header.number) == header.hash:
                    self.stats["replayed"] += 1
                    return
                parent = self._recent.get(header.number - 1) or header.parent_hash
                await self._rewind(header.number - 1, parent)
                continue
            if header.number == tip.number + 1:
                if header.parent_hash == tip.hash:
                    self._push(block)
                    return
                if not await self._rewind_to_fork():
                    # Our tip is the node's, the block's parent is not: the block is on a
                    # branch being abandoned (its Revert follows).
                    self.stats["unlinked_blocks"] += 1
                    return
                continue
            if await self._fill_gap(tip.number + 1, block):
                return
            if not await self._rewind_to_fork():
                # The node's blocks do not link to our tip, yet the tip is canonical: upstreams
                # that disagree for a moment.  Ask again later, not at once.
                failures += 1
                self.stats["unlinked_gaps"] += 1
                await trio.sleep(self._backoff(failures))

    async def _fill_gap(self, first: int, block: Block) -> bool:
        """Fetch blocks ``first..`` below ``block`` onto the tip, then add ``block`` if it
        extends them.  False when the fetched blocks do not extend the tip."""
        fetcher = self._fetcher
        if fetcher is None:
            raise FetchError("blocks are missing and there is no client to fetch them with")
        header = block.header
        number = first
        while number < header.number:
            got = await self._retrying(fetcher.next_blocks, number, header.number - 1)
            tip = self._tip()
            if tip is not None and got[0].header.parent_hash != tip.hash:
                return False
            for fetched in got:
                self._push(fetched)
                if len(self._pending) >= self.settings.batch_blocks or (
                    self._pending_logs >= self.settings.batch_transfers
                ):
                    await self._commit_batch()
            self.stats["fetched_blocks"] += len(got)
            number = got[-1].header.number + 1
        tip = self._tip()
        if tip is None or header.parent_hash == tip.hash:
            self._push(block)
        else:
            # The node's chain no longer leads to this block: it is being reorganised away,
            # and the follower's Revert for it will find nothing to undo.
            self.stats["unlinked_blocks"] += 1
        return True

    async def _rewind_to_fork(self) -> bool:
        """Rewind to the highest recent block on the node's chain; False when that is the
        committed tip itself (nothing to undo)."""
        await self._commit_batch(wait=True)
        tip = self.cursor
        assert tip is not None
        known = {n: h for n, h in self._recent.items() if n < tip.number}
        known[tip.number] = tip.hash
        heights = sorted(known, reverse=True)
        for start in range(0, len(heights), 64):
            chunk = heights[start : start + 64]
            canonical = await self._retrying(canonical_hashes, self._need_client(), chunk)
            for n in chunk:
                if canonical.get(n) == known[n]:
                    if n == tip.number:
                        return False
                    await self._rewind(n, known[n])
                    return True
        # Nothing we remember is canonical: go below it all and trust the node from there.
        below = heights[-1] - 1
        self.stats["deep_divergences"] += 1
        log.error(
            "index diverged from the chain deeper than the blocks it remembers",
            extra={"fields": {"network": self.label, "rewind_to": below}},
        )
        found = await self._retrying(canonical_hashes, self._need_client(), [below])
        await self._rewind(below, found.get(below, "0x" + "00" * 32))
        return True

    # --- fetching ------------------------------------------------------------------------------

    def _need_client(self) -> ChainClient:
        if self._client is None:
            raise FetchError("no client to ask the node with")
        return self._client

    async def _natives(self, blocks: Sequence[Block]) -> dict[str, list[NativeTransfer]]:
        if self._client is None or not self.settings.native_transfers:
            return {}
        client = self._client
        skipped: set[str] = set()
        failures = 0
        while True:
            wanted = [b for b in blocks if b.header.hash not in skipped]
            try:
                return await self._retrying(fetch_natives, client, wanted)
            except BlockUnavailable as exc:
                block = next(b for b in wanted if b.header.hash == exc.block_hash)
                number = block.header.number
                canonical = await self._retrying(canonical_hashes, client, [number])
                if number in canonical and canonical[number] != exc.block_hash:
                    # Reorganised away since the follower read it: its Revert is on the way,
                    # and what it would have added is undone with it.
                    skipped.add(exc.block_hash)
                    self.stats["native_orphaned"] += 1
                    continue
                # The node (an upstream behind the others) does not have it yet: wait.
                failures += 1
                self.stats["fetch_errors"] += 1
                self._warn("block transactions not available yet; retrying", exc, failures)
                await trio.sleep(self._backoff(failures))

    async def _retrying(
        self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn`` until it answers; node and transport failures are retried with back-off
        (BlockUnavailable is the caller's to judge)."""
        failures = 0
        while True:
            try:
                return await fn(*args, **kwargs)
            except BlockUnavailable:
                raise
            except (UpstreamError, RpcCallError, FetchError) as exc:
                failures += 1
                self.stats["fetch_errors"] += 1
                self._warn("indexer fetch failed; retrying", exc, failures)
                await trio.sleep(self._backoff(failures))

    # --- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _backoff(failures: int) -> float:
        return min(MAX_BACKOFF, 0.05 * float(2 ** min(failures, 16)))

    def _warn(self, message: str, exc: Exception, failures: int) -> None:
        if failures in (1, 10) or failures % 100 == 0:
            log.warning(
                message,
                extra={"fields": {"network": self.label, "error": str(exc)[:300], "n": failures}},
            )


def _check(settings: IndexerSettings, chain: str, network: str) -> None:
    where = f"chains.{chain}.{network}.indexer"
    if settings.batch_blocks < 1 or settings.batch_transfers < 1:
        raise ConfigError(f"{where}: batch_blocks and batch_transfers must be >= 1")
    if not settings.batch_seconds > 0:
        raise ConfigError(f"{where}: batch_seconds must be > 0")
    if settings.keep_blocks < 0 or settings.max_log_range < 0:
        raise ConfigError(f"{where}: keep_blocks and max_log_range must be >= 0")
    if settings.start_block is not None and settings.start_block < 0:
        raise ConfigError(f"{where}: start_block must be >= 0")
