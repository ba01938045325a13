"""chaingate.aa against the real ERC-4337 contracts on the devnet (anvil, npm bytecode).

Every hash is compared with what the contract itself returns over eth_call, every address with
the factory's own ``getAddress``, and a sponsored operation built only with chaingate.aa goes
through ``handleOps`` — deploying its wallet — with the events it emits decoded back.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from chaingate.aa import accounts, calls, paymaster, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.rpc import DevnetRpc, RpcError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey
from tests.conftest import DEVNET_SIGNER

Devnet = tuple[AnvilProcess, Manifest]


@pytest.fixture(scope="module")
def devnet() -> Iterator[Devnet]:
    """A devnet of this module's own: its sponsored operations spend the paymasters' deposits,
    which the session devnet's own tests check."""
    with AnvilProcess() as node:
        yield (
            node,
            bootstrap_devnet(
                node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
            ),
        )


TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07", "0.8": "v08"}
CHAIN_ID = 31337
FAILED_OP = abi.selector("FailedOp(uint256,string)")


class NodeCaller:
    """The async ``call(method, params)`` learn_factory wants, over the devnet's sync client."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, params: Sequence[Any]) -> Any:
        with DevnetRpc(self.url) as rpc:
            return rpc.call(method, *params)


def eth_calls(url: str, to: str, calldatas: Sequence[bytes]) -> list[bytes]:
    with DevnetRpc(url) as rpc:
        replies = rpc.batch(
            [("eth_call", [{"to": to, "input": "0x" + data.hex()}, "latest"]) for data in calldatas]
        )
    return [bytes.fromhex(reply[2:]) for reply in replies]


def random_address() -> str:
    return checksum_address(secrets.token_bytes(20))


def random_op(version: Version, *, sponsored: bool) -> UserOperation:
    def some_bytes(limit: int) -> bytes:
        return secrets.token_bytes(secrets.randbelow(limit))

    def gas() -> int:
        return secrets.randbits(secrets.choice([16, 64, 128]))

    op = UserOperation(
        sender=random_address(),
        nonce=secrets.randbits(256),
        call_data=some_bytes(300),
        call_gas_limit=gas(),
        verification_gas_limit=gas(),
        pre_verification_gas=gas(),
        max_fee_per_gas=gas(),
        max_priority_fee_per_gas=gas(),
        signature=some_bytes(100),
    )
    if secrets.randbelow(2):
        op = op.with_(factory=random_address(), factory_data=some_bytes(100))
    if sponsored:
        op = op.with_(
            paymaster=random_address(),
            paymaster_verification_gas_limit=gas(),
            paymaster_post_op_gas_limit=gas(),
            paymaster_data=some_bytes(200),
        )
    return op


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_learn_factory_computes_what_get_address_returns(
    devnet: Devnet, version: Version
) -> None:
    node, manifest = devnet
    address = manifest.address(f"simple_account_factory_{TAGS[version]}")
    factory = await accounts.learn_factory(NodeCaller(node.url), address, version)
    assert factory.address == checksum_address(address) and factory.version == version
    probes = [(random_address(), secrets.randbits(256)) for _ in range(18)]
    probes += [(random_address(), 0), (random_address(), 2**256 - 1)]
    answers = eth_calls(
        node.url,
        address,
        [abi.encode_call("getAddress(address,uint256)", owner, salt) for owner, salt in probes],
    )
    for (owner, salt), answer in zip(probes, answers, strict=True):
        assert factory.account_address(owner, salt) == abi.decode(["address"], answer)[0]


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
def test_user_op_hash_equals_get_user_op_hash(devnet: Devnet, version: Version) -> None:
    node, manifest = devnet
    entry_point = manifest.address(f"entry_point_{TAGS[version]}")
    ops = [random_op(version, sponsored=i % 2 == 0) for i in range(12)]
    struct = userop.OP_TUPLE_TYPE[version]
    answers = eth_calls(
        node.url,
        entry_point,
        [abi.encode_call(f"getUserOpHash({struct})", userop.packed(op, version)) for op in ops],
    )
    for op, answer in zip(ops, answers, strict=True):
        assert userop.user_op_hash(
            op, entry_point=entry_point, chain_id=CHAIN_ID, version=version
        ) == (answer)


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
def test_verifying_paymaster_hash_equals_get_hash(devnet: Devnet, version: Version) -> None:
    node, manifest = devnet
    pm = manifest.address(f"verifying_paymaster_{TAGS[version]}")
    struct = userop.OP_TUPLE_TYPE[version]
    cases = []
    for _ in range(12):
        # getHash of v0.7 reads the gas limits out of paymasterAndData, so it needs a paymaster.
        op = random_op(version, sponsored=version != "0.6" or secrets.randbelow(2) == 1)
        cases.append((op, secrets.randbits(48), secrets.randbits(48)))
    answers = eth_calls(
        node.url,
        pm,
        [
            abi.encode_call(
                f"getHash({struct},uint48,uint48)", userop.packed(op, version), until, after
            )
            for op, until, after in cases
        ],
    )
    for (op, until, after), answer in zip(cases, answers, strict=True):
        got = paymaster.verifying_paymaster_hash(
            op,
            paymaster=pm,
            chain_id=CHAIN_ID,
            valid_until=until,
            valid_after=after,
            version=version,
        )
        assert got == answer


# --- a sponsored operation through handleOps --------------------------------------------------


def funded_bundler(rpc: DevnetRpc) -> str:
    """A fresh EOA of our own, so no other test's account nonces move."""
    bundler = random_address()
    rpc.call("anvil_setBalance", bundler, hex(10**18))
    rpc.call("anvil_impersonateAccount", bundler)
    return bundler


