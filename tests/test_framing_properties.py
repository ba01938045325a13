"""Hypothesis properties of the framing modules, checked on both twins and between them.

* The compiled twin must give exactly what the pure twin (the specification) gives, for every
  input: arbitrary bytes, generated valid traffic, and mutations of it, fed with the same split
  points.
* Nothing may raise: every malformed input is an ``HttpError`` / a JSON-RPC error.
* Independent oracles judge the results: h11 says whether the HTTP response the edge would
  write for an outcome is valid HTTP/1.1 (the edge's own parser must not judge itself), and
  Python's ``json`` module (strict: no NaN/Infinity) says whether a body is JSON at all and what
  it means.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import h11
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chaingate import twins as impl_module
from chaingate.envelope import error_body
from chaingate.framing_constants import MAX_JSON_DEPTH
from chaingate.twins import Impl
from tests.helpers import call_fields, request_fields
from tests.jsonrpc_contract import (
    INVALID_REQUEST,
    MSG_BAD_ID,
    MSG_BAD_METHOD,
    MSG_BAD_PARAMS,
    MSG_BAD_UTF8,
    MSG_BAD_VERSION,
    MSG_BATCH_ITEM,
    MSG_EMPTY_BATCH,
    MSG_INVALID_JSON,
    MSG_NO_METHOD,
    MSG_NOT_CALL,
    MSG_TOO_DEEP,
    PARSE_ERROR,
)

# CHAINGATE_FUZZ_EXAMPLES raises the budget for a long local fuzzing run.
SETTINGS = settings(
    max_examples=int(os.environ.get("CHAINGATE_FUZZ_EXAMPLES", "400")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


JSON_CT = b"Content-Type: application/json\r\n"


@pytest.fixture(scope="module")
def impls() -> tuple[Impl, Impl]:
    """(compiled, pure): the differential tests need both at once."""
    pure = impl_module.pure()
    try:
        compiled = impl_module.compiled()
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip("compiled modules not built (run `pip install -e .`)")
    return compiled, pure


# ============================================================================================
# HTTP/1.1: generators


LIMITS: list[dict[str, int]] = [
    {},  # the defaults
    {"max_line": 24, "max_header_bytes": 48, "max_headers": 3, "max_body": 8},
    {"max_line": 40, "max_header_bytes": 120, "max_headers": 6, "max_body": 32},
    {"max_line": 64, "max_header_bytes": 400, "max_headers": 12, "max_body": 200},
]

METHODS = [b"POST", b"POST", b"GET", b"HEAD", b"PUT", b"OPTIONS", b"M-SEARCH", b"x!#$%&'*+.^_`|~"]
TARGETS = [b"/", b"/rpc", b"/v1/ethereum/mainnet", b"/a?b=c&d", b"/%7E?", b"*", b"/" + b"x" * 40]
CONNECTION_VALUES = [b"close", b"keep-alive", b"Keep-Alive", b"upgrade, close", b"foo, keep-alive"]
EXTRA_HEADERS = [
    (b"Content-Type", b"application/json"),
    (b"X-Api-Key", b"key-123"),
    (b"Authorization", b"Bearer t0k"),
    (b"X-Request-Id", b"req-9"),
    (b"Upgrade", b"h2c"),
    (b"User-Agent", b"hypothesis/1.0 (x)"),
    (b"X-Obs-Text", b"caf\xc3\xa9"),
    (b"X-Empty", b""),
    (b"Accept", b"*/*"),
    (b"Origin", b"https://app.example"),
    (b"Accept-Encoding", b"gzip, br;q=0.5"),
    (b"Content-Encoding", b"gzip"),
]
OWS = [b"", b" ", b"  ", b"\t", b" \t"]
CHUNK_EXTENSIONS = [b"", b"", b";a", b";a=b", b';q="x y"', b" ;x", b"\t;x=1;y"]
TRAILERS = [b"X-T: 1", b"Trailer-Two:\tv ", b'etag: "x"']
SPLICES = [
    b"\r\n",
    b"\r",
    b"\n",
    b" ",
    b"\t",
    b":",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    b"Host: x\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: 99999999\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip\r\n",
    b"Expect: 100-continue\r\n",
    b"Connection: close\r\n",
    b" folded\r\n",
    b"HTTP/1.1",
    b"HTTP/2.0",
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
]


def _cased(draw: st.DrawFn, name: bytes) -> bytes:
    return draw(st.sampled_from([name, name.lower(), name.upper()]))


@st.composite
def chunked_body(draw: st.DrawFn, body: bytes, h11_safe: bool = False) -> bytes:
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    # h11 refuses the whitespace RFC 9112 allows before a chunk extension (BWS ";").
    extensions = [e for e in CHUNK_EXTENSIONS if not h11_safe or e[:1] in (b"", b";")]
    out = b""
    for piece in pieces:
        if not piece:
            continue  # a zero-size chunk would end the body
        size = b"%x" % len(piece)
        size = draw(st.sampled_from([b"", b"0", b"00"])) + draw(
            st.sampled_from([size, size.upper()])
        )
        out += size + draw(st.sampled_from(extensions)) + b"\r\n" + piece + b"\r\n"
    out += b"0" + draw(st.sampled_from(extensions)) + b"\r\n"
    for trailer in draw(st.lists(st.sampled_from(TRAILERS), max_size=2)):
        out += trailer + b"\r\n"
    return out + b"\r\n"


@st.composite
def http_request(draw: st.DrawFn, h11_safe: bool = False) -> tuple[bytes, dict[str, Any]]:
    """One valid request and what the parser must make of it (with the default limits).

    ``h11_safe`` leaves out what RFC 9112 allows but h11 refuses: "Content-Length: 0" repeated
    as "00", and whitespace before a chunk extension.
    """
    method = draw(st.sampled_from(METHODS))
    target = draw(st.sampled_from(TARGETS))
    version = draw(st.sampled_from([11, 11, 11, 10]))
    fields: list[tuple[bytes, bytes]] = []
    if version == 11 or draw(st.booleans()):
        fields.append((b"Host", draw(st.sampled_from([b"example.com", b"127.0.0.1:8545", b"h"]))))
    connection = draw(st.none() | st.sampled_from(CONNECTION_VALUES))
    if connection is not None:
        fields.append((b"Connection", connection))
    fields += draw(st.lists(st.sampled_from(EXTRA_HEADERS), max_size=3, unique=True))
    if version == 11 and draw(st.integers(0, 5)) == 0:
        fields.append((b"Expect", b"100-continue"))
    framing = draw(
        st.sampled_from(
            ["none", "length", "length", "chunked"] if version == 11 else ["none", "length"]
        )
    )
    body = b"" if framing == "none" else draw(st.binary(max_size=40))
    if framing == "length":
        fields.append((b"Content-Length", b"%d" % len(body)))
        if draw(st.integers(0, 5)) == 0:
            duplicate = b"%d" % len(body) if h11_safe else b"0%d" % len(body)
            fields.append((b"Content-Length", duplicate))  # an identical duplicate
    elif framing == "chunked":
        fields.append(
            (b"Transfer-Encoding", draw(st.sampled_from([b"chunked", b"Chunked", b"CHUNKED"])))
        )
    fields = draw(st.permutations(fields))
    head = b"%s %s HTTP/1.%d\r\n" % (method, target, version % 10)
    for name, value in fields:
        head += _cased(draw, name) + b":" + draw(st.sampled_from(OWS)) + value
        head += draw(st.sampled_from(OWS)) + b"\r\n"
    head += b"\r\n"
    payload = draw(chunked_body(body, h11_safe)) if framing == "chunked" else body
    tokens = [
        t.strip().lower() for name, v in fields if name == b"Connection" for t in v.split(b",")
    ]
    keep_alive = b"close" not in tokens and (version == 11 or b"keep-alive" in tokens)
    expected = {
        "method": method,
        "target": target,
        "version": version,
        "keep_alive": keep_alive,
        "body": body,
        "headers": [(name.lower(), value) for name, value in fields],
    }
    return head + payload, expected


@st.composite
def request_stream(draw: st.DrawFn, h11_safe: bool = False) -> tuple[bytes, list[dict[str, Any]]]:
    """Pipelined valid requests, with the blank lines a client may send between them."""
    requests = draw(st.lists(http_request(h11_safe), min_size=1, max_size=3))
    blank_lines = not h11_safe  # h11 does not skip blank lines before a request
    data = b""
    for raw, _ in requests:
        if blank_lines:
            data += draw(st.sampled_from([b"", b"", b"\r\n", b"\r\n\r\n"]))
        data += raw
    return data, [expected for _, expected in requests]


@st.composite
def mutated(draw: st.DrawFn, data: bytes, splices: list[bytes]) -> bytes:
    """``data`` with a few bytes inserted, deleted, replaced or duplicated."""
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        kind = draw(
            st.sampled_from(["insert", "splice", "delete", "replace", "duplicate", "truncate"])
        )
        if kind == "insert":
            data = data[:pos] + draw(st.binary(min_size=1, max_size=3)) + data[pos:]
        elif kind == "splice":
            data = data[:pos] + draw(st.sampled_from(splices)) + data[pos:]
        elif kind == "delete":
            data = data[:pos] + data[pos + draw(st.integers(1, 8)) :]
        elif kind == "replace" and pos < len(data):
            data = data[:pos] + bytes([draw(st.integers(0, 255))]) + data[pos + 1 :]
        elif kind == "duplicate":
            end = min(len(data), pos + draw(st.integers(1, 30)))
            data = data[:end] + data[pos:end] + data[end:]
        elif kind == "truncate":
            data = data[:pos]
    return data


@st.composite
def feeding(
    draw: st.DrawFn, data_strategy: st.SearchStrategy[bytes]
) -> tuple[list[bytes], bool, dict[str, int]]:
    """Bytes split at random points (sometimes one byte at a time), EOF or not, and limits."""
    data = draw(data_strategy)
    if draw(st.integers(0, 7)) == 0:
        chunks = [data[i : i + 1] for i in range(len(data))]
    else:
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return chunks, draw(st.booleans()), draw(st.sampled_from(LIMITS))


request_bytes = st.one_of(
    st.binary(max_size=200),
    request_stream().map(lambda s: s[0]),
    request_stream().flatmap(lambda s: mutated(s[0], SPLICES)),
)


# ============================================================================================
# HTTP/1.1: running the parsers


def request_key(r: Any) -> tuple[Any, ...]:
    return ("request", *request_fields(r))


def response_key(r: Any) -> tuple[Any, ...]:
    return ("response", r.status, r.body, r.keep_alive, r.content_type, r.retry_after)


def error_key(e: Any) -> tuple[Any, ...]:
    return ("error", e.status, e.message)


def event_key(event: Any) -> tuple[Any, ...]:
    if hasattr(event, "method"):
        return request_key(event)
    if hasattr(event, "body"):
        return response_key(event)
    return error_key(event)


def run_request_parser(
    http1: Any, chunks: Iterable[bytes], eof: bool, limits: dict[str, int]
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """Feed the chunks like the edge does; return a log of every observation and the events."""
    parser = http1.RequestParser(**limits)
    log: list[tuple[Any, ...]] = []
    found: list[Any] = []

    def drain() -> None:
        while True:
            event = parser.next_event()
            if event is None:
                break
            if not found or not isinstance(found[-1], http1.HttpError):
                found.append(event)  # the outcomes, each error once
            if isinstance(event, http1.HttpError):
                log.append(error_key(event))
                again = parser.next_event()  # an error is final and repeats
                assert isinstance(again, http1.HttpError)
                assert error_key(again) == error_key(event)
                break
            log.append(request_key(event))
        log.append(("state", parser.take_continue(), parser.has_partial, parser.closed))

    for chunk in chunks:
        parser.feed(chunk)
        drain()
    if eof:
        parser.feed_eof()
        drain()
        assert parser.closed, "after EOF every byte is either a request or an error"
    return log, found


def run_response_parser(
    http1: Any, chunks: Iterable[bytes], eof: bool, limits: dict[str, int]
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    parser = http1.ResponseParser(**limits)
    log: list[tuple[Any, ...]] = []
    found: list[Any] = []

    def drain() -> None:
        while True:
            event = parser.next_event()
            if event is None:
                break
            if not found or not isinstance(found[-1], http1.HttpError):
                found.append(event)  # the outcomes, each error once
            if isinstance(event, http1.HttpError):
                log.append(error_key(event))
                again = parser.next_event()
                assert isinstance(again, http1.HttpError)
                assert error_key(again) == error_key(event)
                break
            log.append(response_key(event))
        log.append(("state", parser.has_partial))

    for chunk in chunks:
        parser.feed(chunk)
        drain()
    if eof:
        parser.feed_eof()
        drain()
    return log, found


def h11_read_response(data: bytes, method: str = "POST") -> tuple[h11.Connection, Any, bytes]:
    """Read exactly one response to ``method`` with h11; fail on anything invalid or extra."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "gateway")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    head = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            raise AssertionError(f"h11 needs more data: the response is incomplete: {data!r}")
        if isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            raise AssertionError(f"unexpected h11 event {event!r} for {data!r}")
    assert conn.trailing_data == (b"", False), f"bytes after the response: {data!r}"
    return conn, head, body


