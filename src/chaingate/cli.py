"""The ``chaingate`` command.

* ``chaingate dev`` — everything on embedded defaults: installs and starts anvil, serves
  ``ethereum/devnet`` and ``solana/devnet`` (a local Solana node, in process) on
  127.0.0.1:8000, prints ready-to-paste curl lines.  Ctrl-C stops it all.  Its data dir
  (locked: one ``chaingate dev`` each) keeps the chains and the keys across starts.
* ``chaingate serve --config FILE`` — the production entry point.
* ``chaingate migrate [--config FILE]`` — apply pending database migrations and say which.
* ``chaingate accounts set-password EMAIL`` — a dashboard password for an account.
* ``chaingate bench WORKLOAD`` — load tests against any endpoint (``chaingate.benchsuite``).
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import msgspec
import trio

from chaingate import config
from chaingate.allocator import pin_mmap_threshold
from chaingate.auth import admin
from chaingate.auth.plans import PlanError, Plans
from chaingate.auth.store import AuthRows
from chaingate.bundler.service import bundler_key
from chaingate.cluster.supervisor import PARENT_ENV, Supervisor, reserve_port, watch_parent
from chaingate.cluster.workers import check_shared_state, worker_count
from chaingate.config.manifest import Manifest
from chaingate.config.network import Network
from chaingate.dashboard.accounts import dev_signin_link, set_password_command
from chaingate.devnet import anvil, chainfile, persist
from chaingate.devnet.demo import METADATA_HOSTNAME, served_documents
from chaingate.devnet.devkeys import DEV_EMAIL, KEYS_FILE, issue_dev_keys
from chaingate.devnet.docserver import DevnetHost, serve_documents
from chaingate.devnet.keeper import refresh_price_feeds
from chaingate.devnet.lock import DataDirBusy, DataDirLock
from chaingate.devnet.node import DevNode, NodeFailed
from chaingate.devnet.rpc import DevnetRpc
from chaingate.devnet.solana import devstate as solana_devstate
from chaingate.devnet.solana import server as solana_server
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey, load_or_create_key
from chaingate.gateway import Gateway
from chaingate.obs.logs import setup_logging
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.store import AppliedMigration, Store, StoreError, open_store

# Under the dev data dir: the devnet's manifest (NetworkSettings.manifest points at it), the
# dev-only paymaster signer key (generated on first run, mode 0600), the saved chain
# (chaingate.devnet.chainfile) and the dev API keys (chaingate.devnet.devkeys).
DEVNET_MANIFEST = "devnet-manifest.json"
PAYMASTER_KEY_FILE = "paymaster-signer.key"
# The bundler's EOA on the devnet: a key of its own (not anvil's account 0, which tests and
# scripts use, so nonces never collide), funded at every start.
BUNDLER_KEY_FILE = "bundler.key"
BUNDLER_FUNDING_WEI = 1000 * 10**18
DEVNET_CHAIN = chainfile.CHAIN_FILE
DEV_KEYS_FILE = KEYS_FILE
DEV_NETWORK = ("ethereum", "devnet")
SOLANA_NETWORK = ("solana", "devnet")
INDEX_WAIT = 60.0  # seconds the banner waits for the index to hold the chain


def _say(text: str) -> None:
    print(text, flush=True)


# The signals that stop chaingate dev: SIGHUP too, so closing its terminal still saves the chain
# and stops anvil (which runs in a session of its own and gets no hangup).
DEV_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopper:
    """What a stop signal stops: the gateway once it runs (gracefully), else everything."""

    def __init__(self, cancel_scope: trio.CancelScope, gateway: Gateway | None = None) -> None:
        self.cancel_scope = cancel_scope
        self.gateway = gateway
        self.signalled = False


async def _watch_signals(stopper: _Stopper, signals: AsyncIterator[int]) -> None:
    """First signal: graceful shutdown.  Second: stop at once.  Later ones are absorbed (the
    receiver stays open while anything is being saved and stopped)."""
    async for _ in signals:
        gateway = stopper.gateway
        if stopper.signalled or gateway is None:
            if not stopper.signalled:
                _say("\nStopping...")
            stopper.signalled = True
            stopper.cancel_scope.cancel()
            continue
        stopper.signalled = True
        _say("\nStopping (Ctrl-C again to stop at once)...")
        gateway.shutdown()


async def _serve(gateway: Gateway) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            parent = os.environ.get(PARENT_ENV)
            if parent is not None:  # a worker of `serve --workers N`: gone with its parent

                async def stop_with_parent() -> None:
                    await watch_parent(int(parent))
                    gateway.shutdown()

                nursery.start_soon(stop_with_parent)

            async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
                try:
                    await gateway.run(task_status=task_status)
                finally:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(_watch_signals, _Stopper(nursery.cancel_scope, gateway), signals)
            await nursery.start(run_gateway)


def _dev_banner(
    port: int,
    host: str,
    anvil_url: str,
    admin_token: str,
    keys: tuple[str, str] | None,
    manifest_path: str,
    manifest: Manifest,
    keys_path: Path | None = None,
    webhook_variant: str = "a",
    bundler_address: str = "",
    dashboard_token: str = "",
    solana: _SolanaNode | None = None,
) -> str:
    """What `chaingate dev` prints once it is up: where everything is, then a curl line for
    every feature (docs/start.md walks through them)."""
    base = f"http://{host}:{port}"
    rpc = f"{base}/v1/rpc/ethereum/devnet"
    dashboard = (
        f"  dashboard {base}/dashboard/signin/link/{dashboard_token}\n"
        "            (open it and press Sign in, once; then: chaingate accounts set-password"
        " EMAIL)\n"
        if dashboard_token
        else ""
    )
    key_header = ""
    key_url = ""
    key_lines = "  API keys  off ([auth] enabled = false)\n"
    if keys is not None:
        test_key, live_key = keys
        key_header = f" -H 'X-API-Key: {test_key}'"
        key_url = (
            f"\n            {rpc}/{test_key}\n"
            "            (the key in the URL, for MetaMask, cast --rpc-url, Hardhat:"
            " docs/guides/rpc.md)"
        )
        key_lines = (
            f"  test key  {test_key}   (testnets only)\n"
            f"  live key  {live_key}\n"
            f"            the same on every start: kept in {keys_path}\n"
            "            no rate or compute-unit limits (the dev account overrides its plan's)\n"
        )
    where = f"""
