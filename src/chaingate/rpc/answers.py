"""Bounds on answer bytes: per request (``rpc.max_answer_bytes``) and per process.  Sans-IO.

A batch's answer is assembled from replies that arrive group by group.  ``Assembly`` counts
one request's reply bytes against the per-request bound and, for batches, against the
process-wide ``AnswerBudget`` of bytes being assembled (``rpc.max_assembling_bytes``; the
fast lane's, ``fastlane.AnswerBudget``, shared with it).  A
reply that does not fit is not built: its call gets a JSON-RPC error instead (see
docs/decisions/hardening.md, "The answer bound").  Once a request is over its bound, reads still in
flight are abandoned — they could only be refused — through the cancel scopes registered here.

The edge reads ``AnswerBudget.held`` / ``exhausted`` (all services share one budget) to refuse
new work with 503 before memory grows.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec
import trio

from chaingate.framing_constants import LIMIT_EXCEEDED
from chaingate.twintypes.fastlane import AnswerBudget

# Bytes a reply adds beyond its id and payload: '{"jsonrpc":"2.0","id":' ',"result":' '}' and
# the comma that separates it from the next reply of a batch.
REPLY_OVERHEAD = 34


# The ``reason`` of a -32005 answer refused by a bound: its own, or the process's budget.
ANSWER_TOO_LARGE = "answer_too_large"
OVERLOADED = "overloaded"
_MAY_HAVE_RUN = (
    "; the call reached the node and may have been executed, so check its effect (for a "
    "transaction: look it up by hash) before sending it again"
)


def limit_error(message: str, reason: str, limit: int | None = None) -> bytes:
    """A -32005 error object: ``message``, and ``reason`` (and ``limit``) in its data."""
    data: dict[str, object] = {"reason": reason}
    if limit is not None:
        data["limit"] = limit
    return msgspec.json.encode({"code": LIMIT_EXCEEDED, "message": message, "data": data})


class AnswerRefusals(NamedTuple):
    """The error objects of a call refused by a bound, built once per network: over the
    request's bound or the process's budget, for a read and for a write (which may have run)."""

    too_large: bytes
    too_large_write: bytes
    busy: bytes
    busy_write: bytes


def answer_refusals(max_answer_bytes: int) -> AnswerRefusals:
    too_large = (
        f"answer too large: the replies to this request passed the limit of "
        f"{max_answer_bytes} bytes (rpc.max_answer_bytes); send fewer calls per batch "
        "or narrow the query"
    )
    busy = "server busy: too many answer bytes are being assembled; retry shortly"
    limit = max_answer_bytes
    return AnswerRefusals(
        limit_error(too_large, ANSWER_TOO_LARGE, limit),
        limit_error(too_large + _MAY_HAVE_RUN, ANSWER_TOO_LARGE, limit),
        limit_error(busy, OVERLOADED),
        limit_error(busy + _MAY_HAVE_RUN, OVERLOADED),
    )


# Outcomes of ``Assembly.admit``.
FITS, TOO_LARGE, BUSY = 0, 1, 2


class Assembly:
    """One batch's answer while it is being assembled."""

    __slots__ = ("_budget", "_scopes", "coming", "limit", "over", "taken", "used")

    def __init__(self, limit: int, budget: AnswerBudget) -> None:
        self.limit = limit
        self.used = 0  # reply bytes placed in the answer so far
        self.taken = 0  # of which taken from the process budget
        self.coming = 0  # bytes of group bodies on their way (``reserve``)
        self.over = False  # the answer passed its bound: every later reply is refused
        self._budget = budget
        self._scopes: list[trio.CancelScope] = []

    def admit(self, size: int) -> int:
        """May a reply of ``size`` bytes join the answer?  FITS, TOO_LARGE or BUSY."""
        if self.over or self.used + size > self.limit:
            self.stop()
            return TOO_LARGE
        if not self._budget.take(size):
            return BUSY
        self.used += size
        self.taken += size
        return FITS

    def reserve(self, length: int) -> bool:
        """A group's answer of ``length`` bytes (-1: not declared) starts arriving: may it
        still join?  Not when the answer is over its bound, nor when — something already in
        it or on its way — it could not take the whole body: the answer stops there (its
        reads are abandoned) and the body is dropped unread.  So memory holds the bound and
        one group's body, not every group the node sends.  Give the bytes back with
        ``unreserve`` once the group is placed."""
        if self.over:
            return False
        if length > 0:
            if (self.used or self.coming) and self.used + self.coming + length > self.limit:
                self.stop()
                return False
            self.coming += length
        return True

    def unreserve(self, length: int) -> None:
        self.coming -= length

    def watch(self, scope: trio.CancelScope) -> None:
        """Abandon the work under ``scope`` (reads in flight) once the answer is over."""
        if self.over:
            scope.cancel()
        self._scopes.append(scope)

    def stop(self) -> None:
        self.over = True
        for scope in self._scopes:
            scope.cancel()
        self._scopes.clear()

    def release(self) -> None:
        """The answer is handed on (or dropped): its bytes leave the process budget."""
        self._budget.give_back(self.taken)
        self.taken = 0