def assert_valid_response(
    data: bytes, status: int, body: bytes, keep_alive: bool, method: str = "POST"
) -> None:
    conn, head, got_body = h11_read_response(data, method)
    assert head is not None
    assert head.status_code == status
    assert got_body == body
    assert (conn.their_state is h11.MUST_CLOSE) == (not keep_alive)
    assert (b"content-type", b"application/json") in list(head.headers)


def check_edge_responses(http1: Any, events: list[Any], status: int) -> None:
    """Every outcome's response, built as the edge builds it, is valid HTTP/1.1 per h11."""
    for event in events:
        if isinstance(event, http1.HttpError):
            assert 400 <= event.status <= 599
            body = error_body(event.status, event.message)
            response = http1.build_response(event.status, JSON_CT, body, False)
            assert_valid_response(response, event.status, body, False)
            continue
        body = b'{"jsonrpc":"2.0","id":1,"result":' + json.dumps(event.body.hex()).encode() + b"}"
        response = http1.build_response(
            status, JSON_CT, body, event.keep_alive, event.version == 10
        )
        method = "POST"
        if event.method == b"HEAD":
            method = "HEAD"
            if status != 204:
                response = response[: len(response) - len(body)]  # as the edge answers HEAD
        expected_body = b"" if status == 204 or method == "HEAD" else body
        assert_valid_response(response, status, expected_body, event.keep_alive, method)


