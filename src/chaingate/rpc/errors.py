"""Why an upstream call failed, and what the client is told about it."""

from __future__ import annotations

import msgspec

CONNECT = "connect"  # no connection could be made: nothing was sent
CONNECTION_LOST = "connection_lost"  # the connection broke while the call was queued or in flight
TIMEOUT = "timeout"  # no answer within the attempt's deadline
HTTP_STATUS = "http_status"  # the node answered with an HTTP error status
THROTTLED = "throttled"  # the node answered 429
BAD_RESPONSE = "bad_response"  # the answer was not valid HTTP or JSON-RPC
UNAVAILABLE = "unavailable"  # no upstream was left to try before the deadline
HEAD_OUTLIER = "head_outlier"  # the upstream's head is beyond any plausible lead (probes)
# The node refused the call unprocessed (HTTP/2: REFUSED_STREAM, or a stream above a GOAWAY's
# last-stream-id): sent again, even a write, on another stream (pool.py, Upstream.send).
REFUSED = "refused"
# Nobody wanted the answer any more when it came (a batch over its answer bound gave up the
# read): its body was dropped unread.  Not a failure of the node: never retried, never counted.
ABANDONED = "abandoned"

INTERNAL_ERROR = -32603


class UpstreamError(Exception):
    """An upstream call failed.  ``sent`` is False only when no byte of it reached the wire."""

    def __init__(
        self, kind: str, message: str, *, sent: bool, upstream: str = "", status: int = 0
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.sent = sent
        self.upstream = upstream
        self.status = status

    def __repr__(self) -> str:
        return f"UpstreamError({self.kind!r}, {self.message!r}, sent={self.sent})"


def error_object(code: int, message: str, reason: str | None = None) -> bytes:
    """Raw JSON of a JSON-RPC error object (``data.reason`` names the failure class)."""
    error: dict[str, object] = {"code": code, "message": message}
    if reason is not None:
        error["data"] = {"reason": reason}
    return msgspec.json.encode(error)


def client_error(exc: UpstreamError, *, write: bool) -> bytes:
    """The JSON-RPC error object a client receives for a failed upstream call."""
    if write and exc.sent:
        return error_object(
            INTERNAL_ERROR,
            "upstream failed after the call was sent; it may have been executed, so check its "
            "effect (for a transaction: look it up by hash) before sending it again",
            "outcome_unknown",
        )
    return error_object(INTERNAL_ERROR, f"upstream unavailable: {exc.message}", exc.kind)
