"""Webhook delivery: the outbox → real receivers, on SQLite and PostgreSQL.

Receivers are real HTTP servers on loopback (``tests/webhook_receiver.py``: h11, over TLS from
a trustme CA or plain TCP); the pause e-mail goes to a real SMTP server (aiosmtpd, in its own
thread) over STARTTLS with a login.  Signatures are checked with code we did not write
(``standardwebhooks``) and by hand with ``hmac``.

Retry schedules that span hours run on trio's MockClock: the dispatcher's clock and the
store's are the mock clock plus a fixed epoch, so hours pass in seconds of real time and every
due time is exact.  The mock clock jumps only after ``AUTOJUMP`` seconds of real idleness, so a
store call in a worker thread does not make time leap under it; a watchdog on the real clock
bounds those tests instead of trio deadlines.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import hashlib
import hmac
import ipaddress
import itertools
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from standardwebhooks.webhooks import Webhook

from chaingate.auth.store import AuthRows
from chaingate.config import SmtpSettings, WebhookSettings
from chaingate.obs.metrics import Registry
from chaingate.outbound import Fetcher, IPAddress, OutboundPolicy, TcpConnector
from chaingate.store import Store, open_store
from chaingate.store.base import new_id
from chaingate.webhooks.delivery import (
    Admission,
    Dispatcher,
    judge,
    next_utc_midnight,
    register_delivery_metrics,
)
from chaingate.webhooks.mailer import Mailer, MailError
from chaingate.webhooks.model import event_id
from chaingate.webhooks.outbox import Attempt, Due, NewEvent, OutboxEvent
from chaingate.webhooks.store import WebhookRow, WebhookRows
from chaingate.webhooks.variants import VARIANT_A, VARIANT_B, Variant, new_secret, verify_a
from tests.webhook_receiver import Receiver, tls_pair

AUTOJUMP = 0.1
# 2024-05-01T00:00:00Z: mock-clock tests start a little before a midnight they can cross.
MIDNIGHT = 1_714_521_600
SMTP_USER = "mailer"
SMTP_PASSWORD = "s3cret-smtp-pa55"


Clock = Callable[[], float]


def mock_time(mock: trio.testing.MockClock, base: float) -> Clock:
    """Seconds since the epoch on the mock clock (read directly: the store reads its clock in
    worker threads too)."""
    return lambda: base + mock.current_time()


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=AUTOJUMP)


@contextlib.contextmanager
def real_time_limit(seconds: float) -> Iterator[None]:
    """Fail the block after ``seconds`` of wall-clock time (trio's deadlines are mocked)."""
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:
        timer = threading.Timer(seconds, lambda: token.run_sync_soon(scope.cancel))
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
    if scope.cancelled_caught:
        pytest.fail(f"not done within {seconds} s of real time")


@contextlib.asynccontextmanager
async def opened(url: str, data_dir: Path, clock: Clock = time.time) -> AsyncIterator[Store]:
    store = open_store(url, data_dir, clock=lambda: int(clock() * 1000))
    async with store:
        await store.migrate()
        yield store


async def make_webhook(store: Store, account_id: str, url: str, variant: Variant) -> WebhookRow:
    now = store.clock()
    row = WebhookRow(
        id=new_id("wh_"),
        account_id=account_id,
        url=url,
        chain="ethereum",
        network="devnet",
        chain_label="ethereum",
        event_type=variant.type_name("address_activity"),
        config="{}",
        confirmations=0,
        status="active",
        status_reason=None,
        secret=new_secret(),
        previous_secret=None,
        previous_secret_until=None,
        sequence=0,
        matched_from=None,
        created_at=now,
        updated_at=now,
    )
    return await WebhookRows(store).create_webhook(row, limit=0)


async def add_events(store: Store, variant: Variant, hook: WebhookRow, count: int) -> list[str]:
    """``count`` events (the variant's test event) for ``hook``, in sequence order."""
    events = [
        NewEvent(
            id=event_id(hook.id, f"test|{new_id('')}"),
            webhook_id=hook.id,
            event_type=variant.type_name("test"),
        )
        for _ in range(count)
    ]

    def render(event: NewEvent, sequence: int, now: int) -> str:
        return variant.render(
            None,
            event_id=event.id,
            webhook_id=hook.id,
            event_type=event.event_type,
            chain_label="ethereum",
            chain_id=31337,
            sequence=sequence,
            created_at_ms=now,
        )

    assert await WebhookRows(store).add_events(events, render) == count
    return [e.id for e in events]


def make_dispatcher(
    store: Store,
    variant: Variant,
    fetcher: Fetcher,
    *,
    clock: Clock = time.time,
    quota: int = 0,
    mailer: Mailer | None = None,
    **settings: Any,
) -> Dispatcher:
    return Dispatcher(
        WebhookRows(store),
        variant,
        WebhookSettings(variant=variant.name, **settings),  # type: ignore[arg-type]
        fetcher,
        daily_quota=lambda _account: quota,
        mailer=mailer,
        clock=clock,
    )


async def attempts_of(store: Store, hook: WebhookRow, event: str | None = None) -> list[Attempt]:
    found, _ = await WebhookRows(store).list_webhook_attempts(hook.id, event, offset=0, limit=100)
    return sorted(found, key=lambda a: (a.event_id, a.attempt))


async def event_row(store: Store, hook: WebhookRow, event: str) -> OutboxEvent:
    row = await WebhookRows(store).get_webhook_event(hook.id, event)
    assert row is not None
    return row


async def until(check: Callable[[], Any], interval: float = 0.02) -> None:
    """Poll ``check`` (an async predicate) until it holds; the caller bounds the wait."""
    while not await check():
        await trio.sleep(interval)


# --- a real SMTP server ----------------------------------------------------------------------


@dataclass
class Mail:
    recipients: list[str]
    message: EmailMessage
    authenticated: bool
    encrypted: bool


@dataclass
class Inbox:
    """An aiosmtpd server (its own thread and asyncio loop) that requires a login over TLS."""

    token: trio.lowlevel.TrioToken
    port: int = 0
    client_tls: ssl.SSLContext | None = None
    mails: list[Mail] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.mails.append(
            Mail(
                list(envelope.rcpt_tos),
                message,
                bool(session.authenticated),
                server.transport.get_extra_info("ssl_object") is not None,
            )
        )
        self.token.run_sync_soon(self._arrived)
        return "250 OK"

    def _arrived(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, count: int) -> list[Mail]:
        while len(self.mails) < count:
            await self.changed.wait()
        return list(self.mails)


def _authenticate(
    server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
) -> AuthResult:
    ok = (
        isinstance(auth_data, LoginPassword)
        and auth_data.login == SMTP_USER.encode()
        and auth_data.password == SMTP_PASSWORD.encode()
    )
    return AuthResult(success=ok, handled=False)  # a failure answers 535


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def smtp_server(*, implicit_tls: bool) -> AsyncIterator[Inbox]:
    server_tls, client_tls = tls_pair()
    inbox = Inbox(trio.lowlevel.current_trio_token(), _free_port(), client_tls)
    tls: dict[str, Any] = (
        {"ssl_context": server_tls}
        if implicit_tls
        else {"tls_context": server_tls, "require_starttls": True}
    )
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=inbox.port,
        authenticator=_authenticate,
        # aiosmtpd knows a STARTTLS session is encrypted, not an implicit-TLS one.
        auth_require_tls=not implicit_tls,
        **tls,
    )
    await trio.to_thread.run_sync(controller.start)
    try:
        yield inbox
    finally:
        await trio.to_thread.run_sync(controller.stop)


