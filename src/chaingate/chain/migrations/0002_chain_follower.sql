-- The chain follower's state per chain/network: its cursor, and the recent canonical blocks
-- (with their logs) it needs to detect and undo a reorg, even after a restart.

CREATE TABLE chain_cursors (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,           -- last block handed to every consumer
    hash TEXT NOT NULL,
    finalized BIGINT NOT NULL,        -- last block announced as finalized (-1: none yet)
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network)
);

CREATE TABLE chain_blocks (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,
    hash TEXT NOT NULL,
    parent_hash TEXT NOT NULL,
    body TEXT NOT NULL,               -- the Block (header and logs) as JSON
    PRIMARY KEY (chain, network, number)
);
