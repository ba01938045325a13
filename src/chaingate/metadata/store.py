"""The metadata service's rows: on-chain token facts and fetched NFT/contract documents.

Keys are lowercase: ``contract`` is 0x + 40 hex digits, ``token_id`` 64 hex digits ('' for a
contract's own document), so ERC-4906 ranges are text ranges.  A row is *due* when its
``next_retry_at`` has passed; claiming due NFT rows moves ``next_retry_at`` to a lease in the
same transaction, so two processes never fetch the same document at once and a process that
dies mid-fetch only delays it by the lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from chaingate.store.base import register_network_table
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

# Bound on the parameters of one IN (...) list.
_CHUNK = 400


class TokenRow(msgspec.Struct, kw_only=True):
    contract: str
    standard: str | None = None
    standard_hint: str | None = None
    name: str | None = None
    symbol: str | None = None
    decimals: int | None = None
    total_supply: str | None = None
    status: str = "pending"
    last_error: str | None = None
    attempts: int = 0
    fetched_at: int | None = None
    next_retry_at: int | None = None
    updated_at: int = 0


class NftRow(msgspec.Struct, kw_only=True):
    contract: str
    token_id: str
    standard: str | None = None
    token_uri: str | None = None
    name: str | None = None
    description: str | None = None
    image_url: str | None = None
    animation_url: str | None = None
    external_url: str | None = None
    banner_url: str | None = None
    traits: str | None = None
    status: str = "pending"
    last_error: str | None = None
    attempts: int = 0
    fetched_at: int | None = None
    next_retry_at: int | None = None
    priority: int = 0
    refresh_requested_at: int | None = None
    updated_at: int = 0


class RefreshGrant(msgspec.Struct, frozen=True, kw_only=True):
    """A refresh request's outcome: refused for ``left_ms`` more (the account's cool-down),
    or accepted (``left_ms`` 0) with the document due at ``due_at`` (epoch ms)."""

    left_ms: int = 0
    due_at: int = 0


_TOKEN_COLUMNS = tuple(TokenRow.__struct_fields__)
_NFT_COLUMNS = tuple(NftRow.__struct_fields__)
_TOKEN_SELECT = f"SELECT {', '.join(_TOKEN_COLUMNS)} FROM token_metadata"  # noqa: S608
_NFT_SELECT = f"SELECT {', '.join(_NFT_COLUMNS)} FROM nft_metadata"  # noqa: S608
_TOKEN_UPSERT = (
    f"INSERT INTO token_metadata (chain, network, {', '.join(_TOKEN_COLUMNS)})"  # noqa: S608
    f" VALUES (?, ?, {', '.join('?' * len(_TOKEN_COLUMNS))})"
    " ON CONFLICT (chain, network, contract) DO UPDATE SET "
    + ", ".join(
        f"{c} = excluded.{c}"
        if c != "standard_hint"
        else "standard_hint = COALESCE(excluded.standard_hint, token_metadata.standard_hint)"
        for c in _TOKEN_COLUMNS
        if c != "contract"
    )
)
_NFT_INSERT = (
    f"INSERT INTO nft_metadata (chain, network, {', '.join(_NFT_COLUMNS)})"  # noqa: S608
    f" VALUES (?, ?, {', '.join('?' * len(_NFT_COLUMNS))})"
    " ON CONFLICT (chain, network, contract, token_id) DO NOTHING"
)
_NFT_UPDATE = (
    "UPDATE nft_metadata SET "  # noqa: S608 - constants only
    + ", ".join(f"{c} = ?" for c in _NFT_COLUMNS if c not in ("contract", "token_id"))
    + " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _token(row: Sequence[Any]) -> TokenRow:
    return TokenRow(**dict(zip(_TOKEN_COLUMNS, row, strict=True)))


def _nft(row: Sequence[Any]) -> NftRow:
    return NftRow(**dict(zip(_NFT_COLUMNS, row, strict=True)))


def _nft_values(row: NftRow) -> list[Any]:
    return [getattr(row, c) for c in _NFT_COLUMNS if c not in ("contract", "token_id")]


class MetaRows(Rows):
    """Token and NFT metadata rows over the store engine."""

    # --- token facts -----------------------------------------------------------------------

    async def load_token_rows(
        self, chain: str, network: str, contracts: Sequence[str]
    ) -> dict[str, TokenRow]:
        wanted = sorted(set(contracts))

        def select(tx: Tx) -> dict[str, TokenRow]:
            found: dict[str, TokenRow] = {}
            for start in range(0, len(wanted), _CHUNK):
                chunk = wanted[start : start + _CHUNK]
                rows = tx.query(
                    f"{_TOKEN_SELECT} WHERE chain = ? AND network = ?"
                    f" AND contract IN ({_marks(len(chunk))})",
                    (chain, network, *chunk),
                )
                found.update((row[0], _token(row)) for row in rows)
            return found

        result: dict[str, TokenRow] = await self.run_transaction(select, write=False)
        return result

    async def save_token_rows(self, chain: str, network: str, rows: Sequence[TokenRow]) -> None:
        """Insert or replace (a known standard_hint is kept when the row brings none)."""
        values = [
            (chain, network, *(getattr(r, c) for c in _TOKEN_COLUMNS))
            for r in sorted(rows, key=lambda r: r.contract)
        ]
        if not values:
            return

        def upsert(tx: Tx) -> None:
            tx.executemany(_TOKEN_UPSERT, values)

        await self.run_transaction(upsert)

    async def note_token_contracts(
        self, chain: str, network: str, hints: Sequence[tuple[str, str | None]], now: int
    ) -> list[str]:
        """Record contracts the indexer saw (with its standard hint).  New ones, and known ones
        whose hint changed, become due for a probe now; returns those contracts."""
        given = dict(sorted(hints))

        def note(tx: Tx) -> list[str]:
            due: list[str] = []
            keys = list(given)
            known: dict[str, str | None] = {}
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start : start + _CHUNK]
                rows = tx.query(
                    "SELECT contract, standard_hint FROM token_metadata"  # noqa: S608
                    f" WHERE chain = ? AND network = ? AND contract IN ({_marks(len(chunk))})",
                    (chain, network, *chunk),
                )
                known.update((c, h) for c, h in rows)
            for contract, hint in given.items():
                if contract not in known:
                    tx.execute(
                        "INSERT INTO token_metadata (chain, network, contract, standard_hint,"
                        " status, attempts, next_retry_at, updated_at)"
                        " VALUES (?, ?, ?, ?, 'pending', 0, ?, ?)",
                        (chain, network, contract, hint, now, now),
                    )
                    due.append(contract)
                elif hint is not None and hint != known[contract]:
                    tx.execute(
                        "UPDATE token_metadata SET standard_hint = ?, next_retry_at = ?,"
                        " updated_at = ? WHERE chain = ? AND network = ? AND contract = ?",
                        (hint, now, now, chain, network, contract),
                    )
                    due.append(contract)
            return due

        result: list[str] = await self.run_transaction(note)
        return result

    async def due_token_contracts(
        self, chain: str, network: str, now: int, limit: int
    ) -> list[str]:
        def select(tx: Tx) -> list[str]:
            rows = tx.query(
                "SELECT contract FROM token_metadata WHERE chain = ? AND network = ?"
                " AND next_retry_at IS NOT NULL AND next_retry_at <= ?"
                " ORDER BY next_retry_at LIMIT ?",
                (chain, network, now, limit),
            )
            return [row[0] for row in rows]

        result: list[str] = await self.run_transaction(select, write=False)
        return result

    # --- NFT and contract documents ----------------------------------------------------------

    async def load_nft_rows(
        self, chain: str, network: str, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], NftRow]:
        wanted = set(keys)
        contracts = sorted({c for c, _ in wanted})

        def select(tx: Tx) -> dict[tuple[str, str], NftRow]:
            found: dict[tuple[str, str], NftRow] = {}
            for contract in contracts:
                ids = sorted(t for c, t in wanted if c == contract)
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start : start + _CHUNK]
                    rows = tx.query(
                        f"{_NFT_SELECT} WHERE chain = ? AND network = ? AND contract = ?"
                        f" AND token_id IN ({_marks(len(chunk))})",
                        (chain, network, contract, *chunk),
                    )
                    for row in rows:
                        nft = _nft(row)
                        found[(nft.contract, nft.token_id)] = nft
            return found

        result: dict[tuple[str, str], NftRow] = await self.run_transaction(select, write=False)
        return result

    async def ensure_nft_rows(
        self, chain: str, network: str, keys: Sequence[tuple[str, str]], now: int, priority: int
    ) -> None:
        """Pending rows, due now, for the keys that have none (existing rows are untouched)."""
        values = [
            (
                chain,
                network,
                *_nft_values_full(
                    NftRow(
                        contract=c,
                        token_id=t,
                        next_retry_at=now,
                        priority=priority,
                        updated_at=now,
                    )
                ),
            )
            for c, t in sorted(set(keys))
        ]
        if not values:
            return

        def insert(tx: Tx) -> None:
            tx.executemany(_NFT_INSERT, values)

        await self.run_transaction(insert)

    async def wake_nft_rows(
        self,
        chain: str,
        network: str,
        keys: Sequence[tuple[str, str]],
        now: int,
        idle_before: int,
        priority: int,
    ) -> int:
        """Rows with no fetch scheduled that failed (or were left pending) and were last
        touched before ``idle_before`` become due now: a failure is retried when asked for."""
        rows = [
            (now, priority, now, chain, network, c, t, idle_before) for c, t in sorted(set(keys))
        ]

        def wake(tx: Tx) -> int:
            changed = 0
            for row in rows:
                changed += tx.execute(
                    "UPDATE nft_metadata SET next_retry_at = ?, priority = ?, attempts = 0,"
                    " updated_at = ? WHERE chain = ? AND network = ? AND contract = ?"
                    " AND token_id = ? AND next_retry_at IS NULL"
                    " AND status IN ('failed', 'pending', 'stale') AND updated_at < ?",
                    row,
                )
            return changed

        result: int = await self.run_transaction(wake)
        return result

    async def claim_nft_rows(
        self,
        chain: str,
        network: str,
        now: int,
        lease_until: int,
        limit: int,
        busy: frozenset[tuple[str, str]] = frozenset(),
    ) -> list[NftRow]:
        """Up to ``limit`` due rows (clients' first, then oldest due), leased until
        ``lease_until``: nobody else claims them before then.  ``busy``: keys the caller is
        fetching already (made due again meanwhile), left for later."""

        def claim(tx: Tx) -> list[NftRow]:
            rows = tx.query(
                f"{_NFT_SELECT} WHERE chain = ? AND network = ?"
                " AND next_retry_at IS NOT NULL AND next_retry_at <= ?"
                " ORDER BY priority DESC, next_retry_at, contract, token_id LIMIT ?",
                (chain, network, now, limit + len(busy)),
            )
            claimed: list[NftRow] = []
            for row in rows:
                nft = _nft(row)
                if (nft.contract, nft.token_id) in busy or len(claimed) == limit:
                    continue
                taken = tx.execute(
                    "UPDATE nft_metadata SET next_retry_at = ?"
                    " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?"
                    " AND next_retry_at = ?",
                    (lease_until, chain, network, nft.contract, nft.token_id, nft.next_retry_at),
                )
                if taken:
                    claimed.append(nft)
            return claimed

        result: list[NftRow] = await self.run_transaction(claim)
        return result

    async def save_nft_row(self, chain: str, network: str, row: NftRow, version: int) -> None:
        """Write a fetch's outcome over the row claimed when its ``updated_at`` was
        ``version``.  A refresh or an ERC-4906 event that touched the row since then wins:
        the outcome is kept (as ``stale`` if it succeeded) and the row stays due."""

        def save(tx: Tx) -> None:
            rows = tx.query(
                "SELECT updated_at, next_retry_at, priority, refresh_requested_at"
                " FROM nft_metadata"
                " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                (chain, network, row.contract, row.token_id),
            )
            if not rows:
                tx.execute(_NFT_INSERT, (chain, network, *_nft_values_full(row)))
                return
            updated_at, next_retry_at, priority, requested = rows[0]
            outcome = msgspec.structs.replace(row, refresh_requested_at=requested)
            if updated_at != version:
                outcome = msgspec.structs.replace(
                    outcome,
                    next_retry_at=next_retry_at,
                    priority=priority,
                    attempts=0,
                    status="stale" if row.status == "ok" else row.status,
                )
            tx.execute(
                _NFT_UPDATE, (*_nft_values(outcome), chain, network, row.contract, row.token_id)
            )

        await self.run_transaction(save)

    async def request_nft_refresh(
        self,
        chain: str,
        network: str,
        key: tuple[str, str],
        now: int,
        cooldown_ms: int,
        account: str = "",
    ) -> RefreshGrant:
        """``account`` asks for the document to be fetched again.  Refused (``left_ms``) when
        the account had one accepted within the cool-down: each account has its own
        allowance.  Accepted otherwise, and the fetch is due at ``due_at``: now, unless a
        refresh of the document was accepted (for anyone) within the cool-down — then the
        one already due is joined, or a fetch is scheduled where the cool-down ends, so the
        document's origin sees at most one refresh per cool-down however many accounts ask."""
        contract, token_id = key
        document = (chain, network, contract, token_id)
        fresh = (
            chain,
            network,
            *_nft_values_full(
                NftRow(
                    contract=contract,
                    token_id=token_id,
                    next_retry_at=now,
                    priority=1,
                    refresh_requested_at=now,
                    updated_at=now,
                )
            ),
        )

        def request(tx: Tx) -> RefreshGrant:
            tx.execute(  # the document's requests past their cool-down mean nothing
                "DELETE FROM nft_refresh_requests WHERE chain = ? AND network = ?"
                " AND contract = ? AND token_id = ? AND requested_at <= ?",
                (*document, now - cooldown_ms),
            )
            # A row left is the account's refresh within the cool-down.  One statement takes
            # the allowance: of two requests at once, the second finds the first's row.
            taken = tx.execute(
                "INSERT INTO nft_refresh_requests"
                " (chain, network, contract, token_id, account_id, requested_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (chain, network, contract, token_id,"
                " account_id) DO NOTHING",
                (*document, account, now),
            )
            if not taken:
                (mine,) = tx.query(
                    "SELECT requested_at FROM nft_refresh_requests WHERE chain = ?"
                    " AND network = ? AND contract = ? AND token_id = ? AND account_id = ?",
                    (*document, account),
                )
                return RefreshGrant(left_ms=max(1, int(mine[0] + cooldown_ms - now)))
            rows = tx.query(
                "SELECT refresh_requested_at, next_retry_at FROM nft_metadata"
                " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                document,
            )
            if not rows:
                tx.execute(_NFT_INSERT, fresh)
                return RefreshGrant(due_at=now)
            last, next_at = rows[0]
            if last is None or now >= last + cooldown_ms:
                tx.execute(
                    "UPDATE nft_metadata SET refresh_requested_at = ?, next_retry_at = ?,"
                    " priority = 1, attempts = 0, updated_at = ?,"
                    " status = CASE WHEN status = 'ok' THEN 'stale' ELSE status END"
                    " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                    (now, now, now, *document),
                )
                return RefreshGrant(due_at=now)
            if last > now:  # a fetch is scheduled already: join it
                return RefreshGrant(due_at=last)
            if next_at is not None and next_at <= now:  # due, not started: it will be fresh
                tx.execute(
                    "UPDATE nft_metadata SET priority = 1"
                    " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                    document,
                )
                return RefreshGrant(due_at=now)
            # Fetched (or being fetched) since that refresh: once more where its cool-down
            # ends.  A fetch under way keeps this schedule (save_nft_row sees updated_at).
            at = last + cooldown_ms
            tx.execute(
                "UPDATE nft_metadata SET refresh_requested_at = ?, next_retry_at = ?,"
                " priority = 1, attempts = 0, updated_at = ?"
                " WHERE chain = ? AND network = ? AND contract = ? AND token_id = ?",
                (at, at, now, *document),
            )
            return RefreshGrant(due_at=at)

        result: RefreshGrant = await self.run_transaction(request)
        return result

    async def prune_nft_refresh_requests(self, chain: str, network: str, before: int) -> int:
        """Forget refreshes accepted before ``before`` (past every cool-down)."""

        def prune(tx: Tx) -> int:
            return int(
                tx.execute(
                    "DELETE FROM nft_refresh_requests"
                    " WHERE chain = ? AND network = ? AND requested_at < ?",
                    (chain, network, before),
                )
            )

        count: int = await self.run_transaction(prune)
        return count

    async def mark_nfts_due(
        self,
        chain: str,
        network: str,
        contract: str,
        first: str,
        last: str,
        now: int,
        at: int | None = None,
    ) -> int:
        """Token documents of ``contract`` with ids in [first, last] (hex) are due now (or at
        ``at``, if sooner than already), their data kept as ``stale`` (ERC-4906 events,
        contract refreshes).  Returns the count."""
        at = now if at is None else at

        def mark(tx: Tx) -> int:
            changed: int = tx.execute(
                "UPDATE nft_metadata SET attempts = 0, updated_at = ?,"
                " next_retry_at = CASE WHEN next_retry_at IS NULL OR next_retry_at > ?"
                " THEN ? ELSE next_retry_at END,"
                " status = CASE WHEN status = 'ok' THEN 'stale' ELSE status END"
                " WHERE chain = ? AND network = ? AND contract = ?"
                " AND token_id >= ? AND token_id <= ? AND token_id <> ''",
                (now, at, at, chain, network, contract, first, last),
            )
            return changed

        result: int = await self.run_transaction(mark)
        return result


def _nft_values_full(row: NftRow) -> list[Any]:
    return [getattr(row, c) for c in _NFT_COLUMNS]


# Rows derived from one chain/network (Store.reset_network clears them on a new chain).
META_TABLES = ("token_metadata", "nft_metadata", "nft_refresh_requests")


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*META_TABLES)
