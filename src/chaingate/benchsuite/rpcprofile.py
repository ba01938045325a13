"""The RPC read mix: a TOML profile (``profiles/rpc.toml`` by default, ``profiles/solana.toml``
for a Solana network, or a user's file)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

KINDS = (
    "eth_blockNumber",
    "eth_chainId",
    "eth_getBalance",
    "eth_call",
    "eth_getTransactionReceipt",
    "eth_getBlockByNumber",
    "eth_getLogs",
)
# The Solana profile's kinds (``family = "solana"``), drawn by solsample.
SOLANA_KINDS = (
    "getSlot",
    "getLatestBlockhash",
    "getBalance",
    "getAccountInfo",
    "getMultipleAccounts",
    "getBlock",
    "getTransaction",
    "getSignatureStatuses",
)
FAMILY_KINDS = {"evm": KINDS, "solana": SOLANA_KINDS}
BATCH = "batch"
MAX_BATCH = 1000


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    name: str
    mix: dict[str, float]  # kind (or "batch") -> weight
    batch_size: int
    logs_range: int
    sample_blocks: int
    lag: int
    family: str = "evm"  # the chain's JSON-RPC dialect: evm or solana


def load(name_or_path: str) -> Profile:
    """A shipped profile by name (``rpc``), or a TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileError(f"profile {path}: {exc.strerror}") from None
    else:
        try:
            shipped = resources.files("chaingate.benchsuite") / "profiles" / f"{name_or_path}.toml"
            text = shipped.read_text()
        except (FileNotFoundError, OSError):
            raise ProfileError(
                f"no shipped profile {name_or_path!r} (try rpc, or solana)"
            ) from None
    try:
        return parse(name_or_path, tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {name_or_path}: {exc}") from None


def _positive_int(data: dict[str, Any], section: str, key: str, default: int, high: int) -> int:
    value = data.get(section, {}).get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= high:
        raise ProfileError(f"[{section}] {key}: an integer from 1 to {high}")
    return value


def parse(name: str, data: dict[str, Any]) -> Profile:
    family = data.get("family", "evm")
    if family not in FAMILY_KINDS:
        raise ProfileError(f"family = {family!r}: one of {', '.join(FAMILY_KINDS)}")
    kinds = FAMILY_KINDS[family]
    mix = data.get("mix")
    if not isinstance(mix, dict) or not mix:
        raise ProfileError(f"profile {name}: a [mix] table of weights is needed")
    for kind, weight in mix.items():
        if kind not in (*kinds, BATCH):
            raise ProfileError(
                f"[mix] {kind}: unknown for family {family}; known: {', '.join((*kinds, BATCH))}"
            )
        if not isinstance(weight, int | float) or isinstance(weight, bool) or weight < 0:
            raise ProfileError(f"[mix] {kind}: a weight >= 0")
    if not any(mix.values()):
        raise ProfileError(f"profile {name}: every weight is 0")
    lag = data.get("sample", {}).get("lag", 2)
    if not isinstance(lag, int) or isinstance(lag, bool) or not 0 <= lag <= 1000:
        raise ProfileError("[sample] lag: an integer from 0 to 1000")
    return Profile(
        name=name,
        mix={k: float(v) for k, v in mix.items() if v},
        batch_size=_positive_int(data, "batch", "size", 10, MAX_BATCH),
        logs_range=_positive_int(data, "getLogs", "range", 10, 10_000),
        sample_blocks=_positive_int(data, "sample", "blocks", 32, 1000),
        lag=lag,
        family=family,
    )