chaingate dev is up.
  JSON-RPC  {rpc}{key_url}
  anvil     {anvil_url}  (chain id {anvil.DEVNET_CHAIN_ID})
  manifest  {manifest_path}
            {len(manifest.contracts)} contracts by name: ERC-4337 v0.6-v0.8, tokens, NFTs, feeds
  paymaster signer {manifest.paymaster_signer}
  bundler   {base}/v1/bundler/ethereum/devnet  (EOA {bundler_address or "none"}, funded)
{_solana_where(base, solana, keys)}{dashboard}{key_lines}
"""
    try_lines = _dev_try_lines(base, rpc, key_header, admin_token, manifest, webhook_variant)
    try_lines += _solana_try_lines(base, key_header, solana)
    return where + try_lines + "Ctrl-C stops chaingate and anvil.\n"


class _SolanaNode:
    """What the banner says of solana/devnet: the node's URLs and its manifest."""

    def __init__(
        self,
        endpoints: solana_server.Endpoints,
        manifest: solana_devstate.SolanaManifest,
        path: Path,
    ) -> None:
        self.endpoints = endpoints
        self.manifest = manifest
        self.path = path


def _solana_where(base: str, solana: _SolanaNode | None, keys: tuple[str, str] | None) -> str:
    if solana is None:
        return ""
    rpc = f"{base}/v1/rpc/solana/devnet"
    # The key in the URL: what solana-py, @solana/kit and the Solana CLI take.
    key_url = f"\n            {rpc}/{keys[0]}" if keys is not None else ""
    manifest = solana.manifest
    mint = manifest.mint
    first = manifest.accounts[0]
    each = f"{first.lamports // 10**9} SOL and {first.tokens // 10**mint.decimals} {mint.symbol}"
    return f"""  Solana    {rpc}{key_url}
            node {solana.endpoints.http}  (PubSub {solana.endpoints.ws}; LiteSVM, 400 ms slots)
  manifest  {solana.path}
            {len(manifest.accounts)} funded keypairs ({each} each; keypair files beside it),
            SPL mint {mint.symbol} {mint.address}
"""


