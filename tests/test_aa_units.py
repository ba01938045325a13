"""The sans-IO ERC-4337 primitives in chaingate.aa, checked against code we did not write.

Reference hashes are recomputed here from the Solidity definitions with ``eth_abi`` and
``eth_utils.keccak``; paymaster signatures are recovered by ``eth_account``; callData is encoded
by ``eth_abi``.  The contracts themselves check the same things on a real chain in
tests/test_aa_devnet.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from eth_abi import encode as eth_encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import keccak, to_checksum_address
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaingate.aa import accounts, calls, paymaster, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.devnet.artifacts import aa_artifacts
from chaingate.evm import abi
from chaingate.evm.keys import PrivateKey

VERSIONS: tuple[Version, ...] = ("0.6", "0.7")
UINT128 = 2**128 - 1

addresses = st.binary(min_size=20, max_size=20).map(to_checksum_address)
gas = st.integers(min_value=0, max_value=UINT128)
small_bytes = st.binary(max_size=200)


@st.composite
def user_ops(draw: st.DrawFn, *, with_paymaster: bool | None = None) -> UserOperation:
    has_factory = draw(st.booleans())
    has_paymaster = draw(st.booleans()) if with_paymaster is None else with_paymaster
    return UserOperation(
        sender=draw(addresses),
        nonce=draw(st.integers(min_value=0, max_value=2**256 - 1)),
        call_data=draw(small_bytes),
        call_gas_limit=draw(gas),
        verification_gas_limit=draw(gas),
        pre_verification_gas=draw(gas),
        max_fee_per_gas=draw(gas),
        max_priority_fee_per_gas=draw(gas),
        signature=draw(small_bytes),
        factory=draw(addresses) if has_factory else None,
        factory_data=draw(small_bytes) if has_factory else b"",
        paymaster=draw(addresses) if has_paymaster else None,
        paymaster_verification_gas_limit=draw(gas) if has_paymaster else 0,
        paymaster_post_op_gas_limit=draw(gas) if has_paymaster else 0,
        paymaster_data=draw(small_bytes) if has_paymaster else b"",
    )


# --- reference implementations, from the Solidity sources ------------------------------------


def ref_init_code(op: UserOperation) -> bytes:
    return bytes.fromhex(op.factory[2:]) + op.factory_data if op.factory else b""


def ref_paymaster_and_data(op: UserOperation, version: str) -> bytes:
    if op.paymaster is None:
        return b""
    gas_limits = b""
    if version == "0.7":
        gas_limits = op.paymaster_verification_gas_limit.to_bytes(
            16, "big"
        ) + op.paymaster_post_op_gas_limit.to_bytes(16, "big")
    return bytes.fromhex(op.paymaster[2:]) + gas_limits + op.paymaster_data


def ref_pair(high: int, low: int) -> bytes:
    return (high << 128 | low).to_bytes(32, "big")


def ref_user_op_hash(op: UserOperation, entry_point: str, chain_id: int, version: str) -> bytes:
    pnd = ref_paymaster_and_data(op, version)
    if version == "0.6":  # UserOperationLib.pack (v0.6)
        inner = keccak(
            eth_encode(
                ["address", "uint256", "bytes32", "bytes32"] + ["uint256"] * 5 + ["bytes32"],
                [
                    op.sender,
                    op.nonce,
                    keccak(ref_init_code(op)),
                    keccak(op.call_data),
                    op.call_gas_limit,
                    op.verification_gas_limit,
                    op.pre_verification_gas,
                    op.max_fee_per_gas,
                    op.max_priority_fee_per_gas,
                    keccak(pnd),
                ],
            )
        )
    else:  # UserOperationLib.encode (v0.7)
        inner = keccak(
            eth_encode(
                [
                    "address",
                    "uint256",
                    "bytes32",
                    "bytes32",
                    "bytes32",
                    "uint256",
                    "bytes32",
                    "bytes32",
                ],
                [
                    op.sender,
                    op.nonce,
                    keccak(ref_init_code(op)),
                    keccak(op.call_data),
                    ref_pair(op.verification_gas_limit, op.call_gas_limit),
                    op.pre_verification_gas,
                    ref_pair(op.max_priority_fee_per_gas, op.max_fee_per_gas),
                    keccak(pnd),
                ],
            )
        )
    return keccak(eth_encode(["bytes32", "address", "uint256"], [inner, entry_point, chain_id]))


V06_STRUCT = "(address,uint256,bytes,bytes,uint256,uint256,uint256,uint256,uint256,bytes,bytes)"


def ref_paymaster_hash(
    op: UserOperation,
    pm: str,
    chain_id: int,
    until: int,
    after: int,
    version: str,
    sender_nonce: int = 0,
) -> bytes:
    if version == "0.6":
        # VerifyingPaymaster.pack: the struct's calldata up to paymasterAndData's length word.
        struct = (
            op.sender,
            op.nonce,
            ref_init_code(op),
            op.call_data,
            op.call_gas_limit,
            op.verification_gas_limit,
            op.pre_verification_gas,
            op.max_fee_per_gas,
            op.max_priority_fee_per_gas,
            ref_paymaster_and_data(op, version),
            op.signature,
        )
        encoded = eth_encode([V06_STRUCT], [struct])[32:]  # drop the outer offset word
        pack = encoded[: int.from_bytes(encoded[9 * 32 : 10 * 32], "big")]
        return keccak(
            eth_encode(
                ["bytes", "uint256", "address", "uint256", "uint48", "uint48"],
                [pack, chain_id, pm, sender_nonce, until, after],
            )
        )
    return keccak(
        eth_encode(
            [
                "address",
                "uint256",
                "bytes32",
                "bytes32",
                "bytes32",
                "uint256",
                "uint256",
                "bytes32",
                "uint256",
                "address",
                "uint48",
                "uint48",
            ],
            [
                op.sender,
                op.nonce,
                keccak(ref_init_code(op)),
                keccak(op.call_data),
                ref_pair(op.verification_gas_limit, op.call_gas_limit),
                # uint256(bytes32(paymasterAndData[20:52]))
                op.paymaster_verification_gas_limit << 128 | op.paymaster_post_op_gas_limit,
                op.pre_verification_gas,
                ref_pair(op.max_priority_fee_per_gas, op.max_fee_per_gas),
                chain_id,
                pm,
                until,
                after,
            ],
        )
    )


# --- user operations -----------------------------------------------------------------------


@given(user_ops(), addresses, st.integers(min_value=1, max_value=2**64))
def test_user_op_hash_matches_the_solidity_definition(
    op: UserOperation, entry_point: str, chain_id: int
) -> None:
    for version in VERSIONS:
        expected = ref_user_op_hash(op, entry_point, chain_id, version)
        assert userop.user_op_hash(
            op, entry_point=entry_point, chain_id=chain_id, version=version
        ) == (expected)


@given(user_ops())
def test_packed_layout_and_handle_ops_calldata(op: UserOperation) -> None:
    v06 = userop.packed(op, "0.6")
    assert v06[2] == ref_init_code(op) and v06[9] == ref_paymaster_and_data(op, "0.6")
    v07 = userop.packed(op, "0.7")
    assert v07[4] == ref_pair(op.verification_gas_limit, op.call_gas_limit)
    assert v07[6] == ref_pair(op.max_priority_fee_per_gas, op.max_fee_per_gas)
    assert v07[7] == ref_paymaster_and_data(op, "0.7")
    beneficiary = "0x" + "ab" * 20
    for version, packed in zip(VERSIONS, (v06, v07), strict=True):
        struct = userop.OP_TUPLE_TYPE[version]
        signature = f"handleOps({struct}[],address)"
        expected = keccak(text=signature)[:4] + eth_encode(
            [f"{struct}[]", "address"], [[packed, packed], beneficiary]
        )
        assert userop.handle_ops_calldata([op, op], beneficiary, version) == expected
    assert userop.from_paymaster_and_data(op.paymaster_and_data("0.7"), "0.7") == (
        op.paymaster,
        op.paymaster_verification_gas_limit,
        op.paymaster_post_op_gas_limit,
        op.paymaster_data,
    )


@given(user_ops())
def test_encoded_size_is_the_encoding_s_length(op: UserOperation) -> None:
    for version in ("0.6", "0.7", "0.8"):
        struct = userop.OP_TUPLE_TYPE[version]
        # eth_abi puts the tuple behind an offset word; chaingate's encoder does not.
        expected = len(eth_encode([struct], [userop.packed(op, version)])) - 32
        assert userop.encoded_size(op, version) == expected
        assert expected == len(abi.encode(struct, userop.packed(op, version)))


def test_init_code_and_paymaster_fields() -> None:
    factory = "0x9406Cc6185a346906296840746125a0E44976454"
    op = UserOperation(
        sender="0x" + "11" * 20,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=2,
        pre_verification_gas=3,
        max_fee_per_gas=4,
        max_priority_fee_per_gas=5,
    )
    assert op.init_code == b"" and op.paymaster_and_data("0.7") == b""
    deployed = op.with_(factory=factory, factory_data=b"\x01\x02")
    assert deployed.init_code == bytes.fromhex(factory[2:]) + b"\x01\x02"
    assert userop.from_init_code(deployed.init_code) == (factory, b"\x01\x02")
    assert userop.from_init_code(b"") == (None, b"")
    with pytest.raises(ValueError, match="shorter than a factory"):
        userop.from_init_code(b"\x01" * 19)
    sponsored = op.with_(
        paymaster=factory,
        paymaster_verification_gas_limit=0x1234,
        paymaster_post_op_gas_limit=0x56,
        paymaster_data=b"\xee",
    )
    assert sponsored.paymaster_and_data("0.6") == bytes.fromhex(factory[2:]) + b"\xee"
    assert sponsored.paymaster_and_data("0.7") == (
        bytes.fromhex(factory[2:]) + (0x1234).to_bytes(16, "big") + (0x56).to_bytes(16, "big")
    ) + (b"\xee")
    with pytest.raises(ValueError, match="uint128"):
        userop.packed(op.with_(call_gas_limit=2**128), "0.7")
    with pytest.raises(ValueError, match="unknown EntryPoint version"):
        userop.packed(op, "0.9")  # type: ignore[arg-type]


def test_events_decode_what_eth_abi_encodes() -> None:
    user_op_hash = "0x" + "5a" * 32
    sender = to_checksum_address("0x" + "c1" * 20)
    pm = to_checksum_address("0x" + "d2" * 20)
    factory = to_checksum_address("0x" + "e3" * 20)

    def topic(address: str) -> str:
        return "0x" + "00" * 12 + address[2:].lower()

    signature = "UserOperationEvent(bytes32,address,address,uint256,bool,uint256,uint256)"
    assert "0x" + keccak(text=signature).hex() == userop.USER_OPERATION_EVENT
    event = userop.decode_user_operation_event(
        [userop.USER_OPERATION_EVENT, user_op_hash, topic(sender), topic(pm)],
        eth_encode(["uint256", "bool", "uint256", "uint256"], [7, True, 10**15, 123_456]),
    )
    assert event == userop.UserOperationEvent(
        user_op_hash=user_op_hash,
        sender=sender,
        paymaster=pm,
        nonce=7,
        success=True,
        actual_gas_cost=10**15,
        actual_gas_used=123_456,
    )
    deployed_topic = keccak(text="AccountDeployed(bytes32,address,address,address)")
    assert "0x" + deployed_topic.hex() == userop.ACCOUNT_DEPLOYED
    deployed = userop.decode_account_deployed(
        [userop.ACCOUNT_DEPLOYED, user_op_hash, topic(sender)],
        eth_encode(["address", "address"], [factory, pm]),
    )
    assert (deployed.sender, deployed.factory, deployed.paymaster) == (sender, factory, pm)
    with pytest.raises(ValueError, match="not a UserOperationEvent"):
        userop.decode_user_operation_event(
            [userop.ACCOUNT_DEPLOYED, user_op_hash, topic(sender), topic(pm)], bytes(128)
        )
    with pytest.raises(ValueError, match="topics"):
        userop.decode_account_deployed([userop.ACCOUNT_DEPLOYED], bytes(64))
    with pytest.raises(ValueError, match="data too short"):
        userop.decode_account_deployed(
            [userop.ACCOUNT_DEPLOYED, user_op_hash, topic(sender)], bytes(10)
        )


# --- the VerifyingPaymaster ---------------------------------------------------------------

timestamps = st.integers(min_value=0, max_value=2**48 - 1)


@given(user_ops(with_paymaster=True), addresses, timestamps, timestamps, st.integers(0, 2**32))
def test_paymaster_hash_matches_the_solidity_definition(
    op: UserOperation, pm: str, until: int, after: int, sender_nonce: int
) -> None:
    for version in VERSIONS:
        got = paymaster.verifying_paymaster_hash(
            op,
            paymaster=pm,
            chain_id=31337,
            valid_until=until,
            valid_after=after,
            version=version,
            sender_nonce=sender_nonce,
        )
        assert got == ref_paymaster_hash(op, pm, 31337, until, after, version, sender_nonce)


SIGNER = PrivateKey(keccak(b"test_aa_units signer"))


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(user_ops(with_paymaster=False), addresses, timestamps, timestamps)
def test_sponsor_signature_recovers_to_the_signer_with_eth_account(
    op: UserOperation, pm: str, until: int, after: int
) -> None:
    op = op.with_(paymaster_verification_gas_limit=100_000, paymaster_post_op_gas_limit=5)
    for version in VERSIONS:
        sponsored = paymaster.sponsor(
            op,
            SIGNER,
            paymaster=pm,
            chain_id=1,
            valid_until=until,
            valid_after=after,
            version=version,
        )
        assert sponsored.paymaster == pm
        assert sponsored.with_(paymaster=None, paymaster_data=b"") == op
        got_until, got_after, signature = paymaster.decode_paymaster_data(sponsored.paymaster_data)
        assert (got_until, got_after, len(signature)) == (until, after, 65)
        # What the contract hashes when validating the final operation:
        digest = ref_paymaster_hash(sponsored, pm, 1, until, after, version)
        recovered = Account.recover_message(encode_defunct(primitive=digest), signature=signature)
        assert recovered == SIGNER.address
        assert paymaster.eth_signed_message_hash(digest) == keccak(
            b"\x19Ethereum Signed Message:\n32" + digest
        )


def test_paymaster_data_stub_parses_and_recovers() -> None:
    stub = paymaster.paymaster_data_stub(2**48 - 1, 5)
    assert len(stub) == 64 + 65
    until, after, signature = paymaster.decode_paymaster_data(stub)
    assert (until, after) == (2**48 - 1, 5)
    # Recovers to some address rather than failing, as OpenZeppelin's ECDSA.recover needs.
    assert Account.recover_message(encode_defunct(primitive=bytes(32)), signature=signature)
    with pytest.raises(ValueError, match="uint48"):
        paymaster.decode_paymaster_data(bytes(31) + b"\x01" + (2**48).to_bytes(32, "big"))
    with pytest.raises(ValueError, match="shorter"):
        paymaster.decode_paymaster_data(bytes(63))
    op = UserOperation(
        sender="0x" + "11" * 20,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=2,
        pre_verification_gas=3,
        max_fee_per_gas=4,
        max_priority_fee_per_gas=5,
    )
    with pytest.raises(ValueError, match="paymaster_verification_gas_limit"):
        paymaster.sponsor(
            op, SIGNER, paymaster=op.sender, chain_id=1, valid_until=0, valid_after=0, version="0.7"
        )


# --- SimpleAccount calls ---------------------------------------------------------------------

inner_calls = st.lists(
    st.tuples(addresses, st.integers(min_value=0, max_value=2**256 - 1), small_bytes), max_size=6
)


def execute(target: str, value: int, data: bytes) -> bytes:
    return keccak(text="execute(address,uint256,bytes)")[:4] + eth_encode(
        ["address", "uint256", "bytes"], [target, value, data]
    )


def batch_v06(items: list[tuple[str, int, bytes]]) -> bytes:
    return keccak(text="executeBatch(address[],bytes[])")[:4] + eth_encode(
        ["address[]", "bytes[]"], [[t for t, _, _ in items], [d for _, _, d in items]]
    )


def batch_v07(items: list[tuple[str, int, bytes]], values: list[int]) -> bytes:
    return keccak(text="executeBatch(address[],uint256[],bytes[])")[:4] + eth_encode(
        ["address[]", "uint256[]", "bytes[]"],
        [[t for t, _, _ in items], values, [d for _, _, d in items]],
    )


@given(inner_calls)
def test_calls_round_trip_eth_abi_encodings(items: list[tuple[str, int, bytes]]) -> None:
    for target, value, data in items:
        for version in VERSIONS:
            assert calls.decode_account_calls(execute(target, value, data), version) == [
                calls.InnerCall(target, value, data)
            ]
    zero_valued = [calls.InnerCall(t, 0, d) for t, _, d in items]
    assert calls.decode_account_calls(batch_v06(items), "0.6") == zero_valued
    assert calls.decode_account_calls(batch_v07(items, []), "0.7") == zero_valued
    assert calls.decode_account_calls(batch_v07(items, [v for _, v, _ in items]), "0.7") == [
        calls.InnerCall(t, v, d) for t, v, d in items
    ]


def test_calls_refuse_what_the_account_would_refuse() -> None:
    target = to_checksum_address("0x" + "77" * 20)
    assert calls.decode_account_calls(b"", "0.6") == []  # no account call at all
    assert calls.InnerCall(target, 1, b"\x01\x02").selector is None
    assert calls.InnerCall(target, 0, b"\xa9\x05\x9c\xbb" + bytes(64)).selector == (
        b"\xa9\x05\x9c\xbb"
    )
    items = [(target, 1, b"\x01"), (target, 2, b"")]
    with pytest.raises(calls.CallDataError, match=r"not a SimpleAccount v0\.6.*0x[0-9a-f]{8}"):
        calls.decode_account_calls(batch_v07(items, []), "0.6")  # v0.7's executeBatch
    with pytest.raises(calls.CallDataError, match="selector 0xa9059cbb"):
        calls.decode_account_calls(b"\xa9\x05\x9c\xbb" + bytes(64), "0.7")
    with pytest.raises(calls.CallDataError, match="shorter than a selector"):
        calls.decode_account_calls(b"\x01\x02", "0.7")
    with pytest.raises(calls.CallDataError, match="wrong array lengths"):
        calls.decode_account_calls(batch_v07(items, [1]), "0.7")
    mismatched = keccak(text="executeBatch(address[],bytes[])")[:4] + eth_encode(
        ["address[]", "bytes[]"], [[target], [b"", b""]]
    )
    with pytest.raises(calls.CallDataError, match="wrong array lengths"):
        calls.decode_account_calls(mismatched, "0.6")
    dirty = bytearray(execute(target, 0, b""))
    dirty[4] = 1  # a bit above the address's 160
    with pytest.raises(calls.CallDataError, match="bits above 160"):
        calls.decode_account_calls(bytes(dirty), "0.6")
    many = [(target, 0, b"")] * (calls.MAX_INNER_CALLS + 1)
    with pytest.raises(calls.CallDataError, match="at most 256"):
        calls.decode_account_calls(batch_v06(many), "0.6")
    assert len(calls.decode_account_calls(batch_v06(many[:256]), "0.6")) == 256
    with pytest.raises(calls.CallDataError, match=r"truncated|past the data"):
        calls.decode_account_calls(execute(target, 0, b"\x01" * 40)[:-30], "0.6")


def _mutations() -> st.SearchStrategy[bytes]:
    valid = st.one_of(
        st.builds(execute, addresses, st.integers(0, 2**256 - 1), small_bytes),
        inner_calls.map(batch_v06),
        inner_calls.map(lambda items: batch_v07(items, [v for _, v, _ in items])),
    )

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(valid))
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["truncate", "word", "byte"]))
            if kind == "truncate":
                del data[draw(st.integers(0, len(data))) :]
            elif kind == "word" and len(data) >= 36:
                at = 4 + 32 * draw(st.integers(0, (len(data) - 4) // 32 - 1))
                value = draw(
                    st.sampled_from([0, 1, 32, 2**64, 2**255, 2**256 - 1, 2**256 - 32])
                    | st.integers(0, 2**256 - 1)
                )
                data[at : at + 32] = value.to_bytes(32, "big")
            elif data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)

    selectors = st.sampled_from(
        [calls.EXECUTE, calls.EXECUTE_BATCH_V06, calls.EXECUTE_BATCH_V07, b"\x00" * 4]
    )
    return mutated() | st.builds(lambda s, rest: s + rest, selectors, st.binary(max_size=300))


@settings(max_examples=500)
@given(_mutations())
def test_malformed_call_data_raises_only_call_data_error(data: bytes) -> None:
    for version in VERSIONS:
        try:
            decoded = calls.decode_account_calls(data, version)
        except calls.CallDataError as exc:
            message = str(exc)
        else:
            message = "decoded"
            assert len(decoded) <= calls.MAX_INNER_CALLS
        assert message  # every refusal says why


# --- SimpleAccountFactory -------------------------------------------------------------------


def factory_runtime(tag: str) -> bytes:
    found = aa_artifacts({"factory": (tag, "SimpleAccountFactory")}, announce=lambda _: None)
    return found["factory"].deployed_bytecode


@pytest.mark.parametrize("tag", ["v06", "v07", "v08"])
def test_proxy_creation_code_candidates_in_the_npm_factories(tag: str) -> None:
    runtime = factory_runtime(tag)
    candidates = accounts.find_proxy_creation_code_candidates(runtime)
    assert 0 < len(candidates) <= 16
    assert all(code.startswith(bytes.fromhex("6080604052")) for code in candidates)
    assert all(code in runtime for code in candidates)
    # The likeliest comes first: a constructor that states its own length (ERC1967Proxy's).
    assert candidates[0] != runtime


class FakeNode:
    """Answers learn_factory's three calls: the npm factory code and a chosen getAddress."""

    def __init__(self, code: bytes, get_address: str) -> None:
        self.code = code
        self.get_address = get_address
        self.seen: list[str] = []

    async def call(self, method: str, params: Any) -> Any:
        await trio.lowlevel.checkpoint()
        self.seen.append(method)
        if method == "eth_getCode":
            return "0x" + self.code.hex()
        selector = params[0]["data"][2:10]
        word = self.get_address if selector != "11464fbe" else "0x" + "ab" * 20
        return "0x" + "00" * 12 + word[2:]


