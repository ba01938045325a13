"""``WalletService``: smart wallets, gas policies and signed sponsorship, as one service.

* Wallets: created through the API at their counterfactual address (computed locally,
  proven against the factory), ``deployed`` once the follower sees the EntryPoint's
  ``AccountDeployed`` for them — whoever submitted it — and back when that block is
  reorganised away (``tracker``).
* Policies: an account's rules (``rules``), stored as normalised JSON.
* Sponsorship: every rule checked, the worst case priced in USD from the chain's own feed,
  the VerifyingPaymaster hash signed, and the spend reserved in the same transaction that
  checks the policy's limits; the follower settles it with the EntryPoint's actual cost.

The gateway builds one, hands the REST plane to it, and starts it in its nursery before the
followers (whose events it consumes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import msgspec
import trio

from chaingate.aa.calls import CallDataError, InnerCall, decode_account_calls
from chaingate.aa.paymaster import sponsor
from chaingate.aa.userop import UserOperation, Version, packs_gas, require_version, user_op_hash
from chaingate.chain.client import ChainClient
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap
from chaingate.cluster.leases import Leadership, LocalLeadership
from chaingate.cluster.rolestream import follower_terms
from chaingate.config import NetworkSettings
from chaingate.config.manifest import load_manifest
from chaingate.config.network import Network
from chaingate.evm.keys import PrivateKey
from chaingate.obs.metrics import Registry, Sample
from chaingate.rpc.local import LocalRpc
from chaingate.store import Store
from chaingate.store.base import new_id
from chaingate.wallets import rules as policy_rules
from chaingate.wallets.erc7677 import Erc7677
from chaingate.wallets.model import (
    Evaluation,
    InvalidOperation,
    LimitReached,
    PolicyRefused,
    Sponsored,
)
from chaingate.wallets.network import NotServed, Unavailable, WalletNetwork
from chaingate.wallets.rules import Refusal, Rules, Usage
from chaingate.wallets.sponsorship import usd_rate, wei_to_usd, worst_case_wei
from chaingate.wallets.store import (
    Counts,
    Ledger,
    PolicyRow,
    PolicyUsage,
    ReservationRefused,
    SponsorshipRow,
    WalletRow,
    WalletRows,
)
from chaingate.wallets.tracker import Tracker

log = logging.getLogger("chaingate.wallets")

_rules_decoder = msgspec.json.Decoder(Rules)


def _day(now_s: float) -> int:
    return int(now_s // 86400)


class WalletService:
    def __init__(
        self,
        store: Store,
        followers: Mapping[Network, Follower],
        clients: Mapping[Network, ChainClient],
        networks: Mapping[Network, NetworkSettings],
        signer: PrivateKey | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Keyed by ``Network``; every EVM network with ``wallets.enabled`` is served,
        and tracked when it is followed."""
        self.store = WalletRows(store)
        self.signer = signer
        self.clock = clock
        self.networks: dict[Network, WalletNetwork] = {}
        self.trackers: dict[Network, Tracker] = {}
        self._taps: dict[Network, Tap] = {}
        # Each tracker runs while this process leads its network's ``wallets`` role
        # (chaingate.cluster; set by the gateway: here alone unless processes share the store).
        self.leadership: Leadership = LocalLeadership()
        self._followers = followers
        self.deposits: dict[tuple[Network, str], int] = {}  # (network, version) -> wei
        for key, net in networks.items():
            if net.family != "evm" or not net.wallets.enabled or key not in clients:
                continue
            manifest = load_manifest(net.manifest) if net.manifest else None
            wallet_net = WalletNetwork(key, net, clients[key], manifest, clock=clock)
            self.networks[key] = wallet_net
            follower = followers.get(key)
            if follower is not None:
                self.trackers[key] = Tracker(
                    store,
                    follower.chain,
                    follower.network,
                    entry_points=list(wallet_net.entry_points.values()),
                    paymasters=list(wallet_net.paymasters.values()),
                    client=clients[key],
                    begins_at=follower.started_at,
                )
                self._taps[key] = follower.tap("wallets")

    # chaingate.cluster: the single-writer role this service runs, one process per network.
    writer_role = "wallets"

    @property
    def writes_for(self) -> Collection[Network]:
        """The networks whose rows this service writes."""
        return self.trackers.keys()

    # --- running ---------------------------------------------------------------------------

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests (through this object's methods): the paymaster deposit
        watch, which sponsorship reads."""
        if self.signer is not None:
            nursery.start_soon(self._watch_deposits)

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """Each followed network's deployment tracker: the writer of its wallet rows and
        settlements."""
        await nursery.start(self._writers)

    def shutdown(self) -> None:
        """Nothing to drain: every write is one transaction, never left half-done."""

    async def _writers(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            for key, tracker in self.trackers.items():
                led = follower_terms(
                    self.leadership,
                    "wallets",
                    self._followers[key],
                    self._taps[key],
                    tracker.run,
                    tracker.position,
                )
                await nursery.start(led.run)
            task_status.started()

    async def _watch_deposits(self) -> None:
        interval = min(
            (n.settings.deposit_poll_interval for n in self.networks.values()), default=60
        )
        warned: set[tuple[Network, str]] = set()
        while True:
            for key, net in self.networks.items():
                for version, paymaster in net.paymasters.items():
                    try:
                        deposit = await net.deposit(version)
                    except Unavailable:
                        continue  # the node will answer on a later round
                    if deposit is None:
                        continue
                    self.deposits[(key, version)] = deposit
                    low = deposit < net.deposit_floor
                    if low and (key, version) not in warned:
                        log.warning(
                            "paymaster deposit below its floor",
                            extra={
                                "fields": {
                                    "network": str(key),
                                    "paymaster": paymaster,
                                    "deposit_wei": str(deposit),
                                    "floor_wei": str(net.deposit_floor),
                                }
                            },
                        )
                        warned.add((key, version))
                    elif not low:
                        warned.discard((key, version))
            await trio.sleep(max(0.1, interval))

    def register_metrics(self, registry: Registry) -> None:
        def deposits() -> list[Sample]:
            samples: list[Sample] = []
            for (key, version), wei in sorted(self.deposits.items()):
                labels = {
                    "chain": key.chain,
                    "network": key.network,
                    "entry_point_version": version,
                }
                samples.append((labels, wei))
            return samples

        registry.family(
            "chaingate_paymaster_deposit_wei",
            "gauge",
            "The sponsoring paymaster's deposit at its EntryPoint (wei); a warning is logged "
            "below [chains.<chain>.<network>.wallets] deposit_floor.",
            deposits,
        )

    def register_rpc(self, endpoints: Mapping[Network, LocalRpc], costs: dict[str, int]) -> None:
        """The ERC-7677 paymaster methods on each served network's bundler endpoint."""
        for key in self.networks:
            endpoint = endpoints.get(key)
            if endpoint is not None:
                Erc7677(self, key).register(endpoint, costs)

    # --- wallets ---------------------------------------------------------------------------

    def network(self, key: Network) -> WalletNetwork:
        net = self.networks.get(key)
        if net is None:
            raise NotServed(
                f"smart wallets are off for {key} ([chains.<chain>.<network>.wallets] enabled)"
            )
        return net

    async def create_wallet(
        self,
        account_id: str,
        key: Network,
        owner: str,
        salt: int,
        version: Version | None,
        *,
        eip7702: bool = False,
    ) -> tuple[WalletRow, bool]:
        """A SimpleAccount at its factory's address for (owner, salt); ``eip7702``: the
        owner's own address, an EIP-7702 account of v0.8 delegating to the network's
        delegate (``deployed`` once a delegation to it is seen on chain)."""
        net = self.network(key)
        now = int(self.clock() * 1000)
        if eip7702:
            if version not in (None, "0.8") or salt:
                raise InvalidOperation(
                    "eip7702: an EIP-7702 wallet is the owner's own address on EntryPoint "
                    "v0.8 (no salt, entry_point_version 0.8 or none)"
                )
            row = WalletRow(
                chain=net.chain,
                network=net.network,
                address=owner.lower(),
                account_id=account_id,
                owner=owner.lower(),
                salt="0",
                version="0.8",
                factory=net.delegate.lower(),
                created_at=now,
                kind="eip7702",
            )
        else:
            version = version or net.settings.default_version
            factory = await net.factory(version)
            row = WalletRow(
                chain=net.chain,
                network=net.network,
                address=factory.account_address(owner, salt).lower(),
                account_id=account_id,
                owner=owner.lower(),
                salt=str(salt),
                version=version,
                factory=factory.address.lower(),
                created_at=now,
            )
        _, total = await self.store.list_wallets(account_id, None, offset=0, limit=0)
        if total >= net.settings.max_wallets_per_account:
            found = await self.store.get_wallet(account_id, row.address)
            if not any(w.chain == net.chain and w.network == net.network for w in found):
                raise LimitReached(
                    f"the account holds {total} wallets, the most this deployment allows"
                )
        return await self.store.add_wallet(row)

    async def nonce(self, wallet: WalletRow) -> int:
        net = self.network(Network(wallet.chain, wallet.network))
        return await net.nonce(wallet.address, require_version(wallet.version))

    # --- policies --------------------------------------------------------------------------

    async def create_policy(
        self, account_id: str, name: str, key: Network, label: str, rules: Rules
    ) -> PolicyRow:
        net = self.network(key)
        _, total = await self.store.list_policies(account_id, offset=0, limit=0)
        if total >= net.settings.max_policies_per_account:
            raise LimitReached(
                f"the account holds {total} gas policies, the most this deployment allows"
            )
        now = int(self.clock() * 1000)
        row = PolicyRow(
            id=new_id("gp_"),
            account_id=account_id,
            name=name,
            chain=net.chain,
            network=net.network,
            chain_label=label,
            rules=msgspec.json.encode(rules).decode(),
            status="active",
            created_at=now,
            updated_at=now,
        )
        await self.store.add_policy(row)
        return row

    async def ledger(self, policy_id: str) -> Ledger:
        return await self.store.policy_ledger(policy_id, int(self.clock() * 1000))

    # --- sponsorship -----------------------------------------------------------------------

    async def _prepare(
        self,
        account_id: str,
        key: Network,
        policy_id: str,
        op: UserOperation,
        entry_point: str | None,
        fill_init_code: bool,
    ) -> tuple[WalletNetwork, PolicyRow, Rules, UserOperation, Version, bool]:
        net = self.network(key)
        policy, creation = await self.store.sponsorship_context(
            account_id, policy_id, net.chain, net.network, op.sender.lower()
        )
        if policy is None:
            raise LookupError(policy_id)
        if Network(policy.chain, policy.network) != key:
            raise InvalidOperation(
                f"policy_id: {policy_id} sponsors on {policy.chain_label}, not on this chain"
            )
        rules = _rules_decoder.decode(policy.rules)
        version: Version
        if entry_point is not None:
            found = net.version_of_entry_point(entry_point)
            if found is None:
                known = ", ".join(f"{ep} (v{v})" for v, ep in net.entry_points.items())
                raise InvalidOperation(
                    f"entry_point: {entry_point} is not an EntryPoint of {key} (known: {known})"
                )
            version = found
        elif creation is not None:
            version = require_version(creation[2])
        else:
            version = net.settings.default_version
        filled = False
        if op.eip7702_auth is not None or op.eip7702_init:
            if version != "0.8":
                raise InvalidOperation(
                    "user_operation.eip7702Auth: EIP-7702 senders are EntryPoint v0.8's"
                )
            if op.eip7702_auth is None:
                raise InvalidOperation(
                    "user_operation.eip7702Auth: an operation with the 0x7702 initCode marker "
                    "is sponsored with its authorization"
                )
        elif op.factory is None and not await net.has_code(op.sender):
            if creation is not None and creation[3].lower() == net.delegate.lower():
                raise InvalidOperation(
                    f"user_operation.eip7702Auth: {op.sender} is an EIP-7702 wallet not "
                    "delegated yet: send the owner's authorization with its first operation"
                )
            if creation is None or creation[2] != version or not fill_init_code:
                raise InvalidOperation(
                    f"user_operation.sender: {op.sender} has no code on {key} and the "
                    "operation carries no initCode (v0.6), factory (v0.7, v0.8) or "
                    "eip7702Auth (v0.8); create the wallet with POST /v1/wallets/create or "
                    "send them"
                )
            owner, salt, _, _ = creation
            factory = await net.factory(version)
            op = op.with_(
                factory=factory.address, factory_data=factory.factory_data(owner, int(salt))
            )
            filled = True
        if packs_gas(version):
            op = op.with_(
                paymaster_verification_gas_limit=op.paymaster_verification_gas_limit
                or net.settings.paymaster_verification_gas,
                paymaster_post_op_gas_limit=op.paymaster_post_op_gas_limit
                or net.settings.paymaster_post_op_gas,
            )
        else:
            op = op.with_(paymaster_verification_gas_limit=0, paymaster_post_op_gas_limit=0)
        return net, policy, rules, op, version, filled

    async def _price(
        self, net: WalletNetwork, rules: Rules, op: UserOperation, version: Version
    ) -> tuple[int | None, int | None]:
        """(worst case in USD micros, USD micros per coin); (None, None) without a price
        when no rule needs one."""
        needs_usd = any(
            r is not None for r in (rules.max_gas_usd, rules.max_total_usd, rules.max_per_user_usd)
        )
        try:
            rate = usd_rate(await net.usd_per_eth())
        except Unavailable:
            if needs_usd:
                raise
            return None, None
        return wei_to_usd(worst_case_wei(op, version), rate), rate

    @staticmethod
    def _calls(rules: Rules, op: UserOperation, version: Version) -> list[InnerCall]:
        if rules.allowed_contracts is None and rules.allowed_methods is None:
            return []
        try:
            return decode_account_calls(op.call_data, version)
        except CallDataError as exc:
            rule = "allowed_contracts" if rules.allowed_contracts is not None else "allowed_methods"
            refusal = Refusal(rule, f"cannot tell what the operation calls: {exc}")
            raise PolicyRefused("", refusal) from None

    def _decide(self, now_s: float, cost: int) -> Callable[[PolicyRow, PolicyUsage], Any]:
        """The in-transaction check: the policy as it is now (a PATCH may have paused it or
        changed its rules since it was read), against its counts."""

        def decide(policy: PolicyRow, usage: PolicyUsage) -> Refusal | None:
            if policy.status != "active":
                return Refusal("status", f"the policy is {policy.status}")
            rules = _rules_decoder.decode(policy.rules)
            return policy_rules.check_usage(
                rules,
                Usage(
                    sender_today=usage.sender_today,
                    recent=usage.recent,
                    oldest_recent_s=None
                    if usage.oldest_recent_ms is None
                    else -(-usage.oldest_recent_ms // 1000),  # rounded up: never early
                    period_spent=usage.period_spent,
                    sender_period_spent=usage.sender_period_spent,
                ),
                cost,
                int(now_s),
            )

        return decide

    async def _check_rules(
        self,
        net: WalletNetwork,
        policy: PolicyRow,
        rules: Rules,
        op: UserOperation,
        version: Version,
        now_s: float,
    ) -> tuple[Refusal | None, int | None, int | None]:
        """The policy's rules that need no counts, on ``op``: (the refusal or None, the worst
        case in USD micros, USD micros per coin).  A paused policy or calls that cannot be
        decoded raise PolicyRefused."""
        if policy.status != "active":
            raise PolicyRefused(policy.id, Refusal("status", f"the policy is {policy.status}"))
        try:
            calls = self._calls(rules, op, version)
        except PolicyRefused as exc:
            raise PolicyRefused(policy.id, exc.refusal) from None
        cost, rate = await self._price(net, rules, op, version)
        refusal = policy_rules.check_operation(
            rules,
            calls,
            cost or 0,
            int(now_s),
            # Whose code runs to make the account: its factory, or the code it delegates to.
            factory=_account_maker(op),
            known_factories=[net.factory_addresses[version], net.delegate],
        )
        return refusal, cost, rate

    def _valid_until(self, net: WalletNetwork, key: Network, rules: Rules, now_s: float) -> int:
        """When a signature given now expires: the network's TTL after the later of our clock
        and the chain's head."""
        follower = self._followers.get(key)
        chain_now = follower.head.timestamp if follower is not None and follower.head else 0
        valid_until = max(int(now_s), chain_now) + net.settings.signature_ttl
        if rules.valid_until is not None:
            # A signature never outlives its policy's window.
            valid_until = min(valid_until, max(rules.valid_until, int(now_s) + 1))
        return valid_until

    async def sponsor(
        self,
        account_id: str,
        key: Network,
        policy_id: str,
        op: UserOperation,
        entry_point: str | None,
        *,
        dry_run: bool = False,
        fill_init_code: bool = True,
    ) -> Sponsored | Evaluation:
        """Sponsor ``op`` under the policy (or, ``dry_run``, say what the policy would do).
        ``fill_init_code``: an undeployed wallet created here gets its initCode from our
        records (only where the answer can hand it back)."""
        net, policy, rules, op, version, filled = await self._prepare(
            account_id, key, policy_id, op, entry_point, fill_init_code
        )
        if self.signer is None and not dry_run:
            raise NotServed(
                "sponsorship is off: no paymaster signer key ([paymaster] key_file, or "
                "CHAINGATE_PAYMASTER__KEY)"
            )
        paymaster = net.paymasters.get(version)
        if paymaster is None and not dry_run:
            raise NotServed(f"no v{version} paymaster is configured for {key}")
        now_s = self.clock()
        refusal, cost, rate = await self._check_rules(net, policy, rules, op, version, now_s)
        if refusal is not None:
            if dry_run:
                return Evaluation(refusal, cost, version)
            raise PolicyRefused(policy.id, refusal)
        now_ms = int(now_s * 1000)
        wants = _counts_wanted(now_s)
        decide = self._decide(now_s, cost or 0)
        if dry_run:
            sender = op.sender.lower()
            found = await self.store.policy_usage(
                account_id, policy.id, sender, day=_day(now_s), now_ms=now_ms, wants=wants
            )
            if found is None:  # deleted meanwhile
                raise LookupError(policy_id)
            return Evaluation(decide(*found), cost, version)
        assert self.signer is not None
        assert paymaster is not None
        chain_id = net.chain_id
        if chain_id is None:
            raise NotServed(f"{key} has no chain_id configured")
        valid_until = self._valid_until(net, key, rules, now_s)
        valid_after = 0
        # The v0.6 sample paymaster also signs over its own per-sender counter.
        sender_nonce = await net.paymaster_nonce(version, op.sender) if version == "0.6" else 0
        signed = sponsor(
            op,
            self.signer,
            paymaster=paymaster,
            chain_id=chain_id,
            valid_until=valid_until,
            valid_after=valid_after,
            version=version,
            sender_nonce=sender_nonce,
        )
        entry = net.entry_points[version]
        op_hash = (
            "0x" + user_op_hash(signed, entry_point=entry, chain_id=chain_id, version=version).hex()
        )
        row = _sponsorship_row(
            net, policy.id, op.sender, signed, op_hash, version, now_s, valid_until, cost, rate
        )
        try:
            await self.store.reserve_sponsorship(
                account_id,
                row,
                now_ms=now_ms,
                wants=wants,
                decide=decide,
            )
        except ReservationRefused as exc:
            raise PolicyRefused(policy.id, exc.refusal) from None
        return Sponsored(
            op=signed,
            version=version,
            entry_point=entry,
            paymaster=paymaster,
            user_op_hash=op_hash,
            valid_until=valid_until,
            valid_after=valid_after,
            usd=cost,
            sponsorship_id=row.id,
            init_code_filled=filled,
        )


def _sponsorship_row(
    net: WalletNetwork,
    policy_id: str,
    sender: str,
    signed: UserOperation,
    op_hash: str,
    version: Version,
    now_s: float,
    valid_until: int,
    cost: int | None,
    rate: int | None,
) -> SponsorshipRow:
    """The reservation a signature makes: counted against the policy until it settles, or
    until its signature has expired and the settle grace has passed."""
    now_ms = int(now_s * 1000)
    return SponsorshipRow(
        id=new_id("sp_"),
        policy_id=policy_id,
        chain=net.chain,
        network=net.network,
        sender=sender.lower(),
        user_op_hash=op_hash,
        day=_day(now_s),
        created_at=now_ms,
        valid_until_s=valid_until,
        released_at=now_ms + (net.settings.signature_ttl + net.settings.settle_grace) * 1000,
        estimated_wei=str(worst_case_wei(signed, version)),
        estimated_usd=cost or 0,
        usd_per_eth=str(rate or 0),
    )


def _account_maker(op: UserOperation) -> str | None:
    """Whose code an operation runs to make its account: the factory it deploys through, or
    the contract its EIP-7702 authorization delegates to."""
    if op.deploys:
        return op.factory
    return op.eip7702_auth.address if op.eip7702_auth is not None else None


def _counts_wanted(now_s: float) -> Callable[[PolicyRow], Counts]:
    """The counts a policy's rules (as they are inside the reservation) need."""

    def wants(policy: PolicyRow) -> Counts:
        rules = _rules_decoder.decode(policy.rules)
        budgets = rules.max_total_usd is not None or rules.max_per_user_usd is not None
        limit = rules.rate_limit
        return Counts(
            sender_today=rules.max_per_user_per_day is not None,
            recent_since_ms=int(now_s * 1000) - limit.interval_seconds * 1000 if limit else None,
            period_since_ms=policy_rules.period_start(rules.budget_period, int(now_s)) * 1000
            if budgets
            else None,
            sender_spend=rules.max_per_user_usd is not None,
        )

    return wants
