"""Choose the compiled or the pure-Python twin of every hot-path module.

``CHAINGATE_PURE=1`` forces the pure twins.  Otherwise the compiled modules are required: a
missing build is an ImportError at start-up, not a silent fall-back to the slow path, because a
proxy that quietly runs 5x slower is worse than one that refuses to start.
(``CHAINGATE_PURE=auto`` allows the fall-back for tools that only need correctness.)
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

NATIVE_MODULES = ("http1", "jsonrpc", "limiter", "fastlane", "edgeloop")


@dataclass(frozen=True)
class Impl:
    """One consistent set of framing modules: all compiled or all pure."""

    name: str
    http1: ModuleType
    jsonrpc: ModuleType
    limiter: ModuleType
    fastlane: ModuleType
    edgeloop: ModuleType


def _load(package: str, name: str) -> Impl:
    modules = {mod: importlib.import_module(f"{package}.{mod}") for mod in NATIVE_MODULES}
    return Impl(name=name, **modules)


def pure() -> Impl:
    return _load("chaingate._pure", "pure")


def compiled() -> Impl:
    return _load("chaingate._native", "compiled")


def select(mode: str | None = None) -> Impl:
    """Impl chosen by ``mode`` (default: the CHAINGATE_PURE environment variable)."""
    if mode is None:
        mode = os.environ.get("CHAINGATE_PURE", "")
    mode = mode.strip().lower()
    if mode in ("1", "true", "yes", "pure"):
        return pure()
    if mode == "auto":
        try:
            return compiled()
        except ImportError:
            return pure()
    return compiled()
