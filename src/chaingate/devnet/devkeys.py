"""``chaingate dev``'s API keys, kept across restarts so scripts and pasted curl lines keep working.

Dev only: the two keys (test and live) sit in clear in ``<data dir>/dev-keys.json`` (mode 0600)
beside the store that holds their hashes — a production deployment never keeps a key.  On each
start a kept key is reused while the store still accepts it (same pepper, not revoked);
otherwise a new one replaces it.  Dev keys of earlier runs that are not kept are revoked.

The dev account is sized for development: its own limits override its plan's, every one
unlimited (0), so a script sending user operations in a loop never meets a 429.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgspec
import trio

from chaingate.auth import admin, apikeys
from chaingate.auth.plans import Limits
from chaingate.auth.store import AuthRows
from chaingate.store import Store

KEYS_FILE = "dev-keys.json"
DEV_EMAIL = "dev@chaingate.localhost"
DEV_PLAN = "growth"
# Every limit of the plan overridden with 0: unlimited (config/plans.toml's convention).
DEV_LIMITS = msgspec.json.encode({name: 0 for name in Limits.__struct_fields__}).decode()
ENVIRONMENTS = ("test", "live")


class DevKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    test: str
    live: str


class Issued(msgspec.Struct, frozen=True):
    keys: DevKeys
    new: tuple[str, ...]  # the environments whose key was made on this start


def _read(path: Path) -> dict[str, str]:
    try:
        kept = msgspec.json.decode(path.read_bytes(), type=DevKeys)
    except (OSError, msgspec.DecodeError):
        return {}  # missing or damaged: new keys, written over it
    return {"test": kept.test, "live": kept.live}


def _write(path: Path, keys: DevKeys) -> None:
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(msgspec.json.encode(keys) + b"\n")
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


async def issue_dev_keys(store: Store, pepper: bytes, path: Path) -> Issued:
    """The dev account's test and live keys: the kept ones while valid, new ones otherwise."""
    accounts = AuthRows(store)
    account = await admin.ensure_account(accounts, DEV_EMAIL, DEV_PLAN)
    if account.limits != DEV_LIMITS:  # also the account of a data dir from before
        await accounts.set_plan(account.id, DEV_PLAN, DEV_LIMITS)
    rows = await accounts.list_keys(account.id)
    active = {row.key_hash: row for row in rows if row.revoked_at is None}
    kept = await trio.to_thread.run_sync(_read, path)
    keys: dict[str, str] = {}
    keep_ids: set[str] = set()
    for environment in ENVIRONMENTS:
        key = kept.get(environment, "")
        if apikeys.environment_of(key.encode()) != environment:
            continue
        row = active.get(apikeys.hash_key(pepper, key.encode()))
        if row is not None and row.environment == environment:
            keys[environment] = key
            keep_ids.add(row.id)
    for row in active.values():
        if row.name.startswith("dev-") and row.id not in keep_ids:
            await accounts.revoke_key(row.id)  # an earlier run's key nobody holds any more
    new = tuple(e for e in ENVIRONMENTS if e not in keys)
    for environment in new:
        keys[environment], _ = await admin.create_key(
            accounts, pepper, account.id, f"dev-{environment}", environment
        )
    issued = DevKeys(test=keys["test"], live=keys["live"])
    await trio.to_thread.run_sync(_keep, path, issued, bool(new))
    return Issued(issued, new)


def _keep(path: Path, keys: DevKeys, changed: bool) -> None:
    if changed or not path.exists():
        _write(path, keys)
    else:
        os.chmod(path, 0o600)  # whoever loosened it: these are keys
