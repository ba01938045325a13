"""The ``chaingate`` command.

* ``chaingate dev`` — everything on embedded defaults: installs and starts anvil, serves
  ``ethereum/devnet`` on 127.0.0.1:8000, prints ready-to-paste curl lines.  Ctrl-C stops it all.
* ``chaingate serve --config FILE`` — the production entry point.
* ``chaingate migrate [--config FILE]`` — apply pending database migrations and say which.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from chaingate import config
from chaingate.auth import admin
from chaingate.auth.plans import PlanError, Plans
from chaingate.devnet import anvil
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.manifest import Manifest, save_manifest
from chaingate.evm.keys import PrivateKey, load_or_create_key
from chaingate.gateway import Gateway
from chaingate.obs.logs import setup_logging
from chaingate.store import AppliedMigration, Store, StoreError, open_store

DEV_EMAIL = "dev@chaingate.localhost"
# Under the dev data dir: the devnet's manifest (NetworkSettings.manifest points at it) and the
# dev-only paymaster signer key (generated on first run, mode 0600).
DEVNET_MANIFEST = "devnet-manifest.json"
PAYMASTER_KEY_FILE = "paymaster-signer.key"


def _say(text: str) -> None:
    print(text, flush=True)


async def _watch_signals(gateway: Gateway, cancel_scope: trio.CancelScope) -> None:
    """First SIGINT/SIGTERM: graceful shutdown.  Second: stop at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if gateway._shutdown.is_set():
                cancel_scope.cancel()
                return
            _say("\nStopping (Ctrl-C again to stop at once)...")
            gateway.shutdown()


async def _serve(gateway: Gateway) -> None:
    async with trio.open_nursery() as nursery:

        async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
            try:
                await gateway.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()

        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        await nursery.start(run_gateway)


def _dev_banner(
    port: int,
    host: str,
    anvil_url: str,
    admin_token: str,
    keys: tuple[str, str] | None,
    manifest_path: str,
    manifest: Manifest,
) -> str:
    base = f"http://{host}:{port}"
    rpc = f"{base}/v1/rpc/ethereum/devnet"
    key_header = ""
    key_lines = "  API keys  off ([auth] enabled = false)\n"
    if keys is not None:
        test_key, live_key = keys
        key_header = f" -H 'X-API-Key: {test_key}'"
        key_lines = (
            f"  test key  {test_key}   (testnets only; shown once, new each run)\n"
            f"  live key  {live_key}\n"
        )
    return f"""
chaingate dev is up.
  JSON-RPC  {rpc}
  anvil     {anvil_url}  (chain id {anvil.DEVNET_CHAIN_ID})
  manifest  {manifest_path}
            {len(manifest.contracts)} contracts by name: ERC-4337 v0.6/v0.7, tokens, NFTs, feeds
  paymaster signer {manifest.paymaster_signer}
{key_lines}
Try:
  curl -s {rpc}{key_header} \\
       -H 'Content-Type: application/json' \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}}'
  curl -s {rpc}{key_header} \\
       -d '[{{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}},
            {{"jsonrpc":"2.0","id":2,"method":"eth_accounts"}}]'
  curl -s {base}/v1/usage{key_header}
  curl -s {base}/v1/health
  curl -s {base}/metrics -H 'Authorization: Bearer {admin_token}'

Ctrl-C stops chaingate and anvil.
"""