def _solana_try_lines(base: str, key_header: str, solana: _SolanaNode | None) -> str:
    """Curl lines for solana/devnet, on the first dev keypair and its token account."""
    if solana is None:
        return ""
    rpc = f"{base}/v1/rpc/solana/devnet"
    account = solana.manifest.accounts[0]
    return f"""Solana:
  curl -s {rpc}{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"getBalance","params":["{account.pubkey}"]}}'
  curl -s {rpc}{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"getTokenAccountBalance",
            "params":["{account.token_account}"]}}'
  curl -s {rpc}{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"getSlot","params":[{{"commitment":"processed"}}]}}'
  (solana-py, @solana/kit and the Solana CLI take the URL; docs/guides/rpc.md, "Solana")

"""


def _dev_try_lines(
    base: str,
    rpc: str,
    key_header: str,
    admin_token: str,
    manifest: Manifest,
    webhook_variant: str,
) -> str:
    """A curl line for every feature, on the devnet's demo account, token and collection."""
    ct = "-H 'Content-Type: application/json'"  # REST bodies say they are JSON (else 415)
    hook_type = "address_activity" if webhook_variant == "a" else "ADDRESS_ACTIVITY"
    # A demo account with tokens and NFTs, and the demo token and collection.
    holder = manifest.accounts[2] if len(manifest.accounts) > 2 else manifest.deployer
    token = manifest.contracts["erc20_cgt"].address if "erc20_cgt" in manifest.contracts else ""
    collection = manifest.contracts.get("erc721_collection")
    collection_address = collection.address if collection is not None else ""
    # A transaction to simulate: the holder sends one CGT to the deployer.
    send_one = abi.encode_call("transfer(address,uint256)", manifest.deployer, 10**18).hex()
    sim_tx = f'{{"from":"{holder}","to":"{token}","data":"0x{send_one}"}}'
    sim_body = f'{{"kind":"asset_changes","transactions":[{sim_tx}]}}'
    return f"""Try:
  curl -s {rpc}{key_header} \\
       -H 'Content-Type: application/json' \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}}'
  curl -s {rpc}{key_header} \\
       -d '[{{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}},
            {{"jsonrpc":"2.0","id":2,"method":"eth_accounts"}}]'
  curl -s --compressed {rpc}{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["latest",true]}}'
  curl -s {rpc}{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"chaingate_simulateAssetChanges","params":[{sim_tx}]}}'
  (what it would do before it is signed; alchemy_simulateAssetChanges answers the same;
   bundles, call traces and UserOperations: docs/guides/simulation.md)
  curl -s {base}/v1/simulate/ethereum{key_header} {ct} -d '{sim_body}'
  curl -si -X OPTIONS {rpc} \\
       -H 'Origin: https://app.example' -H 'Access-Control-Request-Method: POST'
  (a browser's preflight; lock a key to your site, IPs, methods or contracts with
   chaingate keys update KEY_ID --allow-origin https://app.example: docs/guides/rpc.md)
  curl -s {base}/v1/gas/ethereum/prices{key_header}
  curl -s {base}/v1/tokens/ethereum/balances/{holder}{key_header}
  curl -s {base}/v1/tokens/ethereum/metadata/{token}{key_header}
  curl -s {base}/v1/nfts/ethereum/owned/{holder}{key_header}
  curl -s {base}/v1/nfts/ethereum/metadata/{collection_address}/1{key_header}
  curl -s {base}/v1/nfts/ethereum/collection/{collection_address}{key_header}
  curl -s {base}/v1/transfers/ethereum/{holder}{key_header}
  curl -s {base}/v1/usage{key_header}
  curl -s {base}/v1/wallets/create{key_header} {ct} -d '{{"owner":"{holder}","chain":"ethereum"}}'
  curl -s {base}/v1/wallets/create{key_header} {ct} \\
       -d '{{"owner":"{holder}","chain":"ethereum","eip7702":true}}'   (the EOA itself, EIP-7702)
  curl -s {base}/v1/wallets{key_header}
  curl -s {base}/v1/gas/policies{key_header} {ct} \\
       -d '{{"name":"demo","chain":"ethereum","rules":{{"max_gas_usd":"20"}}}}'
  (POST {base}/v1/gas/sponsor with an operation: docs/guides/wallets.md;
   REST bodies are JSON, labelled so: 415 otherwise)
  curl -s {base}/v1/webhooks{key_header} {ct} \\
       -d '{{"url":"http://127.0.0.1:9000/hook","chain":"ethereum","event_type":"{hook_type}","config":{{"addresses":["{holder}"]}}}}'
  curl -s {base}/v1/webhooks{key_header}
  (a receiver to try them with, and how to verify signatures: docs/guides/webhooks.md)
  curl -s {base}/v1/bundler/ethereum/devnet{key_header} \\
       -d '{{"jsonrpc":"2.0","id":1,"method":"eth_supportedEntryPoints","params":[]}}'
  (send a UserOperation with permissionless.js or Python: docs/guides/wallets.md)
  curl -s {base}/v1/openapi.json    (the REST API, OpenAPI 3.1)
  curl -s {base}/v1/health
  (worker: the answering process; leads: its single-writer roles — one process here;
   chaingate serve --workers N on PostgreSQL + Redis: docs/guides/operator.md)
  curl -s {base}/metrics -H 'Authorization: Bearer {admin_token}'

"""


