"""The demo contracts (``contracts/*.sol``), compiled offline by the pinned solc-js from npm.

solc-js is the official compiler built to WebAssembly: one npm package, no native toolchain,
the same output on every machine.  Compiled output is cached under the devnet cache directory,
keyed by the compiler version, the settings and the sources' hash, so only a changed source
pays the compile (~10 s of CPU).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chaingate.devnet.artifacts import Artifact
from chaingate.devnet.npm import npm_install

SOLC_VERSION = "0.8.28"
# Fixed so the bytecode (and with it every CREATE2 address) is the same on every machine.
SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 200},
    "evmVersion": "cancun",
    "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object"]}},
}

# Reads standard JSON on stdin, writes solc's standard JSON answer on stdout.
_COMPILE_JS = """
const solc = require(process.argv[1]);
let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => { process.stdout.write(solc.compile(input)); });
"""


def devnet_sources() -> dict[str, str]:
    """The shipped ``*.sol`` sources by file name."""
    folder = importlib.resources.files("chaingate.devnet") / "contracts"
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".sol")
    }


def solc_package(announce: Callable[[str], None] = print) -> Path:
    target = npm_install(
        f"solc-{SOLC_VERSION}",
        [f"solc@{SOLC_VERSION}"],
        "node_modules/solc/soljson.js",
        what=f"solc {SOLC_VERSION} (solc-js, ~9 MB)",
        announce=announce,
    )
    return target / "node_modules" / "solc"


def _settings(deployed: bool) -> dict[str, Any]:
    """SETTINGS, asking for the runtime code too when ``deployed`` (for state overrides)."""
    if not deployed:
        return SETTINGS
    wanted = ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]
    return {**SETTINGS, "outputSelection": {"*": {"*": wanted}}}


def _run_solc(
    sources: Mapping[str, str], announce: Callable[[str], None], settings: dict[str, Any]
) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is needed to compile the devnet contracts: install Node.js 20+")
    package = solc_package(announce)
    # ~10 s of CPU (more on a busy machine) that would otherwise pass in silence: say so.
    announce(
        f"devnet: compiling the demo contracts ({len(sources)} sources) with solc-js "
        f"{SOLC_VERSION}; once, then cached..."
    )
    started = time.monotonic()
    request = {
        "language": "Solidity",
        "sources": {name: {"content": text} for name, text in sources.items()},
        "settings": settings,
    }
    done = subprocess.run(
        [node, "-e", _COMPILE_JS, str(package)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"solc-js failed: {done.stderr.strip()[-2000:]}")
    output: dict[str, Any] = json.loads(done.stdout)
    errors = [e for e in output.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise RuntimeError("solc: " + "\n".join(e["formattedMessage"] for e in errors))
    announce(f"devnet: compiled in {time.monotonic() - started:.1f}s")
    return output


def compile_sources(
    sources: Mapping[str, str],
    cache_dir: Path,
    *,
    announce: Callable[[str], None] = print,
    deployed: bool = False,
) -> dict[str, Artifact]:
    """Deployable contracts (non-empty bytecode) by contract name, from cache when possible;
    ``deployed``: with their runtime code too."""
    settings = _settings(deployed)
    key_material = json.dumps([SOLC_VERSION, settings, sorted(sources.items())], sort_keys=True)
    key = hashlib.sha256(key_material.encode()).hexdigest()[:20]
    cache_file = cache_dir / f"solc-{SOLC_VERSION}-{key}.json"
    try:
        output = json.loads(cache_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        output = _run_solc(sources, announce, settings)
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=cache_dir, prefix=".solc-")
        with os.fdopen(fd, "w") as handle:
            json.dump(output, handle)
        os.replace(staging, cache_file)
    artifacts: dict[str, Artifact] = {}
    for file_name, contracts in output["contracts"].items():
        for name, compiled in contracts.items():
            bytecode = bytes.fromhex(compiled["evm"]["bytecode"]["object"])
            runtime = compiled["evm"].get("deployedBytecode", {}).get("object", "")
            if bytecode:  # interfaces compile to nothing
                artifacts[name] = Artifact(
                    name=name,
                    source=f"chaingate:{file_name} (solc {SOLC_VERSION})",
                    abi=compiled["abi"],
                    bytecode=bytecode,
                    deployed_bytecode=bytes.fromhex(runtime),
                )
    return artifacts