def build_op(
    rpc: DevnetRpc,
    manifest: Manifest,
    version: Version,
    factory: accounts.AccountFactory,
    owner: PrivateKey,
    signer: PrivateKey,
) -> tuple[UserOperation, bytes]:
    """A deploying, sponsored, owner-signed operation and its user op hash."""
    tag = TAGS[version]
    entry_point = manifest.address(f"entry_point_{tag}")
    pm = manifest.address(f"verifying_paymaster_{tag}")
    salt = secrets.randbits(256)
    sender = factory.account_address(owner.address, salt)
    targets = [random_address(), random_address()]
    if version == "0.6":
        call_data = abi.encode_call("execute(address,uint256,bytes)", targets[0], 0, b"\xc0\xde")
    elif version == "0.8":  # BaseAccount's Call[]
        call_data = abi.encode_call(
            "executeBatch((address,uint256,bytes)[])",
            [(targets[0], 0, b"\xc0\xde"), (targets[1], 0, b"")],
        )
    else:  # the empty value array: every call sends 0
        call_data = abi.encode_call(
            "executeBatch(address[],uint256[],bytes[])", targets, [], [b"\xc0\xde", b""]
        )
    assert [call.target for call in calls.decode_account_calls(call_data, version)] == (
        targets[:1] if version == "0.6" else targets
    )
    block = rpc.call("eth_getBlockByNumber", "latest", False)
    priority = 10**9
    nonce = abi.decode(
        ["uint256"],
        bytes.fromhex(
            rpc.call(
                "eth_call",
                {
                    "to": entry_point,
                    "input": "0x" + abi.encode_call("getNonce(address,uint192)", sender, 0).hex(),
                },
                "latest",
            )[2:]
        ),
    )[0]
    op = UserOperation(
        sender=sender,
        nonce=nonce,
        call_data=call_data,
        call_gas_limit=200_000,
        verification_gas_limit=1_000_000,
        pre_verification_gas=60_000,
        max_fee_per_gas=2 * int(block["baseFeePerGas"], 16) + priority,
        max_priority_fee_per_gas=priority,
        factory=factory.address,
        factory_data=factory.factory_data(owner.address, salt),
        paymaster_verification_gas_limit=200_000 if version != "0.6" else 0,
        paymaster_post_op_gas_limit=50_000 if version != "0.6" else 0,
    )
    op = paymaster.sponsor(
        op,
        signer,
        paymaster=pm,
        chain_id=CHAIN_ID,
        # The next block may be stamped with the wall clock, far after "latest" in a devnet
        # restored from its cached state.
        valid_until=max(int(block["timestamp"], 16), int(time.time())) + 3600,
        valid_after=0,
        version=version,
    )
    digest = userop.user_op_hash(op, entry_point=entry_point, chain_id=CHAIN_ID, version=version)
    signature = owner.sign_digest(accounts.owner_digest(digest, version))
    return op.with_(signature=signature), digest


