"""The seam where every request is authenticated and metered before it is dispatched.

The edge calls ``authenticate`` once per request (before reading meaning into the body) and
puts ``response_headers`` on every response it sends; the RPC service calls ``admit`` with the
request's total compute units once it has classified the calls, before anything reaches a node.
A rejected request costs nothing.

``OpenGate`` admits everything: it is what runs until API keys and plans are configured.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec


class Principal(msgspec.Struct, frozen=True):
    """Who is calling.  ``key_id`` is empty for the anonymous principal of the open gate."""

    key_id: str = ""
    account_id: str = ""
    scopes: frozenset[str] = frozenset()
    test_key: bool = False


class Rejection(msgspec.Struct, frozen=True):
    """Why a request is refused: HTTP status, spec error code, message, extra header lines."""

    status: int
    code: str
    message: str
    headers: bytes = b""


class NetworkInfo(msgspec.Struct, frozen=True):
    chain: str
    network: str
    testnet: bool


class Gate(Protocol):
    def authenticate(self, request: Any, network: NetworkInfo | None) -> Principal | Rejection: ...

    def admit(self, principal: Principal, write: bool, cu: int, tcu: int) -> Rejection | None: ...

    def response_headers(self, principal: Principal | None) -> bytes: ...


ANONYMOUS = Principal()


class OpenGate:
    """No keys, no limits."""

    def authenticate(self, request: Any, network: NetworkInfo | None) -> Principal | Rejection:
        return ANONYMOUS

    def admit(self, principal: Principal, write: bool, cu: int, tcu: int) -> Rejection | None:
        return None

    def response_headers(self, principal: Principal | None) -> bytes:
        return b""
