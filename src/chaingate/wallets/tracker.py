"""The wallet subsystem's follower consumer: deployments and settlements, reorg-safe.

From each applied block it takes the EntryPoints' logs: ``AccountDeployed`` (a wallet is
deployed, by whoever sent it) and ``UserOperationEvent`` paid by one of our paymasters (a
sponsorship is settled at its actual cost).  A reverted block's rows are undone by its hash.
Delivery is at least once and both writes are idempotent, so a replayed block changes nothing.
Its position (the last block handled) is kept for it (``chaingate.chain.consumer``): each
leadership term goes on from there, or from the network's origin when nothing was saved.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import trio

from chaingate.aa.userop import (
    ACCOUNT_DEPLOYED,
    USER_OPERATION_EVENT,
    decode_account_deployed,
    decode_user_operation_event,
)
from chaingate.chain.consumer import KeptPosition, consume
from chaingate.chain.events import Apply, Block, ChainEvent, Revert
from chaingate.store import Store
from chaingate.wallets.store import Deployment, Settlement, WalletRows

log = logging.getLogger("chaingate.wallets")


class Tracker:
    def __init__(
        self,
        store: Store,
        chain: str,
        network: str,
        *,
        entry_points: Sequence[str],
        paymasters: Sequence[str],
    ) -> None:
        self.store = WalletRows(store)
        self.chain = chain
        self.network = network
        self._entry_points = {a.lower() for a in entry_points}
        self._paymasters = {a.lower() for a in paymasters}
        self.stats: Counter[str] = Counter()
        self.position = KeptPosition(store, "wallets", chain, network, self.stats)

    def _relevant(self, block: Block) -> tuple[list[Deployment], list[Settlement]]:
        deployments: list[Deployment] = []
        settlements: list[Settlement] = []
        for entry in block.logs:
            if entry.address.lower() not in self._entry_points or not entry.topics:
                continue
            topic = entry.topics[0].lower()
            try:
                data = bytes.fromhex(entry.data[2:])
                if topic == ACCOUNT_DEPLOYED:
                    event = decode_account_deployed(entry.topics, data)
                    deployments.append(
                        Deployment(
                            event.sender.lower(),
                            block.header.number,
                            block.header.hash,
                            entry.transaction_hash,
                            block.header.timestamp * 1000,
                        )
                    )
                elif topic == USER_OPERATION_EVENT:
                    op = decode_user_operation_event(entry.topics, data)
                    if op.paymaster.lower() in self._paymasters:
                        settlements.append(
                            Settlement(
                                op.user_op_hash.lower(),
                                block.header.number,
                                block.header.hash,
                                entry.transaction_hash,
                                op.actual_gas_cost,
                                op.success,
                            )
                        )
            except ValueError:
                # An EntryPoint does not emit malformed events; a node that sends one is
                # wrong, and one log is not worth stopping for.
                self.stats["malformed"] += 1
        return deployments, settlements

    async def handle(self, event: ChainEvent) -> None:
        if isinstance(event, Apply):
            deployments, settlements = self._relevant(event.block)
            if deployments:
                await self.store.record_deployments(self.chain, self.network, deployments)
                self.stats["deployments"] += len(deployments)
            if settlements:
                settled = await self.store.settle_sponsorships(
                    self.chain, self.network, settlements
                )
                self.stats["settlements"] += settled
        elif isinstance(event, Revert):
            deployments, settlements = self._relevant(event.block)
            if deployments or settlements:
                await self.store.revert_block(self.chain, self.network, event.block.header.hash)
                self.stats["reverted_blocks"] += 1

    async def run(self, events: trio.abc.ReceiveChannel[ChainEvent]) -> None:
        await consume(
            events,
            self.handle,
            name="wallet tracker",
            label=f"{self.chain}/{self.network}",
            stats=self.stats,
            log=log,
            position=self.position,
        )
