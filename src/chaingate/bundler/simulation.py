"""Validation by simulation: the EntryPoint's own ``simulateValidation``, and the bundle's
second validation through ``handleOps``.

* v0.6: ``EntryPoint.simulateValidation(op)`` always reverts; the revert data is the answer
  (``ValidationResult`` / ``ValidationResultWithAggregation``, or ``FailedOp`` when refused).
* v0.7 and v0.8: the EntryPoint has no simulation functions; ``EntryPointSimulations`` of
  the same version (same storage layout, plus ``simulateValidation``) is placed at the
  EntryPoint's address by an eth_call state override, so it reads the real deposits and
  nonces. It *returns* ``ValidationResult`` and reverts with ``FailedOp`` /
  ``FailedOpWithRevert``.  A v0.8 operation carrying an EIP-7702 authorization is simulated
  with the delegation already in place: the sender's code overridden with its designator.

The sans-IO half (``validation_call``, ``decode_validation``, ``check_validation``) is shared
with the ERC-7562 tracer, which runs the same call under ``debug_traceCall``. The async half
makes the eth_call (the "unsafe mode" path: no tracing).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any, Protocol

import msgspec
import trio

from chaingate.aa.userop import (
    OP_TUPLE_TYPE,
    UserOperation,
    Version,
    packed,
    packs_gas,
    require_version,
)
from chaingate.bundler.errors import (
    INVALID_AGGREGATOR,
    INVALID_SIGNATURE,
    SIMULATION_REJECTED,
    TIME_RANGE,
    BundlerFault,
    code_of_failed_op,
)
from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.eip7702 import designator
from chaingate.evm.reverts import describe_revert as decode_revert

__all__ = [
    "FailedOp",
    "NodeClient",
    "StakeInfo",
    "ValidationResult",
    "check_validation",
    "decode_revert",
    "decode_validation",
    "eth_call",
    "finish_validation",
    "node_batch",
    "parse_validation_data",
    "revert_data_of",
    "revert_fault",
    "simulate_handle_ops",
    "simulate_validation",
    "simulations_code_v07",
    "simulations_for",
    "state_override",
    "validation_call",
    "wire_override",
]

UINT48_MAX = (1 << 48) - 1
SIG_FAILED = 1  # the "aggregator" address 1 in validationData: the signature check failed
MIN_VALID_SECONDS = 30  # the reference bundler refuses an op that expires within 30 s

_ADDRESS_MASK = (1 << 160) - 1

_STAKE = "(uint256,uint256)"
_V06_RETURN_INFO = "(uint256,uint256,bool,uint48,uint48,bytes)"
_V07_RETURN_INFO = "(uint256,uint256,uint256,uint256,bytes)"
_V06_RESULT = f"({_V06_RETURN_INFO},{_STAKE},{_STAKE},{_STAKE})"
_V06_RESULT_AGG = f"({_V06_RETURN_INFO},{_STAKE},{_STAKE},{_STAKE},(address,{_STAKE}))"
_V07_RESULT = f"(({_V07_RETURN_INFO},{_STAKE},{_STAKE},{_STAKE},(address,{_STAKE})))"

V06_VALIDATION_RESULT = abi.selector(f"ValidationResult{_V06_RESULT}")
V06_VALIDATION_RESULT_AGG = abi.selector(f"ValidationResultWithAggregation{_V06_RESULT_AGG}")
FAILED_OP = abi.selector("FailedOp(uint256,string)")
FAILED_OP_WITH_REVERT = abi.selector("FailedOpWithRevert(uint256,string,bytes)")

_SIMULATE_VALIDATION = {v: f"simulateValidation({t})" for v, t in OP_TUPLE_TYPE.items()}


class NodeClient(Protocol):
    """What this package needs of a node client (``chaingate.chain.client.ChainClient``)."""

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any: ...


async def node_batch(
    client: NodeClient, calls: Sequence[tuple[str, Sequence[Any]]]
) -> list[Any | RpcCallError]:
    """Results in call order, a refused call as its RpcCallError: one JSON-RPC batch with a
    client that has them (one request for the node to parse, one round trip, one upstream
    for all), else concurrent calls."""
    batch = getattr(client, "batch", None)
    if batch is not None:
        results: list[Any | RpcCallError] = await batch(calls)
        return results
    found: list[Any | RpcCallError] = [None] * len(calls)

    async def one(index: int) -> None:
        method, params = calls[index]
        try:
            found[index] = await client.call(method, params)
        except RpcCallError as error:
            found[index] = error

    async with trio.open_nursery() as nursery:
        for index in range(len(calls)):
            nursery.start_soon(one, index)
    return found


class StakeInfo(msgspec.Struct, frozen=True):
    stake: int
    unstake_delay_sec: int


_NO_STAKE = StakeInfo(0, 0)


class ValidationResult(msgspec.Struct, frozen=True, kw_only=True):
    """What simulateValidation answered, version-neutral.

    ``valid_until`` is already mapped from 0 to ``UINT48_MAX`` (no expiry), and both time
    fields are the intersection of the account's and the paymaster's ranges.
    ``account_sig_failed`` / ``paymaster_sig_failed`` say whose signature failed; v0.6 only
    reports that *a* signature failed, so there both are None and ``sig_failed`` is set.
    """

    pre_op_gas: int
    prefund: int
    sig_failed: bool
    valid_after: int
    valid_until: int
    paymaster_context: bytes
    sender: StakeInfo
    factory: StakeInfo
    paymaster: StakeInfo
    aggregator: str | None = None  # a real aggregator (not the sig-failed marker)
    aggregator_stake: StakeInfo | None = None
    account_sig_failed: bool | None = None
    paymaster_sig_failed: bool | None = None
    account_validation_data: int = 0  # v0.7's raw words (0 for v0.6)
    paymaster_validation_data: int = 0


class ParsedValidationData(msgspec.Struct, frozen=True):
    aggregator: int  # 0 none, 1 signature failed, else an aggregator address
    valid_after: int
    valid_until: int  # 0 mapped to UINT48_MAX


def parse_validation_data(data: int) -> ParsedValidationData:
    """``_parseValidationData``: aggregator (low 160 bits), validUntil (48), validAfter (48)."""
    until = (data >> 160) & UINT48_MAX
    return ParsedValidationData(
        aggregator=data & _ADDRESS_MASK,
        valid_after=(data >> 208) & UINT48_MAX,
        valid_until=until or UINT48_MAX,
    )


# --- building the call -----------------------------------------------------------------------


# Shipped with the package (``chaingate serve`` never runs npm): the deployedBytecode of the
# pinned npm artifacts, written and checked identical by ``python -m chaingate.devnet.shipped``.
SIMULATIONS: dict[Version, str] = {
    "0.7": "artifacts/EntryPointSimulations-v07.json",
    "0.8": "artifacts/EntryPointSimulations-v08.json",
}
SIMULATIONS_V07 = SIMULATIONS["0.7"]


class ShippedCode(msgspec.Struct, frozen=True):
    contract: str
    source: str  # the npm package version it was taken from
    sha256: str  # of the code: a damaged copy is refused
    deployedBytecode: str


def read_shipped_code(data: bytes) -> ShippedCode:
    shipped = msgspec.json.decode(data, type=ShippedCode)
    code = bytes.fromhex(shipped.deployedBytecode.removeprefix("0x"))
    if not code or hashlib.sha256(code).hexdigest() != shipped.sha256:
        raise RuntimeError(f"the shipped {shipped.contract} code does not match its sha256")
    return shipped


@functools.cache
def simulations_for(version: Version) -> bytes | None:
    """EntryPointSimulations runtime code of ``version`` (None for v0.6, which simulates
    itself) from the pinned npm artifact (the reference bundler puts the same deployedBytecode
    in its state override), shipped in the package."""
    name = SIMULATIONS.get(require_version(version))
    if name is None:
        return None
    data = (resources.files("chaingate.bundler") / name).read_bytes()
    return bytes.fromhex(read_shipped_code(data).deployedBytecode.removeprefix("0x"))


def simulations_code_v07() -> bytes:
    code = simulations_for("0.7")
    assert code is not None
    return code


def state_override(op: UserOperation) -> dict[str, Any]:
    """The state an operation is simulated in beyond the chain's: an EIP-7702 sender's
    delegation, as its authorization will set it in the bundle's transaction."""
    if op.eip7702_auth is None:
        return {}
    return {checksum_address(op.sender): {"code": "0x" + designator(op.eip7702_auth.address).hex()}}


