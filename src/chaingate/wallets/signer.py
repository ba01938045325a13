"""The paymaster signer key, from ``[paymaster]``: given inline (through
CHAINGATE_PAYMASTER__KEY, never the file) or as a key file.  Never logged: ``PrivateKey``
shows only its address."""

from __future__ import annotations

from pathlib import Path

from chaingate.config import ConfigError, Settings
from chaingate.evm.keys import PrivateKey


def paymaster_signer(settings: Settings) -> PrivateKey | None:
    given = settings.paymaster
    if given.key and given.key_file:
        raise ConfigError("paymaster: give key or key_file, not both")
    try:
        if given.key:
            return PrivateKey.from_hex(given.key)
        if given.key_file:
            return PrivateKey.from_hex(Path(given.key_file).expanduser().read_text())
    except OSError as exc:
        raise ConfigError(f"paymaster.key_file: cannot read it ({exc.strerror})") from None
    except ValueError:
        raise ConfigError("paymaster: the key is not a 0x-hex secp256k1 private key") from None
    return None
