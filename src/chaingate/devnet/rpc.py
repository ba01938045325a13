"""A small synchronous JSON-RPC client for the devnet bootstrap: one keep-alive connection,
batches, errors raised with the method that failed.

The bootstrap runs in a worker thread under ``chaingate dev`` and directly in sync test
fixtures, so it is plain blocking code; the gateway's own trio client is for the serving path.
"""

from __future__ import annotations

import http.client
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec


class RpcError(RuntimeError):
    def __init__(self, method: str, error: object) -> None:
        message = error.get("message", error) if isinstance(error, dict) else error
        super().__init__(f"{method}: {message}")
        self.method = method
        self.error = error


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.decode

Call = tuple[str, Sequence[Any]]


class DevnetRpc:
    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("the devnet is reached over plain http://host:port")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._path = parts.path or "/"
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _post(self, body: bytes) -> Any:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            self._conn.request("POST", self._path, body, {"Content-Type": "application/json"})
            response = self._conn.getresponse()
            payload = response.read()
        except OSError:
            self.close()  # never resent: the call may have been a transaction
            raise
        except http.client.HTTPException as exc:
            # A reply cut short (anvil dying mid-answer): a connection failure like any other.
            self.close()
            raise ConnectionError(f"devnet node: {exc!r}") from exc
        if response.status != 200:
            raise RuntimeError(f"devnet node answered HTTP {response.status}")
        return _decode(payload)

    def call(self, method: str, *params: object) -> Any:
        reply = self._post(_encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        if "error" in reply:
            raise RpcError(method, reply["error"])
        return reply["result"]

    def batch(self, calls: Sequence[Call]) -> list[Any]:
        """Results in call order; the first error raises (naming its method)."""
        if not calls:
            return []
        body = _encode(
            [
                {"jsonrpc": "2.0", "id": i, "method": method, "params": list(params)}
                for i, (method, params) in enumerate(calls)
            ]
        )
        replies = self._post(body)
        if not isinstance(replies, list) or len(replies) != len(calls):
            raise RuntimeError("devnet node answered a batch with the wrong number of replies")
        by_id = {reply.get("id"): reply for reply in replies}
        results = []
        for i, (method, _) in enumerate(calls):
            reply = by_id.get(i)
            if reply is None:
                raise RuntimeError(f"devnet node left {method} (batch item {i}) unanswered")
            if "error" in reply:
                raise RpcError(method, reply["error"])
            results.append(reply["result"])
        return results

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> DevnetRpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