def _bundler_address(settings: config.Settings) -> str:
    key = bundler_key(settings.bundler)
    return key.address if key is not None else ""


def _fund_bundler(anvil_url: str, settings: config.Settings) -> None:
    """Tops the dev bundler key up to BUNDLER_FUNDING_WEI (it pays every bundle's gas)."""
    key = bundler_key(settings.bundler)
    if key is None:
        return
    with DevnetRpc(anvil_url) as rpc:
        if int(rpc.call("eth_getBalance", key.address, "latest"), 16) < BUNDLER_FUNDING_WEI // 2:
            rpc.call("anvil_setBalance", key.address, hex(BUNDLER_FUNDING_WEI))


def _new_chain_line(new_because: str | None, deleted: dict[str, int]) -> str:
    """The one line saying the store's chain state was reset, and why."""
    rows = ", ".join(
        f"{count} row{'' if count == 1 else 's'} of {table}" for table, count in deleted.items()
    )
    why = new_because or "the store had followed another one"
    return (
        f"devnet: this is a new chain ({why}); reset what the store derived from the previous "
        f"one ({rows or 'nothing was stored yet'})"
    )


async def _dev(
    settings: config.Settings,
    data_dir: Path,
    binary: Path,
    anvil_port: int,
    store: Store,
    signer: PrivateKey,
) -> int:
    anvil_url = f"http://127.0.0.1:{anvil_port}"
    node = DevNode(
        anvil.anvil_argv(binary, anvil_port), anvil_url, data_dir / DEVNET_CHAIN, say=_say
    )
    # Open from the start, so a signal during start-up, or while anvil is being saved and
    # stopped, is ours to handle rather than a KeyboardInterrupt that would orphan anvil.
    with trio.open_signal_receiver(*DEV_SIGNALS) as signals:
        return await _dev_until_stopped(settings, data_dir, anvil_url, node, store, signer, signals)


async def _dev_until_stopped(
    settings: config.Settings,
    data_dir: Path,
    anvil_url: str,
    node: DevNode,
    store: Store,
    signer: PrivateKey,
    signals: AsyncIterator[int],
) -> int:
    async with trio.open_nursery() as nursery:
        stopper = _Stopper(nursery.cancel_scope)
        nursery.start_soon(_watch_signals, stopper, signals)

        async def run_node(task_status: trio.TaskStatus[None]) -> None:
            try:
                await node.run(task_status=task_status)
            finally:
                nursery.cancel_scope.cancel()  # anvil gone for good: so is chaingate dev

        try:
            await nursery.start(run_node)
        except (NodeFailed, OSError) as exc:
            _say(f"error: cannot start anvil: {exc}")
            return 1
        solana = await _start_solana(nursery, data_dir)
        if solana is None:
            return 1
        settings = _with_solana_node(settings, solana.endpoints)
        code = await _bring_up(
            nursery, stopper, settings, data_dir, anvil_url, node, store, signer, solana
        )
        if code != 0:
            nursery.cancel_scope.cancel()  # takes anvil down
    if node.failure is not None:  # anvil died for good (at start-up or later)
        _say(f"error: {node.failure}")
        return 1
    return code


