"""ERC-7677 paymaster web service methods, on ``/v1/bundler/{chain}/{network}``.

``pm_getPaymasterStubData(userOp, entryPoint, chainId, context)`` and
``pm_getPaymasterData(...)``, with ``context`` = ``{"policyId": "gp_..."}`` (Pimlico's
``sponsorshipPolicyId`` is accepted too), so viem's ``createPaymasterClient`` and
permissionless.js work unchanged:

* stub data: the policy is evaluated (a dry run: nothing signed or reserved) and, if it would
  sponsor, paymaster fields of the final length with a dummy signature, for gas estimation;
* data: the real sponsorship — every rule, the spend reserved, the VerifyingPaymaster hash
  signed over the operation exactly as sent (its paymaster gas limits included).

The operation must carry its ``factory``/``initCode`` when the wallet is not deployed: the
answer holds only paymaster fields, so an initCode filled in here would be signed and lost.

Both methods need the scope REST ``POST /v1/gas/sponsor`` needs (``SPONSOR_SCOPE``,
``gas:manage``) beside the endpoint's ``bundler:send``: the stub data reveals what a policy
would sponsor, the data spends its budget — one rule at both doors.  Without it: -32002 with
``data: {"status": 403, "code": "forbidden"}``, as a scope refusal inside JSON-RPC reads
elsewhere (WebSocket calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from chaingate.aa.paymaster import paymaster_data_stub
from chaingate.aa.userop import (
    EIP7702_SHORT,
    UserOperation,
    Version,
    from_init_code,
    from_paymaster_and_data,
    packs_gas,
)
from chaingate.config.network import Network
from chaingate.evm.addresses import checksum_address
from chaingate.evm.eip7702 import Authorization, parse_authorization
from chaingate.rpc.local import INTERNAL_ERROR, INVALID_PARAMS, LocalRpc, RpcFault
from chaingate.wallets.model import (
    SPONSOR_SCOPE,
    Evaluation,
    InvalidOperation,
    PolicyRefused,
    Sponsored,
    account_of,
)
from chaingate.wallets.network import Unavailable, WalletNetwork


class Sponsor(Protocol):
    """What the methods need of the wallet service (``WalletService``)."""

    @property
    def networks(self) -> Mapping[Network, WalletNetwork]: ...

    async def sponsor(
        self,
        account_id: str,
        key: Network,
        policy_id: str,
        op: UserOperation,
        entry_point: str | None,
        *,
        dry_run: bool = False,
        fill_init_code: bool = True,
    ) -> Sponsored | Evaluation: ...


# A refusal by the policy: an application error (JSON-RPC leaves -32000..-32099 to servers).
POLICY_REFUSED = -32001
UNAVAILABLE = -32002
MAX_HEX = 2 + 2 * 24 * 1024  # the REST plane's bound on bytes fields (api.types.HexData)


class RpcUserOperation(msgspec.Struct, rename="camel"):
    """A UserOperation as ERC-7769 clients send it (v0.6, v0.7 and v0.8 fields; all hex)."""

    sender: str
    nonce: str = "0x0"
    call_data: str = "0x"
    call_gas_limit: str = "0x0"
    verification_gas_limit: str = "0x0"
    pre_verification_gas: str = "0x0"
    max_fee_per_gas: str = "0x0"
    max_priority_fee_per_gas: str = "0x0"
    init_code: str | None = None
    factory: str | None = None
    factory_data: str | None = None
    paymaster_and_data: str | None = None
    paymaster: str | None = None
    paymaster_verification_gas_limit: str | None = None
    paymaster_post_op_gas_limit: str | None = None
    paymaster_data: str | None = None
    signature: str | None = None
    eip7702_auth: dict[str, Any] | None = None


def _quantity(name: str, value: str | None, bits: int = 256) -> int:
    if value is None:
        return 0
    if not isinstance(value, str) or not value.startswith("0x") or not 3 <= len(value) <= 66:
        raise RpcFault(INVALID_PARAMS, f"userOp.{name}: expected a 0x-hex quantity")
    try:
        number = int(value, 16)
    except ValueError:
        raise RpcFault(INVALID_PARAMS, f"userOp.{name}: expected a 0x-hex quantity") from None
    if number >= 1 << bits:
        raise RpcFault(INVALID_PARAMS, f"userOp.{name}: does not fit uint{bits}")
    return number


def _data(name: str, value: str | None) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str) or not value.startswith("0x") or len(value) > MAX_HEX:
        raise RpcFault(INVALID_PARAMS, f"userOp.{name}: expected 0x-hex bytes")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise RpcFault(INVALID_PARAMS, f"userOp.{name}: expected 0x-hex bytes") from None


def _address(name: str, value: str) -> str:
    try:
        raw = _data(name, value)
        if len(raw) != 20:
            raise ValueError
        return checksum_address(raw)
    except (ValueError, RpcFault):
        raise RpcFault(INVALID_PARAMS, f"{name}: expected an address") from None


def to_user_operation(raw: RpcUserOperation, version: Version) -> UserOperation:
    factory: str | None = None
    if raw.factory and raw.factory.lower() == EIP7702_SHORT:
        factory = EIP7702_SHORT
    elif raw.factory:
        factory = _address("userOp.factory", raw.factory)
    factory_data = _data("factoryData", raw.factory_data)
    if raw.init_code and raw.init_code != "0x":
        try:
            factory, factory_data = from_init_code(_data("initCode", raw.init_code))
        except ValueError as exc:
            raise RpcFault(INVALID_PARAMS, f"userOp.initCode: {exc}") from None
    pm_verification = _quantity(
        "paymasterVerificationGasLimit", raw.paymaster_verification_gas_limit, 128
    )
    pm_post_op = _quantity("paymasterPostOpGasLimit", raw.paymaster_post_op_gas_limit, 128)
    if packs_gas(version) and raw.paymaster_and_data:  # a packed form, from some clients
        try:
            _, pm_verification, pm_post_op, _ = from_paymaster_and_data(
                _data("paymasterAndData", raw.paymaster_and_data), version
            )
        except ValueError:
            pass  # a stub of another shape: the limits of the fields, else the defaults
    return UserOperation(
        sender=_address("userOp.sender", raw.sender),
        nonce=_quantity("nonce", raw.nonce),
        call_data=_data("callData", raw.call_data),
        call_gas_limit=_quantity("callGasLimit", raw.call_gas_limit, 128),
        verification_gas_limit=_quantity("verificationGasLimit", raw.verification_gas_limit, 128),
        pre_verification_gas=_quantity("preVerificationGas", raw.pre_verification_gas, 128),
        max_fee_per_gas=_quantity("maxFeePerGas", raw.max_fee_per_gas, 128),
        max_priority_fee_per_gas=_quantity(
            "maxPriorityFeePerGas", raw.max_priority_fee_per_gas, 128
        ),
        factory=factory,
        factory_data=factory_data,
        paymaster_verification_gas_limit=pm_verification,
        paymaster_post_op_gas_limit=pm_post_op,
        eip7702_auth=_authorization(raw.eip7702_auth),
    )


def _authorization(value: dict[str, Any] | None) -> Authorization | None:
    if value is None:
        return None
    try:
        return parse_authorization(value)
    except ValueError as exc:
        raise RpcFault(INVALID_PARAMS, f"userOp.{exc}") from None


def _require_sponsor_scope(method: str, principal: object) -> None:
    scopes: frozenset[str] = getattr(principal, "scopes", frozenset())
    if SPONSOR_SCOPE not in scopes:
        raise RpcFault(
            UNAVAILABLE,
            f"{method} needs the {SPONSOR_SCOPE} scope (as POST /v1/gas/sponsor): this key "
            "lacks it",
            {"status": 403, "code": "forbidden", "scope": SPONSOR_SCOPE},
        )


class Erc7677:
    """The two methods for one network, registered on its ``LocalRpc``."""

    def __init__(self, service: Sponsor, key: Network) -> None:
        self.service = service
        self.key = key

    def register(self, rpc: LocalRpc, costs: dict[str, int]) -> None:
        rpc.register("pm_getPaymasterStubData", self.stub_data, costs["pm_getPaymasterStubData"])
        rpc.register("pm_getPaymasterData", self.data, costs["pm_getPaymasterData"])

    def _params(self, params: object) -> tuple[RpcUserOperation, str, Version, str]:
        if not isinstance(params, list) or len(params) < 3:
            raise RpcFault(INVALID_PARAMS, "expected [userOperation, entryPoint, chainId, context]")
        net = self.service.networks.get(self.key)
        if net is None:
            raise RpcFault(UNAVAILABLE, f"smart wallets are off for {self.key}")
        try:
            op = msgspec.convert(params[0], RpcUserOperation)
        except msgspec.ValidationError as exc:
            raise RpcFault(INVALID_PARAMS, f"userOperation: {exc}") from None
        entry_point = params[1]
        version = net.version_of_entry_point(entry_point) if isinstance(entry_point, str) else None
        if version is None:
            known = ", ".join(f"{ep} (v{v})" for v, ep in net.entry_points.items())
            raise RpcFault(INVALID_PARAMS, f"entryPoint: not one of {self.key}'s ({known})")
        chain_id = params[2]
        if net.chain_id is not None and _quantity("chainId", chain_id, 64) != net.chain_id:
            raise RpcFault(INVALID_PARAMS, f"chainId: {self.key} is chain {hex(net.chain_id)}")
        context = params[3] if len(params) > 3 else None
        policy = None
        if isinstance(context, dict):
            policy = context.get("policyId") or context.get("sponsorshipPolicyId")
        if not isinstance(policy, str) or not 1 <= len(policy) <= 64:
            raise RpcFault(INVALID_PARAMS, 'context: expected {"policyId": "gp_..."}')
        return op, str(net.entry_points[version]), version, policy

    async def _sponsor(
        self, given: tuple[RpcUserOperation, str, Version, str], principal: object, *, dry_run: bool
    ) -> object:
        raw, entry_point, version, policy = given
        op = to_user_operation(raw, version)
        try:
            return await self.service.sponsor(
                account_of(principal),
                self.key,
                policy,
                op,
                entry_point,
                dry_run=dry_run,
                fill_init_code=False,
            )
        except PolicyRefused as exc:
            refusal = exc.refusal
            raise RpcFault(
                POLICY_REFUSED,
                f"gas policy {exc.policy_id or policy} refuses: rule {refusal.rule}: "
                f"{refusal.message}",
                {"rule": refusal.rule, "policyId": policy, "retryAfter": refusal.retry_after},
            ) from None
        except InvalidOperation as exc:
            raise RpcFault(INVALID_PARAMS, str(exc)) from None
        except LookupError:
            raise RpcFault(INVALID_PARAMS, f"context.policyId: no gas policy {policy}") from None
        except Unavailable as exc:
            raise RpcFault(UNAVAILABLE, str(exc)) from None
        except ValueError as exc:
            raise RpcFault(INTERNAL_ERROR, f"cannot sponsor this operation: {exc}") from None

    async def stub_data(self, params: object, principal: object) -> object:
        _require_sponsor_scope("pm_getPaymasterStubData", principal)
        given = self._params(params)
        outcome = await self._sponsor(given, principal, dry_run=True)
        assert isinstance(outcome, Evaluation)
        if outcome.refusal is not None:
            refusal = outcome.refusal
            raise RpcFault(
                POLICY_REFUSED,
                f"gas policy refuses: rule {refusal.rule}: {refusal.message}",
                {"rule": refusal.rule, "retryAfter": refusal.retry_after},
            )
        net = self.service.networks[self.key]
        version = outcome.version or net.settings.default_version
        paymaster = net.paymasters.get(version)
        if paymaster is None:
            raise RpcFault(UNAVAILABLE, f"no v{version} paymaster is configured for {self.key}")
        stub = paymaster_data_stub(0, 0)
        if version == "0.6":
            return {"paymasterAndData": "0x" + bytes.fromhex(paymaster[2:]).hex() + stub.hex()}
        raw = given[0]
        verification = _quantity(
            "paymasterVerificationGasLimit", raw.paymaster_verification_gas_limit, 128
        )
        post_op = _quantity("paymasterPostOpGasLimit", raw.paymaster_post_op_gas_limit, 128)
        return {
            "paymaster": paymaster,
            "paymasterData": "0x" + stub.hex(),
            "paymasterVerificationGasLimit": hex(
                verification or net.settings.paymaster_verification_gas
            ),
            "paymasterPostOpGasLimit": hex(post_op or net.settings.paymaster_post_op_gas),
            "isFinal": False,
        }

    async def data(self, params: object, principal: object) -> object:
        _require_sponsor_scope("pm_getPaymasterData", principal)
        done = await self._sponsor(self._params(params), principal, dry_run=False)
        assert isinstance(done, Sponsored)
        if done.version == "0.6":
            return {"paymasterAndData": "0x" + done.op.paymaster_and_data("0.6").hex()}
        return {"paymaster": done.paymaster, "paymasterData": "0x" + done.op.paymaster_data.hex()}
