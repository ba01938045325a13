"""The indexers' families in ``/metrics`` (counted by each Indexer in plain attributes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from chaingate.config.network import Network
from chaingate.data.indexer import Indexer
from chaingate.obs.metrics import Registry, Sample


def register_index_metrics(registry: Registry, indexers: Mapping[Network, Indexer]) -> None:
    def block() -> Iterable[Sample]:
        for ix in indexers.values():
            number = ix.cursor.number if ix.cursor is not None else -1
            yield {"chain": ix.chain, "network": ix.network}, number

    def events() -> Iterable[Sample]:
        for ix in indexers.values():
            base = {"chain": ix.chain, "network": ix.network}
            for kind, n in sorted(ix.stats.items()):
                yield {**base, "kind": kind}, n

    registry.family(
        "chaingate_indexer_block",
        "gauge",
        "Number of the last block whose token transfers are in the index (-1: none yet).",
        block,
    )
    registry.family(
        "chaingate_indexer_events_total",
        "counter",
        "Indexer activity: blocks, logs, transfers indexed; logs ignored (transfer-like, not "
        "transfers); blocks reverted, replayed, fetched; rewinds, commits, errors.",
        events,
    )
