"""Delivery: the outbox → receivers, with retries, pauses and the daily quota.

One claim loop leases due events in batches and queues each at its endpoint (its webhook
URL), in claim order.  Up to ``max_per_endpoint`` workers per endpoint take them in turn, each
attempt also holding one of the process's ``max_concurrency`` slots: take the account's daily
quota, sign and POST the stored body, and judge the answer (``judge``: delivered, retried
later, failed; a 410 disables the webhook, the last retry of variant A pauses it).  Outcomes
are written in batches: one ``finish_attempts`` call for up to ``FLUSH_BATCH`` of them, or
every ``FLUSH_INTERVAL``.

Memory is bounded: an event is held from its claim until its outcome (or its give-back) is
written, and the loop claims only while fewer than ``max_concurrency + lookahead`` are held
(``lookahead``: ``claim_batch``, at most ``max_concurrency``); an endpoint holds at most
``max_per_endpoint + claim_batch`` of them, events beyond that are given back for a second
(see ``Admission``).  A process holds no more than it can start soon: what is due beyond
that stays in the outbox for the other processes sharing it (``serve --workers N``), which
the writer's commit wakes (``Store.notify``).  Delivery is at least once: a process that dies
leaves its events leased until the lease runs out, and then they are sent again, with the same
id.  See docs/decisions/webhooks.md, "Delivery".
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol
from urllib.parse import urlsplit

import msgspec
import trio

from chaingate.config import WebhookSettings
from chaingate.obs.metrics import LatencyHistogram, Registry, Sample
from chaingate.outbound import Fetcher, FetchError, FetchLimits
from chaingate.store.base import StoreError
from chaingate.webhooks.mailer import Mailer, pause_notice
from chaingate.webhooks.outbox import Attempt, Due, Outcome
from chaingate.webhooks.variants import Variant

log = logging.getLogger("chaingate.webhooks.delivery")

DAY_MS = 86_400_000
# Outcomes are written together: this often, or as soon as this many wait.
FLUSH_INTERVAL = 0.05
FLUSH_BATCH = 200
# A receiver's answer is read up to this much (the log keeps ``response_log_bytes`` of it).
MAX_RESPONSE_BYTES = 64 * 1024
CONNECT_TIMEOUT = 3.0
# An attempt starts only with this much of its lease left beyond the timeout, so its outcome
# is written before another worker may lease the event again.
LEASE_MARGIN = 5.0
# Events an endpoint has no room for go back to the outbox, due again this much later.
OVERFLOW_DELAY_MS = 1000
# On shutdown: writing what is known and giving back the rest, at most this long.
SHUTDOWN_GRACE = 5.0
# A failing store is tried again after this long, doubling up to the maximum.
STORE_RETRY = (0.1, 5.0)
# Pause notices waiting for the mailer; beyond this they are logged, not sent.
MAIL_QUEUE = 64
# Due times of retries and holds this process knows (it wakes for them); beyond this the
# latest are forgotten and found by the poll instead.
MAX_TIMERS = 4096
# Accounts whose quota of the day is known to be used up (asked no more until tomorrow).
MAX_SPENT = 10_000

_headers_encoder = msgspec.json.Encoder()


class DeliveryStore(Protocol):
    """What delivery needs of the store (``chaingate.webhooks.store``)."""

    async def claim_due_events(self, now: int, limit: int, lease_ms: int) -> list[Due]: ...

    async def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[str]: ...

    async def hold_events(self, event_ids: Sequence[str], until: int) -> None: ...

    async def take_delivery_quota(self, account_id: str, day: int, limit: int) -> bool: ...

    async def webhook_owner_email(self, webhook_id: str) -> tuple[str, str] | None: ...


# --- the rules (sans-IO) -------------------------------------------------------------------


def utc_day(now_ms: int) -> int:
    """Days since the epoch, UTC: the quota's day."""
    return now_ms // DAY_MS


