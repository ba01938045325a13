"""The devnet's price keeper: each feed's price pushed again when ``chaingate dev`` starts.

A real Chainlink feed gets a new round at least every heartbeat, and chaingate refuses a price
older than ``metadata.max_feed_age`` rather than show a stale one.  The devnet's feeds were last
updated when its chain was made — maybe days ago, in a saved chain or the bootstrap cache — so
without a keeper every USD value on the devnet would honestly be null.  The keeper sends one
``updateAnswer`` with the demo's price, from the deployer (the feeds' owner), to each feed
whose last round is older than ``HEARTBEAT`` — so a quick restart mines nothing.
"""

from __future__ import annotations

import time

from chaingate.config.manifest import Manifest
from chaingate.devnet.demo import ETH_USD_NOW, NATIVE_PRICE_FEED, TOKENS, usd_answer
from chaingate.devnet.deploy import Tx, TxRunner
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi

# A feed updated less than this long ago is left alone (Chainlink's common heartbeat).
HEARTBEAT = 3600.0


def price_updates(manifest: Manifest) -> list[Tx]:
    prices = {NATIVE_PRICE_FEED: ETH_USD_NOW}
    for token in TOKENS:
        prices[f"feed_{token.symbol.lower()}_usd"] = token.usd_price
    return [
        Tx(
            f"update {feed}",
            manifest.deployer,
            manifest.address(feed),
            abi.encode_call("updateAnswer(int256)", usd_answer(price)),
            gas=150_000,
        )
        for feed, price in prices.items()
        if feed in manifest.contracts
    ]


def refresh_price_feeds(url: str, manifest: Manifest, *, now: float | None = None) -> int:
    """Push a new round to every feed of the manifest whose last one is older than
    ``HEARTBEAT``; the number of feeds updated."""
    now = time.time() if now is None else now
    with DevnetRpc(url) as rpc:
        txs = [tx for tx in price_updates(manifest) if _age(rpc, tx.to or "", now) > HEARTBEAT]
        TxRunner(rpc).run(txs)
    return len(txs)


def _age(rpc: DevnetRpc, feed: str, now: float) -> float:
    """Seconds since the feed's latest round (latestRoundData's updatedAt)."""
    data = "0x" + abi.encode_call("latestRoundData()").hex()
    raw = rpc.call("eth_call", {"to": feed, "data": data}, "latest")
    _, _, _, updated, _ = abi.decode(
        ["uint80", "int256", "uint256", "uint256", "uint80"], bytes.fromhex(raw[2:])
    )
    return now - int(updated)
