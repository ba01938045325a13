"""Webhook filters (chaingate.webhooks.filters): every key of every kind, accepted and refused,
the key a refusal names, the value limit, EIP-55, and normalisation that is a fixed point."""

from __future__ import annotations

from typing import Any, get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaingate.evm.abi import event_topic, selector
from chaingate.evm.addresses import checksum_address
from chaingate.webhooks.filters import (
    Filter,
    FilterError,
    filter_values,
    merge_addresses,
    parse_config,
)
from chaingate.webhooks.model import Kind

A = "0x" + "aa" * 20
B = "0x" + "bb" * 20
C = "0x" + "0c" * 20
EIP55 = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # EIP-55's own example
EIP55_WRONG = "0x5aaeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # one letter's case flipped
H1 = "0x" + "11" * 32
H2 = "0x" + "22" * 32
TRANSFER = event_topic("Transfer(address,address,uint256)")
TRANSFER_SELECTOR = "0xa9059cbb"

KINDS: tuple[str, ...] = tuple(k for k in get_args(Kind) if k != "test")
ALL_KEYS = (
    "addresses",
    "contracts",
    "from",
    "to",
    "min_value",
    "topics",
    "selectors",
    "transaction_hashes",
    "token_ids",
)
KEYS = {
    "address_activity": {"addresses", "selectors"},
    "token_transfer": {"contracts", "addresses", "from", "to", "min_value"},
    "nft_transfer": {"contracts", "addresses", "from", "to", "token_ids"},
    "mined_transaction": {"transaction_hashes"},
    "log": {"addresses", "topics"},
    "internal_transfer": {"addresses", "min_value"},
    "new_block": set(),
    "pending_transaction": {"addresses", "selectors"},
}

# One config per kind using every key it takes, and what it normalises to.
EXAMPLES: dict[str, tuple[dict[str, Any], Filter]] = {
    "address_activity": (
        {
            "addresses": [B, EIP55, A, B.upper().replace("0X", "0x")],
            "selectors": ["transfer(address, uint)", "0xA9059CBB", "0x095ea7b3"],
        },
        Filter(
            addresses=(EIP55.lower(), A, B),
            selectors=("0x095ea7b3", TRANSFER_SELECTOR),
        ),
    ),
    "token_transfer": (
        {"contracts": [C], "addresses": [A], "from": [B], "to": [A, B], "min_value": "1000"},
        Filter(addresses=(A,), contracts=(C,), from_=(B,), to=(A, B), min_value="1000"),
    ),
    "nft_transfer": (
        {"contracts": [C], "addresses": [A], "from": [B], "to": [A], "token_ids": [10, "2", "0x1"]},
        Filter(addresses=(A,), contracts=(C,), from_=(B,), to=(A,), token_ids=("1", "2", "10")),
    ),
    "mined_transaction": (
        {"transaction_hashes": [H2, H1.upper().replace("0X", "0x"), H1]},
        Filter(transaction_hashes=(H1, H2)),
    ),
    "log": (
        {"addresses": [C], "topics": [TRANSFER, None, [H2, H1, H2]]},
        Filter(addresses=(C,), topics=((TRANSFER,), None, (H1, H2))),
    ),
    "internal_transfer": (
        {"addresses": [A], "min_value": 10**18},
        Filter(addresses=(A,), min_value=str(10**18)),
    ),
    "new_block": ({}, Filter()),
    "pending_transaction": (
        {"addresses": [A], "selectors": ["approve(address,uint256)"]},
        Filter(addresses=(A,), selectors=("0x095ea7b3",)),
    ),
}

# A value each key accepts (used where another key is under test).
GOOD = {
    "addresses": [A],
    "contracts": [C],
    "from": [A],
    "to": [B],
    "min_value": "1",
    "topics": [TRANSFER],
    "selectors": [TRANSFER_SELECTOR],
    "transaction_hashes": [H1],
    "token_ids": ["1"],
}


def error(kind: str, raw: Any, *, max_values: int = 100) -> FilterError:
    with pytest.raises(FilterError) as caught:
        parse_config(kind, raw, max_values=max_values)  # type: ignore[arg-type]
    return caught.value


