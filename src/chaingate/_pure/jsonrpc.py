"""JSON-RPC 2.0 envelope framing, sans-IO: the pure-Python twin of ``native/jsonrpc.pyx``.

The proxy reads only what it must from a request: each call's ``id`` (kept as the client's raw
bytes, echoed back unchanged), its ``method`` (a str) and its ``params`` (kept as raw bytes and
forwarded as sent).  The scan still validates the whole body as strict JSON (RFC 8259, UTF-8),
so a malformed body is a -32700 and never reaches a node.

Upstream responses are scanned the same way: each reply's ``id``, ``result`` and ``error`` are
raw byte spans, so a result passes from node to client without being decoded and re-encoded.

This module is the specification of behaviour; the compiled twin must match it exactly.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from chaingate.framing_constants import MAX_JSON_DEPTH

__all__ = [
    "IMPLEMENTATION",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Call",
    "ParsedRequest",
    "ParsedResponse",
    "Reply",
    "array_item",
    "error_reply",
    "join_batch",
    "parse_request",
    "parse_response",
    "raw_error_reply",
    "result_block",
    "result_reply",
    "upstream_batch",
    "upstream_request",
]

IMPLEMENTATION = "pure"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_STRING_TAIL = re.compile(rb'(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WS = re.compile(rb"[ \t\n\r]*")

_SYNTAX = -1  # scanner failure codes
_TOO_DEEP = -2

MSG_INVALID_JSON = "parse error: invalid JSON"
MSG_TOO_DEEP = f"parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels"
MSG_BAD_UTF8 = "parse error: body is not valid UTF-8"
MSG_EMPTY_BATCH = "invalid request: empty batch"
MSG_NOT_CALL = "invalid request: expected an object or an array of objects"
MSG_BATCH_ITEM = "invalid request: batch item is not an object"
MSG_BAD_ID = "invalid request: id must be a string, a number or null"
MSG_BAD_VERSION = 'invalid request: jsonrpc must be "2.0"'
MSG_NO_METHOD = "invalid request: method is missing"
MSG_BAD_METHOD = "invalid request: method must be a string"
MSG_BAD_PARAMS = "invalid request: params must be an array or an object"


class Call:
    """One call of a client request.

    ``id`` is the raw JSON of the id, or None when absent (a notification).  When ``error`` is
    non-zero the call is invalid and ``id`` is what the error reply must carry (``b"null"`` when
    the call's own id is missing or unusable).
    """

    __slots__ = ("error", "id", "message", "method", "params")

    def __init__(
        self,
        id: bytes | None,
        method: str | None,
        params: bytes | None,
        error: int,
        message: str,
    ) -> None:
        self.id = id
        self.method = method
        self.params = params
        self.error = error
        self.message = message


class ParsedRequest:
    """The calls of a request body; ``error`` non-zero means the whole body is refused."""

    __slots__ = ("batch", "calls", "error", "message")

    def __init__(self, batch: bool, calls: list[Call], error: int, message: str) -> None:
        self.batch = batch
        self.calls = calls
        self.error = error
        self.message = message


class Reply:
    """One reply of an upstream response; each field is raw JSON or None when absent."""

    __slots__ = ("_result", "error", "id")

    def __init__(self, id: bytes | None, result: bytes | None, error: bytes | None) -> None:
        self.id = id
        self._result = result
        self.error = error

    @property
    def result(self) -> bytes | None:
        return self._result

    @property
    def block(self) -> int | None:
        """``result_block(result)`` (None without a result).  The compiled twin reads it while
        it scans the response, so that a receipt is not scanned twice."""
        return None if self._result is None else result_block(self._result)


class ParsedResponse:
    __slots__ = ("batch", "replies")

    def __init__(self, batch: bool, replies: list[Reply]) -> None:
        self.batch = batch
        self.replies = replies


def _ws(b: bytes, i: int) -> int:
    m = _WS.match(b, i)
    return m.end() if m else i


def _skip(b: bytes, i: int, n: int, depth: int) -> int:
    """End offset of the JSON value starting at ``i`` (no leading whitespace), or < 0."""
    if i >= n:
        return _SYNTAX
    c = b[i]
    if c == 0x22:  # "
        m = _STRING_TAIL.match(b, i + 1)
        return m.end() if m else _SYNTAX
    if c == 0x7B:  # {
        if depth >= MAX_JSON_DEPTH:
            return _TOO_DEEP
        i = _ws(b, i + 1)
        if i < n and b[i] == 0x7D:
            return i + 1
        while True:
            if i >= n or b[i] != 0x22:
                return _SYNTAX
            m = _STRING_TAIL.match(b, i + 1)
            if not m:
                return _SYNTAX
            i = _ws(b, m.end())
            if i >= n or b[i] != 0x3A:
                return _SYNTAX
            i = _skip(b, _ws(b, i + 1), n, depth + 1)
            if i < 0:
                return i
            i = _ws(b, i)
            if i >= n:
                return _SYNTAX
            if b[i] == 0x7D:
                return i + 1
            if b[i] != 0x2C:
                return _SYNTAX
            i = _ws(b, i + 1)
    if c == 0x5B:  # [
        if depth >= MAX_JSON_DEPTH:
            return _TOO_DEEP
        i = _ws(b, i + 1)
        if i < n and b[i] == 0x5D:
            return i + 1
        while True:
            i = _skip(b, i, n, depth + 1)
            if i < 0:
                return i
            i = _ws(b, i)
            if i >= n:
                return _SYNTAX
            if b[i] == 0x5D:
                return i + 1
            if b[i] != 0x2C:
                return _SYNTAX
            i = _ws(b, i + 1)
    if c == 0x74:
        return i + 4 if b.startswith(b"true", i) else _SYNTAX
    if c == 0x66:
        return i + 5 if b.startswith(b"false", i) else _SYNTAX
    if c == 0x6E:
        return i + 4 if b.startswith(b"null", i) else _SYNTAX
    m = _NUMBER.match(b, i)
    return m.end() if m else _SYNTAX


def _string_value(raw: bytes) -> str:
    """Decode the inside of a JSON string already validated by the scanner."""
    if b"\\" in raw:
        value: str = json.loads(b'"' + raw + b'"')
        return value
    return raw.decode("utf-8")


def _members(b: bytes, i: int, n: int, depth: int, out: list[tuple[str, int, int]]) -> int:
    """Scan the object at ``i``; append (key, value_start, value_end) per member; end or < 0."""
    if depth >= MAX_JSON_DEPTH:
        return _TOO_DEEP
    i = _ws(b, i + 1)
    if i < n and b[i] == 0x7D:
        return i + 1
    while True:
        if i >= n or b[i] != 0x22:
            return _SYNTAX
        m = _STRING_TAIL.match(b, i + 1)
        if not m:
            return _SYNTAX
        key = _string_value(b[i + 1 : m.end() - 1])
        i = _ws(b, m.end())
        if i >= n or b[i] != 0x3A:
            return _SYNTAX
        start = _ws(b, i + 1)
        end = _skip(b, start, n, depth + 1)
        if end < 0:
            return end
        out.append((key, start, end))
        i = _ws(b, end)
        if i >= n:
            return _SYNTAX
        if b[i] == 0x7D:
            return i + 1
        if b[i] != 0x2C:
            return _SYNTAX
        i = _ws(b, i + 1)


def _call(b: bytes, members: list[tuple[str, int, int]]) -> Call:
    """Build a Call from an object's members (a repeated key: the last one counts)."""
    id_raw: bytes | None = None
    version_ok = False
    method: str | None = None
    method_seen = False
    params: bytes | None = None
    for key, start, end in members:
        if key == "id":
            id_raw = b[start:end]
        elif key == "jsonrpc":
            version_ok = b[start:end] == b'"2.0"'
        elif key == "method":
            method_seen = True
            method = _string_value(b[start + 1 : end - 1]) if b[start] == 0x22 else None
        elif key == "params":
            params = b[start:end]
    if id_raw is not None and id_raw[0] in b"tf{[":
        return Call(b"null", None, None, INVALID_REQUEST, MSG_BAD_ID)
    reply_id = b"null" if id_raw is None else id_raw
    if not version_ok:
        return Call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_VERSION)
    if not method_seen:
        return Call(reply_id, None, None, INVALID_REQUEST, MSG_NO_METHOD)
    if method is None:
        return Call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_METHOD)
    if params is not None and params[0] not in b"[{":
        return Call(reply_id, None, None, INVALID_REQUEST, MSG_BAD_PARAMS)
    return Call(id_raw, method, params, 0, "")