@functools.lru_cache(maxsize=8)
def _code_hex(code: bytes) -> str:
    """The EntryPointSimulations code as the override says it: the same few codes on every
    validation (~20 KB; the bytes object is the caller's own, so its hash is computed once)."""
    return "0x" + code.hex()


# A code longer than this is sent as JSON text encoded once (``wire_override``).
_RAW_CODE_CHARS = 4096


@functools.lru_cache(maxsize=8)
def _code_json(code_hex: str) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(code_hex))


def wire_override(client: object, override: dict[str, Any] | None) -> Any:
    """``override`` as a request to ``client`` carries it.  A client whose encoder is
    msgspec's (``ChainClient.raw_json``) gets the shipped simulations' code as its JSON text
    encoded once (``msgspec.Raw``, copied as it is): ~42,000 characters on every validation
    that msgspec would otherwise scan for escapes (~60,000 instructions, callgrind).  The
    same request on the wire."""
    if not override or not getattr(client, "raw_json", False):
        return override
    wire: dict[str, Any] = {}
    for address, fields in override.items():
        code = fields.get("code") if isinstance(fields, dict) else None
        if isinstance(code, str) and len(code) > _RAW_CODE_CHARS:
            fields = {**fields, "code": _code_json(code)}
        wire[address] = fields
    return wire


