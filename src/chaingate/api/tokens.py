"""``GET /v1/tokens/{chain}/balances/{address}`` and ``GET /v1/tokens/{chain}/metadata/{contract}``.

Balances come from the reorg-safe index (``chaingate.data``): ERC-20 balances that are not
zero, ordered by contract address, with the block the index was at.  Names, symbols,
decimals, prices and logos come from the metadata service (``chaingate.metadata``): exact
decimal strings, ``usd_value`` only from a fresh on-chain feed (else null, never invented),
``logo_url`` only from a configured token list (else null).  A contract the metadata service
knows is not an ERC-20 (an NFT, or something that only logs Transfer) is left out — by the
index's query, so ``total`` counts exactly what the pages hold.
"""

from __future__ import annotations

import msgspec

from chaingate.api.datasets import CACHE_SECONDS, Datasets, block_ref
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import Address, ChainName, Paged50

# How long a request may wait for the facts of a contract it is the first to ask about.
METADATA_WAIT = 2.0


class BalancesPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    address: Address


class TokenBalance(msgspec.Struct):
    contract: Address
    symbol: str | None
    name: str | None
    # null when the contract has no decimals() (EIP-20 makes it optional): amounts are then
    # raw units and never priced.
    decimals: int | None
    balance: str
    formatted_balance: str
    usd_value: str | None
    logo_url: str | None


class TokenBalanceList(msgspec.Struct):
    address: Address
    chain: str
    tokens: list[TokenBalance]
    page: int
    total: int
    limit: int
    # The block the index had applied when this was read (beyond the spec).
    block_number: int | None
    block_hash: str | None


class TokenPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    contract: Address


class TokenMetadata(msgspec.Struct):
    contract: Address
    chain: str
    name: str | None
    symbol: str | None
    decimals: int | None
    total_supply: str | None
    formatted_total_supply: str | None
    price_usd: str | None
    market_cap_usd: str | None
    logo_url: str | None


def register(api: RestApi, deps: ApiDeps) -> None:
    datasets = Datasets(deps, "token balances")
    _register_balances(api, datasets)
    _register_metadata(api, datasets)


def _register_balances(api: RestApi, datasets: Datasets) -> None:
    @api.route(
        "GET",
        "/v1/tokens/{chain}/balances/{address}",
        name="getTokenBalances",
        summary="ERC-20 balances of an address (non-zero), with metadata, USD values, logos",
        access="data:read",
        path_params=BalancesPath,
        query=Paged50,
        response=TokenBalanceList,
        errors=(404,),
        tags=("tokens",),
        description="From the reorg-safe index: a balance is undone when its block is "
        "reorganised away. Ordered by contract address (stable across pages).",
        cache_seconds=CACHE_SECONDS,
    )
    async def get_balances(call: Call[BalancesPath, Paged50, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        page = call.query
        for _ in range(2):
            found = await data.index.balances(
                call.path.address, offset=page.offset, limit=page.limit
            )
            described = await data.metadata.describe_balances(
                {item.contract: item.balance for item in found.items}, wait=METADATA_WAIT
            )
            # The index leaves out what the metadata knows is no ERC-20; one it learnt while
            # this page waited for it is left out of a second read, and of its total, too.
            if all(Address.of(item.contract) in described for item in found.items):
                break
        tokens = [
            TokenBalance(
                contract=Address.of(info.contract),
                symbol=info.symbol,
                name=info.name,
                decimals=info.decimals,
                balance=info.balance,
                formatted_balance=info.formatted_balance,
                usd_value=info.usd_value,
                logo_url=info.logo_url,
            )
            for item in found.items
            if (info := described.get(Address.of(item.contract))) is not None
        ]
        at = block_ref(found.at)
        return TokenBalanceList(
            address=call.path.address,
            chain=data.name,
            tokens=tokens,
            page=page.page,
            # Less any the index was not told of (a store error): the rest of the pages agree.
            total=found.total - (len(found.items) - len(tokens)),
            limit=page.limit,
            block_number=at.block_number,
            block_hash=at.block_hash,
        )


def _register_metadata(api: RestApi, datasets: Datasets) -> None:
    @api.route(
        "GET",
        "/v1/tokens/{chain}/metadata/{contract}",
        name="getTokenMetadata",
        summary="An ERC-20's name, symbol, decimals, on-chain supply, USD price and market cap",
        access="data:read",
        path_params=TokenPath,
        response=TokenMetadata,
        errors=(404, 503),
        tags=("tokens",),
        description="`total_supply` is read on-chain; `price_usd` from a configured "
        "Chainlink-style feed that is fresh (else null); `market_cap_usd` = supply x price "
        "when both are known. 404 for an address without code or that is not an ERC-20.",
        cache_seconds=CACHE_SECONDS,
    )
    async def get_token_metadata(call: Call[TokenPath, NoInput, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        info = await data.metadata.token_info(call.path.contract, wait=METADATA_WAIT)
        meta = info.metadata
        if meta.status == "ok" and meta.standard != "ERC20":
            kind = f"an {meta.standard} contract" if meta.standard else "not a token contract"
            raise ApiError(404, f"{call.path.contract} is {kind} on {data.key}")
        if meta.status in ("pending", "failed") and meta.standard is None:
            raise ApiError(
                503,
                f"the facts of {call.path.contract} could not be read yet"
                + (f" ({meta.last_error})" if meta.last_error else "")
                + ": retry shortly",
                headers={"Retry-After": "2"},
            )
        return TokenMetadata(
            contract=call.path.contract,
            chain=data.name,
            name=meta.name,
            symbol=meta.symbol,
            decimals=meta.decimals,
            total_supply=info.total_supply,
            formatted_total_supply=info.formatted_total_supply,
            price_usd=info.price_usd,
            market_cap_usd=info.market_cap_usd,
            logo_url=info.logo_url,
        )
