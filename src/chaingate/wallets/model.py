"""What the wallet subsystem hands its callers (the REST plane, the ERC-7677 methods): its
outcomes and refusals, and whose records a caller reaches."""

from __future__ import annotations

import msgspec

from chaingate.aa.userop import UserOperation, Version
from chaingate.wallets.rules import Refusal


class PolicyRefused(Exception):
    def __init__(self, policy_id: str, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.policy_id = policy_id
        self.refusal = refusal


class InvalidOperation(ValueError):
    """The operation (or what it names) cannot be sponsored as sent; for the client."""


class LimitReached(Exception):
    """An account holds as many wallets or policies as its network allows."""


class Sponsored(msgspec.Struct, frozen=True):
    op: UserOperation  # with the paymaster fields (and initCode from our records) filled in
    version: Version
    entry_point: str
    paymaster: str
    user_op_hash: str
    valid_until: int
    valid_after: int
    usd: int | None  # worst case, USD micros (None: no price and no USD rule)
    sponsorship_id: str
    init_code_filled: bool


class Evaluation(msgspec.Struct, frozen=True):
    refusal: Refusal | None
    usd: int | None
    version: Version | None  # None: refused before the version mattered


# With API keys off (a closed network), every caller is this one account.
LOCAL_ACCOUNT = "local"
# The scope that lets a key spend a gas policy's budget, at both doors: REST
# ``POST /v1/gas/sponsor`` and ERC-7677's ``pm_*`` on the bundler path.
SPONSOR_SCOPE = "gas:manage"


def account_of(principal: object) -> str:
    """Whose wallets and policies a caller reaches: its key's account."""
    account = getattr(principal, "account_id", None) if principal is not None else None
    return str(account) if account else LOCAL_ACCOUNT
