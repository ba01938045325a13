"""Continue the devnet's saved chain on a fresh anvil, or start a new one; save it again.

Blocking code (``DevnetRpc`` and file writes), run on a worker thread by ``chaingate dev``:

* ``prepare`` — on a freshly started anvil: load the saved chain (``chainfile``) and check it
  loaded as saved, or, when there is none or it cannot be used, bootstrap a new chain and give
  it a new id.  Writes the chain file and the manifest; says why a chain is new.
* ``save`` — dump the running chain over the chain file (atomically), when it moved on.
* ``restore`` — load a saved chain into a fresh anvil; ``write_state_file`` — the same chain as
  the file ``anvil --load-state`` starts from (a restart: no moment without the chain).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from chaingate.config.manifest import Manifest, ManifestError, load_manifest, save_manifest
from chaingate.devnet import chainfile, statedump
from chaingate.devnet.bootstrap import bootstrap_devnet, definition_key, verify_devnet
from chaingate.devnet.chainfile import ChainFileError, SavedChain
from chaingate.devnet.deploy import BootstrapError
from chaingate.devnet.rpc import DevnetRpc, RpcError

# A dump of a large devnet (100,000 logs) takes seconds; a node that takes this long is stuck.
RPC_TIMEOUT = 30.0


class RestoreError(RuntimeError):
    """A saved chain did not load into anvil as it was saved."""


class Prepared(NamedTuple):
    saved: SavedChain
    manifest: Manifest
    new_because: str | None  # why the chain is a new one; None when the saved one continues


def snapshot(rpc: DevnetRpc, chain_id: str, definition: str) -> SavedChain:
    """The node's whole state as chain ``chain_id``, reduced to its canonical chain."""
    dump = statedump.decode(rpc.call("anvil_dumpState"))
    best = statedump.best_block(dump)
    # By number, after the dump: a block mined meanwhile does not change which one is ``best``.
    client, head = rpc.batch(
        [("web3_clientVersion", []), ("eth_getBlockByNumber", [hex(best), False])]
    )
    if _hash(head) is None:
        raise RestoreError(f"the node does not know its own best block {best}")
    cleaned, hashes = statedump.canonical_only(
        dump, head["hash"], lambda h: rpc.call("eth_getBlockByHash", h, False)
    )
    return SavedChain(
        schema=chainfile.SCHEMA,
        id=chain_id,
        genesis=hashes[0],
        head=best,
        head_hash=head["hash"],
        saved_at=time.time_ns() // 1_000_000,
        anvil=str(client),
        definition=definition,
        state=statedump.encode(cleaned),
    )


def restore(url: str, saved: SavedChain) -> None:
    """Load ``saved`` into the fresh node at ``url``; ``RestoreError`` if it is not that chain."""
    with DevnetRpc(url, timeout=RPC_TIMEOUT) as rpc:
        try:
            rpc.call("anvil_loadState", saved.state)
        except RpcError as exc:
            raise RestoreError(f"anvil refused it ({exc})") from None
    check_loaded(url, saved)


def check_loaded(url: str, saved: SavedChain) -> None:
    """``RestoreError`` unless the node at ``url`` serves ``saved``'s chain up to its head."""
    with DevnetRpc(url, timeout=RPC_TIMEOUT) as rpc:
        genesis, head = rpc.batch(
            [
                ("eth_getBlockByNumber", ["0x0", False]),
                ("eth_getBlockByNumber", [hex(saved.head), False]),
            ]
        )
    if _hash(genesis) != saved.genesis or _hash(head) != saved.head_hash:
        raise RestoreError("its genesis or head block differ from the saved ones once loaded")


def write_state_file(saved: SavedChain, path: Path) -> None:
    """The saved state as the JSON file ``anvil --load-state`` reads at start (mode 0600), so
    a restarted anvil serves the chain from its first answer, never an empty one."""
    data = msgspec.json.encode(statedump.decode(saved.state))
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def _hash(block: object) -> str | None:
    return block.get("hash") if isinstance(block, dict) else None


