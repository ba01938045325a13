"""Slots, blocks and commitments over LiteSVM: the node's state, with no I/O and no clock.

LiteSVM executes transactions against one account state and keeps no blocks.  The ledger adds
what a validator has around that: slot ``head`` is open (processed) and takes the transactions
sent now; ``advance`` closes it and opens the next with a new blockhash; confirmed and finalized
trail the head by ``confirmed_depth`` and ``finalized_depth`` slots.  Every slot records the
state its transactions overwrote (an undo log), so an account read at an older commitment sees
that slot's state.  Blocks, transactions and undo logs older than ``history`` slots are dropped.

The ledger checks what LiteSVM is told not to: signatures (a simulation may skip them), a
recent blockhash among the last ``MAX_PROCESSING_AGE`` blocks' (LiteSVM knows only its latest),
and a signature already processed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from solders.account import Account
from solders.hash import Hash
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.message import Message
from solders.pubkey import Pubkey
from solders.rpc.responses import RpcSimulateTransactionResult
from solders.signature import Signature
from solders.system_program import TransferParams, transfer
from solders.transaction import Transaction, VersionedTransaction
from solders.transaction_metadata import FailedTransactionMetadata, TransactionMetadata

from chaingate.devnet.solana import codec

Commitment = Literal["processed", "confirmed", "finalized"]
COMMITMENTS: tuple[Commitment, ...] = ("processed", "confirmed", "finalized")
MAX_PROCESSING_AGE = 150
LAMPORTS_PER_SIGNATURE = 5000
FAUCET_LAMPORTS = 10**9 * 10**9  # a billion SOL


class TransactionRefused(Exception):
    """A transaction that never reaches a block; ``err`` is Solana's TransactionError JSON."""

    def __init__(self, err: object) -> None:
        super().__init__(err)
        self.err = err


@dataclass
class Executed:
    """One transaction's outcome: what getTransaction's ``meta`` and simulation report."""

    signature: str
    tx: VersionedTransaction
    slot: int
    err: object
    logs: list[str]
    units: int
    fee: int
    pre_balances: list[int]
    post_balances: list[int]
    inner: list[dict[str, Any]]
    return_data: dict[str, Any] | None
    pre_token_balances: list[dict[str, Any]] = field(default_factory=list)
    post_token_balances: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Block:
    slot: int
    parent_slot: int
    blockhash: str
    previous_blockhash: str
    block_time: int
    block_height: int
    transactions: list[Executed] = field(default_factory=list)
    # Each account as it was before this slot first wrote it (None: it did not exist).
    undo: dict[Pubkey, Account | None] = field(default_factory=dict)


def _lamports(account: Account | None) -> int:
    return account.lamports if account is not None else 0


def error_json(err: Any) -> object:
    """Solana's JSON for a solders TransactionError (solders serialises it inside a result)."""
    result = RpcSimulateTransactionResult(err=err, logs=None, accounts=None, units_consumed=None)
    return msgspec.json.decode(result.to_json())["err"]


