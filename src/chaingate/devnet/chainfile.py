"""The devnet's chain, saved in the data dir so ``chaingate dev`` continues it after a restart.

One JSON file holds anvil's own ``anvil_dumpState`` (accounts, code, storage, blocks,
receipts, logs) with what identifies the chain it belongs to:

* ``id`` — random, made once when the chain was created.  The bootstrap loads the same cached
  state into every new devnet, so two chains started from it share their genesis and first
  blocks; only this tells a continued chain from one started again.
* ``genesis`` and ``head``/``head_hash`` — checked against anvil after loading, so a state
  that did not load as saved is never taken for this chain.
* ``definition`` — the devnet's contracts it was made with: when the code would deploy others
  now, the chain is not continued (it would lack what the manifest should name).

``identity`` (genesis and id) is what the store records for the network it derived state from.
Written atomically (a crash mid-save leaves the previous file whole), mode 0600.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import msgspec

SCHEMA = 1
CHAIN_FILE = "devnet-chain.json"


class ChainFileError(Exception):
    """The saved chain is missing, unreadable or of another schema."""


class SavedChain(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: int
    id: str  # random, per chain created
    genesis: str  # hash of block 0
    head: int  # the newest block when saved (the state holds at least this one)
    head_hash: str
    saved_at: int  # epoch milliseconds
    anvil: str  # web3_clientVersion of the node that dumped it
    definition: str  # the devnet's contracts it was bootstrapped with (bootstrap.definition_key)
    state: str  # anvil_dumpState's answer, reduced to the canonical chain (0x-hex gzip'd JSON)

    @property
    def identity(self) -> str:
        return f"{self.genesis}:{self.id}"


def new_chain_id() -> str:
    return secrets.token_hex(16)


def load(path: Path) -> SavedChain:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ChainFileError(f"no saved chain at {path}") from None
    except OSError as exc:
        raise ChainFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        saved = msgspec.json.decode(data, type=SavedChain)
    except msgspec.DecodeError as exc:  # ValidationError too
        raise ChainFileError(f"{path} is not a saved chain: {exc}") from None
    if saved.schema != SCHEMA:
        raise ChainFileError(f"{path} has schema {saved.schema}, expected {SCHEMA}")
    return saved


def save(path: Path, saved: SavedChain) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(msgspec.json.encode(saved))
            handle.flush()
            os.fsync(handle.fileno())  # on disk before it replaces the previous save
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def set_aside(path: Path, why: str = "unusable") -> Path | None:
    """Move a saved chain that will not be continued out of the way (kept, never loaded)."""
    aside = path.with_name(f"{path.name}.{why}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return None
    return aside
