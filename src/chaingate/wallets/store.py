"""The wallet subsystem's rows: wallets, their deployments, gas policies and sponsorships.

Addresses and hashes are stored lowercase.  A reservation is one transaction that first
bumps its policy's ``reservations`` counter — an UPDATE, so PostgreSQL holds the policy's row
lock until commit and SQLite's BEGIN IMMEDIATE already serialises writers — then reads the
policy's counts, asks the caller's ``decide`` and inserts the sponsorship: concurrent
requests of one policy, from any number of processes, each see the ones before them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from chaingate.store.base import register_network_columns, register_network_table
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

WALLET_TABLES = ("wallet_deployments", "wallet_delegations")
# A sponsorship is the account's record; only its settlement came from the chain.
WALLET_SETTLEMENT_COLUMNS = (
    "sponsorships",
    "settled_block",
    "settled_block_hash",
    "settled_tx",
    "actual_wei",
    "actual_usd",
    "success",
)


class WalletRow(msgspec.Struct, kw_only=True):
    chain: str
    network: str
    address: str
    account_id: str
    owner: str
    salt: str
    version: str
    factory: str  # an EIP-7702 wallet's: the code it delegates to
    created_at: int
    kind: str = "simple"  # or "eip7702": the owner's own address, delegated
    # From wallet_deployments (an EIP-7702 wallet: its latest delegation, when to its code),
    # when the follower has seen the wallet deployed.
    deployed_block: int | None = None
    deploy_tx: str | None = None
    deployed_at: int | None = None


class Deployment(msgspec.Struct, frozen=True):
    address: str
    block_number: int
    block_hash: str
    tx_hash: str
    deployed_at: int


class Delegation(msgspec.Struct, frozen=True):
    """An EIP-7702 wallet's delegation as a block left it (the zero address: cleared)."""

    address: str
    block_number: int
    block_hash: str
    tx_hash: str
    delegate: str
    set_at: int


class PolicyRow(msgspec.Struct, kw_only=True):
    id: str
    account_id: str
    name: str
    chain: str
    network: str
    chain_label: str
    rules: str  # JSON
    status: str
    created_at: int
    updated_at: int


class SponsorshipRow(msgspec.Struct, kw_only=True):
    id: str
    policy_id: str
    chain: str
    network: str
    sender: str
    user_op_hash: str
    day: int
    created_at: int
    valid_until_s: int
    released_at: int
    estimated_wei: str
    estimated_usd: int
    usd_per_eth: str


class Settlement(msgspec.Struct, frozen=True):
    user_op_hash: str
    block_number: int
    block_hash: str
    tx_hash: str
    actual_wei: int
    success: bool


class PolicyUsage(msgspec.Struct, frozen=True):
    """What ``reserve_sponsorship`` hands ``decide`` (see chaingate.wallets.rules.Usage)."""

    sender_today: int
    recent: int
    oldest_recent_ms: int | None
    period_spent: int
    sender_period_spent: int


class Counts(msgspec.Struct, frozen=True):
    """Which of a policy's counts a reservation must read (each costs a query, and a budget
    without a period reads all the policy's rows): only what its rules name."""

    sender_today: bool = False
    recent_since_ms: int | None = None  # rate_limit: signatures after this
    period_since_ms: int | None = None  # budgets: spend since the period began
    sender_spend: bool = False  # the sender's spend too


class Ledger(msgspec.Struct, frozen=True):
    """Estimated versus settled spend of one policy (USD micros)."""

    reserved_operations: int  # signed, not settled, signature still live
    reserved_usd: int
    settled_operations: int
    settled_estimated_usd: int  # what those operations were priced at when signed
    settled_usd: int  # what the EntryPoint charged for them
    released_operations: int  # signed, never used before the signature expired


class ReservationRefused(Exception):
    """``decide`` refused: the transaction is rolled back, nothing is reserved."""

    def __init__(self, refusal: Any) -> None:
        super().__init__("reservation refused")
        self.refusal = refusal


