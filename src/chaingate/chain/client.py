"""JSON-RPC calls that chaingate itself makes (follower, gas oracle, hubs), through the pool.

The proxy path forwards client bytes untouched; internal callers want decoded results, so
this thin layer encodes calls with msgspec, sends them through the same ``UpstreamPool``
(health, failover, TLS) and decodes the answers.  Node errors become ``RpcCallError``; an
upstream that cannot be reached raises the pool's ``UpstreamError``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec
import trio

from chaingate.rpc.errors import BAD_RESPONSE, UpstreamError
from chaingate.rpc.pool import UpstreamPool


class RpcCallError(Exception):
    """The node answered the call with a JSON-RPC error."""

    def __init__(self, method: str, code: int, message: str, data: object = None) -> None:
        super().__init__(f"{method}: {code} {message}")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class _Call(msgspec.Struct):
    method: str
    params: Sequence[Any]
    id: int
    jsonrpc: str = "2.0"


class _Reply(msgspec.Struct):
    id: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None


class _RawReply(msgspec.Struct):
    id: int | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: dict[str, Any] | None = None


T = TypeVar("T")


class _TypedReply(msgspec.Struct, Generic[T]):
    id: int | None = None
    result: T | None = None
    error: dict[str, Any] | None = None


@functools.cache
def _typed_decoder(kind: Any) -> msgspec.json.Decoder[_TypedReply[Any]]:
    return msgspec.json.Decoder(_TypedReply[kind])


_encode = msgspec.json.Encoder().encode
_decode_one = msgspec.json.Decoder(_Reply).decode
_decode_batch = msgspec.json.Decoder(list[_Reply]).decode
_decode_raw = msgspec.json.Decoder(_RawReply).decode


class ChainClient:
    """Decoded JSON-RPC over one chain/network's upstream pool (its ``run()`` must be running)."""

    # Parameters may hold msgspec.Raw (JSON text encoded once): the encoder copies it.
    raw_json = True

    def __init__(self, pool: UpstreamPool, *, timeout: float = 30.0, max_batch: int = 100) -> None:
        self.pool = pool
        self.timeout = timeout
        self.max_batch = max_batch
        self._next_id = 1
        self.calls = 0  # upstream requests made (a batch counts once); tests read it

    def _ids(self, n: int) -> int:
        first = self._next_id
        self._next_id += n
        return first

    async def _post(self, body: bytes, retry_safe: bool) -> tuple[str, bytes]:
        self.calls += 1
        deadline = trio.current_time() + self.timeout
        upstream, response = await self.pool.request(body, retry_safe=retry_safe, deadline=deadline)
        return upstream.name, bytes(response.body)

    async def _one(
        self,
        method: str,
        params: Sequence[Any],
        retry_safe: bool,
        decode: Callable[[bytes], _Reply | _RawReply | _TypedReply[Any]],
        *,
        invalid_raises: bool = False,
    ) -> Any:
        """One call sent and its reply decoded by ``decode``: the result, or RpcCallError for
        the node's error, UpstreamError for an answer that is not JSON-RPC (with
        ``invalid_raises``, a reply of the wrong shape raises msgspec.ValidationError)."""
        call_id = self._ids(1)
        name, body = await self._post(_encode(_Call(method, params, call_id)), retry_safe)
        try:
            reply = decode(body)
        except msgspec.DecodeError as exc:
            if invalid_raises and isinstance(exc, msgspec.ValidationError):
                raise
            raise UpstreamError(
                BAD_RESPONSE, f"{method}: answer is not JSON-RPC", sent=True, upstream=name
            ) from None
        return _unwrap(method, reply)

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        """One call's result; raises RpcCallError or UpstreamError."""
        return await self._one(method, params, retry_safe, _decode_one)

    async def call_raw(
        self, method: str, params: Sequence[Any], *, retry_safe: bool = True
    ) -> msgspec.Raw:
        """One call's result as the node's own JSON text (``null`` when it gave none), for
        an answer passed on as it is: never built into Python objects to be encoded again
        (a bundle's receipt, ~24 KB, on every eth_getUserOperationReceipt).  Raises as
        ``call``."""
        result: msgspec.Raw = await self._one(method, params, retry_safe, _decode_raw)
        return result

    async def call_as(
        self, method: str, params: Sequence[Any], kind: Any, *, retry_safe: bool = True
    ) -> Any:
        """One call's result decoded straight into ``kind`` (a large answer — a struct log —
        never becomes generic Python objects first).  msgspec.ValidationError if it is not
        one; RpcCallError or UpstreamError as ``call``."""
        decode = _typed_decoder(kind).decode
        return await self._one(method, params, retry_safe, decode, invalid_raises=True)

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any | RpcCallError]:
        """Results in call order (an item that failed is its RpcCallError, not raised).

        Read-only calls only: a batch is retried on another upstream as a whole.
        """
        results: list[Any | RpcCallError] = []
        for start in range(0, len(calls), self.max_batch):
            chunk = calls[start : start + self.max_batch]
            first = self._ids(len(chunk))
            body = _encode([_Call(m, p, first + i) for i, (m, p) in enumerate(chunk)])
            name, answer = await self._post(body, True)
            try:
                replies = _decode_batch(answer)
            except msgspec.DecodeError:
                raise UpstreamError(
                    BAD_RESPONSE, "batch answer is not a JSON-RPC array", sent=True, upstream=name
                ) from None
            by_id = {r.id: r for r in replies}
            for i, (method, _) in enumerate(chunk):
                reply = by_id.get(first + i)
                if reply is None:
                    raise UpstreamError(
                        BAD_RESPONSE, f"batch answer lacks {method}", sent=True, upstream=name
                    )
                try:
                    results.append(_unwrap(method, reply))
                except RpcCallError as exc:
                    results.append(exc)
        return results


def _unwrap(method: str, reply: _Reply | _RawReply | _TypedReply[Any]) -> Any:
    if reply.error is not None:
        error = reply.error
        raise RpcCallError(
            method, int(error.get("code", 0)), str(error.get("message", "")), error.get("data")
        )
    return reply.result
