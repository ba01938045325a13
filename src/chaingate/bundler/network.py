"""One network's bundler: its mempool and reputation, admission, bundling and receipts.

Every change of an operation's state is written to the store before it is acted on (an
accepted operation is stored before its hash is answered; a bundle's operations are stored
``submitted`` with the transaction's hash before the transaction is sent), so a process killed
at any point restarts with every accepted operation and never bundles one twice: on start,
operations recorded ``submitted`` are settled against the node first (mined: the follower's
receipts finish them; still pending in the node: watched; gone: back to pending).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import trio

from chaingate.aa.userop import UserOperation, Version, authorizations, handle_ops_calldata
from chaingate.bundler.admission import Admission
from chaingate.bundler.admits import GroupCommit
from chaingate.bundler.errors import INVALID_PARAMS, BundlerFault
from chaingate.bundler.estimation import AUTHORIZATION_GAS
from chaingate.bundler.mempool import Entry, Mempool, new_entry, op_gas
from chaingate.bundler.orphans import OrphanWatch
from chaingate.bundler.receiptstore import ReceiptRow
from chaingate.bundler.reputation import Reputation, ReputationChanges
from chaingate.bundler.simulation import simulate_handle_ops
from chaingate.bundler.store import BundlerRows, Intent
from chaingate.bundler.submitter import NotMined, Submitter, bundle_fees
from chaingate.bundler.tracecall import code_hashes
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.config import NetworkBundlerSettings
from chaingate.config.network import Network
from chaingate.evm import abi
from chaingate.evm.eip7702 import delegate_of
from chaingate.rpc.errors import UpstreamError
from chaingate.store import Store
from chaingate.store.base import StoreError

# methods.UNAVAILABLE's code: not available in this process now.
NOT_LEADING = -32002

log = logging.getLogger("chaingate.bundler")

# handleOps' own gas beyond its operations' limits (the loop, events, the beneficiary's pay).
BUNDLE_OVERHEAD_GAS = 50_000
PER_OP_OVERHEAD_GAS = 10_000
# How many times one bundle attempt may drop an operation named by FailedOp and try again.
MAX_DROPS_PER_BUNDLE = 32
PRUNE_INTERVAL = 600.0
FOLLOW_WAIT = 10.0


class BundlerNetwork:
    def __init__(
        self,
        key: Network,
        settings: NetworkBundlerSettings,
        client: ChainClient,
        store: Store,
        entry_points: dict[Version, str],
        mempool: Mempool,
        reputation: Reputation,
        admission: Admission,
        submitter: Submitter | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.key = key
        self.label = str(key)  # for logs
        self.chain, self.network = key.chain, key.network
        self.settings = settings
        self.client = client
        self.store = BundlerRows(store)
        self.entry_points = entry_points
        self._versions = {address.lower(): version for version, address in entry_points.items()}
        self.mempool = mempool
        self.reputation = reputation
        self.admission = admission
        self.submitter = submitter
        self.clock = clock
        self.mode = settings.mode
        # Whether this process leads the network's ``bundler`` role (chaingate.cluster): asked
        # right before a bundle transaction is signed and sent, so a process that lost the
        # role (its lease session died) does not send one the new leader sends too.
        self.leads: Callable[[], bool] = lambda: True
        # Whether other processes may lead the role (set by the service under leadership):
        # then every write that must not come from a deposed leader is fenced by ``term``,
        # and without a term nothing is bundled.
        self.fenced = False
        # The leadership term (chaingate.cluster.terms) this process serves: set once the term
        # has begun *and* its load is done, None again when the term ends.  Unfenced (one
        # process), it stays None and no fence is compared.
        self.term: int | None = None
        self.head = 0
        self._wake = trio.Event()
        self._head_moved = trio.Event()
        self._lock = trio.Lock()  # admission and bundling change the mempool one at a time
        self._admits = GroupCommit(self._lock, self.mempool, self.reputation, self._save_admits)
        self._orphans = OrphanWatch(client)  # reorged bundles the node may still mine
        self.accepted: Counter[str] = Counter()  # by entry point version
        self.rejected: Counter[int] = Counter()  # by error code
        self.bundles: Counter[str] = Counter()  # sent, mined, failed
        self.inclusion_seconds: deque[float] = deque(maxlen=1000)  # submit to inclusion
        self.eoa_balance: int | None = None  # the bundler key's, read after each bundle

    # --- chain id and entry points ---------------------------------------------------------

    @property
    def chain_id(self) -> int | None:
        """None until learned from the upstreams (no ``chain_id`` configured)."""
        return self.admission.chain_id

    def set_chain_id(self, chain_id: int) -> None:
        self.admission.chain_id = chain_id
        if self.submitter is not None:
            self.submitter.chain_id = chain_id

    def version_of(self, entry_point: object) -> Version:
        if not isinstance(entry_point, str):
            raise BundlerFault(INVALID_PARAMS, "entryPoint: expected an address")
        version = self._versions.get(entry_point.lower())
        if version is None:
            served = ", ".join(self.entry_points.values())
            raise BundlerFault(
                INVALID_PARAMS,
                f"entry point {entry_point[:42]} is not served on {self.key} (served: {served})",
            )
        return version

    # --- admission -------------------------------------------------------------------------

    async def accept(self, op: UserOperation, entry_point: str, version: Version) -> str:
        try:
            delegate = await self.delegate_on_chain(op)
            # What the mempool can refuse without validation, before any node call.
            provisional = new_entry(
                op,
                user_op_hash=self.admission.user_op_hash(op, entry_point, version, delegate),
                entry_point=entry_point,
                version=version,
                now_ms=int(self.clock() * 1000),
            )
            self.mempool.precheck(provisional)
            pending = (
                self.mempool.paymaster_pending_cost(op.paymaster, (provisional.sender, op.nonce))
                if op.paymaster is not None
                else 0
            )
            validated = await self.admission.validate(
                op,
                entry_point,
                version,
                self.head,
                paymaster_pending=pending,
                delegate=delegate,
                op_hash=provisional.hash,
            )
            # Added and committed with the operations validated beside it (one transaction
            # with the reputation they changed; a replaced one is kept, dropped: "replaced by").
            added = await self._admits.admit(
                validated.entry, paymaster_deposit=validated.paymaster_deposit
            )
        except BundlerFault as fault:
            self.rejected[fault.code] += 1
            raise
        self.accepted[version] += 1
        self._wake.set()
        return added.entry.hash

    async def delegate_on_chain(self, op: UserOperation) -> str | None:
        """The sender's EIP-7702 delegate on chain, for the hash of a v0.8 operation with the
        0x7702 initCode marker and no authorization of its own (None for any other)."""
        if not op.eip7702_init or op.eip7702_auth is not None:
            return None
        code = await self.client.call("eth_getCode", [op.sender, "latest"])
        found = delegate_of(bytes.fromhex(code[2:])) if isinstance(code, str) else None
        if found is None:
            raise BundlerFault(
                INVALID_PARAMS,
                f"userOp.factory: the EIP-7702 marker needs a delegated sender: {op.sender} is "
                "not delegated and the operation carries no eip7702Auth",
                {"field": "factory"},
            )
        return found

    async def _save_admits(self, entries: Sequence[Entry], reputation: ReputationChanges) -> None:
        await self.store.save_bundler_entries(
            self.chain, self.network, entries, reputation=reputation
        )

    async def _persist(self, entries: Sequence[Entry], term: int | None = None) -> None:
        """The new states of entries the mempool moved (what its calls returned); ``term``:
        fenced by that leadership term (a bundle's writes)."""
        if entries and not await self.store.save_bundler_entries(
            self.chain, self.network, entries, term=term
        ):
            self._fenced()

    def _current(self, term: int | None) -> None:
        """Refuses a bundle's write once its term ended in this process, or a later one began
        (the mempool is then the mirror's or that term's: not to be touched by the earlier
        one)."""
        if term is not None and term != self.term:
            self._fenced()

    def _serving(self) -> int | None:
        """The term this process's writes are fenced by now (None: unfenced, one process);
        refused while fenced and no term is served here (not begun, not loaded, or ended)."""
        if self.fenced and self.term is None:
            self._fenced()
        return self.term

    def _fenced(self) -> None:
        self.bundles["fenced"] += 1
        raise BundlerFault(
            NOT_LEADING, f"{self.key}: not this process's leadership term; not written"
        )

    async def save_reputation(self) -> None:
        changed, removed = self.reputation.take_changes()
        if changed or removed:
            await self.store.bundler_save_reputation(
                self.chain, self.network, changed, removed, int(self.reputation.decayed_at * 1000)
            )

    async def clear(self, *, mempool: bool, reputation: bool) -> None:
        """debug_bundler_clear*: the pending operations dropped, the reputation forgotten."""
        async with self._lock:
            if mempool:
                dropped = self.mempool.clear()
                await self._persist(dropped)
            if reputation:
                self.reputation.clear()
                self.reputation.take_changes()
                await self.store.bundler_clear_reputation(self.chain, self.network)

    # --- starting --------------------------------------------------------------------------

    async def load(self, term: int | None = None) -> None:
        """The mempool and reputation as the store kept them; bundles in flight settled, their
        writes fenced by ``term`` (the leadership term this load begins; None: one process).
        The term is served from then on."""
        self.term = None
        entries = await self.store.bundler_live(self.chain, self.network)
        self.mempool.load(entries)
        reputation, decayed_ms = await self.store.bundler_load_reputation(self.chain, self.network)
        self.reputation.load(reputation, decayed_ms / 1000 if decayed_ms is not None else None)
        in_flight: dict[str, list[Entry]] = {}
        for entry in self.mempool.entries():
            if entry.status == "submitted" and entry.bundle_tx:
                in_flight.setdefault(entry.bundle_tx, []).append(entry)
        for bundle_tx, group in in_flight.items():
            await self._settle_unfinished(bundle_tx, group, term)
        self.term = term

    async def pick_up(self) -> int:
        """Operations other processes accepted (they keep them in the store), into this
        leader's mempool, which takes each one once; how many were taken.  Read and taken
        under the lock every change of the mempool and its rows holds: an operation this
        process finished (included by the follower, failed, dropped) while a read was on its
        way would come back live from the read's stale row, and stay — or be bundled again."""
        async with self._lock:
            live = await self.store.bundler_live(self.chain, self.network)
            return self.mempool.load(live)

    async def _settle_unfinished(
        self, bundle_tx: str, group: list[Entry], term: int | None
    ) -> None:
        """A bundle sent before a restart: mined (the follower's receipts will include its
        operations), still known to the node (left submitted, watched: pending again if the
        node drops it), or gone (its operations are pending again)."""
        if await self.client.call("eth_getTransactionReceipt", [bundle_tx]):
            return
        if await self.client.call("eth_getTransactionByHash", [bundle_tx]):
            self._orphans.watch(bundle_tx)  # pending: back to pending if the node drops it
            return
        if await self._finish_recorded(bundle_tx):
            return
        # Another copy (a fee bump, or the one before it) may have been mined: an operation
        # whose nonce the EntryPoint has used waits, submitted, for the follower's receipt.
        lost = [e.hash for e in group if not await self._nonce_used(e)]
        back = self.mempool.requeue(lost, "bundle lost in a restart")
        # Fenced: a leader deposed during its own load must not put back to pending what the
        # next leader has recorded submitted since.
        await self._persist(back, term)

    async def _finish_recorded(self, bundle_tx: str) -> bool:
        """A bundle transaction recorded but unknown to the node — its sender died or was
        deposed before, or while, sending it; its request may still be on its way — is sent
        again, the same bytes: whichever copy arrives, the nonce is used once and the
        operations are bundled once.  False when there is no record, or its nonce was used
        by another transaction meanwhile."""
        if self.submitter is None:
            return False
        intent = await self.store.bundler_intent(self.chain, self.network, bundle_tx)
        if intent is None:
            return False
        used = await self.client.call("eth_getTransactionCount", [self.submitter.address, "latest"])
        if int(used, 16) > intent.nonce:
            return False
        try:
            await self.submitter.send_raw(intent.raw)
        except (RpcCallError, UpstreamError) as exc:
            log.warning(
                "a recorded bundle transaction could not be sent again",
                extra={"fields": {"network": self.label, "tx": bundle_tx, "error": str(exc)}},
            )
            return False
        self.bundles["finished"] += 1
        log.info(
            "a bundle transaction recorded by an earlier term, sent again as recorded",
            extra={"fields": {"network": self.label, "tx": bundle_tx, "term": intent.term}},
        )
        return True

    async def _nonce_used(self, entry: Entry) -> bool:
        """Whether the EntryPoint has consumed ``entry``'s nonce (it, or another operation
        with its nonce, was included)."""
        data = abi.encode_call("getNonce(address,uint192)", entry.op.sender, entry.nonce >> 64)
        answer = await self.client.call(
            "eth_call", [{"to": entry.entry_point, "data": "0x" + data.hex()}, "latest"]
        )
        return int(answer, 16) > entry.nonce

    # --- receipts (the follower) -----------------------------------------------------------

    async def included(self, rows: Sequence[ReceiptRow]) -> None:
        async with self._lock:
            changed: list[Entry] = []
            now = self.clock()
            for row in rows:
                done, stale = self.mempool.mark_included(
                    row.user_op_hash,
                    block_number=row.block_number,
                    block_hash=row.block_hash,
                    tx_hash=row.tx_hash,
                )
                if done is not None:
                    changed.append(done)
                    waited = now - done.submitted_at / 1000
                    self.inclusion_seconds.append(waited)
                changed.extend(stale)
            if changed:
                await self._persist(changed)
                await self.save_reputation()
        if self.mempool.has_pending():
            self._wake.set()

    async def reverted(self, hashes: Sequence[str]) -> None:
        """Operations whose block was orphaned: submitted still, under their bundle
        transaction, while the node has it (``chaingate.bundler.orphans``); else pending
        again, to be bundled again."""
        async with self._lock:
            self._serving()  # a deposed term puts nothing back
            found: list[Entry] = []
            for user_op_hash in hashes:
                entry = self.mempool.included(user_op_hash)
                if entry is None:
                    entry = await self.store.bundler_get(self.chain, self.network, user_op_hash)
                if entry is not None and entry.status == "included":
                    found.append(entry)
        sent = await self._orphans.known(e.bundle_tx for e in found if e.bundle_tx)
        async with self._lock:
            term = self._serving()
            back: list[Entry] = []
            for entry in found:
                still_sent = entry.bundle_tx in sent
                restored = self.mempool.revert_inclusion(
                    entry.hash, still_sent=still_sent
                ) or self.mempool.restore(entry, still_sent=still_sent)
                if restored is not None:
                    back.append(restored)
            if back:
                await self._persist(back, term)
        if back:
            log.info(
                "operations of an orphaned block are back in the mempool",
                extra={
                    "fields": {
                        "network": self.label,
                        "count": len(back),
                        "still_sent": sum(e.status == "submitted" for e in back),
                    }
                },
            )
            self._wake.set()

    async def _requeue_orphans(self) -> None:
        """The operations of reorged bundle transactions the node has since dropped: pending
        again."""
        for tx in await self._orphans.gone():
            async with self._lock:
                term = self._serving()
                left = [
                    e.hash
                    for e in self.mempool.entries()
                    if e.status == "submitted" and e.bundle_tx == tx
                ]
                back = self.mempool.requeue(left, "bundle transaction dropped after a reorg")
                await self._persist(back, term)
            if back:
                self._wake.set()

    def on_head(self, number: int) -> None:
        self.head = max(self.head, number)
        self._head_moved.set()
        self._head_moved = trio.Event()
        if self.mempool.has_pending():
            self._wake.set()

    async def _followed_to(self, block_number: int) -> None:
        """Until the follower has applied ``block_number`` (its receipts are in), at most
        FOLLOW_WAIT seconds: a bundle's operations are then included, not still submitted."""
        with trio.move_on_after(FOLLOW_WAIT):
            while self.head < block_number:
                await self._head_moved.wait()

    # --- bundling --------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._bundle_loop)
            nursery.start_soon(self._prune_loop)

    async def _bundle_loop(self) -> None:
        """``auto``: a bundle when woken (a new operation, a new head) or every interval while
        operations wait.  ``manual``: only ``send_bundle_now``."""
        if self.submitter is not None:
            with contextlib.suppress(RpcCallError, UpstreamError):
                self.eoa_balance = await self.submitter.balance()
        while True:
            with trio.move_on_after(self.settings.bundle_interval):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                if self._orphans:
                    await self._requeue_orphans()
                if self.mode != "auto" or self.submitter is None or not self.mempool.has_pending():
                    continue
                await self.bundle_once()
            except (RpcCallError, UpstreamError, NotMined, BundlerFault) as exc:
                self.bundles["failed"] += 1
                log.warning(
                    "bundle attempt failed",
                    extra={"fields": {"network": self.label, "error": str(exc)}},
                )
                await trio.sleep(self.settings.bundle_interval)  # not a busy loop
            except Exception:
                # A bug must not take the gateway down with the bundler: logged, retried.
                self.bundles["failed"] += 1
                log.exception("bundle attempt failed", extra={"fields": {"network": self.label}})
                await trio.sleep(self.settings.bundle_interval)

    def _still_leading(self) -> None:
        if not self.leads():
            self.bundles["not_leading"] += 1
            raise BundlerFault(
                NOT_LEADING, f"{self.key}: another process leads this network's bundler now"
            )
        if self.fenced and self.term is None:
            # The lease is held but its term has not begun, or its mempool not loaded yet:
            # what the mirror holds may be a second stale, and a write would not be fenced.
            self.bundles["not_leading"] += 1
            raise BundlerFault(
                NOT_LEADING, f"{self.key}: this process's bundler term has not begun yet"
            )

    async def _prune_loop(self) -> None:
        """Finished operations are kept ``keep_finished`` for lookups, then deleted."""
        while True:
            await trio.sleep(PRUNE_INTERVAL)
            before_ms = int((self.clock() - self.settings.keep_finished) * 1000)
            with contextlib.suppress(StoreError):
                await self.store.bundler_prune(self.chain, self.network, before_ms)

    async def bundle_once(self) -> dict[str, Any] | None:
        """Build, check, send one bundle and wait until it is mined; None when nothing waits.
        Returns what debug_bundler_sendBundleNow answers."""
        if self.submitter is None:
            raise BundlerFault(INVALID_PARAMS, f"{self.key}: no bundler key is configured")
        async with self.submitter.lock:
            # Every write of this bundle is fenced by the term it began in: once that term
            # ended, or a later one began (here or in another process), it writes and sends
            # nothing more.  Under leadership, no bundle before the term is served.
            self._still_leading()
            term = self.term
            prepared = await self._prepare_bundle(term)
            if prepared is None:
                return None
            entries, entry_point, version, gas, fees = prepared
            calldata = handle_ops_calldata([e.op for e in entries], self._beneficiary(), version)
            nonce = await self.submitter.next_nonce()
            self._still_leading()
            auths = authorizations([e.op for e in entries])
            raw, bundle_tx = self.submitter.sign(entry_point, calldata, gas, fees, nonce, auths)
            hashes = [e.hash for e in entries]
            # The signed transaction and its operations' new state are recorded first, fenced
            # by this leader's term: a leader deposed meanwhile records nothing and sends
            # nothing; a later leader finds the record and sends these same bytes (never a
            # second bundle of these operations) if the node does not know them.
            await self._record(hashes, Intent(bundle_tx, nonce, raw, term or 0), term)
            self._still_leading()
            try:
                await self.submitter.send_raw(raw)
            except (RpcCallError, UpstreamError):
                await self._requeue(entries, "the node refused the bundle transaction", term)
                raise
            self.bundles["sent"] += 1

            async def record_copy(copy: str, copy_raw: bytes) -> None:
                # A fee bump's copy is recorded before it is sent, like the first one.
                self._still_leading()
                await self._record(hashes, Intent(copy, nonce, copy_raw, term or 0), term)

            try:
                mined = await self.submitter.wait_mined(
                    bundle_tx,
                    nonce,
                    entry_point,
                    calldata,
                    gas,
                    fees,
                    auths,
                    before_resend=record_copy,
                )
            except NotMined:
                await self._requeue(entries, "bundle transaction not mined", term)
                raise
            if mined.tx_hash != bundle_tx:  # a fee bump's copy was mined
                async with self._lock:
                    self._current(term)
                    moved = self.mempool.mark_submitted([e.hash for e in entries], mined.tx_hash)
                    await self._persist(moved, term)
            self.bundles["mined" if mined.status else "reverted"] += 1
            self.eoa_balance = await self.submitter.balance()
            await self._followed_to(mined.block_number)
            if not mined.status:
                # handleOps reverted on chain though the same call passed just before: the
                # state moved in between.  Its operations are validated again next round.
                await self._requeue(entries, "bundle transaction reverted", term)
            return {
                "transactionHash": mined.tx_hash,
                "blockNumber": hex(mined.block_number),
                "blockHash": mined.block_hash,
                "userOpHashes": [e.hash for e in entries],
                "status": "0x1" if mined.status else "0x0",
            }

    async def _record(self, hashes: list[str], intent: Intent, term: int | None) -> None:
        """``intent`` and its operations ``submitted`` under its hash, in the store (fenced
        by ``term`` when other processes may lead), then in the mempool."""
        async with self._lock:
            self._current(term)
            submitted = self.mempool.mark_submitted(hashes, intent.tx_hash)
            if not await self.store.record_submission(
                self.chain, self.network, submitted, intent, fenced=self.fenced or term is not None
            ):
                # The mempool is the store's again when this process leads next.
                self._fenced()

    def _beneficiary(self) -> str:
        assert self.submitter is not None
        return self.settings.beneficiary or self.submitter.address

    async def _requeue(
        self, entries: Sequence[Entry], reason: str, term: int | None = None
    ) -> None:
        async with self._lock:
            self._current(term)
            back = self.mempool.requeue([e.hash for e in entries], reason)
            await self._persist(back, term)

    async def _prepare_bundle(
        self, term: int | None
    ) -> tuple[list[Entry], str, Version, int, Any] | None:
        """The operations of the next bundle (one entry point's), checked together by
        handleOps' eth_call: an operation a FailedOp names is dropped (and its entity
        penalised as ERC-7562 says) and the rest checked again."""
        assert self.submitter is not None
        base_fee, tip = await self.submitter.current_fees()
        for version, entry_point in self.entry_points.items():
            async with self._lock:
                selection = self.mempool.select_bundle(
                    base_fee=base_fee,
                    max_gas=self.settings.max_bundle_gas,
                    max_ops=self.settings.max_bundle_ops,
                    entry_point=entry_point,
                    block_number=self.head,
                )
                if selection.dropped:
                    self._current(term)
                    await self._persist(list(selection.dropped), term)
            entries = list(selection.entries)
            entries = await self._drop_changed_code(entries, term)
            for _ in range(MAX_DROPS_PER_BUNDLE):
                if not entries:
                    break
                try:
                    failed = await simulate_handle_ops(
                        self.client,
                        [e.op for e in entries],
                        entry_point,
                        version,
                        self._beneficiary(),
                        sender=self.submitter.address,
                    )
                except BundlerFault as fault:
                    # handleOps reverted without naming an operation: each is tried alone.
                    entries = await self._alone(entries, entry_point, version, fault.message, term)
                    continue
                if failed is None:
                    break
                if not 0 <= failed.index < len(entries):
                    raise BundlerFault(INVALID_PARAMS, f"FailedOp names index {failed.index}")
                culprit = entries.pop(failed.index)
                await self._fail(culprit, failed.reason, term)
            else:
                entries = []
            if not entries:
                continue
            fees = bundle_fees(
                base_fee,
                tip,
                [(e.max_fee_per_gas, e.max_priority_fee_per_gas) for e in entries],
            )
            if fees is None:
                continue
            gas = await self._bundle_gas(entries, entry_point, version)
            return entries, entry_point, version, gas, fees
        return None

    async def _bundle_gas(self, entries: list[Entry], entry_point: str, version: Version) -> int:
        """The bundle transaction's gas limit: the node's estimate + 20%, and never less than
        the operations' own limits (the EntryPoint reserves an operation's verification gas
        again when it executes it (AA95), so a limit near the sum of the limits reverts) — but
        never more than a block holds."""
        assert self.submitter is not None
        calldata = handle_ops_calldata([e.op for e in entries], self._beneficiary(), version)
        tx: dict[str, Any] = {
            "from": self.submitter.address,
            "to": entry_point,
            "data": "0x" + calldata.hex(),
        }
        auths = authorizations([e.op for e in entries])
        if auths:
            tx["authorizationList"] = [a.json() for a in auths]
        estimate = int(await self.client.call("eth_estimateGas", [tx]), 16)
        limits = (
            BUNDLE_OVERHEAD_GAS
            + sum(op_gas(e) + PER_OP_OVERHEAD_GAS for e in entries)
            + AUTHORIZATION_GAS * len(auths)
        )
        gas = max(estimate * 6 // 5, limits)
        # The limits of operations selected by their expected gas may sum past a block.
        return min(gas, self.submitter.block_gas_limit or gas)

    async def _alone(
        self, entries: list[Entry], entry_point: str, version: Version, why: str, term: int | None
    ) -> list[Entry]:
        """The operations that pass handleOps on their own (the others fail with ``why``)."""
        assert self.submitter is not None
        kept = []
        for entry in entries:
            try:
                failed = await simulate_handle_ops(
                    self.client,
                    [entry.op],
                    entry_point,
                    version,
                    self._beneficiary(),
                    sender=self.submitter.address,
                )
            except BundlerFault as fault:
                await self._fail(entry, fault.message, term)
                continue
            if failed is None:
                kept.append(entry)
            else:
                await self._fail(entry, failed.reason or why, term)
        return kept

    async def _fail(self, entry: Entry, reason: str, term: int | None) -> None:
        """An operation handleOps refused after it passed validation: failed, and the entity
        to blame is penalised (ERC-7562: the paymaster for AA3x, the factory for AA1x, else
        a staked factory — accountable for the accounts it deploys, EREP-020 — or the account
        when staked); a paymaster not to blame gets back the ``opsSeen`` this operation gave
        it (EREP-015).  One whose nonce the EntryPoint has used meanwhile was included
        elsewhere (another bundler, a copy mined before a restart): dropped, nobody blamed —
        a receipt, if it is ours, makes it ``included``."""
        if reason[:4] in ("AA25", "AA10") and await self._nonce_used(entry):
            async with self._lock:
                self._current(term)
                await self._persist(
                    [e for e in [self.mempool.drop(entry.hash, "nonce used on chain")] if e], term
                )
            return
        async with self._lock:
            self._current(term)
            done = self.mempool.mark_failed(entry.hash, reason)
            blamed = self._to_blame(entry, reason)
            if blamed is not None:
                self.reputation.crashed_handle_ops(blamed)
            if entry.paymaster is not None and blamed != entry.paymaster:
                self.reputation.seen(entry.paymaster, -1)  # EREP-015
            if done is not None:
                await self._persist([done], term)
            await self.save_reputation()
        log.info(
            "operation dropped from a bundle",
            extra={"fields": {"network": self.label, "userOpHash": entry.hash, "reason": reason}},
        )

    def _to_blame(self, entry: Entry, reason: str) -> str | None:
        head = reason[:4]
        if head.startswith("AA3"):
            return entry.paymaster
        if head.startswith("AA1"):
            return entry.factory
        staked = self.reputation.is_staked
        factory = entry.factory_stake
        if entry.factory is not None and staked(factory.stake, factory.unstake_delay_sec):
            return entry.factory  # EREP-020
        sender = entry.sender_stake
        return entry.sender if staked(sender.stake, sender.unstake_delay_sec) else None

    async def _drop_changed_code(self, entries: list[Entry], term: int | None) -> list[Entry]:
        """Safe mode: an operation whose validation touched code that changed since (a
        contract destroyed or deployed at an address it read) is dropped."""
        addresses = {a for e in entries for a, _ in e.code_hashes}
        if not addresses:
            return entries
        now = await code_hashes(self.client, addresses)
        kept = []
        for e in entries:
            if all(now.get(a, h) == h for a, h in e.code_hashes):
                kept.append(e)
            else:
                await self._fail(e, "code accessed during validation changed", term)
        return kept
