"""EntryPoint v0.8 and EIP-7702 senders through the bundler, end to end: a real gateway on a
real devnet (anvil on Prague, the npm 0.8.0 EntryPoint, SimpleAccountFactory and
Simple7702Account), safe and unsafe mode.  EIP-7702 authorizations are signed by eth-account
(a signer nobody here wrote); the bundle that carries one is a type-4 transaction."""

from __future__ import annotations

from typing import Any

from eth_account import Account

from chaingate.aa import accounts
from chaingate.aa.userop import UserOperation, user_op_hash
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.eip7702 import Authorization, delegate_of
from chaingate.evm.keys import PrivateKey
from tests.test_bundler_e2e import GWEI, Bundler, bundler, sponsored_op  # noqa: F401

CHAIN_ID = 31337


def authorize(
    key: PrivateKey, delegate: str, nonce: int, chain_id: int = CHAIN_ID
) -> Authorization:
    """``key``'s EIP-7702 authorization, signed by eth-account."""
    signed = Account.sign_authorization(
        {"chainId": chain_id, "address": delegate, "nonce": nonce}, key.hex()
    )
    return Authorization(
        chain_id=chain_id,
        address=delegate,
        nonce=nonce,
        y_parity=signed.y_parity,
        r=signed.r,
        s=signed.s,
    )


def eoa_op(
    b: Bundler, key: PrivateKey, *, auth: Authorization | None, nonce: int = 0
) -> UserOperation:
    """A Simple7702Account operation of ``key``'s own EOA, paying its own prefund: it sends
    1 wei to a fixed address."""
    entry_point = b.manifest.address("entry_point_v08")
    with DevnetRpc(b.node.url) as rpc:
        block = rpc.call("eth_getBlockByNumber", "latest", False)
    op = UserOperation(
        sender=key.address,
        nonce=nonce,
        call_data=abi.encode_call(
            "execute(address,uint256,bytes)", "0x000000000000000000000000000000000000dEaD", 1, b""
        ),
        call_gas_limit=60_000,
        verification_gas_limit=150_000,
        pre_verification_gas=100_000,
        max_fee_per_gas=2 * int(block["baseFeePerGas"], 16) + GWEI,
        max_priority_fee_per_gas=GWEI,
        eip7702_auth=auth,
    )
    digest = user_op_hash(op, entry_point=entry_point, chain_id=CHAIN_ID, version="0.8")
    return op.with_(signature=key.sign_digest(accounts.owner_digest(digest, "0.8")))


async def send(b: Bundler, op: UserOperation) -> dict[str, Any]:
    entry_point = b.manifest.address("entry_point_v08")
    return await b.call("eth_sendUserOperation", encode_user_operation(op, "0.8"), entry_point)


async def test_the_devnet_serves_three_entry_points(bundler: Bundler) -> None:
    supported = await bundler.result("eth_supportedEntryPoints")
    assert supported == [
        bundler.manifest.address(f"entry_point_{tag}") for tag in ("v06", "v07", "v08")
    ]
    assert supported[2] == "0x4337084D9E255Ff0702461CF8895CE9E3b5Ff108"


async def test_a_v08_simple_account_deploys_sponsored(bundler: Bundler) -> None:
    entry_point = bundler.manifest.address("entry_point_v08")
    op, expected = await sponsored_op(bundler, "0.8")
    sent = await bundler.result(
        "eth_sendUserOperation", encode_user_operation(op, "0.8"), entry_point
    )
    assert sent == expected
    receipt = await bundler.receipt(sent)
    assert receipt["success"] is True and receipt["entryPoint"] == entry_point
    assert receipt["paymaster"] == bundler.manifest.address("verifying_paymaster_v08")
    by_hash = await bundler.result("eth_getUserOperationByHash", sent)
    assert by_hash["userOperation"] == encode_user_operation(op, "0.8")


async def test_an_eip7702_account_delegates_in_its_first_operation(bundler: Bundler) -> None:
    delegate = bundler.manifest.address("simple_7702_account_v08")
    key = PrivateKey.generate()
    with DevnetRpc(bundler.node.url) as rpc:
        rpc.call("anvil_setBalance", key.address, hex(10**18))
    first = eoa_op(bundler, key, auth=authorize(key, delegate, 0))
    sent = await send(bundler, first)
    assert "result" in sent, sent
    receipt = await bundler.receipt(sent["result"])
    assert receipt["success"] is True and receipt["sender"] == key.address
    # The bundle was a type-4 transaction carrying the authorization; the EOA is delegated.
    with DevnetRpc(bundler.node.url) as rpc:
        tx = rpc.call("eth_getTransactionByHash", receipt["receipt"]["transactionHash"])
        code = rpc.call("eth_getCode", key.address, "latest")
    assert tx["type"] == "0x4" and len(tx["authorizationList"]) == 1
    assert delegate_of(bytes.fromhex(code[2:])) == delegate
    by_hash = await bundler.result("eth_getUserOperationByHash", sent["result"])
    assert by_hash["userOperation"]["eip7702Auth"]["address"] == delegate
    # The next one needs no authorization: the delegation is on chain (a plain bundle).
    second = await send(bundler, eoa_op(bundler, key, auth=None, nonce=1))
    assert "result" in second, second
    receipt = await bundler.receipt(second["result"])
    with DevnetRpc(bundler.node.url) as rpc:
        tx = rpc.call("eth_getTransactionByHash", receipt["receipt"]["transactionHash"])
    assert receipt["success"] is True and tx["type"] == "0x2"


