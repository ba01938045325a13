"""The bundler's JSON-RPC methods (ERC-7769) on ``/v1/bundler/{chain}/{network}``.

Parameters are checked strictly and refused with -32602 naming what is wrong; results have
the shapes ERC-7769 gives (hex quantities, checksummed addresses).  Beyond the spec, two
methods answer what users of other bundlers ask when an operation was "accepted but never
bundled": ``chaingate_getUserOperationStatus(hash)`` and
``chaingate_getPendingUserOperations(sender)``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from chaingate.aa.userop import (
    OP_TUPLE_TYPE,
    UserOperation,
    Version,
    from_init_code,
    from_paymaster_and_data,
    require_version,
)
from chaingate.bundler.errors import INVALID_PARAMS, BundlerFault
from chaingate.bundler.estimation import estimate_gas
from chaingate.bundler.mempool import Entry
from chaingate.bundler.network import BundlerNetwork
from chaingate.bundler.receiptstore import ReceiptRow
from chaingate.bundler.rpcform import address_param, encode_user_operation, parse_user_operation
from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.rpc.errors import UpstreamError
from chaingate.rpc.local import Handler, LocalRpc, RpcFault

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")  # a set test: clients poll receipts often


class _ReceiptHead(msgspec.Struct):
    blockHash: object = None  # the node's field name


_receipt_head = msgspec.json.Decoder(_ReceiptHead | None).decode


def _block_hash(receipt: msgspec.Raw) -> str | None:
    """A transaction receipt's blockHash, lower case; None when the node gave no receipt
    (or not an object)."""
    try:
        head = _receipt_head(receipt)
    except msgspec.DecodeError:
        return None
    return str(head.blockHash).lower() if head is not None and head.blockHash else None


def _params(params: object, least: int, most: int, shape: str) -> list[Any]:
    if not isinstance(params, list) or not least <= len(params) <= most:
        raise BundlerFault(INVALID_PARAMS, f"params: expected {shape}")
    return params


def _hash(params: object) -> str:
    """The one userOpHash parameter; -32602 with the reference bundler's words otherwise."""
    value = params[0] if isinstance(params, list) and len(params) == 1 else None
    if (
        not isinstance(value, str)
        or len(value) != 66
        or value[:2] not in ("0x", "0X")
        or not _HEX_DIGITS.issuperset(value[2:])
    ):
        raise BundlerFault(
            INVALID_PARAMS,
            "Missing/invalid userOpHash: params: expected [userOpHash], 32 bytes as 0x-hex",
        )
    return "0x" + value[2:].lower()