async def _bring_up(
    nursery: trio.Nursery,
    stopper: _Stopper,
    settings: config.Settings,
    data_dir: Path,
    anvil_url: str,
    node: DevNode,
    store: Store,
    signer: PrivateKey,
    solana: _SolanaNode | None = None,
) -> int:
    """On the started anvil: the chain (continued or new), the store's state agreeing with
    it, the dev keys, the gateway, the banner.  1 (having said why) when any fails."""
    manifest_path = settings.chains["ethereum"]["devnet"].manifest
    try:
        prepared = await trio.to_thread.run_sync(
            functools.partial(
                persist.prepare,
                anvil_url,
                chain_path=data_dir / DEVNET_CHAIN,
                manifest_path=Path(manifest_path),
                paymaster_signer=signer.address,
                renew=functools.partial(trio.from_thread.run, node.renew),
                announce=_say,
            )
        )
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as exc:
        if node.failure is None:  # else anvil died, and that is what is said
            _say(f"error: devnet bootstrap failed: {exc}")
        return 1
    node.track(prepared.saved)
    try:
        async with store:
            await store.migrate()
            claim = await store.claim_chain(*DEV_NETWORK, prepared.saved.identity)
            issued = None
            dashboard_token = ""
            if settings.auth.enabled:
                issued = await issue_dev_keys(
                    store, settings.auth.pepper.encode(), data_dir / DEV_KEYS_FILE
                )
                if settings.dashboard.enabled:
                    dashboard_token = await dev_signin_link(store, DEV_EMAIL)
    except (StoreError, OSError) as exc:  # OSError: the dev keys file could not be written
        _say(f"error: {exc}")
        return 1
    if claim.reset:
        _say(_new_chain_line(prepared.new_because, claim.deleted))
    await _fund_and_price(anvil_url, settings, prepared.manifest)
    # The devnet's IPFS and https documents come from a server of its own on loopback (its
    # IPFS gateway, and where its https host goes); loopback is allowed here, and only here.
    try:
        documents = await nursery.start(serve_documents, served_documents())
    except OSError as exc:
        _say(f"error: cannot serve the devnet's metadata documents on loopback: {exc}")
        return 1
    settings = _with_ipfs_gateway(settings, documents)
    route = DevnetHost(METADATA_HOSTNAME, int(documents.rsplit(":", 1)[1]))
    fetcher = Fetcher(OutboundPolicy.dev(), resolver=route, connector=route)
    gateway = Gateway(settings, fetcher=fetcher)

    async def run_gateway(task_status: trio.TaskStatus[int]) -> None:
        try:
            await gateway.run(task_status=task_status)
        finally:
            nursery.cancel_scope.cancel()  # takes anvil down with us

    stopper.gateway = gateway
    try:
        port = await nursery.start(run_gateway)
    except OSError as exc:  # most often: the port is taken
        _say(f"error: cannot serve on {settings.server.host}:{settings.server.port}: {exc}")
        return 1
    await _wait_for_the_index(gateway, anvil_url)
    keys = (issued.keys.test, issued.keys.live) if issued is not None else None
    _say(
        _dev_banner(
            port,
            settings.server.host,
            anvil_url,
            settings.observability.admin_token,
            keys,
            manifest_path,
            prepared.manifest,
            data_dir / DEV_KEYS_FILE,
            settings.webhooks.variant,
            _bundler_address(settings),
            dashboard_token,
            solana,
        )
    )
    return 0


async def _fund_and_price(anvil_url: str, settings: config.Settings, manifest: Manifest) -> None:
    """The bundler's key funded and the price feeds refreshed: a failure of either is a
    warning (the devnet runs, with bundles or USD values that may fail)."""
    try:
        await trio.to_thread.run_sync(_fund_bundler, anvil_url, settings)
    except (RuntimeError, OSError, ValueError) as exc:
        _say(f"warning: the bundler's key was not funded ({exc}): bundles may fail")
    try:
        await trio.to_thread.run_sync(refresh_price_feeds, anvil_url, manifest)
    except (RuntimeError, OSError, ValueError) as exc:
        _say(
            f"warning: the devnet's price feeds were not refreshed ({exc}): USD values may be null"
        )


async def _start_solana(nursery: trio.Nursery, data_dir: Path) -> _SolanaNode | None:
    """solana/devnet's node: its ledger resumed from the data dir (else a new one, funded), served
    on loopback and saved there while it runs.  None (having said why) when it cannot start."""
    try:
        prepared = await trio.to_thread.run_sync(solana_devstate.prepare, data_dir, time.time())
    except (OSError, ValueError) as exc:
        _say(f"error: cannot prepare the Solana devnet under {data_dir}: {exc}")
        return None
    _say(prepared.note)
    try:
        endpoints = await nursery.start(
            functools.partial(solana_server.serve, prepared.ledger, state_path=prepared.state_path)
        )
    except OSError as exc:
        _say(f"error: cannot serve the Solana devnet on loopback: {exc}")
        return None
    path = data_dir / solana_devstate.DIRECTORY / solana_devstate.MANIFEST_FILE
    return _SolanaNode(endpoints, prepared.manifest, path)


