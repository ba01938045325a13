"""Webhooks: list, create (the secret shown once), edit, pause/resume, delete, rotate the
secret, test ping; the delivery log and events with filters; replay one event or every
failed one since a time.  Each action is the REST route's own handler (``restcalls``): the
same validation and messages, another account's webhook 404 as there."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from quart import Blueprint, g, redirect, request
from quart.typing import ResponseReturnValue

from chaingate.api.errors import ApiError
from chaingate.dashboard.web import (
    PREFIX,
    Dashboard,
    chain_names,
    form_value,
    gather,
    json_object,
    page,
    page_number,
    signed_in,
    small_int,
)
from chaingate.webhooks.manage import Subscriptions

EVENT_STATES = ("pending", "delivered", "failed", "cancelled")
MAX_CONFIRMATIONS = 1_000_000  # the REST handler applies its own, tighter, rule


def _config(text: str) -> dict[str, Any] | None:
    return json_object(text, "config") if text.strip() else None


def register(bp: Blueprint, dash: Dashboard) -> None:
    _register_list(bp, dash)
    _register_changes(bp, dash)
    _register_replays(bp, dash)


def _event_types(dash: Dashboard) -> list[str]:
    service = dash.api.webhooks
    return list(service.variant.event_types) if service is not None else []


async def _list_page(dash: Dashboard, status: int = 200, **context: object) -> ResponseReturnValue:
    """The list of the account's webhooks (filtered by status) and the form to create one."""
    account = g.session.account_id
    filter_status = request.args.get("status", "")
    query = {"page": page_number()}
    if filter_status in ("active", "paused", "disabled"):
        query["status"] = filter_status
    try:
        listed = await dash.rest("listWebhooks", account, query=query)
    except ApiError as exc:
        listed = {"webhooks": [], "page": 1, "total": 0, "limit": 25}
        context.setdefault("error", exc.message)
    return await page(
        "webhooks.html",
        status,
        title="Webhooks",
        listed=listed,
        filter_status=filter_status,
        event_types=_event_types(dash),
        chains=chain_names(dash),
        **context,
    )


async def _detail(
    dash: Dashboard, webhook_id: str, status: int = 200, **context: object
) -> ResponseReturnValue:
    """One webhook: its settings, delivery attempts and events (filtered as asked)."""
    account = g.session.account_id
    path = {"id": webhook_id[:64]}
    try:
        hook = await dash.rest("getWebhook", account, path=path)
    except ApiError as exc:
        return await page("error.html", exc.status, title="Webhook", message=exc.message)
    event_id = request.args.get("event_id", "").strip()[:64]
    state = request.args.get("state", "")
    attempts_query = {"page": page_number()}
    if event_id:
        attempts_query["event_id"] = event_id
    events_query = {"page": page_number("events_page")}
    if state in EVENT_STATES:
        events_query["state"] = state
    try:
        attempts, events = await gather(
            lambda: dash.rest("listWebhookAttempts", account, path=path, query=attempts_query),
            lambda: dash.rest("listWebhookEvents", account, path=path, query=events_query),
        )
    except ApiError as exc:
        return await page("error.html", exc.status, title="Webhook", message=exc.message)
    # What each attempt sent: its event's body (every attempt sends exactly that).
    bodies = {event["id"]: event["body"] for event in events["events"]}
    if event_id and event_id not in bodies and dash.api.webhooks is not None:
        found = await Subscriptions(dash.api.webhooks).event(hook["id"], event_id)
        if found is not None:
            bodies[found.id] = msgspec.json.decode(found.body)
    return await page(
        "webhook.html",
        status,
        bodies=bodies,
        title=f"Webhook {hook['id']}",
        hook=hook,
        config_text=msgspec.json.format(msgspec.json.encode(hook["config"]), indent=2).decode(),
        attempts=attempts,
        events=events,
        event_id=event_id,
        state=state,
        states=EVENT_STATES,
        **context,
    )


async def _act(
    dash: Dashboard, webhook_id: str, name: str, done: str, **kwargs: Any
) -> ResponseReturnValue:
    """Call the REST route ``name`` on the webhook; back to its page saying ``done``."""
    try:
        await dash.rest(name, g.session.account_id, path={"id": webhook_id[:64]}, **kwargs)
    except ApiError as exc:
        if exc.status == 404:
            return await page("error.html", 404, title="Webhook", message=exc.message)
        return await _detail(dash, webhook_id, exc.status, error=exc.message)
    return redirect(f"{PREFIX}/webhooks/{webhook_id[:64]}?done={done}", 303)


