"""``POST /v1/gas/sponsor`` — a policy's paymaster signature for one UserOperation.

The operation's fields are the spec's (hex strings); for the version it is sponsored under,
``initCode`` (v0.6) or ``factory``/``factoryData`` (v0.7, v0.8) may be sent too, a v0.8
EIP-7702 sender its ``eip7702Auth``, and a v0.7/v0.8 client may name the paymaster's gas
limits (else the network's defaults are used).  Paymaster fields
a client sends (a stub) are ignored: they are what this answers.  An undeployed wallet
created through the API gets its initCode from our records; the answer then carries it,
since the paymaster's signature covers it.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from chaingate.aa.userop import UserOperation, from_init_code
from chaingate.api.chains import ChainResolver
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.api.routing import Call, NoInput, RestApi
from chaingate.api.types import Address, ChainName, HexData, Uint256
from chaingate.api.walletsupport import account_of, service_of, unavailable
from chaingate.evm.eip7702 import parse_authorization
from chaingate.wallets.model import SPONSOR_SCOPE, Sponsored
from chaingate.wallets.rules import usd_text

# Gas limits above this are no operation a block could hold: refused as a client's mistake.
MAX_GAS = 1 << 64
MAX_FEE = 1 << 128  # the width v0.7 packs fees into


class SponsorOperation(msgspec.Struct, forbid_unknown_fields=True):
    """A UserOperation as sent for sponsorship (ERC-7769 field names)."""

    sender: Address
    nonce: Uint256
    callData: HexData
    callGasLimit: Uint256
    verificationGasLimit: Uint256
    preVerificationGas: Uint256
    maxFeePerGas: Uint256
    maxPriorityFeePerGas: Uint256
    initCode: HexData | None = None
    factory: Address | None = None
    factoryData: HexData | None = None
    paymasterVerificationGasLimit: Uint256 | None = None
    paymasterPostOpGasLimit: Uint256 | None = None
    # v0.8: the EIP-7702 authorization an EOA sender delegates with, in ERC-7769's form.
    eip7702Auth: dict[str, Any] | None = None
    # Accepted and ignored: the answer supplies them (or the owner signs afterwards).
    signature: HexData | None = None
    paymaster: str | None = None
    paymasterData: HexData | None = None
    paymasterAndData: HexData | None = None


class SponsorBody(msgspec.Struct, forbid_unknown_fields=True):
    chain: ChainName
    policy_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    user_operation: SponsorOperation
    # Beyond the spec: the EntryPoint (else the wallet's, for one created here, else the
    # network's default version).
    entry_point: Address | None = None


class SponsorshipResult(msgspec.Struct, omit_defaults=True):
    paymaster: Address
    paymasterData: str
    paymasterVerificationGasLimit: str
    paymasterPostOpGasLimit: str
    sponsored_gas_usd: str | None
    # v0.6 only: paymaster ++ paymasterData, as the v0.6 UserOperation carries it.
    paymasterAndData: str | None = None
    # Beyond the spec.
    entryPoint: Address | None = None
    userOpHash: str | None = None
    validUntil: int | None = None
    validAfter: int | None = None
    sponsorship_id: str | None = None
    # Filled from our records for an undeployed wallet (the signature covers them).
    initCode: str | None = None
    factory: Address | None = None
    factoryData: str | None = None


def _gas(name: str, value: int) -> int:
    if value >= MAX_GAS:
        raise ApiError(400, f"invalid field 'user_operation.{name}': at most 2**64 - 1")
    return value


def to_user_operation(op: SponsorOperation) -> UserOperation:
    """The request's operation, checked, as ``chaingate.aa`` takes it."""
    factory: str | None = op.factory
    factory_data = bytes(op.factoryData or b"")
    if op.initCode:
        if op.factory is not None:
            raise ApiError(
                400,
                "invalid field 'user_operation.initCode': send initCode (v0.6) or "
                "factory/factoryData (v0.7, v0.8), not both",
            )
        if len(op.initCode) < 20:
            raise ApiError(
                400, "invalid field 'user_operation.initCode': shorter than a factory address"
            )
        factory, factory_data = from_init_code(bytes(op.initCode))
    elif factory is None and factory_data:
        raise ApiError(400, "invalid field 'user_operation.factoryData': given without factory")
    for name in ("maxFeePerGas", "maxPriorityFeePerGas"):
        if getattr(op, name) >= MAX_FEE:
            raise ApiError(400, f"invalid field 'user_operation.{name}': at most 2**128 - 1")
    if op.maxPriorityFeePerGas > op.maxFeePerGas:
        raise ApiError(
            400,
            "invalid field 'user_operation.maxPriorityFeePerGas': above maxFeePerGas",
        )
    auth = None
    if op.eip7702Auth is not None:
        try:
            auth = parse_authorization(op.eip7702Auth)
        except ValueError as exc:
            field, _, why = str(exc).partition(": ")
            raise ApiError(400, f"invalid field 'user_operation.{field}': {why}") from None
    return UserOperation(
        sender=str(op.sender),
        nonce=int(op.nonce),
        call_data=bytes(op.callData),
        call_gas_limit=_gas("callGasLimit", int(op.callGasLimit)),
        verification_gas_limit=_gas("verificationGasLimit", int(op.verificationGasLimit)),
        pre_verification_gas=_gas("preVerificationGas", int(op.preVerificationGas)),
        max_fee_per_gas=int(op.maxFeePerGas),
        max_priority_fee_per_gas=int(op.maxPriorityFeePerGas),
        factory=str(factory) if factory else None,
        factory_data=factory_data,
        paymaster_verification_gas_limit=_gas(
            "paymasterVerificationGasLimit", int(op.paymasterVerificationGasLimit or 0)
        ),
        paymaster_post_op_gas_limit=_gas(
            "paymasterPostOpGasLimit", int(op.paymasterPostOpGasLimit or 0)
        ),
        eip7702_auth=auth,
    )


