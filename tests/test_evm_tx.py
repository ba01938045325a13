"""chaingate.evm.rlp and chaingate.evm.tx proven against libraries nobody here wrote:
pyrlp for the encoding, eth-account for signing and sender recovery."""

from __future__ import annotations

import pytest
import rlp as pyrlp
from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate.evm import rlp
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey
from chaingate.evm.tx import Eip1559, decode_raw

items = st.recursive(
    st.binary(max_size=80), lambda children: st.lists(children, max_size=6), max_leaves=20
)


@given(items)
def test_rlp_matches_pyrlp_both_ways(item: rlp.Item) -> None:
    encoded = rlp.encode(item)
    assert encoded == pyrlp.encode(item)
    assert rlp.decode(encoded) == item


@pytest.mark.parametrize(
    "bad",
    [
        b"\x81\x05",  # a byte below 0x80 wrapped as a string
        b"\xb8\x05hello",  # a short string with a long length
        b"\x83ab",  # truncated
        b"\x80\x80",  # trailing bytes
        b"\xb9\x00\x40" + b"x" * 64,  # a length with a leading zero
    ],
)
def test_rlp_refuses_non_canonical_input(bad: bytes) -> None:
    with pytest.raises(rlp.RlpError):
        rlp.decode(bad)


KEY = PrivateKey.generate()
uints = st.integers(min_value=0, max_value=2**64)
addresses = st.binary(min_size=20, max_size=20).map(checksum_address)


@settings(max_examples=40)
@given(
    chain_id=st.integers(min_value=1, max_value=2**32),
    nonce=uints,
    tip=uints,
    fee=uints,
    gas=st.integers(min_value=21000, max_value=30_000_000),
    value=uints,
    data=st.binary(max_size=300),
    to=st.one_of(st.none(), addresses),
)
def test_eip1559_signing_matches_eth_account(
    chain_id: int, nonce: int, tip: int, fee: int, gas: int, value: int, data: bytes, to: str | None
) -> None:
    tx = Eip1559(
        chain_id=chain_id,
        nonce=nonce,
        max_priority_fee_per_gas=tip,
        max_fee_per_gas=fee,
        gas=gas,
        to=to,
        value=value,
        data=data,
    )
    theirs = Account.sign_transaction(
        {
            "type": 2,
            "chainId": chain_id,
            "nonce": nonce,
            "maxPriorityFeePerGas": tip,
            "maxFeePerGas": fee,
            "gas": gas,
            "to": to or b"",
            "value": value,
            "data": data,
        },
        KEY.hex(),
    )
    raw = tx.sign(KEY)
    assert raw == bytes(theirs.raw_transaction)
    decoded = decode_raw(raw)
    assert (decoded.sender, decoded.nonce, decoded.to) == (KEY.address, nonce, to)
    assert decoded.hash == "0x" + bytes(theirs.hash).hex()


@pytest.mark.parametrize("chain_id", [None, 1, 31337])
def test_legacy_and_2930_senders_are_recovered(chain_id: int | None) -> None:
    legacy: dict[str, object] = {
        "nonce": 3,
        "gasPrice": 10**9,
        "gas": 21000,
        "to": "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
        "value": 1,
    }
    if chain_id is not None:
        legacy["chainId"] = chain_id
    decoded = decode_raw(bytes(Account.sign_transaction(legacy, KEY.hex()).raw_transaction))
    assert (decoded.kind, decoded.sender, decoded.nonce) == (0, KEY.address, 3)
    typed = dict(legacy, type=1, chainId=chain_id or 1, accessList=[])
    decoded = decode_raw(bytes(Account.sign_transaction(typed, KEY.hex()).raw_transaction))
    assert (decoded.kind, decoded.sender, decoded.to) == (
        1,
        KEY.address,
        "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
    )


@pytest.mark.parametrize("raw", [b"", b"\x07\xc0", b"\x02\xc3\x01\x02\x03", b"\xc0"])
def test_what_is_not_a_transaction_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"transaction|RLP|fields"):
        decode_raw(raw)
