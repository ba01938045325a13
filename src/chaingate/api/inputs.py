"""Typed input: a request's path, query and body decoded into msgspec Structs.

Every mistake of the client is a 400 ``invalid_request`` whose message names the parameter
(``invalid query parameter 'limit': expected an integer <= 100``), never a 500.  Unknown
query parameters and body fields are refused too: a typo (``?limt=5``) silently ignored is a
bug the client never finds.  So is what a lax reading would guess at: an integer written
``1e3`` or ``1.0``, a key given twice in one JSON object (which one did the client mean?).
A body is checked for depth before it is decoded (the decoder recurses per level), and for
its label first: a body must say it is JSON (``check_media_type``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from typing import Any, TypeVar, get_origin

import msgspec

from chaingate.api.errors import ApiError
from chaingate.api.types import dec_hook
from chaingate.framing_constants import MAX_JSON_DEPTH
from chaingate.jsondepth import outside_strings, too_deep

S = TypeVar("S", bound=msgspec.Struct)

MAX_BODY_BYTES = 256 << 10  # REST bodies are small documents; the edge caps bodies at 1 MiB
_AT = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<where>[^`]*)`)?$", re.DOTALL)
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
# C0, DEL and C1: no parameter takes one (names, ids, addresses, URLs...).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NO_CONTROL = "control characters (NUL, ESC, line breaks...) are not allowed"
# How msgspec writes them: C0 escaped (\n, \u001b), DEL and C1 as they are.  An escaped
# backslash before "n" matches too; the walk that names the field then finds nothing.
_CONTROL_WRITTEN = re.compile(rb"\\[bfnrt]|\\u00[01]|\x7f|\xc2[\x80-\x9f]")
_JSON_ONLY = "the body must be sent as Content-Type: application/json"
_JSON_SUFFIX = re.compile(r"application/[a-z0-9!#$&^_.-]+\+json")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")
_TYPE_WORDS = {
    "`int`": "an integer",
    "`str`": "a string",
    "`bool`": "a boolean",
    "`float`": "a number",
    "`array`": "an array",
    "`object`": "an object",
    "`null`": "null",
}


def decode_path(kind: type[S], params: dict[str, str]) -> S:
    return _convert(kind, params, "path parameter")


def decode_query(kind: type[S], items: Iterable[tuple[str, list[str]]]) -> S:
    """From the query's (name, values) pairs; a scalar parameter may be given once only."""
    lists = {f.name for f in msgspec.structs.fields(kind) if get_origin(f.type) is list}
    raw: dict[str, Any] = {}
    for name, values in items:
        if name in lists:
            raw[name] = values
        elif len(values) > 1:
            raise ApiError(400, f"query parameter {_shown(name)} is given more than once")
        else:
            raw[name] = values[0]
    for name, value in raw.items():
        if any(_CONTROL.search(v) for v in (value if isinstance(value, list) else [value])):
            raise ApiError(400, f"invalid query parameter {_shown(name)}: {_NO_CONTROL}")
    for name in _integer_fields(kind) & raw.keys():
        # Lax conversion reads "1e3" and "1.0" as integers: only digits are one.
        if not _INTEGER.fullmatch(raw[name]):
            raise ApiError(400, f"invalid query parameter {_shown(name)}: expected an integer")
    decoded = _convert(kind, raw, "query parameter")
    for name, value in raw.items():
        # Lax conversion reads the text "null" as None, which for an optional parameter is
        # "not given": a value the schema does not allow, answered as one.
        if value == "null" and getattr(decoded, name, None) is None:
            raise ApiError(400, f"invalid query parameter {_shown(name)}: null is not a value")
    return decoded


def check_media_type(labels: list[str]) -> None:
    """415 unless the request labels its body ``application/json`` (or a ``+json`` type such
    as ``application/merge-patch+json``), parameters allowed, a charset only if UTF-8 (RFC
    8259 8.1: JSON between systems is UTF-8).  A missing label is refused too: a body's type
    is stated, not guessed (RFC 9110 8.3 leaves it to the server; JSON-RPC is lenient there,
    docs/decisions/rpc.md, for the scripts that omit it)."""
    if len(labels) != 1:
        raise ApiError(
            415,
            f"{_JSON_ONLY}; the request has "
            + ("no Content-Type" if not labels else "more than one Content-Type"),
        )
    kind, _, parameters = labels[0].partition(";")
    kind = kind.strip().lower()
    if kind != "application/json" and not _JSON_SUFFIX.fullmatch(kind):
        raise ApiError(415, f"{_JSON_ONLY}, not {_shown(kind)}")
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise ApiError(415, f"{_JSON_ONLY}: a JSON body is UTF-8, not {_shown(charset)}")


