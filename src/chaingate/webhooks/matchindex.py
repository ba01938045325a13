"""Sans-IO matching: a block's data in, each webhook's ``Match``es out, in block order.

``MatchIndex`` is built once per set of active webhooks (they change rarely; blocks come
every few seconds).  It files each subscription under the values its filter names —
addresses, contracts, topics, transaction hashes — so a block costs a dictionary look-up per
address, contract or topic it carries, plus one check per subscription so found: 100,000
watched addresses cost a block no more than 10 do.  Only ``new_block`` webhooks are listed
whole, and each of them is a match.

What a block yields, per kind:

* ``address_activity``: per watched address involved, one match for each native transfer
  (a successful transaction's value), token transfer (ERC-20, -721, -1155), and transaction
  that moved no value (a contract interaction, or any reverted transaction: its sender still
  acted) — with ``watched`` and ``direction``.  A transfer to oneself is two matches,
  outgoing then incoming, so incoming minus outgoing stays the balance change.
  ``selectors`` keep only items of transactions whose input starts so.
* An ERC-1155 batch is one transfer per token id; an id the batch names twice, once, with
  the amounts summed (its event key could not tell the two apart).
* ``token_transfer`` / ``nft_transfer``: ERC-20 / ERC-721 and ERC-1155 transfers (mints
  and burns included: they come from or go to the zero address).
* ``mined_transaction``: the transaction, with its receipt's status and gas used.
* ``log``: each log whose address and topics fit (``eth_getLogs`` rules per position).
* ``internal_transfer``: value moved by calls below the top one (``parse_call_traces``).
* ``new_block``: the block.

A filter that constrains nothing (``parse_config`` refuses them) matches nothing.

Order: by transaction index; within one, the transaction itself, then its logs (by log
index; a batch's items in array order), then its internal transfers (a trace does not say
where among the logs a call happened); the block itself first.  Ties (one item, several
webhooks) go by webhook id, so the same block always gives the same list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from chaingate.chain.events import Block, BlockHeader, Log
from chaingate.data.nativetransfers import native_transfers, value_transactions
from chaingate.data.transfers import Transfer, decode_block
from chaingate.webhooks.filters import Filter
from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    Fact,
    InternalTransferFact,
    Kind,
    LogFact,
    Match,
    TransactionFact,
    TransferFact,
)

# The EVM's limit on nested calls: a deeper trace is no trace of a real node.
MAX_CALL_DEPTH = 1024
# Call types that move value to another account; DELEGATECALL and CALLCODE run another's
# code in the caller's own account, STATICCALL cannot carry value.
_VALUE_CALLS = frozenset({"CALL", "CREATE", "CREATE2", "SELFDESTRUCT"})
_NFT = frozenset({"ERC721", "ERC1155"})

Direction = Literal["incoming", "outgoing"]
# (transaction index, phase, position, sub-position, webhook id, direction rank)
_Key = tuple[int, int, int, int, str, int]
_BLOCK, _TX, _LOG, _INTERNAL = -1, 0, 1, 2


class Subscription(msgspec.Struct, frozen=True):
    webhook_id: str
    kind: Kind
    filter: Filter


class BlockData(msgspec.Struct, frozen=True):
    """One block as the matcher needs it; the optional parts are required where ``Needs``
    says so (and ignored otherwise)."""

    block: BlockFact
    logs: Sequence[Log]
    # Full transaction objects (``eth_getBlockByHash(hash, true)``), in block order.
    transactions: Sequence[Mapping[str, Any]] | None = None
    # Receipts by transaction hash (``eth_getBlockReceipts``).
    receipts: Mapping[str, Mapping[str, Any]] | None = None
    # Internal transfers (``parse_call_traces``).
    internal: Sequence[InternalTransferFact] | None = None


class Needs(msgspec.Struct, frozen=True):
    """What ``BlockData`` must carry beyond the logs for an index's subscriptions."""

    transactions: bool = False
    receipts: bool = False
    traces: bool = False


