"""``chaingate_leader{role,chain,network}``: 1 where this process leads the role, else 0;
``chaingate_leadership_total{kind}``: what the leadership did (looks, roles taken and handed
over, connections lost, silent processes deposed)."""

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
    registry.family(
        "chaingate_leadership_total",
        "counter",
        "Leadership: looks at the locks, roles taken and handed over, lease connections lost,"
        " other processes deposed for silence past their lease.",
        lambda: [({"kind": kind}, float(n)) for kind, n in sorted(leadership.stats.items())],
    )
