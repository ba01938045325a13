"""Typed input: a request's path, query and body decoded into msgspec Structs.

Every mistake of the client is a 400 ``invalid_request`` whose message names the parameter
(``invalid query parameter 'limit': expected an integer <= 100``), never a 500.  Unknown
query parameters and body fields are refused too: a typo (``?limt=5``) silently ignored is a
bug the client never finds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar, get_origin

import msgspec

from chaingate.api.errors import ApiError
from chaingate.api.types import dec_hook

S = TypeVar("S", bound=msgspec.Struct)

MAX_BODY_BYTES = 256 << 10  # REST bodies are small documents; the edge caps bodies at 1 MiB
_AT = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<where>[^`]*)`)?$", re.DOTALL)
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
    decoded = _convert(kind, raw, "query parameter")
    for name, value in raw.items():
        # Lax conversion reads the text "null" as None, which for an optional parameter is
        # "not given": a value the schema does not allow, answered as one.
        if value == "null" and getattr(decoded, name, None) is None:
            raise ApiError(400, f"invalid query parameter {_shown(name)}: null is not a value")
    return decoded


def decode_body(kind: type[S], data: bytes) -> S:
    if not data.strip():
        raise ApiError(400, "a JSON body is required")
    if len(data) > MAX_BODY_BYTES:
        raise ApiError(413, f"the body may be at most {MAX_BODY_BYTES} bytes")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    return _convert(kind, value, "field", strict=True)


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
