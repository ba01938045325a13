"""``WebhookService``: signed webhooks, as one service the gateway starts in its nursery.

* a ``NetworkMatcher`` per followed EVM network (the follower's blocks → the outbox), and a
  ``PendingPoller`` for the networks' pending transactions when the variant has them;
* one ``Dispatcher`` (the outbox → receivers, retries, pauses, the daily quota), woken on
  PostgreSQL also by the other processes' writes (``Store.listener``);
* a pruner that keeps the delivery log to ``retention_days``.

The REST resource (``chaingate.api.webhooks``) works through the methods below and the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

import trio

from chaingate.auth.plans import Limits
from chaingate.chain.client import ChainClient
from chaingate.chain.follower import Follower
from chaingate.chain.tap import Tap
from chaingate.cluster.leases import Leadership, LocalLeadership
from chaingate.cluster.roles import RoleKey
from chaingate.cluster.rolestream import follower_terms
from chaingate.config import NetworkSettings, WebhookSettings
from chaingate.config.network import Network
from chaingate.obs.metrics import Registry, Sample
from chaingate.outbound import ConnectionPool, Fetcher, FetchError, OutboundPolicy, PoolLimits
from chaingate.outbound.url import parse_url
from chaingate.store import Store
from chaingate.store.base import StoreError
from chaingate.webhooks.blockmatcher import NetworkMatcher, TokenSource
from chaingate.webhooks.delivery import Dispatcher, register_delivery_metrics
from chaingate.webhooks.mailer import Mailer
from chaingate.webhooks.model import event_id
from chaingate.webhooks.outbox import OUTBOX_CHANNEL, NewEvent
from chaingate.webhooks.pending import PendingPoller
from chaingate.webhooks.store import WebhookRow, WebhookRows
from chaingate.webhooks.variants import Variant, variant

log = logging.getLogger("chaingate.webhooks")

PRUNE_INTERVAL = 3600.0
ANALYZE_INTERVAL = 10.0
ANALYZE_AFTER_EVENTS = 5000
MAX_URL_LENGTH = 2048


class UrlRefused(ValueError):
    """A webhook URL this deployment will not deliver to; the message says why."""


class WebhookService:
    def __init__(
        self,
        store: Store,
        settings: WebhookSettings,
        followers: Mapping[Network, Follower],
        clients: Mapping[Network, ChainClient],
        networks: Mapping[Network, NetworkSettings],
        fetcher: Fetcher,
        *,
        limits: Callable[[str], Limits | None] = lambda _account: None,
        metadata: Mapping[Network, TokenSource] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Keyed by ``Network``; every followed EVM network gets a matcher.  Token and
        NFT payloads take their metadata from ``metadata`` (each indexed network's metadata
        service) where the network has one."""
        self.store = WebhookRows(store)
        self.settings = settings
        self.variant: Variant = variant(settings.variant)
        self.fetcher = fetcher
        self.clock = clock
        self._limits = limits
        self._networks = networks
        self.matchers: dict[Network, NetworkMatcher] = {}
        self._taps: dict[Network, Tap] = {}
        self._pollers: list[tuple[Network, PendingPoller]] = []
        # Matching (and pending polls) run while this process leads the network's
        # ``webhooks`` role (set by the gateway: here alone unless processes share the
        # store); deliveries run everywhere.
        self.leadership: Leadership = LocalLeadership()
        self._followers = followers
        self.dispatcher = Dispatcher(
            self.store,
            self.variant,
            settings,
            fetcher,
            daily_quota=self.daily_quota,
            mailer=Mailer(settings.smtp) if settings.smtp.url else None,
            clock=clock,
        )
        # Processes sharing the store wake each other's dispatchers (None: none can).
        self.listener = store.listener(OUTBOX_CHANNEL, self.dispatcher.wake)
        for key, follower in followers.items():
            net = networks[key]
            if net.family != "evm":
                continue
            matcher = NetworkMatcher(
                key.chain,
                key.network,
                store,
                clients.get(key),
                self.variant,
                chain_id=net.chain_id,
                max_log_range=net.follower.max_log_range,
                on_events=self.dispatcher.wake,
                metadata=(metadata or {}).get(key),
            )
            self.matchers[key] = matcher
            self._taps[key] = follower.tap("webhooks")
            client = clients.get(key)
            if client is not None and "pending_transaction" in self.variant.event_types.values():
                self._pollers.append(
                    (
                        key,
                        PendingPoller(
                            matcher.label,
                            client,
                            matcher.current_index,
                            matcher.write_unanchored,
                            interval=settings.pending_poll_interval,
                        ),
                    )
                )

    # chaingate.cluster: the single-writer role this service runs, one process per network.
    writer_role = "webhooks"

    @property
    def writes_for(self) -> Collection[Network]:
        """The networks whose rows this service writes."""
        return self.matchers.keys()

    # --- what the REST resource asks -------------------------------------------------------

    def serves(self, key: Network) -> bool:
        """Whether events of ``key`` are matched here (it is followed)."""
        return key in self.matchers

    def chain_id(self, key: Network) -> int | None:
        net = self._networks.get(key)
        return net.chain_id if net is not None else None

    def plan_limits(self, account_id: str) -> tuple[int, int]:
        """(webhooks per account, filter values per webhook): the plan's, within the
        deployment's ceilings."""
        plan = self._limits(account_id)
        hooks = self.settings.max_webhooks_per_account
        values = self.settings.max_addresses_per_webhook
        if plan is not None and plan.webhooks:
            hooks = min(hooks, plan.webhooks)
        if plan is not None and plan.webhook_addresses:
            values = min(values, plan.webhook_addresses)
        return hooks, values

    def daily_quota(self, account_id: str) -> int:
        """Deliveries per UTC day (0: unlimited)."""
        plan = self._limits(account_id)
        return plan.webhook_deliveries_per_day if plan is not None else 0

    async def check_url(self, url: str) -> str:
        """``url`` if this deployment may deliver to it, else UrlRefused: HTTPS (plain HTTP
        only where allowed), a port and host the outbound policy allows, and every address
        the name resolves to allowed — checked again at every delivery, since a name can
        change what it resolves to."""
        if len(url) > MAX_URL_LENGTH:
            raise UrlRefused(f"longer than {MAX_URL_LENGTH} characters")
        try:
            target = parse_url(url)
        except FetchError as exc:
            raise UrlRefused(exc.message) from None
        if not target.tls and not self.settings.allow_http:
            raise UrlRefused("must be https://")
        try:
            await self.fetcher.admitted(target)  # the checks every delivery makes again
        except FetchError as exc:
            raise UrlRefused(exc.message) from None
        return url

    def filters_changed(self, key: Network) -> None:
        matcher = self.matchers.get(key)
        if matcher is not None:
            matcher.filters_changed()

    def wake(self) -> None:
        self.dispatcher.wake()

    async def send_test(self, row: WebhookRow) -> str:
        """A test event (the variant's ping) to the webhook, through the outbox like any
        other: signed, retried and logged.  Its id."""
        now = int(self.clock() * 1000)
        ping = NewEvent(
            id=event_id(row.id, f"test|{now}"),
            webhook_id=row.id,
            event_type=self.variant.type_name("test"),
        )

        def render(event: NewEvent, sequence: int, created: int) -> str:
            return self.variant.render(
                None,
                event_id=event.id,
                webhook_id=row.id,
                event_type=event.event_type,
                chain_label=row.chain_label,
                chain_id=self.chain_id(Network(row.chain, row.network)),
                sequence=sequence,
                created_at_ms=created,
            )

        await self.store.add_events([ping], render)
        self.dispatcher.wake()
        return ping.id

    # --- running ---------------------------------------------------------------------------

    def register_metrics(self, registry: Registry) -> None:
        register_delivery_metrics(registry, self.dispatcher)

        def matched() -> list[Sample]:
            return [
                ({"chain": m.chain, "network": m.network, "kind": kind}, float(n))
                for m in self.matchers.values()
                for kind, n in sorted(m.stats.items())
            ]

        registry.family(
            "chaingate_webhook_matcher_total",
            "counter",
            "Webhook matching: blocks matched, events written, reverted blocks, events "
            "cancelled and compensated, reloads of the filters, stale commits, errors.",
            matched,
        )

    async def run(self, nursery: trio.Nursery) -> None:
        """What serves requests: nothing to start (the REST resource calls this object's
        methods)."""

    async def run_writers(self, nursery: trio.Nursery) -> None:
        """Each followed network's matcher, the outbox dispatcher, the pending-transaction
        pollers and the outbox's pruning: the writers of the webhook rows."""
        await nursery.start(self._writers)

    def shutdown(self) -> None:
        """Nothing to drain: every write is one transaction, never left half-done."""

    async def _writers(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            for key, matcher in self.matchers.items():
                led = follower_terms(
                    self.leadership,
                    "webhooks",
                    self._followers[key],
                    self._taps[key],
                    matcher.run,
                    matcher,
                )
                await nursery.start(led.run)
            await nursery.start(self.dispatcher.run)  # every process delivers (SKIP LOCKED)
            if self.listener is not None:
                nursery.start_soon(self.listener.run)
            for key, poller in self._pollers:
                role = RoleKey.of("webhooks", key)
                nursery.start_soon(self.leadership.lead, role, poller.run)
            nursery.start_soon(self._prune)
            nursery.start_soon(self._analyze)
            pool = self.fetcher.pool
            if pool is not None:
                nursery.start_soon(self._run_pool, pool)
            task_status.started()

    @staticmethod
    async def _run_pool(pool: ConnectionPool) -> None:
        try:
            await pool.run()  # closes idle connections as they expire
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()

    async def _analyze(self) -> None:
        """Keep the outbox's statistics current while it churns (see WebhookRows.analyze_outbox)."""
        analyzed = 0
        while True:
            await trio.sleep(ANALYZE_INTERVAL)
            written = sum(m.stats["events"] for m in self.matchers.values())
            if written - analyzed < ANALYZE_AFTER_EVENTS:
                continue
            try:
                await self.store.analyze_outbox()
                analyzed = written
            except StoreError as exc:
                log.warning("webhooks: outbox not analyzed", extra={"fields": {"error": str(exc)}})

    async def _prune(self) -> None:
        while True:
            before = int((self.clock() - self.settings.retention_days * 86_400) * 1000)
            try:
                await self.store.prune_webhook_history(before)
            except StoreError as exc:
                log.warning("webhooks: history not pruned", extra={"fields": {"error": str(exc)}})
            await trio.sleep(PRUNE_INTERVAL)


def webhook_delivery_fetcher(policy: OutboundPolicy, settings: WebhookSettings) -> Fetcher:
    """The fetcher deliveries go through: the deployment's outbound policy, with keep-alive
    connections to each receiver (as many idle as may be in flight to it)."""
    # One key per receiving origin (every webhook URL of one host shares it): as many idle as
    # may be in flight at once, or most deliveries would open a connection.
    limits = PoolLimits(
        max_idle_per_key=settings.max_concurrency, max_idle=settings.max_concurrency
    )
    return Fetcher(policy, pool=ConnectionPool(limits))
