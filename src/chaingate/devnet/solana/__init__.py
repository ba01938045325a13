"""A local Solana node for ``chaingate dev`` and the tests: LiteSVM behind Solana's JSON-RPC.

``ledger`` keeps slots, blocks and commitments over LiteSVM (plain Python, no I/O);
``methods`` answers JSON-RPC over a ledger; ``server`` is the thin trio/h11 edge.
docs/decisions/devnet.md says what differs from a validator.
"""
