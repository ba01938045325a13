"""Token and NFT metadata, USD prices and logos (issue 9).

``MetadataService`` (``service.py``) is the one object the gateway starts per EVM network;
the REST endpoints ask it and the indexer reports to it.  The rest are small parts: batched
calls (``multicall``), what contracts say (``tokens``), feeds (``prices``), token lists
(``tokenlist``), URIs and gateways (``uris``, ``cid``), documents (``documents``, ``nft``),
the background queue (``refresher``) and the on-chain facts cache (``tokencache``).
"""

from chaingate.metadata.model import (
    BalanceInfo,
    CollectionMetadata,
    NftMetadata,
    PriceQuote,
    RefreshResult,
    Standard,
    Status,
    TokenInfo,
    TokenMetadata,
    Trait,
)
from chaingate.metadata.service import MetadataService
from chaingate.metadata.uris import parse_token_id

__all__ = [
    "BalanceInfo",
    "CollectionMetadata",
    "MetadataService",
    "NftMetadata",
    "PriceQuote",
    "RefreshResult",
    "Standard",
    "Status",
    "TokenInfo",
    "TokenMetadata",
    "Trait",
    "parse_token_id",
]