def parse(kind: str, raw: Any, *, max_values: int = 100) -> Filter:
    return parse_config(kind, raw, max_values=max_values)  # type: ignore[arg-type]


# --- every kind ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_normalises_its_example(kind: str) -> None:
    raw, expected = EXAMPLES[kind]
    assert set(raw) == KEYS[kind], "the example uses every key the kind takes"
    assert parse(kind, raw) == expected


@pytest.mark.parametrize(
    ("kind", "key"),
    [(k, key) for k in KINDS for key in (*ALL_KEYS, "address", "webhook_id") if key not in KEYS[k]],
)
def test_a_key_the_kind_does_not_take_is_refused_by_name(kind: str, key: str) -> None:
    raw = dict(EXAMPLES[kind][0])
    raw[key] = GOOD.get(key, [A])
    exc = error(kind, raw)
    assert exc.key == key
    assert exc.message.startswith(f"unknown key for {kind}")
    assert exc.field == f"config.{key}"


def test_an_unknown_key_is_echoed_cut_short() -> None:
    exc = error("new_block", {"k" * 100_000: 1})
    assert exc.key == "k" * 64


def test_new_block_takes_no_config_at_all() -> None:
    assert parse("new_block", None) == Filter()
    assert parse("new_block", {}) == Filter()
    assert msgspec.json.encode(parse("new_block", None)) == b"{}"


def test_a_config_that_is_not_an_object_names_the_config_itself() -> None:
    exc = error("address_activity", [A])
    assert exc.key == ""
    assert exc.field == "config"


def test_the_ping_kind_is_no_subscription() -> None:
    with pytest.raises(ValueError, match="not a kind") as caught:
        parse("test", {})
    assert not isinstance(caught.value, FilterError)  # a caller's bug, not the client's


# --- required keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "raw", "key", "message"),
    [
        ("address_activity", {}, "addresses", "required for address_activity"),
        ("address_activity", None, "addresses", "required"),
        ("address_activity", {"selectors": [TRANSFER_SELECTOR]}, "addresses", "required"),
        ("mined_transaction", {}, "transaction_hashes", "required"),
        ("internal_transfer", {"min_value": "5"}, "addresses", "required"),
        ("pending_transaction", {"selectors": [TRANSFER_SELECTOR]}, "addresses", "required"),
        ("token_transfer", {}, "contracts", "contracts, addresses, from or to"),
        ("token_transfer", {"min_value": "1"}, "contracts", "one at least"),
        ("nft_transfer", {}, "contracts", "contracts, addresses, from or to"),
        ("log", {}, "addresses", "addresses or topics"),
        ("log", {"topics": [None, None]}, "topics", "every position is null"),
        ("nft_transfer", {"addresses": [A], "token_ids": [1]}, "token_ids", "needs contracts"),
    ],
)
def test_required_keys(kind: str, raw: Any, key: str, message: str) -> None:
    exc = error(kind, raw)
    assert exc.key == key
    assert message in exc.message


@pytest.mark.parametrize("key", ["contracts", "addresses", "from", "to"])
def test_any_one_party_or_contract_narrows_a_transfer_filter_enough(key: str) -> None:
    for kind in ("token_transfer", "nft_transfer"):
        f = parse(kind, {key: [A]})
        assert filter_values(f) == 1


def test_a_log_filter_may_name_only_topics_or_only_addresses() -> None:
    assert parse("log", {"topics": [None, H1]}) == Filter(topics=(None, (H1,)))
    assert parse("log", {"addresses": [A]}) == Filter(addresses=(A,))
    assert parse("log", {"addresses": [A], "topics": []}) == Filter(addresses=(A,))


# --- addresses -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["addresses", "contracts", "from", "to"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0x1234", "40 hex digits"),
        (A[:-1] + "g", "40 hex digits"),
        (A[2:], "40 hex digits"),
        (A + "00", "40 hex digits"),
        (12, "40 hex digits"),
        (None, "40 hex digits"),
        (EIP55_WRONG, "checksum"),
    ],
)
def test_a_bad_address_is_named_with_its_index(key: str, value: Any, message: str) -> None:
    kind = "token_transfer"
    exc = error(kind, {key: [A, B, value]})
    assert exc.key == f"{key}[2]"
    assert message in exc.message


