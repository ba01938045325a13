"""The method table: scope, compute units, cacheability and retry safety per JSON-RPC method.

Loaded once from ``config/methods.toml`` (see the comments there for each field).  The rules
that read a row — a call's block tag, whether it is valid, its price, whether its answer may be
cached — are the fast lane's (``Route.classify``, ``Method.price``, ``Method.may_be_cached`` in
``_pure/fastlane.py`` and its compiled twin), which the Python handler asks too.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import msgspec

Scope = Literal["rpc:read", "rpc:write"]
CachePolicy = Literal["none", "static", "finalized"]


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    cu: int
    scope: Literal["read", "write"] = "read"
    tcu: int | None = None
    cu_historical: int | None = None
    block: int | None = None
    cache: CachePolicy = "none"
    retry: bool | None = None
    local: bool = False
    testnet_only: bool = False
    broadcast: bool = False
    cu_per_kib: int | None = None
    max_bytes: int | None = None


class MethodSpec(msgspec.Struct, frozen=True):
    name: str
    scope: Scope
    cu: int
    tcu: int
    cu_historical: int | None
    block_param: int | None
    cache: CachePolicy
    retry: bool
    # Answered by chaingate itself (a subsystem registers the handler), never forwarded.
    local: bool = False
    # Served on test networks only (refused with -32601 elsewhere, before admission).
    testnet_only: bool = False
    # A write sent to every healthy upstream at once, answered by the first success.
    broadcast: bool = False
    # Priced by the answer: units added per started KiB of it (admitted at ``cu``).
    cu_per_kib: int | None = None
    # The largest answer relayed for this method (a bigger one: -32005, answer_too_large).
    max_bytes: int | None = None

    @property
    def special(self) -> bool:
        """Rules the RPC service's Python handler applies (the fast lane hands the call over):
        a broadcast, a price by the answer's size, a bound of the method's own."""
        return self.broadcast or self.cu_per_kib is not None or self.max_bytes is not None

    @property
    def is_write(self) -> bool:
        return self.scope == "rpc:write"

    @property
    def coalescible(self) -> bool:
        """Identical concurrent calls may share one upstream call (reads without side effects)."""
        return self.retry and not self.is_write


def _spec(name: str, entry: _Entry) -> MethodSpec:
    is_write = entry.scope == "write"
    if entry.cu < 0 or (entry.tcu is not None and entry.tcu < 0):
        raise ValueError(f"{name}: compute units cannot be negative")
    if entry.local and (entry.cache != "none" or entry.block is not None or is_write):
        raise ValueError(f"{name}: a local method is a read, never cached, with no block param")
    if entry.broadcast and not is_write:
        raise ValueError(f"{name}: only a write is broadcast")
    if (entry.cu_per_kib is not None and entry.cu_per_kib < 0) or (
        entry.max_bytes is not None and entry.max_bytes < 1
    ):
        raise ValueError(f"{name}: cu_per_kib must be >= 0 and max_bytes >= 1")
    if (entry.cu_per_kib is not None or entry.max_bytes is not None) and (
        entry.cache != "none" or entry.local
    ):
        raise ValueError(f"{name}: a method priced or bounded by its answer is never cached")
    return MethodSpec(
        name=name,
        scope="rpc:write" if is_write else "rpc:read",
        cu=entry.cu,
        tcu=entry.cu if entry.tcu is None else entry.tcu,
        cu_historical=entry.cu_historical,
        block_param=entry.block,
        cache=entry.cache,
        retry=(not is_write) if entry.retry is None else (entry.retry and not is_write),
        local=entry.local,
        testnet_only=entry.testnet_only,
        broadcast=entry.broadcast,
        cu_per_kib=entry.cu_per_kib,
        max_bytes=entry.max_bytes,
    )


class MethodTable:
    """Method specs per chain family, plus the spec used for pass-through methods."""

    def __init__(self, families: dict[str, dict[str, MethodSpec]], passthrough: MethodSpec) -> None:
        self._families = families
        self.passthrough = passthrough

    def family(self, name: str) -> dict[str, MethodSpec]:
        return self._families.get(name, {})

    @classmethod
    def load(cls, path: Path) -> MethodTable:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read method table {path}: {exc}") from None
        passthrough_raw = data.pop("passthrough", {"cu": 20, "scope": "write", "retry": False})
        try:
            passthrough = _spec("passthrough", msgspec.convert(passthrough_raw, _Entry))
            families = {
                family: {
                    name: _spec(name, msgspec.convert(raw, _Entry)) for name, raw in methods.items()
                }
                for family, methods in data.items()
            }
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}: {exc}") from None
        return cls(families, passthrough)


def block_number(tag: bytes | None) -> int | None:
    """The block number a raw JSON block tag names (``"0x1b4"`` or a bare integer), else None."""
    if tag is None:
        return None
    if len(tag) > 2 and tag[0] == 0x22 and tag[1:3] == b"0x" and tag[-1] == 0x22:
        try:
            return int(tag[3:-1], 16)
        except ValueError:
            return None
    if tag.isdigit() and len(tag) < 20:
        return int(tag)
    return None
