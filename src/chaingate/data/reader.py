"""The index's read model: what the token, NFT and transfer endpoints answer from.

    reader = IndexReader(store, "ethereum", "mainnet")   # or Indexer.reader
    page = await reader.balances("0xabc...", offset=0, limit=50)

Every answer carries ``at``, the block the index was at when it was read (None before the
first block is indexed), read in the same snapshot as the data.  Addresses are answered in
lowercase 0x-hex and accepted in any case; amounts are Python ints (raw units, exact);
token ids are ints.  Only positive balances and quantities are listed: a negative one means a
contract that broke its own bookkeeping or history indexed from after its first mint.
Pagination: ``offset``/``limit`` with ``total`` for lists a client pages through (balances,
owned NFTs, holders), a cursor for transfers (newest first; a cursor stays valid as blocks are
added, since it names a position in the chain, not an offset).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from chaingate.data.ledger import ContractRow
from chaingate.data.store import Direction, IndexCursor, IndexRows, TransferRow
from chaingate.data.transfers import Standard
from chaingate.store import Store


class InvalidCursor(ValueError):
    """A pagination cursor this reader did not hand out."""


class IndexPosition(msgspec.Struct, frozen=True):
    block_number: int
    block_hash: str


class TokenBalance(msgspec.Struct, frozen=True):
    contract: str
    balance: int  # raw units


class TokenBalances(msgspec.Struct, frozen=True):
    address: str
    at: IndexPosition | None
    total: int
    offset: int
    limit: int
    items: list[TokenBalance]  # by contract address


class OwnedNft(msgspec.Struct, frozen=True):
    contract: str
    token_id: int
    standard: Literal["ERC721", "ERC1155"]
    quantity: int  # 1 for ERC-721


class OwnedNfts(msgspec.Struct, frozen=True):
    address: str
    at: IndexPosition | None
    total: int
    offset: int
    limit: int
    items: list[OwnedNft]  # by (contract, token id)


class TokenContract(msgspec.Struct, frozen=True):
    """A contract that emitted token transfers, with what the index counts about it."""

    contract: str
    standard: Standard  # of its first transfer
    standards: list[Standard]  # every standard its transfers had (a hybrid has several)
    first_block: int
    transfers: int
    erc20_holders: int  # addresses with a positive ERC-20 balance
    erc20_supply: int  # minted minus burned, as seen from transfers
    nft_supply: int  # token ids in existence (positive supply)
    nft_owners: int  # distinct addresses holding at least one token


class NftCollection(msgspec.Struct, frozen=True):
    contract: str
    standard: Literal["ERC721", "ERC1155"]  # as observed
    total_supply: int  # token ids in existence
    num_owners: int
    at: IndexPosition | None


class NftHolder(msgspec.Struct, frozen=True):
    address: str
    quantity: int


class NftToken(msgspec.Struct, frozen=True):
    contract: str
    token_id: int
    standard: Literal["ERC721", "ERC1155"]
    supply: int  # minted minus burned (1 for a live ERC-721, 0 once burned)
    owner: str | None  # ERC-721: the owner; ERC-1155: None
    holders_total: int  # addresses with a positive quantity
    holders: list[NftHolder]  # the requested page of them, by address
    at: IndexPosition | None


class TransferItem(msgspec.Struct, frozen=True):
    block_number: int
    block_hash: str
    block_time: int  # Unix seconds
    tx_hash: str
    tx_index: int
    log_index: int | None  # None for a native transfer
    standard: Standard
    contract: str | None  # None for a native transfer
    sender: str  # 0x0…0 for a mint
    receiver: str  # 0x0…0 for a burn
    token_id: int | None
    amount: int  # raw units; 1 for ERC-721
    direction: Literal["in", "out", "self"]  # as seen from the address asked about


class TransferPage(msgspec.Struct, frozen=True):
    address: str
    at: IndexPosition | None
    items: list[TransferItem]  # newest first
    next_cursor: str | None  # None: nothing older


class ContractsPage(msgspec.Struct, frozen=True):
    items: list[TokenContract]  # in order of first appearance
    next_cursor: str | None


def _position(cursor: IndexCursor | None) -> IndexPosition | None:
    return IndexPosition(cursor.number, cursor.hash) if cursor is not None else None


def _nft_standard(row: ContractRow) -> Literal["ERC721", "ERC1155"]:
    if row.standard == "ERC1155" or (row.erc1155_transfers and not row.erc721_transfers):
        return "ERC1155"
    return "ERC721"


def _token_contract(row: ContractRow) -> TokenContract:
    return TokenContract(
        row.contract,
        row.standard,
        row.standards(),
        row.first_block,
        row.erc20_transfers + row.erc721_transfers + row.erc1155_transfers,
        row.holders,
        row.supply,
        row.tokens,
        row.owners,
    )


MAX_CURSOR_NUMBER = (1 << 63) - 1  # the stores' integers: larger is no cursor we handed out


def _parse_cursor(text: str) -> tuple[int, str]:
    head, sep, tail = text.partition(":")
    if not sep or not head.isdigit() or not tail or len(text) > 200:
        raise InvalidCursor(f"not a cursor: {text[:40]!r}")
    if int(head) > MAX_CURSOR_NUMBER or (tail.isdigit() and int(tail) > MAX_CURSOR_NUMBER):
        raise InvalidCursor(f"not a cursor: {text[:40]!r}")
    return int(head), tail


def _limit(limit: int) -> int:
    if limit < 1:
        raise ValueError("limit must be at least 1")
    return limit


class IndexReader:
    """Reads one chain/network's index (any number of readers; they never write)."""

    def __init__(self, store: Store, chain: str, network: str) -> None:
        self._store = IndexRows(store)
        self.chain = chain
        self.network = network

    async def at(self) -> IndexPosition | None:
        """The last block indexed."""
        return _position(await self._store.index_cursor(self.chain, self.network))

    async def balances(self, address: str, *, offset: int = 0, limit: int = 50) -> TokenBalances:
        """Positive ERC-20 balances of ``address``, by contract address."""
        holder = address.lower()
        cursor, total, rows = await self._store.index_balances(
            self.chain, self.network, holder, max(0, offset), _limit(limit)
        )
        items = [TokenBalance(c, b) for c, b in rows]
        return TokenBalances(holder, _position(cursor), total, offset, limit, items)

    async def owned_nfts(self, address: str, *, offset: int = 0, limit: int = 50) -> OwnedNfts:
        """ERC-721 and ERC-1155 tokens ``address`` holds, by (contract, token id)."""
        holder = address.lower()
        cursor, total, rows = await self._store.index_nfts_owned(
            self.chain, self.network, holder, max(0, offset), _limit(limit)
        )
        items = [OwnedNft(c, t, _nft_standard(row), q) for c, t, q, row in rows]
        return OwnedNfts(holder, _position(cursor), total, offset, limit, items)

    async def contract(self, contract: str) -> TokenContract | None:
        """What the index knows of one contract; None if it never emitted a token transfer."""
        _, row = await self._store.index_contract(self.chain, self.network, contract.lower())
        return _token_contract(row) if row is not None else None

    async def collection(self, contract: str) -> NftCollection | None:
        """Supply and owners of an NFT collection; None unless it emitted NFT transfers."""
        cursor, row = await self._store.index_contract(self.chain, self.network, contract.lower())
        if row is None or not (row.erc721_transfers or row.erc1155_transfers):
            return None
        return NftCollection(
            row.contract, _nft_standard(row), row.tokens, row.owners, _position(cursor)
        )

    async def nft_token(
        self, contract: str, token_id: int, *, offset: int = 0, limit: int = 50
    ) -> NftToken | None:
        """One token: its owner (ERC-721) or a page of its holders; None when it has neither
        supply nor holders (never minted, or burned)."""
        cursor, row, token, holders = await self._store.index_token(
            self.chain, self.network, contract.lower(), token_id, max(0, offset), _limit(limit)
        )
        if row is None or token is None:
            return None
        standard = _nft_standard(row)
        page = [NftHolder(h, q) for h, q in holders]
        owner = None
        if standard == "ERC721" and token.holders == 1 and page:
            owner = page[0].address
        return NftToken(
            row.contract,
            token_id,
            standard,
            token.supply,
            owner,
            token.holders,
            page,
            _position(cursor),
        )

    async def transfers(
        self,
        address: str,
        *,
        direction: Direction = "any",
        contract: str | None = None,
        from_block: int | None = None,
        to_block: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> TransferPage:
        """Native and token transfers from/to ``address``, newest first.  ``contract``
        filters by token contract; ``cursor`` is a previous page's ``next_cursor``."""
        if direction not in ("in", "out", "any"):
            raise ValueError("direction is in, out or any")
        before = None
        if cursor is not None:
            number, tail = _parse_cursor(cursor)
            if not tail.isdigit():
                raise InvalidCursor(f"not a transfers cursor: {cursor[:40]!r}")
            before = (number, int(tail))
        who = address.lower()
        at, rows = await self._store.index_transfers(
            self.chain,
            self.network,
            who,
            direction=direction,
            contract=contract.lower() if contract is not None else None,
            from_block=from_block,
            to_block=to_block,
            before=before,
            limit=_limit(limit),
        )
        items = [_transfer_item(row, who) for row in rows]
        following = None
        if len(rows) == limit:
            following = f"{rows[-1].block_number}:{rows[-1].seq}"
        return TransferPage(who, _position(at), items, following)

    async def contracts_seen(self, *, cursor: str | None = None, limit: int = 100) -> ContractsPage:
        """Token contracts in the order they first appeared, after ``cursor`` (a previous
        page's ``next_cursor``) — how a metadata service catches up with new contracts."""
        after = _parse_cursor(cursor) if cursor is not None else None
        rows = await self._store.index_contracts_seen(
            self.chain, self.network, after, _limit(limit)
        )
        following = None
        if len(rows) == limit:
            following = f"{rows[-1].first_block}:{rows[-1].contract}"
        return ContractsPage([_token_contract(r) for r in rows], following)


def _transfer_item(row: TransferRow, who: str) -> TransferItem:
    if row.sender == who and row.receiver == who:
        direction: Literal["in", "out", "self"] = "self"
    elif row.sender == who:
        direction = "out"
    else:
        direction = "in"
    return TransferItem(
        row.block_number,
        row.block_hash,
        row.block_time,
        row.tx_hash,
        row.tx_index,
        row.log_index,
        row.standard,  # type: ignore[arg-type]  # written from a Standard
        row.contract,
        row.sender,
        row.receiver,
        row.token_id,
        row.amount,
        direction,
    )
