"""The account methods: balances, accounts by key or program, SPL Token reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solders.account import Account
from solders.pubkey import Pubkey

from chaingate.devnet.solana import codec
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.params import (
    arg,
    commitment,
    config,
    invalid,
    pubkey,
    with_context,
)

MAX_MULTIPLE_ACCOUNTS = 100
ENCODINGS = ("binary", "base58", "base64", "base64+zstd", "jsonParsed")
# Where a validator still defaults to the legacy "binary" (a bare base58 string).
LEGACY_DEFAULT = "binary"


def _encoding(cfg: dict[str, Any], default: str = "base64") -> str:
    encoding = cfg.get("encoding", default)
    if encoding not in ENCODINGS:
        raise invalid(f"Invalid params: unsupported encoding {encoding!r}")
    return str(encoding)


def _data_slice(cfg: dict[str, Any]) -> tuple[int, int] | None:
    window = cfg.get("dataSlice")
    if window is None:
        return None
    if not isinstance(window, dict):
        raise invalid("Invalid params: dataSlice wants integer offset and length")
    offset, length = window.get("offset"), window.get("length")
    if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
        raise invalid("Invalid params: dataSlice wants integer offset and length")
    return offset, length


def _decimals(ledger: Ledger, slot: int, accounts: list[Account]) -> dict[Pubkey, int]:
    """The decimals of the mints ``accounts`` (token accounts) name, for jsonParsed."""
    found: dict[Pubkey, int] = {}
    for account in accounts:
        data = bytes(account.data)
        if codec.token_kind(account) == "account":
            mint = Pubkey.from_bytes(data[0:32])
            if mint not in found:
                mint_account = ledger.account(mint, slot)
                if mint_account is not None and codec.token_kind(mint_account) == "mint":
                    found[mint] = bytes(mint_account.data)[44]
    return found


def _ui(
    ledger: Ledger, slot: int, accounts: list[Account | None], cfg: dict[str, Any]
) -> list[dict[str, Any] | None]:
    encoding = _encoding(cfg)
    window = _data_slice(cfg)
    present = [account for account in accounts if account is not None]
    decimals = _decimals(ledger, slot, present) if encoding == "jsonParsed" else {}
    try:
        return [
            None if account is None else codec.ui_account(account, encoding, window, decimals)
            for account in accounts
        ]
    except codec.EncodingError as exc:
        raise invalid(str(exc)) from None


def get_balance(ledger: Ledger, params: list[Any]) -> object:
    key = pubkey(arg(params, 0, str, name="pubkey"))
    slot = commitment(ledger, config(params, 1))
    account = ledger.account(key, slot)
    return with_context(slot, account.lamports if account else 0)


def get_account_info(ledger: Ledger, params: list[Any]) -> object:
    key = pubkey(arg(params, 0, str, name="pubkey"))
    cfg = config(params, 1)
    cfg.setdefault("encoding", LEGACY_DEFAULT)
    slot = commitment(ledger, cfg)
    return with_context(slot, _ui(ledger, slot, [ledger.account(key, slot)], cfg)[0])


def get_multiple_accounts(ledger: Ledger, params: list[Any]) -> object:
    keys = [pubkey(text) for text in arg(params, 0, list, name="pubkeys")]
    if len(keys) > MAX_MULTIPLE_ACCOUNTS:
        raise invalid(f"Too many inputs provided; max {MAX_MULTIPLE_ACCOUNTS}")
    cfg = config(params, 1)
    slot = commitment(ledger, cfg)
    return with_context(slot, _ui(ledger, slot, [ledger.account(k, slot) for k in keys], cfg))


def account_filter(spec: object) -> Callable[[bytes], bool]:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise invalid("Invalid params: a filter is {dataSize} or {memcmp}")
    if "dataSize" in spec:
        size = spec["dataSize"]
        if not isinstance(size, int):
            raise invalid("Invalid params: dataSize must be an integer")
        return lambda data: len(data) == size
    memcmp = spec.get("memcmp")
    if not isinstance(memcmp, dict) or not isinstance(memcmp.get("offset"), int):
        raise invalid("Invalid params: memcmp wants an offset and bytes")
    offset = memcmp["offset"]
    try:
        wanted = codec.decode_bytes(str(memcmp.get("bytes", "")), memcmp.get("encoding", "base58"))
    except codec.EncodingError as exc:
        raise invalid(f"Invalid params: memcmp bytes: {exc}") from None
    if len(wanted) > 128:
        raise invalid("Invalid param: memcmp bytes above 128 bytes")
    return lambda data: data[offset : offset + len(wanted)] == wanted


def program_accounts(
    ledger: Ledger, program: Pubkey, slot: int, filters: list[Callable[[bytes], bool]]
) -> list[tuple[Pubkey, Account]]:
    return [
        (key, account)
        for key, account in ledger.program_accounts(program, slot)
        if all(test(bytes(account.data)) for test in filters)
    ]


def _keyed(
    ledger: Ledger, slot: int, found: list[tuple[Pubkey, Account]], cfg: dict[str, Any]
) -> list[dict[str, Any]]:
    shown = _ui(ledger, slot, [account for _, account in found], cfg)
    return [{"account": ui, "pubkey": str(key)} for (key, _), ui in zip(found, shown, strict=True)]


def get_program_accounts(ledger: Ledger, params: list[Any]) -> object:
    program = pubkey(arg(params, 0, str, name="program id"), "program id")
    cfg = config(params, 1)
    cfg.setdefault("encoding", LEGACY_DEFAULT)
    slot = commitment(ledger, cfg)
    filters = cfg.get("filters") or []
    if not isinstance(filters, list) or len(filters) > 4:
        raise invalid("Too many filters provided; max 4")
    found = program_accounts(ledger, program, slot, [account_filter(spec) for spec in filters])
    value = _keyed(ledger, slot, found, cfg)
    return with_context(slot, value) if cfg.get("withContext") else value


def get_token_accounts_by_owner(ledger: Ledger, params: list[Any]) -> object:
    owner = pubkey(arg(params, 0, str, name="owner"), "owner")
    which = arg(params, 1, dict, name="mint or programId")
    cfg = config(params, 2)
    cfg.setdefault("encoding", LEGACY_DEFAULT)
    slot = commitment(ledger, cfg)
    filters: list[Callable[[bytes], bool]] = [
        lambda data: codec.is_token_account_data(data) and data[32:64] == bytes(owner)
    ]
    if "mint" in which:
        mint = pubkey(which["mint"], "mint")
        mint_account = ledger.account(mint, slot)
        if mint_account is None or mint_account.owner not in codec.TOKEN_PROGRAMS:
            raise invalid("Invalid param: could not find mint")
        programs = [mint_account.owner]
        filters.append(lambda data: data[0:32] == bytes(mint))
    elif "programId" in which:
        program = pubkey(which["programId"], "programId")
        if program not in codec.TOKEN_PROGRAMS:
            raise invalid("Invalid param: unrecognized Token program id")
        programs = [program]
    else:
        raise invalid("Invalid params: want {mint} or {programId}")
    found = [
        hit for program in programs for hit in program_accounts(ledger, program, slot, filters)
    ]
    return with_context(slot, _keyed(ledger, slot, found, cfg))


def _token(ledger: Ledger, params: list[Any], what: str) -> tuple[int, bytes, Account]:
    key = pubkey(arg(params, 0, str, name="pubkey"))
    slot = commitment(ledger, config(params, 1))
    account = ledger.account(key, slot)
    if account is None or codec.token_kind(account) != what:
        raise invalid(f"Invalid param: not a Token {what}")
    return slot, bytes(account.data), account


def get_token_account_balance(ledger: Ledger, params: list[Any]) -> object:
    slot, data, _ = _token(ledger, params, "account")
    mint = ledger.account(Pubkey.from_bytes(data[0:32]), slot)
    if mint is None:
        raise invalid("Invalid param: could not find mint")
    amount = int.from_bytes(data[64:72], "little")
    return with_context(slot, codec.token_amount(amount, bytes(mint.data)[44]))


def get_token_supply(ledger: Ledger, params: list[Any]) -> object:
    slot, data, _ = _token(ledger, params, "mint")
    supply = int.from_bytes(data[36:44], "little")
    return with_context(slot, codec.token_amount(supply, data[44]))


def get_minimum_balance_for_rent_exemption(ledger: Ledger, params: list[Any]) -> object:
    size = arg(params, 0, int, name="data length")
    if size < 0 or size > 10 * 1024 * 1024:
        raise invalid("Invalid params: data length out of range")
    return ledger.svm.minimum_balance_for_rent_exemption(size)


METHODS: dict[str, Callable[[Ledger, list[Any]], object]] = {
    "getBalance": get_balance,
    "getAccountInfo": get_account_info,
    "getMultipleAccounts": get_multiple_accounts,
    "getProgramAccounts": get_program_accounts,
    "getTokenAccountsByOwner": get_token_accounts_by_owner,
    "getTokenAccountBalance": get_token_account_balance,
    "getTokenSupply": get_token_supply,
    "getMinimumBalanceForRentExemption": get_minimum_balance_for_rent_exemption,
}