async def _run_anvil(argv: list[str], *, task_status: trio.TaskStatus[object]) -> None:
    """anvil as a child of our nursery: cancelled (terminated) when chaingate stops."""
    await trio.run_process(
        argv, task_status=task_status, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _bootstrap_devnet(anvil_url: str, paymaster_signer: str, manifest_path: str) -> Manifest:
    """Deploy (or load from cache) the devnet's contracts and write the manifest."""
    manifest = bootstrap_devnet(anvil_url, paymaster_signer=paymaster_signer, announce=_say)
    save_manifest(manifest, manifest_path)
    return manifest


async def _dev(
    settings: config.Settings,
    binary: Path,
    anvil_port: int,
    dev_store: Store | None,
    paymaster_signer: str,
) -> int:
    keys = await _dev_keys(settings, dev_store) if dev_store is not None else None
    argv = anvil.anvil_argv(binary, anvil_port)
    manifest_path = settings.chains["ethereum"]["devnet"].manifest
    async with trio.open_nursery() as nursery:
        await nursery.start(_run_anvil, argv)
        anvil_url = f"http://127.0.0.1:{anvil_port}"
        await trio.to_thread.run_sync(anvil.wait_ready, anvil_url)
        try:
            manifest = await trio.to_thread.run_sync(
                _bootstrap_devnet, anvil_url, paymaster_signer, manifest_path
            )
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
            _say(f"error: devnet bootstrap failed: {exc}")
            nursery.cancel_scope.cancel()  # takes anvil down
            return 1
        gateway = Gateway(settings)

        async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
            try:
                await gateway.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()  # takes anvil down with us

        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        port = await nursery.start(run_gateway)
        _say(
            _dev_banner(
                port,
                settings.server.host,
                anvil_url,
                settings.observability.admin_token,
                keys,
                manifest_path,
                manifest,
            )
        )
    return 0


def _dev_settings(args: argparse.Namespace, anvil_url: str) -> config.Settings:
    path = config.default_config_dir() / "dev.toml"
    data: dict[str, Any] = __import__("tomllib").loads(path.read_text())
    data["chains"]["ethereum"]["devnet"]["upstreams"][0]["url"] = anvil_url
    data["server"]["port"] = args.port
    data["server"]["host"] = args.host
    observability = data.setdefault("observability", {})
    if not os.environ.get("CHAINGATE_OBSERVABILITY__ADMIN_TOKEN"):
        observability["admin_token"] = "dev-admin-" + secrets.token_urlsafe(12)
    if args.data_dir:
        data["data_dir"] = args.data_dir
    settings = config.from_mapping(data, config_dir=path.parent)
    data_dir = Path(settings.data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True)
    devnet = data["chains"]["ethereum"]["devnet"]
    if not devnet.get("manifest"):
        devnet["manifest"] = str(data_dir / DEVNET_MANIFEST)
    if settings.auth.enabled and not settings.auth.pepper:
        data.setdefault("auth", {})["pepper"] = admin.dev_pepper(data_dir)
    return config.from_mapping(data, config_dir=path.parent)


def _paymaster_key(args: argparse.Namespace, settings: config.Settings) -> PrivateKey:
    """The key given with --paymaster-key, else the dev one kept under the data dir."""
    if args.paymaster_key:
        return PrivateKey.from_hex(Path(args.paymaster_key).expanduser().read_text())
    return load_or_create_key(Path(settings.data_dir).expanduser() / PAYMASTER_KEY_FILE)


async def _dev_keys(settings: config.Settings, store: Store) -> tuple[str, str]:
    """Fresh dev keys for this run (test and live); the previous run's are revoked."""
    pepper = settings.auth.pepper.encode()
    async with store:
        await store.migrate()
        account = await admin.ensure_account(store, DEV_EMAIL, "growth")
        for row in await store.list_keys(account.id):
            if row.revoked_at is None and row.name.startswith("dev-"):
                await store.revoke_key(row.id)
        test_key, _ = await admin.create_key(store, pepper, account.id, "dev-test", "test")
        live_key, _ = await admin.create_key(store, pepper, account.id, "dev-live", "live")
    return test_key, live_key


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        binary = anvil.anvil_binary(announce=_say)
    except (OSError, RuntimeError) as exc:
        _say(f"error: cannot install anvil: {exc}")
        return 1
    anvil_port = args.anvil_port or anvil.free_port()
    settings = _dev_settings(args, f"http://127.0.0.1:{anvil_port}")
    setup_logging(settings.observability.log_level)
    try:
        signer = _paymaster_key(args, settings)
    except (OSError, ValueError) as exc:
        _say(f"error: cannot read the paymaster signer key: {exc}")
        return 1
    try:
        dev_store = None
        if settings.auth.enabled:
            dev_store = open_store(settings.store.url, Path(settings.data_dir).expanduser())
        code: int = trio.run(_dev, settings, binary, anvil_port, dev_store, signer.address)
    except OSError as exc:
        _say(f"error: {exc}")
        return 1
    return code


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config)
    except config.ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    setup_logging(settings.observability.log_level)
    try:
        gateway = Gateway(settings)
    except (config.ConfigError, PlanError) as exc:
        _say(f"error: {exc}")
        return 2
    trio.run(_serve, gateway)
    return 0


async def _migrate(store: Store) -> tuple[list[int], list[AppliedMigration]]:
    async with store:
        applied_now = await store.migrate()
        return applied_now, await store.applied_migrations()


def cmd_migrate(args: argparse.Namespace) -> int:
    try:
        # No file: built-in defaults (sqlite under data_dir) plus CHAINGATE_* overrides.
        settings = config.load(args.config) if args.config else config.from_mapping({})
    except config.ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    try:
        store = open_store(
            settings.store.url,
            Path(settings.data_dir).expanduser(),
            pool_size=settings.store.pool_size,
        )
        _say(f"store: {store.display_url}")
        applied_now, recorded = trio.run(_migrate, store)
    except StoreError as exc:
        _say(f"error: {exc}")
        return 1
    for migration in recorded:
        state = "applied now" if migration.version in applied_now else "already applied"
        _say(f"{migration.version:04d} {migration.name}: {state}")
    version = recorded[-1].version if recorded else 0
    _say(f"schema at version {version} ({len(applied_now)} applied now)")
    return 0


