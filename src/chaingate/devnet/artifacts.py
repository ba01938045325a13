"""Contract artifacts (ABI + creation bytecode) and where they come from.

* ERC-4337 contracts: the audited bytecode published in the pinned npm package
  ``@account-abstraction/contracts`` — 0.6.0 and 0.7.0 installed side by side as npm aliases
  (``aa-v06``, ``aa-v07``).  That exact bytecode reproduces the mainnet addresses through the
  deterministic deployment proxy, so it is used as shipped, never recompiled.
* chaingate's demo contracts: ``contracts/*.sol`` beside this file, compiled by ``solc``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from chaingate.devnet.npm import npm_install

AA_PACKAGE = "@account-abstraction/contracts"
AA_VERSIONS = {"v06": "0.6.0", "v07": "0.7.0"}


class Artifact(msgspec.Struct, frozen=True):
    name: str
    source: str  # where the bytecode came from, e.g. "npm:@account-abstraction/contracts@0.7.0"
    abi: list[dict[str, Any]]
    bytecode: bytes  # creation code, without constructor arguments
    # Runtime code as published (npm artifacts only): what a bundler puts in a state override.
    deployed_bytecode: bytes = b""


def fingerprint(artifacts: Mapping[str, Artifact]) -> str:
    """A digest of every artifact's bytecode: part of the devnet state's cache key."""
    digest = hashlib.sha256()
    for key in sorted(artifacts):
        digest.update(key.encode() + b"\0" + artifacts[key].bytecode + b"\0")
    return digest.hexdigest()


def _aa_install(announce: Callable[[str], None]) -> Path:
    versions = "+".join(AA_VERSIONS.values())
    return npm_install(
        f"aa-contracts-{versions}",
        [f"aa-{tag}@npm:{AA_PACKAGE}@{version}" for tag, version in AA_VERSIONS.items()],
        # One npm run installs both; the rename into place makes either file proof of both.
        "node_modules/aa-v07/artifacts/EntryPoint.json",
        what=f"{AA_PACKAGE} {' and '.join(AA_VERSIONS.values())} (~12 MB)",
        announce=announce,
    )


def aa_package(tag: str, *, announce: Callable[[str], None] = print) -> Path:
    """The installed package of a version tag ("v06"), its version checked."""
    package = _aa_install(announce) / "node_modules" / f"aa-{tag}"
    version = json.loads((package / "package.json").read_text())["version"]
    if version != AA_VERSIONS[tag]:  # a stale or hand-edited install must not slip through
        raise RuntimeError(f"{package} holds {AA_PACKAGE} {version}, not {AA_VERSIONS[tag]}")
    return package


def aa_artifacts(
    names: Mapping[str, tuple[str, str]], *, announce: Callable[[str], None] = print
) -> dict[str, Artifact]:
    """Artifacts by key, each given as (version tag, contract name), e.g. ("v07", "EntryPoint")."""
    found: dict[str, Artifact] = {}
    for key, (tag, contract) in names.items():
        package = aa_package(tag, announce=announce)
        version = AA_VERSIONS[tag]
        data = json.loads((package / "artifacts" / f"{contract}.json").read_text())
        found[key] = Artifact(
            name=contract,
            source=f"npm:{AA_PACKAGE}@{version}",
            abi=data["abi"],
            bytecode=bytes.fromhex(data["bytecode"].removeprefix("0x")),
            deployed_bytecode=bytes.fromhex(data.get("deployedBytecode", "0x").removeprefix("0x")),
        )
    return found