def save(url: str, path: Path, current: SavedChain, *, if_moved: bool = False) -> SavedChain | None:
    """Dump the node's chain (the one ``current`` describes) to ``path``; return the new save.

    ``if_moved``: only when the head changed since ``current`` (None otherwise).  State changed
    without a block (``anvil_setBalance``...) is saved by the next block or the save on stop.
    """
    with DevnetRpc(url, timeout=RPC_TIMEOUT) as rpc:
        if if_moved:
            head = rpc.call("eth_getBlockByNumber", "latest", False)
            if _hash(head) == current.head_hash:
                return None
        saved = snapshot(rpc, current.id, current.definition)
    if saved.genesis != current.genesis:  # never save another chain under this one's id
        raise RestoreError(f"the node at {url} serves another chain than the one saved")
    chainfile.save(path, saved)
    return saved


def prepare(
    url: str,
    *,
    chain_path: Path,
    manifest_path: Path,
    paymaster_signer: str,
    renew: Callable[[], None],
    cache_dir: Path | None = None,
    announce: Callable[[str], None] = print,
) -> Prepared:
    """Bring the fresh node at ``url`` to the devnet: the saved chain, or a new one.

    ``renew`` replaces the node with a fresh one on the same URL: needed when a saved state
    was loaded but is not the chain (``anvil_reset`` would not do: it drops the deterministic
    deployment proxy anvil puts in its genesis).
    """
    new_because: str | None = None
    saved: SavedChain | None = None
    definition = definition_key(cache_dir, announce)
    try:
        saved = chainfile.load(chain_path)
    except ChainFileError as exc:
        aside = chainfile.set_aside(chain_path)
        if aside is None:
            new_because = f"no saved chain in {chain_path}"
        else:
            new_because = f"the saved chain was unusable, moved to {aside}"
            announce(f"devnet: {exc}; moved to {aside}, starting a new chain")
    if saved is not None and saved.definition != definition:
        aside = chainfile.set_aside(chain_path, "previous")
        new_because = f"the devnet's contracts changed since it was saved, moved to {aside}"
        announce(f"devnet: {new_because}; starting a new chain")
        saved = None
    if saved is not None:
        try:
            restore(url, saved)
        except RestoreError as exc:
            aside = chainfile.set_aside(chain_path)
            new_because = f"the saved chain did not load, moved to {aside}"
            announce(
                f"devnet: the chain saved in {chain_path} did not load: {exc}; moved to {aside}"
            )
            saved = None
            renew()
    if saved is None:
        manifest = bootstrap_devnet(
            url, paymaster_signer=paymaster_signer, cache_dir=cache_dir, announce=announce
        )
        with DevnetRpc(url, timeout=RPC_TIMEOUT) as rpc:
            saved = snapshot(rpc, chainfile.new_chain_id(), definition)
        chainfile.save(chain_path, saved)
        save_manifest(manifest, manifest_path)
        return Prepared(saved, manifest, new_because)
    kept = _saved_manifest(url, manifest_path, paymaster_signer)
    if kept is None:
        # The chain is ours but its manifest is gone or names another paymaster signer: the
        # bootstrap adds what is missing to this chain (it never replays the history).
        kept = bootstrap_devnet(
            url, paymaster_signer=paymaster_signer, cache_dir=cache_dir, announce=announce
        )
        saved = save(url, chain_path, saved) or saved
    save_manifest(kept, manifest_path)
    announce(f"devnet: continuing the chain saved in {chain_path} (block {saved.head})")
    return Prepared(saved, kept, None)


def _saved_manifest(url: str, path: Path, paymaster_signer: str) -> Manifest | None:
    try:
        manifest = load_manifest(path)
        if manifest.paymaster_signer.lower() != paymaster_signer.lower():
            return None
        verify_devnet(url, manifest)
    except (ManifestError, BootstrapError):
        return None
    return manifest
