"""``[server] workers``: how many processes, and what more than one requires."""

from __future__ import annotations

import os
from typing import Literal

from chaingate.config import ConfigError, Settings

MAX_WORKERS = 256


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(setting: int | Literal["auto"]) -> int:
    if setting == "auto":
        return available_cpus()
    if not 1 <= setting <= MAX_WORKERS:
        raise ConfigError(f'server.workers must be between 1 and {MAX_WORKERS}, or "auto"')
    return setting


def check_shared_state(settings: Settings, workers: int) -> None:
    """More than one worker shares everything through PostgreSQL and Redis: refuse what each
    process would keep to itself (an SQLite file, per-process rate limits)."""
    if workers <= 1:
        return
    url = settings.store.url
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"server.workers = {workers} needs the store on PostgreSQL: set store.url "
            "(or CHAINGATE_STORE__URL) to a postgresql:// URL; SQLite is for one process"
        )
    if settings.auth.enabled and not settings.auth.redis_url:
        raise ConfigError(
            f"server.workers = {workers} needs rate limits in Redis: set auth.redis_url "
            "(or CHAINGATE_AUTH__REDIS_URL); in-memory limits would count per worker"
        )
