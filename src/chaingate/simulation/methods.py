"""The simulation methods: chaingate's names, Alchemy's names (accepted as aliases, answered
the same way, so code written for them moves by changing the URL), their params, and what
the dashboard's API reference says of each.  Priced in config/methods.toml (and, for the one
served on ``/v1/bundler`` too, config/bundler.toml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["ALIASES", "BUNDLER_METHODS", "METHODS", "REFERENCE", "Kind"]

Kind = Literal["assets", "bundle", "execution", "user_operation"]

_OWN: dict[str, Kind] = {
    "chaingate_simulateAssetChanges": "assets",
    "chaingate_simulateAssetChangesBundle": "bundle",
    "chaingate_simulateExecution": "execution",
    "chaingate_simulateUserOperationAssetChanges": "user_operation",
}
# Alchemy's name -> ours.
ALIASES: Mapping[str, str] = {name.replace("chaingate_", "alchemy_"): name for name in _OWN}
# Every name served, with what it does.
METHODS: Mapping[str, Kind] = {**_OWN, **{alias: _OWN[own] for alias, own in ALIASES.items()}}
# Served on /v1/bundler/{chain}/{network} too (where UserOperations go).
BUNDLER_METHODS = (
    "chaingate_simulateUserOperationAssetChanges",
    "alchemy_simulateUserOperationAssetChanges",
)

# (params, what it answers) for the API reference.
REFERENCE: Mapping[str, tuple[str, str]] = {
    "chaingate_simulateAssetChanges": (
        "[transaction, block?, stateOverrides?]",
        "Every change of native currency (internal transfers included), ERC-20, ERC-721 and "
        "ERC-1155 balances and approvals the transaction would make: {changes, gasUsed, "
        "error}, with each token's symbol, name, decimals and logo.",
    ),
    "chaingate_simulateAssetChangesBundle": (
        "[[transaction, ...], block?, stateOverrides?]",
        "The same for a list of transactions run in order, each seeing the previous ones' "
        "effects: one result per transaction.",
    ),
    "chaingate_simulateExecution": (
        '["FLAT" | "NESTED"?, transaction, block?, stateOverrides?]',
        "The call tree (type, from, to, value, input, output, gas, error) and the logs, "
        "decoded where the ABI is known (token standards, EntryPoint, devnet contracts).",
    ),
    "chaingate_simulateUserOperationAssetChanges": (
        "[userOperation, entryPoint, block?, stateOverrides?]",
        "A UserOperation's asset changes as the EntryPoint would run it (v0.6, v0.7, v0.8), who "
        "pays its gas (a sponsored one costs its sender nothing) and whether its signatures "
        "would pass. Also on /v1/bundler/{chain}/{network}.",
    ),
}
