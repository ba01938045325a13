"""Gas price estimates from an ``eth_feeHistory`` result: pure functions, no I/O.

The rule (docs/decisions/gas.md, "Gas prices"):

* ``eth_feeHistory`` gives, for each of the last ``history_blocks`` blocks, the priority fee
  paid at three gas-weighted reward percentiles — one per tier (slow, standard, fast);
* a block whose rewards are all zero (empty, or only zero-tip transactions) says nothing
  about competition for block space and is left out;
* a tier's priority fee is the median across the remaining blocks of its percentile (the
  upper middle value for an even count): one odd block cannot move it;
* tiers never decrease from slow to fast and none is below ``PRIORITY_FLOOR_WEI``; with no
  informative block at all every tier is the floor — or, on a chain without a base fee,
  the node's ``eth_gasPrice``;
* ``max_fee = 2 * base fee of the pending block + priority fee``: room for six full blocks in
  a row (+12.5 % each, 1.125**6 ≈ 2.03) before the transaction is priced out.

On a chain without a base fee (pre-London) the node reports the whole gas price paid as the
"reward", so the same rule yields legacy gas prices, with ``max_fee == priority``.

All amounts are integers of wei until they are formatted as exact decimal gwei strings.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

GWEI = 10**9
# No tier offers a zero tip: it is legal, but nodes commonly keep a minimum tip for their
# pools, and a tip that never propagates is worse than paying a thousandth of a gwei.
PRIORITY_FLOOR_WEI = 1_000_000
BASE_FEE_MULTIPLIER = 2
TIERS = ("slow", "standard", "fast")
# Blocks a transaction of each tier is expected to wait (close to the usual wallet promises:
# "likely in the next block" for fast, "within a few" for slow).
INCLUSION_BLOCKS = (4, 2, 1)
# What nodes accept as eth_feeHistory's block count (geth, erigon, nethermind: 1024).
MAX_HISTORY_BLOCKS = 1024

_QUANTITY = re.compile(r"0x[0-9a-fA-F]{1,64}")

Triple = tuple[int, int, int]


def parse_quantity(value: object) -> int:
    """An int from a JSON-RPC hex quantity; ValueError for anything else."""
    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
        raise ValueError(f"not a hex quantity: {str(value)[:40]!r}")
    return int(value, 16)


def check_settings(history_blocks: int, percentiles: Sequence[float]) -> None:
    """ValueError unless the settings make a valid eth_feeHistory call for three tiers."""
    if not 1 <= history_blocks <= MAX_HISTORY_BLOCKS:
        raise ValueError(f"gas.history_blocks must be between 1 and {MAX_HISTORY_BLOCKS}")
    if len(percentiles) != len(TIERS) or not all(0 <= p <= 100 for p in percentiles):
        raise ValueError("gas.percentiles must be three numbers between 0 and 100")
    # Nodes refuse percentiles that are not strictly increasing.
    if not all(a < b for a, b in itertools.pairwise(percentiles)):
        raise ValueError("gas.percentiles must be strictly increasing (slow, standard, fast)")


class _RawFeeHistory(msgspec.Struct, rename="camel"):
    oldest_block: str
    gas_used_ratio: list[float]
    base_fee_per_gas: list[str] | None = None
    reward: list[list[str]] | None = None


class FeeHistory(msgspec.Struct, frozen=True):
    """An ``eth_feeHistory`` result, quantities decoded."""

    oldest_block: int
    # One per block, then the pending block's; empty on a node that reports no base fee.
    base_fees: tuple[int, ...]
    # Per block, one reward per tier.
    rewards: tuple[Triple, ...]

    @property
    def newest_block(self) -> int:
        return self.oldest_block + len(self.rewards) - 1

    @property
    def pending_base_fee(self) -> int:
        return self.base_fees[-1] if self.base_fees else 0


def parse_fee_history(result: object) -> FeeHistory:
    """Decode and check an ``eth_feeHistory`` result; ValueError when it is malformed."""
    raw = msgspec.convert(result, _RawFeeHistory)  # ValidationError is a ValueError
    blocks = len(raw.gas_used_ratio)
    if blocks == 0:
        raise ValueError("eth_feeHistory returned no blocks")
    base_fees = tuple(parse_quantity(v) for v in raw.base_fee_per_gas or ())
    if base_fees and len(base_fees) != blocks + 1:
        raise ValueError("eth_feeHistory: baseFeePerGas must hold one more entry than blocks")
    if raw.reward is None or len(raw.reward) != blocks:
        raise ValueError("eth_feeHistory: reward must hold one row per block")
    rewards: list[Triple] = []
    for row in raw.reward:
        if len(row) != len(TIERS):
            raise ValueError("eth_feeHistory: each reward row must hold one entry per percentile")
        rewards.append((parse_quantity(row[0]), parse_quantity(row[1]), parse_quantity(row[2])))
    return FeeHistory(parse_quantity(raw.oldest_block), base_fees, tuple(rewards))


def upper_median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def reward_medians(history: FeeHistory) -> Triple | None:
    """Each tier's median reward over the blocks where someone paid a tip; None if none did."""
    rows = [row for row in history.rewards if any(row)]
    if not rows:
        return None
    return (
        upper_median([row[0] for row in rows]),
        upper_median([row[1] for row in rows]),
        upper_median([row[2] for row in rows]),
    )