async def test_learn_factory_refuses_what_it_cannot_prove() -> None:
    runtime = factory_runtime("v07")
    node = FakeNode(runtime, "0x" + "12" * 20)  # a getAddress no candidate reproduces
    with pytest.raises(accounts.FactoryMismatch, match="is not a SimpleAccountFactory"):
        await accounts.learn_factory(node, "0x" + "34" * 20, "0.7")
    assert node.seen == ["eth_getCode", "eth_call", "eth_call"]
    with pytest.raises(accounts.FactoryMismatch, match="no contract"):
        await accounts.learn_factory(FakeNode(b"", "0x" + "12" * 20), "0x" + "34" * 20, "0.7")
    # With the answer the real factory would give (our own computation here; the devnet test
    # takes it from the chain), the first candidate is kept.
    factory = "0x" + "34" * 20
    expected = accounts.AccountFactory(
        to_checksum_address(factory),
        to_checksum_address("0x" + "ab" * 20),
        accounts.find_proxy_creation_code_candidates(runtime)[0],
        "0.7",
    )
    owner = to_checksum_address("0x" + "56" * 20)
    node = FakeNode(runtime, expected.account_address(owner, 9))
    learned = await accounts.learn_factory(node, factory, "0.7", probe_owner=owner, probe_salt=9)
    assert learned == expected
    assert learned.factory_data(owner, 9) == keccak(text="createAccount(address,uint256)")[
        :4
    ] + eth_encode(["address", "uint256"], [owner, 9])
    with pytest.raises(ValueError, match="uint256"):
        learned.account_address(owner, 2**256)


