"""Account and key administration shared by ``chaingate keys`` and ``chaingate dev``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

from chaingate.auth import allowlists, apikeys
from chaingate.auth.gate import SCOPES
from chaingate.auth.store import Account, AuthRows, KeyRow


class AdminError(ValueError):
    """A request the store cannot carry out (unknown scope, account...)."""


def parse_scopes(text: str | None) -> str:
    """Space- or comma-separated scopes, validated; "" (all scopes) when none are given."""
    if not text:
        return ""
    scopes = [s for s in text.replace(",", " ").split() if s]
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise AdminError(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}")
    return " ".join(sorted(set(scopes)))


async def ensure_account(store: AuthRows, email: str, plan: str) -> Account:
    account = await store.find_account_by_email(email)
    if account is None:
        account = await store.create_account(email, plan)
    return account


async def create_key(
    store: AuthRows, pepper: bytes, account_id: str, name: str, environment: str, scopes: str = ""
) -> tuple[str, KeyRow]:
    """A new key: the full key (to show once) and what was stored (hash and prefix only)."""
    key = apikeys.generate(environment)
    row = KeyRow(
        account_id=account_id,
        name=name,
        prefix=apikeys.display_prefix(key),
        key_hash=apikeys.hash_key(pepper, key.encode()),
        environment=environment,
        scopes=scopes,
    )
    return key, await store.insert_key(row)


def dev_pepper(data_dir: Path) -> str:
    """The devnet's pepper, created once under the data dir (owner-only file)."""
    path = data_dir / "pepper"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
    return path.read_text().strip()


LISTS = ("origins", "ips", "methods", "contracts")


async def update_allowlists(
    store: AuthRows, key_id: str, replace: dict[str, list[str]], clear: set[str]
) -> KeyRow | None:
    """Replace the named lists of a key (``replace``: list name -> entries, comma- or
    space-separated as typed) and empty those in ``clear`` ("all": every list); the others
    stay.  AllowlistError for a bad entry (nothing is stored); None for an unknown key."""
    both = set(replace) & clear
    if both or ("all" in clear and replace):
        raise AdminError("a list cannot be both set and cleared in one command")
    unknown = (set(replace) | clear) - {*LISTS, "all"}
    if unknown:
        raise AdminError(f"unknown list(s) {', '.join(sorted(unknown))}; known: {', '.join(LISTS)}")
    try:
        parsed = allowlists.build(
            **{
                name: [entry for value in values for entry in value.replace(",", " ").split()]
                for name, values in replace.items()
            }
        )
    except allowlists.AllowlistError as exc:
        raise AdminError(str(exc)) from None

    def change(current: str | None) -> str | None:
        lists = allowlists.loads(current) if current else allowlists.Allowlists()
        if "all" in clear:
            lists = allowlists.Allowlists()
        updates = {name: getattr(parsed, name) for name in replace}
        updates.update({name: () for name in clear if name != "all"})
        return allowlists.dumps(msgspec.structs.replace(lists, **updates))

    return await store.update_key_allowlists(key_id, change)
