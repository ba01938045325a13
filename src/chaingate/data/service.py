"""``DataPlane``: the token and NFT data of every followed EVM network, as one service.

For each network whose indexer is enabled: an ``Indexer`` fed by the network's follower and a
``MetadataService`` (``chaingate.metadata``) that the indexer tells of new token contracts and
ERC-4906 updates, and that tells the index which contracts are no ERC-20s.  The gateway
builds one, hands the REST plane its ``readers`` and ``metadata``, and starts it in its
nursery before the followers (whose events it consumes).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping

import trio

from chaingate.chain.client import ChainClient
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap
from chaingate.cluster.leases import Leadership, LocalLeadership
from chaingate.cluster.rolestream import follower_terms
from chaingate.config import NetworkSettings
from chaingate.config.manifest import load_manifest
from chaingate.config.network import Network
from chaingate.data.indexer import Indexer
from chaingate.data.metrics import register_index_metrics
from chaingate.data.reader import IndexReader
from chaingate.data.store import IndexRows
from chaingate.metadata.service import MetadataService
from chaingate.obs.metrics import Registry
from chaingate.outbound import Fetcher
from chaingate.store import Store


class DataPlane:
    def __init__(
        self,
        store: Store,
        followers: Mapping[Network, Follower],
        clients: Mapping[Network, ChainClient],
        networks: Mapping[Network, NetworkSettings],
        fetcher: Fetcher,
    ) -> None:
        """Keyed by ``Network``; a network gets an index if it is followed and its
        ``indexer.enabled``."""
        self.indexers: dict[Network, Indexer] = {}
        self.metadata: dict[Network, MetadataService] = {}
        self._taps: dict[Network, Tap] = {}
        # Each network's indexer runs while this process leads its ``indexer`` role
        # (chaingate.cluster; set by the gateway: here alone unless processes share the store).
        self.leadership: Leadership = LocalLeadership()
        self._followers = followers
        verdicts = IndexRows(store)
        for key, follower in followers.items():
            net = networks[key]
            if not net.indexer.enabled:
                continue
            indexer = Indexer(
                key.chain,
                key.network,
                store,
                clients[key],
                net.indexer,
                finality_depth=net.finality_depth,
                max_log_range=net.follower.max_log_range,
            )
            # A batch of room: the follower fetches ahead while a batch commits.
            self._taps[key] = follower.tap(
                "indexer", max(net.follower.consumer_buffer, net.indexer.batch_blocks)
            )
            metadata = MetadataService(
                key.chain,
                key.network,
                net.metadata,
                clients[key],
                store,
                fetcher,
                chain_id=net.chain_id,
                manifest=load_manifest(net.manifest) if net.manifest else None,
            )
            indexer.add_listener(metadata.on_index_commit)
            # Its verdicts shape the index's balance lists (what is no ERC-20 is left out).
            metadata.add_verdict_listener(
                functools.partial(verdicts.set_erc20_verdicts, key.chain, key.network)
            )
            self.indexers[key] = indexer
            self.metadata[key] = metadata

    # chaingate.cluster: the single-writer role this service runs, one process per network.
    writer_role = "indexer"

    @property
    def writes_for(self) -> Collection[Network]:
        """The networks whose rows this service writes."""
        return self.indexers.keys()

    @property
    def readers(self) -> dict[Network, IndexReader]:
        return {key: indexer.reader for key, indexer in self.indexers.items()}

    def version(self) -> tuple[int, ...]:
        """Changes whenever any index begins or ends a commit, and never repeats: what an
        answer computed from the index is valid for (the edge's REST cache)."""
        return tuple(indexer.generation for indexer in self.indexers.values())

    async def wait_indexed(self, key: Network, number: int) -> None:
        """Returns once ``key``'s index holds block ``number`` (at once if it has none)."""
        indexer = self.indexers.get(key)
        if indexer is not None:
            await indexer.wait_indexed(number)

    def register_metrics(self, registry: Registry) -> None:
        register_index_metrics(registry, self.indexers)

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests: nothing to start (the index is read through ``readers``
        and the metadata services' methods)."""

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """Each network's metadata service and indexer, ready once every one is: the
        writers of its index and metadata rows (one process per network runs them)."""
        await nursery.start(self._writers)

    def shutdown(self) -> None:
        """Nothing to drain: every write is one transaction, never left half-done."""

    async def _writers(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Ready once every metadata service and indexer is; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            for metadata in self.metadata.values():
                await nursery.start(metadata.run)
            for key, indexer in self.indexers.items():
                led = follower_terms(
                    self.leadership,
                    "indexer",
                    self._followers[key],
                    self._taps[key],
                    indexer.run,
                    indexer,
                )
                await nursery.start(led.run)
            task_status.started()
