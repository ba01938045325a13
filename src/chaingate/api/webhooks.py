"""Signed webhooks: the spec's ``POST``, ``GET`` (list), ``PATCH`` and ``DELETE /v1/webhooks``,
and beyond it ``GET /v1/webhooks/{id}``, the delivery log (``/events``, ``/attempts``),
replays, a test ping and secret rotation.

A webhook is matched on one followed network from the block its answer names
(``matched_from_block``): creating it, or changing what it matches, takes effect at exactly
that block (``chaingate.webhooks.blockmatcher``).  Its ``config`` is checked strictly
(``chaingate.webhooks.filters``): a wrong key or value is 400 naming ``config.<key>``.  Its URL
must be one this deployment may deliver to — HTTPS, and a host that resolves only to addresses
the outbound policy allows — checked here and again at every delivery; and one that
displays as what it is: no space, control or invisible formatting character
(``chaingate.printable``).  Another account's webhook is 404, exactly like one that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import ChainName, Paged25, UnixTime
from chaingate.api.wallets import iso
from chaingate.evm.addresses import checksum_address
from chaingate.wallets.model import account_of
from chaingate.webhooks.manage import (
    EventCancelled,
    EventInFlight,
    InvalidField,
    NoEvent,
    NotServed,
    NoWebhook,
    Subscriptions,
    WebhookChange,
)
from chaingate.webhooks.outbox import Attempt, OutboxEvent
from chaingate.webhooks.service import MAX_URL_LENGTH, WebhookService
from chaingate.webhooks.store import WebhookLimitReached, WebhookRow

Url = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_URL_LENGTH)]
EventType = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Confirmations = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        description="Beyond the spec: deliver once the block is this many blocks deep "
        "(0: at once; at most the deployment's max_confirmations, 128 by default).",
    ),
]
EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Status = Literal["active", "paused", "disabled"]
EventState = Literal["pending", "delivered", "failed", "cancelled"]
AddressEdit = Annotated[
    list[Any],
    msgspec.Meta(
        description="Beyond the spec: addresses to add to (or remove from) config.addresses, "
        "without sending the whole list."
    ),
]
SigningSecret = Annotated[
    str,
    msgspec.Meta(description="whsec_...: the HMAC key of the signatures. Shown only here."),
]
MatchedFrom = Annotated[
    int | None,
    msgspec.Meta(
        description="Beyond the spec: the first block whose events the webhook gets with its "
        "current settings (null: the first block the network's matcher handles)."
    ),
]
MatchedFromChange = Annotated[
    int | UnsetType | None,
    msgspec.Meta(
        description="Present when the change moved what an active webhook matches: the first "
        "block matched the new way."
    ),
]
StatusReason = Annotated[
    str | None,
    msgspec.Meta(
        description="Why the service paused or disabled the webhook (null: active, or set by "
        "its owner)."
    ),
]


# --- requests --------------------------------------------------------------------------------


class CreateWebhook(msgspec.Struct, forbid_unknown_fields=True):
    url: Url
    chain: ChainName
    event_type: EventType
    config: dict[str, Any] | None = None
    confirmations: Confirmations = 0


class UpdateWebhook(msgspec.Struct, forbid_unknown_fields=True):
    url: Url | None = None
    status: Literal["active", "paused"] | None = None
    config: dict[str, Any] | None = None
    confirmations: Confirmations | None = None
    addresses_to_add: AddressEdit | None = None
    addresses_to_remove: AddressEdit | None = None


class WebhookPath(msgspec.Struct, forbid_unknown_fields=True):
    id: str


class EventPath(msgspec.Struct, forbid_unknown_fields=True):
    id: str
    event_id: str


class ListQuery(Paged25, forbid_unknown_fields=True):
    status: Status | None = None


class EventsQuery(Paged25, forbid_unknown_fields=True):
    state: EventState | None = None


class AttemptsQuery(Paged25, forbid_unknown_fields=True):
    event_id: EventId | None = None


class ReplayBody(msgspec.Struct, forbid_unknown_fields=True):
    since: UnixTime


# --- answers ---------------------------------------------------------------------------------


class CreatedWebhook(msgspec.Struct):
    """The subscription as created: the only answer that carries ``signing_secret``."""

    id: str
    url: str
    chain: str
    event_type: str
    config: dict[str, Any]
    signing_secret: SigningSecret
    status: Status
    created_at: str
    confirmations: int
    matched_from_block: MatchedFrom


class Webhook(msgspec.Struct):
    id: str
    url: str
    chain: str
    event_type: str
    config: dict[str, Any]
    status: Status
    status_reason: StatusReason
    confirmations: int
    matched_from_block: MatchedFrom
    created_at: str
    updated_at: str


class WebhookSummary(msgspec.Struct):
    id: str
    url: str
    chain: str
    event_type: str
    status: Status
    created_at: str


class WebhookList(msgspec.Struct):
    webhooks: list[WebhookSummary]
    page: int
    total: int
    limit: int


class UpdatedWebhook(msgspec.Struct):
    id: str
    url: str
    chain: str
    event_type: str
    status: Status
    updated_at: str
    matched_from_block: MatchedFromChange = UNSET


class DeletedWebhook(msgspec.Struct):
    id: str
    deleted: bool


class WebhookEvent(msgspec.Struct):
    id: str
    event_type: str
    sequence: int
    block_number: int | None
    block_hash: str | None
    original_id: Annotated[
        str | None,
        msgspec.Meta(
            description="A compensating event (its block left the chain after it was "
            "sent): the event it takes back."
        ),
    ]
    state: EventState
    attempts: int
    next_attempt_at: Annotated[
        str | None, msgspec.Meta(description="When the next attempt is due (null: not pending).")
    ]
    created_at: str
    last_status: int | None
    last_error: str | None
    body: Annotated[dict[str, Any], msgspec.Meta(description="Exactly what every attempt sends.")]


class WebhookEventList(msgspec.Struct):
    events: list[WebhookEvent]
    page: int
    total: int
    limit: int


class DeliveryAttempt(msgspec.Struct):
    event_id: str
    attempt: int
    started_at: str
    url: str
    request_headers: list[tuple[str, str]]
    status: Annotated[
        int | None,
        msgspec.Meta(description="The receiver's HTTP status (null: no answer; see error)."),
    ]
    response_body: str | None
    latency_ms: int
    error: str | None


class DeliveryAttemptList(msgspec.Struct):
    attempts: list[DeliveryAttempt]
    page: int
    total: int
    limit: int


class Replayed(msgspec.Struct):
    replayed: int


class PingSent(msgspec.Struct):
    """The test event written to the outbox (its delivery follows)."""

    event_id: str


class RotatedSecret(msgspec.Struct):
    id: str
    signing_secret: SigningSecret
    previous_secret_expires_at: str


# --- helpers ---------------------------------------------------------------------------------

_headers_decoder = msgspec.json.Decoder(list[tuple[str, str]])


def service_of(deps: ApiDeps) -> WebhookService:
    if deps.webhooks is None:
        raise ApiError(404, "webhooks need a store (and [webhooks] enabled) on this deployment")
    service: WebhookService = deps.webhooks
    return service


def subscriptions_of(deps: ApiDeps) -> Subscriptions:
    return Subscriptions(service_of(deps))


@contextmanager
def _refusals() -> Iterator[None]:
    """What the webhook rules refuse, as the API answers it (their messages as they are)."""
    try:
        yield
    except InvalidField as exc:
        raise ApiError(400, str(exc)) from None
    except WebhookLimitReached as exc:
        raise ApiError(403, str(exc)) from None
    except (NotServed, NoWebhook, NoEvent) as exc:
        raise ApiError(404, str(exc)) from None
    except EventCancelled as exc:
        raise ApiError(409, str(exc), code="conflict") from None
    except EventInFlight as exc:
        headers = {"Retry-After": str(exc.retry_after)}
        raise ApiError(409, str(exc), code="conflict", headers=headers) from None


_ADDRESS_KEYS = ("addresses", "contracts", "from", "to")


def shown_config(stored: str) -> dict[str, Any]:
    """The stored (normalised, lowercase) filter as answers show it: addresses EIP-55, like
    every address the API answers with."""
    config: dict[str, Any] = msgspec.json.decode(stored)
    for key in _ADDRESS_KEYS:
        values = config.get(key)
        if isinstance(values, list):
            config[key] = [checksum_address(v) if isinstance(v, str) else v for v in values]
    return config


def _webhook(row: WebhookRow) -> Webhook:
    return Webhook(
        id=row.id,
        url=row.url,
        chain=row.chain_label,
        event_type=row.event_type,
        config=shown_config(row.config),
        status=row.status,  # type: ignore[arg-type]  # the store holds only these three
        status_reason=row.status_reason,
        confirmations=row.confirmations,
        matched_from_block=row.matched_from,
        created_at=iso(row.created_at),
        updated_at=iso(row.updated_at),
    )


def _summary(row: WebhookRow) -> WebhookSummary:
    return WebhookSummary(
        id=row.id,
        url=row.url,
        chain=row.chain_label,
        event_type=row.event_type,
        status=row.status,  # type: ignore[arg-type]  # the store holds only these three
        created_at=iso(row.created_at),
    )


def _event(event: OutboxEvent) -> WebhookEvent:
    return WebhookEvent(
        id=event.id,
        event_type=event.event_type,
        sequence=event.sequence,
        block_number=event.block_number,
        block_hash=event.block_hash,
        original_id=event.original_id,
        state=event.state,  # type: ignore[arg-type]  # the store holds only these four
        attempts=event.attempts,
        next_attempt_at=iso(event.next_attempt_at) if event.state == "pending" else None,
        created_at=iso(event.created_at),
        last_status=event.last_status,
        last_error=event.last_error,
        body=msgspec.json.decode(event.body),
    )


def _attempt(attempt: Attempt) -> DeliveryAttempt:
    try:
        headers = _headers_decoder.decode(attempt.request_headers)
    except msgspec.DecodeError:
        headers = []
    return DeliveryAttempt(
        event_id=attempt.event_id,
        attempt=attempt.attempt,
        started_at=iso(attempt.started_at),
        url=attempt.url,
        request_headers=headers,
        status=attempt.status,
        response_body=attempt.response_body,
        latency_ms=attempt.latency_ms,
        error=attempt.error,
    )


# --- routes ----------------------------------------------------------------------------------


def register(api: RestApi, deps: ApiDeps) -> None:
    _register_subscriptions(api, deps, ChainResolver(deps.evm_networks, "webhooks"))
    _register_changes(api, deps)
    _register_log(api, deps)
    _register_deliveries(api, deps)


def _register_subscriptions(api: RestApi, deps: ApiDeps, chains: ChainResolver) -> None:
    """Creating, listing and reading webhooks."""

    @api.route(
        "POST",
        "/v1/webhooks",
        name="createWebhook",
        summary="Subscribe a URL to signed events of one chain",
        access="webhooks:manage",
        body=CreateWebhook,
        response=CreatedWebhook,
        status=201,
        errors=(400, 403, 404),
        tags=("webhooks",),
        description="`signing_secret` is shown here only, once. `config` filters by kind "
        "(address_activity: `addresses` (required), `selectors`; the other kinds' keys are in "
        'docs/decisions/webhooks.md, "Webhook filters"); its values, all keys together, count '
        "against the plan's limit per webhook, and the account's webhooks against its limit "
        "(403). The URL must be HTTPS and resolve only to public addresses. Beyond the spec: "
        "`confirmations` (deliver once the block is that deep) and `matched_from_block`, the "
        "first block whose events the webhook gets (null: the first block the network's "
        "matcher handles).",
    )
    async def create_webhook(call: Call[NoInput, NoInput, CreateWebhook]) -> Any:
        subscriptions = subscriptions_of(deps)
        body = call.body
        with _refusals():
            subscriptions.kind(body.event_type)  # refused before the chain is resolved
            stored = await subscriptions.create(
                account_of(call.principal),
                key=chains.resolve(body.chain, call.principal),
                chain_label=body.chain,
                url=body.url,
                event_type=body.event_type,
                config=body.config,
                confirmations=body.confirmations,
            )
        return CreatedWebhook(
            id=stored.id,
            url=stored.url,
            chain=stored.chain_label,
            event_type=stored.event_type,
            config=shown_config(stored.config),
            signing_secret=stored.secret,
            status="active",
            created_at=iso(stored.created_at),
            confirmations=stored.confirmations,
            matched_from_block=stored.matched_from,
        )

    @api.route(
        "GET",
        "/v1/webhooks",
        name="listWebhooks",
        summary="The calling account's webhooks, oldest first",
        access="webhooks:manage",
        query=ListQuery,
        response=WebhookList,
        errors=(400, 404),
        tags=("webhooks",),
    )
    async def list_webhooks(call: Call[NoInput, ListQuery, None]) -> Any:
        query = call.query
        rows, total = await subscriptions_of(deps).of_account(
            account_of(call.principal), query.status, offset=query.offset, limit=query.limit
        )
        return WebhookList(
            webhooks=[_summary(r) for r in rows], page=query.page, total=total, limit=query.limit
        )

    @api.route(
        "GET",
        "/v1/webhooks/{id}",
        name="getWebhook",
        summary="One webhook (without its secret), with why the service paused it if it did",
        access="webhooks:manage",
        path_params=WebhookPath,
        response=Webhook,
        errors=(404,),
        tags=("webhooks",),
    )
    async def get_webhook(call: Call[WebhookPath, NoInput, None]) -> Any:
        with _refusals():
            row = await subscriptions_of(deps).owned(account_of(call.principal), call.path.id)
        return _webhook(row)


def _register_changes(api: RestApi, deps: ApiDeps) -> None:
    """Changing and deleting a webhook."""

    @api.route(
        "PATCH",
        "/v1/webhooks/{id}",
        name="updateWebhook",
        summary="Change a webhook's URL, filter or confirmations; pause or resume it",
        access="webhooks:manage",
        path_params=WebhookPath,
        body=UpdateWebhook,
        response=UpdatedWebhook,
        errors=(400, 404),
        tags=("webhooks",),
        description="`config` replaces the whole filter; beyond the spec, "
        "`addresses_to_add` and `addresses_to_remove` edit its `addresses` (after `config` "
        "when both are given; removing one it lacks is no error). `status` `active` resumes "
        "a paused webhook, or one the service disabled (its receiver answered 410), and "
        "clears `status_reason`; events held meanwhile are then delivered. A paused webhook "
        "matches nothing: blocks mined while it is paused give it no events. "
        "`matched_from_block` is given when the change moved what an active webhook "
        "matches: the first block matched the new way.",
    )
    async def update_webhook(call: Call[WebhookPath, NoInput, UpdateWebhook]) -> Any:
        body = call.body
        change = WebhookChange(
            url=body.url,
            status=body.status,
            config=body.config,
            confirmations=body.confirmations,
            addresses_to_add=body.addresses_to_add,
            addresses_to_remove=body.addresses_to_remove,
        )
        with _refusals():
            row, refiltered = await subscriptions_of(deps).update(
                account_of(call.principal), call.path.id, change
            )
        return UpdatedWebhook(
            id=row.id,
            url=row.url,
            chain=row.chain_label,
            event_type=row.event_type,
            status=row.status,  # type: ignore[arg-type]  # the store holds only these three
            updated_at=iso(row.updated_at),
            matched_from_block=(
                row.matched_from if refiltered and row.status == "active" else UNSET
            ),
        )

    @api.route(
        "DELETE",
        "/v1/webhooks/{id}",
        name="deleteWebhook",
        summary="Delete a webhook, its pending events and its delivery log (permanent)",
        access="webhooks:manage",
        path_params=WebhookPath,
        response=DeletedWebhook,
        errors=(404,),
        tags=("webhooks",),
    )
    async def delete_webhook(call: Call[WebhookPath, NoInput, None]) -> Any:
        with _refusals():
            row = await subscriptions_of(deps).delete(account_of(call.principal), call.path.id)
        return DeletedWebhook(id=row.id, deleted=True)


def _register_log(api: RestApi, deps: ApiDeps) -> None:
    """The delivery log: events and attempts."""

    @api.route(
        "GET",
        "/v1/webhooks/{id}/events",
        name="listWebhookEvents",
        summary="A webhook's events, newest first: their state, attempts and bodies",
        access="webhooks:manage",
        path_params=WebhookPath,
        query=EventsQuery,
        response=WebhookEventList,
        errors=(400, 404),
        tags=("webhooks",),
        description="Events are kept for the deployment's retention (30 days by default) "
        "once delivered, failed or cancelled; pending ones until they are.",
    )
    async def list_events(call: Call[WebhookPath, EventsQuery, None]) -> Any:
        query = call.query
        with _refusals():
            events, total = await subscriptions_of(deps).events(
                account_of(call.principal),
                call.path.id,
                query.state,
                offset=query.offset,
                limit=query.limit,
            )
        return WebhookEventList(
            events=[_event(e) for e in events], page=query.page, total=total, limit=query.limit
        )

    @api.route(
        "GET",
        "/v1/webhooks/{id}/attempts",
        name="listWebhookAttempts",
        summary="A webhook's delivery log, newest first: each request, answer and latency",
        access="webhooks:manage",
        path_params=WebhookPath,
        query=AttemptsQuery,
        response=DeliveryAttemptList,
        errors=(400, 404),
        tags=("webhooks",),
    )
    async def list_attempts(call: Call[WebhookPath, AttemptsQuery, None]) -> Any:
        query = call.query
        with _refusals():
            attempts, total = await subscriptions_of(deps).attempts(
                account_of(call.principal),
                call.path.id,
                query.event_id,
                offset=query.offset,
                limit=query.limit,
            )
        return DeliveryAttemptList(
            attempts=[_attempt(a) for a in attempts],
            page=query.page,
            total=total,
            limit=query.limit,
        )


def _register_deliveries(api: RestApi, deps: ApiDeps) -> None:
    """Replays, the test ping and secret rotation."""

    @api.route(
        "POST",
        "/v1/webhooks/{id}/events/{event_id}/replay",
        name="replayWebhookEvent",
        summary="Send one event again, with a new round of retries",
        access="webhooks:manage",
        path_params=EventPath,
        response=Replayed,
        status=202,
        errors=(404, 409),
        tags=("webhooks",),
        description="Any event but a cancelled one (its block left the chain before it was "
        "sent). A paused webhook's replayed events wait until it is resumed. An event being "
        "delivered at the moment is 409 with `Retry-After`: replay it once that attempt ends "
        "(never a second copy while the first is unanswered).",
    )
    async def replay_event(call: Call[EventPath, NoInput, None]) -> Any:
        with _refusals():
            count = await subscriptions_of(deps).replay_event(
                account_of(call.principal), call.path.id, call.path.event_id
            )
        return Replayed(replayed=count)

    @api.route(
        "POST",
        "/v1/webhooks/{id}/replay",
        name="replayWebhookEvents",
        summary="Send again every failed event created since a moment",
        access="webhooks:manage",
        path_params=WebhookPath,
        body=ReplayBody,
        response=Replayed,
        status=202,
        errors=(400, 404),
        tags=("webhooks",),
    )
    async def replay_failed(call: Call[WebhookPath, NoInput, ReplayBody]) -> Any:
        with _refusals():
            count = await subscriptions_of(deps).replay_failed(
                account_of(call.principal), call.path.id, call.body.since * 1000
            )
        return Replayed(replayed=count)

    @api.route(
        "POST",
        "/v1/webhooks/{id}/test",
        name="testWebhook",
        summary="Send a test event: signed, retried and logged like any other",
        access="webhooks:manage",
        path_params=WebhookPath,
        response=PingSent,
        status=202,
        errors=(404,),
        tags=("webhooks",),
    )
    async def test_webhook(call: Call[WebhookPath, NoInput, None]) -> Any:
        with _refusals():
            sent = await subscriptions_of(deps).send_test(account_of(call.principal), call.path.id)
        return PingSent(event_id=sent)

    @api.route(
        "POST",
        "/v1/webhooks/{id}/rotate-secret",
        name="rotateWebhookSecret",
        summary="A new signing secret (shown once); the old one also signs for a while",
        access="webhooks:manage",
        path_params=WebhookPath,
        response=RotatedSecret,
        errors=(404,),
        tags=("webhooks",),
        description="Until `previous_secret_expires_at` every delivery carries a signature "
        "with each secret, so receivers can switch without losing an event.",
    )
    async def rotate_secret(call: Call[WebhookPath, NoInput, None]) -> Any:
        with _refusals():
            row = await subscriptions_of(deps).rotate_secret(
                account_of(call.principal), call.path.id
            )
        assert row.previous_secret_until is not None
        return RotatedSecret(
            id=row.id,
            signing_secret=row.secret,
            previous_secret_expires_at=iso(row.previous_secret_until),
        )
