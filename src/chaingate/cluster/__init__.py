"""More than one process: workers on one port, and one leader per role and chain/network.

* ``roles`` — sans-IO: the single-writer roles, their labels and advisory-lock keys, and the
  fair-share decision of which roles a process takes or hands over.
* ``leases`` — who leads: PostgreSQL session-level advisory locks held on a connection of
  their own, with a lease each look renews (``PgLeadership``), or every role led here
  (``LocalLeadership``, one process).
* ``gates`` — a follower's stream read by a consumer only in its terms (dropped otherwise):
  each term begins with a backlog from the consumer's own position (``chain.catchup``).
* ``workers`` — how many workers ``[server] workers`` means, and what N > 1 requires.
* ``supervisor`` — the small parent of ``chaingate serve --workers N``.
"""
