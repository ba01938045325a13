"""The wallet subsystem's follower consumer: deployments and settlements, reorg-safe.

From each applied block it takes the EntryPoints' logs: ``AccountDeployed`` (a wallet is
deployed, by whoever sent it) and ``UserOperationEvent`` paid by one of our paymasters (a
sponsorship is settled at its actual cost).  EIP-7702 wallets are delegated by transactions,
not logs: while the network has any, each block's type-4 transactions are read (the block
with its transactions), their authorities recovered, and for those that are our EIP-7702
wallets the delegate read back from the account's code after the block — whoever sent it,
set or cleared (an authorization that did not apply leaves the code as it was).  A reverted
block's rows are undone by its hash.  Delivery is at least once and every write is
idempotent, so a replayed block changes nothing.  Its position (the last block handled) is
kept for it (``chaingate.chain.consumer``): each leadership term goes on from there, or from
the network's origin when nothing was saved.
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
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.chain.consumer import BeginsAt, KeptPosition, consume
from chaingate.chain.events import Apply, Block, ChainEvent, Revert
from chaingate.config.network import Network
from chaingate.evm.eip7702 import ZERO_ADDRESS, delegate_of, parse_authorization
from chaingate.rpc.errors import UpstreamError
from chaingate.store import Store
from chaingate.wallets.store import Delegation, Deployment, Settlement, WalletRows

log = logging.getLogger("chaingate.wallets")
NODE_RETRY_SECONDS = 1.0


class UnusableAnswer(Exception):
    """The node answered what is not the block or code asked for: asked again."""


class Tracker:
    def __init__(
        self,
        store: Store,
        chain: str,
        network: str,
        *,
        entry_points: Sequence[str],
        paymasters: Sequence[str],
        client: ChainClient | None = None,
        begins_at: BeginsAt | None = None,
    ) -> None:
        """``begins_at``: where it begins having handled nothing (``KeptPosition``)."""
        self.store = WalletRows(store)
        self.client = client  # reads type-4 transactions and codes (EIP-7702 wallets)
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))  # for logs
        self._entry_points = {a.lower() for a in entry_points}
        self._paymasters = {a.lower() for a in paymasters}
        self.stats: Counter[str] = Counter()
        self.position = KeptPosition(
            store, "wallets", chain, network, self.stats, begins_at=begins_at
        )

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

    async def _delegations(self, block: Block) -> list[Delegation]:
        """The block's delegations of our EIP-7702 wallets (see the module docstring)."""
        if self.client is None or not block.transactions:
            return []
        if not await self.store.has_eip7702_wallets(self.chain, self.network):
            return []
        full = await self.client.call("eth_getBlockByHash", [block.header.hash, True])
        if not isinstance(full, dict):
            # Null: the node answering is behind the follower's (or lost the block to a
            # reorganisation).  Read as a block without transactions it would lose delegations.
            raise UnusableAnswer(f"eth_getBlockByHash {block.header.hash}: {str(full)[:80]}")
        last_tx: dict[str, str] = {}  # authority -> the block's last transaction naming it
        for tx in full.get("transactions", []):
            if not isinstance(tx, dict) or tx.get("type") != "0x4":
                continue
            for item in tx.get("authorizationList") or []:
                try:
                    authority = parse_authorization(item).authority().lower()
                except ValueError:
                    self.stats["bad_authorization"] += 1  # skipped by the chain too
                    continue
                last_tx[authority] = str(tx.get("hash", "")).lower()
        ours = await self.store.eip7702_wallets(self.chain, self.network, list(last_tx))
        found = []
        at = {"blockHash": block.header.hash}  # EIP-1898: after this block, not one at its height
        for address in sorted(ours):
            code = await self.client.call("eth_getCode", [address, at])
            try:
                if not isinstance(code, str) or code[:2] != "0x":
                    raise ValueError("not 0x-hex")
                delegate = delegate_of(bytes.fromhex(code[2:]))
            except ValueError:
                raise UnusableAnswer(f"eth_getCode {address}: {str(code)[:80]}") from None
            found.append(
                Delegation(
                    address,
                    block.header.number,
                    block.header.hash,
                    last_tx[address],
                    (delegate or ZERO_ADDRESS).lower(),
                    block.header.timestamp * 1000,
                )
            )
        return found

    async def handle(self, event: ChainEvent) -> None:
        if isinstance(event, Apply):
            while True:  # a missed delegation would leave a wallet's status wrong for good
                try:
                    delegations = await self._delegations(event.block)
                    break
                except (RpcCallError, UpstreamError, UnusableAnswer) as exc:
                    self.stats["node_errors"] += 1
                    log.warning(
                        "wallet tracker: the node failed reading delegations; retrying",
                        extra={
                            "fields": {
                                "network": self.label,
                                "error": str(exc),
                            }
                        },
                    )
                    await trio.sleep(NODE_RETRY_SECONDS)
            if delegations:
                await self.store.record_delegations(self.chain, self.network, delegations)
                self.stats["delegations"] += len(delegations)
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
            await self.store.revert_delegations(self.chain, self.network, event.block.header.hash)
            deployments, settlements = self._relevant(event.block)
            if deployments or settlements:
                await self.store.revert_block(self.chain, self.network, event.block.header.hash)
                self.stats["reverted_blocks"] += 1

    async def run(self, events: trio.abc.ReceiveChannel[ChainEvent]) -> None:
        await consume(
            events,
            self.handle,
            name="wallet tracker",
            label=self.label,
            stats=self.stats,
            log=log,
            position=self.position,
        )