def validation_call(
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations: bytes | None,
    *,
    gas: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(eth_call transaction object, state override or None) that simulates ``op``'s
    validation; the tracer runs the same pair under debug_traceCall.

    v0.7 and later need ``simulations`` (``simulations_for(version)``): it is placed at the
    EntryPoint's address, so the simulation sees the EntryPoint's own storage.
    """
    version = require_version(version)
    entry_point = checksum_address(entry_point)
    calldata = abi.encode_call(_SIMULATE_VALIDATION[version], packed(op, version))
    tx: dict[str, Any] = {"to": entry_point, "data": "0x" + calldata.hex()}
    if gas is not None:
        tx["gas"] = hex(gas)
    override = state_override(op)
    if packs_gas(version):
        if not simulations:
            raise ValueError(
                f"EntryPoint v{version} validation needs the EntryPointSimulations code"
            )
        override[entry_point] = {"code": _code_hex(simulations)}
    return tx, override or None


# --- decoding the answer ---------------------------------------------------------------------


def _failed_op_fault(data: bytes) -> BundlerFault | None:
    """The fault for a FailedOp / FailedOpWithRevert revert, None for other data."""
    try:
        if data[:4] == FAILED_OP:
            index, reason = abi.decode(["uint256", "string"], data[4:])
            return BundlerFault(
                code_of_failed_op(reason),
                reason,
                {"reason": reason, "opIndex": index},
                reason=reason,
            )
        if data[:4] == FAILED_OP_WITH_REVERT:
            index, reason, inner = abi.decode(["uint256", "string", "bytes"], data[4:])
            text = decode_revert(inner)
            return BundlerFault(
                code_of_failed_op(reason),
                f"{reason}: {text}",
                {"reason": reason, "opIndex": index, "revertData": "0x" + inner.hex()},
                reason=reason,
            )
    except abi.AbiError:
        return None
    return None


def _stake(value: tuple[Any, ...]) -> StakeInfo:
    return StakeInfo(int(value[0]), int(value[1]))


def revert_fault(data: bytes) -> BundlerFault:
    """The fault for revert data of a validation or simulation call: FailedOp's reason and
    code, or -32500 with the decoded revert."""
    return _reverted(data)


def _reverted(data: bytes) -> BundlerFault:
    fault = _failed_op_fault(data)
    if fault is not None:
        return fault
    return BundlerFault(
        SIMULATION_REJECTED,
        f"validation reverted: {decode_revert(data)}",
        {"revertData": "0x" + data.hex()},
    )


def decode_validation(version: Version, data: bytes, reverted: bool) -> ValidationResult:
    """The ValidationResult in ``data`` (the call's return or revert data).

    Raises BundlerFault: FailedOp / FailedOpWithRevert with the AAxx reason and its code
    (``code_of_failed_op``), any other revert -> -32500 with the decoded reason. Signature,
    aggregator and time-range checks are ``check_validation``'s.
    """
    version = require_version(version)
    if version == "0.6":
        if not reverted:
            raise BundlerFault(
                SIMULATION_REJECTED,
                "simulateValidation returned instead of reverting with its result "
                "(no EntryPoint v0.6 at that address?)",
            )
        return _decode_v06(data)
    if reverted:
        raise _reverted(data)
    try:
        ((info, sender, factory, paymaster, aggregator_info),) = abi.decode(_V07_RESULT, data)
    except abi.AbiError:
        raise BundlerFault(
            SIMULATION_REJECTED,
            "simulateValidation returned no ValidationResult (no EntryPoint v0.7 there?)",
            {"returnData": "0x" + data.hex()},
        ) from None
    pre_op_gas, prefund, account_data, paymaster_data, context = info
    account = parse_validation_data(account_data)
    pm = parse_validation_data(paymaster_data)
    _aggregator_address, aggregator_stake = aggregator_info
    aggregator = account.aggregator if account.aggregator > SIG_FAILED else 0
    return ValidationResult(
        pre_op_gas=pre_op_gas,
        prefund=prefund,
        sig_failed=account.aggregator == SIG_FAILED or pm.aggregator != 0,
        valid_after=max(account.valid_after, pm.valid_after),
        valid_until=min(account.valid_until, pm.valid_until),
        paymaster_context=context,
        sender=_stake(sender),
        factory=_stake(factory),
        paymaster=_stake(paymaster),
        aggregator=checksum_address(aggregator.to_bytes(20, "big")) if aggregator else None,
        aggregator_stake=_stake(aggregator_stake) if aggregator else None,
        account_sig_failed=account.aggregator == SIG_FAILED,
        # The EntryPoint refuses any non-zero paymaster aggregator as "AA34 signature error".
        paymaster_sig_failed=pm.aggregator != 0,
        account_validation_data=account_data,
        paymaster_validation_data=paymaster_data,
    )


def _decode_v06(data: bytes) -> ValidationResult:
    selector, body = data[:4], data[4:]
    try:
        if selector == V06_VALIDATION_RESULT:
            info, sender, factory, paymaster = abi.decode(_V06_RESULT, body)
            aggregator, aggregator_stake = None, None
        elif selector == V06_VALIDATION_RESULT_AGG:
            info, sender, factory, paymaster, (address, stake) = abi.decode(_V06_RESULT_AGG, body)
            aggregator, aggregator_stake = address, _stake(stake)
        else:
            raise _reverted(data)
    except abi.AbiError:
        raise _reverted(data) from None
    pre_op_gas, prefund, sig_failed, valid_after, valid_until, context = info
    return ValidationResult(
        pre_op_gas=pre_op_gas,
        prefund=prefund,
        sig_failed=sig_failed,
        valid_after=valid_after,
        valid_until=valid_until or UINT48_MAX,
        paymaster_context=context,
        sender=_stake(sender),
        factory=_stake(factory),
        paymaster=_stake(paymaster),
        aggregator=aggregator,
        aggregator_stake=aggregator_stake,
    )


def check_validation(
    result: ValidationResult,
    *,
    now: int,
    has_paymaster: bool,
    min_valid_seconds: int = MIN_VALID_SECONDS,
) -> None:
    """The reference bundler's checks of a ValidationResult, as BundlerFaults: aggregator
    (-32506, none supported), signature (-32507, AA24 account / AA34 paymaster), time range
    (-32503: not yet valid, expired, or expiring within ``min_valid_seconds``)."""
    if result.aggregator is not None:
        raise BundlerFault(
            INVALID_AGGREGATOR,
            f"aggregator {result.aggregator} is not supported",
            {"aggregator": result.aggregator},
        )
    if result.sig_failed:
        account_failed = result.account_sig_failed
        if account_failed is None:  # v0.6: whose is unknown; without a paymaster, the account's
            account_failed = not has_paymaster
            reason = "AA24 signature error" if account_failed else "AA24/AA34 signature error"
        else:
            reason = "AA24 signature error" if account_failed else "AA34 signature error"
        raise BundlerFault(
            INVALID_SIGNATURE,
            f"{reason}: invalid UserOperation or paymaster signature",
            {"reason": reason},
            reason=reason,
        )
    window = {"validAfter": result.valid_after, "validUntil": result.valid_until, "now": now}
    if result.valid_after > now:
        raise BundlerFault(TIME_RANGE, f"not valid before {result.valid_after} (now {now})", window)
    if result.valid_until < now + min_valid_seconds:
        what = "expired" if result.valid_until < now else "expires too soon"
        raise BundlerFault(
            TIME_RANGE,
            f"{what}: valid until {result.valid_until}, now {now}, "
            f"at least {min_valid_seconds} s needed",
            window,
        )


# --- over the node ---------------------------------------------------------------------------


def revert_data_of(error: RpcCallError) -> bytes | None:
    """The revert data in a node's eth_call error (geth, anvil, erigon, nethermind put it in
    ``data`` as hex, some nest it as ``data.data``); None when the error is no revert."""
    data = error.data
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data[:2] in ("0x", "0X"):
        try:
            return bytes.fromhex(data[2:])
        except ValueError:
            return None
    # A revert without data: anvil and geth answer code 3 / "execution reverted".
    if error.code == 3 or "revert" in error.message.lower():
        return b""
    return None


async def eth_call(
    client: NodeClient, tx: dict[str, Any], override: dict[str, Any] | None
) -> tuple[bytes, bool]:
    """(return or revert data, reverted) of one eth_call at "latest". A node error that is
    not a revert propagates as the RpcCallError it is: the node failed, not the operation."""
    params: list[Any] = [tx, "latest"]
    if override is not None:
        params.append(wire_override(client, override))
    try:
        reply = await client.call("eth_call", params)
    except RpcCallError as error:
        data = revert_data_of(error)
        if data is None:
            raise
        return data, True
    if not isinstance(reply, str) or reply[:2] not in ("0x", "0X"):
        raise RpcCallError("eth_call", -32603, f"non-hex eth_call answer {reply!r}")
    return bytes.fromhex(reply[2:]), False


async def simulate_validation(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    simulations_code: bytes | None,
    *,
    now: int | None = None,
    min_valid_seconds: int = MIN_VALID_SECONDS,
) -> ValidationResult:
    """Validate ``op`` by eth_call (no ERC-7562 tracing): the result, or a BundlerFault.

    ``now`` defaults to the wall clock (a chain's next block is stamped near it)."""
    version = require_version(version)
    tx, override = validation_call(
        op, entry_point, version, simulations_code or simulations_for(version)
    )
    data, reverted = await eth_call(client, tx, override)
    result = decode_validation(version, data, reverted)
    await finish_validation(
        client, op, entry_point, version, result, now=now, min_valid_seconds=min_valid_seconds
    )
    return result


async def finish_validation(
    client: NodeClient,
    op: UserOperation,
    entry_point: str,
    version: Version,
    result: ValidationResult,
    *,
    now: int | None = None,
    min_valid_seconds: int = MIN_VALID_SECONDS,
) -> None:
    """``check_validation``, and on v0.6 a signature failure with a paymaster named AA24 or
    AA34 by asking handleOps (eth_call), which checks the account's first. For the traced
    path too: call it after ``decode_validation``."""
    stamp = int(time.time()) if now is None else now
    try:
        check_validation(
            result,
            now=stamp,
            has_paymaster=op.paymaster is not None,
            min_valid_seconds=min_valid_seconds,
        )
    except BundlerFault as fault:
        if fault.code != INVALID_SIGNATURE or result.account_sig_failed is not None:
            raise
        failed = await simulate_handle_ops(client, [op], entry_point, version, entry_point)
        if failed is None or failed.reason[:4] not in ("AA24", "AA34"):
            raise
        raise BundlerFault(
            INVALID_SIGNATURE, failed.reason, {"reason": failed.reason}, reason=failed.reason
        ) from None


class FailedOp(msgspec.Struct, frozen=True):
    """The operation a bundle's handleOps refuses: its index and the EntryPoint's reason."""

    index: int
    reason: str
    code: int  # code_of_failed_op(reason)
    inner: bytes = b""  # FailedOpWithRevert's revert data


async def simulate_handle_ops(
    client: NodeClient,
    ops: Sequence[UserOperation],
    entry_point: str,
    version: Version,
    beneficiary: str,
    gas: int | None = None,
    *,
    sender: str | None = None,
) -> FailedOp | None:
    """The second validation of a whole bundle: eth_call of ``handleOps(ops, beneficiary)``
    from ``sender`` (default the beneficiary, i.e. the bundler's EOA), with the operations'
    EIP-7702 authorizations. None when it would
    succeed; the FailedOp it names otherwise. Another revert (out of gas, a crash the
    EntryPoint does not attribute) raises BundlerFault(-32500) with the decoded reason."""
    from chaingate.aa.userop import authorizations, handle_ops_calldata

    calldata = handle_ops_calldata(ops, checksum_address(beneficiary), version)
    tx: dict[str, Any] = {
        "from": checksum_address(sender or beneficiary),
        "to": checksum_address(entry_point),
        "data": "0x" + calldata.hex(),
    }
    auths = authorizations(ops)
    if auths:  # as the bundle's type-4 transaction applies them, signatures and nonces checked
        tx["authorizationList"] = [a.json() for a in auths]
    if gas is not None:
        tx["gas"] = hex(gas)
    data, reverted = await eth_call(client, tx, None)
    if not reverted:
        return None
    fault = _failed_op_fault(data)
    if fault is None:
        raise BundlerFault(
            SIMULATION_REJECTED,
            f"handleOps reverted: {decode_revert(data)}",
            {"revertData": "0x" + data.hex()},
        )
    index = int(fault.data["opIndex"])
    inner = fault.data.get("revertData", "0x")
    return FailedOp(index, fault.reason, fault.code, bytes.fromhex(inner[2:]))