def smtp_settings(inbox: Inbox, scheme: str, password: str = SMTP_PASSWORD) -> SmtpSettings:
    return SmtpSettings(
        url=f"{scheme}://127.0.0.1:{inbox.port}",
        sender="alerts@chaingate.test",
        username=SMTP_USER,
        password=password,
        timeout=5.0,
    )


# --- the rules -------------------------------------------------------------------------------


def _due(retries: int) -> Due:
    event = OutboxEvent(
        id="evt_x",
        webhook_id="wh_x",
        account_id="acct_x",
        chain="ethereum",
        network="devnet",
        sequence=1,
        event_type="t",
        block_number=None,
        block_hash=None,
        deliver_at_block=None,
        original_id=None,
        body="{}",
        state="pending",
        attempts=retries,
        retries=retries,
        next_attempt_at=0,
        lease_until=0,
        created_at=0,
        finished_at=None,
        last_status=None,
        last_error=None,
    )
    return Due(event, "https://x.example/", "whsec_AA==", None, "t")


def _attempt(status: int | None, error: str | None = None) -> Attempt:
    return Attempt(
        event_id="evt_x",
        attempt=1,
        webhook_id="wh_x",
        started_at=0,
        url="https://x.example/",
        request_headers="[]",
        status=status,
        response_body=None,
        latency_ms=0,
        error=error,
    )


