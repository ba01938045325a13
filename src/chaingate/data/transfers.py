"""Sans-IO decoding of a block's logs into token transfers and metadata updates.

Recognised: the transfers of the token standards (ERC-20, ERC-721, ERC-1155 single and batch),
read by ``chaingate.evm.tokenlogs``, the one rule for their shapes; and

* ERC-4906 ``MetadataUpdate(uint256)`` / ``BatchMetadataUpdate(uint256, uint256)`` and
  ERC-1155 ``URI(string, uint256 indexed)``: not state, handed to listeners (metadata refresh).

A transfer look-alike (a transfer's topic0 with another shape, see ``tokenlogs``) is counted
in ``DecodedBlock.ignored`` and otherwise skipped: a contract that merely emits look-alike
events cannot break the index.

Every record gets ``seq``, its position in the block: a transaction's native value transfer
comes before its logs (the value moves when the call starts), logs in log order, a batch's
items in array order.  Decoding is pure: the same block always yields the same records, which
is what makes undoing a block exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from chaingate.chain.events import Block, Log
from chaingate.evm.abi import event_topic
from chaingate.evm.tokenlogs import TRANSFER, TRANSFER_BATCH, TRANSFER_SINGLE, transfer_events

Standard = Literal["native", "ERC20", "ERC721", "ERC1155"]
TOKEN_STANDARDS: tuple[Standard, ...] = ("ERC20", "ERC721", "ERC1155")

_TRANSFER_TOPICS = frozenset({TRANSFER, TRANSFER_SINGLE, TRANSFER_BATCH})
METADATA_UPDATE = event_topic("MetadataUpdate(uint256)")
BATCH_METADATA_UPDATE = event_topic("BatchMetadataUpdate(uint256,uint256)")
URI = event_topic("URI(string,uint256)")

ZERO_ADDRESS = "0x" + "00" * 20
_WORD_HEX = 64


class Transfer(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One movement of value.  Addresses are lowercase 0x-hex; ``contract`` is None for the
    native currency; ``token_id`` is None for fungible transfers; ``amount`` is 1 for ERC-721.
    Mints come from ``ZERO_ADDRESS`` and burns go to it."""

    block_number: int
    seq: int
    tx_hash: str
    tx_index: int
    log_index: int | None  # None: a native transfer (not a log)
    standard: Standard
    contract: str | None
    sender: str
    receiver: str
    token_id: int | None
    amount: int


class NativeTransfer(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A successful top-level transaction that moved native currency (see ``native``)."""

    tx_index: int
    tx_hash: str
    sender: str
    receiver: str
    value: int


class MetadataUpdate(msgspec.Struct, frozen=True):
    """Token metadata changed (ERC-4906) or an ERC-1155 id's URI was set: ids
    ``first_token..last_token`` of ``contract`` need their metadata fetched again."""

    contract: str
    first_token: int
    last_token: int
    kind: Literal["erc4906", "erc1155_uri"]
    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int


class DecodedBlock(msgspec.Struct):
    number: int
    hash: str
    parent_hash: str
    timestamp: int
    transfers: list[Transfer]
    metadata: list[MetadataUpdate]
    logs: int  # logs the block carried
    ignored: int  # logs with a transfer's topic0 but not a transfer's shape


def _word(topic: str) -> int:
    if len(topic) != 2 + _WORD_HEX:
        raise ValueError("not a 32-byte word")
    return int(topic, 16)


class _Decoder:
    """Decodes one block's logs in order, numbering the records as it goes."""

    def __init__(self, block: Block, natives: Sequence[NativeTransfer]) -> None:
        header = block.header
        self.number = header.number
        self.hash = header.hash
        self.transfers: list[Transfer] = []
        self.metadata: list[MetadataUpdate] = []
        self.ignored = 0
        self._natives = sorted(natives, key=lambda n: n.tx_index)
        self._next_native = 0
        self._position = (0, 0)  # (transaction index, log index) of the log being decoded

    def natives_up_to(self, tx_index: int) -> None:
        """Emit the native transfers of transactions up to ``tx_index`` (they precede its logs)."""
        natives = self._natives
        while self._next_native < len(natives) and natives[self._next_native].tx_index <= tx_index:
            n = natives[self._next_native]
            self._next_native += 1
            self.transfers.append(
                Transfer(
                    self.number,
                    len(self.transfers),
                    n.tx_hash,
                    n.tx_index,
                    None,
                    "native",
                    None,
                    n.sender,
                    n.receiver,
                    None,
                    n.value,
                )
            )

    def log(self, entry: Log, tx_index: int, log_index: int) -> None:
        topics = entry.topics
        if not topics or entry.removed:
            return
        self._position = (tx_index, log_index)
        topic0 = topics[0].lower()
        if topic0 in _TRANSFER_TOPICS:
            self._transfers(entry, topics)
        elif topic0 in (METADATA_UPDATE, BATCH_METADATA_UPDATE, URI):
            self._metadata(entry, topic0)

    def _add(
        self,
        entry: Log,
        standard: Standard,
        sender: str,
        receiver: str,
        token_id: int | None,
        amount: int,
    ) -> None:
        tx_index, log_index = self._position
        self.transfers.append(
            Transfer(
                self.number,
                len(self.transfers),
                entry.transaction_hash,
                tx_index,
                log_index,
                standard,
                entry.address.lower(),
                sender,
                receiver,
                token_id,
                amount,
            )
        )

    def _transfers(self, entry: Log, topics: list[str]) -> None:
        events = transfer_events(topics, entry.data)
        if events is None:
            self.ignored += 1
            return
        for event in events:
            assert event.standard is not None  # transfers always name theirs
            self._add(
                entry, event.standard, event.sender, event.receiver, event.token_id, event.amount
            )

    def _metadata(self, entry: Log, topic0: str) -> None:
        data = entry.data
        try:
            if topic0 == METADATA_UPDATE and len(entry.topics) == 1:
                first = last = _word(data)
                kind: Literal["erc4906", "erc1155_uri"] = "erc4906"
            elif topic0 == BATCH_METADATA_UPDATE and len(entry.topics) == 1:
                if len(data) != 2 + 2 * _WORD_HEX:
                    raise ValueError("BatchMetadataUpdate carries two words")
                first, last = int(data[2:66], 16), int(data[66:130], 16)
                kind = "erc4906"
            elif topic0 == URI and len(entry.topics) == 2:
                first = last = _word(entry.topics[1])
                kind = "erc1155_uri"
            else:
                return  # another event with a colliding name: not ours to count
        except ValueError:
            return
        self.metadata.append(
            MetadataUpdate(
                entry.address.lower(),
                first,
                last,
                kind,
                self.number,
                self.hash,
                entry.transaction_hash,
                self._position[1],
            )
        )


def decode_block(block: Block, natives: Sequence[NativeTransfer] = ()) -> DecodedBlock:
    """Every transfer and metadata update of ``block``, in block order (see the module doc)."""
    decoder = _Decoder(block, natives)
    for entry in block.logs:
        try:
            tx_index, log_index = int(entry.transaction_index, 16), int(entry.log_index, 16)
        except ValueError:
            decoder.ignored += 1  # a node would never send this; a proxy might
            continue
        decoder.natives_up_to(tx_index)
        decoder.log(entry, tx_index, log_index)
    decoder.natives_up_to(1 << 62)
    header = block.header
    return DecodedBlock(
        header.number,
        header.hash,
        header.parent_hash,
        header.timestamp,
        decoder.transfers,
        decoder.metadata,
        len(block.logs),
        decoder.ignored,
    )