def send(rpc: DevnetRpc, sender: str, to: str, data: bytes) -> dict[str, Any]:
    tx_hash = rpc.call(
        "eth_sendTransaction",
        {"from": sender, "to": to, "input": "0x" + data.hex(), "gas": hex(3_000_000)},
    )
    deadline = time.monotonic() + 10
    while (receipt := rpc.call("eth_getTransactionReceipt", tx_hash)) is None:
        assert time.monotonic() < deadline, "transaction not mined"
        time.sleep(0.02)  # automine mines just after answering
    result: dict[str, Any] = receipt
    return result


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_sponsored_operation_deploys_the_wallet_through_handle_ops(
    devnet: Devnet, version: Version
) -> None:
    node, manifest = devnet
    tag = TAGS[version]
    entry_point = manifest.address(f"entry_point_{tag}")
    pm = checksum_address(manifest.address(f"verifying_paymaster_{tag}"))
    factory = await accounts.learn_factory(
        NodeCaller(node.url), manifest.address(f"simple_account_factory_{tag}"), version
    )
    owner = PrivateKey.generate()
    with DevnetRpc(node.url) as rpc:
        op, digest = build_op(rpc, manifest, version, factory, owner, DEVNET_SIGNER)
        assert rpc.call("eth_getCode", op.sender, "latest") == "0x"
        bundler = funded_bundler(rpc)
        receipt = send(
            rpc, bundler, entry_point, userop.handle_ops_calldata([op], bundler, version)
        )
        assert receipt["status"] == "0x1"
        assert rpc.call("eth_getCode", op.sender, "latest") != "0x"
        if version == "0.6":  # the v0.6 paymaster counts what it sponsored for each sender
            (count,) = abi.decode(
                ["uint256"],
                eth_calls(node.url, pm, [abi.encode_call("senderNonce(address)", op.sender)])[0],
            )
            assert count == 1
            # ...and that count is part of the next hash it signs for the sender.
            struct = userop.OP_TUPLE_TYPE[version]
            (answer,) = eth_calls(
                node.url,
                pm,
                [
                    abi.encode_call(
                        f"getHash({struct},uint48,uint48)", userop.packed(op, version), 7, 3
                    )
                ],
            )
            assert answer == paymaster.verifying_paymaster_hash(
                op,
                paymaster=pm,
                chain_id=CHAIN_ID,
                valid_until=7,
                valid_after=3,
                version=version,
                sender_nonce=1,
            )
    logs = [log for log in receipt["logs"] if log["address"].lower() == entry_point.lower()]
    events = [
        userop.decode_user_operation_event(log["topics"], bytes.fromhex(log["data"][2:]))
        for log in logs
        if log["topics"][0] == userop.USER_OPERATION_EVENT
    ]
    deployed = [
        userop.decode_account_deployed(log["topics"], bytes.fromhex(log["data"][2:]))
        for log in logs
        if log["topics"][0] == userop.ACCOUNT_DEPLOYED
    ]
    assert len(events) == 1 and len(deployed) == 1
    event = events[0]
    assert event.success and event.user_op_hash == "0x" + digest.hex()
    assert (event.sender, event.paymaster, event.nonce) == (op.sender, pm, op.nonce)
    assert event.actual_gas_cost > 0 and event.actual_gas_used > 0
    assert deployed[0] == userop.AccountDeployed(
        user_op_hash="0x" + digest.hex(), sender=op.sender, factory=factory.address, paymaster=pm
    )


@pytest.mark.parametrize("version", ["0.6", "0.7", "0.8"])
async def test_paymaster_signature_by_another_key_fails_aa34(
    devnet: Devnet, version: Version
) -> None:
    node, manifest = devnet
    tag = TAGS[version]
    entry_point = manifest.address(f"entry_point_{tag}")
    factory = await accounts.learn_factory(
        NodeCaller(node.url), manifest.address(f"simple_account_factory_{tag}"), version
    )
    with DevnetRpc(node.url) as rpc:
        op, _ = build_op(
            rpc, manifest, version, factory, PrivateKey.generate(), PrivateKey.generate()
        )
        bundler = funded_bundler(rpc)
        calldata = userop.handle_ops_calldata([op], bundler, version)
        with pytest.raises(RpcError) as caught:
            rpc.call(
                "eth_call", {"from": bundler, "to": entry_point, "input": "0x" + calldata.hex()}
            )
        # anvil returns the revert data: FailedOp(opIndex, reason).
        error = caught.value.error
        data = error.get("data", "") if isinstance(error, dict) else ""
        assert data.startswith("0x" + FAILED_OP.hex()), error
        index, reason = abi.decode(["uint256", "string"], bytes.fromhex(data[10:]))
        assert (index, reason) == (0, "AA34 signature error")
        assert send(rpc, bundler, entry_point, calldata)["status"] == "0x0"
        assert rpc.call("eth_getCode", op.sender, "latest") == "0x"
