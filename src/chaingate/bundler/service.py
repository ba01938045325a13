"""``BundlerService``: the ERC-4337 bundler of every served EVM network, as one service.

Per network (``BundlerNetwork``): a mempool kept in the store, ERC-7562 reputation, admission
(sanity, simulation traced under the ERC-7562 rules in safe mode), bundling by the process's
bundler key, and receipts from the follower's logs.  Its JSON-RPC methods are registered on
the network's ``/v1/bundler/{chain}/{network}`` endpoint (native, beside ERC-7677's); its
loops run in the service's own nursery, a sibling of the REST plane's.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import trio

from chaingate.aa.userop import VERSIONS, Version, entry_point_address
from chaingate.bundler.admission import Admission
from chaingate.bundler.mempool import Mempool, MempoolLimits
from chaingate.bundler.methods import BundlerMethods
from chaingate.bundler.network import BundlerNetwork
from chaingate.bundler.receipts import ReceiptTracker
from chaingate.bundler.reputation import Reputation
from chaingate.bundler.sanity import SanityLimits
from chaingate.bundler.submitter import Submitter
from chaingate.chain.chainid import ChainIdMismatch, upstream_chain_id
from chaingate.chain.client import ChainClient
from chaingate.chain.feed import TermFeed
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap
from chaingate.cluster.leases import Leadership, LocalLeadership
from chaingate.cluster.roles import RoleKey
from chaingate.cluster.rolestream import RoleStream, follower_terms
from chaingate.cluster.terms import RoleTerms
from chaingate.config import BundlerSettings, ConfigError, NetworkSettings
from chaingate.config.manifest import load_manifest
from chaingate.config.network import Network
from chaingate.evm.keys import PrivateKey
from chaingate.obs.metrics import Registry, Sample
from chaingate.rpc.local import LocalRpc
from chaingate.store import Store
from chaingate.store.base import StoreError

log = logging.getLogger("chaingate.bundler")

# Without a configured chain_id: how long the start waits for the upstreams' eth_chainId, and
# how often it is asked again after that (the gateway serves meanwhile).
START_CHAIN_ID_WAIT = 5.0
CHAIN_ID_RETRY = 5.0
# How often a leading bundler takes in operations other processes accepted.
PICK_UP_INTERVAL = 1.0


def bundler_key(settings: BundlerSettings) -> PrivateKey | None:
    """The bundler EOA's key from ``[bundler] key`` or ``key_file``; None when neither."""
    if settings.key:
        return PrivateKey.from_hex(settings.key)
    if settings.key_file:
        try:
            return PrivateKey.from_hex(Path(settings.key_file).expanduser().read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"bundler.key_file: {exc}") from None
    return None


def _entry_points(net: NetworkSettings, key: Network) -> dict[Version, str]:
    manifest = load_manifest(net.manifest) if net.manifest else None
    served: dict[Version, str] = {}
    for version in VERSIONS:
        if version not in net.bundler.entry_points:
            continue
        served[version] = entry_point_address(net.wallets.entry_points, manifest, version)
    if not served:
        raise ConfigError(f"chains.{key.chain}.{key.network}.bundler.entry_points: name one")
    return served