def _scan_failure(code: int) -> str:
    return MSG_TOO_DEEP if code == _TOO_DEEP else MSG_INVALID_JSON


def parse_request(body: bytes, max_batch: int) -> ParsedRequest:
    """Split a request body into calls.  Never raises: every failure is a JSON-RPC error."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return ParsedRequest(False, [], PARSE_ERROR, MSG_BAD_UTF8)
    n = len(body)
    i = _ws(body, 0)
    if i >= n:
        return ParsedRequest(False, [], PARSE_ERROR, MSG_INVALID_JSON)
    c = body[i]
    if c == 0x7B:
        members: list[tuple[str, int, int]] = []
        end = _members(body, i, n, 0, members)
        if end < 0:
            return ParsedRequest(False, [], PARSE_ERROR, _scan_failure(end))
        if _ws(body, end) != n:
            return ParsedRequest(False, [], PARSE_ERROR, MSG_INVALID_JSON)
        return ParsedRequest(False, [_call(body, members)], 0, "")
    if c == 0x5B:
        calls: list[Call] = []
        count = 0
        i = _ws(body, i + 1)
        if i < n and body[i] == 0x5D:
            if _ws(body, i + 1) != n:
                return ParsedRequest(True, [], PARSE_ERROR, MSG_INVALID_JSON)
            return ParsedRequest(True, [], INVALID_REQUEST, MSG_EMPTY_BATCH)
        while True:
            if i < n and body[i] == 0x7B:
                members = []
                end = _members(body, i, n, 1, members)
                if end < 0:
                    return ParsedRequest(True, [], PARSE_ERROR, _scan_failure(end))
                count += 1
                if count <= max_batch:
                    calls.append(_call(body, members))
            else:
                end = _skip(body, i, n, 1)
                if end < 0:
                    return ParsedRequest(True, [], PARSE_ERROR, _scan_failure(end))
                count += 1
                if count <= max_batch:
                    calls.append(Call(b"null", None, None, INVALID_REQUEST, MSG_BATCH_ITEM))
            i = _ws(body, end)
            if i >= n:
                return ParsedRequest(True, [], PARSE_ERROR, MSG_INVALID_JSON)
            if body[i] == 0x5D:
                break
            if body[i] != 0x2C:
                return ParsedRequest(True, [], PARSE_ERROR, MSG_INVALID_JSON)
            i = _ws(body, i + 1)
        if _ws(body, i + 1) != n:
            return ParsedRequest(True, [], PARSE_ERROR, MSG_INVALID_JSON)
        if count > max_batch:
            return ParsedRequest(
                True,
                [],
                INVALID_REQUEST,
                f"invalid request: batch of {count} calls exceeds the limit of {max_batch}",
            )
        return ParsedRequest(True, calls, 0, "")
    end = _skip(body, i, n, 0)
    if end < 0:
        return ParsedRequest(False, [], PARSE_ERROR, _scan_failure(end))
    if _ws(body, end) != n:
        return ParsedRequest(False, [], PARSE_ERROR, MSG_INVALID_JSON)
    return ParsedRequest(False, [], INVALID_REQUEST, MSG_NOT_CALL)


def _reply(b: bytes, members: list[tuple[str, int, int]]) -> Reply:
    id_raw = result = error = None
    for key, start, end in members:
        if key == "id":
            id_raw = b[start:end]
        elif key == "result":
            result = b[start:end]
        elif key == "error":
            error = b[start:end]
    return Reply(id_raw, result, error)


def parse_response(body: bytes) -> ParsedResponse | None:
    """Split an upstream response into replies; None when it is not valid JSON-RPC framing."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    n = len(body)
    i = _ws(body, 0)
    if i >= n:
        return None
    members: list[tuple[str, int, int]] = []
    if body[i] == 0x7B:
        end = _members(body, i, n, 0, members)
        if end < 0 or _ws(body, end) != n:
            return None
        return ParsedResponse(False, [_reply(body, members)])
    if body[i] != 0x5B:
        return None
    replies: list[Reply] = []
    i = _ws(body, i + 1)
    if i < n and body[i] == 0x5D:
        return ParsedResponse(True, []) if _ws(body, i + 1) == n else None
    while True:
        if i >= n:
            return None
        if body[i] == 0x7B:
            members = []
            end = _members(body, i, n, 1, members)
            if end < 0:
                return None
            replies.append(_reply(body, members))
        else:
            end = _skip(body, i, n, 1)
            if end < 0:
                return None
            replies.append(Reply(None, None, None))
        i = _ws(body, end)
        if i >= n:
            return None
        if body[i] == 0x5D:
            break
        if body[i] != 0x2C:
            return None
        i = _ws(body, i + 1)
    if _ws(body, i + 1) != n:
        return None
    return ParsedResponse(True, replies)