def check_request_invariants(http1: Any, events: list[Any], limits: dict[str, int]) -> None:
    max_body = limits.get("max_body", 1 << 20)
    for event in events:
        if isinstance(event, http1.HttpError):
            assert event.status in (400, 413, 414, 417, 431, 501, 505), event
            continue
        assert event.version in (10, 11)
        assert event.target[:1] == b"/" or event.target == b"*"
        assert event.path + (b"?" + event.query if b"?" in event.target else b"") == event.target
        assert len(event.body) <= max_body
        assert isinstance(event.keep_alive, bool)
        assert isinstance(event.expect_continue, bool)
        if event.version == 11:
            assert event.host is not None
        hosts = [v for n, v in event.headers if n == b"host"]
        assert len(hosts) <= 1 and event.host == (hosts[0] if hosts else None)
        for name, value in event.headers:
            assert name == name.lower() and name
            assert value == value.strip(b" \t")
            assert b"\r" not in value and b"\n" not in value and b"\x00" not in value
        lengths = {v for n, v in event.headers if n == b"content-length"}
        te = [v for n, v in event.headers if n == b"transfer-encoding"]
        assert not (lengths and te), "Content-Length and Transfer-Encoding together"
        if lengths:
            assert len({int(v) for v in lengths}) == 1
            assert len(event.body) == int(lengths.pop())


# ============================================================================================
# HTTP/1.1: properties


