"""Bootstrapped devnet states kept on disk, so a second start loads instead of redeploying.

An entry is anvil's own ``anvil_dumpState`` (accounts, code, storage, blocks, receipts and logs)
plus the manifest that describes it, both under a key that digests everything that shaped the
state: node version and chain id, its accounts, the paymaster signer, every artifact's bytecode
and the bootstrap code itself.  Change any of them and the key changes; a stale entry is never
used.  The newest few entries are kept.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from chaingate.config import manifest as manifest_io
from chaingate.config.manifest import Manifest

KEEP = 4
# Modules whose behaviour shapes the bootstrapped state: their source is part of the key.
_SHAPING_MODULES = ("bootstrap.py", "deploy.py", "demo.py", "erc4337.py")


def cache_key(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    here = Path(__file__).parent
    for name in _SHAPING_MODULES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:32]


def _paths(cache_dir: Path, key: str) -> tuple[Path, Path]:
    return cache_dir / f"state-{key}.hex", cache_dir / f"state-{key}.manifest.json"


def load(cache_dir: Path, key: str) -> tuple[str, Manifest] | None:
    state_path, manifest_path = _paths(cache_dir, key)
    try:
        state = state_path.read_text()
        manifest = manifest_io.load_manifest(manifest_path)
    except (OSError, manifest_io.ManifestError):
        return None
    if manifest.cache_key != key:
        return None
    os.utime(state_path)  # recently used: survives pruning
    return state, manifest


def _write_atomic(path: Path, data: bytes) -> None:
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def save(cache_dir: Path, key: str, state: str, manifest: Manifest) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    state_path, manifest_path = _paths(cache_dir, key)
    # The manifest goes last: an entry without one is ignored, so a crash leaves no half entry.
    _write_atomic(state_path, state.encode())
    _write_atomic(manifest_path, manifest_io.dumps(manifest))
    _prune(cache_dir)


def discard(cache_dir: Path, key: str) -> None:
    for path in _paths(cache_dir, key):
        path.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # another process pruned it meanwhile
        return 0.0


def _prune(cache_dir: Path) -> None:
    states = sorted(cache_dir.glob("state-*.hex"), key=_mtime, reverse=True)
    for old in states[KEEP:]:
        discard(cache_dir, old.name.removeprefix("state-").removesuffix(".hex"))
