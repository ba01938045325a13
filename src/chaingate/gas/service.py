"""The gas subsystem as the gateway runs it: one ``GasOracle`` per followed network,
recomputing its prices on every new head its follower reports (in memory: no writer)."""

from __future__ import annotations

from collections.abc import Mapping

import trio

from chaingate.chain.client import ChainClient
from chaingate.chain.events import ChainEvent
from chaingate.chain.follower import Follower
from chaingate.config import NetworkSettings
from chaingate.config.network import Network
from chaingate.gas.oracle import GasOracle


class GasService:
    def __init__(
        self,
        followers: Mapping[Network, Follower],
        clients: Mapping[Network, ChainClient],
        networks: Mapping[Network, NetworkSettings],
    ) -> None:
        self.oracles: dict[Network, GasOracle] = {}
        self.streams: dict[Network, trio.MemoryReceiveChannel[ChainEvent]] = {}
        for key, follower in followers.items():
            self.oracles[key] = GasOracle(
                follower.chain, follower.network, networks[key], clients[key]
            )
            self.streams[key] = follower.subscribe("gas")

    async def run(self, nursery: trio.Nursery) -> None:
        """Ready once every oracle has tried its first estimate."""
        for key, oracle in self.oracles.items():
            await nursery.start(oracle.run, self.streams[key])

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """None: the oracles write nothing."""

    def shutdown(self) -> None:
        """Nothing to drain: estimates live in memory."""