class BundlerService:
    def __init__(
        self,
        store: Store,
        settings: BundlerSettings,
        followers: Mapping[Network, Follower],
        clients: Mapping[Network, ChainClient],
        networks: Mapping[Network, NetworkSettings],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.key = bundler_key(settings)
        self.networks: dict[Network, BundlerNetwork] = {}
        self.trackers: dict[Network, ReceiptTracker] = {}
        self._taps: dict[Network, Tap] = {}
        self._followers = followers
        # Who leads the network's ``bundler`` role (set by the gateway).  When processes
        # share the store (``leadership.shared``), bundling, submission and receipts run
        # only while this process leads it (each term loads the mempool from the store and
        # settles bundles in flight, as a restart does).
        self.leadership: Leadership = LocalLeadership()
        for key, net in networks.items():
            if net.family != "evm" or not net.bundler.enabled or key not in clients:
                continue
            entry_points = _entry_points(net, key)
            chain_id = net.chain_id
            if chain_id is None and net.manifest:
                chain_id = load_manifest(net.manifest).chain_id
            # None: asked of the upstreams when the service starts (``_learn_chain_id``).
            bundler = net.bundler
            safe_mode = settings.safe_mode if bundler.safe_mode is None else bundler.safe_mode
            reputation = Reputation(
                min_stake=int(bundler.min_stake),
                min_unstake_delay=bundler.min_unstake_delay,
                clock=clock,
            )
            mempool = Mempool(
                reputation,
                MempoolLimits(max_size=bundler.mempool_size, expiry_margin_s=bundler.min_valid_for),
                clock=lambda: int(clock() * 1000),
            )
            admission = Admission(
                clients[key],
                chain_id,
                reputation,
                SanityLimits(
                    max_verification_gas=bundler.max_verification_gas,
                    max_call_gas=bundler.max_call_gas,
                    max_total_gas=bundler.max_bundle_gas,
                    min_priority_fee=bundler.min_priority_fee,
                ),
                safe_mode=safe_mode,
                simulations_code=None,  # the shipped EntryPointSimulations of each version
                min_valid_for=bundler.min_valid_for,
                clock=clock,
            )
            submitter = (
                Submitter(clients[key], self.key, chain_id, resend_after=bundler.resend_after)
                if self.key is not None
                else None
            )
            bundler_net = BundlerNetwork(
                key,
                bundler,
                clients[key],
                store,
                entry_points,
                mempool,
                reputation,
                admission,
                submitter,
                clock=clock,
            )
            self.networks[key] = bundler_net
            follower = followers.get(key)
            if follower is not None:
                self.trackers[key] = ReceiptTracker(
                    store,
                    key.chain,
                    key.network,
                    list(entry_points.values()),
                    included=bundler_net.included,
                    reverted=bundler_net.reverted,
                    head=bundler_net.on_head,
                    begins_at=follower.started_at,
                )
                self._taps[key] = follower.tap("bundler")

    # chaingate.cluster: the single-writer role this service runs, one process per network.
    writer_role = "bundler"

    @property
    def writes_for(self) -> Collection[Network]:
        """The networks whose rows this service writes."""
        return self.networks.keys()

    def register_rpc(self, endpoints: Mapping[Network, LocalRpc], costs: dict[str, int]) -> None:
        for key, net in self.networks.items():
            endpoint = endpoints.get(key)
            if endpoint is not None:
                BundlerMethods(net, debug=self.settings.debug).register(endpoint, costs)

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests: nothing to start (the methods ``register_rpc`` put on
        each endpoint answer them)."""

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """Each network's mempool (loaded from the store), bundling loop and receipt
        tracker: the single writers of its bundler rows."""
        await nursery.start(self._writers)

    def shutdown(self) -> None:
        """Nothing to drain: every write is one transaction, never left half-done."""

    async def _writers(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self.leadership.shared:
            await self._led_writers(self.leadership, task_status)
            return
        for key, net in self.networks.items():
            if net.chain_id is None:
                await self._learn_chain_id(key, net, START_CHAIN_ID_WAIT)
            if net.chain_id is not None:  # else loaded once it is known (_run_network)
                await net.load()
            if net.submitter is None:
                log.warning(
                    "no bundler key ([bundler] key or key_file): operations are validated and "
                    "kept, no bundle is sent",
                    extra={"fields": {"network": str(key)}},
                )
        async with trio.open_nursery() as nursery:
            for key in self.trackers:
                nursery.start_soon(self._receipts(self.leadership, key).run)
            for key, net in self.networks.items():
                nursery.start_soon(self._run_network, key, net)
            task_status.started()

    async def _led_writers(
        self, leadership: Leadership, task_status: trio.TaskStatus[None]
    ) -> None:
        async with trio.open_nursery() as nursery:
            for key, net in self.networks.items():
                role = RoleKey.of("bundler", key)
                receipts = None
                if key in self.trackers:
                    receipts = self._receipts(leadership, key)
                    await nursery.start(functools.partial(receipts.run, own_terms=False))
                net.leads = functools.partial(leadership.holds, role)
                net.fenced = True  # other processes may lead: no bundle outside a term
                term = functools.partial(self._term, key, net, receipts)
                nursery.start_soon(leadership.lead, role, term)
                nursery.start_soon(self._mirror, leadership, role, net)
            task_status.started()

    def _receipts(self, leadership: Leadership, key: Network) -> RoleStream[TermFeed]:
        """The network's receipt tracker on the follower's stream, in the role's terms."""
        tracker = self.trackers[key]
        return follower_terms(
            leadership,
            "bundler",
            self._followers[key],
            self._taps[key],
            tracker.run,
            tracker.position,
        )

    @staticmethod
    async def _mirror(leadership: Leadership, role: RoleKey, net: BundlerNetwork) -> None:
        """While another process leads, this one's mempool is the store's, a second late at
        most: what it admits is judged against every process's operations (per-sender limits,
        replacements, its size), and what the leader bundled or dropped leaves it."""
        while True:
            await trio.sleep(PICK_UP_INTERVAL)
            if leadership.holds(role) or net.chain_id is None:
                continue
            try:
                live = await net.store.bundler_live(net.chain, net.network)
            except StoreError as exc:
                log.warning("bundler: store unreadable", extra={"fields": {"error": str(exc)}})
                continue
            if not leadership.holds(role):  # not taken meanwhile
                net.mempool.forget_live()
                net.mempool.load(live)

    async def _term(
        self, key: Network, net: BundlerNetwork, receipts: RoleStream[TermFeed] | None
    ) -> None:
        """One leadership term of a network's bundler: what a start after a restart does —
        the mempool as the store has it (what this process kept while another led may have
        been bundled there), bundles in flight settled — then bundling, and taking in what
        other processes accept."""
        # A new term, inside the lease: the previous leader's recording of a bundle fails
        # from now on, and what it recorded before is settled by the load.  The term is
        # served (``net.term``) only once loaded, and no longer once this one ends.
        role = RoleKey("bundler", net.chain, net.network)
        term = await RoleTerms(net.store.store).begin(role)
        try:
            if net.chain_id is None:
                await self._learn_chain_id(key, net, START_CHAIN_ID_WAIT)
            if net.chain_id is not None:
                net.mempool.forget_live()
                await net.load(term)
            async with trio.open_nursery() as nursery:
                if receipts is not None:  # after the load: inclusions find their operations
                    nursery.start_soon(receipts.term)
                nursery.start_soon(self._pick_up, net)
                await self._run_network(key, net, term)
                nursery.cancel_scope.cancel()
        finally:
            net.term = None

    @staticmethod
    async def _pick_up(net: BundlerNetwork) -> None:
        """Operations other processes accepted (they keep them in the store): into this
        leader's mempool, which takes each one once."""
        while True:
            await trio.sleep(PICK_UP_INTERVAL)
            try:
                await net.pick_up()
            except StoreError as exc:
                log.warning("bundler: store unreadable", extra={"fields": {"error": str(exc)}})

    async def _learn_chain_id(self, key: Network, net: BundlerNetwork, wait: float) -> None:
        """A network configured without ``chain_id`` (user operation hashes and bundle
        transactions include it) takes its upstreams' ``eth_chainId``.  Upstreams that
        disagree are refused: at start the gateway does not start (ConfigError); later
        the bundler of that network stays off, said once."""
        try:
            chain_id = await upstream_chain_id(net.client.pool, wait)
        except ChainIdMismatch as exc:
            raise ConfigError(
                f"chains.{key.chain}.{key.network}: {exc}; set chain_id, or fix the upstreams"
            ) from None
        if chain_id is not None:
            net.set_chain_id(chain_id)
            log.info(
                "the bundler's chain id comes from the upstreams (no chain_id configured)",
                extra={"fields": {"network": str(key), "chain_id": chain_id}},
            )

    async def _run_network(
        self, key: Network, net: BundlerNetwork, term: int | None = None
    ) -> None:
        if net.chain_id is None:
            log.warning(
                "the bundler is off until an upstream answers eth_chainId (no chain_id is "
                "configured); its methods answer -32002 meanwhile",
                extra={"fields": {"network": str(key)}},
            )
            try:
                while net.chain_id is None:
                    await trio.sleep(CHAIN_ID_RETRY)
                    await self._learn_chain_id(key, net, CHAIN_ID_RETRY)
            except ConfigError as exc:
                log.error(
                    "the bundler stays off",
                    extra={"fields": {"network": str(key), "error": str(exc)}},
                )
                return
            await net.load(term)
        await net.run()

    # --- metrics ---------------------------------------------------------------------------

    def register_metrics(self, registry: Registry) -> None:
        def labels(key: Network) -> dict[str, str]:
            return {"chain": key.chain, "network": key.network}

        def mempool() -> list[Sample]:
            return [(labels(k), len(n.mempool)) for k, n in sorted(self.networks.items())]

        def accepted() -> list[Sample]:
            return [
                ({**labels(k), "entry_point_version": v}, count)
                for k, n in sorted(self.networks.items())
                for v, count in sorted(n.accepted.items())
            ]

        def rejected() -> list[Sample]:
            return [
                ({**labels(k), "code": str(code)}, count)
                for k, n in sorted(self.networks.items())
                for code, count in sorted(n.rejected.items())
            ]

        def bundles() -> list[Sample]:
            return [
                ({**labels(k), "outcome": outcome}, count)
                for k, n in sorted(self.networks.items())
                for outcome, count in sorted(n.bundles.items())
            ]

        def latency() -> list[Sample]:
            samples: list[Sample] = []
            for k, n in sorted(self.networks.items()):
                recent = sorted(n.inclusion_seconds)
                for q in (0.5, 0.99):
                    if recent:
                        value = recent[min(len(recent) - 1, int(q * len(recent)))]
                        samples.append(({**labels(k), "quantile": str(q)}, value))
            return samples

        def balance() -> list[Sample]:
            return [
                (labels(k), n.eoa_balance)
                for k, n in sorted(self.networks.items())
                if n.eoa_balance is not None
            ]

        registry.family(
            "chaingate_bundler_mempool_operations", "gauge", "Operations in the mempool.", mempool
        )
        registry.family(
            "chaingate_bundler_operations_accepted_total",
            "counter",
            "eth_sendUserOperation calls accepted, by EntryPoint version.",
            accepted,
        )
        registry.family(
            "chaingate_bundler_operations_rejected_total",
            "counter",
            "eth_sendUserOperation calls refused, by JSON-RPC error code.",
            rejected,
        )
        registry.family(
            "chaingate_bundler_bundles_total",
            "counter",
            "Bundle transactions, by outcome (sent, mined, reverted, failed).",
            bundles,
        )
        registry.family(
            "chaingate_bundler_inclusion_seconds",
            "gauge",
            "Seconds from eth_sendUserOperation to the block including it (recent 1000).",
            latency,
        )
        registry.family(
            "chaingate_bundler_eoa_balance_wei",
            "gauge",
            "The bundler key's balance (pays the bundles' gas), read after each bundle.",
            balance,
        )
