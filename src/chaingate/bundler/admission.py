"""Admission of one user operation: reputation, sanity, simulation (traced in safe mode),
ERC-7562 rules, then the mempool.  The order is the cheap checks first: a client's mistake is
answered without a node call where possible (``BundlerNetwork.accept`` runs the mempool's own
``precheck`` before this), and a full trace runs only for an operation that could be accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from chaingate.aa.userop import UserOperation, Version, user_op_hash
from chaingate.bundler import sanity
from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.mempool import Entry, Stake, new_entry
from chaingate.bundler.reputation import Reputation, Title
from chaingate.bundler.safemode import validate_safe
from chaingate.bundler.simulation import (
    NodeClient,
    StakeInfo,
    ValidationResult,
    simulate_validation,
)
from chaingate.bundler.tracecall import code_hashes


class Validated(msgspec.Struct, frozen=True):
    entry: Entry
    result: ValidationResult
    paymaster_deposit: int | None = None  # as sanity read it: EREP-010 again in the mempool


def _stake(info: StakeInfo) -> Stake:
    return Stake(stake=info.stake, unstake_delay_sec=info.unstake_delay_sec)


class Admission:
    """Validates operations for one network."""

    def __init__(
        self,
        client: NodeClient,
        chain_id: int | None,
        reputation: Reputation,
        limits: sanity.SanityLimits,
        *,
        safe_mode: bool,
        simulations_code: bytes | None,
        min_valid_for: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.chain_id = chain_id
        self.reputation = reputation
        self.limits = limits
        self.safe_mode = safe_mode
        self.simulations_code = simulations_code
        self.min_valid_for = min_valid_for
        self.clock = clock

    def user_op_hash(
        self, op: UserOperation, entry_point: str, version: Version, delegate: str | None = None
    ) -> str:
        """``delegate``: the sender's EIP-7702 delegate on chain, for a v0.8 operation with the
        0x7702 initCode marker and no authorization (its hash stands for it)."""
        digest = user_op_hash(
            op, entry_point=entry_point, chain_id=self._chain(), version=version, delegate=delegate
        )
        return "0x" + digest.hex()

    def _chain(self) -> int:
        if self.chain_id is None:
            raise RuntimeError("the chain id is not known yet")  # the methods wait for it
        return self.chain_id

    async def validate(
        self,
        op: UserOperation,
        entry_point: str,
        version: Version,
        head: int,
        *,
        paymaster_pending: int = 0,
        delegate: str | None = None,
        op_hash: str | None = None,
    ) -> Validated:
        """The entry to add, or a BundlerFault naming what failed.  ``paymaster_pending``:
        what the paymaster's operations in the mempool can cost at most (EREP-010).
        ``op_hash``: ``user_op_hash(op, entry_point, version, delegate)`` if the caller has it
        (two keccaks of the packed operation, not worth doing twice)."""
        factory = op.factory if op.deploys else None
        entities: tuple[tuple[Title, str | None], ...] = (
            ("factory", factory),
            ("paymaster", op.paymaster),
        )
        for title, address in entities:
            self.reputation.check_entity(title, address)
        checked = await sanity.check(
            self.client,
            op,
            entry_point,
            version,
            self.limits,
            chain_id=self._chain(),
            paymaster_pending=paymaster_pending,
        )
        now = int(self.clock())
        if self.safe_mode:
            result, outcome = await validate_safe(
                self.client,
                op,
                entry_point,
                version,
                self.simulations_code,
                now=now,
                min_valid_seconds=self.min_valid_for,
                is_staked=lambda info: self.reputation.is_staked(
                    info.stake, info.unstake_delay_sec
                ),
                block=checked.block,
            )
            code_hashes = tuple(sorted((await self._delegated(op, outcome.code_hashes)).items()))
            storage = outcome.storage
        else:
            result = await simulate_validation(
                self.client,
                op,
                entry_point,
                version,
                self.simulations_code,
                now=now,
                min_valid_seconds=self.min_valid_for,
            )
            code_hashes, storage = (), ()
        entry = new_entry(
            op,
            user_op_hash=op_hash or self.user_op_hash(op, entry_point, version, delegate),
            entry_point=entry_point,
            version=version,
            now_ms=int(self.clock() * 1000),
            sender_stake=_stake(result.sender),
            factory_stake=_stake(result.factory),
            paymaster_stake=_stake(result.paymaster),
            valid_after=result.valid_after,
            valid_until=result.valid_until,
            prefund=result.prefund,
            pre_op_gas=result.pre_op_gas,
            code_hashes=code_hashes,
            storage=storage,
            accepted_block=head,
        )
        return Validated(entry, result, checked.paymaster_deposit)

    async def _delegated(self, op: UserOperation, hashes: dict[str, str]) -> dict[str, str]:
        """The code hashes bundling checks again.  An EIP-7702 sender whose authorization the
        bundle carries has its designator only in the simulation (the chain gets it from the
        bundle itself): its delegate's code stands in for it — the account's code, which
        must not change before the bundle."""
        if op.eip7702_auth is None:
            return hashes
        kept = {a: h for a, h in hashes.items() if a != op.sender.lower()}
        kept.update(await code_hashes(self.client, [op.eip7702_auth.address]))
        return kept


__all__ = ["Admission", "BundlerFault", "Validated"]
