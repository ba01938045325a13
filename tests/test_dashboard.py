"""The dashboard over HTTP: sign-in (one-time link, password, admin token), sessions, CSRF,
headers, escaping, another account's objects, brute force, and pages read from the usage
rollups — a real gateway on a real store (SQLite and PostgreSQL) in front of real anvil.

The browser flow (Chromium, axe-core, keyboard, narrow viewport) is tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import csv as csv_module
import io
import os
import re
import secrets
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from chaingate.auth import admin
from chaingate.auth.store import AuthRows, UsageDelta
from chaingate.dashboard.passwords import hash_password, verify_password
from chaingate.dashboard.sharedthrottle import SharedLoginThrottle
from chaingate.dashboard.store import DashboardRows
from chaingate.dashboard.throttle import LoginThrottle
from chaingate.devnet.anvil import AnvilProcess
from chaingate.store import open_store
from chaingate.twins import Impl, select
from tests.test_auth import PEPPER, AuthStack, auth_settings, start_auth
from tests.test_shared_limits import REDIS_URL, _require_redis

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def impl() -> Impl:
    return select()  # the dashboard is framing-agnostic: one implementation is enough


async def _stack(
    nursery: trio.Nursery,
    impl: Impl,
    anvil: AnvilProcess,
    store_url: str,
    tmp_path: Path,
    **dashboard: Any,
) -> AuthStack:
    settings = auth_settings(
        anvil, store_url, tmp_path, dashboard={"secure_cookie": False, **dashboard}
    )
    return await start_auth(nursery, impl, settings)


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> AuthStack:
    return await _stack(nursery, impl, anvil, store_url, tmp_path)


async def account_with_password(stack: AuthStack, email: str) -> str:
    account = await admin.ensure_account(AuthRows(stack.store), email, "free")
    rows = DashboardRows(stack.store)
    await rows.set_credentials(account.id, password_hash=hash_password(PASSWORD))
    return account.id


def browser(stack: AuthStack) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.handle.base, timeout=10, follow_redirects=False)


def csrf(html: str) -> str:
    found = _CSRF.search(html)
    assert found, html[:2000]
    return found[1]


async def sign_in(
    client: httpx.AsyncClient, email: str, password: str = PASSWORD
) -> httpx.Response:
    form = await client.get("/dashboard/signin")
    assert form.status_code == 200
    return await client.post(
        "/dashboard/signin",
        data={"csrf": csrf(form.text), "email": email, "password": password},
    )


async def signed_in(stack: AuthStack, email: str) -> httpx.AsyncClient:
    await account_with_password(stack, email)
    client = browser(stack)
    answer = await sign_in(client, email)
    assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/", answer.text
    return client


def test_scrypt_hashes_verify_and_differ() -> None:
    first, second = hash_password(PASSWORD), hash_password(PASSWORD)
    assert first != second and first.startswith("scrypt$16384$8$1$")
    assert verify_password(PASSWORD, first) and not verify_password("wrong password", first)
    assert not verify_password(PASSWORD, None)


def test_throttle_counts_per_account_and_per_address() -> None:
    throttle = LoginThrottle(per_account=3, per_address=5, window=60)
    for _ in range(3):
        throttle.failed("a@x", "1.1.1.1", 0)
    assert throttle.blocked_for("A@X", "2.2.2.2", 1) > 0  # the account, from anywhere
    assert throttle.blocked_for("b@x", "1.1.1.1", 1) == 0
    for _ in range(2):
        throttle.failed("c@x", "1.1.1.1", 2)
    assert throttle.blocked_for("d@x", "1.1.1.1", 3) > 0  # the address, whatever the account
    assert throttle.blocked_for("a@x", "3.3.3.3", 61) == 0  # the window passed


async def test_the_one_time_link_signs_in_once(stack: AuthStack) -> None:
    account = await admin.ensure_account(AuthRows(stack.store), "link@example.com", "free")
    token = await DashboardRows(stack.store).create_signin_link(account.id, 60_000)
    async with browser(stack) as client:
        first = await use_link(client, token)
        assert first.status_code == 303 and first.headers["location"] == "/dashboard/"
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        overview = await client.get("/dashboard/")
        assert overview.status_code == 200 and "<h1>Overview</h1>" in overview.text
    async with browser(stack) as other:
        again = await use_link(other, token)
        assert again.status_code == 400 and "used already" in again.text
        assert (await other.get("/dashboard/")).status_code == 303


async def use_link(client: httpx.AsyncClient, token: str) -> httpx.Response:
    """Open a sign-in link (which uses nothing) and press its button."""
    opened = await client.get(f"/dashboard/signin/link/{token}")
    assert opened.status_code == 200 and 'id="use-link"' in opened.text
    return await client.post(f"/dashboard/signin/link/{token}", data={"csrf": csrf(opened.text)})


async def test_opening_a_link_uses_nothing_and_its_post_needs_the_csrf_token(
    stack: AuthStack,
) -> None:
    account = await admin.ensure_account(AuthRows(stack.store), "prefetch@example.com", "free")
    token = await DashboardRows(stack.store).create_signin_link(account.id, 60_000)
    async with browser(stack) as scanner:
        for _ in range(3):  # a prefetcher, a link scanner, a preview
            assert (await scanner.get(f"/dashboard/signin/link/{token}")).status_code == 200
        # Login CSRF: another site's form posting the link has no CSRF token of this browser.
        forged = await scanner.post(f"/dashboard/signin/link/{token}", data={})
        assert forged.status_code == 403
    async with browser(stack) as client:
        assert (await use_link(client, token)).status_code == 303


async def test_password_sign_in_and_sign_out(stack: AuthStack) -> None:
    client = await signed_in(stack, "pw@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        assert page.status_code == 200
        out = await client.post("/dashboard/signout", data={"csrf": csrf(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/dashboard/signin"
        assert (await client.get("/dashboard/keys")).status_code == 303
    async with browser(stack) as wrong:
        refused = await sign_in(wrong, "pw@example.com", "not the password")
        assert refused.status_code == 401 and "Wrong e-mail or password" in refused.text


async def test_security_headers_and_cookie_flags_outside_dev(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await _stack(
        nursery, impl, anvil, f"sqlite://{tmp_path}/store.db", tmp_path, secure_cookie=True
    )
    account = await admin.ensure_account(AuthRows(stack.store), "secure@example.com", "free")
    token = await DashboardRows(stack.store).create_signin_link(account.id, 60_000)
    async with browser(stack) as client:
        form = await client.get("/dashboard/signin")
        csp = form.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp
        assert form.headers["x-frame-options"] == "DENY"
        assert form.headers["referrer-policy"] == "same-origin"
        assert form.headers["cache-control"] == "no-store"
        assert "access-control-allow-origin" not in form.headers
        assert re.search(r"<script(?![^>]*\bsrc=)", form.text) is None  # no inline script
        assert " style=" not in form.text and "<style" not in form.text
        opened = await client.get(f"/dashboard/signin/link/{token}")
        pre = opened.headers["set-cookie"].split(";")[0]  # Secure: httpx keeps it off http
        assert pre.startswith("__Host-cg_pre=")
        answer = await client.post(
            f"/dashboard/signin/link/{token}",
            data={"csrf": csrf(opened.text)},
            headers={"Cookie": pre},
        )
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith("__Host-cg_session=")
        for flag in ("Secure", "HttpOnly", "SameSite=Strict", "Path=/"):
            assert flag in cookie, cookie


async def test_a_form_without_its_csrf_token_is_refused(stack: AuthStack) -> None:
    client = await signed_in(stack, "csrf@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        token = csrf(page.text)
        missing = await client.post("/dashboard/keys", data={"name": "x", "environment": "test"})
        assert missing.status_code == 403 and "CSRF" in missing.text
        wrong = await client.post(
            "/dashboard/keys", data={"csrf": token[:-2] + "xx", "name": "x", "environment": "test"}
        )
        assert wrong.status_code == 403
        elsewhere = await client.post(
            "/dashboard/keys",
            data={"csrf": token, "name": "x", "environment": "test"},
            headers={"Origin": "https://evil.example"},
        )
        assert elsewhere.status_code == 403
        account = await AuthRows(stack.store).find_account_by_email("csrf@example.com")
        assert account is not None and await AuthRows(stack.store).list_keys(account.id) == []
        # The sign-in form has one too.
        async with browser(stack) as fresh:
            bare = await fresh.post(
                "/dashboard/signin", data={"email": "csrf@example.com", "password": PASSWORD}
            )
            assert bare.status_code == 403
        made = await client.post(
            "/dashboard/keys", data={"csrf": token, "name": "x", "environment": "test"}
        )
        assert made.status_code == 303


async def shown_once(client: httpx.AsyncClient, made: httpx.Response) -> httpx.Response:
    """Follow a creation's redirect: the page with the new key."""
    assert made.status_code == 303, made.text
    shown = await client.get(made.headers["location"])
    assert shown.status_code == 200
    return shown