_WALLET_COLUMNS = tuple(f for f in WalletRow.__struct_fields__ if not f.startswith("deploy"))
# A SimpleAccount is deployed by the EntryPoint's AccountDeployed; an EIP-7702 wallet while
# its latest delegation is to its code (w.factory).
_WALLET_SELECT = (
    "SELECT "  # noqa: S608 - constants only
    + ", ".join(f"w.{c}" for c in _WALLET_COLUMNS)
    + ", COALESCE(d.block_number, g.block_number), COALESCE(d.tx_hash, g.tx_hash),"
    " COALESCE(d.deployed_at, g.set_at) FROM wallets w LEFT JOIN wallet_deployments d"
    " ON d.chain = w.chain AND d.network = w.network AND d.address = w.address"
    " AND w.kind = 'simple'"
    " LEFT JOIN wallet_delegations g ON w.kind = 'eip7702' AND g.chain = w.chain"
    " AND g.network = w.network AND g.address = w.address AND g.delegate = w.factory"
    " AND g.block_number = (SELECT MAX(x.block_number) FROM wallet_delegations x"
    " WHERE x.chain = w.chain AND x.network = w.network AND x.address = w.address)"
)
_POLICY_COLUMNS = tuple(PolicyRow.__struct_fields__)
_POLICY_SELECT = f"SELECT {', '.join(_POLICY_COLUMNS)} FROM gas_policies"  # noqa: S608
_SPONSORSHIP_COLUMNS = tuple(SponsorshipRow.__struct_fields__)
# A sponsorship counts while settled, or while its signature may still be used.
_LIVE = "(settled_block IS NOT NULL OR released_at > ?)"
_SPENT = "CASE WHEN settled_block IS NOT NULL THEN actual_usd ELSE estimated_usd END"
_IN_CHUNK = 500  # addresses per IN (...): under SQLite's oldest parameter limit (999)


def _wallet(row: Sequence[Any]) -> WalletRow:
    names = (*_WALLET_COLUMNS, "deployed_block", "deploy_tx", "deployed_at")
    return WalletRow(**dict(zip(names, row, strict=True)))


def _policy(row: Sequence[Any]) -> PolicyRow:
    return PolicyRow(**dict(zip(_POLICY_COLUMNS, row, strict=True)))