def _with_solana_node(
    settings: config.Settings, endpoints: solana_server.Endpoints
) -> config.Settings:
    """solana/devnet's upstream: the node chaingate dev started (HTTP and PubSub)."""
    chain, network = SOLANA_NETWORK
    net = settings.chains.get(chain, {}).get(network)
    if net is None:
        return settings  # a dev config without it
    upstream = msgspec.structs.replace(net.upstreams[0], url=endpoints.http, ws_url=endpoints.ws)
    devnet = msgspec.structs.replace(net, upstreams=[upstream])
    chains = {**settings.chains, chain: {**settings.chains[chain], network: devnet}}
    return msgspec.structs.replace(settings, chains=chains)


async def _wait_for_the_index(gateway: Gateway, anvil_url: str) -> None:
    """Until the devnet's index holds the chain as it is now, so that the banner's data-plane
    lines answer as printed (a fresh chain's demo transfers are indexed in a second or two)."""
    if gateway.data is None:
        return
    try:
        head = await trio.to_thread.run_sync(anvil.rpc_call, anvil_url, "eth_blockNumber")
    except (RuntimeError, OSError, ValueError):
        return  # anvil's health is the node's to report
    with trio.move_on_after(INDEX_WAIT) as waited:
        await gateway.data.wait_indexed(Network(*DEV_NETWORK), int(str(head), 16))
    if waited.cancelled_caught:
        _say("warning: the token and NFT index is still catching up; its lines may 404 a while")


def _with_ipfs_gateway(settings: config.Settings, url: str) -> config.Settings:
    """The devnet's metadata asks ``url`` first; image URLs keep the public gateway."""
    net = settings.chains["ethereum"]["devnet"]
    metadata = net.metadata
    metadata = msgspec.structs.replace(
        metadata,
        ipfs_gateways=[url, *metadata.ipfs_gateways],
        image_gateway=metadata.image_gateway or next(iter(metadata.ipfs_gateways), ""),
    )
    devnet = msgspec.structs.replace(net, metadata=metadata)
    chains = {**settings.chains, "ethereum": {**settings.chains["ethereum"], "devnet": devnet}}
    return msgspec.structs.replace(settings, chains=chains)


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
    if not os.environ.get("CHAINGATE_PAYMASTER__KEY"):
        # The devnet paymasters' signer: the key chaingate dev deploys them with.
        key_file = args.paymaster_key or str(data_dir / PAYMASTER_KEY_FILE)
        data.setdefault("paymaster", {}).setdefault("key_file", key_file)
    if not os.environ.get("CHAINGATE_BUNDLER__KEY"):
        load_or_create_key(data_dir / BUNDLER_KEY_FILE)  # generated on first run, mode 0600
        data.setdefault("bundler", {}).setdefault("key_file", str(data_dir / BUNDLER_KEY_FILE))
    return config.from_mapping(data, config_dir=path.parent)


def _paymaster_key(args: argparse.Namespace, settings: config.Settings) -> PrivateKey:
    """The key given with --paymaster-key, else the dev one kept under the data dir."""
    if args.paymaster_key:
        return PrivateKey.from_hex(Path(args.paymaster_key).expanduser().read_text())
    return load_or_create_key(Path(settings.data_dir).expanduser() / PAYMASTER_KEY_FILE)


