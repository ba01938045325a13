"""Bundler validation and estimation against the real EntryPoints on anvil (v0.6 and v0.7).

Operations are real SimpleAccount operations, signed by their owner (and by the devnet
paymaster's signer when sponsored); every verdict is the EntryPoint's own, read back through
chaingate.bundler.simulation; estimated limits are proven by sending the operation through
handleOps on the same anvil.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
import pytest

from chaingate.aa import accounts, paymaster, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler import estimation, sanity, simulation
from chaingate.bundler.errors import (
    EXECUTION_REVERTED,
    INVALID_SIGNATURE,
    PAYMASTER_BALANCE,
    SIMULATION_REJECTED,
    TIME_RANGE,
    BundlerFault,
)
from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey
from tests.conftest import DEVNET_SIGNER

Devnet = tuple[AnvilProcess, Manifest]
TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07"}
CHAIN_ID = 31337
VERSIONS: list[Version] = ["0.6", "0.7"]


@pytest.fixture(scope="module")
def devnet(module_devnet: Devnet) -> Devnet:
    """This module's own devnet, not the session's: its operations deploy accounts and spend
    the paymasters' deposits, which other modules check."""
    return module_devnet


class Node:
    """The bundler's node-client interface over anvil's HTTP endpoint (a real client)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: list[str] = []

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        self.calls.append(method)
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        async with httpx.AsyncClient(timeout=60) as client:
            reply = (await client.post(self.url, json=body)).json()
        if "error" in reply:
            error = reply["error"]
            raise RpcCallError(
                method, error.get("code", 0), error.get("message", ""), error.get("data")
            )
        return reply["result"]


def random_address() -> str:
    return checksum_address(secrets.token_bytes(20))


def word(reply: str) -> int:
    return int(reply, 16)


class Builder:
    """Real SimpleAccount operations for one EntryPoint version on the devnet."""

    def __init__(self, node: Node, manifest: Manifest, version: Version) -> None:
        self.node = node
        self.version = version
        tag = TAGS[version]
        self.entry_point = checksum_address(manifest.address(f"entry_point_{tag}"))
        self.paymaster = checksum_address(manifest.address(f"verifying_paymaster_{tag}"))
        self.factory_address = manifest.address(f"simple_account_factory_{tag}")
        self.factory: accounts.AccountFactory | None = None

    async def setup(self) -> Builder:
        self.factory = await accounts.learn_factory(self.node, self.factory_address, self.version)
        return self

    async def now(self) -> int:
        block = await self.node.call("eth_getBlockByNumber", ["latest", False])
        return max(word(block["timestamp"]), int(time.time()))

    async def fees(self) -> tuple[int, int]:
        block = await self.node.call("eth_getBlockByNumber", ["latest", False])
        priority = 10**9
        return 2 * word(block["baseFeePerGas"]) + priority, priority

    async def nonce(self, sender: str) -> int:
        reply = await self.node.call(
            "eth_call",
            [
                {
                    "to": self.entry_point,
                    "data": "0x" + abi.encode_call("getNonce(address,uint192)", sender, 0).hex(),
                },
                "latest",
            ],
        )
        return word(reply)

    def call_data(self, target: str, data: bytes = b"\xc0\xde") -> bytes:
        return abi.encode_call("execute(address,uint256,bytes)", target, 0, data)

    async def unsigned(
        self,
        owner: PrivateKey,
        *,
        call_data: bytes | None = None,
        fund: int = 0,
        gas: tuple[int, int, int] = (200_000, 1_000_000, 60_000),
    ) -> UserOperation:
        """A deploying operation of a fresh account of ``owner`` (``fund`` wei sent to it)."""
        assert self.factory is not None
        salt = secrets.randbits(64)
        sender = self.factory.account_address(owner.address, salt)
        if fund:
            await self.node.call("anvil_setBalance", [sender, hex(fund)])
        max_fee, priority = await self.fees()
        call_gas, verification_gas, pre_verification_gas = gas
        return UserOperation(
            sender=sender,
            nonce=await self.nonce(sender),
            call_data=self.call_data(random_address()) if call_data is None else call_data,
            call_gas_limit=call_gas,
            verification_gas_limit=verification_gas,
            pre_verification_gas=pre_verification_gas,
            max_fee_per_gas=max_fee,
            max_priority_fee_per_gas=priority,
            factory=self.factory.address,
            factory_data=self.factory.factory_data(owner.address, salt),
        )

    async def sponsored(
        self, op: UserOperation, signer: PrivateKey = DEVNET_SIGNER, *, valid_for: int = 3600
    ) -> UserOperation:
        if self.version == "0.7":
            op = op.with_(
                paymaster_verification_gas_limit=op.paymaster_verification_gas_limit or 200_000,
                paymaster_post_op_gas_limit=op.paymaster_post_op_gas_limit or 50_000,
            )
        return paymaster.sponsor(
            op,
            signer,
            paymaster=self.paymaster,
            chain_id=CHAIN_ID,
            valid_until=await self.now() + valid_for,
            valid_after=0,
            version=self.version,
        )

    def signed(self, op: UserOperation, owner: PrivateKey) -> UserOperation:
        digest = userop.user_op_hash(
            op, entry_point=self.entry_point, chain_id=CHAIN_ID, version=self.version
        )
        return op.with_(signature=owner.sign_digest(paymaster.eth_signed_message_hash(digest)))

    async def send_bundle(self, ops: Sequence[UserOperation]) -> dict[str, Any]:
        """handleOps by eth_sendTransaction from a funded, impersonated EOA; the receipt."""
        bundler = random_address()
        await self.node.call("anvil_setBalance", [bundler, hex(10**19)])
        await self.node.call("anvil_impersonateAccount", [bundler])
        data = userop.handle_ops_calldata(ops, bundler, self.version)
        tx_hash = await self.node.call(
            "eth_sendTransaction",
            [
                {
                    "from": bundler,
                    "to": self.entry_point,
                    "data": "0x" + data.hex(),
                    "gas": hex(5_000_000),
                }
            ],
        )
        deadline = time.monotonic() + 10
        while (receipt := await self.node.call("eth_getTransactionReceipt", [tx_hash])) is None:
            assert time.monotonic() < deadline, "transaction not mined"
        result: dict[str, Any] = receipt
        return result


@pytest.fixture
async def builders(devnet: Devnet) -> dict[Version, Builder]:
    node = Node(devnet[0].url)
    return {v: await Builder(node, devnet[1], v).setup() for v in VERSIONS}


async def simulate(b: Builder, op: UserOperation) -> simulation.ValidationResult:
    return await simulation.simulate_validation(b.node, op, b.entry_point, b.version, None)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_good_self_paid_operation_validates(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.unsigned(owner, fund=10**18), owner)
    result = await simulate(b, op)
    gas = op.call_gas_limit + op.verification_gas_limit + op.pre_verification_gas
    # v0.6 multiplies the verification limit by 3 when a paymaster is used; not here.
    assert result.prefund == gas * op.max_fee_per_gas
    assert 0 < result.pre_op_gas <= op.verification_gas_limit + op.pre_verification_gas
    assert not result.sig_failed and result.aggregator is None
    assert (result.valid_after, result.valid_until) == (0, simulation.UINT48_MAX)
    assert result.sender == result.factory == result.paymaster == simulation.StakeInfo(0, 0)
    assert result.paymaster_context == b""


@pytest.mark.parametrize("version", VERSIONS)
async def test_good_sponsored_operation_validates_with_paymaster_stake_and_time_range(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.sponsored(await b.unsigned(owner)), owner)
    until, after, _ = paymaster.decode_paymaster_data(op.paymaster_data)
    result = await simulate(b, op)
    assert (result.valid_after, result.valid_until) == (after, until)
    assert not result.sig_failed
    assert result.paymaster == simulation.StakeInfo(10**18, 86_400)
    assert result.prefund > 0
    if version == "0.7":
        assert result.paymaster_sig_failed is False and result.account_sig_failed is False
        # the raw word carries the paymaster's range, packed as _packValidationData does
        assert result.paymaster_validation_data == (after << 208) | (until << 160)
    # the second validation of a bundle of it passes too
    assert (
        await simulation.simulate_handle_ops(b.node, [op], b.entry_point, version, random_address())
        is None
    )


@pytest.mark.parametrize("version", VERSIONS)
async def test_signature_by_another_key_is_aa24(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.unsigned(owner, fund=10**18), PrivateKey.generate())
    with pytest.raises(BundlerFault) as caught:
        await simulate(b, op)
    assert caught.value.code == INVALID_SIGNATURE == -32507
    assert caught.value.reason == "AA24 signature error"
    assert caught.value.message.startswith("AA24")


@pytest.mark.parametrize("version", VERSIONS)
async def test_unfunded_sender_is_aa21(builders: dict[Version, Builder], version: Version) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.unsigned(owner), owner)
    with pytest.raises(BundlerFault) as caught:
        await simulate(b, op)
    assert caught.value.code == SIMULATION_REJECTED == -32500
    assert caught.value.reason == "AA21 didn't pay prefund"
    assert caught.value.data["opIndex"] == 0


@pytest.mark.parametrize("version", VERSIONS)
async def test_paymaster_signed_by_another_key_is_aa34(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.sponsored(await b.unsigned(owner), PrivateKey.generate()), owner)
    with pytest.raises(BundlerFault) as caught:
        await simulate(b, op)
    assert caught.value.code == INVALID_SIGNATURE
    assert caught.value.reason == "AA34 signature error"


@pytest.mark.parametrize("version", VERSIONS)
async def test_paymaster_expiring_too_soon_is_a_time_range_error(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.sponsored(await b.unsigned(owner), valid_for=10), owner)
    with pytest.raises(BundlerFault) as caught:
        await simulate(b, op)
    assert caught.value.code == TIME_RANGE == -32503
    assert "expires too soon" in caught.value.message


@pytest.mark.parametrize("version", VERSIONS)
async def test_bundle_second_validation_names_the_failing_index(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owners = [PrivateKey.generate() for _ in range(3)]
    good = [b.signed(await b.unsigned(o, fund=10**18), o) for o in owners[:2]]
    bad = b.signed(await b.unsigned(owners[2]), owners[2])  # unfunded
    failed = await simulation.simulate_handle_ops(
        b.node, [good[0], bad, good[1]], b.entry_point, version, random_address()
    )
    assert failed is not None
    assert (failed.index, failed.reason, failed.code) == (1, "AA21 didn't pay prefund", -32500)


async def test_paymaster_deposit_too_low_is_aa31(builders: dict[Version, Builder]) -> None:
    """A paymaster with code but no deposit: AA31, the paymaster-balance code."""
    b = builders["0.7"]
    poor = random_address()
    code = await b.node.call("eth_getCode", [b.paymaster, "latest"])
    await b.node.call("anvil_setCode", [poor, code])
    owner = PrivateKey.generate()
    op = (await b.unsigned(owner)).with_(
        paymaster=poor,
        paymaster_verification_gas_limit=200_000,
        paymaster_post_op_gas_limit=50_000,
        paymaster_data=paymaster.paymaster_data_stub(0, 0),
    )
    with pytest.raises(BundlerFault) as caught:
        await simulate(b, b.signed(op, owner))
    assert caught.value.code == PAYMASTER_BALANCE
    assert caught.value.reason.startswith("AA31")


def test_decode_validation_turns_other_revert_data_into_32500() -> None:
    data = abi.selector("Error(string)") + abi.encode(["string"], ["boom"])
    for version in VERSIONS:
        with pytest.raises(BundlerFault) as caught:
            simulation.decode_validation(version, data, True)
        assert caught.value.code == -32500 and "boom" in caught.value.message
    with pytest.raises(BundlerFault):
        simulation.decode_validation("0.7", b"\x01\x02", False)
    with pytest.raises(BundlerFault):
        simulation.decode_validation("0.6", b"", False)


def test_parse_validation_data_packing() -> None:
    aggregator = int(random_address(), 16)
    parsed = simulation.parse_validation_data((7 << 208) | (9 << 160) | aggregator)
    assert (parsed.aggregator, parsed.valid_after, parsed.valid_until) == (aggregator, 7, 9)
    assert simulation.parse_validation_data(1).valid_until == simulation.UINT48_MAX


# --- estimation ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("sponsored", "work"), [(False, False), (True, False), (False, True)])
async def test_estimated_limits_pass_handle_ops_for_an_undeployed_account(
    builders: dict[Version, Builder], version: Version, sponsored: bool, work: bool
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = await b.unsigned(owner, fund=0 if sponsored else 10**18, gas=(0, 0, 0))
    if work:  # a call that writes storage: the account deposits to the EntryPoint for itself
        op = op.with_(
            call_data=abi.encode_call(
                "execute(address,uint256,bytes)",
                b.entry_point,
                10**15,
                abi.encode_call("depositTo(address)", op.sender),
            )
        )
    if sponsored:  # estimation with the paymaster's stub data, as ERC-7677 clients do
        op = op.with_(
            paymaster=b.paymaster,
            paymaster_data=paymaster.paymaster_data_stub(await b.now() + 3600, 0),
        )
    estimate = await estimation.estimate_gas(b.node, op, b.entry_point, version, None)
    assert 40_000 < estimate.pre_verification_gas < 60_000
    assert 100_000 < estimate.verification_gas_limit < 1_000_000
    assert 9_100 <= estimate.call_gas_limit < (100_000 if work else 30_000)
    final = op.with_(
        pre_verification_gas=estimate.pre_verification_gas,
        verification_gas_limit=estimate.verification_gas_limit,
        call_gas_limit=estimate.call_gas_limit,
    )
    if version == "0.7" and sponsored:
        assert estimate.paymaster_verification_gas_limit
        # the VerifyingPaymaster returns no context: the EntryPoint never calls its postOp
        assert estimate.paymaster_post_op_gas_limit == 0
        final = final.with_(
            paymaster_verification_gas_limit=estimate.paymaster_verification_gas_limit,
            paymaster_post_op_gas_limit=estimate.paymaster_post_op_gas_limit,
        )
    else:
        assert estimate.paymaster_verification_gas_limit is None or version == "0.6"
    if sponsored:
        final = await b.sponsored(final)
    final = b.signed(final, owner)
    await sanity.check(b.node, final, b.entry_point, version, sanity.SanityLimits())
    await simulate(b, final)  # the estimate passes sanity and validation...
    receipt = await b.send_bundle([final])  # ...and handleOps on chain
    assert receipt["status"] == "0x1"
    events = [
        userop.decode_user_operation_event(log["topics"], bytes.fromhex(log["data"][2:]))
        for log in receipt["logs"]
        if log["topics"][0] == userop.USER_OPERATION_EVENT
    ]
    assert len(events) == 1 and events[0].success and events[0].sender == op.sender
    assert await b.node.call("eth_getCode", [op.sender, "latest"]) != "0x"


@pytest.mark.parametrize("version", VERSIONS)
async def test_estimation_of_a_reverting_call_is_execution_reverted(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    # The account calls the EntryPoint's depositTo with value it does not have: it reverts.
    # Simpler and certain: call the account's own execute from itself -> "account: not
    # Owner or EntryPoint"
    call = abi.encode_call(
        "execute(address,uint256,bytes)",
        b.entry_point,
        0,
        abi.encode_call("withdrawTo(address,uint256)", random_address(), 10**30),
    )
    op = await b.unsigned(owner, call_data=call, fund=10**18, gas=(0, 0, 0))
    with pytest.raises(BundlerFault) as caught:
        await estimation.estimate_gas(b.node, op, b.entry_point, version, None)
    assert caught.value.code == EXECUTION_REVERTED == -32521
    assert "Withdraw amount too large" in caught.value.message


# --- sanity ----------------------------------------------------------------------------------


def sane_refusal(op: UserOperation, version: Version, **limits: Any) -> BundlerFault:
    with pytest.raises(BundlerFault) as caught:
        sanity.check_static(op, version, sanity.SanityLimits(**limits))
    return caught.value


@pytest.mark.parametrize("version", VERSIONS)
async def test_sanity_refuses_before_touching_the_node(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.unsigned(owner, fund=10**18), owner)
    sanity.check_static(op, version, sanity.SanityLimits())  # the builder's op is sane
    cases = {
        "verificationGasLimit": op.with_(verification_gas_limit=5_000_001),  # the DoS cap
        "callGasLimit": op.with_(call_gas_limit=9_099),
        "preVerificationGas": op.with_(pre_verification_gas=30_000),
        "maxPriorityFeePerGas": op.with_(max_priority_fee_per_gas=10),
    }
    for field, bad in cases.items():
        fault = sane_refusal(bad, version, min_priority_fee=100)
        assert fault.code == -32602 and fault.message.startswith(f"userOp.{field}: "), fault
    big = op.with_(call_data=bytes(70_000))
    assert sane_refusal(big, version).message.startswith("userOp.callData: the operation is")
    # the async check refuses a DoS op without a single node call
    calls = len(b.node.calls)
    with pytest.raises(BundlerFault):
        await sanity.check(
            b.node, cases["verificationGasLimit"], b.entry_point, version, sanity.SanityLimits()
        )
    assert len(b.node.calls) == calls


@pytest.mark.parametrize("version", VERSIONS)
async def test_sanity_against_chain_state(
    builders: dict[Version, Builder], version: Version
) -> None:
    b = builders[version]
    owner = PrivateKey.generate()
    op = b.signed(await b.unsigned(owner, fund=10**18), owner)
    limits = sanity.SanityLimits()
    await sanity.check(b.node, op, b.entry_point, version, limits)
    # deploy it: then its initCode is refused (AA10), and its spent nonce (AA25)
    assert (await b.send_bundle([op]))["status"] == "0x1"
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(b.node, op, b.entry_point, version, limits)
    assert caught.value.reason == "AA10" and caught.value.code == -32602
    deployed = op.with_(factory=None, factory_data=b"")
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(b.node, deployed, b.entry_point, version, limits)
    assert caught.value.reason == "AA25" and caught.value.message.startswith("userOp.nonce:")
    await sanity.check(b.node, deployed.with_(nonce=op.nonce + 1), b.entry_point, version, limits)
    # an undeployed sender without a factory (AA20); a factory without code
    fresh = await b.unsigned(PrivateKey.generate())
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(
            b.node, fresh.with_(factory=None, factory_data=b""), b.entry_point, version, limits
        )
    assert caught.value.reason == "AA20"
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(
            b.node, fresh.with_(factory=random_address()), b.entry_point, version, limits
        )
    assert "no contract at the factory" in caught.value.message
    # a paymaster with no code (AA30); fees under the base fee
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(
            b.node, fresh.with_(paymaster=random_address()), b.entry_point, version, limits
        )
    assert caught.value.reason == "AA30"
    with pytest.raises(BundlerFault) as caught:
        await sanity.check(
            b.node,
            fresh.with_(max_fee_per_gas=fresh.max_priority_fee_per_gas),
            b.entry_point,
            version,
            sanity.SanityLimits(base_fee_percent=10_000),
        )
    assert caught.value.message.startswith("userOp.maxFeePerGas: ")


def test_sanity_paymaster_deposit_below_prefund_is_32508() -> None:
    op = UserOperation(
        sender=random_address(),
        nonce=0,
        call_data=b"",
        call_gas_limit=100_000,
        verification_gas_limit=100_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=10,
        max_priority_fee_per_gas=1,
        paymaster=random_address(),
    )
    prefund = sanity.required_prefund(op, "0.6")
    assert prefund == (100_000 + 3 * 100_000 + 50_000) * 10
    state: dict[str, Any] = {
        "base_fee": 1,
        "sender_has_code": True,
        "factory_has_code": None,
        "paymaster_has_code": True,
        "on_chain_nonce": 0,
    }
    sanity.check_state(op, "0.6", sanity.SanityLimits(), paymaster_deposit=prefund, **state)
    with pytest.raises(BundlerFault) as caught:
        sanity.check_state(op, "0.6", sanity.SanityLimits(), paymaster_deposit=prefund - 1, **state)
    assert caught.value.code == PAYMASTER_BALANCE == -32508


def test_the_override_goes_on_the_wire_as_it_is() -> None:
    """``wire_override`` gives a msgspec client the shipped code as JSON text encoded once: the
    request's bytes are the plain override's; a client that is not msgspec's gets it plain."""
    op = UserOperation(
        sender=random_address(),
        nonce=0,
        call_data=b"\x01",
        call_gas_limit=1,
        verification_gas_limit=2,
        pre_verification_gas=3,
        max_fee_per_gas=4,
        max_priority_fee_per_gas=5,
    )
    for version in ("0.7", "0.8"):
        ep = userop.CANONICAL_ENTRY_POINTS[version]
        tx, override = simulation.validation_call(
            op, ep, version, simulation.simulations_for(version)
        )
        assert override is not None
        wire = simulation.wire_override(ChainClient, override)
        assert any(isinstance(f["code"], msgspec.Raw) for f in wire.values())
        plain = msgspec.json.encode([tx, "latest", override])
        assert msgspec.json.encode([tx, "latest", wire]) == plain
        assert simulation.wire_override(object(), override) is override