def test_addresses_in_any_single_case_or_a_valid_checksum_are_lowercased() -> None:
    upper = "0x" + EIP55[2:].upper()
    f = parse("address_activity", {"addresses": [EIP55, EIP55.lower(), upper]})
    assert f.addresses == (EIP55.lower(),)
    assert checksum_address(f.addresses[0]) == EIP55


@pytest.mark.parametrize("value", [A, {"0": A}, 5, None])
def test_a_list_key_given_something_else_is_refused(value: Any) -> None:
    exc = error("address_activity", {"addresses": value})
    assert (exc.key, exc.message) == ("addresses", "expected an array")


def test_an_empty_list_is_refused_rather_than_read_as_no_constraint() -> None:
    exc = error("token_transfer", {"contracts": [C], "addresses": []})
    assert exc.key == "addresses"
    assert "at least one" in exc.message


# --- hashes, selectors, amounts, token ids, topics ------------------------------------------


@pytest.mark.parametrize("value", [H1[:-2], H1 + "00", H1[2:], "0x" + "zz" * 32, 1, None])
def test_a_bad_transaction_hash_is_named(value: Any) -> None:
    exc = error("mined_transaction", {"transaction_hashes": [H1, value]})
    assert exc.key == "transaction_hashes[1]"
    assert "64 hex digits" in exc.message


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0xa9059cbb", TRANSFER_SELECTOR),
        ("0xA9059CBB", TRANSFER_SELECTOR),
        ("transfer(address,uint256)", TRANSFER_SELECTOR),
        ("transfer(address, uint)", TRANSFER_SELECTOR),
        ("transferFrom(address,address,uint256)", "0x23b872dd"),
        (
            "swap((address,uint256)[],bytes)",
            "0x" + selector("swap((address,uint256)[],bytes)").hex(),
        ),
        ("f()", "0x" + selector("f()").hex()),
    ],
)
def test_a_selector_is_given_as_such_or_as_a_signature(given: str, expected: str) -> None:
    f = parse("address_activity", {"addresses": [A], "selectors": [given]})
    assert f.selectors == (expected,)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0xa9059c", "8 hex digits"),
        ("0xa9059cbb00", "8 hex digits"),
        ("transfer", "8 hex digits"),
        ("transfer(address", "8 hex digits"),
        ("1transfer(address)", "8 hex digits"),
        ("transfer(addr,uint256)", "no ABI type"),
        (42, "8 hex digits"),
    ],
)
def test_a_bad_selector_is_named(value: Any, message: str) -> None:
    exc = error("pending_transaction", {"addresses": [A], "selectors": [value]})
    assert exc.key == "selectors[0]"
    assert message in exc.message


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (0, "0"),
        ("0", "0"),
        (10**30, str(10**30)),
        ("12345", "12345"),
        ("0xff", "255"),
        (2**256 - 1, str(2**256 - 1)),
    ],
)
def test_min_value_is_kept_as_a_decimal_string(given: Any, expected: str) -> None:
    f = parse("internal_transfer", {"addresses": [A], "min_value": given})
    assert f.min_value == expected
    assert msgspec.json.decode(msgspec.json.encode(f))["min_value"] == expected


@pytest.mark.parametrize(
    "value", [-1, "-1", 1.5, 1e18, True, "1e18", " 5", "01", 2**256, None, [1]]
)
def test_a_bad_min_value_is_refused(value: Any) -> None:
    exc = error("token_transfer", {"contracts": [C], "min_value": value})
    assert exc.key == "min_value"


@pytest.mark.parametrize("value", [-1, 1.0, True, "x", None, 2**256])
def test_a_bad_token_id_is_named(value: Any) -> None:
    exc = error("nft_transfer", {"contracts": [C], "token_ids": [1, value]})
    assert exc.key == "token_ids[1]"


