"""Choose the compiled or the pure-Python twin of every hot-path module.

``CHAINGATE_PURE=1`` forces the pure twins.  Otherwise the compiled modules are required: a
missing build is an ImportError at start-up, not a silent fall-back to the slow path, because a
proxy that quietly runs 5x slower is worse than one that refuses to start.
(``CHAINGATE_PURE=auto`` allows the fall-back for tools that only need correctness.)

Both sets are handed out under the module Protocols of ``chaingate.twintypes``, so mypy checks
every caller against one declaration.  Here mypy also checks the pure http1, jsonrpc and
limiter against theirs; tests/test_compiled_stubs.py checks all ten modules at run time (the
compiled ones mypy cannot read, the lane and the loop it cannot fully check, see ``pure``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import cast

from chaingate.twintypes.edgeloop import EdgeloopModule
from chaingate.twintypes.fastlane import FastlaneModule
from chaingate.twintypes.http1 import Http1Module
from chaingate.twintypes.jsonrpc import JsonRpcModule
from chaingate.twintypes.limiter import LimiterModule

NATIVE_MODULES = ("http1", "jsonrpc", "limiter", "fastlane", "edgeloop")


@dataclass(frozen=True)
class Impl:
    """One consistent set of framing modules: all compiled or all pure."""

    name: str
    http1: Http1Module
    jsonrpc: JsonRpcModule
    limiter: LimiterModule
    fastlane: FastlaneModule
    edgeloop: EdgeloopModule


def pure() -> Impl:
    from chaingate._pure import edgeloop, fastlane, http1, jsonrpc, limiter

    # The lane's and the loop's classes take each other's objects back (``Route.land`` the
    # route's own flights, ``Loop.close`` its own connections): a Protocol cannot say "this
    # module's class", so those two are cast; tests/test_compiled_stubs.py checks them.
    return Impl(
        "pure",
        http1,
        jsonrpc,
        limiter,
        cast(FastlaneModule, fastlane),
        cast(EdgeloopModule, edgeloop),
    )


def compiled() -> Impl:
    import chaingate._native.edgeloop as edgeloop
    import chaingate._native.fastlane as fastlane
    import chaingate._native.http1 as http1
    import chaingate._native.jsonrpc as jsonrpc
    import chaingate._native.limiter as limiter

    return Impl("compiled", http1, jsonrpc, limiter, fastlane, edgeloop)


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
