"""``GET /v1/transfers/{chain}/{address}`` — beyond the spec: an address's transfers.

The ``data:read`` scope names "transfer APIs"; this is ours, shaped like Alchemy's
``getAssetTransfers`` with its complaints answered: native (top-level) and ERC-20/721/1155
transfers in one list, newest first, from the reorg-safe index (a transfer of a block that is
reorganised away disappears with it).  Filters: ``direction`` (``in``, ``out``, ``any``),
``contract``, ``from_block``/``to_block``.  Pagination by cursor, not page number: a cursor
names a position in the chain, so new blocks never shift a page.  Internal (trace-level)
transfers are not included.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

import msgspec

from chaingate.api.datasets import CACHE_SECONDS, Datasets, block_ref
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, RestApi
from chaingate.api.types import Address, ChainName, Limit

MAX_BLOCK = (1 << 63) - 1
Block = Annotated[int, msgspec.Meta(ge=0, le=MAX_BLOCK)]
Cursor = Annotated[
    str,
    msgspec.Meta(
        max_length=64,
        pattern=r"^[0-9]{1,20}:[0-9]{1,20}$",
        description="`next_cursor` of the previous page.",
    ),
]


class TransfersPath(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    address: Address


class TransfersQuery(msgspec.Struct, forbid_unknown_fields=True):
    direction: Literal["in", "out", "any"] = "any"
    contract: Address | None = None
    from_block: Block | None = None
    to_block: Block | None = None
    cursor: Cursor | None = None
    limit: Limit = 50


class Transfer(msgspec.Struct, rename={"from_": "from"}):
    block_number: int
    block_hash: str
    timestamp: str  # the block's, ISO 8601 UTC
    tx_hash: str
    log_index: int | None  # null for a native transfer
    type: Literal["native", "erc20", "erc721", "erc1155"]
    contract: Address | None  # null for a native transfer
    from_: Address  # 0x000…0 for a mint
    to: Address  # 0x000…0 for a burn
    token_id: str | None
    value: str  # raw units (wei for native); 1 for ERC-721
    direction: Literal["in", "out", "self"]


class TransferList(msgspec.Struct):
    address: Address
    chain: str
    transfers: list[Transfer]
    # null: nothing older.
    next_cursor: str | None
    block_number: int | None
    block_hash: str | None


_TYPES: dict[str, Literal["native", "erc20", "erc721", "erc1155"]] = {
    "native": "native",
    "ERC20": "erc20",
    "ERC721": "erc721",
    "ERC1155": "erc1155",
}


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def register(api: RestApi, deps: ApiDeps) -> None:
    datasets = Datasets(deps, "transfers")

    @api.route(
        "GET",
        "/v1/transfers/{chain}/{address}",
        name="getTransfers",
        summary="Native and token (ERC-20/721/1155) transfers of an address, newest first",
        access="data:read",
        path_params=TransfersPath,
        query=TransfersQuery,
        response=TransferList,
        errors=(404,),
        tags=("transfers",),
        description="Beyond the spec. From the reorg-safe index; internal (trace) transfers "
        "are not included. Page with `cursor` = the previous answer's `next_cursor`.",
        cache_seconds=CACHE_SECONDS,
    )
    async def get_transfers(call: Call[TransfersPath, TransfersQuery, None]) -> object:
        data = datasets.resolve(call.path.chain, call.principal)
        query = call.query
        if (
            query.from_block is not None
            and query.to_block is not None
            and query.from_block > query.to_block
        ):
            raise ApiError(400, "invalid query parameter 'from_block': it is after 'to_block'")
        try:
            page = await data.index.transfers(
                call.path.address,
                direction=query.direction,
                contract=query.contract,
                from_block=query.from_block,
                to_block=query.to_block,
                cursor=query.cursor,
                limit=query.limit,
            )
        except ValueError as exc:  # a cursor this index did not hand out
            raise ApiError(400, f"invalid query parameter 'cursor': {exc}") from None
        at = block_ref(page.at)
        return TransferList(
            address=call.path.address,
            chain=data.name,
            transfers=[
                Transfer(
                    block_number=item.block_number,
                    block_hash=item.block_hash,
                    timestamp=_iso(item.block_time),
                    tx_hash=item.tx_hash,
                    log_index=item.log_index,
                    type=_TYPES[item.standard],
                    contract=Address.of(item.contract) if item.contract else None,
                    from_=Address.of(item.sender),
                    to=Address.of(item.receiver),
                    token_id=None if item.token_id is None else str(item.token_id),
                    value=str(item.amount),
                    direction=item.direction,
                )
                for item in page.items
            ],
            next_cursor=page.next_cursor,
            block_number=at.block_number,
            block_hash=at.block_hash,
        )
