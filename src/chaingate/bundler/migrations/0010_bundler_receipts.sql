-- What the EntryPoints' logs say happened to user operations (chaingate.bundler.receipts):
-- one row per operation per block that included it, whoever bundled it.  Derived from the
-- chain: a reorganised block's rows are deleted by its hash, and a new chain empties them.
CREATE TABLE bundler_receipts (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    user_op_hash TEXT NOT NULL,
    block_hash TEXT NOT NULL,
    block_number BIGINT NOT NULL,
    tx_hash TEXT NOT NULL,
    entry_point TEXT NOT NULL,
    sender TEXT NOT NULL,
    nonce TEXT NOT NULL,              -- decimal uint256
    paymaster TEXT NOT NULL,          -- the zero address when the account paid
    success INTEGER NOT NULL,
    actual_gas_cost TEXT NOT NULL,    -- decimal wei
    actual_gas_used TEXT NOT NULL,
    reason TEXT NOT NULL,             -- UserOperationRevertReason's bytes, 0x-hex ('' if none)
    logs TEXT NOT NULL,               -- JSON: the operation's own logs, as eth_getLogs gives them
    PRIMARY KEY (chain, network, user_op_hash, block_hash)
);
CREATE INDEX bundler_receipts_block ON bundler_receipts (chain, network, block_hash);
CREATE INDEX bundler_receipts_sender ON bundler_receipts (chain, network, sender, block_number);
