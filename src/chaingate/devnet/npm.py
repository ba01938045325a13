"""Pinned npm packages installed into chaingate's cache directory, once, under a lock.

anvil, solc-js and the ERC-4337 contract artifacts all come from npm: each lands in
``<cache>/<name>/node_modules`` (``CHAINGATE_CACHE_DIR`` moves the cache).  An install goes to a
staging directory first and is renamed into place, so a crashed install never looks finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


def cache_root() -> Path:
    override = os.environ.get("CHAINGATE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "chaingate"


@contextlib.contextmanager
def install_lock(root: Path, name: str) -> Iterator[None]:
    """Exclusive lock for installing ``name`` (other processes wait, then reuse it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def npm_install(
    name: str,
    specs: Sequence[str],
    marker: str,
    *,
    what: str,
    install: bool = True,
    announce: Callable[[str], None] = print,
) -> Path:
    """``<cache>/<name>``, holding ``specs`` installed by npm; ``marker`` proves it complete.

    ``marker`` is a path relative to the install directory that exists only after a good
    install (a binary, a package file).  ``what`` describes the download for the announcement.
    """
    root = cache_root()
    target = root / name
    if (target / marker).exists():
        return target
    if not install:
        raise FileNotFoundError(f"{name} is not installed at {target}")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"npm is needed to install {name}: install Node.js 20+ (it brings npm)")
    with install_lock(root, name):
        if (target / marker).exists():  # another process installed it while we waited
            return target
        announce(f"Installing {what} from npm into {target} (first run only)...")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}-staging-"))
        try:
            subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--ignore-scripts",  # artifacts and prebuilt binaries need no install scripts
                    "--prefix",
                    str(staging),
                    *specs,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            if not (staging / marker).exists():
                raise RuntimeError(f"npm installed {', '.join(specs)} but {marker} is missing")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        announce(f"{name} installed.")
    return target
