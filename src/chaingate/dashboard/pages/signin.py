"""Sign-in (password, one-time link, admin token), sign-out, and the account's sessions."""

from __future__ import annotations

import hmac

from quart import Blueprint, g, redirect, request
from quart.typing import ResponseReturnValue

from chaingate.dashboard.passwords import (
    MIN_LENGTH,
    PasswordRejected,
    check_strength,
    hash_password,
    verify_password,
)
from chaingate.dashboard.web import (
    PREFIX,
    Dashboard,
    HashingBusy,
    form_value,
    page,
    signed_in,
)

MAX_EMAIL = 320
BUSY = "The server is busy checking other sign-ins: try again in a few seconds."


def register(bp: Blueprint, dash: Dashboard) -> None:
    _register_signin(bp, dash)
    _register_account(bp, dash)


async def _refused(email: str, message: str, status: int = 401) -> ResponseReturnValue:
    """The sign-in form again, saying why."""
    return await page("signin.html", status, title="Sign in", email=email, error=message)


def _register_signin(bp: Blueprint, dash: Dashboard) -> None:
    """Sign in with a password, a one-time link or the admin token."""

    @bp.route("/signin", methods=["GET"])
    async def signin_form() -> ResponseReturnValue:
        if g.get("session") is not None:
            return redirect(f"{PREFIX}/", 303)
        return await page("signin.html", title="Sign in", email="")

    @bp.route("/signin", methods=["POST"])
    async def signin() -> ResponseReturnValue:
        form = await request.form
        email = form_value(form, "email").strip()[:MAX_EMAIL]
        password = form_value(form, "password")
        now = dash.clock()
        address = dash.client_address()
        # Counted before the check: side-by-side requests cannot exceed the budget.
        wait = await dash.throttle.attempt(email, address, now)
        if wait > 0:
            return await _refused(
                email,
                f"Too many failed sign-ins: try again in {int(wait) + 1} seconds.",
                429,
            )
        account = await dash.accounts.find_account_by_email(email) if email else None
        credentials = await dash.rows.credentials(account.id) if account is not None else None
        stored = credentials.password_hash if credentials is not None else None
        try:
            ok = await dash.hashing.run(verify_password, password, stored)
        except HashingBusy:
            return await _refused(email, BUSY, 429)
        if not ok or account is None or credentials is None:
            return await _refused(email, "Wrong e-mail or password.")
        await dash.throttle.succeeded(email, address, now)
        return await dash.start_session(account.id, credentials.operator)

    @bp.route("/signin/link/<token>", methods=["GET"])
    async def signin_link_page(token: str) -> ResponseReturnValue:
        # Opening the link uses nothing (prefetchers and scanners open links too); its button
        # POSTs with this browser's CSRF token, so another site cannot sign you in with its
        # own link.
        return await page("signin_link.html", title="Sign in", token=token[:100])

    @bp.route("/signin/link/<token>", methods=["POST"])
    async def signin_link(token: str) -> ResponseReturnValue:
        account_id = await dash.rows.use_signin_link(token[:100])
        if account_id is None:
            return await page(
                "signin.html",
                400,
                title="Sign in",
                email="",
                error="This sign-in link was used already or has expired: each link signs "
                "in once. Restart chaingate dev for a new one, or sign in with a password.",
            )
        credentials = await dash.rows.credentials(account_id)
        return await dash.start_session(account_id, bool(credentials and credentials.operator))

    @bp.route("/signin/admin", methods=["POST"])
    async def signin_admin() -> ResponseReturnValue:
        form = await request.form
        supplied = form_value(form, "admin_token")
        now = dash.clock()
        address = dash.client_address()
        if await dash.throttle.admin_attempt(address, now) > 0:
            return await _refused("", "Too many failed sign-ins: try again later.", 429)
        token = dash.admin_token
        if not token or not hmac.compare_digest(supplied.encode(), token.encode()):
            return await _refused("", "Wrong admin token.")
        await dash.throttle.admin_succeeded(address, now)
        return await dash.start_session("", True)


def _register_account(bp: Blueprint, dash: Dashboard) -> None:
    """Sign out; the account's sessions and password."""

    @bp.route("/signout", methods=["POST"])
    async def signout() -> ResponseReturnValue:
        session = g.get("session")
        if session is not None:
            await dash.rows.revoke_session(session.id, session.account_id)
        response = redirect(f"{PREFIX}/signin", 303)
        dash.clear_cookie(response, dash.session_cookie)
        return response

    @bp.route("/account", methods=["GET"])
    @signed_in
    async def account_page() -> ResponseReturnValue:
        return await _account(dash)

    @bp.route("/account/sessions/<session_id>/revoke", methods=["POST"])
    @signed_in
    async def revoke_session(session_id: str) -> ResponseReturnValue:
        session = g.session
        if not await dash.rows.revoke_session(session_id[:64], session.account_id):
            return await _account(dash, error="No such session.", status=404)
        if session_id == session.id:
            response = redirect(f"{PREFIX}/signin", 303)
            dash.clear_cookie(response, dash.session_cookie)
            return response
        return await _account(dash, message="Session revoked: it is signed out.")

    @bp.route("/account/password", methods=["POST"])
    @signed_in
    async def change_password() -> ResponseReturnValue:
        form = await request.form
        session = g.session
        current = form_value(form, "current")
        new = form_value(form, "new")
        credentials = await dash.rows.credentials(session.account_id)
        stored = credentials.password_hash if credentials is not None else None
        try:
            if stored is not None and not await dash.hashing.run(verify_password, current, stored):
                return await _account(dash, error="The current password is wrong.", status=400)
            await dash.hashing.run(check_strength, new)  # reads the list: off the loop
            hashed = await dash.hashing.run(hash_password, new)
        except PasswordRejected as exc:
            return await _account(dash, error=str(exc).capitalize() + ".", status=400)
        except HashingBusy:
            return await _account(dash, error=BUSY, status=429)
        await dash.rows.set_credentials(session.account_id, password_hash=hashed)
        # Every session ended with the change, this one too: sign in again.
        response = redirect(f"{PREFIX}/signin", 303)
        dash.clear_cookie(response, dash.session_cookie)
        return response


async def _account(
    dash: Dashboard, message: str = "", error: str = "", status: int = 200
) -> ResponseReturnValue:
    session = g.session
    account = await dash.accounts.get_account(session.account_id)
    sessions = await dash.rows.sessions_of(session.account_id)
    credentials = await dash.rows.credentials(session.account_id)
    return await page(
        "account.html",
        status,
        title="Account",
        account=account,
        sessions=sessions,
        has_password=bool(credentials and credentials.password_hash),
        min_length=MIN_LENGTH,
        message=message,
        error=error,
    )
