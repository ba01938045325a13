"""Bring a running anvil to the devnet that shows everything, and say where it all is.

``bootstrap_devnet(url, paymaster_signer=..., cache_dir=...)`` deploys ERC-4337 (``erc4337``) and
the demo assets with their history (``demo``) in three batched stages, checks every contract is
where the manifest says, and returns the ``Manifest``.  On a fresh node (block 0) the result is
cached (``state_cache``); the next fresh node with the same inputs gets it by ``anvil_loadState``
in well under a second, keeping its own block gas limit.  ``chaingate dev`` and the test fixtures
both come through here.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from chaingate.config.manifest import SCHEMA, Contract, Manifest
from chaingate.devnet import demo, erc4337, state_cache
from chaingate.devnet.artifacts import (
    Artifact,
    aa_artifacts,
    aa_sources,
    erc4337_sources,
    fingerprint,
)
from chaingate.devnet.deploy import (
    DETERMINISTIC_DEPLOYER,
    BootstrapError,
    Planned,
    TxRunner,
    manual_mining,
)
from chaingate.devnet.npm import cache_root
from chaingate.devnet.rpc import DevnetRpc
from chaingate.devnet.solc import SOLC_VERSION, compile_sources, devnet_sources
from chaingate.evm.addresses import checksum_address, same_address

HISTORY_ACCOUNTS = 10  # anvil's default funded accounts: the deployer and nine more


def default_cache_dir() -> Path:
    return cache_root() / "devnet"


def load_artifacts(cache_dir: Path, announce: Callable[[str], None] = print) -> dict[str, Artifact]:
    """Every artifact the bootstrap deploys, by manifest name or contract name."""
    artifacts: dict[str, Artifact] = aa_artifacts(erc4337.ARTIFACTS, announce=announce)
    # One solc run for the demo contracts and chaingate's own ERC-4337 ones (with what they
    # import from the pinned packages): most of a compile is starting solc-js.
    demo_sources = devnet_sources()
    sources = {**aa_sources(erc4337_sources(), announce=announce), **demo_sources}
    compiled = compile_sources(sources, cache_dir, announce=announce)
    for name, contract in erc4337.COMPILED.items():
        artifacts[name] = compiled[contract]
    demo_files = {f"chaingate:{name} (solc {SOLC_VERSION})" for name in demo_sources}
    artifacts.update((name, a) for name, a in compiled.items() if a.source in demo_files)
    return artifacts


def definition_key(cache_dir: Path | None = None, announce: Callable[[str], None] = print) -> str:
    """A digest of what the devnet's contracts are (compiler, every artifact's bytecode).  A
    chain saved under another one lacks contracts, or has others, than the bootstrap would
    deploy now: ``chaingate dev`` starts a new chain rather than continue it."""
    artifacts = load_artifacts(cache_dir or default_cache_dir(), announce)
    return hashlib.sha256(f"{SOLC_VERSION}\0{fingerprint(artifacts)}".encode()).hexdigest()[:32]


def bootstrap_devnet(
    url: str,
    *,
    paymaster_signer: str,
    cache_dir: Path | None = None,
    announce: Callable[[str], None] = print,
) -> Manifest:
    """Deploy (or load from cache) the devnet at ``url``; returns its manifest."""
    started = time.monotonic()
    cache_dir = cache_dir or default_cache_dir()
    paymaster_signer = checksum_address(paymaster_signer)
    with DevnetRpc(url) as rpc:
        chain_id, client, latest, accounts, proxy_code = rpc.batch(
            [
                ("eth_chainId", []),
                ("web3_clientVersion", []),
                ("eth_getBlockByNumber", ["latest", False]),
                ("eth_accounts", []),
                ("eth_getCode", [DETERMINISTIC_DEPLOYER, "latest"]),
            ]
        )
        if proxy_code in ("0x", ""):  # a call to an empty address "succeeds" and deploys nothing
            raise BootstrapError(f"no deterministic deployment proxy at {DETERMINISTIC_DEPLOYER}")
        if len(accounts) < HISTORY_ACCOUNTS:
            raise BootstrapError(f"the devnet needs {HISTORY_ACCOUNTS} unlocked accounts")
        accounts = [checksum_address(a) for a in accounts[:HISTORY_ACCOUNTS]]
        artifacts = load_artifacts(cache_dir, announce)
        key = state_cache.cache_key(
            [
                str(int(chain_id, 16)),
                client,
                paymaster_signer,
                SOLC_VERSION,
                fingerprint(artifacts),
                *accounts,
            ]
        )
        fresh = int(latest["number"], 16) == 0
        if fresh:
            cached = state_cache.load(cache_dir, key)
            if cached is not None:
                state, manifest = cached
                _load_state(rpc, state, latest["gasLimit"])
                _verify(rpc, manifest, cache_dir)
                announce(f"devnet: state loaded from cache in {time.monotonic() - started:.2f}s")
                return manifest
        with manual_mining(rpc):
            manifest = _deploy(rpc, artifacts, accounts, paymaster_signer, int(chain_id, 16), key)
        _verify(rpc, manifest, None)
        if fresh:  # a node with history of its own would leak that history into the cache
            state_cache.save(cache_dir, key, rpc.call("anvil_dumpState"), manifest)
    # Deployed, not "ready": compiling (said apart, when it happens) is not counted here.
    announce(
        f"devnet: {len(manifest.contracts)} contracts deployed in "
        f"{time.monotonic() - started:.2f}s"
        + (" (state cached for the next start)" if fresh else "")
    )
    return manifest


def _load_state(rpc: DevnetRpc, state: str, gas_limit: str) -> None:
    """Load a cached state into this fresh node, whose block gas limit stays its own.

    ``anvil_loadState`` also restores the dumping node's block environment, gas limit
    included: a state cached by a node started with ``--gas-limit 100000000`` would quietly cut
    a node started with ``--gas-limit 1000000000`` down to 100M, and a block its owner sized
    for 1e9 would leave transactions in the pool.  The gas limit is the node's setting, not
    the chain's (the cache key does not hold it), so it is put back.
    """
    rpc.call("anvil_loadState", state)
    rpc.call("evm_setBlockGasLimit", gas_limit)


def _deploy(
    rpc: DevnetRpc,
    artifacts: Mapping[str, Artifact],
    accounts: list[str],
    paymaster_signer: str,
    chain_id: int,
    key: str,
) -> Manifest:
    deployer = accounts[0]
    planned = erc4337.deployments(artifacts, deployer, paymaster_signer)
    planned += demo.deployments(artifacts, deployer)
    runner = TxRunner(rpc)
    contracts, kept = _deploy_contracts(rpc, runner, planned)
    addresses = {name: c.address for name, c in contracts.items()}
    demo_names = {p.name for p in planned} - erc4337.ARTIFACTS.keys() - erc4337.COMPILED.keys()
    if kept & demo_names and demo_names - kept:
        raise BootstrapError(
            "this node holds some of the demo contracts but not all: start from a fresh node"
        )
    with_history = not kept & demo_names  # the history refers to token ids: only once
    # Stage 2: one sender (the deployer), so its transactions run in order.
    stage = erc4337.funding(addresses, deployer)
    runner.run(stage + demo.seed(addresses, deployer, accounts) if with_history else stage)
    # Stage 3: the other accounts, each acting only on what stage 2 gave it.
    if with_history:
        runner.run(demo.history(addresses, accounts))
    return Manifest(
        schema=SCHEMA,
        chain_id=chain_id,
        contracts=contracts,
        deployer=deployer,
        paymaster_signer=paymaster_signer,
        accounts=accounts,
        native_price_feed=demo.NATIVE_PRICE_FEED,
        block=int(rpc.call("eth_blockNumber"), 16),
        cache_key=key,
    )


def _deploy_contracts(
    rpc: DevnetRpc, runner: TxRunner, planned: list[Planned]
) -> tuple[dict[str, Contract], set[str]]:
    """Stage 1.  CREATE2 targets that already hold code are kept (and named), not redeployed;
    their ``block`` is 0, as their deployment is not ours to know."""
    targets = [p for p in planned if p.address is not None]
    codes = rpc.batch([("eth_getCode", [p.address, "latest"]) for p in targets])
    present = {p.name for p, code in zip(targets, codes, strict=True) if code not in ("0x", "")}
    to_send = [p for p in planned if p.name not in present]
    receipts = dict(
        zip((p.name for p in to_send), runner.run([p.tx for p in to_send]), strict=True)
    )
    contracts: dict[str, Contract] = {}
    for p in planned:
        receipt = receipts.get(p.name)
        address = p.address or (receipt or {}).get("contractAddress")
        if address is None:
            raise BootstrapError(f"{p.name}: no contract address in its receipt")
        block = int(receipt["blockNumber"], 16) if receipt else 0
        contracts[p.name] = msgspec.structs.replace(
            p.contract, address=checksum_address(address), block=block
        )
    return contracts, present


def verify_devnet(url: str, manifest: Manifest) -> None:
    """Raise ``BootstrapError`` unless every contract of ``manifest`` is on the node at ``url``."""
    with DevnetRpc(url) as rpc:
        _verify(rpc, manifest, None)


def _verify(rpc: DevnetRpc, manifest: Manifest, cache_dir: Path | None) -> None:
    """Every manifest contract has code, canonical ones at their canonical address."""
    names = sorted(manifest.contracts)
    codes = rpc.batch([("eth_getCode", [manifest.address(n), "latest"]) for n in names])
    missing = [n for n, code in zip(names, codes, strict=True) if code in ("0x", "")]
    misplaced = [
        n
        for n in names
        if manifest.contracts[n].canonical
        and not same_address(manifest.address(n), erc4337.CANONICAL.get(n, bytes(20)))
    ]
    if missing or misplaced:
        if cache_dir is not None:  # a cached state that does not hold up is thrown away
            state_cache.discard(cache_dir, manifest.cache_key)
        raise BootstrapError(
            f"devnet contracts missing: {missing or 'none'}; not at their canonical address: "
            f"{misplaced or 'none'}"
        )
