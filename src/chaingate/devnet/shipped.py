"""The contract code chaingate ships, rebuilt from the pinned npm packages and compared.

``chaingate serve`` reads EntryPoint simulation code from the package, never from npm:

* ``chaingate/bundler/artifacts/EntryPointSimulations-v07.json`` and ``-v08.json``: the
  ``deployedBytecode`` of ``@account-abstraction/contracts`` 0.7.0's and 0.8.0's
  EntryPointSimulations (``devnet.artifacts``);
* ``chaingate/simulation/artifacts/EntryPointSimulations-v06.json``: v0.6's EntryPoint from
  ``@account-abstraction/contracts@0.6.0``'s source, compiled by the pinned solc with two
  changes that let it stand at the EntryPoint's address in a state override, as v0.7's
  EntryPointSimulations does: ``simulateHandleOp`` *returns* its result (v0.7's
  ``ExecutionResult`` shape) instead of reverting with it, so the operation's logs survive the
  simulation; and the SenderCreator is the one the real EntryPoint created (its first CREATE)
  instead of an immutable the override could not carry.

    python -m chaingate.devnet.shipped          # check the committed files are identical
    python -m chaingate.devnet.shipped --write  # rewrite them (after a pin moves)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from chaingate.aa.userop import MANIFEST_TAG
from chaingate.bundler.simulation import SIMULATIONS
from chaingate.devnet.artifacts import (
    AA_PACKAGE,
    AA_VERSIONS,
    aa_artifacts,
    aa_package,
    aa_sources,
)
from chaingate.devnet.npm import cache_root, npm_install
from chaingate.devnet.solc import SOLC_VERSION, compile_sources
from chaingate.simulation.userops import SIMULATIONS_V06

# What aa 0.6.0's EntryPoint was written against (the package declares no dependency).
OPENZEPPELIN_V4 = "4.9.6"
_ENTRY_POINT = f"{AA_PACKAGE}/core/EntryPoint.sol"

# The two changes to aa 0.6.0's core/EntryPoint.sol, each found exactly once.
_SENDER_CREATOR = "    SenderCreator private immutable senderCreator = new SenderCreator();\n"
_SENDER_CREATOR_NOW = """\
    // chaingate: the SenderCreator the real EntryPoint created in its constructor (its first
    // CREATE), so that this code works at the EntryPoint's address in a state override.
    function senderCreator() internal view returns (SenderCreator) {
        bytes32 created = keccak256(abi.encodePacked(hex"d694", address(this), hex"01"));
        return SenderCreator(address(uint160(uint256(created))));
    }

    // chaingate: simulateHandleOp's answer, returned (v0.7's ExecutionResult shape).
    struct SimulationResult {
        uint256 preOpGas;
        uint256 paid;
        uint256 accountValidationData;
        uint256 paymasterValidationData;
        bool targetSuccess;
        bytes targetResult;
    }
"""
_REVERT = (
    "        revert ExecutionResult(opInfo.preOpGas, paid, data.validAfter, data.validUntil, "
    "targetSuccess, targetResult);\n"
)
_RETURN = """\
        bytes memory result = abi.encode(SimulationResult(
            opInfo.preOpGas, paid, validationData, paymasterValidationData, targetSuccess,
            targetResult));
        assembly { return(add(result, 32), mload(result)) }
"""


def _document(contract: str, source: str, code: bytes) -> bytes:
    document = {
        "contract": contract,
        "source": source,
        "sha256": hashlib.sha256(code).hexdigest(),
        "deployedBytecode": "0x" + code.hex(),
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def expected_npm(tag: str) -> bytes:
    """A v0.7/v0.8 file's bytes as the pinned npm artifact makes them."""
    artifact = aa_artifacts({"sim": (tag, "EntryPointSimulations")}, announce=lambda _: None)["sim"]
    if not artifact.deployed_bytecode:
        raise RuntimeError("the EntryPointSimulations artifact has no deployedBytecode")
    return _document(artifact.name, artifact.source, artifact.deployed_bytecode)


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"aa 0.6.0's EntryPoint.sol no longer has {old.strip()[:60]!r} once")
    return text.replace(old, new)


def patched_v06_sources() -> dict[str, str]:
    """aa 0.6.0's core/EntryPoint.sol, patched, with every file it imports."""
    openzeppelin = npm_install(
        f"openzeppelin-contracts-{OPENZEPPELIN_V4}",
        [f"@openzeppelin/contracts@{OPENZEPPELIN_V4}"],
        "node_modules/@openzeppelin/contracts/package.json",
        what=f"@openzeppelin/contracts {OPENZEPPELIN_V4}",
        announce=lambda _: None,
    )
    entry_point = (aa_package("v06", announce=lambda _: None) / "core/EntryPoint.sol").read_text()
    entry_point = _replace_once(entry_point, _SENDER_CREATOR, _SENDER_CREATOR_NOW)
    for use in ("senderCreator.createSender{", "senderCreator.createSender("):
        entry_point = _replace_once(entry_point, use, use.replace(".", "().", 1))
    entry_point = _replace_once(entry_point, _REVERT, _RETURN)
    return aa_sources(
        {_ENTRY_POINT: entry_point},
        tag="v06",
        openzeppelin=openzeppelin / "node_modules" / "@openzeppelin" / "contracts",
        announce=lambda _: None,
    )


def expected_v06() -> bytes:
    """The v0.6 file's bytes: the patched EntryPoint compiled by the pinned solc."""
    artifacts = compile_sources(
        patched_v06_sources(), cache_root() / "shipped", announce=lambda _: None, deployed=True
    )
    code = artifacts["EntryPoint"].deployed_bytecode
    if not code:
        raise RuntimeError("the patched v0.6 EntryPoint compiled to no runtime code")
    source = (
        f"npm:{AA_PACKAGE}@{AA_VERSIONS['v06']} core/EntryPoint.sol, patched by "
        f"chaingate.devnet.shipped (solc {SOLC_VERSION}, "
        f"@openzeppelin/contracts@{OPENZEPPELIN_V4})"
    )
    return _document("EntryPointSimulations-v06", source, code)


def _npm(tag: str) -> Callable[[], bytes]:
    return lambda: expected_npm(tag)


# Each shipped file: (its package, its path there, what makes it).
SHIPPED: dict[str, tuple[str, str, Callable[[], bytes]]] = {
    **{
        MANIFEST_TAG[version]: ("chaingate.bundler", name, _npm(MANIFEST_TAG[version]))
        for version, name in SIMULATIONS.items()
    },
    "v06": ("chaingate.simulation", SIMULATIONS_V06, expected_v06),
}


def shipped_path(which: str) -> Path:
    package, name, _ = SHIPPED[which]
    return Path(str(resources.files(package) / name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the shipped files")
    args = parser.parse_args(argv)
    differs = 0
    for which, (_, _, build) in SHIPPED.items():
        want, path = build(), shipped_path(which)
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(want)
            print(f"wrote {path}")
        elif not path.is_file() or path.read_bytes() != want:
            print(f"{path} differs from what the pinned packages make (--write)", file=sys.stderr)
            differs += 1
        else:
            print(f"{path} is identical to what the pinned packages make")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
