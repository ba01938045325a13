"""Solana's wire encodings: base58, account data (base58/base64/base64+zstd/jsonParsed for
SPL Token) and the ``json`` form of a transaction, shaped as a validator shapes them."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import zstandard
from solders.account import Account
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction

_ALPHABET = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
# A validator refuses base58 account data above this many bytes (slow to encode).
MAX_BASE58_BYTES = 128
SYSTEM_PROGRAM = Pubkey.from_string("11111111111111111111111111111111")
TOKEN_PROGRAM = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
TOKEN_2022_PROGRAM = Pubkey.from_string("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb")
TOKEN_PROGRAMS = (TOKEN_PROGRAM, TOKEN_2022_PROGRAM)
TOKEN_ACCOUNT_SIZE = 165
MINT_SIZE = 82
# Token-2022 pads a mint to an account's size and says which it is in the byte after.
ACCOUNT_TYPE_OFFSET = TOKEN_ACCOUNT_SIZE
MINT_TYPE, ACCOUNT_TYPE = 1, 2
# An account that can never owe rent says so with u64::MAX.
RENT_EXEMPT_EPOCH = 2**64 - 1


class EncodingError(ValueError):
    """Client input that does not decode."""


def b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = bytearray()
    while number:
        number, digit = divmod(number, 58)
        out.append(_ALPHABET[digit])
    pad = len(data) - len(data.lstrip(b"\0"))
    return (b"1" * pad + bytes(reversed(out))).decode()


def b58decode(text: str) -> bytes:
    number = 0
    for char in text.encode():
        digit = _INDEX.get(char)
        if digit is None:
            raise EncodingError("invalid base58")
        number = number * 58 + digit
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    pad = len(text) - len(text.lstrip("1"))
    return b"\0" * pad + body


def decode_bytes(text: str, encoding: str) -> bytes:
    try:
        if encoding == "base58":
            return b58decode(text)
        if encoding == "base64":
            return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise EncodingError(str(exc)) from exc
    raise EncodingError(f"unsupported encoding: {encoding}")


def encode_data(data: bytes, encoding: str) -> str | list[str]:
    """An account's ``data`` field in ``encoding`` (jsonParsed is the caller's)."""
    if encoding in ("base58", "binary"):
        if len(data) > MAX_BASE58_BYTES:
            raise EncodingError(
                "Encoded binary (base 58) data should be less than 128 bytes, "
                "please use Base64 encoding."
            )
        # "binary", the default where no encoding is asked for: a bare string (legacy form).
        return b58encode(data) if encoding == "binary" else [b58encode(data), "base58"]
    if encoding == "base64":
        return [base64.b64encode(data).decode(), "base64"]
    if encoding == "base64+zstd":
        packed = zstandard.ZstdCompressor().compress(data)
        return [base64.b64encode(packed).decode(), "base64+zstd"]
    raise EncodingError(f"unsupported encoding: {encoding}")


def ui_account(
    account: Account,
    encoding: str,
    data_slice: tuple[int, int] | None = None,
    mint_decimals: dict[Pubkey, int] | None = None,
) -> dict[str, Any]:
    raw = bytes(account.data)
    data: object
    parsed = None
    if encoding == "jsonParsed":
        parsed = parse_token(account, mint_decimals or {})
    if parsed is not None:
        data = parsed
    else:
        if data_slice is not None:
            offset, length = data_slice
            raw = raw[offset : offset + length]
        data = encode_data(raw, "base64" if encoding in ("jsonParsed", "json") else encoding)
    return {
        "data": data,
        "executable": account.executable,
        "lamports": account.lamports,
        "owner": str(account.owner),
        "rentEpoch": RENT_EXEMPT_EPOCH,
        "space": len(account.data),
    }


def _coption_key(data: bytes, at: int) -> str | None:
    tag = int.from_bytes(data[at : at + 4], "little")
    return str(Pubkey.from_bytes(data[at + 4 : at + 36])) if tag else None


def token_amount(amount: int, decimals: int) -> dict[str, Any]:
    ui = amount / 10**decimals
    text = str(amount).rjust(decimals + 1, "0")
    ui_string = (
        f"{text[:-decimals]}.{text[-decimals:]}".rstrip("0").rstrip(".") if decimals else text
    )
    return {
        "amount": str(amount),
        "decimals": decimals,
        "uiAmount": ui,
        "uiAmountString": ui_string,
    }


def parse_mint(data: bytes) -> dict[str, Any]:
    return {
        "mintAuthority": _coption_key(data, 0),
        "supply": str(int.from_bytes(data[36:44], "little")),
        "decimals": data[44],
        "isInitialized": bool(data[45]),
        "freezeAuthority": _coption_key(data, 46),
    }


_STATES = {0: "uninitialized", 1: "initialized", 2: "frozen"}


def parse_token_account(data: bytes, decimals: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "isNative": bool(int.from_bytes(data[109:113], "little")),
        "mint": str(Pubkey.from_bytes(data[0:32])),
        "owner": str(Pubkey.from_bytes(data[32:64])),
        "state": _STATES.get(data[108], "uninitialized"),
        "tokenAmount": token_amount(int.from_bytes(data[64:72], "little"), decimals),
    }
    delegate = _coption_key(data, 72)
    if delegate is not None:
        info["delegate"] = delegate
        info["delegatedAmount"] = token_amount(int.from_bytes(data[121:129], "little"), decimals)
    return info


def is_token_account_data(data: bytes) -> bool:
    size = len(data)
    return size == TOKEN_ACCOUNT_SIZE or (
        size > TOKEN_ACCOUNT_SIZE and data[ACCOUNT_TYPE_OFFSET] == ACCOUNT_TYPE
    )


def token_kind(account: Account) -> str | None:
    """ "mint", "account" (a token account) or None, for SPL Token and Token-2022 alike."""
    if account.owner not in TOKEN_PROGRAMS:
        return None
    size = len(account.data)
    if size == MINT_SIZE:
        return "mint"
    if size == TOKEN_ACCOUNT_SIZE:
        return "account"
    if size > TOKEN_ACCOUNT_SIZE:
        kind = bytes(account.data)[ACCOUNT_TYPE_OFFSET]
        return {MINT_TYPE: "mint", ACCOUNT_TYPE: "account"}.get(kind)
    return None


def parse_token(account: Account, mint_decimals: dict[Pubkey, int]) -> dict[str, Any] | None:
    """SPL Token's jsonParsed form of a mint or token account; None for anything else."""
    kind = token_kind(account)
    data = bytes(account.data)
    program = "spl-token" if account.owner == TOKEN_PROGRAM else "spl-token-2022"
    if kind == "mint":
        parsed = {"info": parse_mint(data), "type": "mint"}
    elif kind == "account":
        decimals = mint_decimals.get(Pubkey.from_bytes(data[0:32]))
        if decimals is None:
            return None
        parsed = {"info": parse_token_account(data, decimals), "type": "account"}
    else:
        return None
    return {"parsed": parsed, "program": program, "space": len(data)}


