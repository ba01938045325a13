"""IPFS content identifiers: is this string a CID? (sans-IO)

Checked by decoding, not by shape alone, so only a real CID reaches a gateway URL:
CIDv0 (base58btc of a sha2-256 multihash, ``Qm…``) and CIDv1 in the multibases gateways
accept — base32 (``b``/``B``), base58btc (``z``), base16 (``f``/``F``), base36 (``k``/``K``) —
whose bytes are ``varint(1) varint(codec) varint(hash code) varint(length) digest``.
"""

from __future__ import annotations

import base64
import binascii

MAX_CID_CHARS = 200
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58)}
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base58(text: str) -> bytes | None:
    value = 0
    for c in text:
        digit = _B58_INDEX.get(c)
        if digit is None:
            return None
        value = value * 58 + digit
    zeros = len(text) - len(text.lstrip("1"))
    body = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return b"\x00" * zeros + body


def _base36(text: str) -> bytes | None:
    if not text or any(c not in _B36 for c in text):
        return None
    value = int(text, 36)
    zeros = len(text) - len(text.lstrip("0"))
    body = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return b"\x00" * zeros + body


def _base32(text: str) -> bytes | None:
    if not text or text.upper() != text:
        return None
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        return None


def _multibase(text: str) -> bytes | None:
    prefix, body = text[:1], text[1:]
    if prefix == "b":
        return _base32(body.upper()) if body == body.lower() else None
    if prefix == "B":
        return _base32(body)
    if prefix == "z":
        return _base58(body)
    if prefix in ("f", "F"):
        if (body.lower() if prefix == "f" else body.upper()) != body:
            return None
        try:
            return bytes.fromhex(body)
        except ValueError:
            return None
    if prefix == "k":
        return _base36(body)
    if prefix == "K":
        return _base36(body.lower()) if body == body.upper() else None
    return None


def _varint(data: bytes, at: int) -> tuple[int, int] | None:
    value = shift = 0
    for i in range(at, min(len(data), at + 9)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    return None


def _multihash_fits(data: bytes, at: int) -> bool:
    code = _varint(data, at)
    if code is None:
        return False
    length = _varint(data, code[1])
    if length is None:
        return False
    return 0 < length[0] <= 64 and length[1] + length[0] == len(data)


def is_cid(text: str) -> bool:
    if not 2 < len(text) <= MAX_CID_CHARS or not text.isascii():
        return False
    if len(text) == 46 and text.startswith("Qm"):
        raw = _base58(text)
        return raw is not None and len(raw) == 34 and raw[:2] == b"\x12\x20"
    raw = _multibase(text)
    if raw is None:
        return False
    version = _varint(raw, 0)
    if version is None or version[0] != 1:
        return False
    codec = _varint(raw, version[1])
    return codec is not None and _multihash_fits(raw, codec[1])