class _Sub:
    """A subscription with its filter as sets and integers, for checking."""

    __slots__ = (
        "addresses",
        "contracts",
        "hashes",
        "kind",
        "min_value",
        "receivers",
        "selectors",
        "senders",
        "token_ids",
        "topics",
        "webhook_id",
    )

    def __init__(self, subscription: Subscription) -> None:
        f = subscription.filter
        self.webhook_id = subscription.webhook_id
        self.kind = subscription.kind
        self.addresses = frozenset(f.addresses)
        self.contracts = frozenset(f.contracts)
        self.senders = frozenset(f.from_)
        self.receivers = frozenset(f.to)
        self.hashes = frozenset(f.transaction_hashes)
        self.min_value = int(f.min_value) if f.min_value is not None else 0
        self.selectors = frozenset(f.selectors)
        self.token_ids = frozenset(int(t) for t in f.token_ids)
        self.topics = tuple(frozenset(t) if t is not None else None for t in f.topics)

    def selector_fits(self, selector: str | None) -> bool:
        return not self.selectors or selector in self.selectors

    def transfer_fits(self, t: Transfer) -> bool:
        return (
            (not self.contracts or t.contract in self.contracts)
            and (not self.addresses or t.sender in self.addresses or t.receiver in self.addresses)
            and (not self.senders or t.sender in self.senders)
            and (not self.receivers or t.receiver in self.receivers)
            and t.amount >= self.min_value
            and (not self.token_ids or t.token_id in self.token_ids)
        )

    def log_fits(self, address: str, topics: Sequence[str]) -> bool:
        if self.addresses and address not in self.addresses:
            return False
        if len(topics) < len(self.topics):
            return False
        return all(
            want is None or got in want for want, got in zip(self.topics, topics, strict=False)
        )


_Index = dict[str, list[_Sub]]


def _file(index: dict[Any, list[_Sub]], keys: Iterable[Any], sub: _Sub) -> None:
    for key in keys:
        index.setdefault(key, []).append(sub)


class _TransferIndex:
    """ERC-20 or NFT transfer subscriptions, each filed under one of its constraints: the
    sender or receiver it names (most selective), else its parties, else its contracts."""

    def __init__(self) -> None:
        self.by_sender: _Index = {}
        self.by_receiver: _Index = {}
        self.by_party: _Index = {}
        self.by_contract: _Index = {}

    def __bool__(self) -> bool:
        return bool(self.by_sender or self.by_receiver or self.by_party or self.by_contract)

    def add(self, sub: _Sub) -> None:
        if sub.senders:
            _file(self.by_sender, sub.senders, sub)
        elif sub.receivers:
            _file(self.by_receiver, sub.receivers, sub)
        elif sub.addresses:
            _file(self.by_party, sub.addresses, sub)
        else:
            _file(self.by_contract, sub.contracts, sub)

    def candidates(self, t: Transfer) -> list[_Sub]:
        found = [
            *self.by_sender.get(t.sender, ()),
            *self.by_receiver.get(t.receiver, ()),
            *self.by_contract.get(t.contract or "", ()),
        ]
        by_sender = self.by_party.get(t.sender, ())
        by_receiver = self.by_party.get(t.receiver, ()) if t.receiver != t.sender else ()
        if by_sender and by_receiver:  # a subscription naming both parties: once
            seen = {id(s) for s in by_sender}
            by_receiver = [s for s in by_receiver if id(s) not in seen]
        found += by_sender
        found += by_receiver
        return found


class _Tx:
    """What matching reads of one transaction and its receipt, parsed once per block."""

    __slots__ = ("index", "moved", "raw", "receipt", "receiver", "selector", "sender", "tx_hash")

    def __init__(self, raw: Mapping[str, Any], receipt: Mapping[str, Any] | None) -> None:
        try:
            self.tx_hash = str(raw["hash"]).lower()
            self.index = int(raw["transactionIndex"], 16)
            self.sender = str(raw["from"]).lower()
            to = raw.get("to") or (receipt.get("contractAddress") if receipt else None)
            self.receiver = str(to).lower() if to else None
            value = int(raw["value"], 16)
            status = receipt.get("status") if receipt is not None else None
            succeeded = status is None or int(status, 16) == 1
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed transaction or receipt: {exc!r}") from None
        self.raw = raw
        self.receipt = receipt
        self.selector = _selector_of(raw)
        # A native transfer carries it (see chaingate.data.nativetransfers): else it is an
        # interaction.
        self.moved = value > 0 and succeeded


def _selector_of(tx: Mapping[str, Any]) -> str | None:
    data = tx.get("input", tx.get("data"))
    if not isinstance(data, str) or len(data) < 10:
        return None
    return data[:10].lower()


