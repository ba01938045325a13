"""Settings → API keys: create (shown once), revoke, allowlists — through
``chaingate.auth.admin``, the same functions ``chaingate keys`` uses; every process's key
registry picks a change up within a second, as for the CLI."""

from __future__ import annotations

import msgspec
from quart import Blueprint, g, redirect, request
from quart.typing import ResponseReturnValue

from chaingate.auth import admin, allowlists
from chaingate.auth.gate import SCOPES
from chaingate.auth.store import KeyRow
from chaingate.dashboard.web import PREFIX, Dashboard, form_value, page, signed_in

MAX_NAME = 64


def shown_lists(row: KeyRow) -> dict[str, list[str]]:
    if not row.allowlists:
        return {name: [] for name in admin.LISTS}
    lists = allowlists.loads(row.allowlists)
    return {name: [str(entry) for entry in getattr(lists, name)] for name in admin.LISTS}


def register(bp: Blueprint, dash: Dashboard) -> None:
    _register_list(bp, dash)
    _register_one_key(bp, dash)


async def _keys_page(dash: Dashboard, status: int = 200, **context: object) -> ResponseReturnValue:
    """The account's keys, revoked ones last, newest first; the form to create one."""
    rows = await dash.accounts.list_keys(g.session.account_id)
    rows.sort(key=lambda r: (r.revoked_at is not None, -r.created_at))
    return await page(
        "keys.html",
        status,
        title="API keys",
        keys=rows,
        scopes=SCOPES,
        lists={row.id: shown_lists(row) for row in rows},
        **context,
    )


async def _owned_key(dash: Dashboard, key_id: str) -> KeyRow | None:
    """The signed-in account's key of that id, else None."""
    rows = await dash.accounts.list_keys(g.session.account_id)
    return next((row for row in rows if row.id == key_id), None)


def _register_list(bp: Blueprint, dash: Dashboard) -> None:
    """The list, a new key (shown once), revoking one."""

    @bp.route("/keys", methods=["GET"])
    @signed_in
    async def keys() -> ResponseReturnValue:
        created = request.args.get("created", "")
        if not created:
            return await _keys_page(
                dash,
            )
        shown = await dash.take_flash(created)
        if shown is None:
            return await _keys_page(
                dash, message="The new key was shown once already: chaingate keeps only its hash."
            )
        new = msgspec.json.decode(shown)
        row = await _owned_key(dash, str(new["id"]))
        if row is None:
            return await _keys_page(
                dash,
            )
        return await _keys_page(dash, new_key=new["key"], new_row=row)

    @bp.route("/keys", methods=["POST"])
    @signed_in
    async def create_key() -> ResponseReturnValue:
        form = await request.form
        name = form_value(form, "name").strip()
        environment = form_value(form, "environment")
        chosen = [s for s in form.getlist("scopes") if s in SCOPES]
        if not 1 <= len(name) <= MAX_NAME or not name.isprintable():
            return await _keys_page(
                dash, 400, error=f"A key needs a name of 1 to {MAX_NAME} characters."
            )
        if environment not in ("test", "live"):
            return await _keys_page(dash, 400, error="Choose the key's environment: test or live.")
        # No scope ticked means every scope, as `chaingate keys create` without --scopes.
        scopes = admin.parse_scopes(" ".join(chosen))
        key, row = await admin.create_key(
            dash.accounts, dash.pepper, g.session.account_id, name, environment, scopes
        )
        if dash.keys_refresh is not None:
            await dash.keys_refresh()  # usable at once in this process
        # POST-redirect-GET: a refresh re-reads the page, it cannot mint a second key.
        flash = await dash.put_flash(msgspec.json.encode({"id": row.id, "key": key}).decode())
        return redirect(f"{PREFIX}/keys?created={flash}", 303)

    @bp.route("/keys/<key_id>/revoke", methods=["POST"])
    @signed_in
    async def revoke_key(key_id: str) -> ResponseReturnValue:
        row = await _owned_key(dash, key_id[:64])
        if row is None:
            return await _keys_page(dash, 404, error="No such key in this account.")
        await dash.accounts.revoke_key(row.id)
        if dash.keys_refresh is not None:
            await dash.keys_refresh()
        return await _keys_page(
            dash, message=f"Key {row.name} revoked: every process refuses it within a second."
        )


def _register_one_key(bp: Blueprint, dash: Dashboard) -> None:
    """One key's page and its allowlists."""

    @bp.route("/keys/<key_id>", methods=["GET"])
    @signed_in
    async def key_page(key_id: str) -> ResponseReturnValue:
        row = await _owned_key(dash, key_id[:64])
        if row is None:
            return await page("error.html", 404, title="Not found", message="No such key.")
        return await page("key.html", title=f"Key {row.name}", key=row, lists=shown_lists(row))

    @bp.route("/keys/<key_id>/allowlists", methods=["POST"])
    @signed_in
    async def edit_allowlists(key_id: str) -> ResponseReturnValue:
        row = await _owned_key(dash, key_id[:64])
        if row is None:
            return await page("error.html", 404, title="Not found", message="No such key.")
        form = await request.form
        replace: dict[str, list[str]] = {}
        clear: set[str] = set()
        for name in admin.LISTS:
            text = form_value(form, name).strip()
            if text:
                replace[name] = [text]
            else:
                clear.add(name)
        try:
            updated = await admin.update_allowlists(dash.accounts, row.id, replace, clear)
        except admin.AdminError as exc:
            return await page(
                "key.html",
                400,
                title=f"Key {row.name}",
                key=row,
                lists={name: [form_value(form, name)] for name in admin.LISTS},
                error=str(exc),
            )
        if dash.keys_refresh is not None:
            await dash.keys_refresh()
        assert updated is not None
        return await page(
            "key.html",
            title=f"Key {row.name}",
            key=updated,
            lists=shown_lists(updated),
            message="Allowlists saved: every process applies them within a second.",
        )
