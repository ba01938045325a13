"""The wallet subsystem's rows on SQLite and PostgreSQL: what a new chain resets (deployments
go, sponsorships stay with their settlement forgotten) and what a reorg undoes."""

from __future__ import annotations

from chaingate.auth.store import AuthRows
from chaingate.store import Store
from chaingate.wallets.store import (
    Counts,
    Deployment,
    PolicyRow,
    Settlement,
    SponsorshipRow,
    WalletRow,
    WalletRows,
)

NET = ("ethereum", "devnet")
WALLET = "0x" + "aa" * 20
HASH = "0x" + "bb" * 32
BLOCK = "0x" + "cc" * 32


async def _settled(store: Store) -> tuple[str, str]:
    """A wallet deployed by, and a sponsorship settled in, block BLOCK; (policy, account)."""
    account = (await AuthRows(store).create_account("w@t", "free")).id
    await WalletRows(store).add_wallet(
        WalletRow(
            chain=NET[0],
            network=NET[1],
            address=WALLET,
            account_id=account,
            owner="0x" + "01" * 20,
            salt="0",
            version="0.7",
            factory="0x" + "02" * 20,
            created_at=1,
        )
    )
    policy = f"gp_{account[-8:]}"
    await WalletRows(store).add_policy(
        PolicyRow(
            id=policy,
            account_id=account,
            name="p",
            chain=NET[0],
            network=NET[1],
            chain_label="ethereum",
            rules="{}",
            status="active",
            created_at=1,
            updated_at=1,
        )
    )
    await WalletRows(store).reserve_sponsorship(
        account,
        SponsorshipRow(
            id=f"sp_{account[-8:]}",
            policy_id=policy,
            chain=NET[0],
            network=NET[1],
            sender=WALLET,
            user_op_hash=HASH,
            day=0,
            created_at=1,
            valid_until_s=10,
            released_at=2,
            estimated_wei=str(10**15),
            estimated_usd=3_000_000,
            usd_per_eth=str(3000 * 10**6),
        ),
        now_ms=1,
        wants=lambda _: Counts(),
        decide=lambda policy, usage: None,
    )
    await WalletRows(store).record_deployments(
        *NET, [Deployment(WALLET, 5, BLOCK, "0x" + "dd" * 32, 5000)]
    )
    settled = await WalletRows(store).settle_sponsorships(
        *NET, [Settlement(HASH, 5, BLOCK, "0x" + "dd" * 32, 4 * 10**14, True)]
    )
    assert settled == 1
    return policy, account


async def test_a_new_chain_forgets_deployments_and_settlements_but_keeps_the_records(
    store: Store,
) -> None:
    policy, account = await _settled(store)
    ledger = await WalletRows(store).policy_ledger(policy, now_ms=100)
    assert (ledger.settled_operations, ledger.settled_usd) == (1, 1_200_000)
    deleted = await store.reset_network(*NET)
    assert deleted["wallet_deployments"] == 1
    assert deleted["sponsorships.settled_block"] == 1
    [wallet] = await WalletRows(store).get_wallet(account, WALLET)
    assert wallet.deploy_tx is None  # counterfactual again; the record stays
    ledger = await WalletRows(store).policy_ledger(policy, now_ms=100)
    assert ledger.settled_operations == 0 and ledger.released_operations == 1
    assert await store.reset_network(*NET) == {}  # nothing left to forget


async def test_a_reorg_undoes_its_blocks_deployments_and_settlements(store: Store) -> None:
    policy, account = await _settled(store)
    await WalletRows(store).revert_block(*NET, "0x" + "ee" * 32)  # another block: nothing changes
    assert (await WalletRows(store).policy_ledger(policy, now_ms=100)).settled_operations == 1
    await WalletRows(store).revert_block(*NET, BLOCK)
    [wallet] = await WalletRows(store).get_wallet(account, WALLET)
    assert wallet.deploy_tx is None
    assert (await WalletRows(store).policy_ledger(policy, now_ms=100)).settled_operations == 0
