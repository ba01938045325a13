"""``MetadataService``: token and NFT metadata, USD prices and logos of one EVM network.

One per EVM network, started in the gateway's nursery (``await nursery.start(service.run)``).
The REST endpoints ask it; the indexer tells it about new token contracts and ERC-4906 events.
Requests never wait longer than they say (``wait``), and the owned-NFT list never waits at
all: what is missing is fetched in the background and shows as ``pending`` until then.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Protocol

import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.config import ConfigError, MetadataSettings
from chaingate.config.manifest import Manifest
from chaingate.config.network import Network
from chaingate.evm.addresses import address_bytes, checksum_address
from chaingate.metadata import tokens as token_calls
from chaingate.metadata.amounts import format_units, usd_value
from chaingate.metadata.documents import DocumentSource
from chaingate.metadata.model import (
    STANDARDS,
    STATUSES,
    BalanceInfo,
    CollectionMetadata,
    NftMetadata,
    PriceQuote,
    RefreshResult,
    Standard,
    Status,
    TokenInfo,
    TokenMetadata,
)
from chaingate.metadata.multicall import CANONICAL_MULTICALL3, Multicall, detect_multicall
from chaingate.metadata.nftfetch import NftFetcher, decode_traits
from chaingate.metadata.prices import PriceBook
from chaingate.metadata.refresher import Key, Refresher
from chaingate.metadata.settings import check_settings, manifest_feeds, manifest_multicall
from chaingate.metadata.store import MetaRows, NftRow
from chaingate.metadata.tokencache import TokenCache, VerdictListener
from chaingate.metadata.tokenlist import TokenList
from chaingate.metadata.uris import UINT256_MAX, public_url, token_id_hex
from chaingate.outbound import Fetcher
from chaingate.rpc.errors import UpstreamError
from chaingate.store import Store, StoreError

log = logging.getLogger("chaingate.metadata")

# image_url / animation_url values longer than this (inline data: images) are not kept.
MAX_URL_CHARS = 100 * 1024
MAX_KEYS = 1000  # cached_nfts / tokens per call
STARTUP_TIMEOUT = 10.0
REFRESH_REQUESTS_PRUNE_SECONDS = 3600.0
CONTRACT_DOCUMENT = ""  # the token id column's value for a contract's own document
ALL_IDS = (token_id_hex(0), token_id_hex(UINT256_MAX))

NftKey = tuple[str, int]  # (contract, token id) as callers give them


class SeenContract(Protocol):
    """What the indexer reports of a new token contract (``chaingate.data`` ContractRow)."""

    @property
    def contract(self) -> str: ...
    @property
    def standard(self) -> str: ...


class SeenUpdate(Protocol):
    """An ERC-4906 / ERC-1155 ``URI`` event (``chaingate.data`` MetadataUpdate)."""

    @property
    def contract(self) -> str: ...
    @property
    def first_token(self) -> int: ...
    @property
    def last_token(self) -> int: ...


class SeenCommit(Protocol):
    """The indexer's ``IndexCommit``: what one commit saw."""

    @property
    def contracts(self) -> Sequence[SeenContract]: ...
    @property
    def metadata(self) -> Sequence[SeenUpdate]: ...


def _lower(address: str) -> str:
    """0x + 40 lowercase hex digits; ValueError for anything that is not an address."""
    return "0x" + address_bytes(address).hex()


def _status_of(row: NftRow) -> Status:
    return STATUSES.get(row.status, "failed")


