"""Keccak-256 as Ethereum uses it (the pre-standard padding, not NIST SHA3-256)."""

from __future__ import annotations

import threading
from typing import Any

from Crypto.Hash import keccak

# Empty input is common (a deployed account's initCode, no paymaster: two of a userOpHash's
# five hashes).
_EMPTY = keccak.new(digest_bits=256).digest()
_CAPACITY, _ROUNDS, _PADDING = 64, 24, 0x01  # Keccak-256: what keccak.new(digest_bits=256) sets

# pycryptodome's own C functions, called straight: through its ``keccak.new(...).digest()``
# one hash cost ~48,000 instructions of Python and cffi object set-up (measured under
# callgrind; the permutation itself is a few thousand), and the bundler hashes ~6 times per
# operation.  One state per thread, reset for each hash (``keccak_digest`` finishes a copy).
# Where the library is not loaded through cffi, the public API.
try:
    from Crypto.Hash.keccak import _raw_keccak_lib as _lib  # type: ignore[attr-defined]
    from Crypto.Util import _raw_api

    _ffi: Any = _raw_api.ffi if _raw_api.backend == "cffi" else None
except (ImportError, AttributeError):  # pragma: no cover - another pycryptodome build
    _ffi = None
_local = threading.local()


def _new_state() -> tuple[Any, Any, Any]:
    holder = _ffi.new("void **")
    if _lib.keccak_init(holder, _CAPACITY, _ROUNDS):
        raise ValueError("keccak_init failed")
    out = _ffi.new("uint8_t[32]")
    _local.state = found = (_ffi.gc(holder[0], _lib.keccak_destroy), out, _ffi.buffer(out))
    return found


def _raw_keccak256(data: bytes) -> bytes:
    try:
        state, out, view = _local.state
    except AttributeError:
        state, out, view = _new_state()
    if (
        _lib.keccak_reset(state)
        or _lib.keccak_absorb(state, _ffi.from_buffer(data), len(data))
        or _lib.keccak_digest(state, out, 32, _PADDING)
    ):
        raise ValueError("keccak failed")
    return bytes(view)


def _api_keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def _raw_agrees() -> bool:
    """The private functions checked once against the public API on a known input: a
    pycryptodome whose C functions changed meaning falls back instead of hashing wrong."""
    probe = bytes(range(200))
    try:
        return _raw_keccak256(probe) == _api_keccak256(probe)
    except Exception:  # any failure of the private path means: not usable
        return False


_hash = _raw_keccak256 if _ffi is not None and _raw_agrees() else _api_keccak256


def keccak256(data: bytes) -> bytes:
    if not data:
        return _EMPTY
    return _hash(data)
