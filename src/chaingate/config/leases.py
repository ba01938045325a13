"""The clock of the cluster's leases (``chaingate.cluster.leases`` runs by it), kept below the
cluster so that the configuration checks ``server.leader_timeout`` by the rule the leases use.
"""

from __future__ import annotations

__all__ = ["MIN_LEADER_TIMEOUT", "QUERY_TIMEOUT", "TICK", "min_lease_timeout"]

TICK = 0.5  # seconds between looks at the locks: the handover delay is about one tick
QUERY_TIMEOUT = 3.0  # a look that takes longer means the connection is lost


def min_lease_timeout(tick: float = TICK) -> float:
    """The shortest lease, in seconds: a look may take QUERY_TIMEOUT before its process counts
    its connection lost (its own remedy for a slow database), the next look follows a tick
    later and the deposer looks a tick apart; a shorter lease deposes a process that is only
    slow."""
    return QUERY_TIMEOUT + 2 * tick


MIN_LEADER_TIMEOUT = min_lease_timeout()