class BundlerMethods:
    """One network's handlers, registered on its ``LocalRpc``."""

    def __init__(self, net: BundlerNetwork, *, debug: bool) -> None:
        self.net = net
        self.debug = debug

    def register(self, rpc: LocalRpc, costs: dict[str, int]) -> None:
        methods: dict[str, Handler] = {
            "eth_sendUserOperation": self.send,
            "eth_estimateUserOperationGas": self.estimate,
            "eth_getUserOperationByHash": self.by_hash,
            "eth_getUserOperationReceipt": self.receipt,
            "eth_supportedEntryPoints": self.supported,
            "eth_chainId": self.chain_id,
            "chaingate_getUserOperationStatus": self.status,
            "chaingate_getPendingUserOperations": self.pending,
        }
        if self.debug:
            from chaingate.bundler.debug import DebugMethods

            methods.update(DebugMethods(self.net).methods())
        for name, handler in methods.items():
            rpc.register(name, self._ready(name, _node_errors(name, handler)), costs[name])

    def _ready(self, method: str, handler: Handler) -> Handler:
        """Every method waits for the chain id (learned from the upstreams when the config
        gives none): hashes and bundles depend on it."""

        async def guarded(params: object, principal: object) -> object:
            if self.net.chain_id is None:
                raise RpcFault(
                    UNAVAILABLE,
                    f"{method}: the bundler of {self.net.key} is waiting for an upstream to "
                    "answer eth_chainId (or set the network's chain_id)",
                )
            return await handler(params, principal)

        return guarded

    def _op(self, raw: object, entry_point: object) -> tuple[UserOperation, str, Version]:
        version = self.net.version_of(entry_point)
        address = self.net.entry_points[version]
        return parse_user_operation(raw, version), address, version

    # --- ERC-7769 --------------------------------------------------------------------------

    async def send(self, params: object, principal: object) -> object:
        raw, entry_point = _params(params, 2, 2, "[userOperation, entryPoint]")
        op, address, version = self._op(raw, entry_point)
        return await self.net.accept(op, address, version)

    async def estimate(self, params: object, principal: object) -> object:
        args = _params(params, 2, 3, "[userOperation, entryPoint, stateOverride?]")
        version = self.net.version_of(args[1])
        address = self.net.entry_points[version]
        op = parse_user_operation(args[0], version, partial=True)
        if len(args) > 2 and args[2] not in (None, {}):
            raise BundlerFault(INVALID_PARAMS, "stateOverride is not supported by this bundler")
        estimate = await estimate_gas(
            self.net.client, op, address, version, self.net.admission.simulations_code
        )
        answer = {
            "preVerificationGas": hex(estimate.pre_verification_gas),
            "verificationGasLimit": hex(estimate.verification_gas_limit),
            "callGasLimit": hex(estimate.call_gas_limit),
        }
        if version == "0.7" and op.paymaster is not None:
            answer["paymasterVerificationGasLimit"] = hex(
                estimate.paymaster_verification_gas_limit or 0
            )
            answer["paymasterPostOpGasLimit"] = hex(estimate.paymaster_post_op_gas_limit or 0)
        return answer

    async def by_hash(self, params: object, principal: object) -> object:
        user_op_hash = _hash(params)
        net = self.net
        row = await net.store.receipt(net.chain, net.network, user_op_hash)
        if row is None or not await self._still_canonical(row):
            return None  # ERC-7769: null until included (see chaingate_getUserOperationStatus)
        version = net.version_of(row.entry_point)
        op = await self._included_op(user_op_hash, row, version)
        if op is None:
            return None
        return {
            "userOperation": encode_user_operation(op, version),
            "entryPoint": checksum_address(row.entry_point),
            "blockNumber": hex(row.block_number),
            "blockHash": row.block_hash,
            "transactionHash": row.tx_hash,
        }

    async def _still_canonical(self, row: ReceiptRow) -> bool:
        """The receipt's block is still the node's (between a reorg and the follower's
        Revert the store may still name an orphaned one)."""
        block = await self.net.client.call("eth_getBlockByNumber", [hex(row.block_number), False])
        return bool(block) and str(block.get("hash", "")).lower() == row.block_hash

    async def _included_op(
        self, user_op_hash: str, row: ReceiptRow, version: Version
    ) -> UserOperation | None:
        """Ours from the mempool or the store; another bundler's from its transaction."""
        net = self.net
        entry = net.mempool.get(user_op_hash) or await net.store.bundler_get(
            net.chain, net.network, user_op_hash
        )
        if entry is not None:
            return entry.op
        tx = await net.client.call("eth_getTransactionByHash", [row.tx_hash])
        if not tx or not isinstance(tx.get("input"), str):
            return None
        for op in _ops_of_handle_ops(bytes.fromhex(tx["input"][2:]), version):
            if net.admission.user_op_hash(op, row.entry_point, version) == user_op_hash:
                return op
        return None

    async def receipt(self, params: object, principal: object) -> object:
        net = self.net
        row = await net.store.receipt(net.chain, net.network, _hash(params))
        if row is None:
            return None
        # The node's receipt goes to the caller as the node wrote it (msgspec.Raw): only its
        # blockHash is read here.
        tx_receipt = await net.client.call_raw("eth_getTransactionReceipt", [row.tx_hash])
        if _block_hash(tx_receipt) != row.block_hash:
            # A reorg took the block away and the follower has not seen it yet: as far as
            # the caller can tell, not included (yet).
            return None
        return {
            "userOpHash": row.user_op_hash,
            "entryPoint": checksum_address(row.entry_point),
            "sender": checksum_address(row.sender),
            "nonce": hex(row.nonce),
            "paymaster": checksum_address(row.paymaster),
            "actualGasCost": hex(row.actual_gas_cost),
            "actualGasUsed": hex(row.actual_gas_used),
            "success": row.success,
            "reason": row.reason or "0x",  # ERC-7769: bytes, empty when the call did not revert
            "logs": msgspec.Raw(row.logs),  # a JSON array as the receipt store wrote it
            "receipt": tx_receipt,
        }

    async def supported(self, params: object, principal: object) -> object:
        _params(params, 0, 0, "[]")
        return list(self.net.entry_points.values())

    async def chain_id(self, params: object, principal: object) -> object:
        _params(params, 0, 0, "[]")
        return hex(self.net.chain_id or 0)

    # --- beyond the spec -------------------------------------------------------------------

    async def status(self, params: object, principal: object) -> object:
        user_op_hash = _hash(params)
        net = self.net
        row = await net.store.receipt(net.chain, net.network, user_op_hash)
        if row is not None:
            return {
                "status": "included",
                "transactionHash": row.tx_hash,
                "blockNumber": hex(row.block_number),
                "blockHash": row.block_hash,
                "success": row.success,
                "reason": None,
            }
        entry = net.mempool.get(user_op_hash) or await net.store.bundler_get(
            net.chain, net.network, user_op_hash
        )
        if entry is None:
            return {"status": "not_found", "transactionHash": None, "reason": None}
        # An entry the store says included whose receipt the follower has not written yet
        # (or took back in a reorg) is still on its way.
        status = "submitted" if entry.status == "included" else entry.status
        return {
            "status": status,
            "transactionHash": entry.bundle_tx,
            "reason": entry.reason,
        }

    async def pending(self, params: object, principal: object) -> object:
        (value,) = _params(params, 1, 1, "[sender]")
        sender = address_param(value, "sender")
        return [_pending_view(e) for e in self.net.mempool.by_sender(sender)]


