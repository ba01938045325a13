"""The indexer: token balances, NFT ownership and transfers, derived from the chain follower.

* ``transfers`` — sans-IO: a block's logs (and its native value transfers) decoded into
  ``Transfer`` records and ERC-4906 metadata updates; anything malformed is counted, not raised.
* ``native`` — sans-IO: top-level native value transfers from full transactions and receipts.
* ``ledger`` — sans-IO: the effects of transfers on balances, holdings, supplies and the counts
  derived from them (holders, owners, tokens in existence), applied or undone exactly.
* ``fetch`` — the few JSON-RPC reads the indexer makes itself (gaps, native transactions).
* ``indexer`` — the service: consumes one follower's events, commits effects and cursor in one
  transaction.
* ``reader`` — the read model the REST endpoints use (``IndexReader``).

The SQL lives in ``chaingate.data.store``.  This package's ``__init__`` imports nothing:
the store imports ``transfers`` and ``ledger``, and the indexer imports the store.
"""
