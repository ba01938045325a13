"""``chaingate_leader{role,chain,network}``: 1 where this process leads the role, else 0."""

from __future__ import annotations

from chaingate.cluster.leases import Leadership
from chaingate.obs.metrics import Registry, Sample


def register_leader_metrics(registry: Registry, leadership: Leadership) -> None:
    def samples() -> list[Sample]:
        return [
            ({"role": key.role, "chain": key.chain, "network": key.network}, float(held))
            for key, held in leadership.roles()
        ]

    registry.family(
        "chaingate_leader",
        "gauge",
        "1 where this process leads the single-writer role of the chain/network, else 0.",
        samples,
    )
