"""Which single-writer roles a process has, and handing the leadership to what runs them.

The composition root gives the parts by what they hold (a follower per network, the networks
each writer runs for); nothing here knows the subsystems' types.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from chaingate.cluster.leases import Leadership, leadership_for
from chaingate.cluster.metrics import register_leader_metrics
from chaingate.cluster.roles import RoleKey
from chaingate.config import Settings
from chaingate.config.network import Network
from chaingate.obs.metrics import Registry
from chaingate.store import Store


class PersistingFollower(Protocol):
    chain: str
    network: str
    may_save: Callable[[], contextlib.AbstractContextManager[bool]]


class SingleWriter(Protocol):
    """A subsystem whose writers run where its role is led."""

    writer_role: str
    leadership: Leadership

    @property
    def writes_for(self) -> Collection[Network]: ...


def lead_writers(
    store: Store | None,
    settings: Settings,
    registry: Registry,
    followers: Mapping[Network, PersistingFollower],
    writers: Iterable[SingleWriter | None],
) -> Leadership:
    """Who runs which single writer when several processes share the store: PostgreSQL's
    advisory locks, or every role here (SQLite); its ``chaingate_leader`` gauge."""
    present = [writer for writer in writers if writer is not None]
    roles = role_keys(followers, {w.writer_role: w.writes_for for w in present})
    leadership = leadership_for(
        store.backend if store is not None else "",
        settings.store.url,
        roles,
        lease_timeout=settings.server.leader_timeout,
        session_tag=store.session_tag if store is not None else "",
    )
    register_leader_metrics(registry, leadership)
    share_writers(leadership, followers.values(), present)
    return leadership


def role_keys(
    followed: Iterable[Network], writers: Mapping[str, Collection[Network] | None]
) -> list[RoleKey]:
    """The roles of this process: a follower per followed network, and each writer role
    (``indexer``, ``webhooks``, …) for the networks it runs on (None: not running)."""
    keys: list[RoleKey] = []
    for key in followed:
        keys.append(RoleKey.of("follower", key))
        for role, networks in writers.items():
            if networks is not None and key in networks:
                keys.append(RoleKey.of(role, key))
    return keys


def share_writers(
    leadership: Leadership,
    followers: Iterable[PersistingFollower],
    services: Iterable[SingleWriter],
) -> None:
    """Each single writer runs where its role is led (here, unless other processes may share
    the store); every process still follows every network (its WebSocket feed) and delivers
    webhooks (the outbox is shared with SKIP LOCKED)."""
    for follower in followers:
        role = RoleKey("follower", follower.chain, follower.network)
        follower.may_save = functools.partial(leadership.writing, role)
    for service in services:
        service.leadership = leadership
