"""The per-network services behind the token, NFT and transfer endpoints, found by ``{chain}``.

One object resolves a request's ``{chain}`` (404 unknown, 403 a test key on a mainnet) and
hands back that network's index reader and metadata service — or says clearly why there is
none (the network is configured but not indexed).
"""

from __future__ import annotations

import msgspec

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.config.network import Network
from chaingate.data.reader import IndexPosition, IndexReader
from chaingate.metadata import MetadataService

# The same answer is served again for up to a second, never across an index commit
# (chaingate.edge.restcache): a popular page costs one computation per second.
CACHE_SECONDS = 1.0


class BlockRef(msgspec.Struct, frozen=True):
    """The block the index was at when the answer was read (null before the first block)."""

    block_number: int | None
    block_hash: str | None


class Dataset(msgspec.Struct, frozen=True):
    key: Network
    name: str  # the shortest {chain} spelling of it, as answers show it
    index: IndexReader
    metadata: MetadataService


class Datasets:
    def __init__(self, deps: ApiDeps, what: str) -> None:
        self._chains = ChainResolver(deps.evm_networks, what)
        self._indexes = deps.indexes
        self._metadata = deps.metadata
        self._what = what

    def resolve(self, name: str, principal: object) -> Dataset:
        key = self._chains.resolve(name, principal)
        index = self._indexes.get(key)
        metadata = self._metadata.get(key)
        if index is None or metadata is None:
            raise ApiError(
                404,
                f"{self._what} are not indexed for {key}: its chain follower or indexer is off "
                "([chains.<chain>.<network>.indexer] enabled = false)",
            )
        return Dataset(key, self._chains.names.name_of(key), index, metadata)


def block_ref(at: IndexPosition | None) -> BlockRef:
    if at is None:
        return BlockRef(None, None)
    return BlockRef(at.block_number, at.block_hash)
