"""What a sponsorship costs at worst, in wei and in USD (sans-IO).

The worst case is what the EntryPoint makes the paymaster prefund: every gas limit the
operation declares, times ``maxFeePerGas``.  v0.7 adds the paymaster's own two limits; v0.6
has none and instead triples ``verificationGasLimit`` when a paymaster is used (it covers
validation, the paymaster's validation and postOp).  USD amounts round up: a limit is never
passed by rounding.
"""

from __future__ import annotations

from decimal import Decimal

from chaingate.aa.userop import UserOperation, Version
from chaingate.wallets.rules import USD_DECIMALS

WEI_PER_ETH = 10**18


def worst_case_gas(op: UserOperation, version: Version) -> int:
    if version == "0.6":
        return op.call_gas_limit + 3 * op.verification_gas_limit + op.pre_verification_gas
    return (
        op.call_gas_limit
        + op.verification_gas_limit
        + op.pre_verification_gas
        + op.paymaster_verification_gas_limit
        + op.paymaster_post_op_gas_limit
    )


def worst_case_wei(op: UserOperation, version: Version) -> int:
    return worst_case_gas(op, version) * op.max_fee_per_gas


def usd_rate(price: Decimal) -> int:
    """USD micros per whole coin (rounded down: the rate is the feed's, not a bound)."""
    return int(price.scaleb(USD_DECIMALS))


def wei_to_usd(wei: int, rate: int) -> int:
    """USD micros of ``wei`` at ``rate`` micros per coin, rounded up."""
    return -(-wei * rate // WEI_PER_ETH)
