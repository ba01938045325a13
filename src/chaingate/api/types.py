"""Types of the REST plane's inputs: the JSON value types (``chaingate.jsonvalues``, shared
with the subsystems that parse the same values), pagination and chain names."""

from __future__ import annotations

from typing import Annotated

import msgspec

from chaingate.jsonvalues import Address as Address
from chaingate.jsonvalues import HexData as HexData
from chaingate.jsonvalues import Uint256 as Uint256
from chaingate.jsonvalues import UnixTime as UnixTime
from chaingate.jsonvalues import dec_hook as dec_hook
from chaingate.jsonvalues import enc_hook as enc_hook
from chaingate.jsonvalues import schema_hook as schema_hook

# --- pagination ------------------------------------------------------------------------------

Page = Annotated[
    int, msgspec.Meta(ge=1, le=1_000_000, description="Page number, from 1 (default 1).")
]
Limit = Annotated[int, msgspec.Meta(ge=1, le=100, description="Items per page, 1 to 100.")]


class Paged50(msgspec.Struct, forbid_unknown_fields=True):
    """``page`` and ``limit`` with the spec's default of 50 (token balances, owned NFTs)."""

    page: Page = 1
    limit: Limit = 50

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit


class Paged25(msgspec.Struct, forbid_unknown_fields=True):
    """``page`` and ``limit`` with the spec's default of 25 (wallets, webhooks)."""

    page: Page = 1
    limit: Limit = 25

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit


ChainName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$",
        description="A chain (`ethereum`: its mainnet, or its only network) or a chain and "
        "network (`ethereum-sepolia`).",
    ),
]