def next_utc_midnight(now_ms: int) -> int:
    return (now_ms // DAY_MS + 1) * DAY_MS


def judge(variant: Variant, due: Due, attempt: Attempt, now_ms: int) -> Outcome:
    """What ``attempt`` decides for its event (and perhaps its webhook).

    2xx: delivered.  410: the receiver is gone for good — the event fails and the webhook is
    disabled.  Anything else fails the attempt: ``retries`` counts the round's failures, and
    the n-th failure schedules retry n after ``retry_delays[n-1]``; the failure after the last
    retry exhausts the event (variant A: 1 attempt + 5 retries, then the webhook is paused;
    variant B: 1 + 7, then the event is failed and the webhook stays active).
    """
    event = due.event
    status = attempt.status
    if status is not None and 200 <= status < 300:
        return Outcome(
            attempt=attempt, state="delivered", retries=event.retries, next_attempt_at=now_ms
        )
    retries = event.retries + 1
    if status == 410:
        return Outcome(
            attempt=attempt,
            state="failed",
            retries=retries,
            next_attempt_at=now_ms,
            webhook_status="disabled",
            webhook_status_reason="receiver answered 410 Gone",
        )
    delays = variant.retry_delays
    if retries <= len(delays):
        return Outcome(
            attempt=attempt,
            state="pending",
            retries=retries,
            next_attempt_at=now_ms + round(delays[retries - 1] * 1000),
        )
    if variant.exhausted == "pause":
        return Outcome(
            attempt=attempt,
            state="failed",
            retries=retries,
            next_attempt_at=now_ms,
            webhook_status="paused",
            webhook_status_reason=(
                f"{len(delays)} retries of event {event.id} failed"
                f" (last: {attempt.error or 'no answer'})"
            ),
        )
    return Outcome(attempt=attempt, state="failed", retries=retries, next_attempt_at=now_ms)


class Endpoint:
    """One webhook URL's share of the process: the events held for it, those still waiting in
    claim order, and the workers sending them."""

    __slots__ = ("held", "waiting", "workers")

    def __init__(self) -> None:
        self.waiting: collections.deque[tuple[Due, int]] = collections.deque()  # (due, lease end)
        self.workers = 0
        self.held = 0


class Admission:
    """Which claimed events the process takes on, and how many to claim next (sans-IO).

    ``bound`` events at most are held; one endpoint holds at most ``per_endpoint``, so a
    receiver that hangs cannot fill the process and starve every other: its surplus is given
    back.  An endpoint that had a surplus is "hot" for ``HOT_MS``.  While every claimed event
    is for a hot endpoint, the next claim is no larger than the room the fullest of them has
    left — a receiver that is merely busy is not fed events only to give them back — except
    that a claim ending a poll interval takes at least a quarter batch, so what waits behind
    a hot endpoint's backlog still gets through.  Endpoints are dropped once nothing is held
    for them; at most ``MAX_HOT`` hot ones are remembered.
    """

    HOT_MS = 60_000
    MAX_HOT = 1024

    def __init__(self, *, bound: int, per_endpoint: int, claim_batch: int) -> None:
        self.bound = bound
        self.per_endpoint = per_endpoint
        self.claim_batch = claim_batch
        self.endpoints: dict[str, Endpoint] = {}
        self.hot: dict[str, int] = {}  # URL -> when it last had a surplus (ms)
        self.held = 0
        self.throttled = False

    def limit(self, *, reserved: int, timed_out: bool) -> int:
        """How many to claim now; ``reserved``: events given back but not yet written."""
        limit = min(self.claim_batch, self.bound - self.held - reserved)
        if self.throttled:
            fullest = max(
                (e.held for url, e in self.endpoints.items() if url in self.hot), default=0
            )
            room = self.per_endpoint - fullest
            if timed_out:
                room = max(room, self.claim_batch // 4, 1)
            limit = min(limit, room)
        return max(limit, 0)

    def take(self, url: str, now_ms: int) -> Endpoint | None:
        """Hold one event for ``url``; None if its endpoint is full."""
        endpoint = self.endpoints.get(url)
        if endpoint is None:
            endpoint = self.endpoints[url] = Endpoint()
        if endpoint.held >= self.per_endpoint:
            self.hot.pop(url, None)  # to the end: the dict stays in order of heat
            self.hot[url] = now_ms
            return None
        endpoint.held += 1
        self.held += 1
        return endpoint

    def claimed(self, urls: Sequence[str], now_ms: int) -> None:
        """After a claim: throttle the next one if all it brought was for hot endpoints."""
        if self.hot:
            horizon = now_ms - self.HOT_MS
            self.hot = {u: t for u, t in self.hot.items() if t > horizon}
            while len(self.hot) > self.MAX_HOT:
                del self.hot[next(iter(self.hot))]  # the one hot longest ago
        self.throttled = bool(urls) and all(url in self.hot for url in urls)

    def release(self, url: str) -> None:
        endpoint = self.endpoints.get(url)
        if endpoint is None:
            return
        endpoint.held -= 1
        self.held -= 1
        if endpoint.held <= 0:
            del self.endpoints[url]


# --- the dispatcher ------------------------------------------------------------------------


class Dispatcher:
    """Sends the outbox's due events until cancelled (``run``)."""

    def __init__(
        self,
        store: DeliveryStore,
        variant: Variant,
        settings: WebhookSettings,
        fetcher: Fetcher,
        *,
        daily_quota: Callable[[str], int],
        mailer: Mailer | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``daily_quota``: an account's deliveries per UTC day (0: unlimited).  ``clock``:
        seconds since the epoch; every due time is taken from it, and the loop sleeps until
        the next one by trio's clock (a test moves both together)."""
        self.store = store
        self.variant = variant
        self.settings = settings
        self.fetcher = fetcher
        self.mailer = mailer
        self.stats: collections.Counter[str] = collections.Counter()
        self.latency = LatencyHistogram()
        self._daily_quota = daily_quota
        self._clock = clock
        self._limits = FetchLimits(
            max_bytes=MAX_RESPONSE_BYTES,
            timeout=settings.timeout,
            connect_timeout=min(CONNECT_TIMEOUT, settings.timeout),
            max_redirects=0,
        )
        # A lease too short for an attempt would let another worker send the event too.
        self._lease_ms = round(
            max(settings.lease_seconds, settings.timeout + 2 * LEASE_MARGIN) * 1000
        )
        self._attempt_ms = round((settings.timeout + LEASE_MARGIN) * 1000)
        # In flight, plus one more round of them waiting: a claim that took a whole block's
        # events would leave the other processes sharing the outbox nothing to send.
        lookahead = min(settings.claim_batch, settings.max_concurrency)
        self._admission = Admission(
            bound=settings.max_concurrency + lookahead,
            per_endpoint=settings.max_per_endpoint + settings.claim_batch,
            claim_batch=settings.claim_batch,
        )
        self._concurrency = trio.CapacityLimiter(settings.max_concurrency)
        self._held: dict[str, str] = {}  # event id -> URL, from claim until written
        self._outcomes: list[Outcome] = []
        self._holds: dict[str, int] = {}  # event id -> due again at (ms), to write
        self._timers: list[int] = []  # heap of due times (ms) this process knows
        self._spent: dict[str, int] = {}  # account -> the UTC day its quota ran out
        self._wakeup = trio.Event()
        self._flush_due = trio.Event()
        self._flush_full = trio.Event()
        self._notices_in, self._notices_out = trio.open_memory_channel[tuple[str, str]](MAIL_QUEUE)

    @property
    def in_flight(self) -> int:
        """Events held in memory: leased and not yet written back."""
        return len(self._held) + self._returning()

    def _returning(self) -> int:
        """Claimed events given back at once (no room at their endpoint), not yet written."""
        return sum(1 for event_id in self._holds if event_id not in self._held)

    def wake(self) -> None:
        """New events are in the outbox: claim now rather than at the next poll."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._flush_loop)
                nursery.start_soon(self._mail_loop)
                task_status.started()
                await self._claim_loop(nursery)
        finally:
            with trio.move_on_after(SHUTDOWN_GRACE, shield=True):
                await self._give_back_all()

    # --- claiming --------------------------------------------------------------------------

    async def _claim_loop(self, nursery: trio.Nursery) -> None:
        timed_out = True
        retry = STORE_RETRY[0]
        while True:
            self._wakeup = trio.Event()  # a wake() from here on is not lost
            limit = self._admission.limit(reserved=self._returning(), timed_out=timed_out)
            if limit > 0:
                now_ms = self._now_ms()
                try:
                    claimed = await self.store.claim_due_events(now_ms, limit, self._lease_ms)
                except StoreError as exc:
                    self._store_failed("claim", exc)
                    await trio.sleep(retry)
                    retry = min(retry * 2, STORE_RETRY[1])
                    continue
                retry = STORE_RETRY[0]
                overflow = self._admit(claimed, now_ms, nursery)
                if len(claimed) == limit and not overflow:
                    continue  # a full batch: more may be due
            timed_out = await self._idle()

    def _admit(self, claimed: list[Due], now_ms: int, nursery: trio.Nursery) -> int:
        """Queue each claimed event at its endpoint (starting a worker there if it has fewer
        than ``max_per_endpoint``), or give it back if the endpoint is full.  How many were
        given back."""
        overflow = 0
        for due in claimed:
            endpoint = self._admission.take(due.url, now_ms)
            if endpoint is None:
                overflow += 1
                self._hold(due.event.id, now_ms + OVERFLOW_DELAY_MS)
                continue
            self._held[due.event.id] = due.url
            endpoint.waiting.append((due, now_ms + self._lease_ms))
            if endpoint.workers < self.settings.max_per_endpoint:
                endpoint.workers += 1
                nursery.start_soon(self._work, endpoint)
        self._admission.claimed([due.url for due in claimed], now_ms)
        self.stats["deferred"] += overflow
        return overflow

    async def _idle(self) -> bool:
        """Until wake(), written outcomes free room, a known due time comes, or the poll
        interval passes; True if time ended the wait."""
        now = self._clock()
        now_ms = int(now * 1000)
        while self._timers and self._timers[0] <= now_ms:
            heapq.heappop(self._timers)
        wait = self.settings.poll_interval
        if self._timers:
            # A millisecond past it: the claim's "due at or before now" then holds for sure.
            wait = min(wait, (self._timers[0] + 1) / 1000 - now)
        with trio.move_on_after(max(wait, 0.0)):
            await self._wakeup.wait()
            return False
        return True

    def _remember(self, due_ms: int) -> None:
        heapq.heappush(self._timers, due_ms)
        if len(self._timers) > MAX_TIMERS:
            self._timers = heapq.nsmallest(MAX_TIMERS // 2, self._timers)

    # --- one attempt -----------------------------------------------------------------------

    async def _work(self, endpoint: Endpoint) -> None:
        """Send an endpoint's waiting events one after the other, in claim order (the
        outbox's: due time, then sequence); one of at most ``max_per_endpoint`` workers."""
        done = False
        try:
            while True:
                async with self._concurrency:
                    if not endpoint.waiting:
                        # Before any checkpoint: an event admitted from now on starts a worker.
                        endpoint.workers -= 1
                        done = True
                        return
                    due, lease_until = endpoint.waiting.popleft()
                    await self._deliver(due, lease_until)
        finally:
            if not done:
                endpoint.workers -= 1

    async def _deliver(self, due: Due, lease_until: int) -> None:
        try:
            await self._attempt(due, lease_until)
        except Exception:
            # A bug must not stop delivery: the event comes back when its lease runs out.
            log.exception(
                "webhooks: delivery failed",
                extra={"fields": {"event": due.event.id, "webhook": due.event.webhook_id}},
            )
            self.stats["errors"] += 1
            self._release(due.event.id)
            self._wakeup.set()

    async def _attempt(self, due: Due, lease_until: int) -> None:
        event = due.event
        now_ms = self._now_ms()
        if now_ms + self._attempt_ms > lease_until:
            # It waited for its endpoint so long that the lease could run out mid-attempt.
            self.stats["deferred"] += 1
            self._hold(event.id, now_ms + OVERFLOW_DELAY_MS)
            return
        held_until = await self._quota_hold(event.account_id, now_ms)
        if held_until is not None:
            self._hold(event.id, held_until)
            return
        attempt = await self._send(due)
        outcome = judge(self.variant, due, attempt, self._now_ms())
        self._count(outcome)
        self._outcomes.append(outcome)
        self._flush_due.set()
        if len(self._outcomes) >= FLUSH_BATCH:
            self._flush_full.set()

    async def _quota_hold(self, account_id: str, now_ms: int) -> int | None:
        """Count one delivery against the account's UTC day; None if it may go out, else
        until when to hold the event: the next midnight when the day's deliveries are used
        up, a moment when the store cannot say (never sent uncounted)."""
        limit = self._daily_quota(account_id)
        if limit <= 0:
            return None
        day = utc_day(now_ms)
        if self._spent.get(account_id) != day:
            try:
                taken = await self.store.take_delivery_quota(account_id, day, limit)
            except StoreError as exc:
                self._store_failed("quota", exc)
                self.stats["deferred"] += 1
                return now_ms + OVERFLOW_DELAY_MS
            if taken:
                return None
            if len(self._spent) >= MAX_SPENT:
                self._spent.clear()
            self._spent[account_id] = day
        self.stats["held_quota"] += 1
        return next_utc_midnight(now_ms)

    async def _send(self, due: Due) -> Attempt:
        event = due.event
        body = event.body.encode()
        started_ms = self._now_ms()
        headers: list[tuple[str, str]] = []
        status: int | None = None
        answer: str | None = None
        error: str | None = None
        began = trio.current_time()
        try:
            secrets = [due.secret]
            if due.previous_secret:
                secrets.append(due.previous_secret)
            headers = self.variant.headers(
                event_id=event.id,
                event_type=due.event_type,
                body=body,
                timestamp=int(self._clock()),
                secrets=secrets,
            )
            error = self._refused_scheme(due.url)
            if error is None:
                response = await self.fetcher.post(
                    due.url, body, headers=headers, limits=self._limits
                )
                status = response.status
                kept = response.body[: self.settings.response_log_bytes]
                answer = kept.decode("utf-8", errors="replace")
                if not response.ok:
                    error = f"receiver answered {status} {response.reason}".rstrip()
                    if 300 <= status < 400:
                        error += " (redirects are not followed: use the final URL)"
        except FetchError as exc:
            error = str(exc)  # names the origin at most, never the path
        except ValueError as exc:  # a secret or URL that cannot be used
            error = f"not sent: {exc}"
        elapsed = trio.current_time() - began
        self.latency.series("delivered" if error is None else "failed").observe(elapsed)
        return Attempt(
            event_id=event.id,
            attempt=event.attempts + 1,
            webhook_id=event.webhook_id,
            started_at=started_ms,
            url=due.url,
            request_headers=_headers_encoder.encode(headers).decode(),
            status=status,
            response_body=answer,
            latency_ms=round(elapsed * 1000),
            error=error,
        )

    def _refused_scheme(self, url: str) -> str | None:
        if urlsplit(url).scheme.lower() == "http" and not self.settings.allow_http:
            return "not sent: this deployment delivers to https:// URLs only"
        return None

    def _count(self, outcome: Outcome) -> None:
        stats = self.stats
        stats["sent"] += 1
        if outcome.state == "delivered":
            stats["delivered"] += 1
            return
        stats["failed_attempts"] += 1
        if outcome.state == "pending":
            stats["retries_scheduled"] += 1
        else:
            stats["events_failed"] += 1
        if outcome.webhook_status == "paused":
            stats["webhooks_paused"] += 1
        elif outcome.webhook_status == "disabled":
            stats["webhooks_disabled"] += 1

    def _hold(self, event_id: str, until_ms: int) -> None:
        self._holds[event_id] = until_ms
        self._flush_due.set()

    def _release(self, event_id: str) -> None:
        url = self._held.pop(event_id, None)
        if url is not None:
            self._admission.release(url)

    # --- writing outcomes ------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_due.wait()
            with trio.move_on_after(FLUSH_INTERVAL):
                await self._flush_full.wait()
            self._flush_due = trio.Event()
            self._flush_full = trio.Event()
            await self._flush(patient=True)

    async def _flush(self, *, patient: bool) -> bool:
        """Write the outcomes and give-backs collected so far.  Patient: until the store
        takes them (the leases run out meanwhile: at least once, never lost).  True if all
        were written."""
        retry = STORE_RETRY[0]
        while self._outcomes or self._holds:
            if await self._write_outcomes() and await self._write_holds():
                continue
            if not patient:
                return False
            await trio.sleep(retry)
            retry = min(retry * 2, STORE_RETRY[1])
        return True

    async def _write_outcomes(self) -> bool:
        outcomes, self._outcomes = self._outcomes, []
        if not outcomes:
            return True
        try:
            moved = set(await self.store.finish_attempts(outcomes))
        except StoreError as exc:
            self._store_failed("outcomes", exc)
            self._outcomes = outcomes + self._outcomes
            return False
        for outcome in outcomes:
            self._release(outcome.attempt.event_id)
            if outcome.state == "pending":
                self._remember(outcome.next_attempt_at)
            elif outcome.webhook_status == "paused" and outcome.attempt.webhook_id in moved:
                moved.discard(outcome.attempt.webhook_id)  # this call paused it: one e-mail
                self._notify_pause(outcome)
        self._wakeup.set()
        return True

    async def _write_holds(self) -> bool:
        holds, self._holds = self._holds, {}
        groups: dict[int, list[str]] = {}
        for event_id, until in holds.items():
            groups.setdefault(until, []).append(event_id)
        for until, ids in groups.items():
            try:
                await self.store.hold_events(ids, until)
            except StoreError as exc:
                self._store_failed("holds", exc)
                for event_id in ids:
                    self._holds.setdefault(event_id, until)
                continue
            for event_id in ids:
                self._release(event_id)
            self._remember(until)
        self._wakeup.set()
        return not self._holds

    async def _give_back_all(self) -> None:
        """On shutdown: write what is decided, and give every other held event back now,
        due at once — another process takes it without waiting for the lease to run out."""
        written = await self._flush(patient=False)
        now_ms = self._now_ms()
        if not written:
            self._outcomes = []  # their events are given back below and tried again
        for event_id in self._held:
            self._holds.setdefault(event_id, now_ms)
        await self._flush(patient=False)
        if self._holds:
            log.warning(
                "webhooks: events left leased at shutdown (sent again when it runs out)",
                extra={"fields": {"events": len(self._holds)}},
            )

    def _store_failed(self, what: str, exc: StoreError) -> None:
        self.stats["store_errors"] += 1
        log.warning("webhooks: store failed", extra={"fields": {"op": what, "error": str(exc)}})

    # --- pause notices ---------------------------------------------------------------------

    def _notify_pause(self, outcome: Outcome) -> None:
        """Queue the owner's e-mail (the store said this process's write paused it)."""
        webhook_id = outcome.attempt.webhook_id
        try:
            self._notices_in.send_nowait((webhook_id, outcome.webhook_status_reason or ""))
        except trio.WouldBlock:
            self.stats["mail_dropped"] += 1
            log.warning(
                "webhooks: paused; too many notices waiting, owner not e-mailed",
                extra={"fields": {"webhook": webhook_id}},
            )

    async def _mail_loop(self) -> None:
        async for webhook_id, reason in self._notices_out:
            await self._mail_owner(webhook_id, reason)

    async def _mail_owner(self, webhook_id: str, reason: str) -> None:
        fields = {"webhook": webhook_id, "reason": reason}
        if self.mailer is None:
            self.stats["mail_skipped"] += 1
            log.warning(
                "webhooks: paused; no SMTP server configured, owner not e-mailed",
                extra={"fields": fields},
            )
            return
        try:
            owner = await self.store.webhook_owner_email(webhook_id)
        except StoreError as exc:
            self.stats["mail_failed"] += 1
            self._store_failed("owner", exc)
            return
        if owner is None:
            return  # deleted since
        email, url = owner
        subject, text = pause_notice(webhook_id, url, reason)
        try:
            await self.mailer.send(email, subject, text)
        except Exception as exc:  # a mail never stops delivery
            self.stats["mail_failed"] += 1
            log.warning(
                "webhooks: pause notice not sent", extra={"fields": {**fields, "error": str(exc)}}
            )
            return
        self.stats["mail_sent"] += 1
        log.info("webhooks: paused; owner e-mailed", extra={"fields": fields})

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


# --- metrics -------------------------------------------------------------------------------

_DELIVERY_OUTCOMES = {
    "delivered": "delivered",
    "failed_attempts": "failed",
    "held_quota": "held_quota",
    "deferred": "deferred",
}


def register_delivery_metrics(registry: Registry, dispatcher: Dispatcher) -> None:
    def deliveries() -> Iterable[Sample]:
        for key, outcome in _DELIVERY_OUTCOMES.items():
            yield {"outcome": outcome}, float(dispatcher.stats[key])

    def activity() -> Iterable[Sample]:
        for kind, n in sorted(dispatcher.stats.items()):
            if kind not in _DELIVERY_OUTCOMES:
                yield {"kind": kind}, float(n)

    def in_flight() -> Iterable[Sample]:
        yield {}, float(dispatcher.in_flight)

    registry.family(
        "chaingate_webhook_deliveries_total",
        "counter",
        "Webhook delivery attempts by outcome (delivered, failed), and events not attempted: "
        "held for the account's daily quota, deferred while their endpoint was full.",
        deliveries,
    )
    registry.family(
        "chaingate_webhook_dispatcher_total",
        "counter",
        "Webhook dispatcher activity: attempts sent, retries scheduled, events failed, "
        "webhooks paused and disabled, pause e-mails sent/failed/skipped/dropped, errors.",
        activity,
    )
    registry.family(
        "chaingate_webhook_in_flight",
        "gauge",
        "Webhook events leased by this process and not yet written back.",
        in_flight,
    )
    registry.histogram(
        "chaingate_webhook_delivery_seconds",
        "Time from sending a webhook delivery to its answer (route: delivered or failed).",
        dispatcher.latency,
    )
