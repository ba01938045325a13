"""How many client connections the edge may hold: derived from the file-descriptor limit.

Every client connection is a descriptor, and so is every upstream connection, store
connection, log file and listener.  A server that accepts clients until ``accept`` fails with
EMFILE can no longer open the upstream connection a request needs, and new clients wait in the
kernel's backlog for an answer that never comes.  So the edge stops short: at start the soft
limit is raised to the hard one, a reserve is kept for everything that is not a client, and
the rest is the connection budget.
"""

from __future__ import annotations

import resource

import msgspec

from chaingate.config import ServerSettings

# Descriptors beyond the caller's reserve: listener, log streams, the store's files, DNS, the
# edge's own accept batch (up to 64 connections may be closing while new ones arrive).
BASE_RESERVE = 128
# With no limit at all (RLIM_INFINITY), the budget is computed as if the limit were this.
UNLIMITED_FDS = 1 << 20
MIN_CONNECTIONS = 16
# The derived default never exceeds this (each connection also costs memory and a task).
AUTO_MAX_CONNECTIONS = 65_536


class ConnectionLimits(msgspec.Struct, frozen=True):
    max_connections: int
    max_per_ip: int
    fd_limit: int  # 0: not known (not started yet)
    reserved: int
    lowered: bool  # the configured max_connections did not fit and was lowered


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; the resulting soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # keep the soft limit we have
    elif hard == resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (UNLIMITED_FDS, hard))
            soft = UNLIMITED_FDS
        except (ValueError, OSError):
            pass
    return UNLIMITED_FDS if soft == resource.RLIM_INFINITY else int(soft)


def connection_limits(settings: ServerSettings, fd_limit: int, reserved: int) -> ConnectionLimits:
    """The edge's caps for ``fd_limit`` descriptors (0: unknown) with ``reserved`` of them
    promised to upstream and store connections."""
    reserve = reserved + BASE_RESERVE
    fits = max(MIN_CONNECTIONS, fd_limit - reserve) if fd_limit else 0
    configured = settings.max_connections
    lowered = False
    if configured <= 0:
        total = min(fits, AUTO_MAX_CONNECTIONS) if fits else 10_000
    elif fits and configured > fits:
        total, lowered = fits, True
    else:
        total = configured
    per_ip = settings.max_connections_per_ip
    if per_ip <= 0:
        per_ip = max(1, total // 2)
    return ConnectionLimits(total, min(per_ip, total), fd_limit, reserve, lowered)