# --- the flat encoder (what the bundler encodes per operation) --------------------------------

_FLAT_TYPES = ["address", "uint256", "uint128", "uint8", "bytes32", "bytes4", "bytes"]


def _flat_value(kind: str) -> st.SearchStrategy[Any]:
    """Values of ``kind``, and some that do not fit it (each encoder must refuse them alike)."""
    if kind == "address":
        return addresses
    if kind.startswith("uint"):
        bits = int(kind[4:])
        edges = st.sampled_from([-1, 0, 2**bits - 1, 2**bits, True])
        return st.integers(min_value=-2, max_value=2**bits + 1) | edges
    if kind == "bytes":
        return small_bytes | st.just("not bytes")
    return st.binary(min_size=int(kind[5:]) - 1, max_size=int(kind[5:]) + 1)


@st.composite
def flat_sequences(draw: st.DrawFn) -> tuple[list[str], list[Any]]:
    types = draw(st.lists(st.sampled_from(_FLAT_TYPES), max_size=8))
    return types, [draw(_flat_value(t)) for t in types]


def _generic(types: str, values: Any) -> bytes | type[Exception]:
    try:
        return abi.parse_type(types).encode(values)
    except (abi.AbiError, ValueError) as exc:
        return type(exc)


def _fast(types: str, values: Any) -> bytes | type[Exception]:
    try:
        return abi.encode(types, values)
    except (abi.AbiError, ValueError) as exc:
        return type(exc)


