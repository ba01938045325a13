"""The devnet's manifest is the contract manifest of configuration (``chaingate.config.manifest``);
this name stays for the devnet's own modules and older callers."""

from chaingate.config.manifest import (
    SCHEMA,
    Contract,
    Kind,
    Manifest,
    ManifestError,
    dumps,
    load_manifest,
    loads,
    save_manifest,
)

__all__ = [
    "SCHEMA",
    "Contract",
    "Kind",
    "Manifest",
    "ManifestError",
    "dumps",
    "load_manifest",
    "loads",
    "save_manifest",
]