async def test_a_bad_authorization_is_refused_naming_it(bundler: Bundler) -> None:
    delegate = bundler.manifest.address("simple_7702_account_v08")
    key = PrivateKey.generate()
    with DevnetRpc(bundler.node.url) as rpc:
        rpc.call("anvil_setBalance", key.address, hex(10**18))
    cases = {
        "signed by": authorize(PrivateKey.generate(), delegate, 0),
        "next account nonce": authorize(key, delegate, 3),
        "neither 0 nor": authorize(key, delegate, 0, chain_id=5),
    }
    for words, auth in cases.items():
        reply = await send(bundler, eoa_op(bundler, key, auth=auth))
        assert reply["error"]["code"] == -32602, reply
        assert "eip7702Auth" in reply["error"]["message"] and words in reply["error"]["message"]
    # Without an authorization an undelegated EOA has no code: AA20.
    reply = await send(bundler, eoa_op(bundler, key, auth=None))
    assert reply["error"]["code"] == -32602 and "AA20" in reply["error"]["message"], reply
    # A chain id of 0 is valid everywhere.
    reply = await send(bundler, eoa_op(bundler, key, auth=authorize(key, delegate, 0, chain_id=0)))
    assert "result" in reply, reply


async def test_an_eip7702_operation_is_estimated_with_a_stub_authorization(
    bundler: Bundler,
) -> None:
    delegate = bundler.manifest.address("simple_7702_account_v08")
    key = PrivateKey.generate()
    with DevnetRpc(bundler.node.url) as rpc:
        rpc.call("anvil_setBalance", key.address, hex(10**18))
    # viem's stub: a signature that recovers nobody in particular.
    stub = Authorization(
        chain_id=CHAIN_ID,
        address=delegate,
        nonce=0,
        y_parity=1,
        r=int("fffffffffffffffffffffffffffffff000000000000000000000000000000000", 16),
        s=int("7aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 16),
    )
    op = eoa_op(bundler, key, auth=stub)
    form = encode_user_operation(op, "0.8")
    estimate = await bundler.result(
        "eth_estimateUserOperationGas", form, bundler.manifest.address("entry_point_v08")
    )
    assert int(estimate["verificationGasLimit"], 16) > 10_000
    assert int(estimate["callGasLimit"], 16) >= 9_100
    # The authorization's 25,000 of intrinsic gas is in preVerificationGas.
    plain = encode_user_operation(op.with_(eip7702_auth=None), "0.8")
    assert (
        int(estimate["preVerificationGas"], 16)
        >= 25_000 + int((await _pvg_without_auth(bundler, plain)), 16) - 200
    )


async def _pvg_without_auth(b: Bundler, form: dict[str, Any]) -> str:
    """preVerificationGas the formula gives the same operation without an authorization: the
    sender's code overridden is not needed for this part, so it is read off a v0.7 twin."""
    from chaingate.bundler.estimation import pre_verification_gas_bound
    from chaingate.bundler.rpcform import parse_user_operation

    return hex(pre_verification_gas_bound(parse_user_operation(form, "0.8", partial=True), "0.8"))


def test_an_eip7702_init_code_hashes_as_the_entry_point_does(
    module_devnet: Any,
) -> None:
    """The 0x7702 marker: getUserOpHash reads the sender's delegate from its code."""
    node, manifest = module_devnet
    entry_point = manifest.address("entry_point_v08")
    delegate = manifest.address("simple_7702_account_v08")
    key = PrivateKey.generate()
    op = UserOperation(
        sender=key.address,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=2,
        pre_verification_gas=3,
        max_fee_per_gas=4,
        max_priority_fee_per_gas=5,
        factory="0x7702",
    )
    with DevnetRpc(node.url) as rpc:
        rpc.call("anvil_setCode", key.address, "0xef0100" + delegate[2:].lower())
        from chaingate.aa.userop import OP_TUPLE_TYPE, packed

        call = abi.encode_call(f"getUserOpHash({OP_TUPLE_TYPE['0.8']})", packed(op, "0.8"))
        answer = rpc.call("eth_call", {"to": entry_point, "input": "0x" + call.hex()}, "latest")
    ours = user_op_hash(
        op, entry_point=entry_point, chain_id=CHAIN_ID, version="0.8", delegate=delegate
    )
    assert "0x" + ours.hex() == answer
