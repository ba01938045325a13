"""The bundler's strict ERC-7769 UserOperation parser and its encoder (no node needed)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler import rpcform
from chaingate.bundler.errors import BundlerFault
from chaingate.evm.addresses import checksum_address

UINT128 = 2**128 - 1
UINT256 = 2**256 - 1
addresses = st.binary(min_size=20, max_size=20).map(checksum_address)
some_bytes = st.binary(max_size=300)


@st.composite
def user_ops(draw: st.DrawFn, version: Version) -> UserOperation:
    gas_max = UINT256 if version == "0.6" else UINT128
    gas = st.integers(min_value=0, max_value=gas_max)
    op = UserOperation(
        sender=draw(addresses),
        nonce=draw(st.integers(min_value=0, max_value=UINT256)),
        call_data=draw(some_bytes),
        call_gas_limit=draw(gas),
        verification_gas_limit=draw(gas),
        pre_verification_gas=draw(st.integers(min_value=0, max_value=UINT256)),
        max_fee_per_gas=draw(gas),
        max_priority_fee_per_gas=draw(gas),
        signature=draw(some_bytes),
    )
    if draw(st.booleans()):
        op = op.with_(factory=draw(addresses), factory_data=draw(some_bytes))
    if draw(st.booleans()):
        pm_gas = st.integers(min_value=0, max_value=UINT128) if version == "0.7" else st.just(0)
        op = op.with_(
            paymaster=draw(addresses),
            paymaster_verification_gas_limit=draw(pm_gas),
            paymaster_post_op_gas_limit=draw(pm_gas),
            paymaster_data=draw(some_bytes),
        )
    return op


@settings(max_examples=300)
@given(st.data())
def test_parse_of_encode_is_the_operation(data: st.DataObject) -> None:
    version: Version = data.draw(st.sampled_from(["0.6", "0.7"]))
    op = data.draw(user_ops(version))
    encoded = rpcform.encode_user_operation(op, version)
    assert rpcform.parse_user_operation(encoded, version) == op
    # and the RPC form has exactly the version's field set
    if version == "0.6":
        assert len(encoded) == 11 and "initCode" in encoded and "factory" not in encoded


V06: dict[str, Any] = {
    "sender": "0x" + "11" * 20,
    "nonce": "0x0",
    "initCode": "0x",
    "callData": "0x",
    "callGasLimit": "0x5208",
    "verificationGasLimit": "0x186a0",
    "preVerificationGas": "0xc350",
    "maxFeePerGas": "0x3b9aca00",
    "maxPriorityFeePerGas": "0x3b9aca00",
    "paymasterAndData": "0x",
    "signature": "0x" + "ab" * 65,
}
V07: dict[str, Any] = {
    "sender": "0x" + "11" * 20,
    "nonce": "0x0",
    "factory": "0x" + "22" * 20,
    "factoryData": "0x1234",
    "callData": "0x",
    "callGasLimit": "0x5208",
    "verificationGasLimit": "0x186a0",
    "preVerificationGas": "0xc350",
    "maxFeePerGas": "0x3b9aca00",
    "maxPriorityFeePerGas": "0x3b9aca00",
    "paymaster": "0x" + "33" * 20,
    "paymasterVerificationGasLimit": "0x1",
    "paymasterPostOpGasLimit": "0x2",
    "paymasterData": "0x",
    "signature": "0x" + "ab" * 65,
}
BASE: dict[Version, dict[str, Any]] = {"0.6": V06, "0.7": V07}


def refused(obj: Any, version: Version, *, partial: bool = False) -> str:
    with pytest.raises(BundlerFault) as caught:
        rpcform.parse_user_operation(obj, version, partial=partial)
    assert caught.value.code == -32602
    return caught.value.message


def test_good_forms_parse() -> None:
    op6 = rpcform.parse_user_operation(V06, "0.6")
    assert op6.factory is None and op6.paymaster is None and op6.call_gas_limit == 21_000
    op7 = rpcform.parse_user_operation(V07, "0.7")
    assert op7.factory == checksum_address("0x" + "22" * 20)
    assert op7.factory_data == b"\x12\x34"
    assert (op7.paymaster_verification_gas_limit, op7.paymaster_post_op_gas_limit) == (1, 2)
    # padded quantities and null optional fields are accepted
    padded = {**V07, "nonce": "0x0000", "factory": None, "factoryData": None}
    assert rpcform.parse_user_operation(padded, "0.7").factory is None
    # v0.6 initCode / paymasterAndData split into the neutral fields
    split = {**V06, "initCode": "0x" + "22" * 20 + "beef", "paymasterAndData": "0x" + "33" * 21}
    op = rpcform.parse_user_operation(split, "0.6")
    assert (op.factory_data, op.paymaster_data) == (b"\xbe\xef", b"\x33")


@pytest.mark.parametrize(
    ("version", "change", "expected"),
    [
        ("0.6", {"initCode": None}, "userOp.initCode: missing"),
        ("0.6", {"signature": None}, "userOp.signature: missing"),
        ("0.7", {"callGasLimit": None}, "userOp.callGasLimit: missing"),
        ("0.7", {"nonce": 5}, "userOp.nonce: expected a quantity as a 0x-hex string, got int"),
        ("0.7", {"nonce": "5"}, "userOp.nonce: expected a quantity"),
        ("0.7", {"nonce": "0x"}, "userOp.nonce: an empty quantity"),
        ("0.7", {"nonce": "0xzz"}, "userOp.nonce: '0xzz' is not hex"),
        ("0.7", {"nonce": "0x" + "1" * 65}, "userOp.nonce: longer than 32 bytes"),
        ("0.7", {"callGasLimit": hex(2**128)}, "userOp.callGasLimit: does not fit uint128"),
        ("0.6", {"callData": "0x123"}, "userOp.callData: odd number of hex digits"),
        ("0.6", {"sender": "0x1234"}, "userOp.sender: an address is 20 bytes"),
        ("0.6", {"initCode": "0x1234"}, "userOp.initCode: shorter than a factory address"),
        ("0.6", {"paymasterAndData": "0x12"}, "userOp.paymasterAndData: shorter than"),
        ("0.6", {"factory": "0x" + "22" * 20}, "userOp.factory: a v0.7 field"),
        ("0.7", {"initCode": "0x"}, "userOp.initCode: a v0.6 field"),
        ("0.7", {"paymasterAndData": "0x"}, "userOp.paymasterAndData: a v0.6 field"),
        ("0.7", {"gasLimit": "0x1"}, "userOp.gasLimit: unknown field"),
        ("0.7", {"factory": None}, "userOp.factoryData: given without a factory"),
        ("0.7", {"paymaster": None}, "userOp.paymasterVerificationGasLimit: given without"),
        ("0.7", {"paymasterPostOpGasLimit": None}, "userOp.paymasterPostOpGasLimit: missing"),
        (
            "0.7",
            {"callData": "0x" + "00" * (rpcform.MAX_FIELD_BYTES + 1)},
            "userOp.callData: longer",
        ),
        (
            "0.7",
            {"sender": "0x" + "aB" * 20},
            "userOp.sender: bad EIP-55 checksum",
        ),
    ],
)
def test_bad_fields_are_named(version: Version, change: dict[str, Any], expected: str) -> None:
    obj = {**BASE[version], **change}  # null is the same as an absent field
    assert refused(obj, version).startswith(expected)


def test_not_an_object_and_unknown_version() -> None:
    assert refused([V06], "0.6") == "userOp: expected an object"
    with pytest.raises(ValueError, match="unknown EntryPoint version"):
        rpcform.parse_user_operation(V06, "0.9")  # type: ignore[arg-type]


def test_partial_form_for_estimation() -> None:
    bare = {"sender": V07["sender"], "nonce": "0x1", "callData": "0x"}
    op = rpcform.parse_user_operation(bare, "0.7", partial=True)
    assert (op.call_gas_limit, op.signature, op.max_fee_per_gas) == (0, b"", 0)
    assert refused(bare, "0.7").startswith("userOp.preVerificationGas: missing")
    # a paymaster without its limits is fine for estimation, not for sending
    with_pm = {**bare, "paymaster": V07["paymaster"], "paymasterData": "0xabcd"}
    assert rpcform.parse_user_operation(with_pm, "0.7", partial=True).paymaster is not None
    assert refused({**bare, "callData": None}, "0.7", partial=True).startswith(
        "userOp.callData: missing"
    )


def test_zero_paymaster_fields_without_paymaster_are_accepted() -> None:
    obj = {**V07, "paymaster": None, "paymasterVerificationGasLimit": "0x0"}
    obj.update(paymasterPostOpGasLimit="0x0", paymasterData="0x")
    assert rpcform.parse_user_operation(obj, "0.7").paymaster is None


def test_encoder_answers_the_v07_shape() -> None:
    op = rpcform.parse_user_operation(V07, "0.7")
    assert rpcform.encode_user_operation(op, "0.7") == {
        **V07,
        "sender": checksum_address(V07["sender"]),
        "factory": checksum_address(V07["factory"]),
        "paymaster": checksum_address(V07["paymaster"]),
    }
    bare = op.with_(factory=None, factory_data=b"", paymaster=None, paymaster_data=b"")
    bare = bare.with_(paymaster_verification_gas_limit=0, paymaster_post_op_gas_limit=0)
    assert set(rpcform.encode_user_operation(bare, "0.7")) == {
        "sender", "nonce", "callData", "callGasLimit", "verificationGasLimit",
        "preVerificationGas", "maxFeePerGas", "maxPriorityFeePerGas", "signature",
    }  # fmt: skip
