"""More than one process: workers on one port, and one leader per role and chain/network.

* ``roles`` — sans-IO: the single-writer roles, their labels and advisory-lock keys, and the
  fair-share decision of which roles a process takes or hands over.
* ``leases`` — who leads: PostgreSQL session-level advisory locks held on a connection of
  their own (``PgLeadership``), or every role led here (``LocalLeadership``, one process).
* ``gates`` — running a single writer only while its role is held, and a follower's stream
  relayed to a consumer only while it leads (events are dropped otherwise: the consumer's own
  stored cursor makes it catch up when it leads again).
* ``workers`` — how many workers ``[server] workers`` means, and what N > 1 requires.
* ``supervisor`` — the small parent of ``chaingate serve --workers N``.
"""