class Ledger:
    def __init__(
        self,
        *,
        genesis_time: float,
        confirmed_depth: int = 1,
        finalized_depth: int = 32,
        history: int = 2048,
    ) -> None:
        if not 0 <= confirmed_depth <= finalized_depth < history:
            raise ValueError("want 0 <= confirmed_depth <= finalized_depth < history")
        self.confirmed_depth = confirmed_depth
        self.finalized_depth = finalized_depth
        self.history = history
        # Signatures and blockhashes are the ledger's to check (see the module's docstring).
        self.svm = LiteSVM().with_sigverify(False).with_blockhash_check(False)
        self.faucet = Keypair()
        self.identity = Keypair().pubkey()
        self.svm.set_account(
            self.faucet.pubkey(), Account(FAUCET_LAMPORTS, b"", codec.SYSTEM_PROGRAM)
        )
        # Every account a transaction named: LiteSVM cannot list its accounts, a snapshot must.
        self.known: set[Pubkey] = {self.faucet.pubkey()}
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self.signatures: dict[str, Executed] = {}
        self.by_address: dict[Pubkey, list[str]] = {}
        self.blockhash_heights: dict[str, int] = {}
        self.transaction_count = 0
        # Told of every slot opened (pubsub.Hub), after the ledger has moved to it.
        self.observers: list[Callable[[Block], None]] = []
        self.head = -1
        self.advance(genesis_time)
        self.genesis_hash = self.blocks[0].blockhash

    # --- slots -----------------------------------------------------------------------------

    def advance(self, now: float) -> Block:
        """Close the open slot and open the next, with a new blockhash, at unix time ``now``."""
        parent = self.blocks.get(self.head)
        self.head += 1
        clock = self.svm.get_clock()
        self.svm.warp_to_slot(self.head)
        self.svm.set_clock(
            type(clock)(
                self.head,
                clock.epoch_start_timestamp,
                clock.epoch,
                clock.leader_schedule_epoch,
                int(now),
            )
        )
        self.svm.expire_blockhash()
        blockhash = str(self.svm.latest_blockhash())
        block = Block(
            slot=self.head,
            parent_slot=parent.slot if parent else 0,
            blockhash=blockhash,
            previous_blockhash=parent.blockhash if parent else blockhash,
            block_time=int(now),
            block_height=self.head,
        )
        self.blocks[self.head] = block
        self.blockhash_heights[blockhash] = block.block_height
        self._prune()
        for observer in self.observers:
            observer(block)
        return block

    def _prune(self) -> None:
        while len(self.blocks) > self.history:
            _, old = self.blocks.popitem(last=False)
            self.blockhash_heights.pop(old.blockhash, None)
            for executed in old.transactions:
                self.signatures.pop(executed.signature, None)
                for key in codec.account_keys(executed.tx):
                    listed = self.by_address.get(key)
                    if listed and listed[0] == executed.signature:
                        listed.pop(0)
                        if not listed:
                            del self.by_address[key]

    def slot(self, commitment: Commitment) -> int:
        depth = {"processed": 0, "confirmed": self.confirmed_depth}.get(
            commitment, self.finalized_depth
        )
        return max(0, self.head - depth)

    def first_available(self) -> int:
        return next(iter(self.blocks))

    def commitment_of(self, slot: int) -> Commitment:
        if slot <= self.slot("finalized"):
            return "finalized"
        return "confirmed" if slot <= self.slot("confirmed") else "processed"

    def blockhash_valid(self, blockhash: str) -> bool:
        height = self.blockhash_heights.get(blockhash)
        return height is not None and height + MAX_PROCESSING_AGE >= self.head

    def last_valid_height(self, slot: int) -> int:
        return self.blocks[slot].block_height + MAX_PROCESSING_AGE

    # --- accounts --------------------------------------------------------------------------

    def account(self, key: Pubkey, slot: int) -> Account | None:
        """``key`` as it was when slot ``slot`` closed (the open head: as it is now)."""
        account = self.svm.get_account(key)
        for later in range(self.head, slot, -1):
            block = self.blocks.get(later)
            if block is not None and key in block.undo:
                account = block.undo[key]
        if account is not None and account.lamports == 0 and not account.data:
            return None  # LiteSVM keeps emptied accounts; a validator has none
        return account

    def program_accounts(self, program: Pubkey, slot: int) -> list[tuple[Pubkey, Account]]:
        keys = {key for key, _ in self.svm.get_program_accounts(program)}
        for later in range(self.head, slot, -1):
            block = self.blocks.get(later)
            if block is not None:
                keys.update(block.undo)
        found = []
        for key in sorted(keys, key=bytes):
            account = self.account(key, slot)
            if account is not None and account.owner == program:
                found.append((key, account))
        return found

    # --- transactions ----------------------------------------------------------------------

    def check(self, tx: VersionedTransaction, *, sig_verify: bool, blockhash: bool) -> None:
        if sig_verify and not all(tx.verify_with_results()):
            raise TransactionRefused("SignatureFailure")
        if blockhash and not self.blockhash_valid(str(tx.message.recent_blockhash)):
            raise TransactionRefused("BlockhashNotFound")

    def simulate(self, tx: VersionedTransaction) -> tuple[Executed, list[Account | None]]:
        """Run ``tx`` on the current state and keep nothing; with the accounts it leaves."""
        keys = codec.account_keys(tx)
        pre = [self.svm.get_balance(key) or 0 for key in keys]
        result = self.svm.simulate_transaction(tx)
        if isinstance(result, FailedTransactionMetadata):
            return self._executed(tx, result.meta(), error_json(result.err()), pre, pre), []
        post_accounts: list[Account | None] = [account for _, account in result.post_accounts()]
        by_key = dict(result.post_accounts())
        post = [by_key[key].lamports if key in by_key else pre[i] for i, key in enumerate(keys)]
        return self._executed(tx, result.meta(), None, pre, post), post_accounts

    def execute(self, tx: VersionedTransaction) -> Executed:
        """Run ``tx`` into the open slot (failed ones too: their fee is charged)."""
        signature = str(tx.signatures[0])
        if signature in self.signatures:
            raise TransactionRefused("AlreadyProcessed")
        keys = codec.account_keys(tx)
        block = self.blocks[self.head]
        before = {key: self.svm.get_account(key) for key in keys}
        result = self.svm.send_transaction(tx)
        if isinstance(result, FailedTransactionMetadata):
            meta, err = result.meta(), error_json(result.err())
        else:
            meta, err = result, None
        payer = keys[0]
        charged = _lamports(before[payer]) != (self.svm.get_balance(payer) or 0)
        if err is not None and not charged:
            raise TransactionRefused(err)  # refused before it ran: no block holds it
        for i, key in enumerate(keys):
            if codec.is_writable(tx, i) and key not in block.undo:
                block.undo[key] = before[key]
        pre = [_lamports(before[key]) for key in keys]
        post = [self.svm.get_balance(key) or 0 for key in keys]
        executed = self._executed(tx, meta, err, pre, post)
        executed.pre_token_balances = codec.token_balances(
            [before[key] for key in keys], self._decimals
        )
        executed.post_token_balances = codec.token_balances(
            [self.svm.get_account(key) for key in keys], self._decimals
        )
        block.transactions.append(executed)
        self.signatures[signature] = executed
        self.transaction_count += 1
        for key in dict.fromkeys(keys):
            self.by_address.setdefault(key, []).append(signature)
        self.known.update(keys)
        return executed

    def _executed(
        self,
        tx: VersionedTransaction,
        meta: TransactionMetadata,
        err: Any,
        pre: list[int],
        post: list[int],
    ) -> Executed:
        inner = [
            {
                "index": index,
                "instructions": [
                    {
                        "accounts": list(ix.instruction().accounts),
                        "data": codec.b58encode(bytes(ix.instruction().data)),
                        "programIdIndex": ix.instruction().program_id_index,
                        "stackHeight": ix.stack_height(),
                    }
                    for ix in group
                ],
            }
            for index, group in enumerate(meta.inner_instructions())
            if group
        ]
        returned = meta.return_data()
        return_data = None
        if bytes(returned.data):
            return_data = {
                "programId": str(returned.program_id),
                "data": codec.encode_data(bytes(returned.data), "base64"),
            }
        return Executed(
            signature=str(tx.signatures[0]),
            tx=tx,
            slot=self.head,
            err=err,
            logs=list(meta.logs()),
            units=meta.compute_units_consumed(),
            fee=meta.fee(),
            pre_balances=pre,
            post_balances=post,
            inner=inner,
            return_data=return_data,
        )

    def _decimals(self, mint: Pubkey) -> int | None:
        account = self.svm.get_account(mint)
        if account is None or codec.token_kind(account) != "mint":
            return None
        return bytes(account.data)[44]

    def airdrop(self, to: Pubkey, lamports: int) -> Executed:
        """A transfer from the faucet, signed and sent like any transaction."""
        blockhash = Hash.from_string(self.blocks[self.head].blockhash)
        message = Message(
            [
                transfer(
                    TransferParams(
                        from_pubkey=self.faucet.pubkey(), to_pubkey=to, lamports=lamports
                    )
                )
            ],
            self.faucet.pubkey(),
        )
        tx = VersionedTransaction.from_legacy(Transaction([self.faucet], message, blockhash))
        return self.execute(tx)

    def status(self, signature: Signature) -> Executed | None:
        return self.signatures.get(str(signature))