def _register_list(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/webhooks", methods=["GET"])
    @signed_in
    async def webhooks() -> ResponseReturnValue:
        return await _list_page(
            dash,
        )

    @bp.route("/webhooks", methods=["POST"])
    @signed_in
    async def create_webhook() -> ResponseReturnValue:
        form = await request.form
        try:
            body: dict[str, Any] = {
                "url": form_value(form, "url").strip(),
                "chain": form_value(form, "chain"),
                "event_type": form_value(form, "event_type"),
            }
            config = _config(form_value(form, "config"))
            if config is not None:
                body["config"] = config
            confirmations = form_value(form, "confirmations").strip()
            if confirmations:
                body["confirmations"] = small_int(
                    confirmations, "confirmations", MAX_CONFIRMATIONS, low=0
                )
            created = await dash.rest("createWebhook", g.session.account_id, body=body)
        except ApiError as exc:
            return await _list_page(dash, exc.status, error=exc.message, form=dict(form))
        return await _list_page(dash, 201, created=created)

    @bp.route("/webhooks/<webhook_id>", methods=["GET"])
    @signed_in
    async def webhook(webhook_id: str) -> ResponseReturnValue:
        return await _detail(dash, webhook_id, message=_DONE.get(request.args.get("done", ""), ""))


def _register_changes(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/webhooks/<webhook_id>/edit", methods=["POST"])
    @signed_in
    async def edit(webhook_id: str) -> ResponseReturnValue:
        form = await request.form
        try:
            body: dict[str, Any] = {}
            url = form_value(form, "url").strip()
            if url:
                body["url"] = url
            config = _config(form_value(form, "config"))
            if config is not None:
                body["config"] = config
            confirmations = form_value(form, "confirmations").strip()
            if confirmations:
                body["confirmations"] = small_int(
                    confirmations, "confirmations", MAX_CONFIRMATIONS, low=0
                )
        except ApiError as exc:
            return await _detail(dash, webhook_id, exc.status, error=exc.message)
        return await _act(dash, webhook_id, "updateWebhook", "saved", body=body)

    @bp.route("/webhooks/<webhook_id>/pause", methods=["POST"])
    @signed_in
    async def pause(webhook_id: str) -> ResponseReturnValue:
        return await _act(dash, webhook_id, "updateWebhook", "paused", body={"status": "paused"})

    @bp.route("/webhooks/<webhook_id>/resume", methods=["POST"])
    @signed_in
    async def resume(webhook_id: str) -> ResponseReturnValue:
        return await _act(dash, webhook_id, "updateWebhook", "resumed", body={"status": "active"})

    @bp.route("/webhooks/<webhook_id>/test", methods=["POST"])
    @signed_in
    async def ping(webhook_id: str) -> ResponseReturnValue:
        return await _act(dash, webhook_id, "testWebhook", "tested")

    @bp.route("/webhooks/<webhook_id>/delete", methods=["POST"])
    @signed_in
    async def delete(webhook_id: str) -> ResponseReturnValue:
        try:
            await dash.rest("deleteWebhook", g.session.account_id, path={"id": webhook_id[:64]})
        except ApiError as exc:
            return await page("error.html", exc.status, title="Webhook", message=exc.message)
        return await _list_page(dash, message=f"Webhook {webhook_id[:64]} deleted.")

    @bp.route("/webhooks/<webhook_id>/rotate", methods=["POST"])
    @signed_in
    async def rotate(webhook_id: str) -> ResponseReturnValue:
        try:
            rotated = await dash.rest(
                "rotateWebhookSecret", g.session.account_id, path={"id": webhook_id[:64]}
            )
        except ApiError as exc:
            return await page("error.html", exc.status, title="Webhook", message=exc.message)
        return await _detail(dash, webhook_id, rotated=rotated)


def _register_replays(bp: Blueprint, dash: Dashboard) -> None:
    @bp.route("/webhooks/<webhook_id>/events/<event_id>/replay", methods=["POST"])
    @signed_in
    async def replay(webhook_id: str, event_id: str) -> ResponseReturnValue:
        try:
            await dash.rest(
                "replayWebhookEvent",
                g.session.account_id,
                path={"id": webhook_id[:64], "event_id": event_id[:64]},
            )
        except ApiError as exc:
            if exc.status == 404:
                return await page("error.html", 404, title="Webhook", message=exc.message)
            return await _detail(dash, webhook_id, exc.status, error=exc.message)
        return redirect(f"{PREFIX}/webhooks/{webhook_id[:64]}?done=replayed", 303)

    @bp.route("/webhooks/<webhook_id>/replay", methods=["POST"])
    @signed_in
    async def replay_failed(webhook_id: str) -> ResponseReturnValue:
        form = await request.form
        since = form_value(form, "since").strip()
        try:
            moment = datetime.fromisoformat(since)
        except ValueError:
            return await _detail(
                dash, webhook_id, 400, error="invalid field 'since': expected a date and time"
            )
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return await _act(
            dash,
            webhook_id,
            "replayWebhookEvents",
            "replayed",
            body={"since": int(moment.timestamp())},
        )


_DONE = {
    "saved": "Saved.",
    "paused": "Paused: it matches nothing until resumed.",
    "resumed": "Resumed: events held meanwhile are delivered now.",
    "tested": "Test event sent: it appears in the delivery log below once delivered.",
    "replayed": "Replay queued: the delivery log shows it once sent.",
}
