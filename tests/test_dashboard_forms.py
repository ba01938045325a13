"""The dashboard's forms and exports held to OWASP ASVS level 2 (issue 39, item 5), on a real
gateway following real anvil, with webhooks, on SQLite and PostgreSQL: JSON fields nested
1,500 deep are a 400 page on every form that takes one; the usage CSV starts no spreadsheet
formula whatever list separator reads it; passwords have 12 characters or more and are none
of the shipped common ones, on the account page and from the command line; webhook URLs with
bidirectional or invisible characters are refused, and one stored before is shown marked;
every answer under /dashboard carries the security headers; sessions end after 30 minutes
idle and 12 hours by default; a key pasted into a page's path does not come back.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows, UsageDelta
from chaingate.config import ConfigError, DashboardSettings, from_mapping
from chaingate.dashboard.passwords import verify_password
from chaingate.dashboard.store import DashboardRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.store import open_store
from chaingate.twins import Impl
from chaingate.webhooks.mailer import pause_notice
from tests.conftest import make_settings
from tests.helpers import GatewayHandle
from tests.test_auth import PEPPER, AuthStack
from tests.test_dashboard import PASSWORD, browser, csrf, impl, sign_in, signed_in

DEEP = "[" * 1500 + "]" * 1500
HOOK_URL = "http://127.0.0.1:9/hooks"  # never called: creating a webhook connects nowhere
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "/\u202egnp.exe" reads "/exe.png"

__all__ = ["impl"]  # one framing twin: the dashboard does not depend on it


@pytest.fixture
async def site(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> AuthStack:
    """A gateway with keys, the dashboard (its default sessions) and webhooks on a followed
    ethereum/devnet; loopback webhook URLs allowed (the dev outbound policy)."""
    settings = make_settings(
        [{"url": anvil.url, "name": "anvil"}],
        network={"follower": {"enabled": True, "poll_interval": 0.05}},
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": store_url},
        webhooks={"allow_http": True},
        dashboard={"secure_cookie": False},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    assert gateway.store is not None
    return AuthStack(GatewayHandle(gateway, io.BytesIO()), gateway.store)


def assert_refused(answer: httpx.Response, *fragments: str) -> None:
    assert answer.status_code == 400, (answer.status_code, answer.text[:3000])
    assert answer.headers["content-type"].startswith("text/html")
    for fragment in fragments:
        assert fragment in answer.text, (fragment, answer.text[:3000])


async def create_webhook(client: httpx.AsyncClient, url: str = HOOK_URL) -> str:
    """Through the dashboard's own form: the new webhook's id."""
    form = await client.get("/dashboard/webhooks")
    created = await client.post(
        "/dashboard/webhooks",
        data={
            "csrf": csrf(form.text),
            "url": url,
            "chain": "ethereum",
            "event_type": "address_activity",
            "config": '{"addresses": ["0x000000000000000000000000000000000000dEaD"]}',
        },
    )
    assert created.status_code == 201, created.text[:3000]
    listed = await client.get("/dashboard/webhooks")
    ids = [part.split('"')[0] for part in listed.text.split('href="/dashboard/webhooks/')[1:]]
    assert ids, listed.text
    return ids[0]


# --- JSON fields ------------------------------------------------------------------------------


async def test_json_fields_nested_1500_deep_are_a_400_page_on_every_form(site: AuthStack) -> None:
    client = await signed_in(site, "deep@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/policies")
        created = await client.post(
            "/dashboard/policies",
            data={"csrf": csrf(page.text), "name": "p", "chain": "ethereum", "rules": "{}"},
        )
        assert created.status_code == 303, created.text[:3000]
        policy = created.headers["location"]
        hook = await create_webhook(client)
        token = csrf((await client.get("/dashboard/webhooks")).text)
        deep = '{"a": ' + DEEP + "}"
        forms = [
            ("/dashboard/policies", {"name": "q", "chain": "ethereum", "rules": deep}, "rules"),
            (f"{policy}/rules", {"rules": deep, "status": "active"}, "rules"),
            (f"{policy}/evaluate", {"user_operation": deep}, "user_operation"),
            (
                "/dashboard/webhooks",
                {"url": HOOK_URL, "chain": "ethereum", "event_type": "address_activity"}
                | {"config": deep},
                "config",
            ),
            (f"/dashboard/webhooks/{hook}/edit", {"config": deep}, "config"),
        ]
        for path, fields, name in forms:
            answer = await client.post(path, data={"csrf": token, **fields})
            assert_refused(answer, f"invalid field &#39;{name}&#39;: nested deeper than 128")
        # The same depth inside a list the form accepts the first level of.
        answer = await client.post(
            f"{policy}/evaluate", data={"csrf": token, "user_operation": DEEP}
        )
        assert_refused(answer, "nested deeper than 128")


# --- the usage CSV ----------------------------------------------------------------------------

# Key names, and how the CSV shows them: a quote before each formula's first character.
FORMULA_NAMES = {
    "p3;=1+1;": "p3;'=1+1;",
    "@SUM(1+1)": "'@SUM(1+1)",
    "-2+3": "'-2+3",
    "=HYPERLINK(1)": "'=HYPERLINK(1)",
    "x,+1": "x,'+1",
    "+1\t=2": "'+1\t'=2",
    "plain": "plain",
}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


async def test_the_usage_csv_quotes_every_cell_and_starts_no_formula(site: AuthStack) -> None:
    client = await signed_in(site, "csv@example.com")
    account = await AuthRows(site.store).find_account_by_email("csv@example.com")
    assert account is not None
    now_minute = int(time.time() // 60)
    for name in FORMULA_NAMES:
        _, row = await admin.create_key(
            AuthRows(site.store), PEPPER.encode(), account.id, name, "test"
        )
        await AuthRows(site.store).add_usage(
            [UsageDelta(row.id, account.id, "eth_call", now_minute, 1, 26)]
        )
    async with aclosing(client):
        answer = await client.get("/dashboard/usage.csv?range=month")
    assert answer.status_code == 200
    text = answer.text
    lines = text.splitlines()
    assert len(lines) == 1 + len(FORMULA_NAMES)
    # Every cell quoted: the rows written again with every cell quoted are the same text.
    rows = list(csv.reader(io.StringIO(text)))
    again = io.StringIO()
    csv.writer(again, quoting=csv.QUOTE_ALL).writerows(rows)
    assert again.getvalue() == text
    # Read with the list separator of many locales (";"), ours, or a tab: no cell is a formula.
    for separator in (",", ";", "\t"):
        for cells in csv.reader(io.StringIO(text), delimiter=separator):
            for cell in cells:
                assert not cell.lstrip('"').startswith(FORMULA_STARTS), (separator, cell, text)
    # Names stay readable: the neutralising quote is all that was added (to "name (prefix…)").
    shown = sorted(row[2].rsplit(" (svc_test_", 1)[0] for row in rows[1:])
    assert shown == sorted(FORMULA_NAMES.values())


# --- passwords --------------------------------------------------------------------------------

REFUSED_PASSWORDS = {
    "elevenchars": "at least 12 characters",
    "password1234": "common and breached",
    "123456789012": "common and breached",
    "qwertyuiop12": "common and breached",
    "Password1234": "common and breached",  # any letter case
}
PASSPHRASE = "staple kettle orbit violet"


async def test_a_new_password_has_12_characters_and_is_not_a_common_one(site: AuthStack) -> None:
    client = await signed_in(site, "pw12@example.com")
    async with aclosing(client):
        for password, why in REFUSED_PASSWORDS.items():
            page = await client.get("/dashboard/account")
            answer = await client.post(
                "/dashboard/account/password",
                data={"csrf": csrf(page.text), "current": PASSWORD, "new": password},
            )
            assert_refused(answer, why)
            assert 'minlength="12"' in answer.text
        page = await client.get("/dashboard/account")
        changed = await client.post(
            "/dashboard/account/password",
            data={"csrf": csrf(page.text), "current": PASSWORD, "new": PASSPHRASE},
        )
        assert changed.status_code == 303 and changed.headers["location"] == "/dashboard/signin"
    async with browser(site) as again:
        assert (await sign_in(again, "pw12@example.com", PASSPHRASE)).status_code == 303


def test_set_password_refuses_short_and_common_passwords(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/store.db"

    async def prepare() -> None:
        async with open_store(url, tmp_path) as store:
            await store.migrate()
            await admin.ensure_account(AuthRows(store), "cli12@example.com", "free")

    async def stored_hash() -> str | None:
        async with open_store(url, tmp_path) as store:
            account = await AuthRows(store).find_account_by_email("cli12@example.com")
            assert account is not None
            credentials = await DashboardRows(store).credentials(account.id)
            return credentials.password_hash if credentials is not None else None

    trio.run(prepare)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")}
    env["CHAINGATE_STORE__URL"] = url

    def run(password: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "chaingate", "accounts", "set-password"]
        return subprocess.run(
            [*command, "cli12@example.com"],
            input=password + "\n",
            env=env,
            text=True,
            capture_output=True,
            timeout=60,
        )

    for password, why in REFUSED_PASSWORDS.items():
        refused = run(password)
        assert refused.returncode == 2 and why in refused.stdout, refused.stdout + refused.stderr
    assert trio.run(stored_hash) is None
    done = run(PASSPHRASE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verify_password(PASSPHRASE, trio.run(stored_hash))


# --- webhook URLs -----------------------------------------------------------------------------

HIDDEN = {
    "\u202e": "U+202E (RIGHT-TO-LEFT OVERRIDE)",
    "\u2066": "U+2066 (LEFT-TO-RIGHT ISOLATE)",
    "\u200b": "U+200B (ZERO WIDTH SPACE)",
    "\u00a0": "U+00A0 (NO-BREAK SPACE)",
    "\u2028": "U+2028 (LINE SEPARATOR)",
}


async def test_webhook_urls_with_hidden_characters_are_refused(site: AuthStack) -> None:
    key, _ = await site.key(plan="enterprise", email="bidi-api@example.com")
    client = await signed_in(site, "bidi@example.com")
    async with aclosing(client), site.client(key) as rest:
        hook = await create_webhook(client)
        token = csrf((await client.get("/dashboard/webhooks")).text)
        config = {"addresses": ["0x000000000000000000000000000000000000dEaD"]}
        body = {"url": HOOK_URL, "chain": "ethereum", "event_type": "address_activity"}
        made = await rest.post("/v1/webhooks", json=body | {"config": config})
        assert made.status_code == 201, made.text
        for char, named in HIDDEN.items():
            url = f"{HOOK_URL}/{char}gnp.exe"  # loopback: allowed here, but for the char
            # The REST API, creating and changing one.
            answers = [
                await rest.post("/v1/webhooks", json=body | {"url": url, "config": config}),
                await rest.patch(f"/v1/webhooks/{made.json()['id']}", json={"url": url}),
            ]
            for answer in answers:
                assert answer.status_code == 400, answer.text
                message = answer.json()["error"]["message"]
                assert f"invalid field 'url': holds {named}" in message
            # The dashboard's forms, creating and editing one: the page does not echo it.
            fields = {"csrf": token, **body, "url": url, "config": json.dumps(config)}
            created = await client.post("/dashboard/webhooks", data=fields)
            edited = await client.post(
                f"/dashboard/webhooks/{hook}/edit", data={"csrf": token, "url": url}
            )
            for page in (created, edited):
                assert_refused(page, f"holds {named}")
                assert char not in page.text
        listed = await rest.get("/v1/webhooks")
        assert [h["url"] for h in listed.json()["webhooks"]] == [HOOK_URL]  # as it was made


async def test_a_stored_url_with_hidden_characters_is_shown_marked(site: AuthStack) -> None:
    client = await signed_in(site, "stored@example.com")
    async with aclosing(client):
        hook = await create_webhook(client)
        stored = f"https://example.com/{RLO}gnp.exe"  # as a row written before the rule

        def rewrite(tx: Any) -> None:
            tx.execute("UPDATE webhooks SET url = ? WHERE id = ?", (stored, hook))

        await site.store.run_transaction(rewrite)
        marked = '<mark class="hidden-char">U+202E (RIGHT-TO-LEFT OVERRIDE)</mark>gnp.exe'
        for path in ("/dashboard/webhooks", f"/dashboard/webhooks/{hook}"):
            page = await client.get(path)
            assert page.status_code == 200
            assert RLO not in page.text and marked in page.text, page.text[:3000]
        detail = await client.get(f"/dashboard/webhooks/{hook}")
        assert "holds hidden characters" in detail.text
        assert 'id="edit-url" name="url" type="url" value=""' in detail.text
    # And in the e-mail telling its owner it was paused.
    subject, text = pause_notice(hook, stored, "HTTP 500")
    assert RLO not in subject + text
    assert "/<U+202E (RIGHT-TO-LEFT OVERRIDE)>gnp.exe" in text


# --- headers, sessions, echoes ----------------------------------------------------------------


SECURITY_HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "Referrer-Policy",
    "Cross-Origin-Opener-Policy",
    "Cross-Origin-Resource-Policy",
    "Permissions-Policy",
)


async def test_every_answer_under_dashboard_carries_the_security_headers(site: AuthStack) -> None:
    async with browser(site) as client:
        answers = {
            "bare path redirect": await client.get("/dashboard"),
            "no such page": await client.get("/dashboard/no-such-page"),
            "method not allowed": await client.put("/dashboard/signin"),
            "refused by the edge": await client.get("/dashboard/%2e%2e/etc"),
            "a page": await client.get("/dashboard/signin"),
            "a static file": await client.get("/dashboard/static/dashboard.css"),
        }
    expected = {
        "bare path redirect": 308,
        "no such page": 404,
        "method not allowed": 405,
        "refused by the edge": 400,
        "a page": 200,
        "a static file": 200,
    }
    assert {what: a.status_code for what, a in answers.items()} == expected
    page = answers["a page"].headers
    assert "frame-ancestors 'none'" in page["content-security-policy"]
    for what, answer in answers.items():
        for name in SECURITY_HEADERS:
            assert answer.headers.get(name) == page[name], (what, name, dict(answer.headers))
        if what != "a static file":
            assert answer.headers.get("cache-control") == "no-store", what
        assert len(answer.headers.get_list("x-content-type-options")) == 1, what


async def test_sessions_end_after_30_minutes_idle_and_12_hours_by_default(
    site: AuthStack,
) -> None:
    assert DashboardSettings().session_idle_minutes == 30
    assert DashboardSettings().session_max_hours == 12
    for bad in ({"session_idle_minutes": 0}, {"session_max_hours": 0}):
        with pytest.raises(ConfigError, match="must be >= 1"):
            from_mapping({"dashboard": bad}, environ={})
    client = await signed_in(site, "idle@example.com")
    account = await AuthRows(site.store).find_account_by_email("idle@example.com")
    assert account is not None

    def sessions(tx: Any) -> list[Any]:
        rows = tx.query(
            "SELECT created_at, expires_at FROM dashboard_sessions WHERE account_id = ?",
            (account.id,),
        )
        return list(rows)

    ((created, expires),) = await site.store.run_transaction(sessions, write=False)
    assert expires - created == 12 * 3_600_000

    async def idle_for(minutes: int) -> None:
        def move(tx: Any) -> None:
            seen = int(time.time() * 1000) - minutes * 60_000
            tx.execute(
                "UPDATE dashboard_sessions SET last_seen_at = ? WHERE account_id = ?",
                (seen, account.id),
            )

        await site.store.run_transaction(move)

    async with aclosing(client):
        await idle_for(29)
        assert (await client.get("/dashboard/keys")).status_code == 200
        await idle_for(31)
        gone = await client.get("/dashboard/keys")
        assert gone.status_code == 303 and gone.headers["location"] == "/dashboard/signin"


async def test_a_key_pasted_into_a_page_path_does_not_come_back(site: AuthStack) -> None:
    key, _ = await site.key(plan="enterprise", email="paste@example.com")
    client = await signed_in(site, "pasted@example.com")
    async with aclosing(client):
        for path in (f"/dashboard/webhooks/{key}", f"/dashboard/policies/{key}"):
            answer = await client.get(path)
            assert answer.status_code == 404, answer.text[:2000]
            assert key not in answer.text and key[9:] not in answer.text
            assert "[redacted]" in answer.text