def cmd_dev(args: argparse.Namespace) -> int:
    try:
        binary = anvil.anvil_binary(announce=_say)
    except (OSError, RuntimeError) as exc:
        _say(f"error: cannot install anvil: {exc}")
        return 1
    anvil_port = args.anvil_port or anvil.free_port()
    settings = _dev_settings(args, f"http://127.0.0.1:{anvil_port}")
    setup_logging(settings.observability.log_level)
    pin_mmap_threshold()
    data_dir = Path(settings.data_dir).expanduser()
    try:
        lock = DataDirLock(data_dir).acquire()
    except DataDirBusy as exc:
        _say(f"error: {exc}")
        return 1
    try:
        try:
            signer = _paymaster_key(args, settings)
        except (OSError, ValueError) as exc:
            _say(f"error: cannot read the paymaster signer key: {exc}")
            return 1
        try:
            store = open_store(settings.store.url, data_dir)
            code: int = trio.run(_dev, settings, data_dir, binary, anvil_port, store, signer)
        except (OSError, StoreError) as exc:
            _say(f"error: {exc}")
            return 1
        except KeyboardInterrupt:  # a Ctrl-C before the signal receiver was open
            return 130
    finally:
        lock.release()
    return code


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config)
        count = worker_count(args.workers if args.workers is not None else settings.server.workers)
        check_shared_state(settings, count)
    except config.ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    setup_logging(settings.observability.log_level)
    if count > 1:
        return _supervise(args.config, settings, count)
    pin_mmap_threshold()
    try:
        gateway = Gateway(settings)
    except (config.ConfigError, PlanError) as exc:
        _say(f"error: {exc}")
        return 2
    try:
        trio.run(_serve, gateway)
    except BaseExceptionGroup as group:
        # A config error found while starting (the bundler's upstreams on different chains,
        # say): the same one line as one found before; anything else as it was.
        found, rest = group.split(config.ConfigError)
        if found is None or rest is not None:
            raise
        for error in _leaves(found):
            _say(f"error: {error}")
        return 2
    return 0


def _supervise(config_path: str, settings: config.Settings, count: int) -> int:
    """``serve --workers N``: the parent holds the port and keeps N workers running."""
    try:
        reservation = reserve_port(settings.server.host, settings.server.port)
    except OSError as exc:
        _say(f"error: cannot serve on {settings.server.host}:{settings.server.port}: {exc}")
        return 2
    with reservation:
        port = reservation.getsockname()[1]
        supervisor = Supervisor(
            config_path, count, port, shutdown_grace=settings.server.shutdown_grace
        )
        return trio.run(supervisor.run)


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions of a group, nested groups flattened (trio nests one per nursery)."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


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
    accounts = AuthRows(store)
    async with store:
        await store.migrate()
        if args.action == "create":
            plans.limits(args.plan)  # an unknown plan is an error before anything is stored
            account = await admin.ensure_account(accounts, args.email, args.plan)
            scopes = admin.parse_scopes(args.scopes)
            key, row = await admin.create_key(
                accounts, pepper, account.id, args.name, args.env, scopes
            )
            _say(f"key {row.id} for {account.email} (account {account.id}, plan {account.plan})")
            _say(f"  scopes: {row.scopes or 'all'}")
            _say(f"  {key}")
            _say("Store it now: it is shown only once.")
        elif args.action == "list":
            account_id = None
            if args.email:
                found = await accounts.find_account_by_email(args.email)
                if found is None:
                    _say(f"no account for {args.email}")
                    return 1
                account_id = found.id
            for row in await accounts.list_keys(account_id):
                state = "revoked" if row.revoked_at is not None else "active"
                last = _iso_ms(row.last_used_at) if row.last_used_at else "never"
                _say(
                    f"{row.id}  {row.prefix}…  {row.name:<16} {row.environment:<4} {state:<7} "
                    f"scopes={row.scopes or 'all'}  created={_iso_ms(row.created_at)}  "
                    f"last_used={last}" + (f"  allow={row.allowlists}" if row.allowlists else "")
                )
        elif args.action == "update":
            replace = {
                name: values
                for name, values in (
                    ("origins", args.allow_origin),
                    ("ips", args.allow_ip),
                    ("methods", args.allow_method),
                    ("contracts", args.allow_contract),
                )
                if values
            }
            clear = set(args.clear or ())
            if not replace and not clear:
                _say(
                    "nothing to change: give --allow-origin/--allow-ip/--allow-method/"
                    "--allow-contract or --clear"
                )
                return 2
            updated = await admin.update_allowlists(accounts, args.key_id, replace, clear)
            if updated is None:
                _say(f"no key {args.key_id}")
                return 1
            _say(
                f"{args.key_id}: allowlists {updated.allowlists or 'none (no restriction)'}; "
                "every process applies them within a second"
            )
        elif args.action == "revoke":
            if not await accounts.revoke_key(args.key_id):
                _say(f"no key {args.key_id}")
                return 1
            _say(f"revoked {args.key_id}; every process stops accepting it within a second")
        else:  # plan
            target = await accounts.find_account_by_email(args.email)
            if target is None:
                _say(f"no account for {args.email}")
                return 1
            plans.limits(args.plan, args.limits)
            await accounts.set_plan(target.id, args.plan, args.limits)
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