@pytest.mark.parametrize(
    ("variant", "delays", "exhausted"),
    [
        (VARIANT_A, [10, 60, 600, 3600, 21600], "paused"),
        (VARIANT_B, [1, 5, 30, 300, 1800, 7200, 28800], None),
    ],
    ids=["a", "b"],
)
def test_the_spec_retry_schedules_and_what_ends_them(
    variant: Variant, delays: list[int], exhausted: str | None
) -> None:
    now = 1_000_000
    # Failure n (n = 1 is the first attempt's) schedules retry n after delays[n-1] ...
    for done, delay in enumerate(delays):
        outcome = judge(variant, _due(done), _attempt(500, "receiver answered 500"), now)
        assert (outcome.state, outcome.retries) == ("pending", done + 1)
        assert outcome.next_attempt_at == now + delay * 1000
        assert outcome.webhook_status is None
    # ... and the failure of the last retry ends the round: A pauses the webhook, B does not.
    last = judge(variant, _due(len(delays)), _attempt(None, "timeout: no answer"), now)
    assert (last.state, last.retries) == ("failed", len(delays) + 1)
    assert last.webhook_status == exhausted
    if exhausted:
        assert last.webhook_status_reason == (
            f"{len(delays)} retries of event evt_x failed (last: timeout: no answer)"
        )
    # A 2xx on any retry delivers; a 410 disables at once; a 3xx is a failure like any other.
    assert judge(variant, _due(3), _attempt(204), now).state == "delivered"
    gone = judge(variant, _due(0), _attempt(410), now)
    assert (gone.state, gone.webhook_status) == ("failed", "disabled")
    assert judge(variant, _due(0), _attempt(301), now).state == "pending"


def test_a_full_endpoint_gets_no_more_and_others_keep_their_room() -> None:
    hung, other = "https://hung.example/", "https://other.example/"
    admission = Admission(bound=20, per_endpoint=6, claim_batch=8)
    assert admission.limit(reserved=0, timed_out=False) == 8
    taken = [admission.take(hung, 0) for _ in range(8)]
    assert sum(e is not None for e in taken) == 6  # two over its share are given back
    admission.claimed([hung] * 8, 0)
    # Everything claimed was for a full endpoint: the next claim waits for its room, except
    # once per poll interval, when a quarter batch goes through for whatever waits behind it.
    assert admission.limit(reserved=2, timed_out=False) == 0
    assert admission.limit(reserved=2, timed_out=True) == 2
    assert admission.take(other, 10) is not None
    admission.claimed([hung, other], 10)
    assert admission.limit(reserved=0, timed_out=False) == 8  # progress: full batches again
    assert admission.held == 7 and admission.limit(reserved=9, timed_out=False) == 4
    for _ in range(6):
        admission.release(hung)
    admission.release(other)
    assert admission.endpoints == {} and admission.held == 0  # idle endpoints are dropped
    # A busy endpoint stays hot while it drains and refills: claims for it alone are sized
    # to its room, not given back ...
    for _ in range(4):
        assert admission.take(hung, 20) is not None
    admission.claimed([hung] * 4, 20)
    assert admission.limit(reserved=0, timed_out=False) == 2
    # ... until a minute passes without a surplus.
    admission.claimed([hung], Admission.HOT_MS + 1)
    assert admission.hot == {} and admission.limit(reserved=0, timed_out=False) == 8


def test_midnight_is_the_next_utc_one() -> None:
    assert next_utc_midnight((MIDNIGHT - 1) * 1000) == MIDNIGHT * 1000
    assert next_utc_midnight(MIDNIGHT * 1000) == (MIDNIGHT + 86_400) * 1000