def _admin_settings(args: argparse.Namespace) -> config.Settings:
    settings = config.load(args.config) if args.config else config.from_mapping({})
    if not settings.auth.pepper:
        raise config.ConfigError(
            "auth.pepper is required to hash keys: set CHAINGATE_AUTH__PEPPER as for `serve`"
        )
    return settings


async def _keys(
    args: argparse.Namespace, settings: config.Settings, store: Store, plans: Plans
) -> int:
    pepper = settings.auth.pepper.encode()
    async with store:
        await store.migrate()
        if args.action == "create":
            plans.limits(args.plan)  # an unknown plan is an error before anything is stored
            account = await admin.ensure_account(store, args.email, args.plan)
            scopes = admin.parse_scopes(args.scopes)
            key, row = await admin.create_key(
                store, pepper, account.id, args.name, args.env, scopes
            )
            _say(f"key {row.id} for {account.email} (account {account.id}, plan {account.plan})")
            _say(f"  scopes: {row.scopes or 'all'}")
            _say(f"  {key}")
            _say("Store it now: it is shown only once.")
        elif args.action == "list":
            account_id = None
            if args.email:
                found = await store.find_account_by_email(args.email)
                if found is None:
                    _say(f"no account for {args.email}")
                    return 1
                account_id = found.id
            for row in await store.list_keys(account_id):
                state = "revoked" if row.revoked_at is not None else "active"
                last = _iso_ms(row.last_used_at) if row.last_used_at else "never"
                _say(
                    f"{row.id}  {row.prefix}…  {row.name:<16} {row.environment:<4} {state:<7} "
                    f"scopes={row.scopes or 'all'}  created={_iso_ms(row.created_at)}  "
                    f"last_used={last}"
                )
        elif args.action == "revoke":
            if not await store.revoke_key(args.key_id):
                _say(f"no key {args.key_id}")
                return 1
            _say(f"revoked {args.key_id}; every process stops accepting it within a second")
        else:  # plan
            target = await store.find_account_by_email(args.email)
            if target is None:
                _say(f"no account for {args.email}")
                return 1
            plans.limits(args.plan, args.limits)
            await store.set_plan(target.id, args.plan, args.limits)
            _say(
                f"{args.email}: plan {args.plan}" + (f" with {args.limits}" if args.limits else "")
            )
    return 0


def _iso_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def cmd_keys(args: argparse.Namespace) -> int:
    try:
        settings = _admin_settings(args)
        plans = Plans.load(config.config_file(settings, settings.auth.plans_file))
        store = open_store(
            settings.store.url,
            Path(settings.data_dir).expanduser(),
            pool_size=settings.store.pool_size,
        )
        return trio.run(_keys, args, settings, store, plans)
    except (config.ConfigError, PlanError, admin.AdminError, StoreError) as exc:
        _say(f"error: {exc}")
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chaingate", description=__doc__.splitlines()[1] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="run on embedded defaults with a local anvil devnet")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--anvil-port", type=int, default=0, help="default: a free port")
    dev.add_argument(
        "--paymaster-key",
        help="file holding the devnet paymaster signer's private key (0x-hex); "
        f"default: <data dir>/{PAYMASTER_KEY_FILE}, generated on first run",
    )
    dev.set_defaults(func=cmd_dev)
    serve = commands.add_parser("serve", help="run with a configuration file")
    serve.add_argument(
        "--config", required=True, help="path to a TOML file (see config/chaingate.example.toml)"
    )
    serve.set_defaults(func=cmd_serve)
    migrate = commands.add_parser("migrate", help="apply pending database migrations")
    migrate.add_argument("--config", help="path to a TOML file; default: built-in defaults")
    migrate.set_defaults(func=cmd_migrate)
    keys = commands.add_parser("keys", help="manage accounts and API keys")
    keys.add_argument("--config", help="path to a TOML file; default: built-in defaults")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a key (its account too, if new)")
    create.add_argument("--email", required=True, help="the owning account's e-mail")
    create.add_argument("--plan", default="free", help="plan of a new account (config/plans.toml)")
    create.add_argument("--name", default="default")
    create.add_argument("--env", choices=("test", "live"), default="test")
    create.add_argument("--scopes", help="e.g. 'rpc:read data:read'; default: all scopes")
    listing = actions.add_parser("list", help="list keys (prefixes only; keys are never stored)")
    listing.add_argument("--email")
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")
    plan = actions.add_parser("plan", help="change an account's plan")
    plan.add_argument("--email", required=True)
    plan.add_argument("--plan", required=True)
    plan.add_argument("--limits", help="JSON overrides, e.g. '{\"requests_per_second\": 500}'")
    keys.set_defaults(func=cmd_keys)
    dev.add_argument("--data-dir", help="default: ~/.local/share/chaingate/dev")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