def decode_body(kind: type[S], data: bytes) -> S:
    if not data.strip():
        raise ApiError(400, "a JSON body is required")
    if len(data) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body may be at most {MAX_BODY_BYTES} bytes")
    if too_deep(data):
        raise ApiError(400, f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
    if not data.isascii():
        # Checked here: msgspec's own answer changed between releases (a UnicodeDecodeError
        # before 0.23, a DecodeError "Invalid UTF-8 encoded string" since).
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "malformed JSON body: not valid UTF-8") from None
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    # The body as decoded, written again in C: each member once, escapes made regular.
    decoded = msgspec.json.encode(value)
    if _maybe_control(decoded) and _CONTROL_WRITTEN.search(decoded):
        _refuse_control_characters(value)
    if _repeats_a_key(data, decoded):
        raise ApiError(
            400, f"malformed JSON body: {_repeated_key(data)} is given twice in an object"
        )
    return _convert(kind, value, "field", strict=True)


def _maybe_control(decoded: bytes) -> bool:
    # Bytes searches (C, memchr) spare most bodies the regular expression.
    return b"\\" in decoded or b"\x7f" in decoded or b"\xc2" in decoded


def _repeats_a_key(data: bytes, decoded: bytes) -> bool:
    """Does the body's text hold more object members than its decoded objects?  Every ":"
    outside the strings of valid JSON is one member, so only when a key repeats (the decoder
    kept the last one).  Without a ``\\u003a`` escape no decoded string holds a ":" the text
    did not, so equal counts of every ":" already settle it; else strings are left out."""
    escaped = b"\\u003a" in data or b"\\u003A" in data
    if not escaped and data.count(b":") == decoded.count(b":"):
        return False
    return outside_strings(data).count(b":") != outside_strings(decoded).count(b":")


def _refuse_control_characters(value: object) -> None:
    """400 naming the first key or string of a decoded body that holds a control character
    (no field takes one; a NUL is no PostgreSQL text)."""
    pending: list[tuple[Any, _Where]] = [(value, None)]
    while pending:
        item, where = pending.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                inside = (where, key)
                if _CONTROL.search(key):
                    raise ApiError(400, f"invalid field {_shown(_path(inside))}: {_NO_CONTROL}")
                pending.append((child, inside))
        elif isinstance(item, list):
            pending.extend((child, (where, i)) for i, child in enumerate(item))
        elif isinstance(item, str) and _CONTROL.search(item):
            raise ApiError(400, f"invalid field {_shown(_path(where))}: {_NO_CONTROL}")


# Where a value sits in a body: (where its container sits, its key or index); None: the body.
_Where = tuple["_Where", str | int] | None


def _path(where: _Where) -> str:
    parts: list[str | int] = []
    while where is not None:
        where, part = where
        parts.append(part)
    text = ""
    for part in reversed(parts):
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _repeated_key(data: bytes) -> str:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, item in items:
            if key in seen:
                raise _Repeated(key)
            seen[key] = item
        return seen

    try:
        json.loads(data, object_pairs_hook=pairs)
    except _Repeated as repeated:
        return f"the key {_shown(repeated.key)}"
    except ValueError:  # what msgspec reads and the stdlib does not (an integer of 5,000 digits)
        pass
    return "a key"


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


@cache
def _integer_fields(kind: type[msgspec.Struct]) -> frozenset[str]:
    """The fields of ``kind`` that take an integer (alone or with null)."""
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType)
    found = set()
    for field in info.fields:
        kind_of = _bare(field.type)
        types = kind_of.types if isinstance(kind_of, msgspec.inspect.UnionType) else (kind_of,)
        if any(isinstance(_bare(t), msgspec.inspect.IntType) for t in types):
            found.add(field.encode_name)
    return frozenset(found)


def _bare(kind: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type under its constraints (``Annotated[int, Meta(ge=1)]`` -> int)."""
    while isinstance(kind, msgspec.inspect.Metadata):
        kind = kind.type
    return kind


def _convert(kind: type[S], raw: dict[str, Any], what: str, *, strict: bool = False) -> S:
    try:
        return msgspec.convert(raw, kind, strict=strict, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise ApiError(400, describe(exc, what)) from None


def describe(exc: msgspec.ValidationError, what: str) -> str:
    """A client-readable message naming the parameter of a msgspec validation error."""
    text = str(exc)
    unknown = _UNKNOWN.match(text)
    missing = _MISSING.match(text)
    found = _AT.match(text)
    where = (found["where"] or "") if found else ""
    prefix = where.lstrip(".")
    if unknown:
        name = f"{prefix}.{unknown['name']}" if prefix else unknown["name"]
        return f"unknown {what} {_shown(name)}"
    if missing:
        name = f"{prefix}.{missing['name']}" if prefix else missing["name"]
        return f"missing required {what} {_shown(name)}"
    detail = found["detail"] if found else text
    for word, plain in _TYPE_WORDS.items():
        detail = detail.replace(word, plain)
    detail = detail[:1].lower() + detail[1:]
    if not prefix:
        return f"invalid {what}s: {detail}"
    return f"invalid {what} {_shown(prefix)}: {detail}"


def _shown(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "...")
