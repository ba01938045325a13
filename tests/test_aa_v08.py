"""EntryPoint v0.8 and EIP-7702, sans I/O, against clients nobody here wrote (eth-account and
eth-abi): the typed userOpHash, authorizations, type-4 transactions, the RPC form's
``eip7702Auth`` and v0.8's ``executeBatch(Call[])``."""

from __future__ import annotations

import eth_abi
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.typed_transactions import TypedTransaction
from hexbytes import HexBytes

from chaingate.aa import calls, userop
from chaingate.aa.userop import UserOperation
from chaingate.bundler import rpcform
from chaingate.bundler.errors import BundlerFault
from chaingate.evm.addresses import checksum_address
from chaingate.evm.eip7702 import Authorization, delegate_of, designator, sign_authorization
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey
from chaingate.evm.tx import Eip7702, decode_raw, tx_hash

KEY = PrivateKey(bytes.fromhex("11" * 32))
ENTRY_POINT = userop.CANONICAL_ENTRY_POINTS["0.8"]
DELEGATE = "0xe6Cae83BdE06E4c305530e199D7217f42808555B"
CHAIN = 31337


def op(**changes: object) -> UserOperation:
    base = UserOperation(
        sender=KEY.address,
        nonce=7,
        call_data=b"\x12\x34",
        call_gas_limit=100_000,
        verification_gas_limit=200_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=3 * 10**9,
        max_priority_fee_per_gas=10**9,
        signature=b"\x01" * 65,
        paymaster="0x00000000000000000000000000000000000000Aa",
        paymaster_verification_gas_limit=60_000,
        paymaster_post_op_gas_limit=1,
        paymaster_data=b"\xee\xff",
    )
    return base.with_(**changes)


def typed_data(o: UserOperation, init_code: bytes) -> dict[str, object]:
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "PackedUserOperation": [
                {"name": "sender", "type": "address"},
                {"name": "nonce", "type": "uint256"},
                {"name": "initCode", "type": "bytes"},
                {"name": "callData", "type": "bytes"},
                {"name": "accountGasLimits", "type": "bytes32"},
                {"name": "preVerificationGas", "type": "uint256"},
                {"name": "gasFees", "type": "bytes32"},
                {"name": "paymasterAndData", "type": "bytes"},
            ],
        },
        "primaryType": "PackedUserOperation",
        "domain": {
            "name": "ERC4337",
            "version": "1",
            "chainId": CHAIN,
            "verifyingContract": ENTRY_POINT,
        },
        "message": {
            "sender": o.sender,
            "nonce": o.nonce,
            "initCode": init_code,
            "callData": o.call_data,
            "accountGasLimits": userop.account_gas_limits(o),
            "preVerificationGas": o.pre_verification_gas,
            "gasFees": userop.gas_fees(o),
            "paymasterAndData": o.paymaster_and_data("0.8"),
        },
    }


def eip712_hash(o: UserOperation, init_code: bytes) -> bytes:
    signable = encode_typed_data(full_message=typed_data(o, init_code))
    return keccak256(b"\x19" + signable.version + signable.header + signable.body)


