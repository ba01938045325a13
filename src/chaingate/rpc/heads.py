"""Judging upstream heads: which head is agreed, who lags, who is an outlier.  Sans-IO.

A head is a claim an upstream makes about the chain.  One liar (or one broken node) must not
decide what the pool believes, so every probe round goes through ``HeadJudge.judge``:

* **sources** are the heads of the upstreams that answered this round, plus a witness's head
  (the chain follower, when it is live);
* the **agreed head** — the one finality is decided from — is the highest head at least two
  sources have reached (the second highest); with one source only, that source's head as long
  as it stays within a *plausible lead* of the anchor below, else the previous agreed head;
* the **anchor** is the highest agreed head and when it was reached; the chain cannot run
  ahead of it by more than ``slack`` blocks plus one block per ``block_time`` since then, so a
  head beyond that is an **outlier** — a fault, when at least one other upstream answered
  (one upstream alone is never accused: there is nobody to compare it with, and a devnet may
  mine a thousand blocks at once; its excess is simply not believed);
* a lone source is judged from the last anchor two sources **confirmed**, and the clock's
  allowance restarts whenever they confirm it again: a liar alone (the honest node's probes
  failing) cannot raise its own ceiling round by round, and a stalled chain makes no far head
  plausible;
* **lag** is measured from the anchor (or from the best plausible head, if lower — a devnet
  revert), so an honest node is never ranked lagging behind a liar.

Heads are parsed with a bound: a quantity above 64 bits is malformed, never a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

# A head quantity has at most 64 bits: 16 hex digits.
MAX_HEAD_HEX_DIGITS = 16
MAX_HEAD = (1 << 64) - 1

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class _HeadReply(msgspec.Struct):
    result: Any = None


_head_decoder = msgspec.json.Decoder(_HeadReply)


def parse_quantity(value: object) -> int | None:
    """A hex quantity (``"0x1b4"``) of at most 64 bits, else None."""
    if not isinstance(value, str) or not value.startswith("0x"):
        return None
    digits = value[2:]
    if not 0 < len(digits) <= MAX_HEAD_HEX_DIGITS or not _HEX_DIGITS.issuperset(digits):
        return None
    return int(digits, 16)


def parse_evm_head(body: bytes) -> int | None:
    """Head number from an ``eth_blockNumber`` response body (probe answers), bounded."""
    try:
        return parse_quantity(_head_decoder.decode(body).result)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def parse_solana_head(body: bytes) -> int | None:
    """Slot from a ``getSlot`` response body (probe answers), bounded to 64 bits."""
    try:
        slot = _head_decoder.decode(body).result
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if type(slot) is not int or not 0 <= slot <= MAX_HEAD:
        return None
    return slot


class _Numbered(Protocol):
    @property
    def number(self) -> int: ...


class Witness(Protocol):
    """Something that follows the chain on its own (``chaingate.chain.Follower``)."""

    @property
    def head(self) -> _Numbered | None: ...

    @property
    def live(self) -> bool: ...


def witness_head(witness: Witness | None) -> int | None:
    """The witness's head when it is live and sane; never raises."""
    if witness is None:
        return None
    try:
        if not witness.live:
            return None
        header = witness.head
        number = header.number if header is not None else None
    except Exception:  # a witness must never break the prober
        return None
    if type(number) is not int or not 0 <= number <= MAX_HEAD:
        return None
    return number


class Verdict:
    """The outcome of one round: outliers (by name) and the lag of everyone else."""

    __slots__ = ("lags", "outliers")

    def __init__(self, outliers: set[str], lags: dict[str, int]) -> None:
        self.outliers = outliers
        self.lags = lags


class HeadJudge:
    def __init__(self, block_time: float, slack: int) -> None:
        self._block_time = max(block_time, 0.001)
        self._slack = max(slack, 0)
        self.head: int | None = None  # the agreed head: finality is decided from it
        self._anchor: int | None = None
        self._anchor_at = 0.0
        # An anchor set by a lone source is provisional: the first round with two sources
        # replaces it (so a liar alone at start-up does not stay the reference).
        self._anchor_confirmed = False
        # The last anchor two sources agreed on, and when they last agreed on it or more: a
        # lone source is judged from this one, so it cannot raise its own ceiling round by
        # round (a liar alone while the honest node's probes fail), nor does a stalled chain
        # make far heads plausible.
        self._confirmed: tuple[int, float] | None = None

    def ceiling(self, now: float) -> int | None:
        """The highest head that is plausible now, or None before any head was agreed."""
        if self._anchor is None:
            return None
        return self._anchor + self._slack + int((now - self._anchor_at) / self._block_time)

    def _lone_ceiling(self, now: float) -> int | None:
        if self._confirmed is None:
            return self.ceiling(now)  # never two sources yet (one upstream, no witness)
        anchor, at = self._confirmed
        return anchor + self._slack + int((now - at) / self._block_time)

    def judge(self, heads: Mapping[str, int], reference: int | None, now: float) -> Verdict:
        """One probe round: ``heads`` of the upstreams that answered, the witness's head."""
        sources = sorted([*heads.values(), *([] if reference is None else [reference])])
        if len(sources) >= 2:
            agreed = sources[-2]
            if self._anchor is None or not self._anchor_confirmed or agreed > self._anchor:
                self._raise_anchor(agreed, now, confirmed=True)
            elif agreed == self._anchor:
                self._anchor_at = now  # still there: the clock's allowance starts again
            if self._confirmed is None or agreed >= self._confirmed[0]:
                self._confirmed = (agreed, now)
            self.head = agreed
        elif len(sources) == 1:
            only = sources[0]
            ceiling = self._lone_ceiling(now)
            if ceiling is None or only <= ceiling:
                if self._anchor is None or only > self._anchor:
                    self._raise_anchor(only, now, confirmed=False)
                self.head = only
            # else: an implausible jump nobody confirms; keep the previous agreed head.
        ceiling = self.ceiling(now)
        outliers: set[str] = set()
        if ceiling is not None and len(heads) >= 2:
            outliers = {name for name, head in heads.items() if head > ceiling}
        plausible = [head for name, head in heads.items() if name not in outliers]
        if not plausible or self._anchor is None:
            return Verdict(outliers, {name: 0 for name in heads if name not in outliers})
        best = min(self._anchor, max(plausible))
        lags = {name: max(0, best - head) for name, head in heads.items() if name not in outliers}
        return Verdict(outliers, lags)

    def note(self, head: int, now: float) -> None:
        """A head seen in an answer between probes: believed only as far as time allows."""
        if self._anchor is None or self.head is None or head <= self.head:
            return
        # No slack here: one answer may only move finality where the clock says the chain
        # could have got since the anchor.
        limit = self._anchor + int((now - self._anchor_at) / self._block_time)
        if head <= limit:
            self.head = head

    def _raise_anchor(self, head: int, now: float, *, confirmed: bool) -> None:
        self._anchor = head
        self._anchor_at = now
        self._anchor_confirmed = confirmed
