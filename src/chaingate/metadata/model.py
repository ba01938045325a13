"""What the metadata service answers: msgspec Structs, one per question.

Every answer says how fresh it is.  ``status`` is one of

* ``ok`` — fetched and parsed (for a token document: the JSON at its URI; for on-chain token
  facts: the calls answered);
* ``stale`` — (NFT documents) data is served, but a refresh was asked for (``POST …/refresh``,
  an ERC-4906 event) and has not succeeded yet;
* ``pending`` — nothing known yet; a fetch is queued or running;
* ``failed`` — the last attempt failed and nothing good is known; ``last_error`` says why and
  ``next_retry_at`` when the next automatic attempt is (None: none scheduled — it is tried again
  when asked for).

Times are epoch milliseconds.  Token ids are ints here; APIs show them as decimal strings.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

import msgspec

Status = Literal["ok", "stale", "pending", "failed"]
# A stored status as the model knows it (a row's text, typed; anything else reads "failed").
STATUSES: dict[str, Status] = {
    "ok": "ok",
    "stale": "stale",
    "pending": "pending",
    "failed": "failed",
}
# What a contract is, by ERC-165 first, then the indexer's hint from its logs, then calls.
Standard = Literal["ERC20", "ERC721", "ERC1155"]
STANDARDS: tuple[Standard, ...] = ("ERC20", "ERC721", "ERC1155")


class TokenMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """On-chain facts of one contract (``name()``, ``symbol()``, ``decimals()``, ERC-165).

    ``standard`` None with ``status`` ``ok`` means *not a token contract*: no code, or it
    answers none of the calls a token answers (an event emitter that logs Transfer, say).
    ``decimals`` None means the contract has no ``decimals()`` (EIP-20 makes it optional):
    amounts are then shown in raw units (0 decimals) and never priced.
    ``name``/``symbol`` are text even where the contract returns bytes32 (MKR-style).
    """

    contract: str  # EIP-55
    standard: Standard | None = None
    name: str | None = None
    symbol: str | None = None
    decimals: int | None = None
    total_supply: int | None = None  # at fetched_at (see TokenInfo for a fresh one)
    status: Status = "pending"
    last_error: str | None = None
    fetched_at: int | None = None
    next_retry_at: int | None = None

    @property
    def is_token(self) -> bool:
        return self.standard is not None

    @property
    def known_not_erc20(self) -> bool:
        """Read, and not an ERC-20 (an NFT, or no token at all): left out of balance lists.
        A contract still being probed is not known to be anything yet."""
        return self.status == "ok" and self.standard != "ERC20"


class Trait(msgspec.Struct, frozen=True):
    """One entry of a document's ``attributes``; every value as a string (see nft.py)."""

    trait_type: str
    value: str


class NftMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """One token's metadata document (``tokenURI`` for ERC-721, ``uri`` for ERC-1155).

    ``image_url`` is as the document gives it (may be ``ipfs://``, ``ar://``, ``data:``);
    ``image_gateway_url`` its HTTP form (``<image_gateway>/ipfs/<cid>/<path>``,
    ``<arweave_gateway>/<tx>/<path>``; http(s) and data: images are the same URL).  The owner
    is not here: it is the indexer's.
    """

    contract: str  # EIP-55
    token_id: int
    standard: Standard | None = None
    token_uri: str | None = None  # {id} substituted; data: URIs shortened to their media type
    name: str | None = None
    description: str | None = None
    image_url: str | None = None
    image_gateway_url: str | None = None
    animation_url: str | None = None
    external_url: str | None = None
    traits: list[Trait] = []
    status: Status = "pending"
    last_error: str | None = None
    attempts: int = 0
    fetched_at: int | None = None
    next_retry_at: int | None = None


class CollectionMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """A contract as a collection: on-chain name/symbol/standard, plus its ERC-7572
    ``contractURI`` document (description, image, banner) when it has one.

    ``status``/``last_error`` describe the contractURI document (``ok`` with no document when
    the contract has no ``contractURI``).  Supply, owner counts and floor prices are not here:
    the first two are the indexer's, and no floor price source exists (always null).
    """

    contract: str
    standard: Standard | None = None
    name: str | None = None
    symbol: str | None = None
    contract_uri: str | None = None
    description: str | None = None
    image_url: str | None = None
    image_gateway_url: str | None = None
    banner_url: str | None = None
    banner_gateway_url: str | None = None
    external_url: str | None = None
    status: Status = "pending"
    last_error: str | None = None
    next_retry_at: int | None = None


class TokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``GET /v1/tokens/{chain}/metadata/{contract}`` shows, amounts as strings.

    ``total_supply`` is read on-chain (at most ``supply_ttl`` old); ``price_usd`` from the
    configured feed (None: no feed, a stale or broken feed); ``market_cap_usd`` =
    formatted supply times price, only when both are known.
    """

    metadata: TokenMetadata
    total_supply: str | None  # raw units
    formatted_total_supply: str | None
    price_usd: str | None
    market_cap_usd: str | None
    logo_url: str | None


class BalanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The metadata side of one ``tokens`` item of ``GET /v1/tokens/{chain}/balances``."""

    contract: str
    symbol: str | None
    name: str | None
    decimals: int | None
    balance: str  # raw units
    formatted_balance: str
    usd_value: str | None
    logo_url: str | None


RefreshStatus = Literal["accepted", "cooldown"]


class RefreshResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to ``request_refresh``: ``accepted`` (the document is fetched again from
    ``due_at_ms`` on) or ``cooldown`` (this account had one accepted less than the cool-down
    ago; ``retry_after`` whole seconds until it may ask again)."""

    status: RefreshStatus
    retry_after: int = 0
    due_at_ms: int = 0


class PriceQuote(msgspec.Struct, frozen=True, kw_only=True):
    """A feed's reading: USD per whole token (or per native coin)."""

    price: Decimal | None
    feed: str | None
    updated_at: int | None = None  # the feed's own updatedAt (epoch seconds)
    error: str | None = None  # why there is no price: no feed, stale, bad answer...