def test_token_ids_sort_as_numbers() -> None:
    f = parse("nft_transfer", {"contracts": [C], "token_ids": ["100", 9, "0x0a", 2**255]})
    assert f.token_ids == ("9", "10", "100", str(2**255))


@pytest.mark.parametrize(
    ("topics", "key", "message"),
    [
        ([None] * 5, "topics", "at most 4 positions"),
        (TRANSFER, "topics", "array"),
        ({"0": TRANSFER}, "topics", "array"),
        ([TRANSFER, "0x12"], "topics[1]", "64 hex digits"),
        ([TRANSFER, [H1, "nope"]], "topics[1][1]", "64 hex digits"),
        ([TRANSFER, []], "topics[1]", "at least one topic"),
        ([TRANSFER, 7], "topics[1]", "null, a topic or an array"),
    ],
)
def test_bad_topics_are_named_by_position(topics: Any, key: str, message: str) -> None:
    exc = error("log", {"addresses": [A], "topics": topics})
    assert exc.key == key
    assert message in exc.message


def test_topics_keep_their_positions_and_trailing_wildcards() -> None:
    # [T, null, null, null]: a log with four topics (an ERC-721 Transfer), not three.
    f = parse("log", {"topics": [TRANSFER.upper().replace("0X", "0x"), None, None, None]})
    assert f.topics == ((TRANSFER,), None, None, None)
    assert msgspec.json.encode(f) == (b'{"topics":[["' + TRANSFER.encode() + b'"],null,null,null]}')


# --- limits ----------------------------------------------------------------------------------


def test_a_list_at_the_limit_is_taken_and_one_more_is_not() -> None:
    addresses = [f"0x{i:040x}" for i in range(1, 11)]
    assert filter_values(parse("address_activity", {"addresses": addresses}, max_values=10)) == 10
    exc = error("address_activity", {"addresses": [*addresses, A]}, max_values=10)
    assert exc.key == "addresses"
    assert "at most 10 values, got 11" in exc.message


def test_the_limit_counts_every_key_together() -> None:
    raw = {"contracts": [C, A], "from": [A, B], "to": [B, C]}
    assert filter_values(parse("token_transfer", raw, max_values=6)) == 6
    exc = error("token_transfer", raw, max_values=5)
    assert exc.key == "to"  # the key that went over
    assert "all keys together" in exc.message


def test_topic_alternatives_count_against_the_limit() -> None:
    raw = {"topics": [TRANSFER, [H1, H2], H2]}
    assert filter_values(parse("log", raw, max_values=4)) == 4
    exc = error("log", raw, max_values=3)
    assert exc.key == "topics[2]"


def test_an_oversized_list_is_counted_before_its_items_are_read() -> None:
    junk = ["not an address"] * 1_000_000
    exc = error("address_activity", {"addresses": junk}, max_values=100_000)
    assert exc.key == "addresses"
    assert "got 1000000" in exc.message


def test_duplicates_count_as_given_but_are_stored_once() -> None:
    f = parse("address_activity", {"addresses": [A, A, A]}, max_values=3)
    assert f.addresses == (A,)
    assert filter_values(f) == 1


# --- normalisation and the stored form -------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_stored_json_parses_back_to_the_same_filter(kind: str) -> None:
    f = parse(kind, EXAMPLES[kind][0])
    stored = msgspec.json.encode(f)
    assert msgspec.json.decode(stored, type=Filter) == f  # how the matcher loads it
    assert parse(kind, msgspec.json.decode(stored)) == f  # shown back, sent again
    assert set(msgspec.json.decode(stored)) == KEYS[kind]  # only the keys given, "from" named so


