"""Clients' ``eth_getLogs`` block ranges: a limit that states itself, and splitting.

Providers differ wildly here (Alchemy: 2K blocks or 10K logs, Infura: 10K logs, QuickNode:
10K blocks, and each says so differently), so a client of chaingate gets one rule per network
and plan, told in the error itself:

* a range wider than the limit (``logs.max_block_range``, lowered by a plan's
  ``logs_max_block_range``) is refused with -32005 (EIP-1474 "limit exceeded"), a message
  that states the limit and ``data`` = {reason, limit, requested, setting, suggested range};
* a range within the limit but wider than ``logs.upstream_block_range`` is split into upstream
  calls of at most that span (several in flight), sized by the follower's ``SpanSizer``
  (halved while a node refuses a part, grown back after), and the parts' logs merged in block
  order — the client sees one answer, byte for byte the nodes' log objects;
* anything else — a ``blockHash`` filter, a range that fits one call, a filter this module
  cannot read — is forwarded untouched, so the node resolves its own tags and gives its own
  errors.

The range rule itself (``logs_limit``, ``logs_verdict``) is the fast lane's, which sends a
range that fits one call without asking Python and hands this module only what it must refuse,
split or read itself (``Route.logs_fit``); this module asks the same rule.

Tags in a split range are resolved against the head of an upstream (one extra call) rather
than the agreed head, which may trail a block.  An empty result is ``[]``, never an error.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import msgspec
import trio

from chaingate import twins
from chaingate.config import LogRangeSettings
from chaingate.framing_constants import LIMIT_EXCEEDED
from chaingate.rpc.spansizer import SpanSizer
from chaingate.twintypes.fastlane import FastlaneModule

# (result, error): exactly one is raw JSON bytes (as in service.py).
Outcome = tuple[bytes | None, bytes | None]
# Sends one call upstream: (method, raw params) -> outcome.
Send = Callable[[str, bytes], Awaitable[Outcome]]

RANGE_TOO_LARGE = "block_range_too_large"
_HEAD_TAGS = frozenset({"latest", "pending", "safe", "finalized"})
# A node's refusal of a part that a smaller part may pass (its own range or result caps).
_REFUSAL = re.compile(
    r"block range|range limit|limited to|more than \d+ (?:results|logs)|response size|exceed"
    r"|too (?:large|many|big|wide)|timeout|timed out",
    re.I,
)

_filters = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_text = msgspec.json.Decoder(str)


class _Error(msgspec.Struct):
    code: int = 0
    message: str = ""
    data: object = None


_error_decoder = msgspec.json.Decoder(_Error)


class Bound(NamedTuple):
    """One end of a range: a block number, or a tag (latest, earliest, ...)."""

    number: int | None
    tag: str | None


class Limit(NamedTuple):
    blocks: int  # 0: none
    setting: str  # where it comes from, as the client is told


class Split(NamedTuple):
    """A query to split: its filter and its two ends (tags not yet resolved)."""

    filter: dict[str, msgspec.Raw]
    first: Bound
    last: Bound


def _bound(raw: msgspec.Raw | None) -> Bound | None:
    if raw is None:
        return Bound(None, "latest")  # absent: the head, as nodes read it
    try:
        value = _text.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if value in _HEAD_TAGS or value == "earliest":
        return Bound(None, value)
    if value[:2] in ("0x", "0X") and 2 < len(value) <= 18:
        try:
            return Bound(int(value[2:], 16), None)
        except ValueError:
            return None
    return None


def _resolve(bound: Bound, head: int | None) -> int | None:
    if bound.number is not None:
        return bound.number
    if bound.tag == "earliest":
        return 0
    return head


class LogRanges:
    """The eth_getLogs policy of one network (pure decisions, plus ``fetch`` for splits)."""

    def __init__(self, settings: LogRangeSettings, rules: FastlaneModule | None = None) -> None:
        # The lane's module, whose range rule this follows (any twin: they agree).
        self._rules = rules if rules is not None else twins.pure().fastlane
        self.max_block_range = max(0, settings.max_block_range)
        self.upstream_block_range = max(0, settings.upstream_block_range)
        self.concurrency = max(1, settings.split_concurrency)
        self.split_requests = 0  # client calls answered by splitting (for /metrics)
        self.split_calls = 0  # upstream calls those took
        self.refused = 0  # client calls refused over the limit

    def limit(self, plan_blocks: int) -> Limit:
        """The widest range for a key whose plan allows ``plan_blocks`` (0: no plan limit):
        the smaller of network and plan values."""
        blocks = self._rules.logs_limit(self.max_block_range, plan_blocks)
        if blocks != self.max_block_range:
            return Limit(blocks, "logs_max_block_range (plan)")
        return Limit(blocks, "logs.max_block_range")

    def plan(self, params: bytes | None, head: int | None, limit: Limit) -> Split | bytes | None:
        """What to do with one eth_getLogs: None (forward untouched), an error object
        (refused over the limit), or a Split (too wide for one upstream call)."""
        if params is None:
            return None
        try:
            filters = _filters.decode(params)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if len(filters) != 1 or "blockHash" in filters[0]:
            return None
        query = filters[0]
        first = _bound(query.get("fromBlock"))
        last = _bound(query.get("toBlock"))
        if first is None or last is None:
            return None
        low, high = _resolve(first, head), _resolve(last, head)
        if low is None or high is None:
            # A head tag and no head known yet: decided once fetch has asked a node.
            return Split(query, first, last) if self.upstream_block_range else None
        rules = self._rules
        verdict = rules.logs_verdict(low, high, limit.blocks, self.upstream_block_range)
        if verdict == rules.LOGS_REFUSE:
            self.refused += 1
            return too_wide(low, high, limit)
        if verdict == rules.LOGS_FORWARD:
            return None  # an inverted range too: the node says what it thinks of it
        return Split(query, first, last)

    async def fetch(
        self, split: Split, send: Send, limit: Limit, max_bytes: int, too_large: bytes
    ) -> Outcome:
        """Answer a split query: resolve its tags against a node's head, send its parts
        (none past that head: those blocks have no logs yet), merge their logs."""
        head, error = await _head_of(send, "latest")
        if head is None:
            return None, error
        low, high = await _number(split.first, head, send), await _number(split.last, head, send)
        if isinstance(low, bytes):
            return None, low
        if isinstance(high, bytes):
            return None, high
        if high < low:
            return await send("eth_getLogs", msgspec.json.encode([split.filter]))
        rules = self._rules
        if rules.logs_verdict(low, high, limit.blocks, 0) == rules.LOGS_REFUSE:
            self.refused += 1
            return None, too_wide(low, high, limit)
        high = min(high, head)
        if high < low:
            return b"[]", None
        if high - low + 1 <= self.upstream_block_range:
            return await send("eth_getLogs", _part(split.filter, low, high))
        self.split_requests += 1
        return await self._parts(split.filter, low, high, send, max_bytes, too_large)

    async def _parts(
        self,
        query: dict[str, msgspec.Raw],
        low: int,
        high: int,
        send: Send,
        max_bytes: int,
        too_large: bytes,
    ) -> Outcome:
        sizer = SpanSizer(self.upstream_block_range)
        retry: deque[tuple[int, int]] = deque()  # refused parts, sent again smaller, first
        found: dict[int, bytes] = {}  # first block of a part -> its logs (inner JSON)
        cursor = low
        total = 2
        failure: bytes | None = None

        def take() -> tuple[int, int] | None:
            nonlocal cursor
            if retry:
                first, last = retry.popleft()
                end = min(last, first + sizer.span - 1)
                if end < last:
                    retry.appendleft((end + 1, last))
                return first, end
            if cursor > high:
                return None
            first, cursor = cursor, min(high, cursor + sizer.span - 1) + 1
            return first, cursor - 1

        async def worker(scope: trio.CancelScope) -> None:
            nonlocal total, failure
            while (part := take()) is not None:
                first, last = part
                self.split_calls += 1
                result, error = await send("eth_getLogs", _part(query, first, last))
                if result is not None:
                    logs = _inner(result)
                    if logs is None:
                        error = _not_logs()
                    else:
                        found[first] = logs
                        total += len(logs) + 1
                        sizer.grow(last - first + 1)
                        if total > max_bytes:
                            failure = too_large
                            scope.cancel()
                            return
                        continue
                assert error is not None
                if last > first and _refused_for_size(error):
                    sizer.shrink(last - first + 1)
                    retry.appendleft((first, last))
                    continue
                failure = error
                scope.cancel()
                return

        async with trio.open_nursery() as nursery:
            for _ in range(self.concurrency):
                nursery.start_soon(worker, nursery.cancel_scope)
        if failure is not None:
            return None, failure
        merged = b",".join(found[first] for first in sorted(found) if found[first])
        return b"[" + merged + b"]", None


def too_wide(low: int, high: int, limit: Limit) -> bytes:
    """The error of a range over the limit: it states the limit and a range that fits."""
    span = high - low + 1
    fits = {"fromBlock": hex(low), "toBlock": hex(low + limit.blocks - 1)}
    message = (
        f"eth_getLogs block range too large: {span} blocks asked ({hex(low)} to {hex(high)}), "
        f"the limit is {limit.blocks} blocks ({limit.setting}); ask for at most "
        f"{limit.blocks} blocks at a time, for example [{fits['fromBlock']}, {fits['toBlock']}]"
    )
    data = {
        "reason": RANGE_TOO_LARGE,
        "limit": limit.blocks,
        "requested": span,
        "setting": limit.setting,
        "suggested": fits,
    }
    return msgspec.json.encode({"code": LIMIT_EXCEEDED, "message": message, "data": data})


def _part(query: dict[str, msgspec.Raw], first: int, last: int) -> bytes:
    part = dict(query)
    part["fromBlock"] = msgspec.Raw(b'"%s"' % hex(first).encode())
    part["toBlock"] = msgspec.Raw(b'"%s"' % hex(last).encode())
    return msgspec.json.encode([part])


def _inner(result: bytes) -> bytes | None:
    """The elements of a JSON array result, without its brackets (b"" when empty)."""
    body = result.strip()
    if body[:1] != b"[" or body[-1:] != b"]":
        return None
    return body[1:-1].strip()


def _not_logs() -> bytes:
    return msgspec.json.encode(
        {
            "code": -32603,
            "message": "upstream answered eth_getLogs with something other than a list of logs",
            "data": {"reason": "bad_response"},
        }
    )


def _refused_for_size(error: bytes) -> bool:
    try:
        decoded = _error_decoder.decode(error)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    reason = decoded.data.get("reason") if isinstance(decoded.data, dict) else None
    if reason in ("timeout", "bad_response"):
        return True
    return _REFUSAL.search(decoded.message) is not None


async def _number(bound: Bound, head: int, send: Send) -> int | bytes:
    """The block number one end of a range names (an error object if no node says)."""
    if bound.number is not None:
        return bound.number
    if bound.tag == "earliest":
        return 0
    if bound.tag in ("safe", "finalized"):
        number, error = await _head_of(send, bound.tag)
        return number if number is not None else error or _not_head(bound.tag)
    return head


async def _head_of(send: Send, tag: str) -> tuple[int | None, bytes | None]:
    """The block number a head tag names now, asked of an upstream."""
    if tag in ("latest", "pending"):
        result, error = await send("eth_blockNumber", b"[]")
    else:
        result, error = await send("eth_getBlockByNumber", b'["%s",false]' % tag.encode())
    if error is not None:
        return None, error
    value: object = None
    try:
        value = msgspec.json.decode(result or b"null")
    except msgspec.DecodeError:
        pass
    if isinstance(value, dict):
        value = value.get("number")
    if isinstance(value, str) and value.startswith("0x"):
        try:
            return int(value, 16), None
        except ValueError:
            pass
    return None, _not_head(tag)


def _not_head(tag: str) -> bytes:
    return msgspec.json.encode(
        {
            "code": -32603,
            "message": f"cannot resolve block tag {tag!r} for eth_getLogs: no upstream named it",
            "data": {"reason": "bad_response"},
        }
    )
