"""Sans-IO: what transfers do to balances, holdings, supplies and the counts derived from them.

The state (rows in ``chaingate.data.store``):

* ERC-20 **balances** per (holder, contract) and, per contract, the **supply** seen minted
  minus burned and the number of **holders** (addresses with a positive balance);
* NFT **holdings** per (holder, contract, token id) — 1 for an ERC-721 owner, the quantity
  for ERC-1155; per (contract, token id) the **supply** minted minus burned and the number of
  **holders**; per (contract, holder) the number of **token ids held** (ERC-721 ``balanceOf``);
  per contract the **tokens** in existence (ids with a positive supply) and the **owners**
  (addresses holding at least one id);
* per contract: the standard first observed, the first block, transfers counted per standard.

Everything is a sum of per-transfer amounts (``effects``), or a count of positive sums — and a
count of positive sums changes exactly when a sum crosses zero (``settle``).  So applying a
batch of blocks needs the old values of the keys it touches only, in any order within the
batch, and undoing transfers is applying them with the sign flipped: the result is exactly the
state before.  Balances may go negative — a non-standard contract, or history that starts
after a contract's first mint — and are kept as they are; only positive ones make a holder.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

import msgspec

from chaingate.data.transfers import TOKEN_STANDARDS, ZERO_ADDRESS, Standard, Transfer

K = TypeVar("K")

BalanceKey = tuple[str, str]  # (holder, contract), ERC-20
HoldingKey = tuple[str, str, int]  # (holder, contract, token id), ERC-721/1155
TokenKey = tuple[str, int]  # (contract, token id)
OwnerKey = tuple[str, str]  # (contract, holder)


class ContractRow(msgspec.Struct):
    """One token contract's counters (mutable: a plan updates it in place)."""

    contract: str
    standard: Standard  # the first one observed
    first_block: int
    erc20_transfers: int = 0
    erc721_transfers: int = 0
    erc1155_transfers: int = 0
    holders: int = 0  # ERC-20: addresses with a positive balance
    supply: int = 0  # ERC-20: minted - burned
    tokens: int = 0  # NFT: token ids with a positive supply
    owners: int = 0  # NFT: addresses holding at least one token id

    def standards(self) -> list[Standard]:
        counts = (self.erc20_transfers, self.erc721_transfers, self.erc1155_transfers)
        return [s for s, n in zip(TOKEN_STANDARDS, counts, strict=True) if n > 0]


class TokenRow(msgspec.Struct, frozen=True):
    supply: int
    holders: int


class Effects(msgspec.Struct):
    """Net changes made by a set of transfers (all token standards; native ones change none)."""

    balances: dict[BalanceKey, int]
    erc20_supply: dict[str, int]
    holdings: dict[HoldingKey, int]
    token_supply: dict[TokenKey, int]
    # (contract, standard) -> transfers added (negative when undoing).
    transfers: dict[tuple[str, Standard], int]
    # contract -> (block, seq, standard) of its earliest transfer here (applying only).
    first_seen: dict[str, tuple[int, int, Standard]]


def effects(transfers: Iterable[Transfer], sign: int = 1) -> Effects:
    """Sum the transfers' changes; ``sign=-1`` gives the changes that undo them."""
    balances: defaultdict[BalanceKey, int] = defaultdict(int)
    erc20_supply: defaultdict[str, int] = defaultdict(int)
    holdings: defaultdict[HoldingKey, int] = defaultdict(int)
    token_supply: defaultdict[TokenKey, int] = defaultdict(int)
    counts: defaultdict[tuple[str, Standard], int] = defaultdict(int)
    first_seen: dict[str, tuple[int, int, Standard]] = {}
    for t in transfers:
        contract = t.contract
        if contract is None or t.standard == "native":
            continue
        amount = t.amount * sign
        counts[(contract, t.standard)] += sign
        seen = first_seen.get(contract)
        if seen is None or (t.block_number, t.seq) < seen[:2]:
            first_seen[contract] = (t.block_number, t.seq, t.standard)
        minted = t.sender == ZERO_ADDRESS
        burned = t.receiver == ZERO_ADDRESS
        if t.standard == "ERC20":
            if not minted:
                balances[(t.sender, contract)] -= amount
            if not burned:
                balances[(t.receiver, contract)] += amount
            if minted != burned:
                erc20_supply[contract] += amount if minted else -amount
            continue
        token_id = t.token_id
        assert token_id is not None  # every NFT transfer names its token
        if not minted:
            holdings[(t.sender, contract, token_id)] -= amount
        if not burned:
            holdings[(t.receiver, contract, token_id)] += amount
        if minted != burned:
            token_supply[(contract, token_id)] += amount if minted else -amount
    return Effects(
        _nonzero(balances),
        _nonzero(erc20_supply),
        _nonzero(holdings),
        _nonzero(token_supply),
        _nonzero(counts),
        first_seen,
    )


