"""Asset changes: what a simulated transaction's events move or permit, in Alchemy's shape.

``changes_of`` (sans-IO) reads an ``Outcome``'s events in order: each native transfer, each
token transfer (ERC-20, ERC-721, ERC-1155 single and every item of a batch) and each approval
(ERC-20 ``Approval``, ERC-721 ``Approval``/``ApprovalForAll``, ERC-1155 ``ApprovalForAll``) is
one change, by the token standards' one rule (``chaingate.evm.tokenlogs``); other logs move
nothing.  ``describe`` then adds what the metadata service knows of each contract: symbol,
name, decimals (the amount scaled by them), logo.

Field meanings (``Change``): ``rawAmount`` in raw units (a transfer's amount, an allowance, 1
for an ERC-721 token or an ApprovalForAll granted and 0 revoked); ``amount`` scaled by the
decimals (null for an ERC-20 whose decimals are unknown); ``tokenId`` 0x-hex.  Addresses are
lowercase, as Alchemy answers them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import msgspec

from chaingate.evm.native import NATIVE_DECIMALS
from chaingate.evm.tokenlogs import (
    APPROVAL,
    APPROVAL_FOR_ALL,
    TRANSFER,
    TRANSFER_BATCH,
    TRANSFER_SINGLE,
    approval_events,
    transfer_events,
)
from chaingate.metadata.amounts import format_units
from chaingate.simulation.execution import EventLog, NativeMove

__all__ = ["Change", "RawChange", "TokenFacts", "changes_of", "describe"]

AssetType = Literal["NATIVE", "ERC20", "ERC721", "ERC1155"]
ChangeType = Literal["TRANSFER", "APPROVE"]

_TRANSFERS = frozenset({TRANSFER, TRANSFER_SINGLE, TRANSFER_BATCH})
_APPROVALS = frozenset({APPROVAL, APPROVAL_FOR_ALL})


class RawChange(msgspec.Struct, frozen=True):
    """A change before metadata: ``asset`` None is an ApprovalForAll (ERC-721 or ERC-1155,
    which the contract's metadata tells)."""

    asset: AssetType | None
    change: ChangeType
    sender: str
    receiver: str
    raw_amount: int
    contract: str | None
    token_id: int | None


class Change(msgspec.Struct):
    assetType: str
    changeType: str
    sender: str = msgspec.field(name="from")
    to: str = ""
    rawAmount: str = "0"
    amount: str | None = None
    contractAddress: str | None = None
    tokenId: str | None = None
    decimals: int | None = None
    symbol: str | None = None
    name: str | None = None
    logo: str | None = None


def changes_of(events: Sequence[Any]) -> list[RawChange]:
    changes: list[RawChange] = []
    for event in events:
        if isinstance(event, NativeMove):
            changes.append(
                RawChange(
                    "NATIVE", "TRANSFER", event.sender, event.receiver, event.value, None, None
                )
            )
            continue
        assert isinstance(event, EventLog)
        topic0 = event.topics[0].lower() if event.topics else ""
        if topic0 in _TRANSFERS:
            found = transfer_events(event.topics, event.data)
            kind: ChangeType = "TRANSFER"
        elif topic0 in _APPROVALS:
            found = approval_events(event.topics, event.data)
            kind = "APPROVE"
        else:
            continue
        for item in found or ():
            changes.append(
                RawChange(
                    item.standard,
                    kind,
                    item.sender,
                    item.receiver,
                    item.amount,
                    event.address,
                    item.token_id,
                )
            )
    return changes


class TokenFacts(Protocol):
    """What this package asks of the metadata service (``chaingate.metadata``)."""

    async def tokens(self, contracts: Sequence[str], *, wait: float = ...) -> Mapping[str, Any]:
        """TokenMetadata by EIP-55 contract: ``standard``, ``name``, ``symbol``, ``decimals``."""
        ...

    def logo_url(self, contract: str) -> str | None: ...


class Native(msgspec.Struct, frozen=True):
    symbol: str
    name: str


async def describe(
    raw: Sequence[RawChange], native: Native, facts: TokenFacts | None, wait: float
) -> list[Change]:
    """Each change with its token's metadata (looked up once per contract, waiting at most
    ``wait`` seconds for contracts never seen); without a metadata service, none."""
    contracts = sorted({c.contract for c in raw if c.contract is not None})
    known: dict[str, Any] = {}
    logos: dict[str, str | None] = {}
    if facts is not None and contracts:
        found = await facts.tokens(contracts, wait=wait)
        known = {address.lower(): meta for address, meta in found.items()}
        logos = {contract: facts.logo_url(contract) for contract in contracts}
    return [
        _change(c, native, known.get(c.contract or ""), logos.get(c.contract or "")) for c in raw
    ]


def _change(raw: RawChange, native: Native, meta: Any, logo: str | None) -> Change:
    if raw.contract is None:
        return Change(
            "NATIVE",
            raw.change,
            raw.sender,
            raw.receiver,
            str(raw.raw_amount),
            format_units(raw.raw_amount, NATIVE_DECIMALS),
            decimals=NATIVE_DECIMALS,
            symbol=native.symbol,
            name=native.name,
        )
    asset = raw.asset
    if asset is None:  # ApprovalForAll: the contract says which standard it follows
        asset = "ERC1155" if meta is not None and meta.standard == "ERC1155" else "ERC721"
    decimals: int | None = 0
    if asset == "ERC20":
        decimals = meta.decimals if meta is not None else None
    amount = format_units(raw.raw_amount, decimals) if decimals is not None else None
    return Change(
        asset,
        raw.change,
        raw.sender,
        raw.receiver,
        str(raw.raw_amount),
        amount,
        raw.contract,
        hex(raw.token_id) if raw.token_id is not None else None,
        decimals,
        meta.symbol if meta is not None else None,
        meta.name if meta is not None else None,
        logo,
    )
