"""The ``chaingate`` command.

* ``chaingate dev`` — everything on embedded defaults: installs and starts anvil, serves
  ``ethereum/devnet`` on 127.0.0.1:8000, prints ready-to-paste curl lines.  Ctrl-C stops it all.
* ``chaingate serve --config FILE`` — the production entry point.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from chaingate import config
from chaingate.devnet import anvil
from chaingate.gateway import Gateway
from chaingate.obs.logs import setup_logging


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


async def _serve(settings: config.Settings) -> None:
    gateway = Gateway(settings)
    async with trio.open_nursery() as nursery:

        async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
            try:
                await gateway.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()

        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        await nursery.start(run_gateway)


def _dev_banner(port: int, host: str, anvil_url: str, admin_token: str) -> str:
    base = f"http://{host}:{port}"
    rpc = f"{base}/v1/rpc/ethereum/devnet"
    return f"""
chaingate dev is up.
  JSON-RPC  {rpc}
  anvil     {anvil_url}  (chain id {anvil.DEVNET_CHAIN_ID})

Try:
  curl -s {rpc} -H 'Content-Type: application/json' \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}}'
  curl -s {rpc} -H 'Content-Type: application/json' \\
       -d '[{{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}},
            {{"jsonrpc":"2.0","id":2,"method":"eth_accounts"}}]'
  curl -s {base}/v1/health
  curl -s {base}/metrics -H 'Authorization: Bearer {admin_token}'

Ctrl-C stops chaingate and anvil.
"""


async def _run_anvil(argv: list[str], *, task_status: trio.TaskStatus[object]) -> None:
    """anvil as a child of our nursery: cancelled (terminated) when chaingate stops."""
    await trio.run_process(
        argv, task_status=task_status, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def _dev(settings: config.Settings, binary: Path, anvil_port: int) -> None:
    argv = anvil.anvil_argv(binary, anvil_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(_run_anvil, argv)
        anvil_url = f"http://127.0.0.1:{anvil_port}"
        await trio.to_thread.run_sync(anvil.wait_ready, anvil_url)
        gateway = Gateway(settings)

        async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
            try:
                await gateway.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()  # takes anvil down with us

        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        port = await nursery.start(run_gateway)
        _say(_dev_banner(port, settings.server.host, anvil_url, settings.observability.admin_token))


def _dev_settings(args: argparse.Namespace, anvil_url: str) -> config.Settings:
    path = config.default_config_dir() / "dev.toml"
    data: dict[str, Any] = __import__("tomllib").loads(path.read_text())
    data["chains"]["ethereum"]["devnet"]["upstreams"][0]["url"] = anvil_url
    data["server"]["port"] = args.port
    data["server"]["host"] = args.host
    observability = data.setdefault("observability", {})
    if not os.environ.get("CHAINGATE_OBSERVABILITY__ADMIN_TOKEN"):
        observability["admin_token"] = "dev-admin-" + secrets.token_urlsafe(12)
    settings = config.from_mapping(data, config_dir=path.parent)
    Path(settings.data_dir).expanduser().mkdir(parents=True, exist_ok=True)
    return settings


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
        trio.run(_dev, settings, binary, anvil_port)
    except OSError as exc:
        _say(f"error: {exc}")
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config)
    except config.ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    setup_logging(settings.observability.log_level)
    trio.run(_serve, settings)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chaingate", description=__doc__.splitlines()[1] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser("dev", help="run on embedded defaults with a local anvil devnet")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--anvil-port", type=int, default=0, help="default: a free port")
    dev.set_defaults(func=cmd_dev)
    serve = commands.add_parser("serve", help="run with a configuration file")
    serve.add_argument(
        "--config", required=True, help="path to a TOML file (see config/chaingate.example.toml)"
    )
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