def result_of(done: Sponsored) -> SponsorshipResult:
    op = done.op
    v06 = done.version == "0.6"
    filled = done.init_code_filled
    return SponsorshipResult(
        paymaster=Address.of(done.paymaster),
        paymasterData="0x" + op.paymaster_data.hex(),
        paymasterVerificationGasLimit=hex(op.paymaster_verification_gas_limit),
        paymasterPostOpGasLimit=hex(op.paymaster_post_op_gas_limit),
        sponsored_gas_usd=usd_text(done.usd) if done.usd is not None else None,
        paymasterAndData="0x" + op.paymaster_and_data("0.6").hex() if v06 else None,
        entryPoint=Address.of(done.entry_point),
        userOpHash=done.user_op_hash,
        validUntil=done.valid_until,
        validAfter=done.valid_after,
        sponsorship_id=done.sponsorship_id,
        initCode="0x" + op.init_code.hex() if filled and v06 else None,
        factory=Address.of(op.factory) if filled and not v06 and op.factory else None,
        factoryData="0x" + op.factory_data.hex() if filled and not v06 else None,
    )


def register(api: RestApi, deps: ApiDeps) -> None:
    chains = ChainResolver(deps.evm_networks, "gas sponsorships")

    @api.route(
        "POST",
        "/v1/gas/sponsor",
        name="sponsorUserOperation",
        summary="Sponsor a UserOperation under a gas policy: the paymaster fields to put in it",
        access=SPONSOR_SCOPE,
        body=SponsorBody,
        response=SponsorshipResult,
        errors=(400, 403, 404, 429, 503),
        tags=("gas",),
        description="Every rule of the policy is checked; the worst case (every gas limit x "
        "maxFeePerGas) is priced in USD from the chain's native-currency feed and reserved "
        "against the policy's limits in the same transaction, then settled at the actual "
        "cost from the EntryPoint's UserOperationEvent. A refusal names its rule: 403, or "
        "429 with Retry-After for `max_per_user_per_day` and `rate_limit`. The owner signs "
        "the operation after putting these fields in it.",
    )
    async def sponsor_user_operation(call: Call[NoInput, NoInput, SponsorBody]) -> object:
        service = service_of(deps)
        body = call.body
        key = chains.resolve(body.chain, call.principal)
        op = to_user_operation(body.user_operation)
        with unavailable():
            done = await service.sponsor(
                account_of(call.principal), key, body.policy_id, op, body.entry_point
            )
        assert isinstance(done, Sponsored)
        return result_of(done)
