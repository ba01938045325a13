"""What the JSON-RPC framing twins (``native/jsonrpc.pyx``, ``_pure/jsonrpc.py``) offer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias


class Call(Protocol):
    """One call of a client request: raw JSON id (None: a notification), method, params; a
    non-zero ``error`` marks it invalid."""

    id: bytes | None
    method: str | None
    params: bytes | None
    error: int
    message: str


class ParsedRequest(Protocol):
    """The calls of a request body; ``error`` non-zero means the whole body is refused."""

    batch: bool
    error: int
    message: str

    @property
    def calls(self) -> Sequence[Call]: ...


class Reply(Protocol):
    """One reply of an upstream response; each field is raw JSON or None.  ``block``: the
    block its result belongs to, ``result_block(result)`` (None without a result)."""

    id: bytes | None
    error: bytes | None

    @property
    def result(self) -> bytes | None: ...
    @property
    def block(self) -> int | None: ...


class ParsedResponse(Protocol):
    batch: bool

    @property
    def replies(self) -> Sequence[Reply]: ...


# The module Protocol's members shadow the class names inside its body.
_Call: TypeAlias = Call
_ParsedRequest: TypeAlias = ParsedRequest
_ParsedResponse: TypeAlias = ParsedResponse
_Reply: TypeAlias = Reply


class JsonRpcModule(Protocol):
    """The module: request and response parsing, and reply builders."""

    @property
    def IMPLEMENTATION(self) -> str: ...
    @property
    def PARSE_ERROR(self) -> int: ...
    @property
    def INVALID_REQUEST(self) -> int: ...
    @property
    def METHOD_NOT_FOUND(self) -> int: ...
    @property
    def INVALID_PARAMS(self) -> int: ...
    @property
    def INTERNAL_ERROR(self) -> int: ...
    @property
    def Call(self) -> type[_Call]: ...
    @property
    def ParsedRequest(self) -> type[_ParsedRequest]: ...
    @property
    def ParsedResponse(self) -> type[_ParsedResponse]: ...
    @property
    def Reply(self) -> type[_Reply]: ...

    def parse_request(self, body: bytes, max_batch: int) -> _ParsedRequest: ...
    def parse_response(self, body: bytes) -> _ParsedResponse | None: ...
    def array_item(self, raw: bytes, index: int) -> bytes | None: ...
    def result_reply(self, id_raw: bytes, result: bytes) -> bytes: ...
    def raw_error_reply(self, id_raw: bytes, error: bytes) -> bytes: ...
    def error_reply(self, id_raw: bytes, code: int, message: str) -> bytes: ...
    def upstream_request(self, request_id: int, method: str, params: bytes | None) -> bytes: ...
    def join_batch(self, parts: list[bytes]) -> bytes: ...
    def upstream_batch(self, first_id: int, calls: list[Any]) -> bytes: ...
    def result_block(self, result: bytes) -> int | None: ...
