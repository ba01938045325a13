"""The native currency of a chain, by chain id: its symbol and name (18 decimals on every EVM
chain).  Ether is the answer for every chain not listed: the mainnet, its testnets, the rollups
and local devnets all use it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["NATIVE_DECIMALS", "native_currency", "native_symbol"]

NATIVE_DECIMALS = 18
_ETHER = ("ETH", "Ether")
_CURRENCIES: Mapping[int, tuple[str, str]] = MappingProxyType(
    {
        56: ("BNB", "BNB"),
        97: ("BNB", "BNB"),
        100: ("XDAI", "xDAI"),
        137: ("POL", "POL"),
        80002: ("POL", "POL"),
        250: ("FTM", "Fantom"),
        43113: ("AVAX", "Avalanche"),
        43114: ("AVAX", "Avalanche"),
        42220: ("CELO", "Celo"),
        44787: ("CELO", "Celo"),
        1284: ("GLMR", "Glimmer"),
        25: ("CRO", "Cronos"),
    }
)


def native_currency(chain_id: int | None) -> tuple[str, str]:
    """(symbol, name) of the chain's native currency."""
    return _CURRENCIES.get(chain_id, _ETHER) if chain_id is not None else _ETHER


def native_symbol(chain_id: int | None) -> str:
    return native_currency(chain_id)[0]