def test_the_v08_hash_is_eip712_typed_data() -> None:
    plain = op()
    assert userop.user_op_hash(
        plain, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8"
    ) == eip712_hash(plain, b"")
    factory = "0x13E9ed32155810FDbd067D4522C492D6f68E5944"
    deploying = plain.with_(factory=factory, factory_data=b"\xab" * 5)
    assert userop.user_op_hash(
        deploying, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8"
    ) == eip712_hash(deploying, deploying.init_code)
    # ...and not v0.7's hash of the same fields.
    assert userop.user_op_hash(
        plain, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8"
    ) != userop.user_op_hash(plain, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.7")


def test_an_eip7702_init_code_hashes_the_delegate_in_its_place() -> None:
    for marker in (userop.EIP7702_SHORT, userop.EIP7702_FACTORY):
        marked = op(factory=marker)
        assert marked.eip7702_init and not marked.deploys
        with pytest.raises(ValueError, match="delegate"):
            userop.user_op_hash(marked, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8")
        on_chain = userop.user_op_hash(
            marked, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8", delegate=DELEGATE
        )
        assert on_chain == eip712_hash(marked, bytes.fromhex(DELEGATE[2:]))
        auth = sign_authorization(KEY, chain_id=CHAIN, address=DELEGATE, nonce=0)
        carried = marked.with_(eip7702_auth=auth)
        assert (
            userop.user_op_hash(carried, entry_point=ENTRY_POINT, chain_id=CHAIN, version="0.8")
            == on_chain
        )
    # The two-byte marker round-trips to two bytes of initCode (what a client signed).
    assert op(factory=userop.EIP7702_SHORT).init_code == bytes.fromhex("7702")
    assert userop.from_init_code(bytes.fromhex("7702")) == (userop.EIP7702_SHORT, b"")


def test_authorizations_match_eth_account() -> None:
    ours = sign_authorization(KEY, chain_id=CHAIN, address=DELEGATE, nonce=5)
    theirs = Account.sign_authorization(
        {"chainId": CHAIN, "address": DELEGATE, "nonce": 5}, KEY.hex()
    )
    assert (ours.y_parity, ours.r, ours.s) == (theirs.y_parity, theirs.r, theirs.s)
    assert ours.authority() == KEY.address == checksum_address(bytes(theirs.authority))
    assert ours.signing_hash() == bytes(theirs.authorization_hash)
    wrong = Authorization(
        chain_id=CHAIN, address=DELEGATE, nonce=6, y_parity=ours.y_parity, r=ours.r, s=ours.s
    )
    assert wrong.authority() != KEY.address  # another nonce: another signer
    with pytest.raises(ValueError, match="lower half"):
        Authorization(
            chain_id=CHAIN, address=DELEGATE, nonce=5, y_parity=0, r=1, s=(1 << 256) - 1
        ).authority()
    assert delegate_of(designator(DELEGATE)) == DELEGATE
    assert delegate_of(b"\x60\x80" * 12) is None


def test_a_type4_bundle_is_what_eth_account_signs() -> None:
    auth = sign_authorization(
        PrivateKey(bytes.fromhex("22" * 32)), chain_id=0, address=DELEGATE, nonce=3
    )
    tx = Eip7702(
        chain_id=CHAIN,
        nonce=9,
        max_priority_fee_per_gas=10**9,
        max_fee_per_gas=5 * 10**9,
        gas=700_000,
        to=ENTRY_POINT,
        data=b"\xca\xfe",
        authorizations=(auth,),
    )
    raw = tx.sign(KEY)
    signed = Account.sign_transaction(
        {
            "type": 4,
            "chainId": CHAIN,
            "nonce": 9,
            "maxPriorityFeePerGas": 10**9,
            "maxFeePerGas": 5 * 10**9,
            "gas": 700_000,
            "to": ENTRY_POINT,
            "value": 0,
            "data": "0xcafe",
            "accessList": [],
            "authorizationList": [
                {
                    "chainId": 0,
                    "address": DELEGATE,
                    "nonce": 3,
                    "yParity": auth.y_parity,
                    "r": auth.r,
                    "s": auth.s,
                }
            ],
        },
        KEY.hex(),
    )
    assert raw == bytes(signed.raw_transaction)
    assert tx_hash(raw) == "0x" + bytes(signed.hash).hex()
    assert TypedTransaction.from_bytes(HexBytes(raw)).hash() == tx.signing_hash()
    decoded = decode_raw(raw)
    assert (decoded.kind, decoded.sender, decoded.nonce) == (4, KEY.address, 9)
    with pytest.raises(ValueError, match="at least one authorization"):
        Eip7702(
            chain_id=CHAIN, nonce=0, max_priority_fee_per_gas=1, max_fee_per_gas=1, gas=1,
            to=ENTRY_POINT,
        ).sign(KEY)  # fmt: skip


AUTH_FORM = {
    "chainId": "0x7a69",
    "address": DELEGATE,
    "nonce": "0x0",
    "yParity": "0x1",
    "r": "0x" + "12" * 32,
    "s": "0x" + "34" * 32,
}
V08 = {
    "sender": KEY.address,
    "nonce": "0x0",
    "callData": "0x",
    "callGasLimit": "0x186a0",
    "verificationGasLimit": "0x30d40",
    "preVerificationGas": "0xc350",
    "maxFeePerGas": "0x1",
    "maxPriorityFeePerGas": "0x1",
    "signature": "0x",
}


def refused(form: object) -> str:
    with pytest.raises(BundlerFault) as caught:
        rpcform.parse_user_operation(form, "0.8")
    return caught.value.message


def test_the_rpc_form_carries_the_authorization() -> None:
    parsed = rpcform.parse_user_operation({**V08, "eip7702Auth": AUTH_FORM}, "0.8")
    assert parsed.eip7702_auth == Authorization(
        chain_id=31337, address=DELEGATE, nonce=0, y_parity=1, r=int("12" * 32, 16),
        s=int("34" * 32, 16),
    )  # fmt: skip
    encoded = rpcform.encode_user_operation(parsed, "0.8")
    assert encoded["eip7702Auth"] == {**AUTH_FORM, "r": hex(parsed.eip7702_auth.r)}
    assert rpcform.parse_user_operation(encoded, "0.8") == parsed
    marker = rpcform.parse_user_operation({**V08, "factory": "0x7702"}, "0.8")
    assert marker.factory == userop.EIP7702_SHORT
    assert rpcform.encode_user_operation(marker, "0.8")["factory"] == "0x7702"
    assert refused({**V08, "eip7702Auth": {**AUTH_FORM, "yParity": "0x2"}}).startswith(
        "userOp.eip7702Auth.yParity"
    )
    assert refused({**V08, "eip7702Auth": {**AUTH_FORM, "extra": "0x1"}}).startswith(
        "userOp.eip7702Auth.extra: unknown field"
    )
    bare = {k: v for k, v in AUTH_FORM.items() if k != "nonce"}
    assert refused({**V08, "eip7702Auth": bare}) == "userOp.eip7702Auth.nonce: missing"
    assert refused({**V08, "eip7702Auth": "0x12"}).startswith("userOp.eip7702Auth: expected")
    with pytest.raises(BundlerFault, match=r"a v0\.8 field"):
        rpcform.parse_user_operation({**V08, "eip7702Auth": AUTH_FORM}, "0.7")


def test_v08_execute_batch_decodes_calls() -> None:
    targets = ["0x" + "11" * 20, "0x" + "22" * 20]
    data = eth_abi.encode(
        ["(address,uint256,bytes)[]"],
        [[(targets[0], 5, b"\xaa\xbb\xcc\xdd\x01"), (targets[1], 0, b"")]],
    )
    decoded = calls.decode_account_calls(calls.EXECUTE_BATCH_V08 + data, "0.8")
    assert [(c.target.lower(), c.value, c.data) for c in decoded] == [
        (targets[0], 5, b"\xaa\xbb\xcc\xdd\x01"),
        (targets[1], 0, b""),
    ]
    with pytest.raises(calls.CallDataError):
        calls.decode_account_calls(calls.EXECUTE_BATCH_V08 + data[:-40], "0.8")
    with pytest.raises(calls.CallDataError, match=r"v0\.7"):
        calls.decode_account_calls(calls.EXECUTE_BATCH_V08 + data, "0.7")