def cmd_accounts(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config) if args.config else config.from_mapping({})
        store = open_store(
            settings.store.url,
            Path(settings.data_dir).expanduser(),
            pool_size=settings.store.pool_size,
        )
        return set_password_command(store, args.email, args.operator, _say)
    except (config.ConfigError, StoreError) as exc:
        _say(f"error: {exc}")
        return 2


def cmd_bench(args: argparse.Namespace) -> int:
    """A fresh interpreter runs the bench: locust patches the process with gevent on import,
    which must come before anything this one has loaded (trio, ssl)."""
    help_asked = ["--help"] if args.bench_help else []
    command = [sys.executable, "-m", "chaingate.benchsuite", *help_asked, *args.bench_args]
    os.execv(sys.executable, command)  # noqa: S606


def _workers_arg(text: str) -> int | Literal["auto"]:
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError('a number, or "auto"') from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chaingate", description=__doc__.splitlines()[1] if __doc__ else None
    )
    commands = parser.add_subparsers(dest="command", required=True)
    dev = commands.add_parser(
        "dev", help="run on embedded defaults with a local anvil devnet and a local Solana node"
    )
    dev.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    dev.add_argument("--port", type=int, default=8000, help="port to serve on (default: 8000)")
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
    serve.add_argument(
        "--workers",
        type=_workers_arg,
        help='processes on the port (default: [server] workers, 1); "auto": one per CPU. '
        "More than one needs PostgreSQL (store.url) and Redis (auth.redis_url)",
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
    create.add_argument("--name", default="default", help="a label for the key (shown in lists)")
    create.add_argument("--env", choices=("test", "live"), default="test")
    create.add_argument("--scopes", help="e.g. 'rpc:read data:read'; default: all scopes")
    listing = actions.add_parser("list", help="list keys (prefixes only; keys are never stored)")
    listing.add_argument("--email", help="only this account's keys")
    update = actions.add_parser(
        "update",
        help="set or clear a key's allowlists; each --allow-* replaces that list "
        "(repeat it, or separate entries with commas)",
    )
    update.add_argument("key_id", help="the key's id (chaingate keys list)")
    update.add_argument(
        "--allow-origin", action="append", help="browser origin, e.g. https://*.example.com"
    )
    update.add_argument("--allow-ip", action="append", help="client CIDR range, IPv4 or IPv6")
    update.add_argument("--allow-method", action="append", help="JSON-RPC method, e.g. eth_call")
    update.add_argument(
        "--allow-contract",
        action="append",
        help="address eth_call/eth_sendRawTransaction/eth_getLogs may target",
    )
    update.add_argument(
        "--clear",
        action="append",
        choices=("origins", "ips", "methods", "contracts", "all"),
        help="empty a list (no restriction); repeatable",
    )
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id", help="the key's id (chaingate keys list)")
    plan = actions.add_parser("plan", help="change an account's plan")
    plan.add_argument("--email", required=True, help="the account's e-mail")
    plan.add_argument("--plan", required=True, help="a plan of config/plans.toml")
    plan.add_argument("--limits", help="JSON overrides, e.g. '{\"requests_per_second\": 500}'")
    keys.set_defaults(func=cmd_keys)
    accounts = commands.add_parser("accounts", help="dashboard sign-in of accounts")
    accounts.add_argument("--config", help="path to a TOML file; default: built-in defaults")
    account_actions = accounts.add_subparsers(dest="action", required=True)
    set_password = account_actions.add_parser(
        "set-password",
        help="set the dashboard password of an account (read from the terminal, or stdin)",
    )
    set_password.add_argument("email")
    set_password.add_argument(
        "--operator",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="flag the account operator (sees every account and the upstreams), or not",
    )
    accounts.set_defaults(func=cmd_accounts)
    bench = commands.add_parser(
        "bench",
        help="load tests against any endpoint: rpc, ws, rest, webhooks, userops, proxy, "
        "alto, compare (pip install -e '.[bench]')",
        add_help=False,
    )
    bench.add_argument("-h", "--help", action="store_true", dest="bench_help")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    dev.add_argument("--data-dir", help="default: ~/.local/share/chaingate/dev")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        result: int = args.func(args)
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
    except BrokenPipeError:
        # The reader left (`chaingate keys list | head -1`): stop quietly, as other tools do.
        # Later writes, the interpreter's own flush at exit included, go nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
    return result


if __name__ == "__main__":
    sys.exit(main())