@SETTINGS
@given(
    feed=feeding(request_bytes),
    status=st.sampled_from([200, 200, 204, 400, 404, 413, 429, 500, 503]),
)
@example(feed=([b"\r\n\r\n"], True, {}), status=200)
@example(feed=([b"GET / HTTP/1.1\r\n\r\n"], False, {}), status=200)
@example(
    feed=(
        [b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"],
        False,
        {},
    ),
    status=200,
)
@example(feed=([b"HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"], False, {}), status=200)
@example(feed=([b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n"], True, {}), status=204)
@example(feed=([b"GET /" + b"a" * 30 + b" HTTP/1.1\r\n"], False, LIMITS[1]), status=200)
@example(feed=([b"\r"], True, {}), status=200)
@example(
    feed=(
        [
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"10000000000000000\r\n",
        ],
        False,
        {},
    ),
    status=200,
)
@example(
    feed=(
        [b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"],
        False,
        {},
    ),
    status=200,
)
@example(
    feed=(
        [b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n", b"ab"],
        True,
        {},
    ),
    status=200,
)
def test_request_parser_twins_agree_and_never_raise(
    impls: tuple[Impl, Impl], feed: tuple[list[bytes], bool, dict[str, int]], status: int
) -> None:
    chunks, eof, limits = feed
    compiled, pure = impls
    pure_log, pure_events = run_request_parser(pure.http1, chunks, eof, limits)
    compiled_log, compiled_events = run_request_parser(compiled.http1, chunks, eof, limits)
    assert compiled_log == pure_log
    # Where the bytes were split does not change what they mean.
    _, whole = run_request_parser(pure.http1, [b"".join(chunks)], eof, limits)
    assert [event_key(e) for e in whole] == [event_key(e) for e in pure_events]
    for impl, found in ((pure, pure_events), (compiled, compiled_events)):
        check_request_invariants(impl.http1, found, limits)
        check_edge_responses(impl.http1, found, status)


@SETTINGS
@given(stream=request_stream(), data=st.data())
def test_valid_requests_parse_as_generated(
    impls: tuple[Impl, Impl], stream: tuple[bytes, list[dict[str, Any]]], data: st.DataObject
) -> None:
    raw, expected = stream
    chunks, eof, _ = data.draw(feeding(st.just(raw)))
    for impl in impls:
        _, found = run_request_parser(impl.http1, chunks, eof, {})
        got = [
            {
                "method": r.method,
                "target": r.target,
                "version": r.version,
                "keep_alive": r.keep_alive,
                "body": r.body,
                "headers": list(r.headers),
            }
            for r in found
        ]
        assert got == expected


def h11_read_requests(raw: bytes) -> tuple[list[tuple[bytes, bytes, bytes]], str]:
    """The requests h11 (as a server) reads from ``raw`` and why it stopped."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    conn.receive_data(b"")
    seen: list[tuple[bytes, bytes, bytes]] = []
    body = b""
    head: Any = None
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Request):
                head, body = event, b""
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                seen.append((bytes(head.method), bytes(head.target), body))
                conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return seen, "closed"  # after HTTP/1.0 or Connection: close
                conn.start_next_cycle()
            else:
                return seen, "end"
    except h11.RemoteProtocolError as exc:
        return seen, str(exc)


@SETTINGS
@given(
    raw=st.one_of(
        request_stream(h11_safe=True).map(lambda s: s[0]),
        request_stream(h11_safe=True).flatmap(lambda s: mutated(s[0], SPLICES)),
    )
)
@example(raw=b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nxGET / HTTP/1.0\r\n\r\n")
@example(raw=b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")  # blank line: only h11 refuses
@example(raw=b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET / HTTP/1.0\r\n\r\n")
@example(
    raw=b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1;a=b\r\nx\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"
)
def test_requests_agree_with_h11(impls: tuple[Impl, Impl], raw: bytes) -> None:
    """h11 (as a server) is the oracle against request smuggling.

    Wherever both read requests, they read the same ones (method, target, body), and the parser
    never accepts a request h11 refuses: it is stricter everywhere except that it skips blank
    lines before a request (RFC 9112 section 2.2), which h11 does not.
    """
    seen, stop = h11_read_requests(raw)
    for impl in impls:
        _, found = run_request_parser(impl.http1, [raw], True, {})
        mine = [(r.method, r.target, r.body) for r in found if isinstance(r, impl.http1.Request)]
        n = min(len(seen), len(mine))
        assert mine[:n] == seen[:n]
        if len(mine) > len(seen):
            if stop == "closed":
                # h11 never keeps an HTTP/1.0 connection open; the parser honours keep-alive.
                last = found[len(seen) - 1]
                assert not last.keep_alive or last.version == 10
            else:
                assert stop == "no request line received", (stop, raw)


# ResponseParser ----------------------------------------------------------------------------

RESPONSE_STATUSES = [100, 102, 200, 200, 201, 204, 304, 404, 429, 500, 503, 599]


@st.composite
def http_response(draw: st.DrawFn, last: bool) -> tuple[bytes, dict[str, Any] | None]:
    status = draw(st.sampled_from(RESPONSE_STATUSES))
    version = draw(st.sampled_from([11, 11, 10]))
    reason = draw(st.sampled_from([b" OK", b" Some Reason", b"", b" "]))
    fields: list[tuple[bytes, bytes]] = []
    connection = draw(st.none() | st.sampled_from(CONNECTION_VALUES))
    if connection is not None:
        fields.append((b"Connection", connection))
    content_type = draw(st.none() | st.sampled_from([b"application/json", b"text/plain"]))
    if content_type is not None:
        fields.append((b"Content-Type", content_type))
    retry_after = draw(
        st.none() | st.sampled_from([b"1", b"120", b"Wed, 21 Oct 2015 07:28:00 GMT"])
    )
    if retry_after is not None:
        fields.append((b"Retry-After", retry_after))
    bodiless = status < 200 or status in (204, 304)
    framing = draw(st.sampled_from(["length", "chunked"] + (["eof"] if last else [])))
    body = b"" if bodiless else draw(st.binary(max_size=40))
    if framing == "length":
        fields.append((b"Content-Length", b"%d" % len(body)))
    elif framing == "chunked":
        fields.append((b"Transfer-Encoding", b"chunked"))
    fields = draw(st.permutations(fields))
    head = b"HTTP/1.%d %d%s\r\n" % (version % 10, status, reason)
    head += b"".join(
        _cased(draw, n) + b":" + draw(st.sampled_from(OWS)) + v + b"\r\n" for n, v in fields
    )
    head += b"\r\n"
    payload = b""
    if not bodiless:
        payload = draw(chunked_body(body)) if framing == "chunked" else body
    if status < 200:
        return head, None  # interim: skipped by the parser
    tokens = [t.strip().lower() for n, v in fields if n == b"Connection" for t in v.split(b",")]
    keep_alive = b"close" not in tokens and (version == 11 or b"keep-alive" in tokens)
    if framing == "eof" and not bodiless:
        keep_alive = False
    expected = {
        "status": status,
        "body": body,
        "keep_alive": keep_alive,
        "content_type": content_type,
        "retry_after": retry_after,
    }
    return head + payload, expected


@st.composite
def response_stream(draw: st.DrawFn) -> tuple[bytes, list[dict[str, Any]]]:
    n = draw(st.integers(1, 3))
    parts = [draw(http_response(last=i == n - 1)) for i in range(n)]
    return b"".join(p for p, _ in parts), [e for _, e in parts if e is not None]


RESPONSE_SPLICES = [
    *SPLICES[:8],
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 3\r\n",
]

response_bytes = st.one_of(
    st.binary(max_size=200),
    response_stream().map(lambda s: s[0]),
    response_stream().flatmap(lambda s: mutated(s[0], RESPONSE_SPLICES)),
)


@SETTINGS
@given(feed=feeding(response_bytes))
@example(feed=([b"HTTP/1.1 200 OK\r\n\r\nabc"], True, {}))
@example(feed=([b"HTTP/1.1 100 Continue\r\n\r\n"], True, {}))
@example(
    feed=([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"], False, {})
)
def test_response_parser_twins_agree_and_never_raise(
    impls: tuple[Impl, Impl], feed: tuple[list[bytes], bool, dict[str, int]]
) -> None:
    chunks, eof, limits = feed
    compiled, pure = impls
    pure_log, pure_events = run_response_parser(pure.http1, chunks, eof, limits)
    compiled_log, _ = run_response_parser(compiled.http1, chunks, eof, limits)
    assert compiled_log == pure_log
    _, whole = run_response_parser(pure.http1, [b"".join(chunks)], eof, limits)
    assert [event_key(e) for e in whole] == [event_key(e) for e in pure_events]
    max_body = limits.get("max_body", 64 << 20)
    for event in pure_events:
        if isinstance(event, pure.http1.HttpError):
            assert event.status == 502
        else:
            assert 200 <= event.status <= 999
            assert len(event.body) <= max_body


@SETTINGS
@given(stream=response_stream(), data=st.data())
def test_valid_responses_parse_as_generated(
    impls: tuple[Impl, Impl], stream: tuple[bytes, list[dict[str, Any]]], data: st.DataObject
) -> None:
    raw, expected = stream
    chunks, _, _ = data.draw(feeding(st.just(raw)))
    for impl in impls:
        _, found = run_response_parser(impl.http1, chunks, True, {})
        got = [
            {
                "status": r.status,
                "body": r.body,
                "keep_alive": r.keep_alive,
                "content_type": r.content_type,
                "retry_after": r.retry_after,
            }
            for r in found
        ]
        assert got == expected


# build_response ----------------------------------------------------------------------------


@SETTINGS
@given(
    status=st.integers(200, 999),
    body=st.binary(max_size=64),
    keep_alive=st.booleans(),
    http10=st.booleans(),
    head=st.booleans(),
)
@example(status=304, body=b"x", keep_alive=True, http10=False, head=False)
@example(status=204, body=b"x", keep_alive=False, http10=True, head=False)
def test_build_response_is_valid_http(
    impls: tuple[Impl, Impl], status: int, body: bytes, keep_alive: bool, http10: bool, head: bool
) -> None:
    compiled, pure = impls
    built = [impl.http1.build_response(status, JSON_CT, body, keep_alive, http10) for impl in impls]
    assert built[0] == built[1]
    response = built[1]
    bodiless = status in (204, 304)
    if head and not bodiless:
        response = response[: len(response) - len(body)]
    expected_body = b"" if head or bodiless else body
    assert_valid_response(response, status, expected_body, keep_alive, "HEAD" if head else "POST")
    # The module's own response parser reads it back the same way.
    for impl in impls:
        if head:
            continue
        _, found = run_response_parser(impl.http1, [response], False, {})
        assert [(r.status, r.body, r.keep_alive) for r in found] == [
            (status, expected_body, keep_alive)
        ]


@SETTINGS
@given(status=st.integers(-(2**70), 2**70) | st.integers(-5, 1100))
@example(status=2**31)  # was an OverflowError in the compiled twin, not a ValueError
@example(status=-(2**63) - 1)
@example(status=999)
@example(status=1000)
def test_build_response_status_range(impls: tuple[Impl, Impl], status: int) -> None:
    for impl in impls:
        if 100 <= status <= 999:
            assert impl.http1.build_response(status, b"", b"", True).startswith(
                b"HTTP/1.1 %d " % status
            )
        else:
            with pytest.raises(ValueError, match="three-digit"):
                impl.http1.build_response(status, b"", b"", True)


# ============================================================================================
# JSON-RPC: the oracle


class Obj(list):  # type: ignore[type-arg]
    """A JSON object as the (key, value) pairs it was written with, duplicates included."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_oracle(body: bytes) -> tuple[str, Any]:
    """("utf8", None) | ("invalid", None) | ("valid", tree) with objects as Obj pair lists."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "utf8", None
    try:
        tree = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=Obj)
    except RecursionError:
        return "deep", None
    except ValueError:
        return "invalid", None
    return "valid", tree


def depth(tree: Any) -> int:
    if isinstance(tree, Obj):
        return 1 + max((depth(v) for _, v in tree), default=0)
    if isinstance(tree, list):
        return 1 + max((depth(v) for v in tree), default=0)
    return 0


def plain(tree: Any) -> Any:
    """The value json.loads gives by default (a repeated key: the last one counts)."""
    if isinstance(tree, Obj):
        return {k: plain(v) for k, v in tree}
    if isinstance(tree, list):
        return [plain(v) for v in tree]
    return tree


def loads(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)


def expected_call_error(obj: dict[str, Any], version_ok: bool) -> str:
    if "id" in obj and isinstance(obj["id"], bool | dict | list):
        return MSG_BAD_ID
    if not version_ok:
        return MSG_BAD_VERSION
    if "method" not in obj:
        return MSG_NO_METHOD
    if not isinstance(obj["method"], str):
        return MSG_BAD_METHOD
    if "params" in obj and not isinstance(obj["params"], dict | list):
        return MSG_BAD_PARAMS
    return ""


def check_call(call: Any, obj: dict[str, Any], body: bytes) -> None:
    """A call against what json.loads says its object means."""
    message = expected_call_error(obj, obj.get("jsonrpc") == "2.0")
    if message != call.message and call.message == MSG_BAD_VERSION and obj.get("jsonrpc") == "2.0":
        # The version is compared as raw bytes: an escaped "2.0" does not count.
        assert b"\\" in body
        message = expected_call_error(obj, False)
    assert call.message == message
    if message:
        assert (call.error, call.method, call.params) == (INVALID_REQUEST, None, None)
        if message == MSG_BAD_ID or "id" not in obj:
            assert call.id == b"null"
        else:
            assert loads(call.id) == obj["id"]
        return
    assert call.error == 0
    assert call.method == obj["method"]
    if "id" in obj:
        assert loads(call.id) == obj["id"]
    else:
        assert call.id is None
    if "params" in obj:
        assert loads(call.params) == obj["params"]
        assert call.params == call.params.strip(b" \t\r\n")
    else:
        assert call.params is None


def check_request_oracle(parsed: Any, body: bytes, max_batch: int) -> None:
    kind, tree = json_oracle(body)
    if kind == "utf8":
        assert (parsed.error, parsed.message, parsed.calls) == (PARSE_ERROR, MSG_BAD_UTF8, [])
        return
    if kind == "invalid":
        assert parsed.error == PARSE_ERROR, "json.loads refuses this body"
        assert parsed.message in (MSG_INVALID_JSON, MSG_TOO_DEEP) and parsed.calls == []
        return
    if kind == "deep" or depth(tree) > MAX_JSON_DEPTH:
        assert (parsed.error, parsed.message, parsed.calls) == (PARSE_ERROR, MSG_TOO_DEEP, [])
        return
    assert parsed.error != PARSE_ERROR, f"valid JSON refused: {parsed.message}"
    if isinstance(tree, Obj):
        assert (parsed.batch, parsed.error, parsed.message, len(parsed.calls)) == (False, 0, "", 1)
        check_call(parsed.calls[0], plain(tree), body)
    elif isinstance(tree, list):
        assert parsed.batch is True
        if not tree:
            assert (parsed.error, parsed.message, parsed.calls) == (
                INVALID_REQUEST,
                MSG_EMPTY_BATCH,
                [],
            )
        elif len(tree) > max_batch:
            message = (
                f"invalid request: batch of {len(tree)} calls exceeds the limit of {max_batch}"
            )
            assert (parsed.error, parsed.message, parsed.calls) == (INVALID_REQUEST, message, [])
        else:
            assert (parsed.error, parsed.message, len(parsed.calls)) == (0, "", len(tree))
            for call, item in zip(parsed.calls, tree, strict=True):
                if isinstance(item, Obj):
                    check_call(call, plain(item), body)
                else:
                    assert (call.id, call.method, call.params, call.error, call.message) == (
                        b"null",
                        None,
                        None,
                        INVALID_REQUEST,
                        MSG_BATCH_ITEM,
                    )
    else:
        assert (parsed.batch, parsed.error, parsed.message, parsed.calls) == (
            False,
            INVALID_REQUEST,
            MSG_NOT_CALL,
            [],
        )


def assert_jsonrpc_response(data: bytes) -> dict[str, Any]:
    obj = loads(data)
    assert isinstance(obj, dict), data
    assert obj.get("jsonrpc") == "2.0", data
    assert "id" in obj, data
    assert obj["id"] is None or isinstance(obj["id"], str | int | float), data
    assert not isinstance(obj["id"], bool), data
    assert ("result" in obj) != ("error" in obj), data
    if "error" in obj and isinstance(obj["error"], dict) and "code" in obj["error"]:
        assert isinstance(obj["error"]["code"], int) and isinstance(obj["error"]["message"], str)
    return obj


def check_replies(jsonrpc: Any, parsed: Any) -> None:
    """Every reply the proxy can assemble from a parse result is a valid JSON-RPC response."""
    replies: list[bytes] = []
    if parsed.error:
        reply = jsonrpc.error_reply(b"null", parsed.error, parsed.message)
        obj = assert_jsonrpc_response(reply)
        assert obj["error"] == {"code": parsed.error, "message": parsed.message}
        replies.append(reply)
    for call in parsed.calls:
        if call.error:
            reply = jsonrpc.error_reply(call.id, call.error, call.message)
            obj = assert_jsonrpc_response(reply)
            assert obj["id"] == loads(call.id)
            assert obj["error"] == {"code": call.error, "message": call.message}
            replies.append(reply)
            continue
        if call.id is None:
            continue  # a notification gets no reply
        result = jsonrpc.result_reply(call.id, call.params or b"null")
        assert assert_jsonrpc_response(result)["id"] == loads(call.id)
        raw_error = jsonrpc.raw_error_reply(call.id, b'{"code":-32601,"message":"no such method"}')
        assert assert_jsonrpc_response(raw_error)["error"]["code"] == -32601
        # The client's method string in a message: any unicode must round-trip.
        named = jsonrpc.error_reply(call.id, -32601, call.method)
        assert assert_jsonrpc_response(named)["error"]["message"] == call.method
        replies += [result, raw_error, named]
        # And the call as forwarded to a node parses back to the same method and params.
        forwarded = jsonrpc.upstream_request(7, call.method, call.params)
        again = jsonrpc.parse_request(forwarded, 1)
        assert again.error == 0
        assert (again.calls[0].id, again.calls[0].method) == (b"7", call.method)
        assert again.calls[0].params == (b"[]" if call.params is None else call.params)
    joined = loads(jsonrpc.join_batch(replies))
    assert len(joined) == len(replies)


def request_result_key(p: Any) -> tuple[Any, ...]:
    return (p.batch, p.error, p.message, [call_fields(c) for c in p.calls])


def response_result_key(p: Any) -> Any:
    if p is None:
        return None
    return (p.batch, [(r.id, r.result, r.error, r.block) for r in p.replies])


# ============================================================================================
# JSON-RPC: generators


class Raw(str):
    """JSON text to emit as is (a number in a form json.dumps would not choose)."""


WHITESPACE = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n  ", "  "])
NUMBER_TEXT = st.from_regex(
    r"-?(0|[1-9][0-9]{0,4})(\.[0-9]{1,4})?([eE][+-]?[0-9]{1,3})?", fullmatch=True
)
KEYS = st.sampled_from(["id", "jsonrpc", "method", "params", "result", "error"]) | st.text(
    max_size=6
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfffb", "\u2028", "\x00\x1f", 'q"\\/']),
    NUMBER_TEXT.map(Raw),
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.lists(st.tuples(KEYS, children), max_size=4).map(Obj)
    ),
    max_leaves=12,
)
IDS = st.one_of(
    st.sampled_from(
        [Raw("1"), Raw("1.0"), Raw("-5e3"), Raw("0"), Raw("-0.0E-0"), "abc", 'a"b', None]
    ),
    st.integers(),
    st.text(max_size=5),
    st.sampled_from([True, False, Obj(), [], [1]]),
)


@st.composite
def json_string(draw: st.DrawFn, s: str) -> str:
    mode = draw(st.integers(0, 3))
    has_surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in s)
    if mode == 0 or has_surrogate:
        return json.dumps(s)
    if mode == 1:
        return json.dumps(s, ensure_ascii=False)
    if mode == 2:
        return '"' + "".join(f"\\u{ord(c):04x}" for c in s) + '"'
    flags = draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s)))
    inner = "".join(
        f"\\u{ord(c):04X}" if f and ord(c) < 0x10000 else json.dumps(c, ensure_ascii=False)[1:-1]
        for c, f in zip(s, flags, strict=True)
    )
    return '"' + inner + '"'


@st.composite
def render(draw: st.DrawFn, value: Any) -> str:
    """JSON text for ``value`` with random whitespace and string escapes."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj):
        parts = [
            draw(WHITESPACE)
            + draw(json_string(k))
            + draw(WHITESPACE)
            + ":"
            + draw(WHITESPACE)
            + draw(render(v))
            + draw(WHITESPACE)
            for k, v in value
        ]
        return "{" + (",".join(parts) if parts else draw(WHITESPACE)) + "}"
    if isinstance(value, list):
        parts = [draw(WHITESPACE) + draw(render(v)) + draw(WHITESPACE) for v in value]
        return "[" + (",".join(parts) if parts else draw(WHITESPACE)) + "]"
    if isinstance(value, str):
        return draw(json_string(value))
    return json.dumps(value)


@st.composite
def jsonrpc_call(draw: st.DrawFn) -> Obj:
    pairs: list[tuple[str, Any]] = []
    if draw(st.integers(0, 9)):
        pairs.append(
            ("jsonrpc", draw(st.sampled_from(["2.0"] * 6 + ["1.0", "2.0 ", Raw("2.0"), None])))
        )
    if draw(st.integers(0, 4)):
        pairs.append(("id", draw(IDS)))
    if draw(st.integers(0, 9)):
        method = st.sampled_from(
            ["eth_blockNumber", "eth_call", "net_version", "", "m\u00e9\ud83d"]
        )
        pairs.append(("method", draw(st.one_of(method, method, st.text(max_size=8), SCALARS))))
    if draw(st.booleans()):
        params = st.lists(VALUES, max_size=3) | st.lists(st.tuples(KEYS, VALUES), max_size=3).map(
            Obj
        )
        pairs.append(("params", draw(st.one_of(params, params, params, SCALARS))))
    pairs += draw(st.lists(st.tuples(KEYS, VALUES), max_size=2))
    return Obj(draw(st.permutations(pairs)))


JSONRPC_VALUES = st.one_of(
    jsonrpc_call(),
    st.lists(jsonrpc_call() | VALUES, max_size=5),
    st.lists(jsonrpc_call(), min_size=1, max_size=5),
    VALUES,
)


@st.composite
def json_document(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> bytes:
    text = draw(WHITESPACE) + draw(render(draw(values))) + draw(WHITESPACE)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def deep_document(draw: st.DrawFn) -> bytes:
    """Nesting around the limit, inside a call's params or bare, closed or not."""
    n = draw(st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"a":', "}]")]))
    inner = opener * n + draw(st.sampled_from(["1", "[]", "{}", '"x"'])) + closer * n
    if draw(st.booleans()):
        inner = '{"jsonrpc":"2.0","id":1,"method":"m","params":[' + inner + "]}"
    if draw(st.booleans()):
        inner = "[" + inner + "]"
    if draw(st.integers(0, 3)) == 0:
        inner = inner[: draw(st.integers(0, len(inner)))]
    return inner.encode()


JSON_SPLICES = [
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b",",
    b":",
    b"\\",
    b"\\u",
    b"0",
    b"-",
    b"e",
    b".",
    b" ",
    b"\x00",
    b"\x1f",
    b"\xc3",
    b"\xc3\xa9",
    b"\xed\xa0\x80",
    b"\xff",
    b"true",
    b"null",
    b'"id":',
    b'"\\u0069d":',
    b"NaN",
    b"Infinity",
    b"1e400",
]

json_bodies = st.one_of(
    st.binary(max_size=120),
    json_document(JSONRPC_VALUES),
    json_document(JSONRPC_VALUES).flatmap(lambda b: mutated(b, JSON_SPLICES)),
    deep_document(),
)


# ============================================================================================
# JSON-RPC: properties


@SETTINGS
@given(body=json_bodies, small=st.integers(0, 3))
@example(body=b'{"jsonrpc":"2.0","id":1,"method":"m"}', small=0)
@example(body=b"[" * 129 + b"]" * 129, small=1)
@example(body=b"[" * 128 + b"]" * 128, small=1)
@example(body=b"[1,2,3,", small=2)
@example(body=b"[1,2,3,{]", small=2)
@example(body=b"\xef\xbb\xbf{}", small=1)
@example(body=b'{"jsonrpc":"2\\u002e0","id":1,"method":"m"}', small=1)
@example(body=b'{"\\u006a\\u0073onrpc":"2.0","\\u0069d":1,"method":"m"}', small=1)
@example(body=b'{"jsonrpc":"2.0","id":1,"method":"\\ud800"}', small=1)
@example(body=b'{"jsonrpc":"2.0","id":1,"method":"m","params":[NaN]}', small=1)
@example(body=b'{"jsonrpc":"2.0","id":1e400,"method":"m"}', small=1)
@example(body=b'{"jsonrpc":"2.0","id":-0,"method":"m","x":{"a":1,"a":[[[]]]}}', small=1)
@example(body=b'{"a":' * 200, small=1)
@example(body=b"\x00", small=1)
@example(body=b'"\xed\xa0\x80"', small=1)
def test_parse_request_twins_agree_never_raise_and_match_json(
    impls: tuple[Impl, Impl], body: bytes, small: int
) -> None:
    compiled, pure = impls
    for max_batch in (small, 1000):
        results = [impl.jsonrpc.parse_request(body, max_batch) for impl in impls]
        assert request_result_key(results[0]) == request_result_key(results[1])
        for impl, parsed in zip(impls, results, strict=True):
            check_request_oracle(parsed, body, max_batch)
            check_replies(impl.jsonrpc, parsed)


def check_response_oracle(parsed: Any, body: bytes) -> None:
    kind, tree = json_oracle(body)
    # Obj is a list too: objects and arrays are framing, scalars and invalid JSON are not.
    if kind != "valid" or depth(tree) > MAX_JSON_DEPTH or not isinstance(tree, list):
        assert parsed is None
        return

    def check_reply(reply: Any, item: Any) -> None:
        if not isinstance(item, Obj):
            assert (reply.id, reply.result, reply.error) == (None, None, None)
            return
        obj = plain(item)
        for name, raw in (("id", reply.id), ("result", reply.result), ("error", reply.error)):
            if name in obj:
                assert raw is not None and loads(raw) == obj[name]
            else:
                assert raw is None

    if isinstance(tree, Obj):
        assert parsed.batch is False and len(parsed.replies) == 1
        check_reply(parsed.replies[0], tree)
    else:
        assert parsed.batch is True and len(parsed.replies) == len(tree)
        for reply, item in zip(parsed.replies, tree, strict=True):
            check_reply(reply, item)


REPLY_VALUES = st.one_of(
    st.lists(
        st.tuples(st.sampled_from(["jsonrpc", "id", "result", "error"]) | KEYS, VALUES), max_size=5
    ).map(Obj),
    st.lists(
        st.lists(st.tuples(st.sampled_from(["id", "result", "error"]), VALUES), max_size=4).map(Obj)
        | VALUES,
        max_size=4,
    ),
    VALUES,
)

response_bodies = st.one_of(
    st.binary(max_size=120),
    json_document(REPLY_VALUES),
    json_document(REPLY_VALUES).flatmap(lambda b: mutated(b, JSON_SPLICES)),
    deep_document(),
)


@SETTINGS
@given(body=response_bodies)
@example(body=b'[{"jsonrpc":"2.0","id":1,"result":"0x1"}, 7, {"\\u0069d":2,"error":{}}]')
@example(body=b"[]")
@example(body=b" [ ] x")
@example(body=b"[" * 129 + b"]" * 129)
def test_parse_response_twins_agree_and_match_json(impls: tuple[Impl, Impl], body: bytes) -> None:
    results = [impl.jsonrpc.parse_response(body) for impl in impls]
    assert response_result_key(results[0]) == response_result_key(results[1])
    for parsed in results:
        check_response_oracle(parsed, body)


# The block a result names (``Reply.block``, ``result_block``): the compiled twin reads it while
# it scans the response; both must answer as the pure twin's decoder of the result does.
BLOCK_TEXTS = st.one_of(
    st.sampled_from(["0x0", "0x2a", "0xFF", "0x", "", "42", "0xzz", "0x1_0", "0x" + "f" * 15,
                     "0x" + "f" * 16, " 0x1", "0x1 ", "0X1", "0x9\n", "0x\u00e9"]),
    st.integers(0, 2**64).map(hex),
)  # fmt: skip
BLOCK_VALUES = st.one_of(
    BLOCK_TEXTS, st.none(), st.integers(0, 99), st.booleans(), st.just(Obj()), st.just([])
)
BLOCK_KEYS = st.sampled_from(
    ["number", "blockNumber", "blockNumber", "number", "logs", "hash", "numbers", "blocknumber"]
)


@st.composite
def block_results(draw: st.DrawFn) -> Any:
    """A result as a block, a transaction or a receipt names its block: ``number`` and
    ``blockNumber`` members (some twice, some escaped, of any type), among others, and inside
    nested logs; sometimes a list of them, or another value."""
    members = Obj(draw(st.lists(st.tuples(BLOCK_KEYS, BLOCK_VALUES | VALUES), max_size=6)))
    if draw(st.booleans()):
        members.append(("logs", [Obj([("blockNumber", draw(BLOCK_TEXTS))])]))
    return draw(st.sampled_from([members, [members], [members, members]]) | VALUES)


def _block_answer(result: bytes) -> int | None:
    """The pure twin's decoder: what every twin's answer must equal."""
    return impl_module.pure().jsonrpc.result_block(result)


@SETTINGS
@given(result=json_document(block_results()), batch=st.booleans())
@example(result=b'{"number":"0x1","x":"\\n"}', batch=False)
@example(result=b'{"numb\\u0065r":"0x1"}', batch=True)
@example(result=b'{"blockNumber":"0x2","blockNumber":"0x3"}', batch=False)
@example(result=b'{"number":7,"blockNumber":"0x3"}', batch=False)
@example(result=b'{"logs":[{"blockNumber":"0x9"}],"blockNumber":"0x3"}', batch=True)
@example(result=b'{"blockNumber":"0x' + b"f" * 16 + b'"}', batch=False)
@example(result=b'[{"number":"0x4"}]', batch=False)
@example(result=b'"0x5"', batch=False)
def test_reply_block_twins_agree(impls: tuple[Impl, Impl], result: bytes, batch: bool) -> None:
    expected = _block_answer(result)
    reply = b'{"jsonrpc":"2.0","id":1,"result":' + result + b"}"
    body = b"[" + reply + b"," + reply + b"]" if batch else reply
    for impl in impls:
        assert impl.jsonrpc.result_block(result) == expected, (impl.name, result)
        parsed = impl.jsonrpc.parse_response(body)
        assert parsed is not None
        assert [r.block for r in parsed.replies] == [expected] * (2 if batch else 1), (
            impl.name,
            body,
        )


BLOCK_SPECIALS = [b"\\n", b"\\u0030", b"\xc3\xa9", b'\\"']


@pytest.mark.parametrize("special", BLOCK_SPECIALS)
def test_a_reply_block_beside_special_bytes(impls: tuple[Impl, Impl], special: bytes) -> None:
    """An escape or non-ASCII byte anywhere in a result, before or after its block member."""
    for before in range(18):
        text = b"a" * before + special
        for result in (
            b'{"x":"' + text + b'","blockNumber":"0x1f"}',
            b'{"blockNumber":"0x1f","x":"' + text + b'"}',
            b'{"' + text + b'":1,"number":"0x2"}',
        ):
            reply = b'{"jsonrpc":"2.0","id":1,"result":' + result + b"}"
            expected = _block_answer(result)
            for impl in impls:
                (got,) = impl.jsonrpc.parse_response(reply).replies
                assert got.block == expected, (impl.name, result)


# What a string scan must stop at, or read past only as UTF-8; the compiled scans skip eight
# plain bytes at a time, so each goes at every offset of the words around it.
STRING_SPECIALS = [
    b'\\"',
    b"\\\\",
    b"\\u00e9",
    b"\\ud83d\\ude00",
    b"\\n",
    b"\\x",
    b"\\u12g4",
    b"\\",
    b"\x00",
    b"\x01",
    b"\x1f",
    b"\x7f",
    b" ",
    b"\xc3\xa9",
    b"\xf0\x9f\x98\x80",
    b"\x80",
    b"\xc3",
    b"\xed\xa0\x80",
    b'"',
]


@pytest.mark.parametrize("special", STRING_SPECIALS)
def test_string_scans_agree_at_every_offset(impls: tuple[Impl, Impl], special: bytes) -> None:
    for before in range(18):
        for after in (0, 1, 7, 8, 9, 17):
            text = b"0x" + b"a" * before + special + b"f" * after
            response = b'{"jsonrpc":"2.0","id":1,"result":"' + text + b'"}'
            results = [impl.jsonrpc.parse_response(response) for impl in impls]
            assert response_result_key(results[0]) == response_result_key(results[1]), response
            check_response_oracle(results[0], response)
            request = b'{"jsonrpc":"2.0","id":1,"method":"m","params":["' + text + b'"]}'
            parsed = [impl.jsonrpc.parse_request(request, 10) for impl in impls]
            assert request_result_key(parsed[0]) == request_result_key(parsed[1]), request
            check_request_oracle(parsed[0], request, 10)


ARRAY_VALUES = st.lists(VALUES, max_size=6)


@SETTINGS
@given(
    raw=st.one_of(
        st.binary(max_size=80),
        json_document(ARRAY_VALUES),
        json_document(ARRAY_VALUES).flatmap(lambda b: mutated(b, JSON_SPLICES)),
        deep_document(),
    ),
    index=st.integers(-1, 8),
)
@example(raw=b"[1,2", index=1)
@example(raw=b" [ 1 , [2, 3] ] ", index=1)
@example(raw=b"[" * 130 + b"]" * 130, index=0)
def test_array_item_twins_agree(impls: tuple[Impl, Impl], raw: bytes, index: int) -> None:
    items = [impl.jsonrpc.array_item(raw, index) for impl in impls]
    assert items[0] == items[1]
    item = items[1]
    kind, tree = json_oracle(raw)
    if kind == "valid" and isinstance(tree, list) and not isinstance(tree, Obj):
        if depth(tree) <= MAX_JSON_DEPTH and 0 <= index < len(tree):
            assert item is not None
            assert item == item.strip(b" \t\r\n")
            assert plain(
                json.loads(item, parse_constant=_reject_constant, object_pairs_hook=Obj)
            ) == plain(tree[index])
        elif index < 0 or index >= len(tree):
            assert item is None
    if item is not None:
        assert item in raw


# Reply builders ----------------------------------------------------------------------------

RAW_IDS = st.one_of(
    st.integers().map(lambda i: str(i).encode()),
    st.text(max_size=10).map(lambda s: json.dumps(s).encode()),
    st.text(max_size=10).map(
        lambda s: json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ),
    NUMBER_TEXT.map(str.encode),
    st.just(b"null"),
)


@SETTINGS
@given(
    raw_id=RAW_IDS,
    code=st.integers(-(2**31), 2**31 - 1),
    message=st.text(max_size=30) | st.sampled_from(["\ud800", 'a"b\\c', "\x00\n\u2028"]),
    result=json_document(VALUES),
)
def test_reply_builders_produce_valid_jsonrpc(
    impls: tuple[Impl, Impl], raw_id: bytes, code: int, message: str, result: bytes
) -> None:
    compiled, pure = impls
    built = []
    for impl in impls:
        m = impl.jsonrpc
        replies = [
            m.error_reply(raw_id, code, message),
            m.result_reply(raw_id, result),
            m.raw_error_reply(
                raw_id,
                m.error_reply(b"null", code, message)[
                    len(b'{"jsonrpc":"2.0","id":null,"error":') : -1
                ],
            ),
        ]
        for reply in replies:
            assert_jsonrpc_response(reply)
        err = loads(replies[0])
        assert err == {
            "jsonrpc": "2.0",
            "id": loads(raw_id),
            "error": {"code": code, "message": message},
        }
        assert loads(replies[1])["result"] == loads(result)
        assert loads(replies[2])["error"] == {"code": code, "message": message}
        batch = m.join_batch(replies)
        assert loads(batch) == [loads(r) for r in replies]
        if message:
            forwarded = m.upstream_request(abs(code), message, None)
            assert loads(forwarded) == {
                "jsonrpc": "2.0",
                "id": abs(code),
                "method": message,
                "params": [],
            }
        built.append([*replies, batch])
    assert built[0] == built[1]
