-- The bundler's mempool (chaingate.bundler.mempool) kept in the store, so a restart loses no
-- accepted operation, and its ERC-7562 reputation table.  Addresses and hashes 0x + lowercase
-- hex; uint256 values as decimal text; timestamps epoch milliseconds.  Both tables are
-- derived from one chain: a new chain empties them (register_network_table).

CREATE TABLE bundler_ops (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    hash TEXT NOT NULL,               -- the userOpHash
    entry_point TEXT NOT NULL,
    version TEXT NOT NULL,            -- 0.6 | 0.7
    sender TEXT NOT NULL,
    nonce TEXT NOT NULL,              -- decimal uint256
    max_fee_per_gas TEXT NOT NULL,    -- decimal
    max_priority_fee_per_gas TEXT NOT NULL,
    entry TEXT NOT NULL,              -- JSON: the mempool Entry as accepted (op, stakes, ...)
    status TEXT NOT NULL,             -- pending | submitted | included | failed | dropped
    bundle_tx TEXT,                   -- the bundle transaction (submitted, included)
    block_number BIGINT,              -- included: where
    block_hash TEXT,
    reason TEXT,                      -- why it failed or was dropped / put back
    submitted_at BIGINT NOT NULL,     -- when the client's operation was accepted
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, hash)
);
-- A replaced operation stays, `dropped` ("replaced by <hash>"), until pruned: the mempool
-- keeps one live operation per (sender, nonce).  Loading live rows at start and pruning
-- finished ones both go by status and age.
CREATE INDEX bundler_ops_status ON bundler_ops (chain, network, status, updated_at);

CREATE TABLE bundler_reputation (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    ops_seen BIGINT NOT NULL,
    ops_included BIGINT NOT NULL,
    decayed_at BIGINT NOT NULL,       -- ms: the table's last hourly decay when this was saved
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, address)
);