def _transaction_fact(
    raw: Mapping[str, Any], block: BlockRef | None, receipt: Mapping[str, Any] | None
) -> TransactionFact:
    try:
        to = raw.get("to")
        data = raw.get("input", raw.get("data")) or "0x"
        status = gas_used = None
        created = None
        if receipt is not None:
            status = int(receipt["status"], 16) if receipt.get("status") is not None else None
            gas_used = int(receipt["gasUsed"], 16) if receipt.get("gasUsed") is not None else None
            created = receipt.get("contractAddress")
        index = raw.get("transactionIndex")
        return TransactionFact(
            block=block,
            tx_hash=str(raw["hash"]).lower(),
            tx_index=int(index, 16) if block is not None and index is not None else None,
            sender=str(raw["from"]).lower(),
            receiver=str(to).lower() if to else None,
            value=int(raw["value"], 16),
            nonce=int(raw["nonce"], 16),
            input=str(data),
            status=status,
            gas_used=gas_used,
            contract_address=str(created).lower() if created else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed transaction or receipt: {exc!r}") from None


def _transfer_fact(block: BlockRef, t: Transfer) -> TransferFact:
    return TransferFact(
        block=block,
        tx_hash=t.tx_hash.lower(),
        tx_index=t.tx_index,
        log_index=t.log_index,
        standard=t.standard,
        contract=t.contract,
        sender=t.sender,
        receiver=t.receiver,
        token_id=t.token_id,
        amount=t.amount,
    )


class MatchIndex:
    def __init__(self, subscriptions: Iterable[Subscription]) -> None:
        self._activity: _Index = {}  # watched address -> address_activity
        self._tokens = _TransferIndex()
        self._nfts = _TransferIndex()
        self._mined: _Index = {}  # transaction hash -> mined_transaction
        self._logs_by_address: _Index = {}
        # Log subscriptions filed under a topic: by (position, topic); a log looks up each
        # of its topics (``_add_log`` says which key a subscription is filed under).
        self._logs_by_topic: dict[tuple[int, str], list[_Sub]] = {}
        self._internal: _Index = {}
        self._pending: _Index = {}
        self._blocks: list[_Sub] = []
        # (subscription, item) pairs checked, all calls together: the work done beyond one
        # look-up per item, which stays proportional to what the block involves.
        self.checked = 0
        for subscription in subscriptions:
            self._add(_Sub(subscription))
        self.needs = Needs(
            transactions=bool(self._activity or self._mined or self._internal),
            receipts=bool(self._activity or self._mined),
            traces=bool(self._internal),
        )

    @property
    def wants_pending(self) -> bool:
        """Some subscription is for pending transactions (worth polling the mempool)."""
        return bool(self._pending)

    def _add(self, sub: _Sub) -> None:
        kind = sub.kind
        if kind == "address_activity":
            _file(self._activity, sub.addresses, sub)
        elif kind == "token_transfer":
            self._tokens.add(sub)
        elif kind == "nft_transfer":
            self._nfts.add(sub)
        elif kind == "mined_transaction":
            _file(self._mined, sub.hashes, sub)
        elif kind == "log":
            self._add_log(sub)
        elif kind == "internal_transfer":
            _file(self._internal, sub.addresses, sub)
        elif kind == "pending_transaction":
            _file(self._pending, sub.addresses, sub)
        elif kind == "new_block":
            self._blocks.append(sub)

    def _add_log(self, sub: _Sub) -> None:
        """File a log subscription under one thing a log must carry to match it: an indexed
        argument (topics 1-3: an address, an id — few logs share one) where it names one,
        else the emitting contract, else the event (topic0: every such event shares it)."""
        arguments = [(len(t), i) for i, t in enumerate(sub.topics) if t is not None and i > 0]
        if arguments:
            _, position = min(arguments)
        elif sub.addresses:
            _file(self._logs_by_address, sub.addresses, sub)
            return
        elif sub.topics and sub.topics[0] is not None:
            position = 0
        else:
            return  # (parse_config refuses a filter of neither)
        topics = sub.topics[position] or ()
        _file(self._logs_by_topic, ((position, t) for t in topics), sub)

    # --- a block -------------------------------------------------------------------------

    def match_block(self, data: BlockData) -> list[Match]:
        """Every match of the block, in block order (see the module doc)."""
        ref = data.block.block
        found: list[tuple[_Key, Match]] = []
        for sub in self._blocks:
            found.append(((_BLOCK, 0, 0, 0, sub.webhook_id, 0), _match(sub, data.block)))
        txs = self._transactions(data) if self.needs.transactions else []
        if self._mined:
            self._match_mined(ref, txs, found)
        if self._activity:
            self._match_interactions(ref, txs, found)
        if self._activity or self._tokens or self._nfts:
            self._match_transfers(data, txs, found)
        if self._logs_by_address or self._logs_by_topic:
            self._match_logs(ref, data.logs, found)
        if self._internal:
            self._match_internal(data, txs, found)
        found.sort(key=lambda item: item[0])
        return [match for _, match in found]

    def _transactions(self, data: BlockData) -> list[_Tx]:
        if data.transactions is None:
            raise ValueError("these webhooks need the block's transactions; none were given")
        receipts = data.receipts if self.needs.receipts else None
        if receipts is None and self.needs.receipts:
            raise ValueError("these webhooks need the block's receipts; none were given")
        by_hash = {str(h).lower(): r for h, r in receipts.items()} if receipts is not None else {}
        txs = []
        for raw in data.transactions:
            if not isinstance(raw, Mapping):
                raise ValueError("block transactions are hashes, not objects")
            tx_hash = str(raw.get("hash")).lower()
            receipt = by_hash.get(tx_hash)
            if receipts is not None and receipt is None:
                raise ValueError(f"no receipt for transaction {tx_hash}")
            txs.append(_Tx(raw, receipt))
        return txs

    def _match_mined(
        self, ref: BlockRef, txs: Sequence[_Tx], found: list[tuple[_Key, Match]]
    ) -> None:
        for tx in txs:
            subs = self._mined.get(tx.tx_hash)
            if not subs:
                continue
            self.checked += len(subs)
            fact = _transaction_fact(tx.raw, ref, tx.receipt)
            for sub in subs:
                found.append(((tx.index, _TX, 0, 1, sub.webhook_id, 0), _match(sub, fact)))

    def _match_interactions(
        self, ref: BlockRef, txs: Sequence[_Tx], found: list[tuple[_Key, Match]]
    ) -> None:
        """Transactions that moved no value, for address_activity (those that did are
        native transfers, matched with the token transfers)."""
        for tx in txs:
            if tx.moved:
                continue
            fact: TransactionFact | None = None
            for address, direction, rank in _sides(tx.sender, tx.receiver):
                for sub in self._activity.get(address, ()):
                    self.checked += 1
                    if not sub.selector_fits(tx.selector):
                        continue
                    if fact is None:
                        fact = _transaction_fact(tx.raw, ref, tx.receipt)
                    key = (tx.index, _TX, 0, 0, sub.webhook_id, rank)
                    found.append((key, _match(sub, fact, address, direction)))

    def _match_transfers(
        self, data: BlockData, txs: Sequence[_Tx], found: list[tuple[_Key, Match]]
    ) -> None:
        ref = data.block.block
        natives = []
        if self._activity:
            body = {"transactions": [tx.raw for tx in txs]}
            receipts = {str(tx.raw["hash"]): tx.receipt or {} for tx in txs}
            natives = native_transfers(value_transactions(body), receipts)
        decoded = decode_block(_block_of(data), natives)
        selectors = {tx.tx_hash: tx.selector for tx in txs}
        for t in _one_per_token_id(decoded.transfers):
            fact: TransferFact | None = None
            position = t.log_index if t.log_index is not None else 0
            phase = _LOG if t.log_index is not None else _TX
            if self._activity:
                for address, direction, rank in _sides(t.sender, t.receiver):
                    for sub in self._activity.get(address, ()):
                        self.checked += 1
                        if not sub.selector_fits(selectors.get(t.tx_hash.lower())):
                            continue
                        fact = fact or _transfer_fact(ref, t)
                        key = (t.tx_index, phase, position, t.seq, sub.webhook_id, rank)
                        found.append((key, _match(sub, fact, address, direction)))
            if t.standard == "ERC20":
                index = self._tokens
            elif t.standard in _NFT:
                index = self._nfts
            else:
                continue  # native: address_activity's alone
            for sub in index.candidates(t):
                self.checked += 1
                if sub.transfer_fits(t):
                    fact = fact or _transfer_fact(ref, t)
                    key = (t.tx_index, phase, position, t.seq, sub.webhook_id, 0)
                    found.append((key, _match(sub, fact)))

    def _match_logs(
        self, ref: BlockRef, logs: Sequence[Log], found: list[tuple[_Key, Match]]
    ) -> None:
        by_address, by_topic = self._logs_by_address, self._logs_by_topic
        for entry in logs:
            if entry.removed:
                continue
            try:
                tx_index, log_index = int(entry.transaction_index, 16), int(entry.log_index, 16)
            except ValueError:
                continue  # as chaingate.data.transfers: a node never sends it, a proxy might
            address = entry.address.lower()
            topics = [t.lower() for t in entry.topics]
            subs = list(by_address.get(address, ()))
            if by_topic:
                for position, topic in enumerate(topics[:4]):
                    subs += by_topic.get((position, topic), ())
            fact: LogFact | None = None
            for sub in subs:
                self.checked += 1
                if not sub.log_fits(address, topics):
                    continue
                fact = fact or LogFact(
                    block=ref,
                    tx_hash=entry.transaction_hash.lower(),
                    tx_index=tx_index,
                    log_index=log_index,
                    address=address,
                    topics=tuple(topics),
                    data=entry.data,
                )
                key = (tx_index, _LOG, log_index, -1, sub.webhook_id, 0)
                found.append((key, _match(sub, fact)))

    def _match_internal(
        self, data: BlockData, txs: Sequence[_Tx], found: list[tuple[_Key, Match]]
    ) -> None:
        if data.internal is None:
            raise ValueError("these webhooks need the block's call traces; none were given")
        indexes = {tx.tx_hash: tx.index for tx in txs}
        for position, transfer in enumerate(data.internal):
            sender, receiver = transfer.sender.lower(), transfer.receiver.lower()
            subs = _either(self._internal, sender, receiver)
            if not subs:
                continue
            tx_index = indexes.get(transfer.tx_hash.lower())
            if tx_index is None:
                raise ValueError(f"internal transfer of {transfer.tx_hash}: not in the block")
            for sub in subs:
                self.checked += 1
                if transfer.value >= sub.min_value:
                    key = (tx_index, _INTERNAL, position, 0, sub.webhook_id, 0)
                    found.append((key, _match(sub, transfer)))

    # --- the mempool ---------------------------------------------------------------------

    def match_pending(self, transactions: Sequence[Mapping[str, Any]]) -> list[Match]:
        """``pending_transaction`` matches of transactions not yet mined: one per webhook and
        transaction (whichever of its addresses sends or receives), in the order given.  A
        malformed one is skipped: the mempool is anyone's to fill."""
        matches = []
        for raw in transactions:
            sender, receiver = raw.get("from"), raw.get("to")
            if not isinstance(sender, str):
                continue
            to = receiver.lower() if isinstance(receiver, str) else None
            subs = _either(self._pending, sender.lower(), to)
            if not subs:
                continue
            selector = _selector_of(raw)
            fact: TransactionFact | None = None
            for sub in sorted(subs, key=lambda s: s.webhook_id):
                self.checked += 1
                if not sub.selector_fits(selector):
                    continue
                if fact is None:
                    try:
                        fact = _transaction_fact(raw, None, None)
                    except ValueError:
                        break
                matches.append(_match(sub, fact))
        return matches


def _either(index: _Index, sender: str, receiver: str | None) -> list[_Sub]:
    """The subscriptions filed under either party, each once."""
    subs = index.get(sender, [])
    others = index.get(receiver, ()) if receiver is not None and receiver != sender else ()
    if not others:
        return subs
    if not subs:
        return list(others)
    seen = {id(s) for s in subs}
    return subs + [s for s in others if id(s) not in seen]


def _sides(sender: str, receiver: str | None) -> list[tuple[str, Direction, int]]:
    """An item's parties as address_activity sees them: outgoing first."""
    sides: list[tuple[str, Direction, int]] = [(sender, "outgoing", 0)]
    if receiver is not None:
        sides.append((receiver, "incoming", 1))
    return sides


def _match(
    sub: _Sub,
    fact: Fact,
    watched: str | None = None,
    direction: Direction | None = None,
) -> Match:
    return Match(sub.webhook_id, sub.kind, fact, watched=watched, direction=direction)


def _one_per_token_id(transfers: list[Transfer]) -> list[Transfer]:
    """An ERC-1155 batch may name an id twice.  Its events are keyed by log and token id
    (``Match.key``), which cannot tell the two apart, so they are one transfer of the sum."""
    first: dict[tuple[str, int, int | None], int] = {}
    out: list[Transfer] = []
    for t in transfers:
        if t.standard != "ERC1155" or t.log_index is None:
            out.append(t)
            continue
        key = (t.tx_hash, t.log_index, t.token_id)
        at = first.get(key)
        if at is None:
            first[key] = len(out)
            out.append(t)
        else:
            out[at] = msgspec.structs.replace(out[at], amount=out[at].amount + t.amount)
    return out


def _block_of(data: BlockData) -> Block:
    """The shape ``chaingate.data.transfers.decode_block`` reads."""
    b = data.block
    header = BlockHeader(
        number=b.block.number,
        hash=b.block.hash,
        parent_hash=b.parent_hash,
        timestamp=b.block.timestamp,
        gas_used=b.gas_used,
        gas_limit=b.gas_limit,
        base_fee_per_gas=b.base_fee_per_gas,
        transaction_count=b.transaction_count,
        fields={},
    )
    return Block(header=header, logs=list(data.logs), transactions=[])


# --- call traces -------------------------------------------------------------------------


def parse_call_traces(
    block: BlockRef, traces: object, *, tx_hashes: Sequence[str] | None = None
) -> list[InternalTransferFact]:
    """The internal transfers in ``debug_traceBlockByHash(hash, {"tracer": "callTracer"})``'s
    answer: one ``{txHash, result: frame}`` per transaction, in block order (``tx_hashes``,
    the block's, name them where a node leaves ``txHash`` out).

    An internal transfer is a call below the top one (the top one is the transaction's own
    value) that carries value to another account.  A frame that failed (``error``) moved
    nothing, nor did anything below it, however its children read.  Anything not of that
    shape raises ValueError."""
    if not isinstance(traces, list):
        raise ValueError("call traces: expected a list, one item per transaction")
    found: list[InternalTransferFact] = []
    for i, item in enumerate(traces):
        if not isinstance(item, Mapping):
            raise ValueError(f"call trace {i}: expected an object")
        tx_hash = item.get("txHash")
        if tx_hash is None and tx_hashes is not None and i < len(tx_hashes):
            tx_hash = tx_hashes[i]
        if not isinstance(tx_hash, str) or len(tx_hash) != 66:
            raise ValueError(f"call trace {i}: no transaction hash")
        top = item.get("result")
        if not isinstance(top, Mapping):
            error = str(item.get("error", "no result"))[:200]
            raise ValueError(f"call trace {i} ({tx_hash}): {error}")
        found += _internal_transfers(block, tx_hash.lower(), top)
    return found


def _internal_transfers(
    block: BlockRef, tx_hash: str, top: Mapping[str, Any]
) -> list[InternalTransferFact]:
    found: list[InternalTransferFact] = []
    if top.get("error"):
        return found  # the transaction reverted: every call in it with it
    # Depth first, children in order: the order the calls started in.  A stack rather than
    # recursion: a trace may nest 1024 deep.
    stack: list[tuple[Any, tuple[int, ...]]] = [
        (frame, (j,)) for j, frame in reversed(list(enumerate(_calls(tx_hash, top))))
    ]
    while stack:
        frame, path = stack.pop()
        if not isinstance(frame, Mapping):
            raise ValueError(f"call trace of {tx_hash}: a call is not an object")
        if len(path) > MAX_CALL_DEPTH:
            raise ValueError(f"call trace of {tx_hash}: deeper than the EVM allows")
        if frame.get("error"):
            continue
        try:
            call_type = str(frame.get("type", "")).upper()
            raw_value = frame.get("value")
            value = int(raw_value, 16) if raw_value is not None else 0
            if value > 0 and call_type in _VALUE_CALLS:
                found.append(
                    InternalTransferFact(
                        block=block,
                        tx_hash=tx_hash,
                        sender=str(frame["from"]).lower(),
                        receiver=str(frame["to"]).lower(),
                        value=value,
                        call_type=call_type,
                        trace_address=path,
                    )
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"call trace of {tx_hash} at {list(path)}: {exc!r}") from None
        children = _calls(tx_hash, frame)
        stack.extend((child, (*path, j)) for j, child in reversed(list(enumerate(children))))
    return found


def _calls(tx_hash: str, frame: Mapping[str, Any]) -> list[Any]:
    calls = frame.get("calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ValueError(f"call trace of {tx_hash}: calls is not a list")
    return calls