hex_address = st.binary(min_size=20, max_size=20).map(lambda b: "0x" + b.hex())
spelled = hex_address.flatmap(
    lambda a: st.sampled_from([a, "0x" + a[2:].upper(), checksum_address(a)])
)
topic = st.binary(min_size=32, max_size=32).map(lambda b: "0x" + b.hex())
position = st.one_of(st.none(), topic, st.lists(topic, min_size=1, max_size=3))
uint = st.integers(min_value=0, max_value=2**256 - 1)
amount = st.one_of(uint, uint.map(str), uint.map(hex))
raw_config = st.fixed_dictionaries(
    {},
    optional={
        "addresses": st.lists(spelled, min_size=1, max_size=5),
        "contracts": st.lists(spelled, min_size=1, max_size=5),
        "from": st.lists(spelled, min_size=1, max_size=5),
        "to": st.lists(spelled, min_size=1, max_size=5),
        "min_value": amount,
        "token_ids": st.lists(amount, min_size=1, max_size=5),
        "topics": st.lists(position, max_size=4),
        "selectors": st.lists(
            st.one_of(
                st.binary(min_size=4, max_size=4).map(lambda b: "0x" + b.hex().upper()),
                st.sampled_from(["transfer(address,uint)", "f()", "g(bytes32[],(int,bool))"]),
            ),
            min_size=1,
            max_size=3,
        ),
        "transaction_hashes": st.lists(topic, min_size=1, max_size=5),
    },
)


@settings(max_examples=300)
@given(kind=st.sampled_from(KINDS), raw=raw_config)
def test_normalisation_is_a_fixed_point(kind: str, raw: dict[str, Any]) -> None:
    raw = {k: v for k, v in raw.items() if k in KEYS[kind]}
    try:
        f = parse(kind, raw)
    except FilterError:
        return  # a required key left out: refused, and that is tested above
    again = parse(kind, msgspec.json.decode(msgspec.json.encode(f)))
    assert again == f
    assert msgspec.json.decode(msgspec.json.encode(f), type=Filter) == f
    for values in (f.addresses, f.contracts, f.from_, f.to, f.selectors, f.transaction_hashes):
        assert list(values) == sorted(set(values))
        assert all(v == v.lower() for v in values)
    assert [int(t) for t in f.token_ids] == sorted({int(t) for t in f.token_ids})


# --- merging addresses (PATCH) ---------------------------------------------------------------


def test_merge_adds_and_removes_addresses() -> None:
    f = parse("address_activity", {"addresses": [A, B], "selectors": [TRANSFER_SELECTOR]})
    merged = merge_addresses(f, [C, EIP55, A], [B, "0x" + "99" * 20])
    assert merged.addresses == tuple(sorted({A, C, EIP55.lower()}))
    assert merged.selectors == f.selectors
    assert merge_addresses(merged, [], []) == merged


def test_merge_names_a_bad_address_by_its_list_and_index() -> None:
    f = parse("address_activity", {"addresses": [A]})
    with pytest.raises(FilterError) as caught:
        merge_addresses(f, [B, EIP55_WRONG], [])
    assert caught.value.key == "addresses_to_add[1]"
    with pytest.raises(FilterError) as caught:
        merge_addresses(f, [], ["0x12"])
    assert caught.value.key == "addresses_to_remove[0]"
    with pytest.raises(FilterError) as caught:
        merge_addresses(f, A, [])  # a str is a Sequence[str], yet no list
    assert caught.value.key == "addresses_to_add"


def test_merge_refuses_to_leave_no_address() -> None:
    f = parse("token_transfer", {"contracts": [C], "addresses": [A]})
    with pytest.raises(FilterError) as caught:
        merge_addresses(f, [], [A])  # would widen it to every transfer of C
    assert caught.value.key == "addresses_to_remove"


def test_merge_edits_only_a_filter_that_has_addresses() -> None:
    f = parse("mined_transaction", {"transaction_hashes": [H1]})
    with pytest.raises(FilterError):
        merge_addresses(f, [A], [])


def test_merge_keeps_to_the_limit() -> None:
    f = parse("address_activity", {"addresses": [A, B], "selectors": [TRANSFER_SELECTOR]})
    assert filter_values(merge_addresses(f, [C], [], max_values=4)) == 4
    with pytest.raises(FilterError) as caught:
        merge_addresses(f, [C, EIP55], [], max_values=4)
    assert caught.value.key == "addresses_to_add"
    assert "in all" in caught.value.message
    with pytest.raises(FilterError, match="at most 4 values, got 5"):
        merge_addresses(f, [A] * 5, [], max_values=4)