def account_keys(tx: VersionedTransaction) -> list[Pubkey]:
    return list(tx.message.account_keys)


def is_writable(tx: VersionedTransaction, index: int) -> bool:
    header = tx.message.header
    keys = len(tx.message.account_keys)
    signed = header.num_required_signatures
    if index < signed:
        return index < signed - header.num_readonly_signed_accounts
    return index < keys - header.num_readonly_unsigned_accounts


def version_of(tx: VersionedTransaction) -> str | int:
    return 0 if isinstance(tx.message, MessageV0) else "legacy"


def ui_transaction(tx: VersionedTransaction, encoding: str) -> Any:
    """A transaction as getTransaction/getBlock return it: ``json``, base58 or base64."""
    if encoding in ("base64", "base58"):
        raw = bytes(tx)
        return [
            b58encode(raw) if encoding == "base58" else base64.b64encode(raw).decode(),
            encoding,
        ]
    if encoding == "jsonParsed":
        return _ui_parsed(tx)
    message = tx.message
    header = message.header
    ui_message: dict[str, Any] = {
        "accountKeys": [str(key) for key in message.account_keys],
        "header": {
            "numReadonlySignedAccounts": header.num_readonly_signed_accounts,
            "numReadonlyUnsignedAccounts": header.num_readonly_unsigned_accounts,
            "numRequiredSignatures": header.num_required_signatures,
        },
        "instructions": [
            {
                "accounts": list(ix.accounts),
                "data": b58encode(bytes(ix.data)),
                "programIdIndex": ix.program_id_index,
                "stackHeight": None,
            }
            for ix in message.instructions
        ],
        "recentBlockhash": str(message.recent_blockhash),
    }
    if isinstance(message, MessageV0):
        ui_message["addressTableLookups"] = _lookups(message)
    return {"message": ui_message, "signatures": [str(sig) for sig in tx.signatures]}


def token_balances(
    accounts: list[Account | None], decimals_of: Callable[[Pubkey], int | None]
) -> list[dict[str, Any]]:
    """A transaction's ``preTokenBalances``/``postTokenBalances``: its token accounts, by index."""
    found = []
    for index, account in enumerate(accounts):
        if account is None or token_kind(account) != "account":
            continue
        data = bytes(account.data)
        mint = Pubkey.from_bytes(data[0:32])
        decimals = decimals_of(mint)
        if decimals is None:
            continue
        amount = int.from_bytes(data[64:72], "little")
        found.append(
            {
                "accountIndex": index,
                "mint": str(mint),
                "owner": str(Pubkey.from_bytes(data[32:64])),
                "programId": str(account.owner),
                "uiTokenAmount": token_amount(amount, decimals),
            }
        )
    return found


def _ui_parsed(tx: VersionedTransaction) -> dict[str, Any]:
    """jsonParsed, partially decoded: account keys with their roles, every instruction with
    its accounts named (a validator goes on to parse the instructions of programs it knows)."""
    message = tx.message
    keys = [str(key) for key in message.account_keys]
    signers = message.header.num_required_signatures
    account_keys = [
        {
            "pubkey": key,
            "signer": index < signers,
            "source": "transaction",
            "writable": is_writable(tx, index),
        }
        for index, key in enumerate(keys)
    ]
    instructions = [
        {
            "accounts": [keys[i] for i in ix.accounts],
            "data": b58encode(bytes(ix.data)),
            "programId": keys[ix.program_id_index],
            "stackHeight": None,
        }
        for ix in message.instructions
    ]
    ui_message: dict[str, Any] = {
        "accountKeys": account_keys,
        "instructions": instructions,
        "recentBlockhash": str(message.recent_blockhash),
    }
    if isinstance(message, MessageV0):
        ui_message["addressTableLookups"] = _lookups(message)
    return {"message": ui_message, "signatures": [str(sig) for sig in tx.signatures]}


def _lookups(message: MessageV0) -> list[dict[str, Any]]:
    return [
        {
            "accountKey": str(lookup.account_key),
            "readonlyIndexes": list(lookup.readonly_indexes),
            "writableIndexes": list(lookup.writable_indexes),
        }
        for lookup in message.address_table_lookups
    ]
