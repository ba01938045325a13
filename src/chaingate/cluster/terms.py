"""Leadership terms: the fence a lease alone cannot give.

A session-level advisory lock says who leads *now*; a leader whose session died mid-write does
not know it yet, and its write may land after the next leader began.  So each leader, once its
lease is granted and before it writes, bumps the role's term in ``role_terms``
(``RoleTerms.begin``); a write that must not come from a deposed leader runs
``still_current`` in its own transaction: it matches only while no later term began, and on
PostgreSQL it holds the row until commit, so a new leader's bump waits for that write and
then sees it (the bundler reconciles what it finds).
"""

from __future__ import annotations

from chaingate.cluster.roles import RoleKey
from chaingate.store.rows import Rows
from chaingate.store.tx import Tx

_BEGIN = (
    "INSERT INTO role_terms (role, chain, network, term) VALUES (?, ?, ?, 1)"
    " ON CONFLICT (role, chain, network) DO UPDATE SET term = role_terms.term + 1"
)
_READ = "SELECT term FROM role_terms WHERE role = ? AND chain = ? AND network = ?"
# A no-op update: it matches only the current term, and takes the row's lock (PostgreSQL).
_STILL = (
    "UPDATE role_terms SET term = term WHERE role = ? AND chain = ? AND network = ? AND term = ?"
)


def still_current(tx: Tx, key: RoleKey, term: int) -> bool:
    """Inside a write's transaction: whether ``term`` is still the role's newest."""
    return tx.execute(_STILL, (key.role, key.chain, key.network, term)) == 1


class RoleTerms(Rows):
    async def begin(self, key: RoleKey) -> int:
        """A new term for ``key`` (call with its lease held): the previous leader's fenced
        writes fail from now on."""

        def bump(tx: Tx) -> int:
            params = (key.role, key.chain, key.network)
            tx.execute(_BEGIN, params)
            return int(tx.query(_READ, params)[0][0])

        return await self.run_transaction(bump)
