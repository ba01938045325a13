"""Signing in from the command line's side: ``chaingate accounts set-password`` and the
one-time link ``chaingate dev`` prints."""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable

import trio

from chaingate.auth.store import AuthRows
from chaingate.dashboard.passwords import PasswordRejected, check_strength, hash_password
from chaingate.dashboard.store import DashboardRows
from chaingate.store import Store

DEV_LINK_TTL_MS = 24 * 3_600_000


async def dev_signin_link(store: Store, email: str) -> str:
    """A one-time link for the dev account ``email`` (an operator: dev shows the upstreams
    too)."""
    account = await AuthRows(store).find_account_by_email(email)
    assert account is not None, "issue_dev_keys makes the dev account first"
    rows = DashboardRows(store)
    await rows.set_credentials(account.id, operator=True)
    return await rows.create_signin_link(account.id, DEV_LINK_TTL_MS)


def read_password() -> str:
    """From the terminal (asked twice), or the first line of stdin when it is not one."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("New password: ")
    if getpass.getpass("Again: ") != first:
        raise PasswordRejected("the two passwords differ")
    return first


async def _set(store: Store, email: str, password: str, operator: bool | None) -> str | None:
    async with store:
        await store.migrate()
        account = await AuthRows(store).find_account_by_email(email)
        if account is None:
            return None
        hashed = await trio.to_thread.run_sync(hash_password, password)
        await DashboardRows(store).set_credentials(
            account.id, password_hash=hashed, operator=operator
        )
        return account.id


def set_password_command(
    store: Store, email: str, operator: bool | None, say: Callable[[str], None]
) -> int:
    try:
        password = read_password()
        check_strength(password)
    except PasswordRejected as exc:
        say(f"error: {exc}")
        return 2
    account_id = trio.run(_set, store, email, password, operator)
    if account_id is None:
        say(f"no account for {email} (chaingate keys create --email {email} makes one)")
        return 1
    flag = "" if operator is None else (" (operator)" if operator else " (not operator)")
    say(f"{email}: dashboard password set{flag}; its sessions were signed out")
    return 0