async def test_a_refresh_after_creating_a_key_shows_it_no_more_and_mints_none(
    stack: AuthStack,
) -> None:
    client = await signed_in(stack, "refresh@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        made = await client.post(
            "/dashboard/keys", data={"csrf": csrf(page.text), "name": "once", "environment": "test"}
        )
        location = made.headers["location"]
        first = await client.get(location)
        assert re.search(r'id="new-key" class="secret">svc_test_', first.text)
        again = await client.get(location)  # the browser's refresh: a GET
        assert again.status_code == 200 and 'id="new-key"' not in again.text
        assert "shown once already" in again.text
        assert len(await AuthRows(stack.store).list_keys(await _account_of(stack))) == 1
    # Another session (even of the same account) cannot read a flash it did not make.
    other = await signed_in(stack, "refresh2@example.com")
    async with aclosing(other), aclosing(browser(stack)) as third:
        page = await other.get("/dashboard/keys")
        made = await other.post(
            "/dashboard/keys", data={"csrf": csrf(page.text), "name": "own", "environment": "test"}
        )
        assert (await third.get(made.headers["location"])).status_code == 303  # signed out
        account_id = await _account_of(stack, "refresh2@example.com")
        rows = DashboardRows(stack.store)
        token, _ = await rows.create_session(account_id, False, "", "", 60_000)
        third.cookies.set("cg_session", token)
        stolen = await third.get(made.headers["location"])
        assert stolen.status_code == 200 and 'id="new-key"' not in stolen.text
        assert 'id="new-key"' in (await other.get(made.headers["location"])).text


async def _account_of(stack: AuthStack, email: str = "refresh@example.com") -> str:
    account = await AuthRows(stack.store).find_account_by_email(email)
    assert account is not None
    return str(account.id)


