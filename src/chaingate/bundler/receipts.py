"""User operation receipts from the follower's logs (never an unbounded ``eth_getLogs``).

An EntryPoint's ``handleOps`` emits, in one transaction: the validation phase's logs
(``AccountDeployed``...), ``BeforeExecution()``, then per operation its own execution's logs,
a ``UserOperationRevertReason`` if its call reverted, and its ``UserOperationEvent``.  So an
operation's logs are the ones after ``BeforeExecution`` (or after the previous operation's
``UserOperationEvent``) and before its own event — the boundary the reference bundler uses.

``extract`` is sans-IO (a block in, receipt rows out); ``ReceiptTracker`` consumes the
follower, writes the rows, and tells the bundler which operations were included or reverted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from chaingate.aa.userop import USER_OPERATION_EVENT, decode_user_operation_event
from chaingate.bundler.receiptstore import BundlerReceiptRows, ReceiptRow
from chaingate.chain.consumer import BeginsAt, KeptPosition, consume
from chaingate.chain.events import Apply, Block, ChainEvent, Log, Revert
from chaingate.config.network import Network
from chaingate.evm import abi
from chaingate.store import Store

log = logging.getLogger("chaingate.bundler")

BEFORE_EXECUTION = abi.event_topic("BeforeExecution()")
REVERT_REASON = abi.event_topic("UserOperationRevertReason(bytes32,address,uint256,bytes)")

_log_list = msgspec.json.Encoder()


def extract(block: Block, entry_points: set[str]) -> list[ReceiptRow]:
    """The receipts of every user operation that ``block``'s served EntryPoints report."""
    rows: list[ReceiptRow] = []
    own_logs: list[Log] = []  # logs since the last boundary in the current transaction
    reasons: dict[str, str] = {}
    current_tx = ""
    for entry in block.logs:
        if entry.transaction_hash != current_tx:
            current_tx, own_logs, reasons = entry.transaction_hash, [], {}
        topic = entry.topics[0].lower() if entry.topics else ""
        from_entry_point = entry.address.lower() in entry_points
        if from_entry_point and topic == BEFORE_EXECUTION:
            own_logs = []
            continue
        if from_entry_point and topic == REVERT_REASON and len(entry.topics) > 1:
            try:
                (reason,) = abi.decode(["uint256", "bytes"], bytes.fromhex(entry.data[2:]))[1:]
            except ValueError:
                reason = b""
            reasons[entry.topics[1].lower()] = "0x" + reason.hex()
            continue
        if not (from_entry_point and topic == USER_OPERATION_EVENT):
            own_logs.append(entry)
            continue
        try:
            event = decode_user_operation_event(entry.topics, bytes.fromhex(entry.data[2:]))
        except ValueError:
            own_logs = []
            continue  # an EntryPoint does not emit a malformed event; a bad node might
        rows.append(
            ReceiptRow(
                user_op_hash=event.user_op_hash.lower(),
                block_hash=block.header.hash,
                block_number=block.header.number,
                tx_hash=entry.transaction_hash,
                entry_point=entry.address,
                sender=event.sender,
                nonce=event.nonce,
                paymaster=event.paymaster,
                success=event.success,
                actual_gas_cost=event.actual_gas_cost,
                actual_gas_used=event.actual_gas_used,
                reason=reasons.get(event.user_op_hash.lower(), ""),
                logs=_log_list.encode(own_logs).decode(),
            )
        )
        own_logs = []
    return rows


Included = Callable[[Sequence[ReceiptRow]], Awaitable[None]]
Reverted = Callable[[Sequence[str]], Awaitable[None]]
Head = Callable[[int], None]


class ReceiptTracker:
    """The bundler's follower consumer for one network."""

    def __init__(
        self,
        store: Store,
        chain: str,
        network: str,
        entry_points: Sequence[str],
        *,
        included: Included,
        reverted: Reverted,
        head: Head,
        begins_at: BeginsAt | None = None,
    ) -> None:
        """``begins_at``: where it begins having handled nothing (``KeptPosition``)."""
        self.store = BundlerReceiptRows(store)
        self.chain = chain
        self.network = network
        self.label = str(Network(chain, network))  # for logs
        self._entry_points = {a.lower() for a in entry_points}
        self._included = included
        self._reverted = reverted
        self._head = head  # told of every block applied, once its receipts are in
        self.stats: Counter[str] = Counter()
        self.head = 0  # the newest block applied
        # Where each term goes on from (chaingate.chain.catchup): kept for it.
        self.position = KeptPosition(
            store, "bundler", chain, network, self.stats, begins_at=begins_at
        )

    async def handle(self, event: ChainEvent) -> None:
        store = self.store
        if isinstance(event, Apply):
            self.head = event.block.header.number
            rows = extract(event.block, self._entry_points)
            if rows:
                await store.record_receipts(self.chain, self.network, rows)
                self.stats["receipts"] += len(rows)
                await self._included(rows)
            self._head(self.head)
        elif isinstance(event, Revert):
            self.head = event.block.header.number - 1
            if any(e.address.lower() in self._entry_points for e in event.block.logs):
                hashes = await store.revert_receipts(
                    self.chain, self.network, event.block.header.hash
                )
                if hashes:
                    self.stats["reverted"] += len(hashes)
                    await self._reverted(hashes)
            self._head(self.head)

    async def run(self, events: trio.abc.ReceiveChannel[ChainEvent]) -> None:
        await consume(
            events,
            self.handle,
            name="bundler receipts",
            label=self.label,
            stats=self.stats,
            log=log,
            position=self.position,
        )
