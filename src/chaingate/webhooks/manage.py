"""The webhook rules an owner's requests go through: ids and secrets, what a config, a URL and
a confirmation depth may be, and which changes re-filter a network or wake the dispatcher.

The REST resource (``chaingate.api.webhooks``) parses and renders; the dashboard's pages call
that resource.  Both see these rules only through ``Subscriptions`` and its errors, whose
messages are shown to the caller as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from chaingate.config.network import Network
from chaingate.printable import code_point, first_hidden_in_url
from chaingate.store import new_id
from chaingate.webhooks.filters import Filter, FilterError, merge_addresses, parse_config
from chaingate.webhooks.model import Kind
from chaingate.webhooks.outbox import Attempt, OutboxEvent
from chaingate.webhooks.service import UrlRefused, WebhookService
from chaingate.webhooks.store import WebhookRow
from chaingate.webhooks.variants import new_secret

# Any valid address: only whether the kind's filter takes addresses at all is asked of it.
_PROBE_ADDRESS = "0x" + "00" * 20

_filter_decoder = msgspec.json.Decoder(Filter)


class InvalidField(Exception):
    """A field of the request the rules refuse: ``field`` names it (``config.<key>``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid field '{field}': {message}")
        self.field = field


class NotServed(Exception):
    """The network is not followed here: no webhook can match it."""

    def __init__(self, key: str) -> None:
        super().__init__(f"webhooks are not served on {key}: it is not followed here")


class NoWebhook(Exception):
    """No such webhook in the account (another account's is the same: it is not shown)."""

    def __init__(self, webhook_id: str) -> None:
        super().__init__(f"no webhook {webhook_id[:64]} in this account")


class NoEvent(Exception):
    def __init__(self, webhook_id: str, event_id: str) -> None:
        super().__init__(f"no event {event_id[:64]} of webhook {webhook_id}")


class EventCancelled(Exception):
    """The event's block left the chain before it was sent: it is never sent again."""

    def __init__(self, event_id: str) -> None:
        super().__init__(
            f"event {event_id} was cancelled (its block left the chain): not sent again"
        )


class EventInFlight(Exception):
    """A delivery worker holds the event (it is being sent) for ``retry_after`` seconds more."""

    def __init__(self, event_id: str, retry_after: int) -> None:
        super().__init__(f"event {event_id} is being delivered: replay it once that attempt ends")
        self.retry_after = retry_after


class WebhookChange(msgspec.Struct, frozen=True, kw_only=True):
    """What an owner asks to change (None: left as it is)."""

    url: str | None = None
    status: str | None = None  # active | paused
    config: dict[str, Any] | None = None
    confirmations: int | None = None
    addresses_to_add: Sequence[Any] | None = None
    addresses_to_remove: Sequence[Any] | None = None


@contextmanager
def _filter_errors() -> Iterator[None]:
    """``FilterError`` as the field it is about: ``config.<key>``, or the change that edits
    the addresses."""
    try:
        yield
    except FilterError as exc:
        field = exc.key if exc.key.startswith("addresses_to_") else exc.field
        raise InvalidField(field, exc.message) from None


@functools.cache
def _takes_addresses(kind: Kind) -> bool:
    """Whether the kind's filter has an address list (addresses_to_add can edit)."""
    try:
        parse_config(kind, {"addresses": [_PROBE_ADDRESS]}, max_values=1)
    except FilterError as exc:
        return exc.key != "addresses"
    return True


def _config_json(f: Filter) -> str:
    return msgspec.json.encode(f).decode()


def _key(row: WebhookRow) -> Network:
    return Network(row.chain, row.network)


class Subscriptions:
    """An account's webhooks, as its owner manages them, over the service's rows."""

    def __init__(self, service: WebhookService) -> None:
        self._service = service
        self._rows = service.store

    def _now_ms(self) -> int:
        return int(self._service.clock() * 1000)

    def kind(self, event_type: str) -> Kind:
        """The kind an event type names in this deployment's variant, else InvalidField."""
        kind = self._service.variant.event_types.get(event_type)
        if kind is None:
            shown = event_type if len(event_type) <= 64 else event_type[:64] + "..."
            accepted = ", ".join(self._service.variant.event_types)
            raise InvalidField("event_type", f"{shown!r} is not one; accepted: {accepted}")
        return kind

    def _confirmations(self, value: int) -> int:
        ceiling = self._service.settings.max_confirmations
        if value > ceiling:
            raise InvalidField("confirmations", f"expected an integer from 0 to {ceiling}")
        return value

    async def _url(self, url: str) -> str:
        hidden = first_hidden_in_url(url)
        if hidden is not None:  # before the service resolves anything
            raise InvalidField(
                "url",
                f"holds {code_point(hidden)}; a URL may not hold spaces, control or invisible"
                " formatting characters (they can make it display as another)",
            )
        try:
            return await self._service.check_url(url)
        except UrlRefused as exc:
            raise InvalidField("url", str(exc)) from None

    async def owned(self, account: str, webhook_id: str) -> WebhookRow:
        row = await self._rows.get_webhook(account, webhook_id)
        if row is None:
            raise NoWebhook(webhook_id)
        return row

    async def create(
        self,
        account: str,
        *,
        key: Network,
        chain_label: str,
        url: str,
        event_type: str,
        config: dict[str, Any] | None,
        confirmations: int,
    ) -> WebhookRow:
        """A new active webhook of network ``key`` with a new id and secret;
        WebhookLimitReached when the account has as many as its plan allows."""
        service = self._service
        kind = self.kind(event_type)
        if not service.serves(key):
            raise NotServed(key)
        max_hooks, max_values = service.plan_limits(account)
        with _filter_errors():
            parsed = parse_config(kind, config, max_values=max_values)
        depth = self._confirmations(confirmations)
        checked_url = await self._url(url)
        now = self._now_ms()
        row = WebhookRow(
            id=new_id("wh_"),
            account_id=account,
            url=checked_url,
            chain=key.chain,
            network=key.network,
            chain_label=chain_label,
            event_type=event_type,
            config=_config_json(parsed),
            confirmations=depth,
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
        stored = await self._rows.create_webhook(row, limit=max_hooks)
        service.filters_changed(key)
        return stored

    async def _new_config(self, account: str, row: WebhookRow, change: WebhookChange) -> str:
        editing = change.addresses_to_add is not None or change.addresses_to_remove is not None
        kind = self._service.variant.event_types.get(row.event_type)
        if kind is None:  # made under the other variant: this deployment cannot match it
            raise InvalidField(
                "config",
                f"event type {row.event_type!r} is not served by this deployment; delete the"
                " webhook",
            )
        if editing and not _takes_addresses(kind):
            field = "addresses_to_add" if change.addresses_to_add else "addresses_to_remove"
            raise InvalidField(field, f"{row.event_type} takes no addresses")
        _, max_values = self._service.plan_limits(account)
        with _filter_errors():
            if change.config is not None:
                parsed = parse_config(kind, change.config, max_values=max_values)
            else:
                parsed = _filter_decoder.decode(row.config)
            if editing:
                parsed = merge_addresses(
                    parsed,
                    change.addresses_to_add or [],
                    change.addresses_to_remove or [],
                    max_values=max_values,
                )
        return _config_json(parsed)

    async def update(
        self, account: str, webhook_id: str, change: WebhookChange
    ) -> tuple[WebhookRow, bool]:
        """The webhook as changed, and whether what it matches was (its status, filter or
        depth): then its network re-filters from ``matched_from``."""
        row = await self.owned(account, webhook_id)
        changes: dict[str, Any] = {}
        editing = change.addresses_to_add is not None or change.addresses_to_remove is not None
        if change.config is not None or editing:
            changes["config"] = await self._new_config(account, row, change)
        if change.confirmations is not None:
            changes["confirmations"] = self._confirmations(change.confirmations)
        if change.url is not None:
            changes["url"] = await self._url(change.url)
        if change.status is not None:
            # Whoever sets the status now is the owner: the service's reason no longer holds.
            changes["status"] = change.status
            changes["status_reason"] = None
        if changes:
            updated = await self._rows.update_webhook(account, row.id, changes, self._now_ms())
            if updated is None:  # deleted meanwhile
                raise NoWebhook(row.id)
            row = updated
        refiltered = bool({"status", "config", "confirmations"} & set(changes))
        if refiltered:
            self._service.filters_changed(_key(row))
        if change.status == "active":
            self._service.wake()
        return row, refiltered

    async def delete(self, account: str, webhook_id: str) -> WebhookRow:
        row = await self.owned(account, webhook_id)
        if not await self._rows.delete_webhook(row.account_id, row.id):
            raise NoWebhook(row.id)
        self._service.filters_changed(_key(row))
        return row

    async def of_account(
        self, account: str, status: str | None, *, offset: int, limit: int
    ) -> tuple[list[WebhookRow], int]:
        return await self._rows.list_webhooks(account, status, offset=offset, limit=limit)

    async def events(
        self, account: str, webhook_id: str, state: str | None, *, offset: int, limit: int
    ) -> tuple[list[OutboxEvent], int]:
        row = await self.owned(account, webhook_id)
        return await self._rows.list_webhook_events(row.id, state, offset=offset, limit=limit)

    async def event(self, webhook_id: str, event_id: str) -> OutboxEvent | None:
        """One event of a webhook (the caller has checked the webhook is the account's)."""
        return await self._rows.get_webhook_event(webhook_id, event_id)

    async def attempts(
        self, account: str, webhook_id: str, event_id: str | None, *, offset: int, limit: int
    ) -> tuple[list[Attempt], int]:
        row = await self.owned(account, webhook_id)
        return await self._rows.list_webhook_attempts(row.id, event_id, offset=offset, limit=limit)

    async def replay_event(self, account: str, webhook_id: str, event_id: str) -> int:
        """Send one event again (1); NoEvent, EventCancelled or EventInFlight when it cannot
        be."""
        row = await self.owned(account, webhook_id)
        count = await self._rows.replay_events(row.id, event_id=event_id)
        if not count:
            event = await self._rows.get_webhook_event(row.id, event_id)
            if event is None:
                raise NoEvent(row.id, event_id)
            if event.state == "cancelled":
                raise EventCancelled(event.id)
            now = self._rows.clock()
            raise EventInFlight(event.id, max(1, -(-(event.lease_until - now) // 1000)))
        self._service.wake()
        return count

    async def replay_failed(self, account: str, webhook_id: str, since_ms: int) -> int:
        """Send again every failed event created since ``since_ms``; how many."""
        row = await self.owned(account, webhook_id)
        count = await self._rows.replay_events(row.id, failed_since=since_ms)
        if count:
            self._service.wake()
        return count

    async def send_test(self, account: str, webhook_id: str) -> str:
        return await self._service.send_test(await self.owned(account, webhook_id))

    async def rotate_secret(self, account: str, webhook_id: str) -> WebhookRow:
        """A new secret; the previous one also signs for the deployment's overlap."""
        now = self._now_ms()
        until = now + int(self._service.settings.secret_overlap * 1000)
        row = await self._rows.rotate_webhook_secret(account, webhook_id, new_secret(), until, now)
        if row is None:
            raise NoWebhook(webhook_id)
        return row
