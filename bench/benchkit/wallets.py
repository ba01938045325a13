"""The wallet and gas-sponsorship REST API as a bench client uses it.

JSON requests carrying the API key, a UserOperation's request fields (hex strings, as
``POST /v1/gas/sponsor`` takes them), and the check that a sponsorship's paymaster signature
is the given signer's: the VerifyingPaymaster hash is recomputed here from the operation and
the answer, and the signer recovered from it (no node needed).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from chaingate.aa.paymaster import (
    decode_paymaster_data,
    eth_signed_message_hash,
    paymaster_data_stub,
    verifying_paymaster_hash,
)
from chaingate.aa.userop import UserOperation, Version
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import recover_address

GWEI = 10**9


def request_json(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: Any = None,
    timeout: float = 10.0,
) -> tuple[int, Any]:
    """(status, decoded JSON body; the text when it is no JSON) of one request."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, method=method, headers=dict(headers))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def execute_call(target: str, value: int = 0, data: bytes = b"") -> bytes:
    """SimpleAccount ``execute(address,uint256,bytes)`` calldata."""
    return abi.encode_call("execute(address,uint256,bytes)", target, value, data)


def user_operation(sender: str, call_data: bytes, **changes: str) -> dict[str, str]:
    """An unsigned UserOperation's fields as the sponsor request takes them (ERC-7769 names,
    hex strings): nonce 0, gas limits a SimpleAccount's first operation fits in, 3 gwei."""
    op = {
        "sender": sender,
        "nonce": "0x0",
        "callData": "0x" + call_data.hex(),
        "callGasLimit": hex(200_000),
        "verificationGasLimit": hex(1_000_000),
        "preVerificationGas": hex(60_000),
        "maxFeePerGas": hex(3 * GWEI),
        "maxPriorityFeePerGas": hex(GWEI),
    }
    op.update(changes)
    return op


def _bytes(text: str | None) -> bytes:
    return bytes.fromhex(text[2:]) if text else b""


def sponsored_operation(
    op: Mapping[str, str], answer: Mapping[str, Any], version: Version
) -> UserOperation:
    """The operation as the client holds it after sponsorship: its own fields plus the
    answer's (paymaster fields, and the factory filled in for an undeployed wallet)."""
    factory = answer.get("factory")
    factory_data = _bytes(answer.get("factoryData"))
    if version == "0.6" and answer.get("initCode"):
        code = _bytes(answer["initCode"])
        factory, factory_data = checksum_address(code[:20]), code[20:]
    return UserOperation(
        sender=op["sender"],
        nonce=int(op["nonce"], 16),
        call_data=_bytes(op["callData"]),
        call_gas_limit=int(op["callGasLimit"], 16),
        verification_gas_limit=int(op["verificationGasLimit"], 16),
        pre_verification_gas=int(op["preVerificationGas"], 16),
        max_fee_per_gas=int(op["maxFeePerGas"], 16),
        max_priority_fee_per_gas=int(op["maxPriorityFeePerGas"], 16),
        factory=factory,
        factory_data=factory_data,
        paymaster=answer["paymaster"],
        paymaster_verification_gas_limit=int(answer["paymasterVerificationGasLimit"], 16),
        paymaster_post_op_gas_limit=int(answer["paymasterPostOpGasLimit"], 16),
        paymaster_data=_bytes(answer["paymasterData"]),
    )


def paymaster_signer_of(
    op: Mapping[str, str],
    answer: Mapping[str, Any],
    *,
    chain_id: int,
    version: Version,
    sender_nonce: int = 0,
) -> str:
    """The address that signed the answer's paymasterData (EIP-55), recovered from the
    VerifyingPaymaster hash of the sponsored operation.  Raises ValueError on malformed data.
    ``sender_nonce``: v0.6's per-sender paymaster counter (0 for a new wallet)."""
    held = sponsored_operation(op, answer, version)
    valid_until, valid_after, signature = decode_paymaster_data(held.paymaster_data)
    if len(signature) != 65:
        raise ValueError(f"a paymaster signature of {len(signature)} bytes, not 65")
    stubbed = held.with_(paymaster_data=paymaster_data_stub(valid_until, valid_after))
    digest = verifying_paymaster_hash(
        stubbed,
        paymaster=str(answer["paymaster"]),
        chain_id=chain_id,
        valid_until=valid_until,
        valid_after=valid_after,
        version=version,
        sender_nonce=sender_nonce,
    )
    return recover_address(eth_signed_message_hash(digest), signature)