class MetadataService:
    def __init__(
        self,
        chain: str,
        network: str,
        settings: MetadataSettings,
        client: ChainClient,
        store: Store,
        fetcher: Fetcher,
        *,
        chain_id: int | None = None,
        manifest: Manifest | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        try:
            check_settings(settings)
        except ValueError as exc:
            raise ConfigError(f"chains.{chain}.{network}: {exc}") from None
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))  # for logs
        self.settings = settings
        self.client = client
        self.store = MetaRows(store)
        self._clock = clock
        if chain_id is None and manifest is not None:
            chain_id = manifest.chain_id
        self.chain_id = chain_id
        # Configured, or the devnet's: used as is (a wrong one only costs a fallback to plain
        # eth_calls per batch).  Otherwise the canonical address, if it has code here.
        self._trusted_multicall = settings.multicall3 or manifest_multicall(manifest)
        self.multicall = Multicall(client, None)  # plain eth_calls until run() finds one
        feeds, native = manifest_feeds(manifest)
        feeds.update(settings.price_feeds)
        self.prices = PriceBook(
            self._current_multicall(),
            feeds,
            settings.native_price_feed or native,
            max_age=settings.max_feed_age,
            feed_max_age=settings.feed_max_age,
            ttl=settings.price_ttl,
            clock=clock,
        )
        self.image_gateway = settings.image_gateway or next(iter(settings.ipfs_gateways), "")
        self.documents = DocumentSource(
            fetcher,
            ipfs_gateways=settings.ipfs_gateways,
            arweave_gateway=settings.arweave_gateway,
            gateway_timeout=settings.gateway_timeout,
            fetch_timeout=settings.fetch_timeout,
            max_bytes=settings.max_document_bytes,
        )
        self.tokens_cache = TokenCache(
            self.store,
            chain,
            network,
            self._current_multicall,
            refresh_interval=settings.token_refresh_interval,
            supply_ttl=settings.supply_ttl,
            schedule=settings.retry_schedule,
            max_attempts=settings.max_attempts,
            clock=clock,
        )
        self.nft_fetcher = NftFetcher(
            self._current_multicall, self.tokens_cache, self.documents, max_url_chars=MAX_URL_CHARS
        )
        self.refresher = Refresher(
            self.store,
            chain,
            network,
            self.nft_fetcher.fetch,
            concurrency=settings.fetch_concurrency,
            schedule=settings.retry_schedule,
            max_attempts=settings.max_attempts,
            clock=clock,
        )
        self._fetcher = fetcher
        self.token_list: TokenList | None = None

    def _current_multicall(self) -> Multicall:
        return self.multicall

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # --- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the prober, the document workers and the token list; ready once they run
        (Multicall3 detection waits at most STARTUP_TIMEOUT).  Runs until cancelled."""
        detected = False
        if self._trusted_multicall is not None:
            self._use_multicall(self._trusted_multicall)
            detected = True
        else:
            with trio.move_on_after(STARTUP_TIMEOUT):
                detected = await self._detect_multicall()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.tokens_cache.run)
            await nursery.start(self.refresher.run)
            if not detected:  # the node did not answer: ask again (an answer "none" is final)
                nursery.start_soon(self._keep_detecting)
            if self.settings.token_list:
                nursery.start_soon(self._run_token_list)
            nursery.start_soon(self._forget_old_refresh_requests)
            task_status.started()

    def _use_multicall(self, address: str | None) -> None:
        self.multicall = Multicall(self.client, address)
        self.prices.multicall = self.multicall

    async def _detect_multicall(self) -> bool:
        """Is the canonical Multicall3 deployed here?  False when the node did not say."""
        try:
            found = await detect_multicall(self.client, [CANONICAL_MULTICALL3])
        except (UpstreamError, RpcCallError) as exc:
            log.warning(
                "multicall3 not detected yet: plain eth_calls",
                extra={"fields": {"network": self.label, "error": str(exc)}},
            )
            return False
        self._use_multicall(found)
        return True

    async def _keep_detecting(self) -> None:
        # The node was unreachable at start-up: ask again until it answers.
        while True:
            if await self._detect_multicall():
                return
            await trio.sleep(60)

    async def _run_token_list(self) -> None:
        while self.chain_id is None:
            try:
                self.chain_id = int(await self.client.call("eth_chainId"), 16)
            except (UpstreamError, RpcCallError, ValueError, TypeError):
                await trio.sleep(30)
        self.token_list = TokenList(
            self.settings.token_list,
            self.chain_id,
            self._fetcher,
            refresh=self.settings.token_list_refresh,
            timeout=self.settings.fetch_timeout,
        )
        await self.token_list.run()

    # --- tokens ----------------------------------------------------------------------------

    async def tokens(
        self, contracts: Sequence[str], *, wait: float = 5.0
    ) -> dict[str, TokenMetadata]:
        """Facts per contract (keys EIP-55), from cache; unknown ones probed together, waited
        for at most ``wait`` seconds (then ``pending``).  ValueError for a non-address."""
        if len(contracts) > MAX_KEYS:
            raise ValueError(f"at most {MAX_KEYS} contracts per call")
        found = await self.tokens_cache.get([_lower(c) for c in contracts], wait)
        return {meta.contract: meta for meta in found.values()}

    async def token(self, contract: str, *, wait: float = 5.0) -> TokenMetadata:
        return (await self.tokens_cache.get([_lower(contract)], wait))[_lower(contract)]

    async def token_info(self, contract: str, *, wait: float = 5.0) -> TokenInfo:
        """The token metadata endpoint's fields: live supply, price, market cap, logo."""
        meta = await self.token(contract, wait=wait)
        supply: int | None = None
        price: Decimal | None = None
        if meta.is_token:
            supply = (await self.tokens_cache.supplies([meta.contract]))[_lower(contract)]
            if supply is None:
                supply = meta.total_supply  # the probe's reading, if the live one failed
        if meta.standard == "ERC20" and meta.decimals is not None:
            price = await self.price_usd(meta.contract)
        shown_decimals = meta.decimals if meta.decimals is not None else 0
        return TokenInfo(
            metadata=meta,
            total_supply=None if supply is None else str(supply),
            formatted_total_supply=None if supply is None else format_units(supply, shown_decimals),
            price_usd=None if price is None else usd_value(1, 0, price),
            market_cap_usd=(
                usd_value(supply, meta.decimals, price)
                if supply is not None and price is not None and meta.decimals is not None
                else None
            ),
            logo_url=self.logo_url(meta.contract),
        )

    async def describe_balances(
        self, balances: Mapping[str, int], *, wait: float = 2.0
    ) -> dict[str, BalanceInfo]:
        """Metadata, formatted amounts, USD values and logos for raw balances (keys EIP-55).

        Contracts known *not* to be ERC-20 (an NFT, or no token at all) are left out; ones
        still being probed are kept with what is known (raw units until decimals are).
        ``usd_value`` needs a price feed and known decimals, else it is None.
        """
        metas = await self.tokens(list(balances), wait=wait)
        raw = {checksum_address(c): amount for c, amount in balances.items()}
        priced = [c for c, m in metas.items() if m.standard == "ERC20" and m.decimals is not None]
        quotes = await self.prices.quotes(priced) if priced else {}
        out: dict[str, BalanceInfo] = {}
        for contract, meta in metas.items():
            if meta.known_not_erc20:
                continue
            amount = raw[contract]
            quote = quotes.get(contract)
            price = quote.price if quote is not None else None
            out[contract] = BalanceInfo(
                contract=contract,
                symbol=meta.symbol,
                name=meta.name,
                decimals=meta.decimals,
                balance=str(amount),
                formatted_balance=format_units(amount, meta.decimals or 0),
                usd_value=(
                    usd_value(amount, meta.decimals, price)
                    if price is not None and meta.decimals is not None
                    else None
                ),
                logo_url=self.logo_url(contract),
            )
        return out

    async def token_balances(self, owner: str, contracts: Sequence[str]) -> dict[str, int | None]:
        """On-chain ``balanceOf(owner)`` per contract (keys EIP-55), in one batch; None where
        the call reverts or answers nonsense.  Raises UpstreamError when the node is down."""
        checksummed = [checksum_address(c) for c in contracts]
        results = await self.multicall.run(token_calls.balance_calls(owner, checksummed))
        return {c: token_calls.decode_balance(r) for c, r in zip(checksummed, results, strict=True)}

    # --- prices and logos ------------------------------------------------------------------

    async def quotes(self, contracts: Sequence[str | None]) -> dict[str | None, PriceQuote]:
        """Feed readings (None: the native currency), one batch; keys as given."""
        return await self.prices.quotes(contracts)

    async def price_usd(self, contract: str | None) -> Decimal | None:
        """USD per whole token (None: native currency); None when no fresh feed says."""
        return (await self.prices.quotes([contract]))[contract].price

    def logo_url(self, contract: str) -> str | None:
        if self.token_list is None:
            return None
        logo = self.token_list.logo(contract)
        return public_url(
            logo,
            ipfs_gateway=self.image_gateway,
            arweave_gateway=self.settings.arweave_gateway,
            max_chars=MAX_URL_CHARS,
        )

    # --- NFTs ------------------------------------------------------------------------------

    def _gateway(self, url: str | None) -> str | None:
        return public_url(
            url,
            ipfs_gateway=self.image_gateway,
            arweave_gateway=self.settings.arweave_gateway,
            max_chars=MAX_URL_CHARS,
        )

    def _nft_metadata(self, contract: str, token_id: int, row: NftRow | None) -> NftMetadata:
        if row is None:
            return NftMetadata(contract=checksum_address(contract), token_id=token_id)
        return NftMetadata(
            contract=checksum_address(contract),
            token_id=token_id,
            standard=next((s for s in STANDARDS if s == row.standard), None),
            token_uri=row.token_uri,
            name=row.name,
            description=row.description,
            image_url=row.image_url,
            image_gateway_url=self._gateway(row.image_url),
            animation_url=row.animation_url,
            external_url=row.external_url,
            traits=decode_traits(row.traits),
            status=_status_of(row),
            last_error=row.last_error,
            attempts=row.attempts,
            fetched_at=row.fetched_at,
            next_retry_at=row.next_retry_at,
        )

    def _idle_ms(self) -> int:
        return round(self.settings.retry_schedule[-1] * 1000)

    def _wakeable(self, row: NftRow, now: int) -> bool:
        """Automatic attempts spent: the row is fetched again when asked for, at most once
        per longest retry delay."""
        return (
            row.next_retry_at is None
            and row.status != "ok"
            and row.updated_at + self._idle_ms() <= now
        )

    async def _schedule(
        self, keys: Sequence[Key], rows: Mapping[Key, NftRow], priority: int
    ) -> bool:
        """Rows for keys that have none, due now; failed rows that may be tried again, woken.
        True when anything became due."""
        now = self.now_ms()
        missing = [k for k in keys if k not in rows]
        wake = [k for k in keys if k in rows and self._wakeable(rows[k], now)]
        if missing:
            await self.store.ensure_nft_rows(self.chain, self.network, missing, now, priority)
        if wake:
            await self.store.wake_nft_rows(
                self.chain, self.network, wake, now, now - self._idle_ms() + 1, priority
            )
        if missing or wake:
            self.refresher.poke()
            return True
        return False

    def _worth_waiting(self, row: NftRow | None, queued: bool) -> bool:
        """A fetch is queued, running, or due now (then the queue is nudged)."""
        if queued or row is None or row.status == "pending":
            return True
        due = row.next_retry_at is not None and row.next_retry_at <= self.now_ms()
        if due:
            self.refresher.poke()
        return due and row.status == "failed"

    async def _document_row(self, key: Key, wait: float) -> NftRow | None:
        """The stored row of a document; queued first in line when missing (or failed and
        retriable now) and waited for at most ``wait`` seconds."""
        events = self.refresher.watch([key]) if wait > 0 else []
        rows = await self.store.load_nft_rows(self.chain, self.network, [key])
        queued = await self._schedule([key], rows, priority=1)
        row = rows.get(key)
        if wait > 0 and self._worth_waiting(row, queued):
            await self.refresher.wait(events, wait)
            row = (await self.store.load_nft_rows(self.chain, self.network, [key])).get(key)
        return row

    async def nft(self, contract: str, token_id: int, *, wait: float = 0.0) -> NftMetadata:
        """One token's metadata from the cache.  Missing (or failed and retriable now): queued
        first in line, and waited for at most ``wait`` seconds; then whatever is known."""
        if not 0 <= token_id <= UINT256_MAX:
            raise ValueError("token id out of uint256 range")
        key = (_lower(contract), token_id_hex(token_id))
        return self._nft_metadata(key[0], token_id, await self._document_row(key, wait))

    async def cached_nfts(self, keys: Sequence[NftKey]) -> dict[NftKey, NftMetadata]:
        """Metadata for many tokens from the cache only — never a fetch on the caller's time.
        Misses are queued for the background (``pending`` meanwhile).  Keys as given."""
        if len(keys) > MAX_KEYS:
            raise ValueError(f"at most {MAX_KEYS} tokens per call")
        stored_keys = {k: (_lower(k[0]), token_id_hex(k[1])) for k in keys}
        rows = await self.store.load_nft_rows(
            self.chain, self.network, list(set(stored_keys.values()))
        )
        try:
            await self._schedule(list(set(stored_keys.values())), rows, priority=0)
        except StoreError as exc:  # the answer from the cache still stands
            log.warning("metadata not queued", extra={"fields": {"error": str(exc)}})
        return {
            k: self._nft_metadata(stored[0], k[1], rows.get(stored))
            for k, stored in stored_keys.items()
        }

    async def collection(self, contract: str, *, wait: float = 2.0) -> CollectionMetadata:
        """On-chain name/symbol/standard and the ERC-7572 contractURI document (fetched on
        first ask, waited for at most ``wait`` seconds)."""
        key = (_lower(contract), CONTRACT_DOCUMENT)
        deadline = trio.current_time() + wait
        await self.token(contract, wait=wait)
        row = await self._document_row(key, max(0.0, deadline - trio.current_time()))
        meta = await self.token(contract, wait=0)
        if row is None:
            return CollectionMetadata(
                contract=meta.contract, standard=meta.standard, name=meta.name, symbol=meta.symbol
            )
        return CollectionMetadata(
            contract=meta.contract,
            standard=meta.standard,
            name=meta.name or row.name,
            symbol=meta.symbol,
            contract_uri=row.token_uri,
            description=row.description,
            image_url=row.image_url,
            image_gateway_url=self._gateway(row.image_url),
            banner_url=row.banner_url,
            banner_gateway_url=self._gateway(row.banner_url),
            external_url=row.external_url,
            status=_status_of(row),
            last_error=row.last_error,
            next_retry_at=row.next_retry_at,
        )

    def stats(self) -> dict[str, int]:
        """Counters for metrics: documents fetched and failed, probe batches sent."""
        return {
            "documents_fetched": self.refresher.fetched,
            "documents_failed": self.refresher.failures,
            "token_probes": self.tokens_cache.probes,
            "documents_in_flight": self.refresher.in_flight,
        }

    # --- refresh and the indexer's hooks ---------------------------------------------------

    async def request_refresh(
        self, contract: str, token_id: int | None, account: str = ""
    ) -> RefreshResult:
        """``POST …/refresh``: one token's document, or (``token_id`` None) the whole contract —
        its on-chain facts, its contractURI document and every token document stored for it.
        Each account may have one accepted per cool-down (per token ``refresh_cooldown``, per
        contract ``contract_refresh_cooldown``), refused with the seconds left; the document's
        origin still sees at most one refresh per cool-down, so one accepted while another
        account's is recent is fetched where that one's cool-down ends."""
        lower = _lower(contract)
        now = self.now_ms()
        if token_id is not None:
            if not 0 <= token_id <= UINT256_MAX:
                raise ValueError("token id out of uint256 range")
            key = (lower, token_id_hex(token_id))
            cooldown = self.settings.refresh_cooldown
        else:
            key = (lower, CONTRACT_DOCUMENT)
            cooldown = self.settings.contract_refresh_cooldown
        grant = await self.store.request_nft_refresh(
            self.chain, self.network, key, now, round(cooldown * 1000), account
        )
        if grant.left_ms:
            retry_after = max(1, math.ceil(grant.left_ms / 1000))
            return RefreshResult(status="cooldown", retry_after=retry_after)
        if token_id is None:
            await self.store.mark_nfts_due(
                self.chain, self.network, lower, *ALL_IDS, now, at=grant.due_at
            )
            self.tokens_cache.refresh_soon(lower)
        self.refresher.poke()
        return RefreshResult(status="accepted", due_at_ms=grant.due_at)

    async def _forget_old_refresh_requests(self) -> None:
        # Who asked when matters only within the cool-down: the rest is pruned hourly.
        longest = max(self.settings.refresh_cooldown, self.settings.contract_refresh_cooldown)
        while True:
            before = self.now_ms() - round(longest * 1000)
            try:
                await self.store.prune_nft_refresh_requests(self.chain, self.network, before)
            except StoreError as exc:
                log.warning(
                    "metadata refresh requests not pruned",
                    extra={"fields": {"network": self.label, "error": str(exc)}},
                )
            await trio.sleep(REFRESH_REQUESTS_PRUNE_SECONDS)

    def add_verdict_listener(self, listener: VerdictListener) -> None:
        """Called with every probe's verdicts (lowercase contract -> shown in balance lists),
        before anyone can read them here: the index leaves what is no ERC-20 out of its
        balance lists in the query itself."""
        self.tokens_cache.verdict_listeners.append(listener)

    async def on_new_contracts(self, contracts: Sequence[tuple[str, str | None]]) -> None:
        hints: list[tuple[str, str | None]] = []
        for contract, hint in contracts:
            standard: Standard | None = next((s for s in STANDARDS if s == hint), None)
            hints.append((_lower(contract), standard))
        await self.tokens_cache.note(hints)

    async def on_index_commit(self, commit: SeenCommit) -> None:
        """The indexer's listener (``indexer.add_listener(service.on_index_commit)``): new token
        contracts are probed, ERC-4906 / ERC-1155 URI events refresh the documents they name."""
        if commit.contracts:
            await self.on_new_contracts([(c.contract, c.standard) for c in commit.contracts])
        for update in commit.metadata:
            await self.on_metadata_update(update.contract, update.first_token, update.last_token)

    async def on_metadata_update(
        self, contract: str, first_token_id: int, last_token_id: int | None = None
    ) -> int:
        """ERC-4906 ``MetadataUpdate(id)`` (``last`` None) or ``BatchMetadataUpdate(from, to)``
        (inclusive): the stored documents in range are fetched again (served as ``stale``
        meanwhile).  Returns how many were.  Tokens not stored yet need nothing: they are
        fetched when first asked for."""
        last = first_token_id if last_token_id is None else last_token_id
        low, high = sorted((first_token_id, last))
        low, high = max(low, 0), min(high, UINT256_MAX)
        if low > high:
            return 0
        count = await self.store.mark_nfts_due(
            self.chain,
            self.network,
            _lower(contract),
            token_id_hex(low),
            token_id_hex(high),
            self.now_ms(),
        )
        if count:
            self.refresher.poke()
        return count