class WalletRows(Rows):
    """Wallets, gas policies and sponsorships over the store engine."""

    # --- wallets ---------------------------------------------------------------------------

    async def add_wallet(self, row: WalletRow) -> tuple[WalletRow, bool]:
        """Insert unless the account already has it; the stored row and whether it is new."""
        values = [getattr(row, c) for c in _WALLET_COLUMNS]

        def insert(tx: Tx) -> tuple[WalletRow, bool]:
            created = tx.execute(
                f"INSERT INTO wallets ({', '.join(_WALLET_COLUMNS)})"  # noqa: S608
                f" VALUES ({', '.join('?' * len(_WALLET_COLUMNS))})"
                " ON CONFLICT (chain, network, address, account_id) DO NOTHING",
                values,
            )
            stored = tx.query(
                f"{_WALLET_SELECT} WHERE w.chain = ? AND w.network = ? AND w.address = ?"
                " AND w.account_id = ?",
                (row.chain, row.network, row.address, row.account_id),
            )
            return _wallet(stored[0]), created == 1

        result: tuple[WalletRow, bool] = await self.run_transaction(insert)
        return result

    async def get_wallet(self, account_id: str, address: str) -> list[WalletRow]:
        """The account's wallets at this address (one per network it was created on)."""

        def select(tx: Tx) -> list[WalletRow]:
            rows = tx.query(
                f"{_WALLET_SELECT} WHERE w.account_id = ? AND w.address = ?"
                " ORDER BY w.created_at, w.chain, w.network",
                (account_id, address),
            )
            return [_wallet(r) for r in rows]

        found: list[WalletRow] = await self.run_transaction(select, write=False)
        return found

    async def list_wallets(
        self,
        account_id: str,
        network: tuple[str, str] | None,
        *,
        offset: int,
        limit: int,
    ) -> tuple[list[WalletRow], int]:
        where = "w.account_id = ?"
        params: tuple[Any, ...] = (account_id,)
        if network is not None:
            where += " AND w.chain = ? AND w.network = ?"
            params += network

        def select(tx: Tx) -> tuple[list[WalletRow], int]:
            total = tx.query(f"SELECT COUNT(*) FROM wallets w WHERE {where}", params)[0][0]  # noqa: S608
            rows = tx.query(
                f"{_WALLET_SELECT} WHERE {where}"
                " ORDER BY w.created_at, w.address, w.chain, w.network LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
            return [_wallet(r) for r in rows], int(total)

        result: tuple[list[WalletRow], int] = await self.run_transaction(select, write=False)
        return result

    async def sponsorship_context(
        self, account_id: str, policy_id: str, chain: str, network: str, sender: str
    ) -> tuple[PolicyRow | None, tuple[str, str, str, str] | None]:
        """In one read: the account's policy, and (owner, salt, version, factory) of the
        account's own wallet record of ``sender`` here — for its initCode (another account's
        record would tell its owner)."""

        def select(tx: Tx) -> tuple[PolicyRow | None, tuple[str, str, str, str] | None]:
            policies = tx.query(
                f"{_POLICY_SELECT} WHERE id = ? AND account_id = ?", (policy_id, account_id)
            )
            wallets = tx.query(
                "SELECT owner, salt, version, factory FROM wallets"
                " WHERE account_id = ? AND chain = ? AND network = ? AND address = ?",
                (account_id, chain, network, sender),
            )
            policy = _policy(policies[0]) if policies else None
            return policy, tuple(wallets[0]) if wallets else None

        found: tuple[PolicyRow | None, tuple[str, str, str, str] | None]
        found = await self.run_transaction(select, write=False)
        return found

    async def record_deployments(
        self, chain: str, network: str, deployments: Sequence[Deployment]
    ) -> None:
        """AccountDeployed events of applied blocks (any sender: a wallet created through the
        API later finds its deployment here)."""
        values = [
            (chain, network, d.address, d.block_number, d.block_hash, d.tx_hash, d.deployed_at)
            for d in deployments
        ]
        if not values:
            return

        def upsert(tx: Tx) -> None:
            tx.executemany(
                "INSERT INTO wallet_deployments"
                " (chain, network, address, block_number, block_hash, tx_hash, deployed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (chain, network, address) DO UPDATE"
                " SET block_number = excluded.block_number, block_hash = excluded.block_hash,"
                " tx_hash = excluded.tx_hash, deployed_at = excluded.deployed_at",
                values,
            )

        await self.run_transaction(upsert)

    async def eip7702_wallets(self, chain: str, network: str, addresses: Sequence[str]) -> set[str]:
        """Which of ``addresses`` (lowercase) are EIP-7702 wallets here, of any account (asked
        in chunks: a block's authorizations may outnumber a statement's parameters)."""
        if not addresses:
            return set()

        def select(tx: Tx) -> set[str]:
            found: set[str] = set()
            for start in range(0, len(addresses), _IN_CHUNK):
                chunk = addresses[start : start + _IN_CHUNK]
                marks = ", ".join("?" * len(chunk))
                rows = tx.query(
                    "SELECT DISTINCT address FROM wallets WHERE kind = 'eip7702'"  # noqa: S608
                    f" AND chain = ? AND network = ? AND address IN ({marks})",
                    (chain, network, *chunk),
                )
                found.update(str(r[0]) for r in rows)
            return found

        found: set[str] = await self.run_transaction(select, write=False)
        return found

    async def has_eip7702_wallets(self, chain: str, network: str) -> bool:
        def select(tx: Tx) -> bool:
            rows = tx.query(
                "SELECT 1 FROM wallets WHERE kind = 'eip7702' AND chain = ? AND network = ?"
                " LIMIT 1",
                (chain, network),
            )
            return bool(rows)

        found: bool = await self.run_transaction(select, write=False)
        return found

    async def record_delegations(
        self, chain: str, network: str, delegations: Sequence[Delegation]
    ) -> None:
        """Delegations of applied blocks (idempotent: a replayed block writes the same)."""
        values = [
            (chain, network, d.address, d.block_number, d.block_hash, d.tx_hash, d.delegate,
             d.set_at)
            for d in delegations
        ]  # fmt: skip
        if not values:
            return

        def upsert(tx: Tx) -> None:
            tx.executemany(
                "INSERT INTO wallet_delegations (chain, network, address, block_number,"
                " block_hash, tx_hash, delegate, set_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (chain, network, address, block_hash) DO UPDATE"
                " SET tx_hash = excluded.tx_hash, delegate = excluded.delegate",
                values,
            )

        await self.run_transaction(upsert)

    async def revert_delegations(self, chain: str, network: str, block_hash: str) -> None:
        """A block was reorganised away: its delegations are undone (the one before is the
        address's latest again)."""

        def undo(tx: Tx) -> None:
            tx.execute(
                "DELETE FROM wallet_delegations WHERE chain = ? AND network = ? AND block_hash = ?",
                (chain, network, block_hash),
            )

        await self.run_transaction(undo)

    async def revert_block(self, chain: str, network: str, block_hash: str) -> None:
        """A block was reorganised away: its deployments and settlements are undone."""

        def undo(tx: Tx) -> None:
            tx.execute(
                "DELETE FROM wallet_deployments WHERE chain = ? AND network = ? AND block_hash = ?",
                (chain, network, block_hash),
            )
            tx.execute(
                "UPDATE sponsorships SET settled_block = NULL, settled_block_hash = NULL,"
                " settled_tx = NULL, actual_wei = NULL, actual_usd = NULL, success = NULL"
                " WHERE chain = ? AND network = ? AND settled_block_hash = ?",
                (chain, network, block_hash),
            )

        await self.run_transaction(undo)

    # --- gas policies ----------------------------------------------------------------------

    async def add_policy(self, row: PolicyRow) -> None:
        values = [getattr(row, c) for c in _POLICY_COLUMNS]

        def insert(tx: Tx) -> None:
            tx.execute(
                f"INSERT INTO gas_policies ({', '.join(_POLICY_COLUMNS)}, reservations)"  # noqa: S608
                f" VALUES ({', '.join('?' * len(_POLICY_COLUMNS))}, 0)",
                values,
            )

        await self.run_transaction(insert)

    async def get_policy(self, account_id: str, policy_id: str) -> PolicyRow | None:
        def select(tx: Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = tx.query(
                f"{_POLICY_SELECT} WHERE id = ? AND account_id = ?", (policy_id, account_id)
            )
            return rows

        rows = await self.run_transaction(select, write=False)
        return _policy(rows[0]) if rows else None

    async def list_policies(
        self, account_id: str, *, offset: int, limit: int
    ) -> tuple[list[PolicyRow], int]:
        def select(tx: Tx) -> tuple[list[PolicyRow], int]:
            total = tx.query(
                "SELECT COUNT(*) FROM gas_policies WHERE account_id = ?", (account_id,)
            )[0][0]
            rows = tx.query(
                f"{_POLICY_SELECT} WHERE account_id = ? ORDER BY created_at, id LIMIT ? OFFSET ?",
                (account_id, limit, offset),
            )
            return [_policy(r) for r in rows], int(total)

        result: tuple[list[PolicyRow], int] = await self.run_transaction(select, write=False)
        return result

    async def update_policy(
        self, account_id: str, policy_id: str, changes: dict[str, Any], now: int
    ) -> PolicyRow | None:
        """Set ``changes`` (name, rules, status); None when the account has no such policy."""
        allowed = {"name", "rules", "status"}
        if not set(changes) <= allowed:
            raise ValueError(f"cannot change {sorted(set(changes) - allowed)}")
        assignments = [f"{column} = ?" for column in sorted(changes)]

        def update(tx: Tx) -> list[tuple[Any, ...]]:
            count = tx.execute(
                f"UPDATE gas_policies SET {', '.join([*assignments, 'updated_at = ?'])}"  # noqa: S608
                " WHERE id = ? AND account_id = ?",
                (*(changes[c] for c in sorted(changes)), now, policy_id, account_id),
            )
            if count != 1:
                return []
            rows: list[tuple[Any, ...]] = tx.query(f"{_POLICY_SELECT} WHERE id = ?", (policy_id,))
            return rows

        rows = await self.run_transaction(update)
        return _policy(rows[0]) if rows else None

    async def delete_policy(self, account_id: str, policy_id: str) -> bool:
        """The policy and its sponsorships; signatures already given stay valid on chain."""

        def delete(tx: Tx) -> bool:
            count = tx.execute(
                "DELETE FROM gas_policies WHERE id = ? AND account_id = ?", (policy_id, account_id)
            )
            if count == 1:
                tx.execute("DELETE FROM sponsorships WHERE policy_id = ?", (policy_id,))
            return bool(count == 1)

        deleted: bool = await self.run_transaction(delete)
        return deleted

    # --- sponsorships ----------------------------------------------------------------------

    async def reserve_sponsorship(
        self,
        account_id: str,
        row: SponsorshipRow,
        *,
        now_ms: int,
        wants: Callable[[PolicyRow], Counts],
        decide: Callable[[PolicyRow, PolicyUsage], Any],
    ) -> SponsorshipRow:
        """Insert ``row`` if ``decide(policy, usage)`` returns None, all in one transaction
        holding the policy's lock; raise ReservationRefused(refusal) otherwise, or LookupError
        when the account has no such policy.  ``wants`` names the counts the policy's rules
        need, as the policy is inside the transaction (those not wanted read as 0)."""

        def reserve(tx: Tx) -> SponsorshipRow:
            locked = tx.execute(
                "UPDATE gas_policies SET reservations = reservations + 1"
                " WHERE id = ? AND account_id = ?",
                (row.policy_id, account_id),
            )
            if locked != 1:
                raise LookupError(row.policy_id)
            policy = _policy(tx.query(f"{_POLICY_SELECT} WHERE id = ?", (row.policy_id,))[0])
            usage = _usage(tx, row.policy_id, row.sender, row.day, now_ms, wants(policy))
            refusal = decide(policy, usage)
            if refusal is not None:
                raise ReservationRefused(refusal)
            tx.execute(
                f"INSERT INTO sponsorships ({', '.join(_SPONSORSHIP_COLUMNS)})"  # noqa: S608
                f" VALUES ({', '.join('?' * len(_SPONSORSHIP_COLUMNS))})",
                [getattr(row, c) for c in _SPONSORSHIP_COLUMNS],
            )
            return row

        reserved: SponsorshipRow = await self.run_transaction(reserve)
        return reserved

    async def policy_usage(
        self,
        account_id: str,
        policy_id: str,
        sender: str,
        *,
        day: int,
        now_ms: int,
        wants: Callable[[PolicyRow], Counts],
    ) -> tuple[PolicyRow, PolicyUsage] | None:
        """The policy and the counts a reservation would see, without reserving (a dry run:
        a read, no lock); None when the account has no such policy."""

        def read(tx: Tx) -> tuple[PolicyRow, PolicyUsage] | None:
            rows = tx.query(
                f"{_POLICY_SELECT} WHERE id = ? AND account_id = ?", (policy_id, account_id)
            )
            if not rows:
                return None
            policy = _policy(rows[0])
            return policy, _usage(tx, policy_id, sender, day, now_ms, wants(policy))

        found: tuple[PolicyRow, PolicyUsage] | None = await self.run_transaction(read, write=False)
        return found

    async def settle_sponsorships(
        self, chain: str, network: str, settlements: Sequence[Settlement]
    ) -> int:
        """UserOperationEvents of applied blocks paid by our paymaster: the actual cost,
        priced at the rate the reservation was priced at.  Returns sponsorships settled."""
        if not settlements:
            return 0

        def settle(tx: Tx) -> int:
            settled = 0
            for s in settlements:
                rows = tx.query(
                    "SELECT id, usd_per_eth FROM sponsorships"
                    " WHERE chain = ? AND network = ? AND user_op_hash = ?",
                    (chain, network, s.user_op_hash),
                )
                for sponsorship_id, rate in rows:
                    usd = s.actual_wei * int(rate) // 10**18
                    settled += tx.execute(
                        "UPDATE sponsorships SET settled_block = ?, settled_block_hash = ?,"
                        " settled_tx = ?, actual_wei = ?, actual_usd = ?, success = ?"
                        " WHERE id = ?",
                        (
                            s.block_number,
                            s.block_hash,
                            s.tx_hash,
                            str(s.actual_wei),
                            usd,
                            s.success,
                            sponsorship_id,
                        ),
                    )
            return settled

        count: int = await self.run_transaction(settle)
        return count

    async def policy_ledger(self, policy_id: str, now_ms: int) -> Ledger:
        def select(tx: Tx) -> Ledger:
            settled = tx.query(
                "SELECT COUNT(*), COALESCE(SUM(estimated_usd), 0), COALESCE(SUM(actual_usd), 0)"
                " FROM sponsorships WHERE policy_id = ? AND settled_block IS NOT NULL",
                (policy_id,),
            )[0]
            reserved = tx.query(
                "SELECT COUNT(*), COALESCE(SUM(estimated_usd), 0) FROM sponsorships"
                " WHERE policy_id = ? AND settled_block IS NULL AND released_at > ?",
                (policy_id, now_ms),
            )[0]
            released = tx.query(
                "SELECT COUNT(*) FROM sponsorships"
                " WHERE policy_id = ? AND settled_block IS NULL AND released_at <= ?",
                (policy_id, now_ms),
            )[0][0]
            return Ledger(
                reserved_operations=int(reserved[0]),
                reserved_usd=int(reserved[1]),
                settled_operations=int(settled[0]),
                settled_estimated_usd=int(settled[1]),
                settled_usd=int(settled[2]),
                released_operations=int(released),
            )

        ledger: Ledger = await self.run_transaction(select, write=False)
        return ledger


def _usage(tx: Tx, pid: str, sender: str, day: int, now_ms: int, counts: Counts) -> PolicyUsage:
    """The counts ``counts`` names of one policy (the others read as 0)."""
    sender_today = recent = spent = sender_spent = 0
    oldest = None
    if counts.sender_today:
        sender_today = tx.query(
            f"SELECT COUNT(*) FROM sponsorships WHERE policy_id = ? AND sender = ?"  # noqa: S608
            f" AND day = ? AND {_LIVE}",
            (pid, sender, day, now_ms),
        )[0][0]
    if counts.recent_since_ms is not None:
        recent, oldest = tx.query(
            "SELECT COUNT(*), MIN(created_at) FROM sponsorships"
            " WHERE policy_id = ? AND created_at > ?",
            (pid, counts.recent_since_ms),
        )[0]
    if counts.period_since_ms is not None:
        spent = tx.query(
            f"SELECT COALESCE(SUM({_SPENT}), 0) FROM sponsorships"  # noqa: S608
            f" WHERE policy_id = ? AND created_at >= ? AND {_LIVE}",
            (pid, counts.period_since_ms, now_ms),
        )[0][0]
        if counts.sender_spend:
            sender_spent = tx.query(
                f"SELECT COALESCE(SUM({_SPENT}), 0) FROM sponsorships"  # noqa: S608
                f" WHERE policy_id = ? AND sender = ? AND created_at >= ? AND {_LIVE}",
                (pid, sender, counts.period_since_ms, now_ms),
            )[0][0]
    return PolicyUsage(
        int(sender_today),
        int(recent),
        int(oldest) if oldest is not None else None,
        int(spent),
        int(sender_spent),
    )


# Rows derived from one chain/network: emptied by Store.reset_network.
register_network_table(*WALLET_TABLES)
register_network_columns(*WALLET_SETTLEMENT_COLUMNS)
