"""viem and permissionless.js (npm, pinned), run with Node: clients nobody here wrote.

Installed once into chaingate's npm cache (``chaingate.devnet.npm``); a script from
``tests/node/`` runs from a directory whose ``node_modules`` is that install, so its ESM
imports resolve to the pinned versions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from chaingate.devnet.npm import npm_install

VIEM = "2.57.20"
PERMISSIONLESS = "0.4.1"
SCRIPTS = Path(__file__).parent / "node"


def node_modules() -> Path:
    root = npm_install(
        f"node-clients-viem{VIEM}-permissionless{PERMISSIONLESS}",
        [f"viem@{VIEM}", f"permissionless@{PERMISSIONLESS}"],
        "node_modules/permissionless/package.json",
        what=f"viem {VIEM} and permissionless.js {PERMISSIONLESS}",
        announce=lambda _: None,
    )
    return root / "node_modules"


def run_script(
    name: str, args: list[str], workdir: Path, timeout: float = 120, modules: Path | None = None
) -> Any:
    """Run ``tests/node/<name>`` with ``args``; its last stdout line, parsed as JSON.
    ``modules``: another install's ``node_modules`` (default: viem and permissionless.js)."""
    node = shutil.which("node")
    assert node is not None, "Node.js is needed for the Node client tests"
    workdir.mkdir(parents=True, exist_ok=True)
    link = workdir / "node_modules"
    if not link.exists():
        link.symlink_to(modules or node_modules(), target_is_directory=True)
    script = workdir / name
    shutil.copyfile(SCRIPTS / name, script)
    done = subprocess.run(
        [node, str(script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
