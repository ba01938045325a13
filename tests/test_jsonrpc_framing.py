"""Example-based tests of the JSON-RPC envelope framing (``chaingate._pure.jsonrpc`` and twin).

Every test takes the ``impl`` fixture, so it runs against both the compiled and the pure
module.  The pure module's docstrings are the specification.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from chaingate.framing_constants import MAX_JSON_DEPTH
from chaingate.twins import Impl
from tests.helpers import call_fields
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


def parse(impl: Impl, body: bytes, max_batch: int = 100) -> Any:
    return impl.jsonrpc.parse_request(body, max_batch)


def single(impl: Impl, body: bytes) -> tuple[Any, ...]:
    parsed = parse(impl, body)
    assert (parsed.batch, parsed.error, parsed.message) == (False, 0, ""), parsed.message
    assert len(parsed.calls) == 1
    return call_fields(parsed.calls[0])


def failure(impl: Impl, body: bytes, max_batch: int = 100) -> tuple[Any, ...]:
    parsed = parse(impl, body, max_batch)
    assert parsed.calls == []
    return parsed.batch, parsed.error, parsed.message


def test_constants(impl: Impl) -> None:
    m = impl.jsonrpc
    assert (m.PARSE_ERROR, m.INVALID_REQUEST, m.METHOD_NOT_FOUND) == (-32700, -32600, -32601)
    assert (m.INVALID_PARAMS, m.INTERNAL_ERROR) == (-32602, -32603)


# --------------------------------------------------------------------------------------------
# parse_request: single calls


def test_a_plain_call(impl: Impl) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'
    assert single(impl, body) == (b"1", "eth_blockNumber", b"[]", 0, "")


@pytest.mark.parametrize(
    "raw_id",
    [
        b"1",
        b"10",
        b"999",
        b"1000",
        b"1.0",
        b"-5e3",
        b"0",
        b"-0",
        b"1E+2",
        b"123456789012345678901234567890",
        b'"abc"',
        b'"a\\"b"',
        b'""',
        b'"\\u00e9\xc3\xa9"',
        b"null",
    ],
)
def test_ids_are_echoed_as_raw_bytes(impl: Impl, raw_id: bytes) -> None:
    body = b'{"jsonrpc":"2.0","method":"m","id":' + raw_id + b"}"
    assert single(impl, body) == (raw_id, "m", None, 0, "")
    reply = impl.jsonrpc.result_reply(raw_id, b"true")
    assert reply == b'{"jsonrpc":"2.0","id":' + raw_id + b',"result":true}'
    assert json.loads(reply)["id"] == json.loads(raw_id)


def test_a_call_without_id_is_a_notification(impl: Impl) -> None:
    assert single(impl, b'{"jsonrpc":"2.0","method":"m"}') == (None, "m", None, 0, "")


def test_params_are_kept_as_raw_bytes_including_whitespace(impl: Impl) -> None:
    params = b'[ 1 ,\n\t{"a" : [ ] } , "x\\u0041" , 1.50e+1 ]'
    body = b'{ "jsonrpc" : "2.0" , "id" : 7 , "method" : "m" , "params" : ' + params + b" }"
    assert single(impl, body) == (b"7", "m", params, 0, "")
    params = b'{ "k":\r\n null }'
    assert single(impl, b'{"jsonrpc":"2.0","method":"m","params":' + params + b"}")[2] == params


def test_whitespace_around_the_body(impl: Impl) -> None:
    body = b' \r\n\t{"jsonrpc":"2.0","id":1,"method":"m"}\n\n '
    assert single(impl, body) == (b"1", "m", None, 0, "")


def test_method_with_escapes_is_decoded(impl: Impl) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"eth_\\u0063all\\n\xe2\x82\xac"}'
    assert single(impl, body)[1] == "eth_call\n\u20ac"


def test_method_names_read_again_are_the_same_names(impl: Impl) -> None:
    """The compiled twin keeps the str of a short ASCII name it read (a slot per name's
    hash): a name read again, a name that shares a slot, a prefix, a longer or escaped or
    non-ASCII name each still come back as what the body says."""
    names = [f"m{i}" for i in range(600)] + ["eth_call", "eth_cal", "eth_calls", "a" * 64]
    names += ["a" * 65, "\u0065th_call", "eth_\u00e9", "eth_é", ""]
    calls = [{"jsonrpc": "2.0", "id": i, "method": "@"} for i in range(len(names))]
    text = json.dumps(calls * 2)
    for name in names * 2:
        text = text.replace('"@"', '"' + name + '"', 1)
    parsed = impl.jsonrpc.parse_request(text.encode(), 10_000)
    expected = [json.loads('"' + name + '"') for name in names] * 2
    assert [call.method for call in parsed.calls] == expected


@pytest.mark.parametrize("bad_id", [b"true", b"false", b"{}", b'{"a":1}', b"[]", b"[1]"])
def test_invalid_id_types(impl: Impl, bad_id: bytes) -> None:
    body = b'{"jsonrpc":"2.0","method":"m","id":' + bad_id + b"}"
    assert single(impl, body) == (b"null", None, None, INVALID_REQUEST, MSG_BAD_ID)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"id":1,"method":"m"}', (b"1", MSG_BAD_VERSION)),
        (b'{"jsonrpc":"1.0","id":1,"method":"m"}', (b"1", MSG_BAD_VERSION)),
        (b'{"jsonrpc":2.0,"id":"x","method":"m"}', (b'"x"', MSG_BAD_VERSION)),
        (b'{"jsonrpc":"2.0 ","id":1,"method":"m"}', (b"1", MSG_BAD_VERSION)),
        (b'{"jsonrpc":"2\\u002e0","id":1,"method":"m"}', (b"1", MSG_BAD_VERSION)),
        (b'{"jsonrpc":"2.0","id":1}', (b"1", MSG_NO_METHOD)),
        (b'{"jsonrpc":"2.0"}', (b"null", MSG_NO_METHOD)),
        (b'{"jsonrpc":"2.0","id":1,"method":5}', (b"1", MSG_BAD_METHOD)),
        (b'{"jsonrpc":"2.0","id":1,"method":null}', (b"1", MSG_BAD_METHOD)),
        (b'{"jsonrpc":"2.0","id":1,"method":["m"]}', (b"1", MSG_BAD_METHOD)),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}', (b"1", MSG_BAD_PARAMS)),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","params":5}', (b"1", MSG_BAD_PARAMS)),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","params":null}', (b"1", MSG_BAD_PARAMS)),
        (b'{"jsonrpc":"2.0","id":1,"method":"m","params":true}', (b"1", MSG_BAD_PARAMS)),
        (b'{"jsonrpc":"2.0","method":"m","params":"x"}', (b"null", MSG_BAD_PARAMS)),
        (b'{"jsonrpc":"2.0","id":"q","method":"m","params":1}', (b'"q"', MSG_BAD_PARAMS)),
        (b"{}", (b"null", MSG_BAD_VERSION)),
        # The id is checked first: a bad id wins over every other problem.
        (b'{"id":true}', (b"null", MSG_BAD_ID)),
    ],
)
def test_invalid_calls(impl: Impl, body: bytes, expected: tuple[bytes, str]) -> None:
    reply_id, message = expected
    assert single(impl, body) == (reply_id, None, None, INVALID_REQUEST, message)


def test_escaped_member_names_are_recognised(impl: Impl) -> None:
    body = (
        b'{"\\u006asonrpc":"2.0","\\u0069d":5,"m\\u0065thod":"x","p\\u0061rams":[1],'
        b'"\\u0069\\u0064\\u0078":9}'
    )
    assert single(impl, body) == (b"5", "x", b"[1]", 0, "")


def test_duplicate_keys_last_wins(impl: Impl) -> None:
    body = (
        b'{"jsonrpc":"1.0","id":1,"method":"a","params":[1],'
        b'"jsonrpc":"2.0","id":2,"method":"b","params":{}}'
    )
    assert single(impl, body) == (b"2", "b", b"{}", 0, "")
    body = b'{"jsonrpc":"2.0","id":1,"method":"a","method":5}'
    assert single(impl, body) == (b"1", None, None, INVALID_REQUEST, MSG_BAD_METHOD)
    body = b'{"jsonrpc":"2.0","id":true,"id":3,"method":"a"}'
    assert single(impl, body) == (b"3", "a", None, 0, "")
    body = b'{"jsonrpc":"2.0","id":3,"method":"a","\\u0069d":[]}'
    assert single(impl, body) == (b"null", None, None, INVALID_REQUEST, MSG_BAD_ID)


def test_unknown_members_are_ignored_but_validated(impl: Impl) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"m","extra":{"deep":[1,2,{"x":null}]}}'
    assert single(impl, body) == (b"1", "m", None, 0, "")
    body = b'{"jsonrpc":"2.0","id":1,"method":"m","extra":[1,]}'
    assert failure(impl, body) == (False, PARSE_ERROR, MSG_INVALID_JSON)


# --------------------------------------------------------------------------------------------
# parse_request: batches


def test_a_batch(impl: Impl) -> None:
    body = (
        b'[{"jsonrpc":"2.0","id":1,"method":"a"},'
        b' {"jsonrpc":"2.0","method":"notify","params":{"x":1}} ,\n'
        b'{"jsonrpc":"2.0","id":"s","method":"c","params":[]}]'
    )
    parsed = parse(impl, body)
    assert (parsed.batch, parsed.error, parsed.message) == (True, 0, "")
    assert [call_fields(c) for c in parsed.calls] == [
        (b"1", "a", None, 0, ""),
        (None, "notify", b'{"x":1}', 0, ""),
        (b'"s"', "c", b"[]", 0, ""),
    ]


def test_empty_batch(impl: Impl) -> None:
    assert failure(impl, b"[]") == (True, INVALID_REQUEST, MSG_EMPTY_BATCH)
    assert failure(impl, b" [ \n ] ") == (True, INVALID_REQUEST, MSG_EMPTY_BATCH)
    assert failure(impl, b"[] x") == (True, PARSE_ERROR, MSG_INVALID_JSON)


def test_batch_of_non_objects(impl: Impl) -> None:
    parsed = parse(impl, b'[1, "x", null, [], true, {"jsonrpc":"2.0","id":4,"method":"m"}]')
    assert (parsed.batch, parsed.error) == (True, 0)
    bad = (b"null", None, None, INVALID_REQUEST, MSG_BATCH_ITEM)
    assert [call_fields(c) for c in parsed.calls] == [bad] * 5 + [(b"4", "m", None, 0, "")]


def test_batch_with_invalid_calls_keeps_going(impl: Impl) -> None:
    parsed = parse(
        impl, b'[{"id":1},{"jsonrpc":"2.0","id":2,"method":"ok"},{"jsonrpc":"2.0","id":{}}]'
    )
    assert [call_fields(c) for c in parsed.calls] == [
        (b"1", None, None, INVALID_REQUEST, MSG_BAD_VERSION),
        (b"2", "ok", None, 0, ""),
        (b"null", None, None, INVALID_REQUEST, MSG_BAD_ID),
    ]


def test_batch_over_max_batch(impl: Impl) -> None:
    call = b'{"jsonrpc":"2.0","id":1,"method":"m"}'
    body = b"[" + b",".join([call] * 4) + b"]"
    assert len(parse(impl, body, max_batch=4).calls) == 4
    assert failure(impl, body, max_batch=3) == (
        True,
        INVALID_REQUEST,
        "invalid request: batch of 4 calls exceeds the limit of 3",
    )
    mixed = b"[1,2," + call + b",4]"
    assert failure(impl, mixed, max_batch=2) == (
        True,
        INVALID_REQUEST,
        "invalid request: batch of 4 calls exceeds the limit of 2",
    )


def test_invalid_json_in_an_oversized_batch_is_still_a_parse_error(impl: Impl) -> None:
    call = b'{"jsonrpc":"2.0","id":1,"method":"m"}'
    assert failure(impl, b"[" + b",".join([call] * 5) + b",]", max_batch=2) == (
        True,
        PARSE_ERROR,
        MSG_INVALID_JSON,
    )
    assert failure(impl, b"[" + b",".join([call] * 5) + b"] 1", max_batch=2) == (
        True,
        PARSE_ERROR,
        MSG_INVALID_JSON,
    )
    assert failure(impl, b"[" + b",".join([call] * 5) + b",{x}]", max_batch=2) == (
        True,
        PARSE_ERROR,
        MSG_INVALID_JSON,
    )


def test_top_level_scalar(impl: Impl) -> None:
    for body in (b"1", b'"x"', b"null", b" true ", b"false", b"-1.5e3"):
        assert failure(impl, body) == (False, INVALID_REQUEST, MSG_NOT_CALL), body


# --------------------------------------------------------------------------------------------
# parse_request: parse errors


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"jsonrpc":"2.0","id":1,"method":"m"',
        b'{"jsonrpc":"2.0","id":1,"method":"m"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"m"} x',
        b'{"jsonrpc":"2.0","id":1,"method":"m"}{}',
        b'{"jsonrpc":"2.0","id":1,"method":"m",}',
        b'{"jsonrpc":"2.0","id":1 "method":"m"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\x01"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\n"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\\x"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\\u12"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\\u12g4"}',
        b'{"jsonrpc":"2.0","id":1,"method":"m\\\'"}',
        b'{"jsonrpc":"2.0","id":01,"method":"m"}',
        b'{"jsonrpc":"2.0","id":-,"method":"m"}',
        b'{"jsonrpc":"2.0","id":-01,"method":"m"}',
        b'{"jsonrpc":"2.0","id":1.,"method":"m"}',
        b'{"jsonrpc":"2.0","id":.5,"method":"m"}',
        b'{"jsonrpc":"2.0","id":1e,"method":"m"}',
        b'{"jsonrpc":"2.0","id":1e+,"method":"m"}',
        b'{"jsonrpc":"2.0","id":+1,"method":"m"}',
        b'{"jsonrpc":"2.0","id":0x10,"method":"m"}',
        b'{"jsonrpc":"2.0","id":NaN,"method":"m"}',
        b'{"jsonrpc":"2.0","id":Infinity,"method":"m"}',
        b'{"jsonrpc":"2.0","id":-Infinity,"method":"m"}',
        b'{"jsonrpc":"2.0","id":nul,"method":"m"}',
        b'{"jsonrpc":"2.0","id":True,"method":"m"}',
        b"{'jsonrpc':'2.0'}",
        b'{jsonrpc:"2.0"}',
        b'{"a" 1}',
        b"[1,]",
        b"[,1]",
        b"[1 2]",
        b"[",
        b"]",
        b"-",
        b"01",
        b"\xef\xbb\xbf{}",
        b'{"a":1}\x00',
        b'{"a":1}\x0c',
        b"\x0b{}",
        b'{"a":"\xc2\xa0"}\xc2\xa0',
    ],
)
def test_parse_errors(impl: Impl, body: bytes) -> None:
    _, error, message = failure(impl, body)
    assert (error, message) == (PARSE_ERROR, MSG_INVALID_JSON)
    # Python's json module (without NaN/Infinity) refuses these bodies too.
    with pytest.raises(ValueError, match=r"\S"):
        json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"\xff"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xc3"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xc0\xaf"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xed\xa0\x80"}',  # an encoded surrogate
        b'{"jsonrpc":"2.0","id":1,"method":"m"}\x80',
        b"\xfe\xff",
        b"[\xe2\x82]",
    ],
)
def test_invalid_utf8(impl: Impl, body: bytes) -> None:
    _, error, message = failure(impl, body)
    assert (error, message) == (PARSE_ERROR, MSG_BAD_UTF8)


def test_valid_utf8_everywhere(impl: Impl) -> None:
    body = '{"jsonrpc":"2.0","id":"ключ","method":"m","params":["😀",{"ü":"日本"}]}'.encode()
    assert single(impl, body) == ('"ключ"'.encode(), "m", '["😀",{"ü":"日本"}]'.encode(), 0, "")


def test_nesting_limit(impl: Impl) -> None:
    def nested(depth: int) -> bytes:
        # A call whose params nest ``depth`` containers in total, counting the call object.
        inner = depth - 1
        return (
            b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * inner + b"]" * inner + b"}"
        )

    ok = nested(MAX_JSON_DEPTH)
    assert single(impl, ok)[0] == b"1"
    too_deep = nested(MAX_JSON_DEPTH + 1)
    assert failure(impl, too_deep) == (False, PARSE_ERROR, MSG_TOO_DEEP)
    assert json.loads(too_deep)  # valid JSON, refused only for its depth
    # In a batch the array counts as a level too.
    assert parse(impl, b"[" + nested(MAX_JSON_DEPTH - 1) + b"]").error == 0
    assert failure(impl, b"[" + nested(MAX_JSON_DEPTH) + b"]") == (True, PARSE_ERROR, MSG_TOO_DEEP)
    # Depth is refused even when the nesting never closes, and in plain arrays.
    assert failure(impl, b"[" * 10_000) == (True, PARSE_ERROR, MSG_TOO_DEEP)
    assert failure(impl, b'{"a":' * 10_000) == (False, PARSE_ERROR, MSG_TOO_DEEP)


def test_nesting_limit_exact_arrays(impl: Impl) -> None:
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    parsed = parse(impl, ok)
    assert (parsed.error, len(parsed.calls)) == (0, 1)
    assert call_fields(parsed.calls[0]) == (b"null", None, None, INVALID_REQUEST, MSG_BATCH_ITEM)
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    assert failure(impl, deep) == (True, PARSE_ERROR, MSG_TOO_DEEP)
    deep_scalar = b'{"jsonrpc":"2.0","id":1,"method":"m","x":' + b"[" * 200 + b"]" * 200 + b"}"
    assert failure(impl, deep_scalar) == (False, PARSE_ERROR, MSG_TOO_DEEP)


def test_syntax_error_before_the_depth_limit_is_invalid_json(impl: Impl) -> None:
    assert failure(impl, b"[" * 5 + b"x") == (True, PARSE_ERROR, MSG_INVALID_JSON)


# --------------------------------------------------------------------------------------------
# parse_response


def reply_fields(reply: Any) -> tuple[Any, ...]:
    return (reply.id, reply.result, reply.error)


def test_parse_response_single(impl: Impl) -> None:
    parsed = impl.jsonrpc.parse_response(b'{"jsonrpc":"2.0","id":7,"result":{"a": [1, 2]}}')
    assert parsed.batch is False
    assert [reply_fields(r) for r in parsed.replies] == [(b"7", b'{"a": [1, 2]}', None)]
    parsed = impl.jsonrpc.parse_response(
        b'{"jsonrpc":"2.0","id":"x","error":{"code":-32000,"message":"boom"}}'
    )
    assert [reply_fields(r) for r in parsed.replies] == [
        (b'"x"', None, b'{"code":-32000,"message":"boom"}')
    ]


@pytest.mark.parametrize(
    "raw_id",
    [
        b"0",
        b"7",
        b"12345",
        b"123456789012345678",
        b"1234567890123456789",
        b"-1",
        b"1e3",
        b"1.5",
        b'"12"',
        b"null",
        b"{}",
    ],
)
def test_a_replys_id_is_its_raw_json(impl: Impl, raw_id: bytes) -> None:
    """Whatever its spelling (the compiled twin keeps an id of ours as its number, made into
    bytes when read), alone or in a batch, and as set afterwards."""
    single = b'{"jsonrpc":"2.0","id":' + raw_id + b',"result":"0x1"}'
    for body in (single, b"[" + single + b"," + single + b"]"):
        parsed = impl.jsonrpc.parse_response(body)
        assert parsed is not None and {r.id for r in parsed.replies} == {raw_id}
    reply = parsed.replies[0]
    reply.id = b"42"
    assert (reply.id, impl.jsonrpc.Reply(raw_id, None, None).id) == (b"42", raw_id)


def test_parse_response_escaped_keys_and_duplicates(impl: Impl) -> None:
    parsed = impl.jsonrpc.parse_response(
        b'{"\\u0069d":1,"r\\u0065sult":"a","result":"b","\\u0065rror":null,"method":"ignored"}'
    )
    assert [reply_fields(r) for r in parsed.replies] == [(b"1", b'"b"', b"null")]


def test_parse_response_batch(impl: Impl) -> None:
    body = b'[{"jsonrpc":"2.0","id":1,"result":"0x1"}, 5, {"id":2,"error":{}} , "s", {}]'
    parsed = impl.jsonrpc.parse_response(body)
    assert parsed.batch is True
    assert [reply_fields(r) for r in parsed.replies] == [
        (b"1", b'"0x1"', None),
        (None, None, None),
        (b"2", None, b"{}"),
        (None, None, None),
        (None, None, None),
    ]
    empty = impl.jsonrpc.parse_response(b" [ ] ")
    assert (empty.batch, empty.replies) == (True, [])


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"1",
        b'"s"',
        b"null",
        b"{",
        b"[",
        b"[1,]",
        b"[] x",
        b'{"id":1}{}',
        b'{"id":1,}',
        b'{"id":01}',
        b'{"id":"\xff"}',
        b"[" * 200 + b"]" * 200,
        b'{"result":' + b"[" * 200 + b"]" * 200 + b"}",
    ],
)
def test_parse_response_invalid(impl: Impl, body: bytes) -> None:
    assert impl.jsonrpc.parse_response(body) is None


# --------------------------------------------------------------------------------------------
# array_item


def test_array_item(impl: Impl) -> None:
    raw = b' [ 1 , "two" , {"three":[3]} , [4, 4] , null ] '
    items = [impl.jsonrpc.array_item(raw, i) for i in range(6)]
    assert items == [b"1", b'"two"', b'{"three":[3]}', b"[4, 4]", b"null", None]
    assert impl.jsonrpc.array_item(b"[]", 0) is None
    assert impl.jsonrpc.array_item(b"[ ]", 0) is None
    assert impl.jsonrpc.array_item(b'{"a":1}', 0) is None
    assert impl.jsonrpc.array_item(b"", 0) is None
    assert impl.jsonrpc.array_item(b"[1,2]", -1) is None
    assert impl.jsonrpc.array_item(b"[1 2]", 1) is None
    assert impl.jsonrpc.array_item(b"[1,", 1) is None


# --------------------------------------------------------------------------------------------
# Reply builders


def assert_response_object(data: bytes) -> dict[str, Any]:
    obj = json.loads(data)
    assert isinstance(obj, dict)
    assert obj["jsonrpc"] == "2.0"
    assert "id" in obj
    assert ("result" in obj) != ("error" in obj)
    return obj


def test_result_reply(impl: Impl) -> None:
    out = impl.jsonrpc.result_reply(b'"a\\"b"', b'{"x": [1, 2]}')
    assert out == b'{"jsonrpc":"2.0","id":"a\\"b","result":{"x": [1, 2]}}'
    assert assert_response_object(out) == {"jsonrpc": "2.0", "id": 'a"b', "result": {"x": [1, 2]}}


def test_raw_error_reply(impl: Impl) -> None:
    out = impl.jsonrpc.raw_error_reply(b"null", b'{"code":-32000,"message":"x"}')
    assert out == b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"x"}}'
    assert assert_response_object(out)["error"] == {"code": -32000, "message": "x"}


@pytest.mark.parametrize(
    "message",
    [
        "plain",
        "",
        'with "quotes" and \\ backslash',
        "control \x00\x01\n\t\x7f chars",
        "unicode: é 日本 😀 \u2028\u2029",
        "lone surrogate \ud800",
        MSG_BAD_VERSION,
    ],
)
def test_error_reply_message_round_trips(impl: Impl, message: str) -> None:
    out = impl.jsonrpc.error_reply(b"5", -32600, message)
    obj = assert_response_object(out)
    assert obj == {"jsonrpc": "2.0", "id": 5, "error": {"code": -32600, "message": message}}
    out.decode("ascii")  # json.dumps escapes everything outside ASCII


def test_upstream_request(impl: Impl) -> None:
    out = impl.jsonrpc.upstream_request(42, "eth_call", b'[{"to":"0x0"}, "latest"]')
    assert out == b'{"jsonrpc":"2.0","id":42,"method":"eth_call","params":[{"to":"0x0"}, "latest"]}'
    out = impl.jsonrpc.upstream_request(1, 'we"ird\u00e9', None)
    assert json.loads(out) == {"jsonrpc": "2.0", "id": 1, "method": 'we"ird\u00e9', "params": []}
    parsed = impl.jsonrpc.parse_request(out, 1)
    assert call_fields(parsed.calls[0]) == (b"1", 'we"ird\u00e9', b"[]", 0, "")


def test_join_batch(impl: Impl) -> None:
    m = impl.jsonrpc
    parts = [m.result_reply(b"1", b"true"), m.error_reply(b"null", -32600, "bad")]
    out = m.join_batch(parts)
    assert out == b"[" + parts[0] + b"," + parts[1] + b"]"
    assert [assert_response_object(json.dumps(o).encode()) for o in json.loads(out)]
    assert m.join_batch([]) == b"[]"
    assert m.join_batch([b"1"]) == b"[1]"
    with pytest.raises(TypeError):
        m.join_batch([b"1", "2"])


def test_join_batch_copies_each_part_once(impl: Impl) -> None:
    # A batch answer may be tens of megabytes: joining it must not build it more than once.
    parts = [b"7" * (4 << 20) for _ in range(8)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = impl.jsonrpc.join_batch(parts)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(out) == 8 * (4 << 20) + 9
    assert peak < len(out) + (64 << 10), f"joining allocated {peak} bytes for {len(out)}"


def test_replies_for_every_parsed_call_are_valid_json(impl: Impl) -> None:
    body = (
        b'[{"jsonrpc":"2.0","id":1.0,"method":"a"},{"jsonrpc":"2.0","id":-5e3,"method":"b"},'
        b'{"jsonrpc":"2.0","id":"a\\"b","method":"c"},{"jsonrpc":"2.0","id":null,"method":"d"},'
        b'{"id":true},7,{"jsonrpc":"2.0","method":"notify"}]'
    )
    parsed = parse(impl, body)
    replies = []
    for call in parsed.calls:
        if call.error:
            replies.append(impl.jsonrpc.error_reply(call.id, call.error, call.message))
        elif call.id is not None:
            replies.append(impl.jsonrpc.result_reply(call.id, b'"ok"'))
    batch = json.loads(impl.jsonrpc.join_batch(replies))
    assert [r["id"] for r in batch] == [1.0, -5e3, 'a"b', None, None, None]
    for reply in replies:
        assert_response_object(reply)


RECEIPT = (
    b'{"blockHash":"0x'
    + b"ab" * 32
    + b'","blockNumber":"0x2a","logs":[{"address":"0x'
    + b"11" * 20
    + b'","blockNumber":"0x2a","topics":[],"data":"0x"}],"logsBloom":"0x'
    + b"00" * 256
    + b'","status":"0x1","gasUsed":21000,"effectiveGasPrice":null}'
)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (RECEIPT, 0x2A),
        (b'{"number":"0x10","hash":"0x01"}', 16),
        (b'{"number":"","blockNumber":"0xff"}', 255),  # an empty number: the blockNumber
        (b'{"number":null,"blockNumber":"0xFF"}', 255),
        (b'{"number":"0x5","blockNumber":"0x6"}', 5),
        (b' { "blockNumber" : "0x7" } ', 7),
        (b"{}", None),
        (b'{"blockNumber":null}', None),
        (b'{"blockNumber":"42"}', None),
        (b'{"blockNumber":"0x"}', None),
        (b'{"blockNumber":"0x1_0"}', 16),  # Python's int() reads it: so does the twin
        (b'{"blockNumber":"0x' + b"f" * 20 + b'"}', int("f" * 20, 16)),
        (b'{"blockNumber":"0xzz"}', None),
        (b'{"blockNumber":7}', None),  # not a string
        (b'{"blockNumber":"0x1","blockNumber":"0x2"}', 2),  # twice: the last
        (b'{"block\\u004eumber":"0x9"}', 9),  # an escaped name
        (b'{"blockNumber":"\\u0030x9"}', 9),
        (b'[{"blockNumber":"0x3"},{"blockNumber":"0x4"}]', 3),
        (b"[]", None),
        (b'"0x5"', None),
        (b"null", None),
        (b'{"blockNumber":"0x1"', None),  # truncated
        (b'{"blockNumber":"0x1"} x', None),
        (b'{"blockNumber":"0x1","x":[1,2,{"y":tru}]}', None),  # invalid JSON elsewhere
        # The decoder does not look inside a string it skips (nor at its bytes), but a raw
        # control byte fails it: the twin answers alike.
        (b'{"blockNumber":"0x1","x":"\xff"}', 1),
        (b'{"blockNumber":"0x1","x":"\x01"}', None),
    ],
)
def test_result_block(impl: Impl, result: bytes, expected: int | None) -> None:
    """The block a result belongs to (the cache's finality check): its ``number``, else its
    ``blockNumber``; the compiled twin reads a plain object itself and hands the rest to
    the pure twin's decoder: both give the same answer for every input."""
    assert impl.jsonrpc.result_block(result) == expected


def test_upstream_batch(impl: Impl) -> None:
    """A group of calls as one upstream batch: each call's ``upstream_request``, ids in turn,
    joined: byte for byte what the two would make."""
    m = impl.jsonrpc

    class _Flight:
        def __init__(self, method: str, params: bytes | None) -> None:
            self.method, self.params = method, params

    calls = [
        _Flight("eth_call", b'[{"to":"0x0"}, "latest"]'),
        _Flight("eth_blockNumber", None),
        _Flight('we"ird\u00e9', b"[]"),
    ]
    out = m.upstream_batch(98, calls)
    parts = [m.upstream_request(98 + i, c.method, c.params) for i, c in enumerate(calls)]
    assert out == m.join_batch(parts)
    assert [item["id"] for item in json.loads(out)] == [98, 99, 100]
    assert m.upstream_batch(1, []) == b"[]"
    with pytest.raises(TypeError):
        m.upstream_batch(1, [_Flight("eth_call", "not bytes")])  # type: ignore[arg-type]
