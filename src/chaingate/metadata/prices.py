"""USD prices from on-chain Chainlink-style feeds (``AggregatorV3Interface``), never invented.

A token has a price only when a feed is configured for it (or, on a devnet, named by the
manifest).  ``read_feed`` (sans-IO) accepts an answer only when ``latestRoundData`` and
``decimals`` answered, the answer is positive, the round is complete
(``answeredInRound >= roundId``, ``updatedAt > 0``) and ``updatedAt`` is at most the feed's
``max_age`` old by the gateway's clock — a node that lags, or a feed that stopped, gives no
price rather than an old one.  ``PriceBook`` reads the feeds it is asked about in one batch
and keeps each reading ``ttl`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import trio

from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.metadata.amounts import scaled
from chaingate.metadata.model import PriceQuote
from chaingate.metadata.multicall import Call, Multicall, Result
from chaingate.metadata.tokens import decode_uint
from chaingate.rpc.errors import UpstreamError

LATEST_ROUND_DATA = abi.encode_call("latestRoundData()")
DECIMALS = abi.encode_call("decimals()")
ROUND_TYPES = ["uint80", "int256", "uint256", "uint256", "uint80"]
# Clocks differ a little; an updatedAt further in the future than this is a broken feed.
FUTURE_SKEW = 300


def feed_calls(feed: str) -> list[Call]:
    return [Call(feed, LATEST_ROUND_DATA), Call(feed, DECIMALS)]


def read_feed(feed: str, results: Sequence[Result], *, now: float, max_age: float) -> PriceQuote:
    """The price a feed's two results give, or a quote with ``error`` saying why not."""
    round_data, decimals_result = results

    def refused(why: str, updated_at: int | None = None) -> PriceQuote:
        return PriceQuote(price=None, feed=feed, updated_at=updated_at, error=why)

    if not round_data.ok or not decimals_result.ok:
        return refused("feed call reverted")
    try:
        round_id, answer, _started, updated_at, answered_in = abi.decode(
            ROUND_TYPES, round_data.data
        )
    except ValueError:
        return refused("feed answer is not latestRoundData")
    decimals = decode_uint(decimals_result.data, bits=8)
    if decimals is None:
        return refused("feed decimals is not a uint8")
    if answer <= 0:
        return refused("feed answer is not positive", updated_at)
    if updated_at == 0 or answered_in < round_id:
        return refused("feed round is incomplete", updated_at)
    if updated_at > now + FUTURE_SKEW:
        return refused("feed updatedAt is in the future", updated_at)
    if max_age > 0 and now - updated_at > max_age:
        return refused(f"feed answer older than {max_age:g} s", updated_at)
    return PriceQuote(price=scaled(answer, decimals), feed=feed, updated_at=updated_at)


class PriceBook:
    """Feed readings by token (None: the native currency), cached ``ttl`` seconds."""

    def __init__(
        self,
        multicall: Multicall,
        feeds: Mapping[str, str],
        native_feed: str | None,
        *,
        max_age: float,
        feed_max_age: Mapping[str, float],
        ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.multicall = multicall
        self._feeds = {token.lower(): checksum_address(feed) for token, feed in feeds.items()}
        self._native = checksum_address(native_feed) if native_feed else None
        self._max_age = max_age
        self._feed_max_age = {feed.lower(): age for feed, age in feed_max_age.items()}
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[str, tuple[float, PriceQuote]] = {}  # feed (lower) -> expiry, quote
        self._lock = trio.Lock()

    def feed_of(self, token: str | None) -> str | None:
        return self._native if token is None else self._feeds.get(token.lower())

    async def quotes(self, tokens: Sequence[str | None]) -> dict[str | None, PriceQuote]:
        """A quote per token asked about (keys as given); one batch for the feeds not cached."""
        feeds = {token: self.feed_of(token) for token in tokens}
        async with self._lock:  # concurrent askers share one read instead of racing
            now = self._clock()
            due = sorted(
                {
                    feed
                    for feed in feeds.values()
                    if feed is not None and self._cache.get(feed.lower(), (0.0, None))[0] <= now
                }
            )
            if due:
                await self._read(due, now)
        answer: dict[str | None, PriceQuote] = {}
        for token, feed in feeds.items():
            if feed is None:
                answer[token] = PriceQuote(price=None, feed=None, error="no price feed configured")
            else:
                answer[token] = self._cache[feed.lower()][1]
        return answer

    async def _read(self, feeds: Sequence[str], now: float) -> None:
        calls = [call for feed in feeds for call in feed_calls(feed)]
        try:
            results = await self.multicall.run(calls)
        except (UpstreamError, RpcCallError) as exc:
            # Not cached: the next asker tries again.
            for feed in feeds:
                quote = PriceQuote(price=None, feed=feed, error=f"feed unreadable: {exc}")
                self._cache[feed.lower()] = (now, quote)
            return
        for i, feed in enumerate(feeds):
            max_age = self._feed_max_age.get(feed.lower(), self._max_age)
            quote = read_feed(feed, results[2 * i : 2 * i + 2], now=now, max_age=max_age)
            self._cache[feed.lower()] = (now + self._ttl, quote)