def _nonzero(sums: Mapping[K, int]) -> dict[K, int]:
    return {k: v for k, v in sums.items() if v != 0}


def settle(old: Mapping[K, int], deltas: Mapping[K, int]) -> tuple[dict[K, int], dict[K, int]]:
    """New values of the keys in ``deltas`` (absent from ``old``: 0), and for each key whose
    value crossed zero, +1 (became positive) or -1 (stopped being positive)."""
    new: dict[K, int] = {}
    crossed: dict[K, int] = {}
    for key, delta in deltas.items():
        before = old.get(key, 0)
        after = before + delta
        new[key] = after
        if (before > 0) != (after > 0):
            crossed[key] = 1 if after > 0 else -1
    return new, crossed


class StateReader(Protocol):
    """Current values of the keys a plan touches (missing keys: no row, i.e. zero)."""

    def balances(self, keys: Sequence[BalanceKey]) -> dict[BalanceKey, int]: ...

    def holdings(self, keys: Sequence[HoldingKey]) -> dict[HoldingKey, int]: ...

    def tokens(self, keys: Sequence[TokenKey]) -> dict[TokenKey, TokenRow]: ...

    def owners(self, keys: Sequence[OwnerKey]) -> dict[OwnerKey, int]: ...

    def contracts(self, addresses: Sequence[str]) -> dict[str, ContractRow]: ...


class Writes(msgspec.Struct):
    """Rows to write: new values, where zero (or a None contract) means "delete the row"."""

    balances: dict[BalanceKey, int]
    holdings: dict[HoldingKey, int]
    tokens: dict[TokenKey, TokenRow]
    owners: dict[OwnerKey, int]
    contracts: dict[str, ContractRow | None]
    new_contracts: list[ContractRow]  # first seen by this plan (for listeners)


def plan(change: Effects, state: StateReader, *, drop_above: int | None = None) -> Writes:
    """The writes that apply ``change`` to the state.  ``drop_above``: when undoing blocks
    above that number, contracts first seen there are deleted rather than updated."""
    counters: defaultdict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    balances, crossed = settle(state.balances(sorted(change.balances)), change.balances)
    for (_, contract), c in crossed.items():
        counters[contract]["holders"] += c
    for contract, delta in change.erc20_supply.items():
        counters[contract]["supply"] += delta

    holdings, crossed_holdings = settle(state.holdings(sorted(change.holdings)), change.holdings)
    held: defaultdict[OwnerKey, int] = defaultdict(int)  # token ids held, per (contract, holder)
    token_holders: defaultdict[TokenKey, int] = defaultdict(int)
    for (holder, contract, token_id), c in crossed_holdings.items():
        held[(contract, holder)] += c
        token_holders[(contract, token_id)] += c

    token_keys = sorted(set(change.token_supply) | set(token_holders))
    old_tokens = state.tokens(token_keys)
    tokens: dict[TokenKey, TokenRow] = {}
    for key in token_keys:
        before = old_tokens.get(key, TokenRow(0, 0))
        after = TokenRow(
            before.supply + change.token_supply.get(key, 0),
            before.holders + token_holders.get(key, 0),
        )
        tokens[key] = after
        if (before.supply > 0) != (after.supply > 0):
            counters[key[0]]["tokens"] += 1 if after.supply > 0 else -1

    owners, crossed_owners = settle(state.owners(sorted(held)), _nonzero(held))
    for (contract, _), c in crossed_owners.items():
        counters[contract]["owners"] += c

    for (contract, standard), n in change.transfers.items():
        counters[contract][f"{standard.lower()}_transfers"] += n

    addresses = sorted(counters.keys() | change.first_seen.keys())
    old_contracts = state.contracts(addresses)
    contracts: dict[str, ContractRow | None] = {}
    new_contracts: list[ContractRow] = []
    for address in addresses:
        row = old_contracts.get(address)
        if row is None:
            block, _, standard = change.first_seen.get(address, (0, 0, "ERC20"))
            row = ContractRow(address, standard, block)
            new_contracts.append(row)
        for name, delta in counters.get(address, {}).items():
            setattr(row, name, getattr(row, name) + delta)
        dropped = drop_above is not None and row.first_block > drop_above
        contracts[address] = None if dropped else row
    return Writes(balances, holdings, tokens, owners, contracts, new_contracts)