@given(flat_sequences(), st.booleans())
def test_the_flat_encoder_is_the_generic_one(
    drawn: tuple[list[str], list[Any]], struct: bool
) -> None:
    """Same bytes and same refusals as the generic encoder, for a flat sequence and for one
    struct of one (``simulateValidation``'s argument), and eth_abi's bytes where it encodes."""
    types, values = drawn
    text = "(" + ",".join(types) + ")"
    if struct:
        text, values = f"({text})", [tuple(values)]
    expected = _generic(text, values)
    assert _fast(text, values) == expected
    assert _fast(text, tuple(values)) == _generic(text, tuple(values))
    if isinstance(expected, bytes) and types:  # eth_abi has no empty struct
        reference = eth_encode([text[1:-1]] if struct else types, values)
        # eth_abi gives the one struct behind its offset, as chaingate's encoder does.
        assert expected == reference
    assert _fast(text, values[:-1] if values else [0]) == _generic(
        text, values[:-1] if values else [0]
    )


@given(st.binary(max_size=600))
def test_keccak256_is_ethereum_s(data: bytes) -> None:
    """pycryptodome's C functions called straight give eth_utils' Keccak-256 (its own state
    per thread, reset between hashes)."""
    from chaingate.evm.keccak import keccak256

    assert keccak256(data) == keccak(data)
    assert keccak256(data + b"\x01") == keccak(data + b"\x01")  # after a hash, a fresh state


