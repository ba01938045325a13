"""What became of one request: the categories a report keeps apart (sans-IO).

A refusal or a rate limit is the target saying no, not the target being slow: it is counted
under its own name and its latency is kept out of the percentiles, which describe answers.
"""

from __future__ import annotations

from typing import Final

OK: Final = "ok"
ERROR: Final = "error"  # transport failure, 5xx, or a JSON-RPC error the scenario did not expect
REFUSED: Final = "refused"  # 401/403, or a JSON-RPC refusal (-32002: key, scope, allowlist)
RATE_LIMITED: Final = "rate_limited"  # 429, or a JSON-RPC limit (-32005)
WRONG: Final = "wrong"  # an answer that is not the right one: id, shape, or unlike the others
DROPPED: Final = "dropped"  # a message that should have arrived and did not (subscriptions)
KINDS: Final = (OK, ERROR, REFUSED, RATE_LIMITED, WRONG, DROPPED)
FAILURES: Final = KINDS[1:]

# JSON-RPC error codes providers use for "no" rather than "failed".
_REFUSAL_CODES = frozenset({-32002, -32001, 401, 403})
_LIMIT_CODES = frozenset({-32005, 429, -32029})


def of_status(status: int) -> str:
    """The outcome an HTTP status alone decides (OK for 2xx: the body decides the rest)."""
    if 200 <= status < 300:
        return OK
    if status in (401, 403):
        return REFUSED
    if status == 429:
        return RATE_LIMITED
    return ERROR


def of_rpc_error(code: object) -> str:
    if code in _REFUSAL_CODES:
        return REFUSED
    if code in _LIMIT_CODES:
        return RATE_LIMITED
    return ERROR


class Failure(Exception):
    """A request that did not get the answer it should: carries its outcome to the recorder
    (through locust's request event, whose ``exception`` it is)."""

    outcome: str = ERROR

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
