"""@solana/kit with @solana-program/system and @solana-program/token (npm, pinned), run with
Node: a Solana client nobody here wrote.

Installed once into chaingate's npm cache (``chaingate.devnet.npm``), like viem in
``tests/node_clients.py``; a script from ``tests/node/`` runs from a directory whose
``node_modules`` is that install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaingate.devnet.npm import npm_install
from tests.node_clients import run_script

KIT = "8.4.0"
TOKEN = "0.16.1"  # @solana-program/token: SPL Token and Associated Token Account instructions
SYSTEM = "0.14.1"  # @solana-program/system: transfers and account creation


def kit_modules() -> Path:
    root = npm_install(
        f"node-clients-solana-kit{KIT}-token{TOKEN}-system{SYSTEM}",
        [
            f"@solana/kit@{KIT}",
            f"@solana-program/token@{TOKEN}",
            f"@solana-program/system@{SYSTEM}",
        ],
        "node_modules/@solana-program/token/package.json",
        what=f"@solana/kit {KIT}, @solana-program/token {TOKEN}, @solana-program/system {SYSTEM}",
        announce=lambda _: None,
    )
    return root / "node_modules"


def run_kit(name: str, args: list[str], workdir: Path, timeout: float = 120) -> Any:
    """Run ``tests/node/<name>`` with kit's install; its last stdout line, parsed as JSON."""
    return run_script(name, args, workdir, timeout, modules=kit_modules())
