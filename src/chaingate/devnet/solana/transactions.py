"""The transaction methods: send, simulate, airdrop, statuses, and reading blocks back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solders.account import Account
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction

from chaingate.devnet.solana import codec
from chaingate.devnet.solana.errors import describe
from chaingate.devnet.solana.ledger import Block, Executed, Ledger, TransactionRefused
from chaingate.devnet.solana.params import (
    Code,
    arg,
    commitment,
    config,
    invalid,
    pubkey,
    with_context,
)
from chaingate.rpc.local import RpcFault

MAX_AIRDROP_LAMPORTS = 10**9 * 10**6
MAX_SIGNATURES_FOR_ADDRESS = 1000
MAX_SIGNATURE_STATUSES = 256
MAX_GET_BLOCKS_RANGE = 500_000


def decode_transaction(text: str, encoding: str) -> VersionedTransaction:
    if encoding not in ("base58", "base64"):
        raise invalid(
            f"Invalid params: unsupported encoding: {encoding}. Supported encodings: base58, base64"
        )
    try:
        raw = codec.decode_bytes(text, encoding)
    except codec.EncodingError as exc:
        raise invalid(f"invalid {encoding} encoding: {exc}") from None
    try:
        tx = VersionedTransaction.from_bytes(raw)
        tx.sanitize()
    except ValueError as exc:
        raise invalid(f"invalid transaction: {exc}") from None
    return tx


def simulation_result(
    executed: Executed | None, err: object, accounts: object = None, replacement: object = None
) -> dict[str, Any]:
    """simulateTransaction's value, and a failed preflight's error data."""
    return {
        "accounts": accounts,
        "err": err,
        "fee": executed.fee if executed else None,
        "innerInstructions": executed.inner if executed else None,
        "loadedAccountsDataSize": None,
        "logs": executed.logs if executed else [],
        "postBalances": executed.post_balances if executed else None,
        "preBalances": executed.pre_balances if executed else None,
        "replacementBlockhash": replacement,
        "returnData": executed.return_data if executed else None,
        "unitsConsumed": executed.units if executed else 0,
    }


def _signature_failure() -> RpcFault:
    return RpcFault(
        Code.SIGNATURE_VERIFICATION_FAILURE, "Transaction signature verification failure"
    )


def _preflight_failure(executed: Executed | None, err: object) -> RpcFault:
    return RpcFault(
        Code.PREFLIGHT_FAILURE,
        f"Transaction simulation failed: {describe(err)}",
        simulation_result(executed, err),
    )


def send_transaction(ledger: Ledger, params: list[Any]) -> object:
    cfg = config(params, 1)
    tx = decode_transaction(arg(params, 0, str, name="transaction"), cfg.get("encoding", "base58"))
    signature = str(tx.signatures[0])
    try:
        ledger.check(tx, sig_verify=True, blockhash=False)
    except TransactionRefused:
        raise _signature_failure() from None
    if not cfg.get("skipPreflight", False):
        commitment(ledger, {**cfg, "commitment": cfg.get("preflightCommitment", "finalized")})
        try:
            ledger.check(tx, sig_verify=False, blockhash=True)
            if ledger.status(tx.signatures[0]) is not None:
                raise TransactionRefused("AlreadyProcessed")
        except TransactionRefused as refused:
            raise _preflight_failure(None, refused.err) from None
        executed, _ = ledger.simulate(tx)
        if executed.err is not None:
            raise _preflight_failure(executed, executed.err)
    if ledger.blockhash_valid(str(tx.message.recent_blockhash)):
        try:
            ledger.execute(tx)
        except TransactionRefused:
            pass  # dropped, as a validator drops what cannot pay or was already processed
    return signature


def simulate_transaction(ledger: Ledger, params: list[Any]) -> object:
    cfg = config(params, 1)
    tx = decode_transaction(arg(params, 0, str, name="transaction"), cfg.get("encoding", "base58"))
    replace = bool(cfg.get("replaceRecentBlockhash", False))
    sig_verify = bool(cfg.get("sigVerify", False))
    if replace and sig_verify:
        raise invalid("sigVerify may not be used with replaceRecentBlockhash")
    slot = commitment(ledger, cfg)
    try:
        ledger.check(tx, sig_verify=sig_verify, blockhash=not replace)
    except TransactionRefused as refused:
        if refused.err == "SignatureFailure":
            raise _signature_failure() from None
        return with_context(slot, simulation_result(None, refused.err))
    executed, post = ledger.simulate(tx)
    accounts = None
    wanted = cfg.get("accounts")
    if isinstance(wanted, dict):
        keys = [pubkey(text, "address") for text in wanted.get("addresses", [])]
        after = dict(zip(codec.account_keys(tx), post, strict=False))
        encoding = wanted.get("encoding", "base64")
        accounts = [_shown(ledger, key, after.get(key), encoding) for key in keys]
    replacement = None
    if replace:
        replacement = {
            "blockhash": ledger.blocks[ledger.head].blockhash,
            "lastValidBlockHeight": ledger.last_valid_height(ledger.head),
        }
    result = simulation_result(executed, executed.err, accounts, replacement)
    if not cfg.get("innerInstructions", False):
        result["innerInstructions"] = None
    return with_context(slot, result)


def _shown(
    ledger: Ledger, key: Pubkey, simulated: Account | None, encoding: str
) -> dict[str, Any] | None:
    """An account after a simulation: as it left it, else as it is."""
    account = simulated if simulated is not None else ledger.account(key, ledger.head)
    return None if account is None else codec.ui_account(account, encoding)


def request_airdrop(ledger: Ledger, params: list[Any]) -> object:
    key = pubkey(arg(params, 0, str, name="pubkey"))
    lamports = arg(params, 1, int, name="lamports")
    if not 0 < lamports <= MAX_AIRDROP_LAMPORTS:
        raise RpcFault(Code.INVALID_REQUEST, "Invalid request: airdrop amount out of range")
    try:
        return ledger.airdrop(key, lamports).signature
    except TransactionRefused as refused:
        raise RpcFault(Code.INVALID_REQUEST, f"airdrop failed: {describe(refused.err)}") from None


def _status(ledger: Ledger, executed: Executed) -> dict[str, Any]:
    level = ledger.commitment_of(executed.slot)
    return {
        "confirmationStatus": level,
        "confirmations": None if level == "finalized" else ledger.head - executed.slot,
        "err": executed.err,
        "slot": executed.slot,
        "status": {"Ok": None} if executed.err is None else {"Err": executed.err},
    }


def get_signature_statuses(ledger: Ledger, params: list[Any]) -> object:
    signatures = arg(params, 0, list, name="signatures")
    if len(signatures) > MAX_SIGNATURE_STATUSES:
        raise invalid(f"Too many inputs provided; max {MAX_SIGNATURE_STATUSES}")
    value = []
    for signature in signatures:
        executed = ledger.signatures.get(str(signature))
        value.append(None if executed is None else _status(ledger, executed))
    return with_context(ledger.head, value)


def _meta(ledger: Ledger, executed: Executed) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "computeUnitsConsumed": executed.units,
        "err": executed.err,
        "fee": executed.fee,
        "innerInstructions": executed.inner,
        "loadedAddresses": {"readonly": [], "writable": []},
        "logMessages": executed.logs,
        "postBalances": executed.post_balances,
        "postTokenBalances": executed.post_token_balances,
        "preBalances": executed.pre_balances,
        "preTokenBalances": executed.pre_token_balances,
        "rewards": [],
        "status": {"Ok": None} if executed.err is None else {"Err": executed.err},
    }
    if executed.return_data is not None:
        meta["returnData"] = executed.return_data
    return meta


def _with_meta(ledger: Ledger, executed: Executed, cfg: dict[str, Any]) -> dict[str, Any]:
    version = codec.version_of(executed.tx)
    max_version = cfg.get("maxSupportedTransactionVersion")
    if version != "legacy" and (max_version is None or max_version < version):
        raise RpcFault(
            Code.UNSUPPORTED_TRANSACTION_VERSION,
            f"Transaction version ({version}) is not supported by the requesting client. "
            "Please try the request again with the following configuration parameter: "
            '"maxSupportedTransactionVersion": 0',
        )
    encoding = cfg.get("encoding", "json")
    if encoding not in ("json", "jsonParsed", "base58", "base64"):
        raise invalid(f"Invalid params: unsupported encoding {encoding!r}")
    shown: dict[str, Any] = {
        "meta": _meta(ledger, executed),
        "transaction": codec.ui_transaction(executed.tx, encoding),
    }
    if max_version is not None:
        shown["version"] = version
    return shown


def get_transaction(ledger: Ledger, params: list[Any]) -> object:
    signature = arg(params, 0, str, name="signature")
    cfg = config(params, 1)
    if isinstance(params[1:2] and params[1], str):
        cfg = {"encoding": params[1]}
    slot = commitment(ledger, cfg, least="confirmed")
    executed = ledger.signatures.get(signature)
    if executed is None or executed.slot > slot:
        return None
    shown = _with_meta(ledger, executed, cfg)
    return {"blockTime": ledger.blocks[executed.slot].block_time, "slot": executed.slot, **shown}


def _block(ledger: Ledger, slot: int, cfg: dict[str, Any]) -> Block:
    if slot > commitment(ledger, cfg, least="confirmed"):
        raise RpcFault(Code.BLOCK_NOT_AVAILABLE, f"Block not available for slot {slot}")
    block = ledger.blocks.get(slot)
    if block is None:
        first = ledger.first_available()
        raise RpcFault(
            Code.BLOCK_CLEANED_UP,
            f"Block {slot} cleaned up, does not exist on node. First available block: {first}",
        )
    return block


def get_block(ledger: Ledger, params: list[Any]) -> object:
    slot = arg(params, 0, int, name="slot")
    cfg = config(params, 1)
    if isinstance(params[1:2] and params[1], str):
        cfg = {"encoding": params[1]}
    block = _block(ledger, slot, cfg)
    shown: dict[str, Any] = {
        "blockHeight": block.block_height,
        "blockTime": block.block_time,
        "blockhash": block.blockhash,
        "parentSlot": block.parent_slot,
        "previousBlockhash": block.previous_blockhash,
    }
    details = cfg.get("transactionDetails", "full")
    if details == "full":
        shown["transactions"] = [_with_meta(ledger, tx, cfg) for tx in block.transactions]
    elif details == "signatures":
        shown["signatures"] = [tx.signature for tx in block.transactions]
    elif details != "none":
        raise invalid(f"Invalid params: unsupported transactionDetails {details!r}")
    if cfg.get("rewards", True):
        shown["rewards"] = []
    return shown


def get_block_time(ledger: Ledger, params: list[Any]) -> object:
    slot = arg(params, 0, int, name="slot")
    block = ledger.blocks.get(slot)
    if block is None or slot > ledger.slot("confirmed"):
        raise RpcFault(Code.BLOCK_NOT_AVAILABLE, f"Block not available for slot {slot}")
    return block.block_time


def get_blocks(ledger: Ledger, params: list[Any]) -> object:
    start = arg(params, 0, int, name="start slot")
    end_or_cfg = params[1] if len(params) > 1 else None
    cfg = end_or_cfg if isinstance(end_or_cfg, dict) else config(params, 2)
    top = commitment(ledger, cfg, least="confirmed")
    end = end_or_cfg if isinstance(end_or_cfg, int) else top
    if end - start > MAX_GET_BLOCKS_RANGE:
        raise invalid(f"Slot range too large; max {MAX_GET_BLOCKS_RANGE}")
    return [slot for slot in ledger.blocks if start <= slot <= min(end, top)]


def get_blocks_with_limit(ledger: Ledger, params: list[Any]) -> object:
    start = arg(params, 0, int, name="start slot")
    limit = arg(params, 1, int, name="limit")
    if not 0 <= limit <= MAX_GET_BLOCKS_RANGE:
        raise invalid(f"Limit too large; max {MAX_GET_BLOCKS_RANGE}")
    top = commitment(ledger, config(params, 2), least="confirmed")
    return [slot for slot in ledger.blocks if start <= slot <= top][:limit]


def get_first_available_block(ledger: Ledger, params: list[Any]) -> object:
    return ledger.first_available()


def get_signatures_for_address(ledger: Ledger, params: list[Any]) -> object:
    key = pubkey(arg(params, 0, str, name="address"), "address")
    cfg = config(params, 1)
    slot = commitment(ledger, cfg, least="confirmed")
    limit = cfg.get("limit") or MAX_SIGNATURES_FOR_ADDRESS
    if not isinstance(limit, int) or not 1 <= limit <= MAX_SIGNATURES_FOR_ADDRESS:
        raise invalid(f"Invalid limit; max {MAX_SIGNATURES_FOR_ADDRESS}")
    newest_first = reversed(ledger.by_address.get(key, []))
    found = []
    started = cfg.get("before") is None
    for signature in newest_first:
        if signature == cfg.get("until"):
            break
        if not started:
            started = signature == cfg["before"]
            continue
        executed = ledger.signatures[signature]
        if executed.slot > slot:
            continue
        found.append(
            {
                "blockTime": ledger.blocks[executed.slot].block_time,
                "confirmationStatus": ledger.commitment_of(executed.slot),
                "err": executed.err,
                "memo": None,
                "signature": signature,
                "slot": executed.slot,
            }
        )
        if len(found) == limit:
            break
    return found


METHODS: dict[str, Callable[[Ledger, list[Any]], object]] = {
    "sendTransaction": send_transaction,
    "simulateTransaction": simulate_transaction,
    "requestAirdrop": request_airdrop,
    "getSignatureStatuses": get_signature_statuses,
    "getTransaction": get_transaction,
    "getBlock": get_block,
    "getBlockTime": get_block_time,
    "getBlocks": get_blocks,
    "getBlocksWithLimit": get_blocks_with_limit,
    "getFirstAvailableBlock": get_first_available_block,
    "minimumLedgerSlot": get_first_available_block,
    "getSignaturesForAddress": get_signatures_for_address,
}
