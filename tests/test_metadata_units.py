"""The sans-IO parts of chaingate.metadata: amounts, call decoding, ERC-165, CIDs, URIs,
documents, token lists, feeds, the retry schedule and the settings checks.

Reference values are computed independently (Decimal arithmetic, hand-written encodings,
published CIDs), never by the code under test.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal, localcontext
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaingate.chain.client import RpcCallError
from chaingate.config import MetadataSettings
from chaingate.evm import abi
from chaingate.metadata import amounts, tokens
from chaingate.metadata.cid import is_cid
from chaingate.metadata.multicall import Call, Multicall, Result
from chaingate.metadata.nft import MAX_TRAITS, DocumentError, parse_document, trait_value
from chaingate.metadata.prices import read_feed
from chaingate.metadata.refresher import next_retry_at
from chaingate.metadata.settings import check_settings
from chaingate.metadata.tokenlist import TokenListError, parse_token_list
from chaingate.metadata.uris import (
    UriError,
    fetch_urls,
    locate,
    parse_token_id,
    public_url,
    shown_uri,
    substitute_id,
    token_id_hex,
)

# --- amounts -------------------------------------------------------------------------------


def reference_units(raw: int, decimals: int) -> str:
    with localcontext(prec=400):
        value = Decimal(raw) / Decimal(10) ** decimals
        text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


@given(st.integers(min_value=0, max_value=2**256 - 1), st.integers(min_value=0, max_value=77))
def test_format_units_is_exact(raw: int, decimals: int) -> None:
    assert amounts.format_units(raw, decimals) == reference_units(raw, decimals)


def test_amounts_examples() -> None:
    assert amounts.format_units(1_500_000, 6) == "1.5"
    assert amounts.format_units(1, 18) == "0.000000000000000001"
    assert amounts.format_units(10**30, 0) == "1" + "0" * 30
    # 2**256 - 1 raw units at 18 decimals times a feed's 8-decimal price: not one digit lost.
    price = amounts.scaled(3012_34567891, 8)
    assert price == Decimal("3012.34567891")
    exact = amounts.usd_value(2**256 - 1, 18, price)
    with localcontext(prec=200):
        assert Decimal(exact) == Decimal(2**256 - 1) / Decimal(10**18) * price
    assert amounts.usd_value(12 * 10**18 + 5 * 10**17, 18, Decimal("0.25")) == "3.125"
    assert amounts.format_decimal(Decimal("1.50E+3")) == "1500"
    assert amounts.format_decimal(Decimal("0.000")) == "0"


# --- what contracts answer -----------------------------------------------------------------


def abi_string(text: bytes) -> bytes:
    return abi.encode(["bytes"], [text])


def word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def test_text_answers_string_or_bytes32() -> None:
    assert tokens.decode_text(abi_string(b"Maker"), 64) == "Maker"
    assert tokens.decode_text(b"MKR".ljust(32, b"\0"), 64) == "MKR"  # bytes32, like MKR
    assert tokens.decode_text(b"\xe2\x82\xacURO".ljust(32, b"\0"), 64) == "€URO"
    assert tokens.decode_text(b"\xff\xfe".ljust(32, b"\0"), 64) is None  # not text
    assert tokens.decode_text(b"AB\0CD".ljust(32, b"\0"), 64) is None  # a hash, not a name
    assert tokens.decode_text(bytes(32), 64) is None
    assert tokens.decode_text(b"", 64) is None
    assert tokens.decode_text(b"\x01" * 40, 64) is None  # neither shape
    assert tokens.decode_text(abi_string("\x07Red\x00 Token\n\u200b".encode()), 64) == "Red Token"
    assert tokens.decode_text(abi_string(b"x" * 500), 64) == "x" * 64
    assert tokens.decode_text(abi_string(b"bad \xff utf8"), 64) == "bad \ufffd utf8"


def test_uint_and_bool_answers() -> None:
    assert tokens.decode_uint(word(18), bits=8) == 18
    assert tokens.decode_uint(word(256), bits=8) is None  # not a uint8: no decimals at all
    assert tokens.decode_uint(b"\x01" * 31) is None
    assert tokens.decode_bool(word(1)) is True and tokens.decode_bool(word(0)) is False
    assert tokens.decode_bool(word(2)) is None


def probe(**answers: bytes | None) -> list[Result]:
    """Results in probe order; a name missing or None is a revert."""
    order = ["name", "symbol", "decimals", "total_supply", "erc165", "invalid", "erc721"]
    order.append("erc1155")
    return [
        Result(False, b"") if answers.get(n) is None else Result(True, answers[n] or b"")
        for n in order
    ]


def test_erc165_tells_721_from_1155_and_guards_against_yes_to_everything() -> None:
    yes, no = word(1), word(0)
    as_721 = tokens.interpret(probe(erc165=yes, invalid=no, erc721=yes, erc1155=no))
    assert as_721.standard == "ERC721"
    as_1155 = tokens.interpret(probe(erc165=yes, invalid=no, erc721=no, erc1155=yes))
    assert as_1155.standard == "ERC1155"
    # Claims every interface (0xffffffff too): ERC-165 says nothing; totalSupply decides.
    liar = probe(erc165=yes, invalid=yes, erc721=yes, erc1155=yes, total_supply=word(5))
    assert tokens.interpret(liar).standard == "ERC20"
    assert tokens.interpret(liar, "ERC1155").standard == "ERC1155"  # the logs' hint wins then
    both = probe(erc165=yes, invalid=no, erc721=yes, erc1155=yes)
    assert tokens.interpret(both).standard == "ERC721"
    assert tokens.interpret(both, "ERC1155").standard == "ERC1155"
    # No ERC-165 (an old ERC-721): the hint; no hint, no totalSupply: not a token.
    assert tokens.interpret(probe(), "ERC721").standard == "ERC721"
    assert tokens.interpret(probe(), "ERC20").standard is None
    assert tokens.interpret(probe(total_supply=b"")).standard is None  # no code: empty answers
    erc20 = tokens.interpret(
        probe(
            name=abi_string(b"Dollar"),
            symbol=b"USD".ljust(32, b"\0"),
            total_supply=word(10**24),
            erc165=b"",
        )
    )
    assert (erc20.standard, erc20.name, erc20.symbol, erc20.decimals, erc20.total_supply) == (
        "ERC20",
        "Dollar",
        "USD",
        None,
        10**24,
    )
    with pytest.raises(ValueError, match="expected 8"):
        tokens.interpret([])


# --- CIDs and URIs -------------------------------------------------------------------------

# Published CIDs (the IPFS docs' examples) in every multibase gateways accept.
V0 = "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"
V1 = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"


def test_cids_are_checked_by_decoding() -> None:
    raw = base64.b32decode(V1[1:].upper() + "=" * (-len(V1[1:]) % 8))
    assert raw[:2] == b"\x01\x70"  # v1, dag-pb: what "bafy" means
    forms = [V0, V1, "B" + V1[1:].upper(), "f" + raw.hex(), "F" + raw.hex().upper()]
    forms.append("k" + _base36(raw))
    forms.append("z" + _base58(raw))
    for cid in forms:
        assert is_cid(cid), cid
    for bad in (
        V0[:-1],  # truncated
        V0[:10] + "0" + V0[11:],  # '0' is not base58
        V1[:-1],  # the multihash no longer fits
        "b" + V1[1:].upper(),  # base32 lower prefix, upper body
        "f01551220" + "00" * 31,  # digest too short
        "f02551220" + "00" * 32,  # version 2
        "x" + V1[1:],  # unknown multibase
        "Qm",
        "",
        "../../etc/passwd",
    ):
        assert not is_cid(bad), bad


def _base58(data: bytes) -> str:
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    value, out = int.from_bytes(data, "big"), ""
    while value:
        value, digit = divmod(value, 58)
        out = alphabet[digit] + out
    return out


def _base36(data: bytes) -> str:
    value, out = int.from_bytes(data, "big"), ""
    while value:
        value, digit = divmod(value, 36)
        out = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + out
    return out


def test_token_ids_and_erc1155_substitution() -> None:
    assert parse_token_id("42") == parse_token_id("0x2a") == parse_token_id("0X2A") == 42
    assert parse_token_id(str(2**256 - 1)) == 2**256 - 1
    for bad in ("-1", "+1", " 1", "1.0", "0x", str(2**256), "0x1" + "0" * 64, "", "\u0661"):
        with pytest.raises(ValueError, match="token id"):
            parse_token_id(bad)
    assert token_id_hex(0xABC) == "0" * 61 + "abc"
    assert substitute_id("https://x.example/{id}.json?v={id}", 0xABC) == (
        f"https://x.example/{'0' * 61}abc.json?v={'0' * 61}abc"
    )
    assert substitute_id("ipfs://cid/{ID}.json", 1) == "ipfs://cid/{ID}.json"  # exact "{id}" only


@pytest.mark.parametrize(
    ("uri", "kind", "root", "path"),
    [
        (f"ipfs://{V1}", "ipfs", V1, ""),
        (f"ipfs://{V1}/1.json", "ipfs", V1, "/1.json"),
        (f"ipfs://ipfs/{V0}/a b.json", "ipfs", V0, "/a%20b.json"),
        (f"ipfs:///ipfs/{V0}", "ipfs", V0, ""),
        (f"IPFS://{V1}/x?filename=y#frag", "ipfs", V1, "/x?filename=y"),
        (f"/ipfs/{V1}/2", "ipfs", V1, "/2"),
        (f"{V0}/3.json", "ipfs", V0, "/3.json"),
        (f" {V1}\n", "ipfs", V1, ""),
        ("ipns://example.eth/meta.json", "ipns", "example.eth", "/meta.json"),
        ("ar://" + "a" * 43 + "/4", "ar", "a" * 43, "/4"),
    ],
)
def test_content_addressed_uris(uri: str, kind: str, root: str, path: str) -> None:
    location = locate(uri, max_data_bytes=1000)
    assert (location.kind, location.root, location.path) == (kind, root, path)


def test_urls_to_fetch_gateways_in_turn_original_last() -> None:
    gateways = ["http://127.0.0.1:8080", "https://ipfs.io/"]
    location = locate(f"ipfs://{V1}/1.json", max_data_bytes=1000)
    assert fetch_urls(location, gateways, "https://arweave.net") == [
        f"http://127.0.0.1:8080/ipfs/{V1}/1.json",
        f"https://ipfs.io/ipfs/{V1}/1.json",
    ]
    # An http(s) URL on someone's gateway: content-addressed, so ours first, it last.
    pinata = f"https://gateway.pinata.cloud/ipfs/{V0}/7"
    assert fetch_urls(locate(pinata, max_data_bytes=0), gateways, "") == [
        f"http://127.0.0.1:8080/ipfs/{V0}/7",
        f"https://ipfs.io/ipfs/{V0}/7",
        pinata,
    ]
    plain = locate("https://Example.org/a b/ünï.json?q=1 2", max_data_bytes=0)
    assert fetch_urls(plain, gateways, "") == [
        "https://Example.org/a%20b/%C3%BCn%C3%AF.json?q=1%202"
    ]
    tx = "b" * 43
    arweave = locate(f"ar://{tx}/meta", max_data_bytes=0)
    assert fetch_urls(arweave, gateways, "https://arweave.net/") == [
        f"https://arweave.net/{tx}/meta"
    ]


def test_data_uris_base64_and_plain() -> None:
    document = b'{"name":"x","n":1}'
    encoded = base64.b64encode(document).decode()
    cases = [
        f"data:application/json;base64,{encoded}",
        f"data:application/json;base64,{encoded.rstrip('=')}",  # padding left out
        f"data:application/json;charset=utf-8;base64,{encoded[:8]}\n{encoded[8:]}",
        f"data:application/json;base64,{encoded.replace('=', '%3D')}",
        "data:application/json,%7B%22name%22%3A%22x%22%2C%22n%22%3A1%7D",
        'data:application/json;utf8,{"name":"x","n":1}',
        '{"name":"x","n":1}',  # the JSON itself, returned as the URI
    ]
    for uri in cases:
        location = locate(uri, max_data_bytes=1000)
        assert (location.kind, location.data) == ("data", document), uri
    urlsafe = base64.urlsafe_b64encode(b"\xfb\xff" * 4).decode()
    assert locate(f"data:;base64,{urlsafe}", max_data_bytes=100).data == b"\xfb\xff" * 4
    assert locate("data:,hello", max_data_bytes=100).media_type == "text/plain"
    with pytest.raises(UriError, match="larger than 10"):
        locate("data:," + "x" * 11, max_data_bytes=10)
    with pytest.raises(UriError, match="base64"):
        locate("data:application/json;base64,!!!!", max_data_bytes=100)
    with pytest.raises(UriError, match="comma"):
        locate("data:application/json", max_data_bytes=100)


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "ftp://example.org/x",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "ipfs://notacid/1",
        "ar://short",
        "https://",
        "https://x.example/" + "a" * 9000,
    ],
)
def test_unusable_uris_are_refused(uri: str) -> None:
    with pytest.raises(UriError):
        locate(uri, max_data_bytes=1000)


def test_public_urls_for_clients() -> None:
    kw: dict[str, Any] = {
        "ipfs_gateway": "https://gw.example/",
        "arweave_gateway": "https://ar.example",
        "max_chars": 64,
    }
    assert public_url(f"ipfs://{V1}/i.png", **kw) == f"https://gw.example/ipfs/{V1}/i.png"
    assert public_url("ar://" + "c" * 43, **kw) == "https://ar.example/" + "c" * 43
    assert public_url("https://x.example/i.png", **kw) == "https://x.example/i.png"
    assert public_url("data:image/png;base64,AAAA", **kw) == "data:image/png;base64,AAAA"
    assert public_url("data:image/png;base64," + "A" * 100, **kw) is None  # too big to inline
    assert public_url("mailto:x@example.org", **kw) is None
    assert public_url(None, **kw) is None
    assert shown_uri("data:application/json;base64," + "A" * 1000) == (
        "data:application/json;base64,… (1029 characters)"
    )


# --- documents -----------------------------------------------------------------------------


def test_trait_values_become_strings() -> None:
    decoder = msgspec.json.Decoder(float_hook=Decimal)

    def value(text: str) -> str | None:
        return trait_value(decoder.decode(text))

    assert [value(v) for v in ("5", "1.50", "1e3", "-0.0", "true", "false", '"x"')] == [
        "5",
        "1.50",
        "1000",
        "-0.0",
        "true",
        "false",
        "x",
    ]
    assert value('{"a": [1, 2.50, null]}') == '{"a":[1,2.50,null]}'
    assert value("null") is None
    assert value("1e999999") == "1E+999999"  # not a megabyte of zeros
    assert value(str(10**1500)) == ("1" + "0" * 1023)[:1023] + "…"  # cut at 1,024
    long = value('"' + "y" * 5000 + '"') or ""
    assert len(long) == 1024 and long.endswith("…")


def test_documents_are_read_leniently_and_bounded() -> None:
    svg = "<svg xmlns='http://www.w3.org/2000/svg'/>"
    doc = parse_document(
        "\ufeff".encode()
        + json.dumps(
            {
                "name": 7,
                "description": "line 1\nline 2\u0007",
                "image_data": svg,
                "animation_url": "https://x.example/{id}.mp4",
                "external_url": "https://x.example/{id}",
                "attributes": {"Colour": "red", "Size": {"value": 3}},
            }
        ).encode(),
        max_url_chars=1000,
        token_id=0x1F,
    )
    assert (doc.name, doc.description) == ("7", "line 1\nline 2")
    assert doc.image_url == "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    assert doc.animation_url == f"https://x.example/{'0' * 62}1f.mp4"
    assert [(t.trait_type, t.value) for t in doc.traits] == [("Colour", "red"), ("Size", "3")]
    many = parse_document(
        json.dumps(
            {"attributes": [{"trait_type": str(i), "value": i} for i in range(500)]}
        ).encode(),
        max_url_chars=10,
    )
    assert len(many.traits) == MAX_TRAITS
    huge_image = parse_document(
        json.dumps({"image": "data:image/png;base64," + "A" * 5000}).encode(), max_url_chars=1000
    )
    assert huge_image.image_url is None
    properties = parse_document(
        b'{"properties": {"rarity": {"name": "Rarity", "value": "rare"}, "n": 2}}',
        max_url_chars=10,
    )
    assert [(t.trait_type, t.value) for t in properties.traits] == [("rarity", "rare"), ("n", "2")]
    deep = b"[" * 100_000 + b"]" * 100_000
    for bad in (b"[1, 2]", b"not json", deep, b"", b'{"name": ' + b"9" * 5000 + b"}"):
        with pytest.raises(DocumentError):
            parse_document(bad, max_url_chars=10)


# --- token lists ---------------------------------------------------------------------------


def test_token_list_logos_for_one_chain() -> None:
    a, b, c, d = ("0x" + ch * 40 for ch in "abcd")
    body = json.dumps(
        {
            "name": "test",
            "tokens": [
                {"chainId": 1, "address": a.upper().replace("0X", "0x"), "logoURI": "https://l/a"},
                {"chainId": 1, "address": b, "logoURI": f"ipfs://{V1}"},
                {"chainId": 1, "address": c, "logoURI": "data:image/png;base64,AAAA"},
                {"chainId": 1, "address": "0x1234", "logoURI": "https://l/bad"},
                {"chainId": 10, "address": d, "logoURI": "https://l/other-chain"},
                {"chainId": 1, "address": d},
                "junk",
            ],
        }
    ).encode()
    assert parse_token_list(body, 1) == {a: "https://l/a", b: f"ipfs://{V1}"}
    assert parse_token_list(body, 10) == {d: "https://l/other-chain"}
    for bad in (b"[]", b"{}", b"nope", b'{"tokens": 3}'):
        with pytest.raises(TokenListError):
            parse_token_list(bad, 1)


# --- price feeds ---------------------------------------------------------------------------


def round_data(round_id: int, answer: int, updated: int, answered_in: int | None = None) -> bytes:
    types = ["uint80", "int256", "uint256", "uint256", "uint80"]
    return abi.encode(types, [round_id, answer, updated, updated, answered_in or round_id])


@pytest.mark.parametrize(
    ("data", "decimals", "price", "error"),
    [
        (round_data(2, 3012_34000000, 10_000), word(8), Decimal("3012.34"), None),
        (round_data(2, 10**18, 10_000), word(18), Decimal(1), None),
        (round_data(2, -5, 10_000), word(8), None, "not positive"),
        (round_data(2, 0, 10_000), word(8), None, "not positive"),
        (round_data(2, 5, 0), word(8), None, "incomplete"),
        (round_data(3, 5, 10_000, answered_in=2), word(8), None, "incomplete"),
        (round_data(2, 5, 10_000 - 3601), word(8), None, "older than 3600"),
        (round_data(2, 5, 10_000 + 301), word(8), None, "future"),
        (round_data(2, 5, 10_000), word(300), None, "uint8"),
        (b"\x01" * 64, word(8), None, "latestRoundData"),
    ],
)
def test_feed_readings(
    data: bytes, decimals: bytes, price: Decimal | None, error: str | None
) -> None:
    quote = read_feed(
        "0xFeed", [Result(True, data), Result(True, decimals)], now=10_000, max_age=3600
    )
    assert quote.price == price
    assert (quote.error is None) if error is None else (error in (quote.error or ""))


def test_feed_staleness_off_and_reverts() -> None:
    old = [Result(True, round_data(1, 5, 1)), Result(True, word(0))]
    assert read_feed("f", old, now=10**9, max_age=0).price == Decimal(5)
    reverted = read_feed("f", [Result(False, b""), Result(True, word(8))], now=1, max_age=0)
    assert (reverted.price, reverted.error) == (None, "feed call reverted")


# --- retry schedule and settings -----------------------------------------------------------


def test_retry_schedule_and_its_cap() -> None:
    schedule = [30.0, 120.0, 600.0]
    delays = [next_retry_at(n, 0, schedule, 5) for n in range(1, 7)]
    assert delays == [30_000, 120_000, 600_000, 600_000, None, None]


def settings(**changes: Any) -> MetadataSettings:
    return msgspec.convert(changes, MetadataSettings)


def test_defaults_pass_and_bad_settings_are_named() -> None:
    check_settings(MetadataSettings())
    check_settings(settings(price_feeds={"0x" + "1" * 40: "0x" + "2" * 40}))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"ipfs_gateways": ["ftp://x"]}, "ipfs_gateways"),
        ({"gateway_timeout": 0}, "gateway_timeout"),
        ({"retry_schedule": []}, "retry_schedule"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"fetch_concurrency": 0}, "fetch_concurrency"),
        ({"max_document_bytes": 10}, "max_document_bytes"),
        ({"price_feeds": {"0xnope": "0x" + "2" * 40}}, "price_feeds"),
        ({"multicall3": "0x12"}, "multicall3"),
        ({"refresh_cooldown": -1}, "refresh_cooldown"),
    ]
    for changes, named in cases:
        with pytest.raises(ValueError, match=named):
            check_settings(settings(**changes))


class NodeAnsweringErrorsStub:
    """A stub of ``ChainClient.batch`` for a node that answers every call with one JSON-RPC
    error: rate limits and missing state cannot be made to happen on anvil."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        self.error = (code, message, data)

    async def batch(self, requests: list[tuple[str, list[Any]]]) -> list[Any]:
        code, message, data = self.error
        return [RpcCallError(method, code, message, data) for method, _ in requests]


@pytest.mark.parametrize(
    ("code", "message"),
    [(-32005, "rate limit exceeded"), (-32000, "header not found"), (-32603, "request timed out")],
)
async def test_a_node_that_does_not_answer_is_no_answer_about_the_contract(
    code: int, message: str
) -> None:
    # Taken as a revert, these made a real ERC-20 "not a token" until the next refresh.
    multicall = Multicall(NodeAnsweringErrorsStub(code, message), None)  # type: ignore[arg-type]
    with pytest.raises(RpcCallError):
        await multicall.run([Call("0x" + "11" * 20, b"\x18\x16\x0d\xdd")])


@pytest.mark.parametrize(
    ("code", "message"),
    [(3, "execution reverted"), (-32000, "execution reverted"), (-32000, "EVM error OutOfGas")],
)
async def test_a_call_the_evm_refused_is_a_failed_result(code: int, message: str) -> None:
    stub = NodeAnsweringErrorsStub(code, message, "0x08c379a0")
    results = await Multicall(stub, None).run([Call("0x" + "11" * 20, b"\x01")])  # type: ignore[arg-type]
    assert results == [Result(False, bytes.fromhex("08c379a0"))]
