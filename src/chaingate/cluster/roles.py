"""The single-writer roles and the fair-share rule that spreads them over processes (sans-IO).

A role is led per chain/network: ``follower:ethereum/devnet`` saves that network's cursor and
window, ``indexer:…`` writes its token/NFT index, and so on.  Each is one PostgreSQL advisory
lock (two int4 keys: chaingate's class, and the role's number).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence, Set

import msgspec

from chaingate.config.network import Network

# The writers that must be single per chain/network (issue 22).  ``gas`` and ``wallets`` are
# registered like the others; what each one guards is in docs/decisions/cluster.md.
ROLES = ("follower", "indexer", "webhooks", "bundler", "gas", "wallets")

# First key of every chaingate leadership lock: "cgld" (never the migrations' bigint lock,
# which lives in the one-key space).
LOCK_CLASS = 0x63676C64
# Second keys are hashed with a namespace (the store's schema: deployments sharing one
# database in schemas of their own never share roles).  The member key is held shared by
# every live process: how many processes share the roles.
MEMBER_ROLE = "members"
# Ticks a role must be seen free, while this process already has its share, before it takes
# the role anyway (a process that does not run that role must not leave it unled).
STARVED_TICKS = 3
# Ticks the membership must stay the same before a process hands over a role above its
# share (a process that restarts must not make the others give roles back and forth).
STABLE_TICKS = 4


class RoleKey(msgspec.Struct, frozen=True, order=True):
    role: str
    chain: str
    network: str

    @classmethod
    def of(cls, role: str, net: Network) -> RoleKey:
        return cls(role, net.chain, net.network)

    @property
    def label(self) -> str:
        return f"{self.role}:{Network(self.chain, self.network)}"


def lock_key(label: str, namespace: str) -> int:
    """The second advisory-lock key of ``label``: a non-negative int4."""
    return zlib.crc32(f"{namespace}|{label}".encode()) & 0x7FFF_FFFF


def role_keys(networks: Sequence[str], roles: Sequence[str] = ROLES) -> list[RoleKey]:
    """Every role of every network (a ``Network``, or its text), in a stable order."""
    keys: list[RoleKey] = []
    for key in networks:
        net = Network.of(key)
        keys.extend(RoleKey.of(role, net) for role in roles)
    return keys


class Decision(msgspec.Struct, frozen=True):
    take: list[RoleKey]
    release: list[RoleKey]


def fair_share(roles: int, members: int) -> int:
    return math.ceil(roles / max(1, members))


def decide(
    registered: Sequence[RoleKey],
    mine: Set[RoleKey],
    held_anywhere: Set[RoleKey],
    members: int,
    free_ticks: Mapping[RoleKey, int],
    stable_ticks: int,
) -> Decision:
    """What to try to take and what to hand over this tick.

    ``held_anywhere``: roles some process holds; ``free_ticks``: for each free role, the
    ticks in a row it was seen free; ``stable_ticks``: ticks the membership stayed as it is.
    Below its share a process takes free roles; at its share it takes only roles left free
    too long; above it (and the membership stable) it hands over one role per tick.
    """
    share = fair_share(len(registered), members)
    free = [k for k in registered if k not in mine and k not in held_anywhere]
    room = share - len(mine)
    take = free[:room] if room > 0 else []
    take += [k for k in free[len(take) :] if free_ticks.get(k, 0) >= STARVED_TICKS]
    release: list[RoleKey] = []
    if room < 0 and stable_ticks >= STABLE_TICKS:
        # The last in the registered order: a stable choice, so two processes never swap.
        release = [max(mine, key=registered.index)] if mine else []
    return Decision(take, release)