async def test_names_are_shown_escaped(stack: AuthStack) -> None:
    client = await signed_in(stack, "xss@example.com")
    name = "<script>alert(1)</script>"
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        made = await shown_once(
            client,
            await client.post(
                "/dashboard/keys",
                data={"csrf": csrf(page.text), "name": name, "environment": "test"},
            ),
        )
        assert name not in made.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in made.text
        policies = await client.get("/dashboard/policies")
        created = await client.post(
            "/dashboard/policies",
            data={
                "csrf": csrf(policies.text),
                "name": name,
                "chain": "ethereum-devnet",
                "rules": '{"max_gas_usd": "5"}',
            },
        )
        assert created.status_code == 303, created.text
        shown = await client.get(created.headers["location"])
        assert name not in shown.text and "&lt;script&gt;" in shown.text


async def test_another_accounts_objects_are_404(stack: AuthStack) -> None:
    other = await admin.ensure_account(AuthRows(stack.store), "other@example.com", "free")
    _, other_key = await admin.create_key(
        AuthRows(stack.store), PEPPER.encode(), other.id, "theirs", "test"
    )
    client = await signed_in(stack, "mine@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        token = csrf(page.text)
        assert other_key.id not in page.text
        assert (await client.get(f"/dashboard/keys/{other_key.id}")).status_code == 404
        revoke = await client.post(f"/dashboard/keys/{other_key.id}/revoke", data={"csrf": token})
        assert revoke.status_code == 404
        rows = await AuthRows(stack.store).list_keys(other.id)
        assert rows[0].revoked_at is None
        assert (await client.get("/dashboard/webhooks/wh_notmine")).status_code == 404
        assert (await client.get("/dashboard/policies/gp_notmine")).status_code == 404


async def test_session_fixation_is_refused(stack: AuthStack) -> None:
    await account_with_password(stack, "fix@example.com")
    async with browser(stack) as client:
        planted = "attacker-chosen-session-token"
        client.cookies.set("cg_session", planted)
        answer = await sign_in(client, "fix@example.com")
        assert answer.status_code == 303
        issued = answer.cookies.get("cg_session")
        assert issued and issued != planted
    async with browser(stack) as attacker:
        attacker.cookies.set("cg_session", planted)
        assert (await attacker.get("/dashboard/")).status_code == 303  # not signed in


async def test_brute_force_is_refused_even_with_the_right_password(stack: AuthStack) -> None:
    await account_with_password(stack, "brute@example.com")
    async with browser(stack) as client:
        for _ in range(5):
            assert (await sign_in(client, "brute@example.com", "guess guess")).status_code == 401
        locked = await sign_in(client, "brute@example.com")
        assert locked.status_code == 429 and "Too many failed sign-ins" in locked.text


async def test_side_by_side_wrong_attempts_are_each_counted(stack: AuthStack) -> None:
    """Counted before the (slow) check: 12 requests sent at once get the 5 guesses the
    budget allows, the others a 429, and the right password is then refused too."""
    await account_with_password(stack, "rush@example.com")
    answers: list[int] = []
    async with browser(stack) as client:
        token = csrf((await client.get("/dashboard/signin")).text)

        async def guess(n: int) -> None:
            data = {"csrf": token, "email": "rush@example.com", "password": f"guess {n:08}"}
            answers.append((await client.post("/dashboard/signin", data=data)).status_code)

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(guess, n)
        assert sorted(answers) == [401] * 5 + [429] * 7, answers
        assert (await sign_in(client, "rush@example.com")).status_code == 429


def test_an_attempt_is_counted_before_its_check_and_a_success_takes_it_back() -> None:
    throttle = LoginThrottle(per_account=2, per_address=3, window=60)
    assert throttle.attempt("a@x", "1.1.1.1", 0) == 0
    assert throttle.attempt("a@x", "1.1.1.1", 1) == 0
    assert throttle.attempt("a@x", "1.1.1.1", 2) > 0  # two in flight: the third waits
    throttle.succeeded("a@x", "1.1.1.1", 1)
    assert throttle.attempt("b@x", "1.1.1.1", 3) == 0  # the success is no failure: 2 of 3
    assert throttle.attempt("c@x", "1.1.1.1", 4) == 0
    assert throttle.attempt("d@x", "1.1.1.1", 5) > 0


async def test_the_shared_throttle_is_one_budget_for_every_process(
    nursery: trio.Nursery,
) -> None:
    """Two processes' throttles on one Redis (auth.redis_url): the rule of ``LoginThrottle``
    with one budget for both, side-by-side attempts included."""
    _require_redis()
    prefix = f"cg:test:signin:{secrets.token_hex(6)}:"  # this test's keys only
    a = SharedLoginThrottle(REDIS_URL, per_account=3, per_address=5, window=60, prefix=prefix)
    b = SharedLoginThrottle(REDIS_URL, per_account=3, per_address=5, window=60, prefix=prefix)
    await nursery.start(a.run)
    await nursery.start(b.run)
    now = time.time()
    # Per account, whichever process and address an attempt lands on.
    assert await a.attempt("a@x", "1.1.1.1", now) == 0
    assert await b.attempt("A@X", "2.2.2.2", now + 1) == 0
    assert await a.attempt("a@x", "3.3.3.3", now + 2) == 0
    assert await b.attempt("a@x", "4.4.4.4", now + 3) == pytest.approx(57, abs=0.01)
    assert await a.attempt("a@x", "4.4.4.4", now + 61) == 0  # the oldest left the window
    # Side by side, split over both: exactly the budget passes.
    passed: list[float] = []

    async def attempt(throttle: SharedLoginThrottle, n: int) -> None:
        passed.append(await throttle.attempt("rush@x", f"10.0.0.{n}", now + 5))

    async with trio.open_nursery() as rush:
        for n in range(12):
            rush.start_soon(attempt, (a, b)[n % 2], n)
    assert sorted(passed)[:4] == [0, 0, 0, pytest.approx(60, abs=0.01)], passed
    # Per address, whatever the account; a success on one process takes its attempt back
    # for both, and clears its account's count.
    for n in range(5):
        assert await (a, b)[n % 2].attempt(f"u{n}@x", "9.9.9.9", now + 10 + n) == 0
    await b.succeeded("u4@x", "9.9.9.9", now + 14)
    assert await a.attempt("u5@x", "9.9.9.9", now + 15) == 0
    assert await b.attempt("u6@x", "9.9.9.9", now + 16) > 0
    await a.succeeded("rush@x", "10.0.0.0", now + 5)
    assert await b.attempt("rush@x", "10.0.0.99", now + 17) == 0
    # The admin token: per address, apart from e-mails.
    for n in range(3):
        assert await (a, b)[n % 2].admin_attempt("7.7.7.7", now + n) == 0
    assert await a.admin_attempt("7.7.7.7", now + 3) > 0
    assert await b.attempt("z@x", "7.7.7.7", now + 3) == 0
    assert a.up and b.up and a.failures == b.failures == 0  # Redis answered every one


async def test_without_redis_each_process_throttles_on_its_own(nursery: trio.Nursery) -> None:
    unreachable = SharedLoginThrottle("redis://127.0.0.1:1/0", 2, 5, 60)
    await nursery.start(unreachable.run)
    assert [await unreachable.attempt("a@x", "1.1.1.1", n) for n in range(3)] == [0, 0, 58]
    assert not unreachable.up and unreachable.failures >= 1


async def test_brute_force_over_two_processes_sharing_redis_is_refused(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    """Two gateways on one store and one Redis (as ``--workers 2``): five wrong guesses
    spread over both lock the account on both; per process each saw fewer than five."""
    _require_redis()
    settings = auth_settings(
        anvil,
        store_url,
        tmp_path,
        auth={"redis_url": REDIS_URL},
        # Addresses are shared by every run of this test (127.0.0.1): only the account's
        # budget (a new account each run) is under test here.
        dashboard={"secure_cookie": False, "login_failures_per_address": 10_000},
    )
    first = await start_auth(nursery, impl, settings)
    second = await start_auth(nursery, impl, settings)
    email = f"spread-{secrets.token_hex(4)}@example.com"
    await account_with_password(first, email)
    async with browser(first) as one, browser(second) as two:
        for n in range(5):
            client = (one, two)[n % 2]
            assert (await sign_in(client, email, f"guess {n}")).status_code == 401
        for client in (one, two):
            locked = await sign_in(client, email)
            assert locked.status_code == 429 and "Too many failed sign-ins" in locked.text


async def test_password_hashing_refuses_once_its_queue_is_full() -> None:
    import threading

    from chaingate.dashboard.web import HashingBusy, PasswordHashing

    hashing = PasswordHashing(threads=1, max_waiting=1)
    release = threading.Event()
    refused: list[int] = []

    async def check(n: int) -> None:
        try:
            await hashing.run(release.wait, 10)
        except HashingBusy:
            refused.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(check, 0)  # runs
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(check, 1)  # waits
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(check, 2)  # refused
        await trio.testing.wait_all_tasks_blocked()
        assert refused == [2]
        release.set()
    assert refused == [2]


async def test_sessions_are_listed_and_revocable(stack: AuthStack) -> None:
    first = await signed_in(stack, "two@example.com")
    second = browser(stack)
    assert (await sign_in(second, "two@example.com")).status_code == 303
    async with aclosing(first), aclosing(second):
        account = await first.get("/dashboard/account")
        ids = re.findall(r"/dashboard/account/sessions/([0-9a-f]{64})/revoke", account.text)
        assert len(ids) == 2
        assert "(this one)" in account.text
        revoked = await first.post(
            f"/dashboard/account/sessions/{_other_session(account.text, ids)}/revoke",
            data={"csrf": csrf(account.text)},
        )
        assert revoked.status_code == 200 and "Session revoked" in revoked.text
        assert (await second.get("/dashboard/")).status_code == 303
        assert (await first.get("/dashboard/")).status_code == 200


def _other_session(html: str, ids: list[str]) -> str:
    """The session that is not marked "(this one)" on the account page."""
    rows = html.split("<tr>")
    for row in rows:
        if "(this one)" not in row:
            for session_id in ids:
                if session_id in row:
                    return session_id
    raise AssertionError("no other session")


async def test_keys_created_in_the_dashboard_work_and_revoke_within_a_second(
    stack: AuthStack,
) -> None:
    client = await signed_in(stack, "keys@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/keys")
        made = await client.post(
            "/dashboard/keys",
            data={
                "csrf": csrf(page.text),
                "name": "ci",
                "environment": "test",
                "scopes": ["rpc:read"],
            },
        )
        assert made.status_code == 303  # POST-redirect-GET
        location = made.headers["location"]
        assert location.startswith("/dashboard/keys?created=")
        made = await client.get(location)
        assert made.status_code == 200
        key = re.search(r'id="new-key" class="secret">(svc_test_[A-Za-z0-9_]+)<', made.text)
        assert key, made.text
        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber", "params": []}
        async with httpx.AsyncClient(base_url=stack.handle.base) as api:
            ok = await api.post("/v1/rpc/ethereum/devnet", json=body, headers={"X-API-Key": key[1]})
            assert ok.status_code == 200 and "result" in ok.json()
            key_id = re.search(r'data-key-id="(key_[A-Za-z0-9]+)"', made.text)
            assert key_id
            revoked_at = time.monotonic()
            revoke = await client.post(
                f"/dashboard/keys/{key_id[1]}/revoke", data={"csrf": csrf(made.text)}
            )
            assert revoke.status_code == 200 and "revoked" in revoke.text
            while True:
                answer = await api.post(
                    "/v1/rpc/ethereum/devnet", json=body, headers={"X-API-Key": key[1]}
                )
                if answer.status_code == 401:
                    break
                assert time.monotonic() - revoked_at < 1.0, "still accepted after a second"
                await trio.sleep(0.02)
        # Allowlists, validated by the CLI's own rules.
        edit = await client.get(f"/dashboard/keys/{key_id[1]}")
        bad = await client.post(
            f"/dashboard/keys/{key_id[1]}/allowlists",
            data={
                "csrf": csrf(edit.text),
                "origins": "not an origin",
                "ips": "",
                "methods": "",
                "contracts": "",
            },
        )
        assert bad.status_code == 400 and 'role="alert"' in bad.text
        good = await client.post(
            f"/dashboard/keys/{key_id[1]}/allowlists",
            data={
                "csrf": csrf(edit.text),
                "origins": "https://app.example",
                "ips": "10.0.0.0/8",
                "methods": "eth_call",
                "contracts": "",
            },
        )
        assert good.status_code == 200 and "https://app.example" in good.text


async def test_usage_pages_read_the_rollups_and_export_csv(stack: AuthStack) -> None:
    client = await signed_in(stack, "usage@example.com")
    account = await AuthRows(stack.store).find_account_by_email("usage@example.com")
    assert account is not None
    _, row = await admin.create_key(AuthRows(stack.store), PEPPER.encode(), account.id, "u", "test")
    now_minute = int(time.time() // 60)
    await AuthRows(stack.store).add_usage(
        [
            UsageDelta(row.id, account.id, "eth_call", now_minute - 1, 5, 130, 1),
            UsageDelta(row.id, account.id, "eth_call", now_minute - 2, 3, 78, 0),
            UsageDelta(row.id, account.id, "eth_blockNumber", now_minute - 90, 7, 7, 0),
        ]
    )
    hours = await AuthRows(stack.store).usage_totals(account.id, "hour", 0, now_minute + 60)
    assert sum(r.requests for r in hours) == 15
    rows = AuthRows(stack.store)
    one_key = await rows.usage_totals(account.id, "hour", 0, now_minute + 60, key_id=row.id)
    assert sum(r.requests for r in one_key) == 15  # the key filter is the query's
    assert await rows.usage_totals(account.id, "hour", 0, now_minute + 60, key_id="key_other") == []
    async with aclosing(client):
        hour = await client.get("/dashboard/?range=hour")
        assert 'id="total-requests">8<' in hour.text
        day = await client.get("/dashboard/?range=day")
        assert 'id="total-requests">15<' in day.text and "<svg" in day.text
        csv = await client.get("/dashboard/usage.csv?range=month")
        assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
        header, *rows = list(csv_module.reader(io.StringIO(csv.text)))
        assert header[:6] == ["period_start", "key_id", "key", "network", "method", "requests"]
        assert sum(int(row[5]) for row in rows) == 15
        other = await client.get("/dashboard/usage.csv?range=month&key=key_other")
        assert other.text.strip().splitlines()[1:] == []  # one key's rows: none of another's
        mine = await client.get(f"/dashboard/usage?range=month&key={row.id}")
        assert mine.status_code == 200 and "15 requests" in mine.text


def test_accounts_set_password_command(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/store.db"

    async def prepare() -> None:
        store = open_store(url, tmp_path)
        async with store:
            await store.migrate()
            await admin.ensure_account(AuthRows(store), "cli@example.com", "free")

    async def stored() -> Any:
        store = open_store(url, tmp_path)
        async with store:
            account = await AuthRows(store).find_account_by_email("cli@example.com")
            assert account is not None
            return await DashboardRows(store).credentials(account.id)

    trio.run(prepare)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")}
    env["CHAINGATE_STORE__URL"] = url

    def run(email: str, password: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chaingate", "accounts", "set-password", email, *extra],
            input=password + "\n",
            env=env,
            text=True,
            capture_output=True,
            timeout=60,
        )

    done = run("cli@example.com", PASSWORD, "--operator")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dashboard password set (operator)" in done.stdout
    credentials = trio.run(stored)
    assert credentials.operator and verify_password(PASSWORD, credentials.password_hash)
    assert run("cli@example.com", "short").returncode == 2
    missing = run("nobody@example.com", PASSWORD)
    assert missing.returncode == 1 and "no account for nobody@example.com" in missing.stdout


async def test_the_bare_path_and_static_files(stack: AuthStack) -> None:
    async with browser(stack) as client:
        bare = await client.get("/dashboard")
        assert bare.status_code == 308 and bare.headers["location"] == "/dashboard/"
        home = await client.get("/dashboard/")
        assert home.status_code == 303 and home.headers["location"] == "/dashboard/signin"
        css = await client.get("/dashboard/static/dashboard.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        js = await client.get("/dashboard/static/dashboard.js")
        assert js.status_code == 200 and "data-copy" in js.text
        assert (await client.get("/dashboard/static/../../../etc/passwd")).status_code == 404


async def test_operators_see_every_account_and_the_upstreams(stack: AuthStack) -> None:
    plain = await signed_in(stack, "plain@example.com")
    async with aclosing(plain):
        assert (await plain.get("/dashboard/operator")).status_code == 404
    async with browser(stack) as client:
        form = await client.get("/dashboard/signin")
        wrong = await client.post(
            "/dashboard/signin/admin", data={"csrf": csrf(form.text), "admin_token": "nope"}
        )
        assert wrong.status_code == 401
        answer = await client.post(
            "/dashboard/signin/admin",
            data={"csrf": csrf(form.text), "admin_token": "test-admin-token"},
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/operator"
        page = await client.get("/dashboard/operator")
        assert page.status_code == 200
        assert "plain@example.com" in page.text and 'id="upstreams"' in page.text
        assert "up0" in page.text  # the devnet's upstream, by name
        plain_account = await AuthRows(stack.store).find_account_by_email("plain@example.com")
        assert plain_account is not None
        detail = await client.get(f"/dashboard/operator/accounts/{plain_account.id}")
        assert detail.status_code == 200 and "plain@example.com" in detail.text
        assert (await client.get("/dashboard/operator/accounts/acct_nope")).status_code == 404
        # No account of its own: account pages send it back to the operator's.
        home = await client.get("/dashboard/keys")
        assert home.status_code == 303 and home.headers["location"] == "/dashboard/operator"


async def admin_session(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/dashboard/signin")
    return await client.post(
        "/dashboard/signin/admin", data={"csrf": csrf(form.text), "admin_token": token}
    )


async def test_rotating_the_admin_token_ends_its_sessions(
    nursery: trio.Nursery,
    impl: Impl,
    anvil: AnvilProcess,
    store_url: str,
    tmp_path: Path,
    stack: AuthStack,
) -> None:
    """A second gateway on the same store, configured with a new admin token: a session
    opened with the old token is not accepted there, one opened with the new token is."""
    settings = auth_settings(
        anvil,
        store_url,
        tmp_path / "rotated",
        dashboard={"secure_cookie": False},
        observability={"admin_token": "rotated-admin-token"},
    )
    rotated = await start_auth(nursery, impl, settings)
    async with browser(stack) as old, browser(rotated) as new:
        assert (await admin_session(old, "test-admin-token")).status_code == 303
        assert (await old.get("/dashboard/operator")).status_code == 200
        new.cookies.set("cg_session", old.cookies["cg_session"])
        refused = await new.get("/dashboard/operator")
        assert refused.status_code == 303 and refused.headers["location"] == "/dashboard/signin"
        new.cookies.clear()
        assert (await admin_session(new, "rotated-admin-token")).status_code == 303
        assert (await new.get("/dashboard/operator")).status_code == 200
    async with browser(stack) as old:
        old.cookies.set("cg_session", new.cookies["cg_session"])
        assert (await old.get("/dashboard/operator")).status_code == 303


async def _sign_in_from(
    client: httpx.AsyncClient, forwarded_for: str, email: str, password: str = PASSWORD
) -> int:
    form = await client.get("/dashboard/signin")
    answer = await client.post(
        "/dashboard/signin",
        data={"csrf": csrf(form.text), "email": email, "password": password},
        headers={"X-Forwarded-For": forwarded_for},
    )
    return answer.status_code


@pytest.mark.parametrize("trusted", [True, False])
async def test_behind_a_trusted_proxy_the_client_is_read_from_x_forwarded_for(
    nursery: trio.Nursery,
    impl: Impl,
    anvil: AnvilProcess,
    store_url: str,
    tmp_path: Path,
    trusted: bool,
) -> None:
    """One address's failures lock out that address only, not everyone behind the proxy;
    from an untrusted peer the header is ignored (a client could send any)."""
    proxies = ["127.0.0.0/8", "10.0.0.0/8"] if trusted else []
    stack = await _stack(
        nursery,
        impl,
        anvil,
        store_url,
        tmp_path,
        trusted_proxies=proxies,
        login_failures_per_address=3,
    )
    await account_with_password(stack, "proxied@example.com")
    async with browser(stack) as client:
        for n in range(3):
            # The left part is the client's own claim: a trusted proxy's hop is skipped.
            spoof = f"198.51.100.{n}, 203.0.113.1, 10.0.0.2"
            assert await _sign_in_from(client, spoof, f"guess{n}@example.com", "x") == 401
        assert await _sign_in_from(client, "203.0.113.1", "proxied@example.com") == 429
        other = await _sign_in_from(client, "203.0.113.2", "proxied@example.com")
        assert other == (303 if trusted else 429)


async def test_the_admin_token_is_throttled_per_address_apart_from_e_mails(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    stack = await _stack(
        nursery, impl, anvil, store_url, tmp_path, trusted_proxies=["127.0.0.1/32"]
    )
    async with browser(stack) as client:
        for _ in range(5):  # an e-mail field reading "admin token" is just an e-mail
            assert await _sign_in_from(client, "203.0.113.9", "admin token", "x") == 401

        async def admin_from(address: str, token: str) -> int:
            form = await client.get("/dashboard/signin")
            answer = await client.post(
                "/dashboard/signin/admin",
                data={"csrf": csrf(form.text), "admin_token": token},
                headers={"X-Forwarded-For": address},
            )
            client.cookies.delete("cg_session")
            return answer.status_code

        assert await admin_from("203.0.113.9", "test-admin-token") == 303
        for _ in range(5):
            assert await admin_from("203.0.113.7", "wrong") == 401
        assert await admin_from("203.0.113.7", "test-admin-token") == 429
        assert await admin_from("203.0.113.8", "test-admin-token") == 303  # not a global lock


@pytest.mark.parametrize("trusted", [True, False])
async def test_the_origin_check_reads_x_forwarded_host_from_a_trusted_proxy(
    nursery: trio.Nursery,
    impl: Impl,
    anvil: AnvilProcess,
    store_url: str,
    tmp_path: Path,
    trusted: bool,
) -> None:
    proxies = ["127.0.0.1/32"] if trusted else []
    stack = await _stack(nursery, impl, anvil, store_url, tmp_path, trusted_proxies=proxies)
    await account_with_password(stack, "origin@example.com")
    async with browser(stack) as client:
        form = await client.get("/dashboard/signin")
        data = {"csrf": csrf(form.text), "email": "origin@example.com", "password": PASSWORD}
        site = {"Origin": "https://chaingate.example", "X-Forwarded-Host": "chaingate.example"}
        answer = await client.post("/dashboard/signin", data=data, headers=site)
        assert answer.status_code == (303 if trusted else 403)
    async with browser(stack) as client:
        form = await client.get("/dashboard/signin")
        data = {"csrf": csrf(form.text), "email": "origin@example.com", "password": PASSWORD}
        elsewhere = {"Origin": "https://evil.example", "X-Forwarded-Host": "chaingate.example"}
        answer = await client.post("/dashboard/signin", data=data, headers=elsewhere)
        assert answer.status_code == 403


async def test_policy_rules_are_checked_by_the_apis_own_rules(stack: AuthStack) -> None:
    client = await signed_in(stack, "rules@example.com")
    async with aclosing(client):
        policies = await client.get("/dashboard/policies")
        created = await client.post(
            "/dashboard/policies",
            data={
                "csrf": csrf(policies.text),
                "name": "p",
                "chain": "ethereum-devnet",
                "rules": '{"max_gas_usd": "5"}',
            },
        )
        assert created.status_code == 303
        path = created.headers["location"]
        page = await client.get(path)
        bad = await client.post(
            f"{path}/rules",
            data={"csrf": csrf(page.text), "rules": '{"max_gas_usd": "lots"}', "status": "active"},
        )
        assert bad.status_code == 400 and "rules.max_gas_usd" in bad.text, bad.text
        unknown = await client.post(
            f"{path}/rules", data={"csrf": csrf(page.text), "rules": '{"colour": 1}'}
        )
        assert unknown.status_code == 400 and "rules.colour" in unknown.text
        good = await client.post(
            f"{path}/rules",
            data={"csrf": csrf(page.text), "rules": '{"max_gas_usd": "7"}', "status": "paused"},
        )
        assert good.status_code == 200 and "Rules saved" in good.text
        assert 'id="policy-status">paused<' in good.text


async def test_the_migration_rolls_up_what_was_metered_before(
    store_url: str, tmp_path: Path
) -> None:
    from chaingate.store.migrate import apply_pending, load_migrations

    store = open_store(store_url, tmp_path)
    async with store:
        migrations = load_migrations()
        before = [m for m in migrations if "usage_rollups" not in m.name]
        await apply_pending(store, before[:11])
        account = await AuthRows(store).create_account("old@example.com", "free")

        def old_rows(tx: Any) -> None:
            tx.executemany(
                "INSERT INTO usage_minutes (key_id, account_id, method, minute, requests,"
                " compute_units, errors) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    ("key_a", account.id, "eth_call", 1440 * 10 + 5, 2, 52, 0),
                    ("key_a", account.id, "eth_call", 1440 * 10 + 65, 3, 78, 1),
                    ("key_a", account.id, "eth_call", 1440 * 11 + 1, 4, 104, 0),
                ],
            )

        await store.run_transaction(old_rows)
        await store.migrate()
        rows = AuthRows(store)
        hours = await rows.usage_totals(account.id, "hour", 0, 1440 * 12)
        assert [(r.period, r.requests) for r in hours] == [
            (1440 * 10, 2),
            (1440 * 10 + 60, 3),
            (1440 * 11, 4),
        ]
        days = await rows.usage_totals(account.id, "day", 0, 1440 * 12)
        assert [(r.period, r.requests, r.errors) for r in days] == [
            (1440 * 10, 5, 1),
            (1440 * 11, 4, 0),
        ]
        # New usage lands in every rollup with the minutes, in one transaction.
        await AuthRows(store).add_usage(
            [UsageDelta("key_a", account.id, "eth_call", 1440 * 11 + 2, 1, 26)]
        )
        days = await rows.usage_totals(account.id, "day", 0, 1440 * 12)
        assert days[-1].requests == 5


async def test_numbers_typed_by_a_client_are_400_never_500(stack: AuthStack) -> None:
    client = await signed_in(stack, "digits@example.com")
    async with aclosing(client):
        for path in ("/dashboard/webhooks", "/dashboard/policies", "/dashboard/wallets"):
            for bad in ("²", "1" * 5000, "0", "-1", "1e3"):
                answer = await client.get(path, params={"page": bad})
                assert answer.status_code == 400, (path, bad, answer.status_code)
                assert "invalid field &#39;page&#39;: expected a whole number" in answer.text
            assert (await client.get(path, params={"page": "2"})).status_code == 200
        form = await client.get("/dashboard/webhooks")
        for bad in ("²", "9" * 5000):
            created = await client.post(
                "/dashboard/webhooks",
                data={
                    "csrf": csrf(form.text),
                    "url": "https://example.com/hook",
                    "chain": "ethereum",
                    "event_type": "address_activity",
                    "confirmations": bad,
                },
            )
            assert created.status_code == 400, created.status_code
            assert "invalid field &#39;confirmations&#39;" in created.text


def test_small_int_reads_ascii_digits_of_bounded_length() -> None:
    from chaingate.api.errors import ApiError
    from chaingate.dashboard.web import small_int

    assert small_int(" 42 ", "n", 100) == 42 and small_int("0", "n", 9, low=0) == 0
    for bad in ("²", "٣", "1" * 5000, "", "101", "0", "+1", "1_0"):
        with pytest.raises(ApiError) as refused:
            small_int(bad, "n", 100)
        assert refused.value.status == 400 and "invalid field 'n'" in refused.value.message


def test_trusted_proxies_must_be_networks() -> None:
    from chaingate import config

    with pytest.raises(config.ConfigError, match=r"dashboard\.trusted_proxies"):
        config.from_mapping({"dashboard": {"trusted_proxies": ["not a net"]}}, environ={})


async def test_the_operator_page_shows_the_newest_accounts_a_page_at_a_time(
    stack: AuthStack,
) -> None:
    from chaingate.dashboard.pages.operator import ACCOUNTS_PER_PAGE

    made = []
    for n in range(ACCOUNTS_PER_PAGE + 5):
        account = await admin.ensure_account(
            AuthRows(stack.store), f"many{n:03}@example.com", "free"
        )
        made.append(account.id)
        if n == 0:
            await admin.create_key(AuthRows(stack.store), PEPPER.encode(), account.id, "k1", "test")
            await admin.create_key(AuthRows(stack.store), PEPPER.encode(), account.id, "k2", "test")
    async with browser(stack) as client:
        assert (await admin_session(client, "test-admin-token")).status_code == 303
        first = await client.get("/dashboard/operator")
        assert first.status_code == 200
        newest = f"many{ACCOUNTS_PER_PAGE + 4:03}@example.com"
        assert newest in first.text and "many000@example.com" not in first.text
        assert 'id="older-accounts"' in first.text
        second = await client.get("/dashboard/operator?page=2")
        assert "many000@example.com" in second.text and newest not in second.text
        row = re.search(r"many000@example.com</td><td>free</td><td>(\d+)</td>", second.text)
        assert row and row[1] == "2", second.text[-3000:]  # live keys, counted by the database
        found = await client.get("/dashboard/operator", params={"q": "MANY003"})
        assert "many003@example.com" in found.text and "many004@" not in found.text
        assert (await client.get("/dashboard/operator?page=²")).status_code == 400


async def test_the_prune_deletes_ended_sessions_used_links_and_old_latency(
    stack: AuthStack,
) -> None:
    # The gateway prunes too, once at its start: after that, only this test's prunes run.
    tasks = stack.handle.gateway.front.dashboard_tasks
    assert tasks is not None
    with trio.fail_after(10):
        await tasks.sampler.pruned.wait()
    rows = DashboardRows(stack.store)
    account = await admin.ensure_account(AuthRows(stack.store), "prune@example.com", "free")
    now = stack.store.clock()
    day_ms = 86_400_000
    live, _ = await rows.create_session(account.id, False, "", "", day_ms)
    _, ended_row = await rows.create_session(account.id, False, "", "", 1)
    _, recent_row = await rows.create_session(account.id, False, "", "", day_ms)
    await rows.revoke_session(recent_row.id, account.id)  # revoked now: kept a while
    await stack.store.run_transaction(
        lambda tx: tx.execute(
            "UPDATE dashboard_sessions SET expires_at = ? WHERE id = ?",
            (now - 8 * day_ms, ended_row.id),
        )
    )
    used = await rows.create_signin_link(account.id, 60_000)
    assert await rows.use_signin_link(used) == account.id
    await rows.create_signin_link(account.id, -1)  # expired
    unused = await rows.create_signin_link(account.id, 60_000)
    minute = now // 60_000
    counts = [1] + [0] * 15
    await rows.add_latency([(minute - 3 * 1440, "rpc", counts), (minute - 10, "rpc", counts)])
    deleted = await rows.prune()
    assert deleted["sessions"] == 1 and deleted["signin_links"] == 2, deleted
    assert deleted["latency"] == 1, deleted  # the 3-day-old minute (its hour and day stay)
    assert await rows.live_session(live, 60_000) is not None
    assert len(await rows.sessions_of(account.id)) == 1
    assert await rows.use_signin_link(unused) == account.id
    left = await stack.store.run_transaction(
        lambda tx: tx.query("SELECT granularity, period FROM latency_rollups ORDER BY 1, 2"),
        write=False,
    )
    assert [g for g, _ in left] == [1, 60, 60, 1440, 1440], left
    assert (await rows.prune())["sessions"] == 0