# The node failed, not the caller: a server error, with what the node said (never a
# traceback).  -32002 as ERC-7677's methods on the same endpoint answer "not available".
UNAVAILABLE = -32002


def _node_errors(method: str, handler: Handler) -> Handler:
    async def guarded(params: object, principal: object) -> object:
        try:
            return await handler(params, principal)
        except RpcCallError as exc:
            hint = ""
            if exc.method == "debug_traceCall":
                hint = " (safe mode needs debug_traceCall with JS tracers; see [bundler] safe_mode)"
            raise RpcFault(
                UNAVAILABLE, f"{method}: the node refused {exc.method}: {exc.message[:200]}{hint}"
            ) from None
        except UpstreamError as exc:
            raise RpcFault(UNAVAILABLE, f"{method}: no node answered ({exc})") from None

    return guarded


def _pending_view(entry: Entry) -> dict[str, Any]:
    return {
        "userOpHash": entry.hash,
        "entryPoint": checksum_address(entry.entry_point),
        "status": entry.status,
        "nonce": hex(entry.nonce),
        "transactionHash": entry.bundle_tx,
        "submittedAt": entry.submitted_at,
        "userOperation": encode_user_operation(entry.op, entry.version),
    }


def _ops_of_handle_ops(calldata: bytes, version: Version) -> list[UserOperation]:
    """The operations of a ``handleOps(ops, beneficiary)`` call (empty if it is not one)."""
    version = require_version(version)
    selector = abi.selector(f"handleOps({OP_TUPLE_TYPE[version]}[],address)")
    if calldata[:4] != selector:
        return []
    try:
        ops, _ = abi.decode([f"{OP_TUPLE_TYPE[version]}[]", "address"], calldata[4:])
    except ValueError:
        return []
    out = []
    for fields in ops:
        if version == "0.6":
            (sender, nonce, init, call, cgl, vgl, pvg, mfee, mtip, pmd, sig) = fields
        else:
            (sender, nonce, init, call, limits, pvg, fees, pmd, sig) = fields
            vgl, cgl = int.from_bytes(limits[:16], "big"), int.from_bytes(limits[16:], "big")
            mtip, mfee = int.from_bytes(fees[:16], "big"), int.from_bytes(fees[16:], "big")
        factory, factory_data = from_init_code(init)
        paymaster, pm_verification, pm_post_op, pm_data = from_paymaster_and_data(pmd, version)
        out.append(
            UserOperation(
                sender=checksum_address(sender),
                nonce=nonce,
                call_data=call,
                call_gas_limit=cgl,
                verification_gas_limit=vgl,
                pre_verification_gas=pvg,
                max_fee_per_gas=mfee,
                max_priority_fee_per_gas=mtip,
                signature=sig,
                factory=factory,
                factory_data=factory_data,
                paymaster=paymaster,
                paymaster_verification_gas_limit=pm_verification,
                paymaster_post_op_gas_limit=pm_post_op,
                paymaster_data=pm_data,
            )
        )
    return out


__all__ = ["BundlerMethods"]
