"""What the edge-loop twins (``native/edgeloop.pyx``, ``_pure/edgeloop.py``) offer, and what
the loop asks of the code around it (the handler's callbacks)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Protocol, TypeAlias

from chaingate.twintypes.fastlane import AnswerBudget, ErrorBody, Lane
from chaingate.twintypes.http1 import Http1Module, Request, RequestParser


class Conn(Protocol):
    """One client connection as the loop keeps it (read by the edge server)."""

    fd: int
    peer: str
    group: str
    parser: RequestParser
    state: int
    since: float
    unsent: int
    # The request being answered: read only while one is (the loop's encode callback).
    request: Request
    auth_failures: int


class DateLine(Protocol):
    """The cached ``Date:`` header line."""

    def line(self) -> bytes: ...


class Loop(Protocol):
    """Every connection of the edge, and what happens when they are ready."""

    closing: bool
    unsent_bytes: int
    overloaded: int
    framing_errors: dict[int, int]

    @property
    def conns(self) -> Mapping[int, Conn]: ...
    def fileno(self) -> int: ...
    def close_loop(self) -> None: ...
    def register(self, sock: socket.socket, peer: str, group: str) -> Conn: ...
    def close(self, conn: Conn) -> None: ...
    def timeout(self, conn: Conn, status: int, message: str) -> None: ...
    def detach(self, conn: Conn) -> tuple[int, bytes] | None: ...
    def idle(self, conn: Conn) -> bool: ...
    def begin_shutdown(self) -> None: ...
    def poll(self) -> bool: ...
    def answer(self, conn: Conn, status: int, headers: bytes, body: bytes) -> None: ...


# The module Protocol's member shadows the class name inside its body.
_Loop: TypeAlias = Loop


class EdgeloopModule(Protocol):
    @property
    def IMPLEMENTATION(self) -> str: ...

    def Loop(
        self,
        http1: Http1Module,
        lane: Lane,
        *,
        limits: tuple[int, int, int, int],
        max_unsent_bytes: int,
        max_auth_failures: int,
        compress_min: int,
        budget: AnswerBudget,
        date: DateLine,
        error_body: ErrorBody,
        handoff: Callable[[Conn, Request], None],
        encode: Callable[[Conn, int, bytes, bytes], None],
        closed: Callable[[Conn], None],
    ) -> _Loop: ...
