"""Example-based tests of the HTTP/1.1 framing (``chaingate._pure.http1`` and its compiled twin).

Every test takes the ``impl`` fixture, so it runs against both the compiled and the pure
module.  The pure module's docstrings are the specification.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaingate.twins import Impl
from tests.helpers import request_fields

SIMPLE = b"POST /rpc HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\nhello"
CLOSED_MID_REQUEST = "connection closed in the middle of a request"


def events(parser: Any) -> list[Any]:
    """Every event the parser can hand out now: requests, then possibly one final error."""
    out: list[Any] = []
    while True:
        event = parser.next_event()
        if event is None:
            return out
        out.append(event)
        if not hasattr(event, "method") and not hasattr(event, "body"):
            return out  # an HttpError is final


def parse(impl: Impl, data: bytes, eof: bool = False, **limits: int) -> list[Any]:
    parser = impl.http1.RequestParser(**limits)
    parser.feed(data)
    if eof:
        parser.feed_eof()
    return events(parser)


def error_of(impl: Impl, data: bytes, eof: bool = False, **limits: int) -> tuple[int, str]:
    """The single HttpError the parser yields for ``data`` (requests before it are allowed)."""
    out = parse(impl, data, eof, **limits)
    assert out, "expected an HttpError, got nothing"
    err = out[-1]
    assert isinstance(err, impl.http1.HttpError), f"expected an HttpError, got {out!r}"
    return err.status, err.message


def one_request(impl: Impl, data: bytes, **limits: int) -> Any:
    out = parse(impl, data, **limits)
    assert len(out) == 1, out
    request = out[0]
    assert isinstance(request, impl.http1.Request), request
    return request


def response_events(impl: Impl, data: bytes, eof: bool = False, **limits: int) -> list[Any]:
    parser = impl.http1.ResponseParser(**limits)
    parser.feed(data)
    if eof:
        parser.feed_eof()
    return events(parser)


# --------------------------------------------------------------------------------------------
# RequestParser: the basics


def test_simple_post(impl: Impl) -> None:
    r = one_request(impl, SIMPLE)
    assert r.method == b"POST"
    assert r.target == b"/rpc"
    assert r.path == b"/rpc"
    assert r.query == b""
    assert r.version == 11
    assert r.keep_alive is True
    assert r.body == b"hello"
    assert r.host == b"example.com"
    assert r.expect_continue is False
    assert r.headers == [(b"host", b"example.com"), (b"content-length", b"5")]


def test_path_and_query_are_split_at_the_first_question_mark(impl: Impl) -> None:
    r = one_request(impl, b"GET /a/b?x=1?y HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (r.target, r.path, r.query) == (b"/a/b?x=1?y", b"/a/b", b"x=1?y")
    assert r.body == b""
    r = one_request(impl, b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (r.target, r.path, r.query) == (b"*", b"*", b"")


def test_nothing_until_the_request_is_complete(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(SIMPLE[:-1])
    assert parser.next_event() is None
    assert parser.has_partial
    parser.feed(SIMPLE[-1:])
    assert parser.next_event().body == b"hello"
    assert not parser.has_partial
    assert parser.next_event() is None


@pytest.mark.parametrize(
    ("version", "connection", "keep_alive"),
    [
        (b"HTTP/1.1", None, True),
        (b"HTTP/1.1", b"close", False),
        (b"HTTP/1.1", b"Keep-Alive", True),
        (b"HTTP/1.1", b"upgrade, CLOSE", False),
        (b"HTTP/1.1", b"keep-alive, close", False),
        (b"HTTP/1.0", None, False),
        (b"HTTP/1.0", b"keep-alive", True),
        (b"HTTP/1.0", b" foo ,\tKEEP-ALIVE ", True),
        (b"HTTP/1.0", b"close", False),
        (b"HTTP/1.0", b"keep-alive, close", False),
        (b"HTTP/1.0", b"keep-alives", False),
    ],
)
def test_keep_alive_defaults(
    impl: Impl, version: bytes, connection: bytes | None, keep_alive: bool
) -> None:
    head = b"GET / " + version + b"\r\nHost: h\r\n"
    if connection is not None:
        head += b"Connection: " + connection + b"\r\n"
    r = one_request(impl, head + b"\r\n")
    assert r.version == (11 if version == b"HTTP/1.1" else 10)
    assert r.keep_alive is keep_alive


def test_http10_without_host_is_accepted(impl: Impl) -> None:
    r = one_request(impl, b"GET / HTTP/1.0\r\n\r\n")
    assert r.host is None
    assert r.version == 10


def test_pipelined_requests_come_out_in_order(impl: Impl) -> None:
    data = (
        b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nA"
        b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nC\r\n0\r\n\r\n"
        b"POST /d HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nD"
    )
    parser = impl.http1.RequestParser()
    parser.feed(data)
    out = events(parser)
    assert [(r.path, r.body) for r in out] == [(b"/a", b"A"), (b"/b", b""), (b"/c", b"C")]
    assert parser.has_partial
    parser.feed(b"D")
    r = parser.next_event()
    assert (r.path, r.body) == (b"/d", b"DD")
    assert parser.next_event() is None
    assert not parser.has_partial


PIPELINE = (
    b"\r\n"
    b"POST /one?q=1 HTTP/1.1\r\nHost: h\r\nX-Api-Key: k1\r\nContent-Length: 3\r\n\r\nabc"
    b"POST /two HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3;ext=1\r\nxyz\r\n2\r\n\r\n\r\n0\r\nTrailer: yes\r\n\r\n"
    b"\r\n\r\n"
    b"GET /three HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    b"POST /four HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody"
)


def test_feeding_one_byte_at_a_time_gives_the_same_requests(impl: Impl) -> None:
    whole = [request_fields(r) for r in parse(impl, PIPELINE)]
    assert [f[2] for f in whole] == [b"/one", b"/two", b"/three", b"/four"]
    assert [f[6] for f in whole] == [b"abc", b"xyz\r\n", b"", b"body"]
    parser = impl.http1.RequestParser()
    split: list[Any] = []
    for i in range(len(PIPELINE)):
        parser.feed(PIPELINE[i : i + 1])
        split.extend(events(parser))
    assert [request_fields(r) for r in split] == whole


def test_every_split_point_gives_the_same_requests(impl: Impl) -> None:
    whole = [request_fields(r) for r in parse(impl, PIPELINE)]
    for cut in range(len(PIPELINE) + 1):
        parser = impl.http1.RequestParser()
        parser.feed(PIPELINE[:cut])
        got = events(parser)
        parser.feed(PIPELINE[cut:])
        got += events(parser)
        assert [request_fields(r) for r in got] == whole, cut


def test_chunked_body_with_extensions_and_trailers(impl: Impl) -> None:
    data = (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n"
        b"5;name=value;flag\r\nhello\r\n"
        b'A \t;x="quoted"\r\n0123456789\r\n'
        b"0;last\r\nX-Trailer: 1\r\nOther:  two \r\n\r\n"
    )
    r = one_request(impl, data)
    assert r.body == b"hello0123456789"
    # Trailers are checked but not merged into the headers.
    assert r.headers == [(b"host", b"h"), (b"transfer-encoding", b"Chunked")]


def test_chunked_empty_body(impl: Impl) -> None:
    r = one_request(
        impl, b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    assert r.body == b""


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        (b"g\r\n", "invalid chunk size"),
        (b"\r\n", "invalid chunk size"),
        (b";ext\r\n", "invalid chunk size"),
        (b" 5\r\n", "invalid chunk size"),
        (b"-1\r\n", "invalid chunk size"),
        (b"1" * 17 + b"\r\n", "invalid chunk size"),
        (b"5;a\x00b\r\n", "invalid character in chunk extension"),
        (b"5;a\rb\r\n", "invalid character in chunk extension"),
        (b"3\r\nabcX\r\n", "chunk data not followed by CRLF"),
        (b"0\r\nbad trailer\r\n\r\n", "header line without a name and colon"),
        (b"0\r\n folded: x\r\n\r\n", "obsolete line folding is not accepted"),
        (b"0\r\nA: \nb\r\n\r\n", "bare CR or LF in trailer section"),
        (b"5" + b";" * 1030 + b"\r\n", "chunk size line too long"),
        (b"5" + b";" * 1030, "chunk size line too long"),
    ],
)
def test_bad_chunked_framing_is_400(impl: Impl, chunks: bytes, message: str) -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert error_of(impl, head + chunks) == (400, message)


def test_chunked_trailer_section_is_bounded(impl: Impl) -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
    assert error_of(impl, head + b"X: " + b"y" * 200 + b"\r\n", max_header_bytes=100) == (
        431,
        "trailer section too large",
    )
    assert error_of(impl, head + b"X: " + b"y" * 200, max_header_bytes=100) == (
        431,
        "trailer section too large",
    )


# --------------------------------------------------------------------------------------------
# Expect: 100-continue


def test_expect_continue_once_while_the_body_is_pending(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n")
    assert parser.take_continue() is False  # nothing parsed yet
    assert parser.next_event() is None
    assert parser.take_continue() is True
    assert parser.take_continue() is False
    parser.feed(b"abc")
    r = parser.next_event()
    assert r.body == b"abc"
    assert r.expect_continue is True
    assert parser.take_continue() is False


def test_expect_continue_not_due_when_the_body_came_along(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"
    )
    r = parser.next_event()
    assert r.expect_continue is True
    assert parser.take_continue() is False


def test_expect_continue_not_due_without_a_body(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n")
    r = parser.next_event()
    assert r.expect_continue is True
    assert parser.take_continue() is False
    parser = impl.http1.RequestParser()
    parser.feed(b"GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n")
    assert parser.next_event().body == b""
    assert parser.take_continue() is False


def test_expect_continue_with_a_chunked_body(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(
        b"POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert parser.next_event() is None
    assert parser.take_continue() is True
    parser.feed(b"1\r\nx\r\n")
    assert parser.next_event() is None
    assert parser.take_continue() is False
    parser.feed(b"0\r\n\r\n")
    assert parser.next_event().body == b"x"


def test_expect_continue_is_ignored_on_http10(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
    assert parser.next_event() is None
    assert parser.take_continue() is False
    parser.feed(b"abc")
    r = parser.next_event()
    assert r.expect_continue is False
    # Any other expectation is refused on 1.1 and ignored on 1.0.
    assert error_of(impl, b"GET / HTTP/1.1\r\nHost: h\r\nExpect: something\r\n\r\n") == (
        417,
        "unsupported Expect header",
    )
    assert (
        one_request(impl, b"GET / HTTP/1.0\r\nExpect: something\r\n\r\n").expect_continue is False
    )


# --------------------------------------------------------------------------------------------
# Limits


def test_request_line_over_max_line_is_414(impl: Impl) -> None:
    line = b"GET /" + b"a" * 100 + b" HTTP/1.1"
    assert len(line) == 114
    ok = one_request(impl, line + b"\r\nHost: h\r\n\r\n", max_line=114)
    assert ok.path == b"/" + b"a" * 100
    assert error_of(impl, line + b"\r\nHost: h\r\n\r\n", max_line=113) == (
        414,
        "start line too long",
    )
    # Refused before the line ends, once more than max_line bytes are buffered.
    assert error_of(impl, line, max_line=50) == (414, "start line too long")
    assert parse(impl, line[:51], max_line=50) == []


def test_header_section_over_max_header_bytes_is_431(impl: Impl) -> None:
    fields = b"Host: h\r\nX-Pad: " + b"p" * 80 + b"\r\n"
    data = b"GET / HTTP/1.1\r\n" + fields + b"\r\n"
    limit = len(fields) + 2  # the field lines plus the blank line
    assert one_request(impl, data, max_header_bytes=limit).host == b"h"
    assert error_of(impl, data, max_header_bytes=limit - 1) == (431, "header section too large")
    # Refused before the section ends.
    assert error_of(impl, b"GET / HTTP/1.1\r\nX: " + b"y" * 500, max_header_bytes=100) == (
        431,
        "header section too large",
    )


def test_more_than_max_headers_is_431(impl: Impl) -> None:
    fields = b"Host: h\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(4))
    data = b"GET / HTTP/1.1\r\n" + fields + b"\r\n"
    assert len(one_request(impl, data, max_headers=5).headers) == 5
    assert error_of(impl, data, max_headers=4) == (431, "more than 4 header fields")


def test_content_length_over_max_body_is_413_before_the_body_arrives(impl: Impl) -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n"
    assert error_of(impl, head, max_body=10) == (413, "request body too large")
    assert one_request(impl, head + b"x" * 11, max_body=11).body == b"x" * 11


def test_chunked_total_over_max_body_is_413(impl: Impl) -> None:
    head = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    ok = head + b"5\r\n12345\r\n5\r\n67890\r\n0\r\n\r\n"
    assert one_request(impl, ok, max_body=10).body == b"1234567890"
    # The second chunk size alone pushes the total over: refused before its data arrives.
    assert error_of(impl, head + b"5\r\n12345\r\n6\r\n", max_body=10) == (
        413,
        "request body too large",
    )
    assert error_of(impl, head + b"ffffffffffffffff\r\n", max_body=10) == (
        413,
        "request body too large",
    )


# --------------------------------------------------------------------------------------------
# Smuggling defences and malformed heads


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            400,
            "both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 3\r\n\r\n",
            400,
            "both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            400,
            "conflicting Content-Length headers",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\n",
            400,
            "invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\n",
            400,
            "invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
            400,
            "invalid Content-Length",
        ),
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n", 400, "invalid Content-Length"),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1234567890123456789\r\n\r\n",
            400,
            "invalid Content-Length",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            501,
            "unsupported Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
            501,
            "unsupported Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            501,
            "unsupported Transfer-Encoding",
        ),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "Transfer-Encoding in an HTTP/1.0 request",
        ),
        (b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400, "invalid character in header name"),
        (b"GET / HTTP/1.1\r\nHost\t: h\r\n\r\n", 400, "invalid character in header name"),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  continued\r\n\r\n",
            400,
            "obsolete line folding is not accepted",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\tcontinued\r\n\r\n",
            400,
            "obsolete line folding is not accepted",
        ),
        (b"GET / HTTP/1.1\r\nHost: h\nX: 1\r\n\r\n", 400, "bare CR or LF in the message head"),
        (b"GET / HTTP/1.1\r\nHost: h\rX: 1\r\n\r\n", 400, "bare CR or LF in header section"),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n",
            400,
            "invalid character in header value",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fb\r\n\r\n",
            400,
            "invalid character in header value",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\n: empty\r\n\r\n",
            400,
            "header line without a name and colon",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nNoColon\r\n\r\n",
            400,
            "header line without a name and colon",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "missing Host header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "more than one Host header"),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host header"),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505, "HTTP version not supported"),
        (b"GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505, "HTTP version not supported"),
        (b"GET / HTTP/1.10\r\nHost: h\r\n\r\n", 400, "malformed HTTP version"),
        (b"GET / http/1.1\r\nHost: h\r\n\r\n", 400, "malformed HTTP version"),
        (b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b"GET / FOO\r\nHost: h\r\n\r\n", 400, "malformed HTTP version"),
        (b"GET /\r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b" GET / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid request method"),
        (b"GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid request target"),
        (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", 400, "invalid request target"),
        (b"GET / HTTP/1.1\nX:y\r\nHost: h\r\n\r\n", 400, "bare CR or LF in the message head"),
        (b"GET / HTTP/1.1\nHost: h\r\n\r\n", 400, "bare CR or LF in the message head"),
        (
            b"GET http://evil.example/ HTTP/1.1\r\nHost: h\r\n\r\n",
            400,
            "request target must be in origin form",
        ),
        (
            b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n",
            400,
            "request target must be in origin form",
        ),
    ],
)
def test_malformed_requests(impl: Impl, data: bytes, status: int, message: str) -> None:
    assert error_of(impl, data) == (status, message)


def test_identical_duplicate_content_lengths_are_accepted(impl: Impl) -> None:
    data = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\ncontent-length: 003\r\n\r\nabc"
    assert one_request(impl, data).body == b"abc"


def test_transfer_encoding_is_case_insensitive(impl: Impl) -> None:
    data = b"POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding:  CHUNKED \r\n\r\n1\r\nz\r\n0\r\n\r\n"
    assert one_request(impl, data).body == b"z"


def test_leading_crlfs_before_a_request_are_ignored(impl: Impl) -> None:
    r = one_request(impl, b"\r\n\r\n\r\n" + SIMPLE)
    assert r.body == b"hello"
    parser = impl.http1.RequestParser()
    parser.feed(SIMPLE + b"\r\n\r\n")
    assert parser.next_event().body == b"hello"
    assert parser.next_event() is None
    assert not parser.has_partial
    parser.feed_eof()
    assert parser.next_event() is None
    assert parser.closed


def test_a_lone_lf_before_a_request_is_not_skipped(impl: Impl) -> None:
    assert error_of(impl, b"\n" + SIMPLE) == (400, "bare CR or LF in the message head")


# --------------------------------------------------------------------------------------------
# EOF and error stickiness


def test_eof_mid_request_is_400(impl: Impl) -> None:
    for cut in (1, 10, SIMPLE.index(b"\r\n\r\n") + 4, len(SIMPLE) - 1):
        parser = impl.http1.RequestParser()
        parser.feed(SIMPLE[:cut])
        assert parser.next_event() is None
        assert not parser.closed
        parser.feed_eof()
        assert not parser.closed  # the partial request is still buffered
        err = parser.next_event()
        assert isinstance(err, impl.http1.HttpError)
        assert (err.status, err.message) == (400, CLOSED_MID_REQUEST)
        assert parser.closed


def test_eof_mid_request_without_a_prior_next_event(impl: Impl) -> None:
    assert error_of(impl, SIMPLE[:-2], eof=True) == (400, CLOSED_MID_REQUEST)
    assert error_of(impl, b"\r", eof=True) == (400, CLOSED_MID_REQUEST)


def test_closed_after_eof_with_nothing_buffered(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    assert not parser.closed
    parser.feed(SIMPLE)
    parser.feed_eof()
    assert not parser.closed  # a complete request is still to be handed out
    assert parser.next_event().body == b"hello"
    assert parser.next_event() is None
    assert parser.closed
    parser.feed(SIMPLE)  # bytes after EOF are ignored
    assert parser.next_event() is None
    assert parser.closed


def test_eof_with_only_blank_lines_is_clean(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(b"\r\n\r\n")
    parser.feed_eof()
    assert parser.next_event() is None
    assert parser.closed


def test_after_an_error_every_next_event_returns_it(impl: Impl) -> None:
    parser = impl.http1.RequestParser()
    parser.feed(b"GET / HTTP/1.1\r\n\r\n" + SIMPLE)
    err = parser.next_event()
    assert (err.status, err.message) == (400, "missing Host header")
    assert parser.closed
    for _ in range(3):
        again = parser.next_event()
        assert isinstance(again, impl.http1.HttpError)
        assert (again.status, again.message) == (400, "missing Host header")
    parser.feed(SIMPLE)
    parser.feed_eof()
    again = parser.next_event()
    assert (again.status, again.message) == (400, "missing Host header")
    assert parser.take_continue() is False


def test_requests_before_an_error_are_handed_out_first(impl: Impl) -> None:
    out = parse(impl, SIMPLE + b"BAD\r\n\r\n")
    assert len(out) == 2
    assert out[0].body == b"hello"
    assert (out[1].status, out[1].message) == (400, "malformed request line")


def test_http_error_repr(impl: Impl) -> None:
    err = impl.http1.HttpError(400, "bad")
    assert (err.status, err.message) == (400, "bad")
    assert repr(err) == "HttpError(400, 'bad')"


# --------------------------------------------------------------------------------------------
# Header values


def test_header_names_are_lower_cased_and_values_stripped(impl: Impl) -> None:
    data = (
        b"POST /x HTTP/1.1\r\n"
        b"HOST:  Example.COM \r\n"
        b"Content-TYPE:\tapplication/json; charset=UTF-8\t\r\n"
        b"X-API-Key:   secret-key\r\n"
        b"authorization: Bearer  tok \r\n"
        b"X-Request-ID: req-1\r\n"
        b"Upgrade: websocket\r\n"
        b"X-Empty:\r\n"
        b"X-Obs-Text: caf\xc3\xa9\r\n"
        b"Content-Length: 0\r\n"
        b"\r\n"
    )
    r = one_request(impl, data)
    assert r.headers == [
        (b"host", b"Example.COM"),
        (b"content-type", b"application/json; charset=UTF-8"),
        (b"x-api-key", b"secret-key"),
        (b"authorization", b"Bearer  tok"),
        (b"x-request-id", b"req-1"),
        (b"upgrade", b"websocket"),
        (b"x-empty", b""),
        (b"x-obs-text", b"caf\xc3\xa9"),
        (b"content-length", b"0"),
    ]
    assert r.host == b"Example.COM"
    assert r.content_type == b"application/json; charset=UTF-8"
    assert r.api_key == b"secret-key"
    assert r.authorization == b"Bearer  tok"
    assert r.request_id == b"req-1"
    assert r.upgrade == b"websocket"


def test_extracted_fields_default_to_none(impl: Impl) -> None:
    r = one_request(impl, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert (r.content_type, r.api_key, r.authorization, r.request_id, r.upgrade) == (None,) * 5


def test_first_occurrence_of_an_extracted_field_wins(impl: Impl) -> None:
    data = (
        b"GET / HTTP/1.1\r\nHost: h\r\n"
        b"X-Api-Key: first\r\n"
        b"Content-Type: a\r\nContent-Type: b\r\n"
        b"Authorization: one\r\n"
        b"X-Request-Id: r1\r\nX-Request-Id: r2\r\n"
        b"Upgrade: u1\r\nUpgrade: u2\r\n\r\n"
    )
    r = one_request(impl, data)
    assert (r.api_key, r.content_type, r.authorization, r.request_id, r.upgrade) == (
        b"first",
        b"a",
        b"one",
        b"r1",
        b"u1",
    )
    assert len(r.headers) == 9


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (b"X-Api-Key: first\r\nx-api-key: second\r\n", "more than one X-API-Key header"),
        (b"X-API-Key: same\r\nX-API-Key: same\r\n", "more than one X-API-Key header"),
        (b"Authorization: Bearer a\r\nauthorization: Bearer b\r\n", "more than one Authorization"),
    ],
)
def test_a_repeated_credential_header_is_refused(impl: Impl, lines: bytes, message: str) -> None:
    # Which of two keys is the caller's?  The first silently winning let a proxy that appends
    # its own key and a client that sends another disagree about who is calling.
    (error,) = parse(impl, b"GET / HTTP/1.1\r\nHost: h\r\n" + lines + b"\r\n")
    assert isinstance(error, impl.http1.HttpError)
    assert error.status == 400
    assert message in error.message


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\nHost: h\n\n",  # LF line endings throughout
        b"GET / HTTP/1.1\r\nHost: h\n\n",  # LF-terminated header lines
        b"GET / HTTP/1.1\nHost: h\r\n\r\n",  # an LF-terminated request line
        b"GET / HTTP/1.1\r\nHost: h\r\n\n",  # a bare LF as the empty line
        b"GET / HTTP/1.1\r\nHost: h\nX: 1\r\n\r\n",
    ],
)
def test_a_head_with_bare_lf_line_endings_is_refused_when_it_ends(impl: Impl, data: bytes) -> None:
    # Without this, a client ending its lines with LF alone waited for a CRLF that never
    # comes: a 408 after the read timeout instead of a 400 now.  Fed whole and byte by byte,
    # the answer is the same, given as soon as the empty line is there.
    for pieces in ([data], [data[i : i + 1] for i in range(len(data))]):
        parser = impl.http1.RequestParser()
        event = None
        for piece in pieces:
            parser.feed(piece)
            event = parser.next_event()
            if event is not None:
                break
        assert isinstance(event, impl.http1.HttpError), (pieces, event)
        assert event.status == 400
        assert event.message == "bare CR or LF in the message head"


def test_a_crlf_split_across_reads_is_not_a_bare_line_break(impl: Impl) -> None:
    data = b"GET /x HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n"
    for cut in range(1, len(data)):
        parser = impl.http1.RequestParser()
        parser.feed(data[:cut])
        assert parser.next_event() is None, cut
        parser.feed(data[cut:])
        request = parser.next_event()
        assert isinstance(request, impl.http1.Request), (cut, request)
        assert request.path == b"/x"


def test_build_response_head_matches_build_response(impl: Impl) -> None:
    body = b"x" * 70_000
    for keep_alive, http10 in ((True, False), (False, False), (True, True)):
        whole = impl.http1.build_response(200, b"A: b\r\n", body, keep_alive, http10)
        head = impl.http1.build_response_head(200, b"A: b\r\n", len(body), keep_alive, http10)
        assert head + body == whole
    with pytest.raises(ValueError, match="separate body"):
        impl.http1.build_response_head(204, b"", 0, True)


# --------------------------------------------------------------------------------------------
# build_response / build_request


def split_response(data: bytes) -> tuple[bytes, list[bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    return lines[0], lines[1:], body


def test_build_response_keep_alive(impl: Impl) -> None:
    out = impl.http1.build_response(200, b"Content-Type: application/json\r\n", b"{}", True)
    assert out == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
    )


def test_build_response_close(impl: Impl) -> None:
    out = impl.http1.build_response(404, b"", b"nope", False)
    assert out == b"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope"
    # Closing wins over http10.
    out = impl.http1.build_response(200, b"", b"", False, True)
    assert split_response(out)[1] == [b"Content-Length: 0", b"Connection: close"]


def test_build_response_http10_keep_alive(impl: Impl) -> None:
    out = impl.http1.build_response(200, b"X: y\r\n", b"abc", True, True)
    assert out == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\nX: y\r\n\r\nabc"
    )


def test_build_response_204_has_no_length_and_no_body(impl: Impl) -> None:
    out = impl.http1.build_response(204, b"X: y\r\n", b"ignored", True)
    assert out == b"HTTP/1.1 204 No Content\r\nX: y\r\n\r\n"
    out = impl.http1.build_response(204, b"", b"ignored", False)
    assert out == b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
    out = impl.http1.build_response(100, b"", b"", True)
    assert out == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_build_response_304_has_no_length_and_no_body(impl: Impl) -> None:
    # A 304 cannot carry content: body bytes would be read as the start of the next response.
    out = impl.http1.build_response(304, b'ETag: "x"\r\n', b"ignored", True)
    assert out == b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'
    parser = impl.http1.ResponseParser()
    parser.feed(out + impl.http1.build_response(200, b"", b"next", True))
    assert [(r.status, r.body) for r in events(parser)] == [(304, b""), (200, b"next")]


def test_build_response_unknown_statuses(impl: Impl) -> None:
    for status in (299, 599, 600, 999):
        status_line, fields, body = split_response(
            impl.http1.build_response(status, b"", b"x", True)
        )
        assert status_line == b"HTTP/1.1 %d Unknown" % status
        assert fields == [b"Content-Length: 1"]
        assert body == b"x"
    assert impl.http1.build_response(413, b"", b"", True).startswith(
        b"HTTP/1.1 413 Content Too Large\r\n"
    )


@pytest.mark.parametrize("status", [-1, 0, 99, 1000, 65536, -(2**31), 2**31, 2**63, -(2**70)])
def test_build_response_status_out_of_range_raises_value_error(impl: Impl, status: int) -> None:
    with pytest.raises(ValueError, match="three-digit"):
        impl.http1.build_response(status, b"", b"", True)


def test_build_response_large_body(impl: Impl) -> None:
    body = bytes(range(256)) * 1000
    out = impl.http1.build_response(200, b"", body, True)
    assert out == b"HTTP/1.1 200 OK\r\nContent-Length: 256000\r\n\r\n" + body


def test_build_request(impl: Impl) -> None:
    out = impl.http1.build_request(b"/v1/rpc", b"node:8545", b"X-A: 1\r\n", b'{"a":1}')
    assert out == (
        b"POST /v1/rpc HTTP/1.1\r\nHost: node:8545\r\nContent-Type: application/json\r\n"
        b'Content-Length: 7\r\nX-A: 1\r\n\r\n{"a":1}'
    )
    r = one_request(impl, out)
    assert (r.path, r.host, r.content_type, r.body) == (
        b"/v1/rpc",
        b"node:8545",
        b"application/json",
        b'{"a":1}',
    )


def test_build_response_round_trips_through_the_response_parser(impl: Impl) -> None:
    data = impl.http1.build_response(
        503, b"Retry-After: 7\r\nContent-Type: text/plain\r\n", b"busy", False
    )
    (resp,) = response_events(impl, data)
    assert (resp.status, resp.body, resp.keep_alive, resp.retry_after, resp.content_type) == (
        503,
        b"busy",
        False,
        b"7",
        b"text/plain",
    )


# --------------------------------------------------------------------------------------------
# ResponseParser


def test_response_content_length(impl: Impl) -> None:
    (resp,) = response_events(
        impl, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert (resp.status, resp.body, resp.keep_alive, resp.content_type, resp.retry_after) == (
        200,
        b"{}",
        True,
        b"application/json",
        None,
    )


def test_response_chunked(impl: Impl) -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;x=y\r\nabcd\r\n1\r\ne\r\n0\r\nTrailer: t\r\n\r\n"
    )
    (resp,) = response_events(impl, data)
    assert resp.body == b"abcde"
    assert resp.keep_alive is True


def test_response_read_until_eof(impl: Impl) -> None:
    parser = impl.http1.ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
    assert parser.next_event() is None
    parser.feed(b"part two")
    assert parser.next_event() is None
    parser.feed_eof()
    resp = parser.next_event()
    assert (resp.status, resp.body, resp.keep_alive) == (200, b"part one, part two", False)
    assert parser.next_event() is None
    assert not parser.has_partial


def _resident(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def test_a_big_declared_body_is_resident_as_it_comes_and_never_twice(impl: Impl) -> None:
    """A declared body of 128 MiB, fed 1 MiB at a time: half of it read, about half of it is
    resident (nothing is zero-filled ahead of the bytes), and the process's peak RSS grows by
    about one body (it is not copied once complete)."""
    size, piece = 128 << 20, b"\xab" * (1 << 20)
    parser = impl.http1.ResponseParser(max_body=size)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM: the peak from now on
    before = _resident("VmRSS")
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    pieces = size // len(piece)
    for _ in range(pieces // 2):
        parser.feed(piece)
        assert parser.next_event() is None
    half = _resident("VmRSS") - before
    for _ in range(pieces - pieces // 2):
        parser.feed(piece)
        response = parser.next_event()
    peak = _resident("VmHWM") - before
    assert len(response.body) == size and response.body[-1:] == b"\xab"
    assert half < size * 3 // 4, half >> 20
    assert peak < size * 3 // 2, peak >> 20


@pytest.mark.parametrize("size", [10, 3 << 20])  # kept as pieces; allocated whole
def test_response_body_read_in_pieces_is_whole(impl: Impl, size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    data = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + body
    data += b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    parser = impl.http1.ResponseParser()
    assert parser.body_length() is None
    events = []
    for start in range(0, len(data), 65536):
        parser.feed(data[start : start + 65536])
        while (event := parser.next_event()) is not None:
            events.append(event)
        if not events:
            assert parser.body_length() == size  # declared, while the body comes
    assert [e.body for e in events] == [body, b"ok"]
    assert parser.body_length() is None


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 3145728\r\n\r\n" + b"a" * (3 << 20),  # allocated whole
        b"Content-Length: 20000\r\n\r\n" + b"a" * 20000,  # kept as pieces
        b"Transfer-Encoding: chunked\r\n\r\n" + b"4e20\r\n" + b"a" * 20000 + b"\r\n0\r\n\r\n",
    ],
)
def test_a_discarded_body_is_consumed_not_kept(impl: Impl, framing: bytes) -> None:
    """Nobody wants the answer (a batch over its bound): its bytes are read in order and
    dropped; the response completes empty, and the next one on the connection is intact."""
    data = b"HTTP/1.1 200 OK\r\n" + framing + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    parser = impl.http1.ResponseParser()
    parser.feed(data[:5000])
    assert parser.next_event() is None
    assert parser.body_length() == (-1 if b"chunked" in framing else int(framing.split()[1]))
    parser.discard_body()
    events = []
    for start in range(5000, len(data), 8192):
        parser.feed(data[start : start + 8192])
        while (event := parser.next_event()) is not None:
            events.append(event)
    assert [(e.status, e.body) for e in events] == [(200, b""), (200, b"ok")]


def test_response_read_until_eof_empty_body(impl: Impl) -> None:
    (resp,) = response_events(impl, b"HTTP/1.0 200 OK\r\n\r\n", eof=True)
    assert (resp.body, resp.keep_alive) == (b"", False)


def test_response_100_continue_is_skipped(impl: Impl) -> None:
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 102 Processing\r\nX: 1\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"
    )
    (resp,) = response_events(impl, data)
    assert (resp.status, resp.body) == (200, b"x")
    parser = impl.http1.ResponseParser()
    parser.feed(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert parser.next_event() is None
    assert not parser.has_partial
    parser.feed(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
    assert parser.next_event().status == 201


@pytest.mark.parametrize("status", [204, 304])
def test_response_without_body(impl: Impl, status: int) -> None:
    data = b"HTTP/1.1 %d X\r\nContent-Length: 10\r\n\r\n" % status
    data += b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    first, second = response_events(impl, data)
    assert (first.status, first.body) == (status, b"")
    assert (second.status, second.body) == (200, b"ok")


def test_response_keep_alive(impl: Impl) -> None:
    cases = [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", False),
    ]
    for data, keep_alive in cases:
        (resp,) = response_events(impl, data)
        assert resp.keep_alive is keep_alive, data


def test_response_retry_after_is_captured(impl: Impl) -> None:
    data = (
        b"HTTP/1.1 429 Too Many Requests\r\nretry-after:  30 \r\nRetry-After: 99\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    (resp,) = response_events(impl, data)
    assert (resp.status, resp.retry_after) == (429, b"30")


def test_response_status_line_without_reason(impl: Impl) -> None:
    (resp,) = response_events(impl, b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n")
    assert resp.status == 200


def test_pipelined_responses_in_order(impl: Impl) -> None:
    data = b"".join(impl.http1.build_response(200, b"", b"%d" % i, True) for i in range(5))
    parser = impl.http1.ResponseParser()
    got = []
    for i in range(len(data)):
        parser.feed(data[i : i + 1])
        got += events(parser)
    assert [r.body for r in got] == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.parametrize("cut", [5, 20, len(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") + 2])
def test_truncated_response_at_eof_is_502(impl: Impl, cut: int) -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    parser = impl.http1.ResponseParser()
    parser.feed(data[:cut])
    assert parser.next_event() is None
    parser.feed_eof()
    err = parser.next_event()
    assert isinstance(err, impl.http1.HttpError)
    assert (err.status, err.message) == (502, "connection closed in the middle of a response")
    assert parser.next_event() is err or (parser.next_event().status == 502)


def test_truncated_chunked_response_at_eof_is_502(impl: Impl) -> None:
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"
    assert [(e.status, e.message) for e in response_events(impl, data, eof=True)] == [
        (502, "connection closed in the middle of a response")
    ]


def test_response_body_over_max_body_is_502(impl: Impl) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"
    errs = response_events(impl, head, max_body=10)
    assert [(e.status, e.message) for e in errs] == [(502, "response body too large")]
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\n"
    errs = response_events(impl, chunked, max_body=10)
    assert [(e.status, e.message) for e in errs] == [(502, "response body too large")]
    until_eof = b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 11
    errs = response_events(impl, until_eof, max_body=10)
    assert [(e.status, e.message) for e in errs] == [(502, "response body too large")]
    (ok,) = response_events(impl, b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 10, eof=True, max_body=10)
    assert ok.body == b"x" * 10


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "unsupported Transfer-Encoding in response",
        ),
        (b"HTTP/2.0 200 OK\r\n\r\n", "unsupported HTTP version in response"),
        (b"HTTP/1.1 20\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "malformed status code"),
        (b"HTTP/1.1_200 OK\r\n\r\n", "malformed status line"),
        (b"HTTP/1.1  200 OK\r\n\r\n", "malformed status code"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status code"),
        (b"HTTP/1.1 099 OK\r\n\r\n", "malformed status code"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "malformed status code"),
        (b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n", "invalid character in header name"),
        (b"HTTP/1.1 200 OK\r\nX: 1\r\n folded\r\n\r\n", "obsolete line folding is not accepted"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "conflicting Content-Length headers",
        ),
    ],
)
def test_bad_responses_are_502(impl: Impl, data: bytes, message: str) -> None:
    errs = response_events(impl, data)
    assert [(e.status, e.message) for e in errs] == [(502, message)]


def test_response_head_limits_are_502(impl: Impl) -> None:
    errs = response_events(impl, b"HTTP/1.1 200 " + b"O" * 100 + b"\r\n\r\n", max_line=50)
    assert [(e.status, e.message) for e in errs] == [(502, "start line too long")]
    data = b"HTTP/1.1 200 OK\r\nX: " + b"y" * 100 + b"\r\n\r\n"
    errs = response_events(impl, data, max_header_bytes=50)
    assert [(e.status, e.message) for e in errs] == [(502, "header section too large")]
    data = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nContent-Length: 0\r\n\r\n"
    errs = response_events(impl, data, max_headers=2)
    assert [(e.status, e.message) for e in errs] == [(502, "more than 2 header fields")]


def test_response_parser_error_is_sticky(impl: Impl) -> None:
    parser = impl.http1.ResponseParser()
    parser.feed(b"garbage\r\n\r\n")
    first = parser.next_event()
    assert (first.status, first.message) == (502, "malformed status line")
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    again = parser.next_event()
    assert (again.status, again.message) == (502, "malformed status line")


def test_response_eof_with_nothing_buffered_is_quiet(impl: Impl) -> None:
    parser = impl.http1.ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
    assert parser.next_event().body == b"x"
    parser.feed_eof()
    assert parser.next_event() is None
    assert not parser.has_partial


@pytest.mark.parametrize("piece", [1000, 7000, 65536, 200_000])
def test_large_response_body_fed_in_pieces_then_a_pipelined_one(impl: Impl, piece: int) -> None:
    """A multi-megabyte body (eth_getLogs) arrives in many reads: same bytes, any piece size."""
    body = bytes(range(256)) * 8000  # ~2 MB
    stream = (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    parser = impl.http1.ResponseParser()
    seen = []
    for start in range(0, len(stream), piece):
        parser.feed(stream[start : start + piece])
        while (event := parser.next_event()) is not None:
            seen.append(event.body)
    assert seen == [body, b"ok"]
    assert not parser.has_partial
