"""One network's matcher: the follower's blocks in, the outbox's events out, reorg-safe.

For each applied block: the network's active webhooks (loaded with the filters version they
had) are matched against the block — its logs, and where some webhook needs them its full
transactions, their receipts and the call traces — and the events are written to the outbox
in the same transaction that moves the matcher's cursor (``WebhookRows.commit_matches``).  That
commit fails when a webhook changed meanwhile; the block is then matched again with the new
filters, so a webhook created or patched is matched from exactly the block its answer names.

A reverted block's events are taken back (``WebhookRows.revert_matches``): never sent ones are
cancelled, the others followed by a compensating event.  On start, and whenever the follower
hands a block that does not extend the cursor (the matcher was down, or behind), the missed
blocks are fetched (``RangeFetcher``) and blocks matched on a branch the chain left are
undone first.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import msgspec
import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.events import Apply, Block, ChainEvent, EventStream, Revert
from chaingate.chain.ranges import FetchError, RangeFetcher, canonical_hashes
from chaingate.config.network import Network
from chaingate.rpc.errors import UpstreamError
from chaingate.store import Store
from chaingate.store.base import StoreError
from chaingate.webhooks.filters import Filter
from chaingate.webhooks.matchindex import BlockData, MatchIndex, Subscription, parse_call_traces
from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    Match,
    NftInfo,
    Token,
    TransferFact,
    event_id,
    removal_id,
)
from chaingate.webhooks.outbox import NewEvent
from chaingate.webhooks.store import WebhookCursorMoved, WebhookRow, WebhookRows
from chaingate.webhooks.variants import Variant

log = logging.getLogger("chaingate.webhooks")

RETRY_SECONDS = 1.0
MAX_BACKOFF = 10.0
# How far below the cursor a matcher coming back looks for blocks the chain has left.
RECONCILE_DEPTH = 128
# A token new to the metadata service is probed while the block waits, this long at most
# (then its symbol and decimals are null in the payload).
TOKEN_WAIT = 3.0
METADATA_CHUNK = 500
# History blocks (a backfill) are committed together, up to this many or this late after the
# first: a live block is committed on its own, at once.
BACKLOG_BLOCKS = 500
BACKLOG_SECONDS = 0.5

_filter_decoder = msgspec.json.Decoder(Filter)
_TRANSIENT = (StoreError, FetchError, UpstreamError, RpcCallError, ValueError)


class TokenSource(Protocol):
    """What payloads take from the token/NFT metadata (``chaingate.metadata``'s service)."""

    async def tokens(self, contracts: Sequence[str], *, wait: float) -> Mapping[str, Any]: ...

    async def cached_nfts(
        self, keys: Sequence[tuple[str, int]]
    ) -> Mapping[tuple[str, int], Any]: ...


class _Stale(Exception):
    """The filters changed under a commit: match the block again."""


class NetworkMatcher:
    def __init__(
        self,
        chain: str,
        network: str,
        store: Store,
        client: ChainClient | None,
        variant: Variant,
        *,
        chain_id: int | None,
        max_log_range: int = 2000,
        on_events: Callable[[], None] = lambda: None,
        metadata: TokenSource | None = None,
    ) -> None:
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))
        self._store = WebhookRows(store)
        self._client = client
        self._variant = variant
        self._chain_id = chain_id
        self._ranges = RangeFetcher(client, max_log_range) if client is not None else None
        self._on_events = on_events
        self._metadata = metadata
        self._version = -1
        self._cursor: tuple[int, str] | None = None
        self._index = MatchIndex(())
        self._hooks: dict[str, WebhookRow] = {}
        self._dirty = True
        self._reloading = trio.Lock()  # the matcher and the pending poller both reload
        # History blocks (Apply with live=False) matched and committed together.
        self._backlog: list[Block] = []
        self._backlog_due = math.inf
        self.stats: Counter[str] = Counter()

    @property
    def cursor(self) -> tuple[int, str] | None:
        return self._cursor

    async def current_index(self) -> MatchIndex:
        """The active webhooks' index, loaded again first if a webhook changed (the pending
        poller asks between blocks: on a chain that mines nothing, no block would)."""
        if self._dirty:
            await self._reload()
        return self._index

    async def write_unanchored(self, matches: Sequence[Match]) -> int:
        """Events of no block (pending transactions): written now, no cursor moved."""
        events = [
            NewEvent(
                id=event_id(m.webhook_id, m.key),
                webhook_id=m.webhook_id,
                event_type=self._hooks[m.webhook_id].event_type,
                payload=m,
            )
            for m in matches
            if m.webhook_id in self._hooks
        ]
        written = await self._store.add_events(events, self._render)
        if written:
            self.stats["events"] += written
            self._on_events()
        return written

    def filters_changed(self) -> None:
        """A webhook of this network changed: load the filters before the next block."""
        self._dirty = True

    # --- running ---------------------------------------------------------------------------

    # No start of its own: having matched nothing, it begins at the network's origin (where a
    # webhook whose ``matched_from_block`` is null is matched from).
    start_block: int | None = None

    async def resume_point(self) -> tuple[int, str] | None:
        """The last block matched, as stored: where a term of it goes on from."""
        return await self._store.webhook_cursor(self.chain, self.network)

    async def run(
        self, events: EventStream, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Match until the follower closes the stream (a term's feed, ``chaingate.cluster.
        gates``: it begins after the stored cursor, or at the network's origin)."""
        # One leadership term: another process may have led this network since the last one.
        self._forget()
        await self._retrying("loading webhook filters", self._reload)
        task_status.started()
        async with contextlib.aclosing(events):
            while True:
                wait = math.inf
                if self._backlog:
                    wait = max(0.0, self._backlog_due - trio.current_time())
                event: ChainEvent | None = None
                try:
                    # Usually there in a backfill: no timed wait (a cancel scope) to take it.
                    event = events.receive_nowait()
                except trio.WouldBlock:
                    # Only the wait is timed: handling an event is never cut short.
                    with trio.move_on_after(wait):
                        try:
                            event = await events.receive()
                        except trio.EndOfChannel:
                            break
                except trio.EndOfChannel:
                    break
                else:
                    await trio.lowlevel.checkpoint_if_cancelled()
                if event is None:
                    await self._retrying("matching", self._flush)  # the backlog waited enough
                    continue
                await self._retrying("matching", functools.partial(self._handle, event))
            await self._retrying("matching", self._flush)

    def _forget(self) -> None:
        """Drop what this process knew of the network's progress (its cursor and any history
        blocks held but not committed): the stored cursor is loaded next, and blocks it
        lacks are fetched again (``_catch_up``)."""
        self._backlog = []
        self._backlog_due = math.inf
        self._cursor = None
        self._dirty = True

    async def _retrying(self, what: str, step: Callable[[], Any]) -> None:
        """Run ``step`` until it succeeds: the follower waits for us meanwhile, so nothing is
        skipped.  A bug skips the event, loudly, rather than stopping every consumer."""
        failures = 0
        while True:
            try:
                await step()
                return
            except WebhookCursorMoved as exc:
                # Another process moved the stored cursor (it led this network meanwhile):
                # go on from where it left it.
                self.stats["moved_cursors"] += 1
                log.warning(
                    f"webhook matcher: {what}: the stored cursor moved; reloading",
                    extra={"fields": {"network": self.label, "error": str(exc)[:300]}},
                )
                self._forget()
            except _TRANSIENT as exc:
                failures += 1
                self.stats["errors"] += 1
                if failures == 1 or failures % 10 == 0:
                    log.warning(
                        f"webhook matcher: {what} failed; retrying",
                        extra={"fields": {"network": self.label, "error": str(exc)[:300]}},
                    )
                await trio.sleep(min(MAX_BACKOFF, RETRY_SECONDS * failures))
            except Exception:
                self.stats["bugs"] += 1
                log.exception(
                    f"webhook matcher: {what}: event skipped",
                    extra={"fields": {"network": self.label}},
                )
                return

    async def _reload(self) -> None:
        async with self._reloading:
            if self._dirty or self._version < 0:
                await self._load()

    async def _load(self) -> None:
        version, cursor, rows = await self._store.load_webhook_filters(self.chain, self.network)
        subscriptions = []
        hooks = {}
        for row in rows:
            kind = self._variant.event_types.get(row.event_type)
            if kind is None:  # a webhook of the other variant (the deployment switched)
                continue
            try:
                subscriptions.append(Subscription(row.id, kind, _filter_decoder.decode(row.config)))
            except msgspec.DecodeError:
                self.stats["bad_configs"] += 1
                continue
            hooks[row.id] = row
        self._index = MatchIndex(subscriptions)
        self._hooks = hooks
        self._version = version
        if self._cursor is None or cursor is None or cursor[0] < self._cursor[0]:
            self._cursor = cursor
        self._dirty = False
        self.stats["reloads"] += 1

    async def _handle(self, event: ChainEvent) -> None:
        if self._dirty:
            await self._reload()
        if isinstance(event, Apply):
            if not event.live and self._held(event.block):
                if len(self._backlog) >= BACKLOG_BLOCKS:
                    await self._flush()
                return
            await self._flush()
            await self._apply(event.block)
        elif isinstance(event, Revert):
            await self._flush()
            await self._revert(event.block)

    # --- the backfill's backlog ------------------------------------------------------------

    def _held(self, block: Block) -> bool:
        """Take a history block into the backlog (True) if it extends the cursor or the
        backlog; a block that does not is handled one by one."""
        header = block.header
        if self._backlog:
            tip = self._backlog[-1].header
            if header.hash == tip.hash:
                return True  # handled again after a failed flush: held already
            at: tuple[int, str] | None = (tip.number, tip.hash)
        else:
            at = self._cursor
        if at is None or header.number != at[0] + 1 or header.parent_hash != at[1]:
            return False
        if not self._backlog:
            self._backlog_due = trio.current_time() + BACKLOG_SECONDS
        self._backlog.append(block)
        return True

    async def _flush(self) -> None:
        """Match the backlog and commit its events with its last block as the cursor: one
        transaction for many history blocks (each one's own would pace the follower, which
        waits for its slowest consumer, to the store's round trips)."""
        blocks = self._backlog
        if not blocks:
            return
        await self._match_and_commit(blocks)
        self._backlog = []

    # --- blocks ----------------------------------------------------------------------------

    async def _apply(self, block: Block) -> None:
        header = block.header
        cursor = self._cursor
        if cursor is not None:
            if header.number <= cursor[0]:
                return  # matched before (the follower repeats its last block after a restart)
            if header.number > cursor[0] + 1 or header.parent_hash != cursor[1]:
                await self._catch_up(block)
                cursor = self._cursor
                if cursor is not None and header.number <= cursor[0]:
                    return
        await self._match_and_commit([block])

    async def _match_and_commit(self, blocks: Sequence[Block]) -> None:
        """``_commit_many``, matched again whenever the filters changed meanwhile."""
        while True:
            try:
                await self._commit_many(blocks)
                return
            except _Stale:
                self._dirty = True
                await self._reload()

    async def _commit_many(self, blocks: Sequence[Block]) -> None:
        """Match ``blocks`` (consecutive) and commit their events with the last one as the
        cursor, in one transaction."""
        events = []
        for block in blocks:
            header = block.header
            matches = await self._matches(block) if self._hooks else []
            events += [self._event(m, header.number, header.hash) for m in matches]
        version = self._version
        last = blocks[-1].header
        done = await self._store.commit_matches(
            self.chain,
            self.network,
            version,
            (last.number, last.hash),
            events,
            self._render,
            expect=self._cursor,
        )
        if not done:
            self.stats["stale_commits"] += 1
            raise _Stale()
        self._cursor = (last.number, last.hash)
        self.stats["blocks"] += len(blocks)
        self.stats["commits"] += 1
        if events:
            self.stats["events"] += len(events)
            self._on_events()

    async def _revert(self, block: Block) -> None:
        cursor = self._cursor
        if cursor is None or cursor[1] != block.header.hash:
            return  # never matched (or already undone)
        parent = (block.header.number - 1, block.header.parent_hash)
        cancelled, compensated = await self._store.revert_matches(
            self.chain,
            self.network,
            block.header.hash,
            parent,
            self._variant.render_removal,
            removal_id,
            expect=cursor,
        )
        self._cursor = parent
        self.stats["reverted_blocks"] += 1
        self.stats["cancelled"] += cancelled
        self.stats["compensated"] += compensated
        if compensated:
            self._on_events()

    async def _catch_up(self, block: Block) -> None:
        """The cursor is not ``block``'s parent: undo what the chain left, then fetch and
        match the blocks between."""
        client = self._need_client()
        assert self._cursor is not None
        await self._undo_orphans(client)
        cursor = self._cursor
        assert self._ranges is not None
        while cursor is not None and cursor[0] + 1 < block.header.number:
            fetched = await self._ranges.next_blocks(cursor[0] + 1, block.header.number - 1)
            if fetched[0].header.parent_hash != cursor[1]:
                raise FetchError(f"block {fetched[0].header.number} does not extend the cursor")
            # Committed as the backlog is: many blocks per transaction, not one each.
            for first in range(0, len(fetched), BACKLOG_BLOCKS):
                missed = fetched[first : first + BACKLOG_BLOCKS]
                await self._match_and_commit(missed)
                self.stats["caught_up_blocks"] += len(missed)
            cursor = self._cursor
        if cursor is not None and block.header.parent_hash != cursor[1]:
            raise FetchError(f"block {block.header.number} does not extend the cursor")

    async def _undo_orphans(self, client: ChainClient) -> None:
        """Revert, newest first, every matched block the chain no longer has."""
        assert self._cursor is not None
        top = self._cursor[0]
        bottom = max(0, top - RECONCILE_DEPTH)
        matched = await self._store.matched_blocks(self.chain, self.network, bottom)
        numbers = sorted({top, *(n for n, _ in matched)} | {n - 1 for n, _ in matched if n > 0})
        canonical = await canonical_hashes(client, numbers)
        lowest: tuple[int, str] | None = None
        at: tuple[int, str] = self._cursor  # the stored cursor, as each revert leaves it
        for number, block_hash in [(top, self._cursor[1]), *matched]:
            if canonical.get(number) == block_hash:
                continue
            parent_number = number - 1
            parent = (parent_number, canonical.get(parent_number, ""))
            await self._store.revert_matches(
                self.chain,
                self.network,
                block_hash,
                parent,
                self._variant.render_removal,
                removal_id,
                expect=at,
            )
            at = self._cursor = parent
            self.stats["reverted_blocks"] += 1
            if lowest is None or parent_number < lowest[0]:
                lowest = parent
        if lowest is not None:
            if lowest[1] == "":
                raise FetchError(f"block {lowest[0]} is not known to the node")
            await self._store.move_webhook_cursor(self.chain, self.network, lowest, expect=at)
            self._cursor = lowest
            self._on_events()

    def _need_client(self) -> ChainClient:
        if self._client is None:
            raise FetchError(f"{self.label}: no chain client to fetch missed blocks")
        return self._client

    # --- matching --------------------------------------------------------------------------

    async def _matches(self, block: Block) -> list[Match]:
        header = block.header
        ref = BlockRef(header.number, header.hash, header.timestamp)
        needs = self._index.needs
        transactions: Sequence[Mapping[str, Any]] | None = None
        receipts: dict[str, Mapping[str, Any]] | None = None
        internal = None
        if needs.transactions or needs.receipts or needs.traces:
            client = self._need_client()
            calls: list[tuple[str, list[Any]]] = []
            if needs.transactions or needs.receipts:
                calls.append(("eth_getBlockByHash", [header.hash, True]))
            if needs.receipts and block.transactions:
                calls.append(("eth_getBlockReceipts", [header.hash]))
            if needs.traces and block.transactions:
                calls.append(("debug_traceBlockByHash", [header.hash, {"tracer": "callTracer"}]))
            answers = dict(zip((m for m, _ in calls), await client.batch(calls), strict=True))
            for method, answer in answers.items():
                if isinstance(answer, RpcCallError):
                    raise answer
                if answer is None:
                    raise FetchError(f"{method} {header.hash}: the node does not know the block")
            if "eth_getBlockByHash" in answers:
                body = answers["eth_getBlockByHash"]
                if not isinstance(body, dict) or body.get("hash") != header.hash:
                    raise FetchError(f"eth_getBlockByHash {header.hash}: another block answered")
                transactions = body.get("transactions") or []
            if needs.receipts:
                receipts = {}
                listed = answers.get("eth_getBlockReceipts") or []
                if not isinstance(listed, list):
                    raise FetchError(f"eth_getBlockReceipts {header.hash}: not a list")
                for receipt in listed:
                    if not isinstance(receipt, dict) or receipt.get("blockHash") != header.hash:
                        raise FetchError(f"receipts of {header.hash} name another block")
                    receipts[str(receipt.get("transactionHash"))] = receipt
            if needs.traces:
                traces = answers.get("debug_traceBlockByHash") or []
                internal = parse_call_traces(ref, traces, tx_hashes=block.transactions)
        data = BlockData(
            block=BlockFact(
                block=ref,
                parent_hash=header.parent_hash,
                gas_used=header.gas_used,
                gas_limit=header.gas_limit,
                base_fee_per_gas=header.base_fee_per_gas,
                transaction_count=header.transaction_count,
            ),
            logs=block.logs,
            transactions=transactions,
            receipts=receipts,
            internal=internal,
        )
        matches = self._index.match_block(data)
        return await self._with_metadata(matches)

    async def _with_metadata(self, matches: list[Match]) -> list[Match]:
        """Token symbols and decimals, and NFT metadata, from the network's metadata service:
        a token new to it is probed (waited for at most ``TOKEN_WAIT``); NFT documents are
        taken as cached (a miss is queued and shows as ``pending``)."""
        if self._metadata is None:
            return matches
        contracts = sorted(
            {
                m.fact.contract
                for m in matches
                if isinstance(m.fact, TransferFact)
                and m.fact.standard == "ERC20"
                and m.fact.contract is not None
            }
        )
        nfts = sorted(
            {
                (m.fact.contract, m.fact.token_id)
                for m in matches
                if isinstance(m.fact, TransferFact)
                and m.fact.standard in ("ERC721", "ERC1155")
                and m.fact.contract is not None
                and m.fact.token_id is not None
            }
        )
        tokens: dict[str, Token] = {}
        items: dict[tuple[str, int], NftInfo] = {}
        for start in range(0, len(contracts), METADATA_CHUNK):
            tokens.update(await self._tokens(contracts[start : start + METADATA_CHUNK]))
        for start in range(0, len(nfts), METADATA_CHUNK):
            cached = await self._metadata.cached_nfts(nfts[start : start + METADATA_CHUNK])
            for (contract, token_id), nft in cached.items():
                items[(contract, token_id)] = NftInfo(
                    name=nft.name,
                    description=nft.description,
                    image_url=nft.image_url,
                    token_uri=nft.token_uri,
                    status=nft.status,
                )
        out = []
        for match in matches:
            fact = match.fact
            if isinstance(fact, TransferFact) and fact.contract is not None:
                token = tokens.get(fact.contract)
                nft = (
                    items.get((fact.contract, fact.token_id)) if fact.token_id is not None else None
                )
                if token is not None:
                    match = msgspec.structs.replace(
                        match, fact=msgspec.structs.replace(fact, token=token)
                    )
                elif nft is not None:
                    match = msgspec.structs.replace(
                        match, fact=msgspec.structs.replace(fact, nft=nft)
                    )
            out.append(match)
        return out

    async def _tokens(self, contracts: list[str]) -> dict[str, Token]:
        """The facts of ``contracts``; those still being probed (a contract the indexer
        announced a moment ago) are asked again until ``TOKEN_WAIT`` has passed."""
        assert self._metadata is not None
        found: dict[str, Token] = {}
        wanted = contracts
        with trio.move_on_after(TOKEN_WAIT):
            while wanted:
                answer = await self._metadata.tokens(wanted, wait=TOKEN_WAIT)
                for contract, facts in answer.items():
                    found[contract.lower()] = Token(
                        symbol=facts.symbol, decimals=facts.decimals, name=facts.name
                    )
                wanted = [c for c, f in answer.items() if f.status == "pending"]
                if wanted:
                    await trio.sleep(0.05)
        return found

    # --- events ----------------------------------------------------------------------------

    def _event(self, match: Match, number: int, block_hash: str) -> NewEvent:
        hook = self._hooks[match.webhook_id]
        return NewEvent(
            id=event_id(hook.id, match.key),
            webhook_id=hook.id,
            event_type=hook.event_type,
            block_number=number,
            block_hash=block_hash,
            deliver_at_block=number + hook.confirmations if hook.confirmations else None,
            payload=match,
        )

    def _render(self, event: NewEvent, sequence: int, now: int) -> str:
        hook = self._hooks[event.webhook_id]
        return self._variant.render(
            event.payload,
            event_id=event.id,
            webhook_id=hook.id,
            event_type=hook.event_type,
            chain_label=hook.chain_label,
            chain_id=self._chain_id,
            sequence=sequence,
            created_at_ms=now,
        )
