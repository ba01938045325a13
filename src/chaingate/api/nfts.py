"""NFT endpoints: one token's metadata, a collection, the NFTs an address owns, refreshes.

Ownership, supply and owner counts come from the reorg-safe index (``chaingate.data``);
documents, names and images from the metadata service (``chaingate.metadata``), which fetches
in the background with retries.  An answer says how fresh its metadata is
(``metadata_status``: ``ok``, ``stale``, ``pending``, ``failed`` with ``metadata_error``) instead
of staying silent about a document it could not fetch.  The owned list never waits for a
fetch: what is missing is queued and shows as ``pending``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from quart import Response

from chaingate.api.datasets import CACHE_SECONDS, Datasets, block_ref
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.responses import json_response
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import Address, ChainName, Paged50, Uint256
from chaingate.api.wallets import iso
from chaingate.auth.gate import Principal

# How long a single-token or collection request may wait for a document fetched on its
# behalf; after that it answers with what is known (status pending) and the fetch goes on.
DOCUMENT_WAIT = 3.0

Standard = Literal["ERC721", "ERC1155"]
MetadataStatus = Literal["ok", "stale", "pending", "failed"]


class NftPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    contract: Address
    token_id: Uint256


class Trait(msgspec.Struct):
    trait_type: str
    value: str


class NftMetadata(msgspec.Struct):
    contract: Address
    token_id: str
    name: str | None
    description: str | None
    image_url: str | None
    image_gateway_url: str | None
    standard: Standard
    # ERC-721: the owner per the index (null once burned); ERC-1155: null (see holders).
    owner: Address | None
    traits: list[Trait]
    # Beyond the spec.
    chain: str
    token_uri: str | None
    holders: int  # addresses holding it (1 for a live ERC-721)
    supply: str  # minted minus burned
    metadata_status: MetadataStatus
    metadata_error: str | None
    block_number: int | None
    block_hash: str | None


class CollectionPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    contract: Address


class Collection(msgspec.Struct):
    contract: Address
    chain: str
    name: str | None
    symbol: str | None
    standard: Standard
    total_supply: int
    num_owners: int
    # No floor-price source is configured: null, never invented.
    floor_price_eth: str | None
    floor_price_usd: str | None
    banner_url: str | None
    image_url: str | None
    description: str | None
    # Beyond the spec.
    contract_uri: str | None
    metadata_status: MetadataStatus
    block_number: int | None
    block_hash: str | None


class OwnedPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    address: Address


class OwnedNft(msgspec.Struct):
    contract: Address
    token_id: str
    name: str | None
    collection_name: str | None
    image_url: str | None
    standard: Standard
    # Beyond the spec.
    quantity: str
    metadata_status: MetadataStatus


class OwnedNftList(msgspec.Struct):
    address: Address
    chain: str
    nfts: list[OwnedNft]
    page: int
    total: int
    limit: int
    block_number: int | None
    block_hash: str | None


class RefreshAccepted(msgspec.Struct):
    """A refresh was queued; the document is fetched again in the background from
    ``scheduled_at`` on: now, or where a refresh another account asked for cools down."""

    status: Literal["accepted"]
    contract: Address
    token_id: str | None
    scheduled_at: str  # ISO 8601 UTC


_REFRESH = (
    "Each account has its own cool-down (429 with `Retry-After` within it). The document's "
    "origin is asked at most once per cool-down whoever asks: a refresh accepted while "
    "another account's is recent is fetched when that one cools down (`scheduled_at`)."
)


def register(api: RestApi, deps: ApiDeps) -> None:
    datasets = Datasets(deps, "NFT data")
    _register_token_and_collection(api, datasets)
    _register_owned(api, datasets)
    _register_refreshes(api, datasets)


def _register_token_and_collection(api: RestApi, datasets: Datasets) -> None:
    @api.route(
        "GET",
        "/v1/nfts/{chain}/metadata/{contract}/{token_id}",
        name="getNftMetadata",
        summary="One NFT: its metadata document, traits, image and owner",
        access="data:read",
        path_params=NftPath,
        response=NftMetadata,
        errors=(404,),
        tags=("nfts",),
        description="`token_id` as a decimal or 0x-hex string. ERC-1155 `{id}` is replaced "
        "by the 64-hex-digit id. A document not fetched yet is fetched for up to 3 s, then "
        "the answer says `metadata_status: pending` and the fetch goes on.",
        cache_seconds=CACHE_SECONDS,
    )
    async def get_nft(call: Call[NftPath, NoInput, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        contract, token_id = call.path.contract, int(call.path.token_id)
        token = await data.index.nft_token(contract, token_id, limit=1)
        if token is None:
            raise ApiError(
                404,
                f"token {token_id} of {contract} does not exist on {data.key} (never minted, "
                "or burned)",
            )
        meta = await data.metadata.nft(contract, token_id, wait=DOCUMENT_WAIT)
        at = block_ref(token.at)
        return NftMetadata(
            contract=contract,
            token_id=str(token_id),
            name=meta.name,
            description=meta.description,
            image_url=meta.image_url,
            image_gateway_url=meta.image_gateway_url,
            standard=token.standard,
            owner=Address.of(token.owner) if token.owner else None,
            traits=[Trait(t.trait_type, t.value) for t in meta.traits],
            chain=data.name,
            token_uri=meta.token_uri,
            holders=token.holders_total,
            supply=str(token.supply),
            metadata_status=meta.status,
            metadata_error=meta.last_error,
            block_number=at.block_number,
            block_hash=at.block_hash,
        )

    @api.route(
        "GET",
        "/v1/nfts/{chain}/collection/{contract}",
        name="getNftCollection",
        summary="An NFT collection: supply and owners from the index, contractURI details",
        access="data:read",
        path_params=CollectionPath,
        response=Collection,
        errors=(404,),
        tags=("nfts",),
        cache_seconds=CACHE_SECONDS,
    )
    async def get_collection(call: Call[CollectionPath, NoInput, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        contract = call.path.contract
        counts = await data.index.collection(contract)
        if counts is None:
            raise ApiError(404, f"{contract} has no ERC-721 or ERC-1155 transfers on {data.key}")
        meta = await data.metadata.collection(contract, wait=DOCUMENT_WAIT)
        at = block_ref(counts.at)
        return Collection(
            contract=contract,
            chain=data.name,
            name=meta.name,
            symbol=meta.symbol,
            standard=counts.standard,
            total_supply=counts.total_supply,
            num_owners=counts.num_owners,
            floor_price_eth=None,
            floor_price_usd=None,
            banner_url=meta.banner_gateway_url or meta.banner_url,
            image_url=meta.image_gateway_url or meta.image_url,
            description=meta.description,
            contract_uri=meta.contract_uri,
            metadata_status=meta.status,
            block_number=at.block_number,
            block_hash=at.block_hash,
        )


def _register_owned(api: RestApi, datasets: Datasets) -> None:
    @api.route(
        "GET",
        "/v1/nfts/{chain}/owned/{address}",
        name="getOwnedNfts",
        summary="The NFTs (ERC-721 and ERC-1155) an address holds",
        access="data:read",
        path_params=OwnedPath,
        query=Paged50,
        response=OwnedNftList,
        errors=(404,),
        tags=("nfts",),
        description="From the index, ordered by (contract, token id). Metadata comes from the "
        "cache only; missing documents are fetched in the background (`pending` meanwhile).",
        cache_seconds=CACHE_SECONDS,
    )
    async def get_owned(call: Call[OwnedPath, Paged50, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        page = call.query
        found = await data.index.owned_nfts(call.path.address, offset=page.offset, limit=page.limit)
        keys = [(item.contract, item.token_id) for item in found.items]
        documents = await data.metadata.cached_nfts(keys) if keys else {}
        contracts = sorted({item.contract for item in found.items})
        facts = await data.metadata.tokens(contracts, wait=0) if contracts else {}
        nfts = []
        for item in found.items:
            document = documents[(item.contract, item.token_id)]
            contract = Address.of(item.contract)
            fact = facts.get(contract)
            nfts.append(
                OwnedNft(
                    contract=contract,
                    token_id=str(item.token_id),
                    name=document.name,
                    collection_name=fact.name if fact is not None else None,
                    image_url=document.image_gateway_url or document.image_url,
                    standard=item.standard,
                    quantity=str(item.quantity),
                    metadata_status=document.status,
                )
            )
        at = block_ref(found.at)
        return OwnedNftList(
            address=call.path.address,
            chain=data.name,
            nfts=nfts,
            page=page.page,
            total=found.total,
            limit=page.limit,
            block_number=at.block_number,
            block_hash=at.block_hash,
        )


async def _refresh(
    data: Any, contract: Address, token_id: int | None, principal: Principal | None
) -> Response:
    """Queue a refresh of a token's documents (``token_id`` None: a collection's) for the
    caller's account: 202 with when it is fetched, or 429 within the account's cool-down."""
    account = principal.account_id if principal is not None else ""
    result = await data.metadata.request_refresh(contract, token_id, account)
    if result.status == "cooldown":
        raise ApiError(
            429,
            f"this account had a refresh of this "
            f"{'token' if token_id is not None else 'collection'} accepted recently: "
            f"retry in {result.retry_after} s",
            code="rate_limited",
            headers={"Retry-After": str(result.retry_after)},
        )
    accepted = RefreshAccepted(
        "accepted",
        contract,
        None if token_id is None else str(token_id),
        iso(result.due_at_ms),
    )
    return json_response(accepted, 202)


def _register_refreshes(api: RestApi, datasets: Datasets) -> None:
    @api.route(
        "POST",
        "/v1/nfts/{chain}/metadata/{contract}/{token_id}/refresh",
        name="refreshNftMetadata",
        summary="Fetch one NFT's metadata document again (cool-down: 5 minutes per account)",
        description=_REFRESH,
        access="data:read",
        path_params=NftPath,
        response=RefreshAccepted,
        status=202,
        errors=(404,),
        tags=("nfts",),
    )
    async def refresh_nft(call: Call[NftPath, NoInput, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        token_id = int(call.path.token_id)
        if await data.index.nft_token(call.path.contract, token_id, limit=1) is None:
            raise ApiError(404, f"token {token_id} of {call.path.contract} does not exist")
        return await _refresh(data, call.path.contract, token_id, call.principal)

    @api.route(
        "POST",
        "/v1/nfts/{chain}/collection/{contract}/refresh",
        name="refreshNftCollection",
        summary="Re-read a collection's facts and every document of it (cool-down: 1 hour per "
        "account)",
        description=_REFRESH,
        access="data:read",
        path_params=CollectionPath,
        response=RefreshAccepted,
        status=202,
        errors=(404,),
        tags=("nfts",),
    )
    async def refresh_collection(call: Call[CollectionPath, NoInput, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        if await data.index.collection(call.path.contract) is None:
            raise ApiError(404, f"{call.path.contract} has no NFT transfers on {data.key}")
        return await _refresh(data, call.path.contract, None, call.principal)
