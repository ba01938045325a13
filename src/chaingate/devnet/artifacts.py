"""Contract artifacts (ABI + creation bytecode) and where they come from.

* ERC-4337 contracts: the audited bytecode published in the pinned npm package
  ``@account-abstraction/contracts`` — 0.6.0, 0.7.0 and 0.8.0 installed side by side as npm
  aliases (``aa-v06``, ``aa-v07``, ``aa-v08``).  That exact bytecode reproduces the mainnet
  addresses through the deterministic deployment proxy, so it is used as shipped, never
  recompiled.  0.8.0 ships no VerifyingPaymaster: chaingate's (``contracts/erc4337/``) is
  compiled by ``solc`` against that package's own sources and a pinned OpenZeppelin.
* chaingate's demo contracts: ``contracts/*.sol`` beside this file, compiled by ``solc``.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import posixpath
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from chaingate.devnet.npm import npm_install

AA_PACKAGE = "@account-abstraction/contracts"
AA_VERSIONS = {"v06": "0.6.0", "v07": "0.7.0", "v08": "0.8.0"}
# What 0.8.0's sources import (the package asks for ^5.1.0): pinned, so chaingate's v0.8
# paymaster compiles to the same bytecode everywhere.
OPENZEPPELIN = ("@openzeppelin/contracts", "5.1.0")
_IMPORT = re.compile(r"""^\s*import\s+(?:[^'"]*?\s+from\s+)?["']([^"']+)["']""", re.MULTILINE)


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
    package, version = OPENZEPPELIN
    return npm_install(
        f"aa-contracts-{versions}-oz{version}",
        [
            *(f"aa-{tag}@npm:{AA_PACKAGE}@{v}" for tag, v in AA_VERSIONS.items()),
            f"{package}@{version}",
        ],
        # One npm run installs all; the rename into place makes any file proof of all.
        "node_modules/aa-v08/artifacts/EntryPoint.json",
        what=f"{AA_PACKAGE} {', '.join(AA_VERSIONS.values())} (~15 MB)",
        announce=announce,
    )


def aa_package(tag: str, *, announce: Callable[[str], None] = print) -> Path:
    """The installed package of a version tag ("v06"), its version checked."""
    package = _aa_install(announce) / "node_modules" / f"aa-{tag}"
    version = json.loads((package / "package.json").read_text())["version"]
    if version != AA_VERSIONS[tag]:  # a stale or hand-edited install must not slip through
        raise RuntimeError(f"{package} holds {AA_PACKAGE} {version}, not {AA_VERSIONS[tag]}")
    return package


def aa_sources(
    own: Mapping[str, str],
    *,
    tag: str = "v08",
    openzeppelin: Path | None = None,
    announce: Callable[[str], None] = print,
) -> dict[str, str]:
    """``own`` sources and every file they import, transitively, by solc source unit name:
    ``@account-abstraction/contracts/...`` from the pinned package of ``tag`` (0.8.0 by
    default), ``@openzeppelin/...`` from the pinned OpenZeppelin or the ``openzeppelin``
    package directory given (relative imports resolved against the importing unit)."""
    root = _aa_install(announce) / "node_modules"
    roots = {
        f"{AA_PACKAGE}/": aa_package(tag, announce=announce),
        f"{OPENZEPPELIN[0]}/": openzeppelin or root / OPENZEPPELIN[0],
    }
    found = dict(own)
    todo = list(own)
    while todo:
        unit = todo.pop()
        for target in _IMPORT.findall(found[unit]):
            if target.startswith("."):
                target = posixpath.normpath(posixpath.join(posixpath.dirname(unit), target))
            if target in found:
                continue
            prefix = next((p for p in roots if target.startswith(p)), None)
            if prefix is None:
                raise RuntimeError(f"{unit} imports {target}, which no pinned package holds")
            found[target] = (roots[prefix] / target[len(prefix) :]).read_text(encoding="utf-8")
            todo.append(target)
    return found


def erc4337_sources() -> dict[str, str]:
    """chaingate's own ERC-4337 contracts (``contracts/erc4337/*.sol``) by file name."""
    folder = importlib.resources.files("chaingate.devnet") / "contracts" / "erc4337"
    return {
        f"erc4337/{entry.name}": entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".sol")
    }


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