@given(st.binary(min_size=20, max_size=20))
def test_checksum_address_is_eip55(raw: bytes) -> None:
    from chaingate.evm.addresses import checksum_address

    assert checksum_address(raw) == to_checksum_address(raw)
    assert checksum_address("0x" + raw.hex()) == to_checksum_address(raw)


_DECODED_TYPES = [
    "(uint256,address,bytes,bool)",
    "((uint256,uint256,uint256,uint256,bytes),(uint256,uint256),(address,(uint256,uint256)))",
    "(uint48,bytes32,string,uint256[])",
]


@given(st.sampled_from(_DECODED_TYPES), st.binary(max_size=400), st.data())
def test_the_compiled_decoder_is_the_generic_one(
    types: str, noise: bytes, data: st.DataObject
) -> None:
    """Same values and same refusals as each type's own ``decode``: on garbage, and on a
    valid encoding with its words cut or changed."""

    def both(blob: bytes) -> tuple[Any, Any]:
        results = []
        for decode in (
            lambda: abi.decode(types, blob),
            lambda: abi.parse_type(types).decode(blob, 0),
        ):
            try:
                results.append(decode())
            except (abi.AbiError, ValueError) as exc:
                results.append(type(exc))
        return results[0], results[1]

    fast, generic = both(noise)
    assert fast == generic
    valid = abi.encode(
        "(uint256,address,bytes,bool)",
        [data.draw(st.integers(0, 2**256 - 1)), "0x" + "ab" * 20, noise, True],
    )
    if types == _DECODED_TYPES[0]:
        assert both(valid)[0] == both(valid)[1] != abi.AbiError
    cut = valid[: data.draw(st.integers(0, len(valid)))]
    fast, generic = both(cut)
    assert fast == generic


@given(user_ops(), user_ops())
def test_handle_ops_calldata_is_remade_for_other_inputs(a: UserOperation, b: UserOperation) -> None:
    """The last calldata is reused only for the same operation objects, beneficiary and
    version."""
    beneficiary, other = "0x" + "ab" * 20, "0x" + "cd" * 20

    def reference(ops: list[UserOperation], to: str, version: Version) -> bytes:
        struct = userop.OP_TUPLE_TYPE[version]
        return keccak(text=f"handleOps({struct}[],address)")[:4] + eth_encode(
            [f"{struct}[]", "address"], [[userop.packed(op, version) for op in ops], to]
        )

    for ops, to, version in (
        ([a, b], beneficiary, "0.7"),
        ([a, b], beneficiary, "0.7"),
        ([a], beneficiary, "0.7"),
        ([a, b], other, "0.7"),
        ([a, b], other, "0.6"),
        ([b, a], other, "0.6"),
    ):
        assert userop.handle_ops_calldata(ops, to, version) == reference(ops, to, version)
