"""What the HTTP/1.1 framing twins (``native/http1.pyx``, ``_pure/http1.py``) offer."""

from __future__ import annotations

from typing import Protocol, TypeAlias


class HttpError(Protocol):
    """A framing failure: the peer gets ``status`` and the connection closes."""

    status: int
    message: str


class Request(Protocol):
    """One complete client request (header names lower-cased, values OWS-stripped)."""

    method: bytes
    target: bytes
    path: bytes
    query: bytes
    version: int
    keep_alive: bool
    body: bytes
    headers: list[tuple[bytes, bytes]]
    host: bytes | None
    content_type: bytes | None
    api_key: bytes | None
    authorization: bytes | None
    request_id: bytes | None
    upgrade: bytes | None
    origin: bytes | None
    accept_encoding: bytes | None
    content_encoding: bytes | None
    expect_continue: bool


class Response(Protocol):
    """One complete upstream response."""

    status: int
    body: bytes
    keep_alive: bool
    content_type: bytes | None
    retry_after: bytes | None


class RequestParser(Protocol):
    """Incremental parser for the requests of one client connection."""

    def feed(self, data: bytes) -> None: ...
    def feed_eof(self) -> None: ...
    @property
    def has_partial(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def take_continue(self) -> bool: ...
    def take_buffered(self) -> bytes: ...
    def next_event(self) -> Request | HttpError | None: ...


class ResponseParser(Protocol):
    """Incremental parser for the responses on one upstream connection."""

    def feed(self, data: bytes) -> None: ...
    def feed_eof(self) -> None: ...
    def body_length(self) -> int | None: ...
    def discard_body(self) -> None: ...
    @property
    def has_partial(self) -> bool: ...
    def next_event(self) -> Response | HttpError | None: ...


# The module Protocol's members shadow the class names inside its body.
_HttpError: TypeAlias = HttpError
_Request: TypeAlias = Request
_Response: TypeAlias = Response
_RequestParser: TypeAlias = RequestParser
_ResponseParser: TypeAlias = ResponseParser


class Http1Module(Protocol):
    """The module: its classes (for construction and ``isinstance``) and builders."""

    @property
    def IMPLEMENTATION(self) -> str: ...
    @property
    def HttpError(self) -> type[_HttpError]: ...
    @property
    def Request(self) -> type[_Request]: ...
    @property
    def Response(self) -> type[_Response]: ...

    def RequestParser(
        self,
        max_line: int = ...,
        max_header_bytes: int = ...,
        max_headers: int = ...,
        max_body: int = ...,
    ) -> _RequestParser: ...

    def ResponseParser(
        self,
        max_line: int = ...,
        max_header_bytes: int = ...,
        max_headers: int = ...,
        max_body: int = ...,
    ) -> _ResponseParser: ...

    def build_response(
        self, status: int, headers: bytes, body: bytes, keep_alive: bool, http10: bool = ...
    ) -> bytes: ...

    def build_response_head(
        self, status: int, headers: bytes, body_length: int, keep_alive: bool, http10: bool = ...
    ) -> bytes: ...

    def build_request(self, path: bytes, host: bytes, headers: bytes, body: bytes) -> bytes: ...