def ascending_floor(values: Triple, floor: int) -> Triple:
    """At least ``floor``, and never below the tier before (a node could report anything)."""
    slow = max(values[0], floor)
    standard = max(values[1], slow)
    return slow, standard, max(values[2], standard)


def max_fee(base_fee: int, priority: int) -> int:
    return BASE_FEE_MULTIPLIER * base_fee + priority


class Fees(msgspec.Struct, frozen=True):
    """An estimate in wei, before formatting."""

    block_number: int
    base_fee: int  # of the pending block; 0 when the chain has none
    priority: Triple  # slow, standard, fast

    @property
    def max_fees(self) -> Triple:
        slow, standard, fast = self.priority
        return (
            max_fee(self.base_fee, slow),
            max_fee(self.base_fee, standard),
            max_fee(self.base_fee, fast),
        )


def needs_gas_price(history: FeeHistory) -> bool:
    """Whether ``compute_fees`` would fall back to ``eth_gasPrice`` (no base fee, no tips)."""
    return history.pending_base_fee == 0 and reward_medians(history) is None


def compute_fees(
    history: FeeHistory, *, gas_price: int | None = None, floor: int = PRIORITY_FLOOR_WEI
) -> Fees:
    base_fee = history.pending_base_fee
    observed = reward_medians(history)
    if observed is None:
        fallback = gas_price if base_fee == 0 and gas_price is not None else floor
        observed = (fallback, fallback, fallback)
    return Fees(history.newest_block, base_fee, ascending_floor(observed, floor))


def legacy_fees(block_number: int, gas_price: int, *, floor: int = PRIORITY_FLOOR_WEI) -> Fees:
    """For a node without eth_feeHistory: its eth_gasPrice for every tier."""
    return Fees(block_number, 0, ascending_floor((gas_price, gas_price, gas_price), floor))


def format_gwei(wei: int) -> str:
    """Exact decimal gwei: at most 9 decimals (1 wei), trailing zeros trimmed, never floats."""
    if wei < 0:
        raise ValueError("a fee cannot be negative")
    whole, fraction = divmod(wei, GWEI)
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction:09d}".rstrip("0")


def estimated_seconds(blocks: int, block_time: float) -> int:
    # round() first: 3 * 0.1 is 0.30000000000000004, which must not become a whole second more.
    return max(1, math.ceil(round(blocks * block_time, 6)))


def iso_utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TierEstimate(msgspec.Struct, frozen=True):
    max_fee_gwei: str
    max_priority_fee_gwei: str
    estimated_seconds: int


class Estimates(msgspec.Struct, frozen=True):
    slow: TierEstimate
    standard: TierEstimate
    fast: TierEstimate


class GasEstimate(msgspec.Struct, frozen=True):
    """The body of ``GET /v1/gas/{chain}/prices`` (the spec's "Gas price estimate")."""

    chain: str
    # Not in the spec's table: ``{chain}`` can name one of several networks, so say which.
    network: str
    block_number: int
    base_fee_gwei: str
    estimates: Estimates
    updated_at: str


def estimate(fees: Fees, *, chain: str, network: str, block_time: float, now: float) -> GasEstimate:
    tiers = [
        TierEstimate(format_gwei(cap), format_gwei(tip), estimated_seconds(blocks, block_time))
        for cap, tip, blocks in zip(fees.max_fees, fees.priority, INCLUSION_BLOCKS, strict=True)
    ]
    return GasEstimate(
        chain=chain,
        network=network,
        block_number=fees.block_number,
        base_fee_gwei=format_gwei(fees.base_fee),
        estimates=Estimates(*tiers),
        updated_at=iso_utc(now),
    )
