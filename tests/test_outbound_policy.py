"""The fetcher's sans-IO parts: the address policy, URL parsing, limits, the bounded body."""

from __future__ import annotations

import gzip
import ipaddress

import pytest

from chaingate.outbound import Category, FetchError, FetchLimits, OutboundPolicy, Reason
from chaingate.outbound.body import BodyReader, content_encoding
from chaingate.outbound.policy import classify, embedded_ipv4, judge, judge_name
from chaingate.outbound.response import media_type_allowed
from chaingate.outbound.url import follow_redirect, parse_url

PRODUCTION = OutboundPolicy()
ip = ipaddress.ip_address

REFUSED = [
    ("127.0.0.1", Category.LOOPBACK),
    ("127.255.0.9", Category.LOOPBACK),
    ("::1", Category.LOOPBACK),
    ("::ffff:127.0.0.1", Category.LOOPBACK),  # IPv4-mapped
    ("2002:7f00:1::", Category.LOOPBACK),  # 6to4 around 127.0.0.1
    ("64:ff9b::7f00:1", Category.LOOPBACK),  # NAT64 around 127.0.0.1
    ("169.254.169.254", Category.METADATA),
    ("::ffff:169.254.169.254", Category.METADATA),
    ("64:ff9b::a9fe:a9fe", Category.METADATA),
    ("2002:a9fe:a9fe::1", Category.METADATA),
    ("fd00:ec2::254", Category.METADATA),
    ("100.100.100.200", Category.METADATA),
    ("169.254.1.1", Category.LINK_LOCAL),
    ("fe80::1", Category.LINK_LOCAL),
    ("fe80::1%2", Category.LINK_LOCAL),
    ("10.0.0.1", Category.PRIVATE),
    ("172.16.5.4", Category.PRIVATE),
    ("192.168.1.1", Category.PRIVATE),
    ("::ffff:10.0.0.1", Category.PRIVATE),
    ("fd12:3456::1", Category.PRIVATE),
    ("100.64.0.1", Category.SHARED),
    ("100.127.255.254", Category.SHARED),
    ("0.0.0.0", Category.UNSPECIFIED),
    ("0.1.2.3", Category.UNSPECIFIED),
    ("::", Category.UNSPECIFIED),
    ("224.0.0.1", Category.MULTICAST),
    ("ff02::1", Category.MULTICAST),
    ("240.0.0.1", Category.RESERVED),
    ("255.255.255.255", Category.RESERVED),
    ("::8.8.8.8", Category.RESERVED),  # deprecated IPv4-compatible form
    ("192.0.2.10", Category.NON_GLOBAL),  # documentation
    ("198.18.0.1", Category.NON_GLOBAL),  # benchmarking
    ("2001:db8::1", Category.NON_GLOBAL),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Category.NON_GLOBAL),  # Teredo
]


@pytest.mark.parametrize(("address", "category"), REFUSED)
def test_production_refuses(address: str, category: Category) -> None:
    verdict = judge(PRODUCTION, ip(address))
    assert verdict.category == category
    assert not verdict.allowed


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
)
def test_production_allows_global_addresses(address: str) -> None:
    verdict = judge(PRODUCTION, ip(address))
    assert verdict.allowed and verdict.category is None


def test_ipv4_mapped_addresses_connect_over_ipv4() -> None:
    assert judge(PRODUCTION, ip("::ffff:8.8.8.8")).address == ip("8.8.8.8")
    assert judge(OutboundPolicy.dev(), ip("::ffff:127.0.0.1")).address == ip("127.0.0.1")
    # NAT64 and 6to4 go through their gateways: the IPv6 address is the one to connect to.
    assert judge(PRODUCTION, ip("64:ff9b::808:808")).address == ip("64:ff9b::808:808")


def test_embedded_ipv4() -> None:
    assert embedded_ipv4(ip("::ffff:1.2.3.4")) == ip("1.2.3.4")
    assert embedded_ipv4(ip("2002:102:304::")) == ip("1.2.3.4")
    assert embedded_ipv4(ip("64:ff9b::102:304")) == ip("1.2.3.4")
    assert embedded_ipv4(ip("2606:4700::1111")) is None
    assert embedded_ipv4(ip("1.2.3.4")) is None