# --- deliveries ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", [VARIANT_A, VARIANT_B], ids=["a", "b"])
async def test_an_event_is_delivered_once_signed_with_both_secrets_of_a_rotation(
    store_url: str, tmp_path: Path, nursery: trio.Nursery, variant: Variant
) -> None:
    server_tls, client_tls = tls_pair()
    receiver = Receiver()
    await nursery.start(receiver.serve, server_tls)
    fetcher = Fetcher(OutboundPolicy.dev(), connector=TcpConnector(client_tls))
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        url = f"https://127.0.0.1:{receiver.port}/hooks/in?token=abc"
        hook = await make_webhook(store, account.id, url, variant)
        previous, current = hook.secret, new_secret()
        now = store.clock()
        await WebhookRows(store).rotate_webhook_secret(
            account.id, hook.id, current, now + 3_600_000, now
        )
        [event] = await add_events(store, variant, hook, 1)
        dispatcher = make_dispatcher(store, variant, fetcher)
        registry = Registry()
        register_delivery_metrics(registry, dispatcher)
        async with trio.open_nursery() as running:
            await running.start(dispatcher.run)
            with trio.fail_after(10):
                [received] = await receiver.wait_for(1)

                async def written() -> bool:
                    return (await event_row(store, hook, event)).state != "pending"

                await until(written)
            # Claimed again and again: nothing more is due.
            for _ in range(5):
                dispatcher.wake()
                await trio.sleep(0.05)
            running.cancel_scope.cancel()

        assert len(receiver.received) == 1
        row = await event_row(store, hook, event)
        assert (row.state, row.attempts, row.retries, row.last_status) == ("delivered", 1, 0, 200)
        body, headers = received.body, received.headers
        assert body == row.body.encode() and received.path == "/hooks/in?token=abc"
        assert received.method == "POST" and headers["content-type"] == "application/json"
        assert headers["webhook-id"] == event == received.json()["id"]
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 10
        for secret in (current, previous):
            Webhook(secret).verify(body, headers)  # raises unless one signature verifies
            if variant is VARIANT_A:
                stamp = headers["x-service-timestamp"]
                digest = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
                assert digest.hexdigest() in headers["x-service-signature"].split(",")
                assert verify_a(body, headers, secret)
            else:
                digest = hmac.new(secret.encode(), body, hashlib.sha256)
                assert f"sha256={digest.hexdigest()}" in headers["x-cloud-signature"].split(",")
                assert headers["x-webhook-idempotency-key"] == event
                assert headers["x-webhook-event"] == received.json()["type"]

        [attempt] = await attempts_of(store, hook)
        assert (attempt.status, attempt.response_body, attempt.error) == (200, "ok", None)
        assert attempt.url == url and attempt.attempt == 1
        logged = dict(msgspec.json.decode(attempt.request_headers, type=list[tuple[str, str]]))
        assert logged["webhook-signature"] == headers["webhook-signature"]
        assert current not in attempt.request_headers and previous not in attempt.request_headers
        assert dispatcher.stats["sent"] == dispatcher.stats["delivered"] == 1
        scraped = registry.render().decode()
        assert 'chaingate_webhook_deliveries_total{outcome="delivered"} 1' in scraped
        assert 'chaingate_webhook_delivery_seconds_count{route="delivered"} 1' in scraped
        assert "chaingate_webhook_in_flight 0" in scraped


