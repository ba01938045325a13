"""The contract manifest: a network's contracts by name — the one place addresses live.

Configuration of any network (``NetworkSettings.manifest`` names the file): components read
addresses from it by name (``load_manifest(path).address("entry_point_v07")``) and never
hard-code one.  ``chaingate dev`` writes the devnet's (``chaingate.devnet``) under its data dir.
JSON, schema-versioned, read into typed msgspec Structs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

import msgspec

SCHEMA = 1

Kind = Literal[
    "entry_point",
    "entry_point_simulations",
    "account_factory",
    # The code an EIP-7702 account delegates to (v0.8's Simple7702Account).
    "account_delegate",
    "paymaster",
    "erc20",
    "erc721",
    "erc1155",
    "multicall3",
    "price_feed",
    # Emits token-shaped events without being a token (what an index must not mistake).
    "not_a_token",
]


class Contract(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    address: str  # EIP-55
    kind: Kind
    # True when it sits at its mainnet (canonical) address with the canonical bytecode.
    canonical: bool
    source: str  # the bytecode's origin: an npm package version or a chaingate source file
    block: int  # the block that deployed it: where a log scan for it can start
    # ERC-4337 version ("0.6", "0.7", "0.8"), and the manifest name of the EntryPoint it serves.
    version: str | None = None
    entry_point: str | None = None
    # Tokens: their symbol and decimals, and the manifest name of their USD price feed.
    symbol: str | None = None
    decimals: int | None = None
    price_feed: str | None = None
    # Price feeds: the pair they price, Chainlink style ("ETH / USD").
    pair: str | None = None


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: int
    chain_id: int
    contracts: dict[str, Contract]
    deployer: str  # the account that deployed and owns the demo contracts and paymasters
    paymaster_signer: str  # the VerifyingPaymasters' signer address (never its key)
    accounts: list[str]  # funded accounts that took part in the demo history
    native_price_feed: str  # manifest name of the feed pricing the native currency in USD
    block: int  # the head when the bootstrap finished
    cache_key: str  # digest of everything that shaped this devnet state

    def contract(self, name: str) -> Contract:
        try:
            return self.contracts[name]
        except KeyError:
            known = ", ".join(sorted(self.contracts))
            raise KeyError(f"the devnet manifest has no contract {name!r} (has: {known})") from None

    def address(self, name: str) -> str:
        return self.contract(name).address

    def of_kind(self, kind: Kind) -> dict[str, Contract]:
        return {name: c for name, c in self.contracts.items() if c.kind == kind}


class ManifestError(Exception):
    """A manifest file is missing, unreadable or of another schema."""


def dumps(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def loads(data: bytes | str) -> Manifest:
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"invalid devnet manifest: {exc}") from None
    if manifest.schema != SCHEMA:
        raise ManifestError(f"devnet manifest schema {manifest.schema}, expected {SCHEMA}")
    return manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read the manifest a network's settings name (``NetworkSettings.manifest``)."""
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read devnet manifest {path}: {exc.strerror}") from None
    return loads(data)


def save_manifest(manifest: Manifest, path: str | Path) -> Path:
    """Write atomically: a reader never sees half a manifest."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(dumps(manifest))
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return target
