"""The contract code chaingate ships, rebuilt from the pinned npm packages and compared.

``chaingate serve`` reads the v0.7 and v0.8 EntryPointSimulations runtime code from the
package (``chaingate/bundler/artifacts``), never from npm.  Those files are the
``deployedBytecode`` of ``@account-abstraction/contracts`` 0.7.0 and 0.8.0
(``devnet.artifacts``):

    python -m chaingate.devnet.shipped          # check the committed file is identical
    python -m chaingate.devnet.shipped --write  # rewrite it (after a pin moves)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from importlib import resources
from pathlib import Path

from chaingate.aa.userop import MANIFEST_TAG, Version
from chaingate.bundler.simulation import SIMULATIONS
from chaingate.devnet.artifacts import aa_artifacts


def expected(version: Version) -> bytes:
    """The shipped file's bytes as the pinned npm artifact makes them."""
    tag = MANIFEST_TAG[version]
    artifact = aa_artifacts({"sim": (tag, "EntryPointSimulations")}, announce=lambda _: None)["sim"]
    if not artifact.deployed_bytecode:
        raise RuntimeError("the EntryPointSimulations artifact has no deployedBytecode")
    document = {
        "contract": artifact.name,
        "source": artifact.source,
        "sha256": hashlib.sha256(artifact.deployed_bytecode).hexdigest(),
        "deployedBytecode": "0x" + artifact.deployed_bytecode.hex(),
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def shipped_path(version: Version) -> Path:
    return Path(str(resources.files("chaingate.bundler") / SIMULATIONS[version]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the shipped files")
    args = parser.parse_args(argv)
    status = 0
    for version in SIMULATIONS:
        want, path = expected(version), shipped_path(version)
        if args.write:
            path.write_bytes(want)
            print(f"wrote {path}")
        elif not path.exists() or path.read_bytes() != want:
            print(
                f"{path} differs from the pinned npm artifact (run with --write)", file=sys.stderr
            )
            status = 1
        else:
            print(f"{path} is identical to the pinned npm artifact")
    return status


if __name__ == "__main__":
    sys.exit(main())
