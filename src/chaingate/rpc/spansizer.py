"""How many blocks to ask a node for in one ``eth_getLogs`` (sans-IO)."""

from __future__ import annotations

import math


class SpanSizer:
    """The block span to ask a node for in one eth_getLogs: halved when the node refuses a
    span, grown back by a quarter after a success at the full span.  Sans-IO: shared by the
    follower's fetcher (chain/ranges.py) and the proxy's splitting of clients' ranges
    (rpc/logranges.py)."""

    def __init__(self, max_range: int) -> None:
        self.max_range = max(1, max_range)
        self.span = self.max_range
        self.splits = 0

    def shrink(self, span: int) -> None:
        self.span = max(1, span // 2)
        self.splits += 1

    def grow(self, span: int) -> None:
        if span == self.span:
            self.span = min(self.max_range, math.ceil(span * 1.25))