def array_item(raw: bytes, index: int) -> bytes | None:
    """Raw JSON of element ``index`` of the (already validated) array ``raw``, if present."""
    n = len(raw)
    i = _ws(raw, 0)
    if i >= n or raw[i] != 0x5B:
        return None
    i = _ws(raw, i + 1)
    if i < n and raw[i] == 0x5D:
        return None
    k = 0
    while i < n:
        end = _skip(raw, i, n, 1)
        if end < 0:
            return None
        if k == index:
            return raw[i:end]
        k += 1
        i = _ws(raw, end)
        if i >= n or raw[i] != 0x2C:
            return None
        i = _ws(raw, i + 1)
    return None


def result_reply(id_raw: bytes, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_raw + b',"result":' + result + b"}"


def raw_error_reply(id_raw: bytes, error: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + id_raw + b',"error":' + error + b"}"


def error_reply(id_raw: bytes, code: int, message: str) -> bytes:
    return b'{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}' % (
        id_raw,
        code,
        json.dumps(message).encode(),
    )


# JSON-encoded method names: the same few dozen names come back on every call.
_METHOD_JSON: dict[str, bytes] = {}
_METHOD_JSON_MAX = 4096


def _method_json(method: str) -> bytes:
    encoded = _METHOD_JSON.get(method)
    if encoded is None:
        encoded = json.dumps(method).encode()
        if len(_METHOD_JSON) < _METHOD_JSON_MAX:
            _METHOD_JSON[method] = encoded
    return encoded


def upstream_request(request_id: int, method: str, params: bytes | None) -> bytes:
    """One call as sent to a node: our own id, the client's method and raw params."""
    return b'{"jsonrpc":"2.0","id":%d,"method":%s,"params":%s}' % (
        request_id,
        _method_json(method),
        b"[]" if params is None else params,
    )


def upstream_batch(first_id: int, calls: list[Any]) -> bytes:
    """Calls (anything with ``method`` and ``params``, a lane's flights) as one upstream batch:
    ``upstream_request`` of each, ids from ``first_id`` on, in one array."""
    return join_batch(
        [upstream_request(first_id + i, call.method, call.params) for i, call in enumerate(calls)]
    )


def join_batch(parts: list[bytes]) -> bytes:
    """``[part,part,...]`` with each part copied once (an answer may be many megabytes)."""
    if not parts:
        return b"[]"
    pieces = [b"["]
    for i, part in enumerate(parts):
        if type(part) is not bytes:
            raise TypeError(f"sequence item {i}: expected bytes, {type(part).__name__} found")
        pieces.append(part)
        pieces.append(b",")
    pieces[-1] = b"]"
    return b"".join(pieces)


class _BlockRef(msgspec.Struct):
    number: str | None = None
    blockNumber: str | None = None


_block_ref_decoder = msgspec.json.Decoder(_BlockRef | list[_BlockRef])


def result_block(result: bytes) -> int | None:
    """The block a block/transaction/receipt result belongs to, when it says: its ``number``,
    else its ``blockNumber`` (a 0x-hex string); of a list, its first item's.  (The RPC
    service asks, to know whether a result is final: ``RpcService._maybe_cache``.)"""
    try:
        ref = _block_ref_decoder.decode(result)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if isinstance(ref, list):
        if not ref:
            return None
        ref = ref[0]
    value = ref.number or ref.blockNumber
    if value is None or not value.startswith("0x"):
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None
