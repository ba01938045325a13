"""A local Solana node for ``chaingate dev`` and the tests: LiteSVM behind Solana's JSON-RPC.

No I/O: ``ledger`` keeps slots, blocks and commitments over LiteSVM; ``rpc`` answers JSON-RPC
over a ledger (``chain``, ``accounts``, ``transactions``); ``pubsub`` turns closed slots into
subscription notifications; ``snapshot`` saves and resumes a ledger.  The edges: ``server``
(HTTP over h11 on trio, the slot clock, periodic saves) and ``wsedge`` (PubSub over wsproto).
docs/decisions/devnet.md says what differs from a validator.
"""