async def test_variant_a_retries_on_schedule_then_pauses_and_mails_the_owner_once(
    store_url: str, tmp_path: Path, nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    receiver = Receiver(answer=lambda _r: 500)
    await nursery.start(receiver.serve)
    clock = mock_time(mock_clock, MIDNIGHT + 3600)
    fetcher = Fetcher(OutboundPolicy.dev())
    async with (
        smtp_server(implicit_tls=False) as inbox,
        opened(store_url, tmp_path, clock) as store,
    ):
        account = await AuthRows(store).create_account("owner@example.com", "free")
        url = f"http://127.0.0.1:{receiver.port}/a"
        hook = await make_webhook(store, account.id, url, VARIANT_A)
        [event] = await add_events(store, VARIANT_A, hook, 1)
        mailer = Mailer(smtp_settings(inbox, "smtp"), ssl_context=inbox.client_tls)
        # The poll is a week: every retry is found by the due time the dispatcher keeps.
        dispatcher = make_dispatcher(
            store,
            VARIANT_A,
            fetcher,
            clock=clock,
            mailer=mailer,
            allow_http=True,
            poll_interval=7 * 86_400.0,
        )
        with real_time_limit(60):
            async with trio.open_nursery() as running:
                await running.start(dispatcher.run)
                await receiver.wait_for(6)
                [mail] = await inbox.wait_for(1)
                await trio.sleep(3 * 86_400)  # three more days: nothing more is sent
                running.cancel_scope.cancel()

        assert len(receiver.received) == 6 and len(inbox.mails) == 1
        delays = [10, 60, 600, 3600, 21600]
        arrivals = [r.at for r in receiver.received]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert gaps == pytest.approx(delays, abs=0.25)
        attempts = await attempts_of(store, hook, event)
        assert [a.attempt for a in attempts] == [1, 2, 3, 4, 5, 6]
        for before, after, delay in zip(attempts, attempts[1:], delays, strict=False):
            # Due ``delay`` after the failure was known, sent within the next few ms.
            late = after.started_at - (before.started_at + before.latency_ms) - delay * 1000
            assert -2 <= late <= 250
        assert {(a.status, a.error) for a in attempts} == {(500, "receiver answered 500")}
        row = await event_row(store, hook, event)
        assert (row.state, row.attempts, row.retries, row.last_status) == ("failed", 6, 6, 500)
        paused = await WebhookRows(store).get_webhook(account.id, hook.id)
        assert paused is not None and paused.status == "paused"
        assert paused.status_reason == (
            f"5 retries of event {event} failed (last: receiver answered 500)"
        )

        assert mail.recipients == ["owner@example.com"]
        assert mail.authenticated and mail.encrypted
        message = mail.message
        assert message["From"] == "alerts@chaingate.test" and message["To"] == "owner@example.com"
        assert hook.id in message["Subject"] and "paused" in message["Subject"]
        text = message.get_content()
        assert hook.id in text and url in text and "5 retries" in text
        assert f"PATCH /v1/webhooks/{hook.id}" in text and '{"status": "active"}' in text
        assert SMTP_PASSWORD not in message.as_string()
        stats = dispatcher.stats
        assert (stats["sent"], stats["failed_attempts"], stats["retries_scheduled"]) == (6, 6, 5)
        assert (stats["events_failed"], stats["webhooks_paused"], stats["mail_sent"]) == (1, 1, 1)


async def test_variant_b_fails_the_event_after_seven_retries_and_keeps_the_webhook(
    store_url: str, tmp_path: Path, nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    answers = [503] * 8 + [200]
    receiver = Receiver(answer=lambda _r: answers.pop(0))
    await nursery.start(receiver.serve)
    clock = mock_time(mock_clock, MIDNIGHT + 3600)
    async with opened(store_url, tmp_path, clock) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hook = await make_webhook(
            store, account.id, f"http://127.0.0.1:{receiver.port}/", VARIANT_B
        )
        [event] = await add_events(store, VARIANT_B, hook, 1)
        dispatcher = make_dispatcher(
            store,
            VARIANT_B,
            Fetcher(OutboundPolicy.dev()),
            clock=clock,
            allow_http=True,
            poll_interval=7 * 86_400.0,
        )
        with real_time_limit(60):
            async with trio.open_nursery() as running:
                await running.start(dispatcher.run)
                await receiver.wait_for(8)

                async def failed() -> bool:
                    return (await event_row(store, hook, event)).state == "failed"

                await until(failed, interval=0.1)
                # The webhook is still active: its next event goes out.
                [later] = await add_events(store, VARIANT_B, hook, 1)
                dispatcher.wake()
                await receiver.wait_for(9)
                running.cancel_scope.cancel()

        arrivals = [r.at for r in receiver.received[:8]]
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert gaps == pytest.approx([1, 5, 30, 300, 1800, 7200, 28800], abs=0.25)
        row = await event_row(store, hook, event)
        assert (row.state, row.attempts, row.retries, row.last_status) == ("failed", 8, 8, 503)
        active = await WebhookRows(store).get_webhook(account.id, hook.id)
        assert active is not None and (active.status, active.status_reason) == ("active", None)
        assert receiver.received[8].json()["id"] == later
        stats = dispatcher.stats
        assert (stats["retries_scheduled"], stats["events_failed"], stats["webhooks_paused"]) == (
            7,
            1,
            0,
        )


async def test_timeouts_dropped_connections_redirects_and_gone(
    store_url: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    answers: dict[str, int | str | tuple[int, bytes]] = {
        "/hang": "hang",
        "/drop": "drop",
        "/moved": 302,
        "/gone": 410,
        "/huge": (200, b"x" * 100_000),  # past what is read of an answer (64 KiB)
    }
    receiver = Receiver(answer=lambda r: answers[r.path])
    await nursery.start(receiver.serve)
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hooks, events = {}, {}
        for path in answers:
            url = f"http://127.0.0.1:{receiver.port}{path}"
            hooks[path] = await make_webhook(store, account.id, url, VARIANT_A)
            [events[path]] = await add_events(store, VARIANT_A, hooks[path], 1)
        dispatcher = make_dispatcher(
            store, VARIANT_A, Fetcher(OutboundPolicy.dev()), allow_http=True, timeout=0.5
        )
        async with trio.open_nursery() as running:
            await running.start(dispatcher.run)

            async def all_attempted() -> bool:
                for path, hook in hooks.items():
                    if (await event_row(store, hook, events[path])).attempts < 1:
                        return False
                return True

            with trio.fail_after(10):
                await until(all_attempted)
            running.cancel_scope.cancel()

        found = {path: (await attempts_of(store, hook))[0] for path, hook in hooks.items()}
        rows = {path: await event_row(store, hook, events[path]) for path, hook in hooks.items()}
        hang, drop, moved, gone = found["/hang"], found["/drop"], found["/moved"], found["/gone"]
        huge = found["/huge"]
        assert hang.status is None and hang.error is not None
        assert hang.error.startswith("timeout:") and "within 0.5 s" in hang.error
        assert 500 <= hang.latency_ms < 2000
        assert drop.status is None and drop.error is not None
        assert drop.error.startswith("http_error:") and drop.latency_ms < 500
        assert moved.status == 302 and moved.error is not None
        assert "redirects are not followed" in moved.error
        assert huge.status is None and huge.error is not None
        assert huge.error.startswith("too_large:") and "65536" in huge.error
        for path in ("/hang", "/drop", "/moved", "/huge"):
            row, attempt = rows[path], found[path]
            assert (row.state, row.retries, row.attempts) == ("pending", 1, 1)
            assert row.last_error == attempt.error
            # Retry 1 is due 10 s after the failure was known.
            due_after = row.next_attempt_at - (attempt.started_at + attempt.latency_ms)
            assert 9_990 <= due_after <= 10_010
        assert (gone.status, rows["/gone"].state) == (410, "failed")
        statuses = {
            p: await WebhookRows(store).get_webhook(account.id, h.id) for p, h in hooks.items()
        }
        assert {p: (w.status, w.status_reason) for p, w in statuses.items() if w} == {
            "/hang": ("active", None),
            "/drop": ("active", None),
            "/moved": ("active", None),
            "/huge": ("active", None),
            "/gone": ("disabled", "receiver answered 410 Gone"),
        }
        assert dispatcher.stats["webhooks_disabled"] == 1
        assert dispatcher.stats["retries_scheduled"] == 4


async def test_the_daily_quota_holds_the_fourth_event_until_midnight_utc(
    store_url: str, tmp_path: Path, nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    receiver = Receiver()
    await nursery.start(receiver.serve)
    start = MIDNIGHT - 60  # 23:59:00 UTC
    clock = mock_time(mock_clock, start)
    async with opened(store_url, tmp_path, clock) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hook = await make_webhook(
            store, account.id, f"http://127.0.0.1:{receiver.port}/", VARIANT_A
        )
        events = await add_events(store, VARIANT_A, hook, 4)
        dispatcher = make_dispatcher(
            store,
            VARIANT_A,
            Fetcher(OutboundPolicy.dev()),
            clock=clock,
            quota=3,
            allow_http=True,
            max_per_endpoint=1,  # one at a time: attempted in sequence order
            poll_interval=7 * 86_400.0,
        )
        with real_time_limit(60):
            async with trio.open_nursery() as running:
                await running.start(dispatcher.run)
                await receiver.wait_for(3)

                async def held() -> bool:  # and the hold written
                    return dispatcher.stats["held_quota"] == 1 and dispatcher.in_flight == 0

                await until(held, interval=0.01)
                waiting = await event_row(store, hook, events[3])
                assert clock() < MIDNIGHT
                await receiver.wait_for(4)
                running.cancel_scope.cancel()

    assert (waiting.state, waiting.attempts, waiting.lease_until) == ("pending", 0, 0)
    assert waiting.next_attempt_at == MIDNIGHT * 1000
    assert [r.json()["id"] for r in receiver.received] == events
    assert all(start + r.at < MIDNIGHT for r in receiver.received[:3])
    assert MIDNIGHT <= start + receiver.received[3].at < MIDNIGHT + 1
    assert dispatcher.stats["held_quota"] == 1 and dispatcher.stats["delivered"] == 4


async def test_concurrency_is_bounded_per_endpoint_overall_and_in_memory(
    store_url: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    one, two = Receiver(delay=0.3), Receiver(delay=0.3)
    await nursery.start(one.serve)
    await nursery.start(two.serve)
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        events = []
        for receiver in (one, two):
            url = f"http://127.0.0.1:{receiver.port}/"
            hook = await make_webhook(store, account.id, url, VARIANT_B)
            events += await add_events(store, VARIANT_B, hook, 6)
        dispatcher = make_dispatcher(
            store,
            VARIANT_B,
            Fetcher(OutboundPolicy.dev()),
            allow_http=True,
            max_per_endpoint=2,
            max_concurrency=3,
            claim_batch=4,
        )
        peak_total = peak_held = 0
        async with trio.open_nursery() as running:
            await running.start(dispatcher.run)
            with trio.fail_after(20):
                while len(one.received) + len(two.received) < 12 or dispatcher.in_flight:
                    peak_total = max(peak_total, one.concurrent + two.concurrent)
                    peak_held = max(peak_held, dispatcher.in_flight)
                    await trio.sleep(0.01)
            running.cancel_scope.cancel()

    assert one.max_concurrent <= 2 and two.max_concurrent <= 2
    assert max(one.max_concurrent, two.max_concurrent) == 2
    assert peak_total == 3  # max_concurrency, reached and never passed
    assert 0 < peak_held <= 3 + 3  # max_concurrency + min(claim_batch, max_concurrency)
    delivered = [r.json()["id"] for r in one.received + two.received]
    assert sorted(delivered) == sorted(events)  # each once


async def test_two_dispatchers_share_one_outbox_and_send_each_event_once(
    store_url: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Two processes' dispatchers on one store (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite:
    one writer at a time): every event is sent exactly once, and both take a share."""
    receiver = Receiver(delay=0.01)
    await nursery.start(receiver.serve)
    async with opened(store_url, tmp_path) as first, opened(store_url, tmp_path) as second:
        account = await AuthRows(first).create_account("owner@example.com", "free")
        url = f"http://127.0.0.1:{receiver.port}/"
        events = []
        for _ in range(4):
            hook = await make_webhook(first, account.id, url, VARIANT_A)
            events += await add_events(first, VARIANT_A, hook, 50)
        dispatchers = [
            make_dispatcher(
                store,
                VARIANT_A,
                Fetcher(OutboundPolicy.dev()),
                allow_http=True,
                claim_batch=10,
                max_per_endpoint=4,
                poll_interval=0.02,
            )
            for store in (first, second)
        ]
        async with trio.open_nursery() as running:
            for dispatcher in dispatchers:
                await running.start(dispatcher.run)
            with trio.fail_after(30):
                await receiver.wait_for(len(events))
                while any(d.in_flight for d in dispatchers):
                    await trio.sleep(0.02)
            await trio.sleep(0.3)  # a second delivery of anything would arrive by now
            running.cancel_scope.cancel()
    delivered = [r.json()["id"] for r in receiver.received]
    assert sorted(delivered) == sorted(events)  # each exactly once
    assert all(d.stats["delivered"] > 0 for d in dispatchers), [d.stats for d in dispatchers]


async def test_claims_come_in_outbox_order_before_and_after_the_outbox_is_analyzed(
    store_url: str, tmp_path: Path
) -> None:
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hook = await make_webhook(store, account.id, "https://receiver.example/", VARIANT_A)
        events = await add_events(store, VARIANT_A, hook, 30)
        first = await WebhookRows(store).claim_due_events(store.clock(), 10, 60_000)
        await WebhookRows(
            store
        ).analyze_outbox()  # PostgreSQL's statistics refreshed (SQLite's too)
        second = await WebhookRows(store).claim_due_events(store.clock(), 100, 60_000)
    assert [d.event.id for d in first + second] == events  # by sequence, each once
    assert [d.event.sequence for d in first + second] == list(range(1, 31))


@dataclass
class StaticResolver:
    names: dict[str, list[str]]

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        return [ipaddress.ip_address(a) for a in self.names[host]]


@dataclass
class RecordingConnector:
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def connect(self, address: IPAddress, port: int, server_name: str | None) -> Any:
        self.calls.append((str(address), port))
        raise OSError("this test never connects")


async def test_refused_addresses_and_plain_http_are_never_connected_to(
    store_url: str, tmp_path: Path
) -> None:
    connector = RecordingConnector()
    resolver = StaticResolver({"hooks.internal.example": ["93.184.216.34", "192.168.1.20"]})
    fetcher = Fetcher(OutboundPolicy(), resolver=resolver, connector=connector)
    urls = {
        "private": "https://10.1.2.3/hook",
        "resolves-inside": "https://hooks.internal.example/hook?key=s3cr3t",
        "plain": "http://93.184.216.34/hook",
    }
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hooks = {k: await make_webhook(store, account.id, u, VARIANT_A) for k, u in urls.items()}
        for hook in hooks.values():
            await add_events(store, VARIANT_A, hook, 1)
        dispatcher = make_dispatcher(store, VARIANT_A, fetcher)
        async with trio.open_nursery() as running:
            await running.start(dispatcher.run)

            async def all_failed() -> bool:
                return dispatcher.stats["failed_attempts"] == 3 and dispatcher.in_flight == 0

            with trio.fail_after(10):
                await until(all_failed)
            running.cancel_scope.cancel()
        found = {k: (await attempts_of(store, h))[0] for k, h in hooks.items()}

    assert connector.calls == []
    assert {a.status for a in found.values()} == {None}
    assert found["private"].error == (
        "blocked_address: https://10.1.2.3: address 10.1.2.3 refused (private)"
    )
    error = found["resolves-inside"].error
    assert error is not None and error.startswith("blocked_address:") and "192.168.1.20" in error
    assert "s3cr3t" not in error
    assert found["plain"].error == "not sent: this deployment delivers to https:// URLs only"


async def test_shutdown_gives_events_under_way_back_at_once(
    store_url: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    receiver = Receiver(answer=lambda _r: "hang")
    await nursery.start(receiver.serve)
    async with opened(store_url, tmp_path) as store:
        account = await AuthRows(store).create_account("owner@example.com", "free")
        hook = await make_webhook(
            store, account.id, f"http://127.0.0.1:{receiver.port}/", VARIANT_A
        )
        [event] = await add_events(store, VARIANT_A, hook, 1)
        settings: dict[str, Any] = {"allow_http": True, "timeout": 10.0, "lease_seconds": 300.0}
        first = make_dispatcher(store, VARIANT_A, Fetcher(OutboundPolicy.dev()), **settings)
        with trio.fail_after(10):
            async with trio.open_nursery() as running:
                await running.start(first.run)
                await receiver.wait_for(1)
                running.cancel_scope.cancel()
        row = await event_row(store, hook, event)
        # Not attempted as far as the log goes, not leased: due now, for anyone.
        assert (row.state, row.attempts, row.lease_until) == ("pending", 0, 0)
        assert row.next_attempt_at <= store.clock()
        assert await attempts_of(store, hook) == []

        receiver.answer = lambda _r: 200
        second = make_dispatcher(store, VARIANT_A, Fetcher(OutboundPolicy.dev()), **settings)
        with trio.fail_after(10):
            async with trio.open_nursery() as running:
                await running.start(second.run)
                await receiver.wait_for(2)

                async def delivered() -> bool:
                    return (await event_row(store, hook, event)).state == "delivered"

                await until(delivered)
                running.cancel_scope.cancel()
        assert [r.json()["id"] for r in receiver.received] == [event, event]


# --- the mailer ------------------------------------------------------------------------------


async def test_the_mailer_speaks_implicit_tls_and_never_shows_the_password() -> None:
    async with smtp_server(implicit_tls=True) as inbox:
        mailer = Mailer(smtp_settings(inbox, "smtps"), ssl_context=inbox.client_tls)
        with trio.fail_after(10):
            await mailer.send("owner@example.com", "Subject line", "Body text.\n")
            [mail] = await inbox.wait_for(1)
        assert mail.authenticated and mail.encrypted
        assert mail.message["Subject"] == "Subject line"
        assert mail.message.get_content().replace("\r\n", "\n") == "Body text.\n"

        wrong = Mailer(
            smtp_settings(inbox, "smtps", "wrong-password"), ssl_context=inbox.client_tls
        )
        with pytest.raises(MailError) as caught, trio.fail_after(10):
            await wrong.send("owner@example.com", "Subject", "Body")
        assert "SMTPAuthenticationError" in str(caught.value)
        assert "wrong-password" not in str(caught.value)
        # A header that would smuggle another is refused before any connection.
        with pytest.raises(MailError):
            await mailer.send("owner@example.com\r\nBcc: someone@example.com", "S", "B")
        assert len(inbox.mails) == 1
