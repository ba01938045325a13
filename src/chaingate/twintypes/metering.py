"""One metering record: what a request leaves in the usage and latency meters.

Every path (the fast lane in both twins, the hand-off, the bundler, REST, WebSocket) books a
request as ``Sample``s through one sink method, ``record``, which writes both meters: the
usage row (requests, compute units, errors under the caller's key, network and method) and
the latency (under the caller's account, network and method), in the same minute.

- A sample with nothing to count (0 requests, 0 units, 0 errors) writes no usage row: the
  latency of a batch, whose calls were counted under their own methods.
- A sample with ``seconds`` < 0 writes no latency: what was never admitted, a batch's calls,
  units billed outside a request (pushed WebSocket notifications).

The lane passes a sample's fields to ``record`` rather than a ``Sample`` (no object per
request on the hot path); the Python paths build ``Sample``s and spread them
(``sink.record(*sample)``).
"""

from __future__ import annotations

from typing import Generic, NamedTuple, Protocol, TypeVar

P = TypeVar("P")
P_contra = TypeVar("P_contra", contravariant=True)

# ``seconds`` of a sample that carries no latency.
UNTIMED = -1.0


class Sample(NamedTuple, Generic[P]):
    """One request's record (or one row of it: a batch books a sample per method)."""

    principal: P
    network: str  # the endpoint's "chain/network"; '' for REST calls (no one network)
    method: str  # a batch's latency is under "batch"
    requests: int = 0
    cu: int = 0
    errors: int = 0
    seconds: float = UNTIMED  # from arrival to answer, once admitted


class MeterSink(Protocol[P_contra]):
    """Where samples go: the lane's admission (``KeyAdmission``/``OpenAdmission``), and the
    key gate, which hands its own to the lane's."""

    def record(
        self,
        principal: P_contra,
        network: str,
        method: str,
        requests: int,
        cu: int,
        errors: int,
        seconds: float,
    ) -> None:
        """Book one sample, given as its fields (see the module's rules)."""
        ...