def test_dev_allows_loopback_only() -> None:
    dev = OutboundPolicy.dev()
    for address in ("127.0.0.1", "127.0.0.53", "::1", "::ffff:127.0.0.1"):
        assert judge(dev, ip(address)).allowed, address
    for address in ("0.0.0.0", "::", "169.254.169.254", "10.0.0.1", "100.64.0.1"):
        assert not judge(dev, ip(address)).allowed, address


def test_allow_private_admits_rfc1918_ula_and_cgnat_but_not_the_rest() -> None:
    policy = OutboundPolicy.production(allow_private=True)
    for address in ("10.0.0.1", "192.168.1.1", "fd12::1", "100.64.0.1"):
        assert judge(policy, ip(address)).allowed, address
    for address in ("127.0.0.1", "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "fe80::1"):
        assert not judge(policy, ip(address)).allowed, address


def test_allow_cidrs_admits_exactly_those_networks_never_metadata() -> None:
    policy = OutboundPolicy.production(
        allow_cidrs=["10.1.2.0/24", "169.254.0.0/16", "0.0.0.0/0", "ff00::/8"]
    )
    assert judge(policy, ip("10.1.2.3")).allowed
    assert judge(policy, ip("192.168.0.1")).allowed  # 0.0.0.0/0: the operator asked for it
    assert judge(policy, ip("169.254.3.3")).allowed
    for never in ("169.254.169.254", "0.0.0.0", "224.0.0.1", "ff02::1"):
        assert not judge(policy, ip(never)).allowed, never
    assert not judge(OutboundPolicy.production(allow_cidrs=["10.1.2.0/24"]), ip("10.1.3.1")).allowed


def test_names_refused_before_resolution() -> None:
    for name in ("metadata.google.internal", "METADATA.google.internal.", "metadata.goog"):
        assert judge_name(OutboundPolicy.dev(), name) == Category.METADATA
    assert judge_name(PRODUCTION, "localhost") == Category.LOOPBACK
    assert judge_name(PRODUCTION, "api.localhost") == Category.LOOPBACK
    assert judge_name(OutboundPolicy.dev(), "localhost") is None
    assert judge_name(PRODUCTION, "ipfs.io") is None


def test_classify_ignores_ipv6_zone() -> None:
    assert classify(ip("fd00:ec2::254%3")) == Category.METADATA


# URLs


def test_parse_url() -> None:
    target = parse_url("https://IPFS.io/ipfs/bafy/1.json?x=1#frag")
    assert (target.scheme, target.host, target.port, target.path) == (
        "https",
        "ipfs.io",
        443,
        "/ipfs/bafy/1.json?x=1",
    )
    assert target.ip is None and target.tls and target.authority == "ipfs.io"
    assert parse_url("http://[::ffff:127.0.0.1]:8080").authority == "[::ffff:7f00:1]:8080"
    assert parse_url("http://[::1]:8080").path == "/"
    assert parse_url("http://127.0.0.1/").ip == ip("127.0.0.1")
    assert parse_url("http://bücher.example/ü").host == "xn--bcher-kva.example"
    assert parse_url("http://bücher.example/ü").path == "/%C3%BC"
    assert parse_url("http://example.com./").host == "example.com"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_INFO",
        "//example.com/",
        "http:///path",
        "http://user:hunter2@example.com/",
        "http://example.com@127.0.0.1/",
        "http://[fe80::1%25eth0]/",
        "http://[127.0.0.1]/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://0177.0.0.1/",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://example.com:-1/",
        "http://exa mple.com/",
        "http://example.com/\r\nX-Injected: 1",
        "http://example.com\\@evil.example/",
        "http://ex_ample..com/",
        "http://" + "a" * 64 + ".com/",
        "http://example.com/" + "a" * 9000,
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(FetchError) as caught:
        parse_url(url)
    assert caught.value.reason == Reason.BAD_URL


def test_bad_url_messages_never_repeat_credentials() -> None:
    with pytest.raises(FetchError) as caught:
        parse_url("https://alice:hunter2@example.com/hook")
    assert "hunter2" not in str(caught.value) and "alice" not in str(caught.value)


def test_follow_redirect() -> None:
    base = parse_url("https://a.example/x/y?q=1")
    assert follow_redirect(base, "/z").url == "https://a.example/z"
    assert follow_redirect(base, "z").url == "https://a.example/x/z"
    assert follow_redirect(base, "//b.example/w").url == "https://b.example/w"
    assert follow_redirect(base, "http://169.254.169.254/").ip == ip("169.254.169.254")
    for bad in ("file:///etc/passwd", "http://u:p@b.example/", "/a b"):
        with pytest.raises(FetchError) as caught:
            follow_redirect(base, bad)
        assert caught.value.reason == Reason.BAD_URL


# Limits, media types, bodies


def test_limits_defaults_and_bounds() -> None:
    limits = FetchLimits()
    assert (limits.max_bytes, limits.max_redirects, limits.content_types) == (1 << 20, 3, None)
    assert FetchLimits(content_types=(" Application/JSON ",)).content_types == ("application/json",)
    with pytest.raises(ValueError, match="max_redirects"):
        FetchLimits(max_redirects=4)
    with pytest.raises(ValueError, match="timeouts"):
        FetchLimits(timeout=0)


def test_media_types() -> None:
    allowed = ("application/json", "image/*")
    assert media_type_allowed("application/json; charset=utf-8", allowed)
    assert media_type_allowed("Image/PNG", allowed)
    assert not media_type_allowed("text/html", allowed)
    assert not media_type_allowed("application/jsonp", allowed)
    assert not media_type_allowed(None, allowed)
    assert not media_type_allowed("", allowed)


def test_body_reader_caps_plain_bodies() -> None:
    reader = BodyReader(10, None)
    reader.feed(b"0123456789")
    assert reader.finish() == b"0123456789"
    reader = BodyReader(10, None)
    reader.feed(b"01234")
    with pytest.raises(FetchError) as caught:
        reader.feed(b"567890")
    assert caught.value.reason == Reason.TOO_LARGE


def test_body_reader_inflates_gzip_under_the_cap() -> None:
    document = b'{"name": "token #1"}' * 10
    reader = BodyReader(len(document), content_encoding("gzip"))
    packed = gzip.compress(document)
    reader.feed(packed[:7])
    reader.feed(packed[7:])
    assert reader.finish() == document


def test_body_reader_stops_a_gzip_bomb_at_the_cap() -> None:
    bomb = gzip.compress(b"\0" * (50 << 20), compresslevel=9)
    assert len(bomb) < 100_000
    pieces: list[bytes] = []

    def feed_in_pieces(reader: BodyReader) -> None:
        for offset in range(0, len(bomb), 4096):
            pieces.append(bomb[offset : offset + 4096])
            reader.feed(pieces[-1])

    with pytest.raises(FetchError) as caught:
        feed_in_pieces(BodyReader(1 << 20, "gzip"))
    assert caught.value.reason == Reason.TOO_LARGE
    assert len(pieces) <= 4  # 1 MiB of zeros inflates from ~1 KB: stopped within a few pieces


def test_body_reader_rejects_truncated_or_invalid_gzip() -> None:
    truncated = BodyReader(1 << 20, "gzip")
    truncated.feed(gzip.compress(b"x" * 1000)[:-4])
    with pytest.raises(FetchError) as caught:
        truncated.finish()
    assert caught.value.reason == Reason.HTTP_ERROR
    with pytest.raises(FetchError) as caught:
        BodyReader(1 << 20, "gzip").feed(b"not gzip at all")
    assert caught.value.reason == Reason.HTTP_ERROR


def test_content_encodings() -> None:
    assert content_encoding(None) is None
    assert content_encoding("identity") is None
    assert content_encoding("GZIP") == "gzip"
    with pytest.raises(FetchError) as caught:
        content_encoding("br")
    assert caught.value.reason == Reason.HTTP_ERROR
