"""The token standards' events, told apart by their shape: the one rule for reading them.

Recognised (topic0, topic count, data length):

* ``Transfer(address indexed, address indexed, uint256)`` — ERC-20: 3 topics, one data word;
  ERC-721 ``Transfer(address indexed, address indexed, uint256 indexed)``: 4 topics, no data
  (the same topic0: the two standards differ by the shape alone);
* ERC-1155 ``TransferSingle(operator, from, to, id, value)`` — 4 topics, two words;
  ``TransferBatch(operator, from, to, ids[], values[])`` — 4 topics, ABI-decoded with bounds;
* ``Approval(address indexed owner, address indexed spender, uint256 value)`` — ERC-20: 3
  topics, one word; ERC-721 ``Approval(owner, approved, tokenId indexed)``: 4 topics, no data;
* ``ApprovalForAll(address indexed owner, address indexed operator, bool approved)`` — ERC-721
  and ERC-1155 alike (the log cannot say which): 3 topics, one word.

A log with one of those topic0s but another shape — a topic count or data length that does not
fit, an address topic with non-zero upper bytes, a batch whose arrays differ in length or run
past the data — is a look-alike: ``None``, never a guess.  Addresses come out lowercase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from chaingate.evm.abi import AbiError, decode, event_topic

__all__ = [
    "APPROVAL",
    "APPROVAL_FOR_ALL",
    "TRANSFER",
    "TRANSFER_BATCH",
    "TRANSFER_SINGLE",
    "TokenEvent",
    "approval_events",
    "transfer_events",
]

Standard = Literal["ERC20", "ERC721", "ERC1155"]

TRANSFER = event_topic("Transfer(address,address,uint256)")
TRANSFER_SINGLE = event_topic("TransferSingle(address,address,address,uint256,uint256)")
TRANSFER_BATCH = event_topic("TransferBatch(address,address,address,uint256[],uint256[])")
APPROVAL = event_topic("Approval(address,address,uint256)")
APPROVAL_FOR_ALL = event_topic("ApprovalForAll(address,address,bool)")

_WORD_HEX = 64
_ZERO_PAD = "0" * 24  # the upper 12 bytes of an address word


class TokenEvent(NamedTuple):
    """One movement or permission.  Transfers: ``sender`` -> ``receiver`` of ``amount`` (1 for
    an ERC-721 token); approvals: the owner lets ``receiver`` spend ``amount`` (an ERC-721
    approval: ``token_id``; ApprovalForAll: 1 granted, 0 revoked, ``standard`` None)."""

    standard: Standard | None
    sender: str
    receiver: str
    token_id: int | None
    amount: int


def _address(topic: str) -> str | None:
    """The address in an indexed address topic; None when the word is not one."""
    if len(topic) != 2 + _WORD_HEX or topic[2:26] != _ZERO_PAD:
        return None
    return "0x" + topic[26:].lower()


def _word(topic: str) -> int:
    if len(topic) != 2 + _WORD_HEX:
        raise ValueError("not a 32-byte word")
    return int(topic, 16)


def _pair(topics: Sequence[str], first: int) -> tuple[str, str] | None:
    if len(topics) <= first + 1:
        return None
    sender, receiver = _address(topics[first]), _address(topics[first + 1])
    if sender is None or receiver is None:
        return None
    return sender, receiver


def _fungible_or_nft(
    topics: Sequence[str], data: str, standard_of_word: Standard
) -> TokenEvent | None:
    """Transfer's and Approval's two shapes: ERC-20 (value in data) or ERC-721 (id in topic)."""
    pair = _pair(topics, 1)
    if pair is None:
        return None
    try:
        if len(topics) == 3 and len(data) == 2 + _WORD_HEX:
            return TokenEvent(standard_of_word, *pair, None, int(data, 16))
        if len(topics) == 4 and data in ("0x", ""):
            return TokenEvent("ERC721", *pair, _word(topics[3]), 1)
    except ValueError:
        return None
    return None


def transfer_events(topics: Sequence[str], data: str) -> list[TokenEvent] | None:
    """The transfers of a log whose topic0 is ``TRANSFER``, ``TRANSFER_SINGLE`` or
    ``TRANSFER_BATCH``; None for a look-alike (see the module doc)."""
    topic0 = topics[0].lower() if topics else ""
    if topic0 == TRANSFER:
        event = _fungible_or_nft(topics, data, "ERC20")
        return None if event is None else [event]
    if len(topics) != 4:
        return None
    pair = _pair(topics, 2)
    if pair is None:
        return None
    try:
        if topic0 == TRANSFER_SINGLE:
            if len(data) != 2 + 2 * _WORD_HEX:
                return None
            token_id, value = int(data[2:66], 16), int(data[66:130], 16)
            return [TokenEvent("ERC1155", *pair, token_id, value)]
        if topic0 != TRANSFER_BATCH:
            return None
        ids, values = decode(["uint256[]", "uint256[]"], bytes.fromhex(data[2:]))
    except (ValueError, AbiError):
        return None
    if len(ids) != len(values):
        return None
    return [TokenEvent("ERC1155", *pair, i, v) for i, v in zip(ids, values, strict=True)]


def approval_events(topics: Sequence[str], data: str) -> list[TokenEvent] | None:
    """The approval of a log whose topic0 is ``APPROVAL`` or ``APPROVAL_FOR_ALL``; None for
    a look-alike."""
    topic0 = topics[0].lower() if topics else ""
    if topic0 == APPROVAL:
        event = _fungible_or_nft(topics, data, "ERC20")
        return None if event is None else [event]
    if topic0 != APPROVAL_FOR_ALL or len(topics) != 3 or len(data) != 2 + _WORD_HEX:
        return None
    pair = _pair(topics, 1)
    try:
        flag = int(data, 16)
    except ValueError:
        return None
    if pair is None or flag > 1:
        return None
    return [TokenEvent(None, *pair, None, flag)]
