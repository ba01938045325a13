-- Where each network's history begins for this deployment (chaingate.chain.follower): the
-- first block its follower followed, claimed once by the first process that knows it.  A
-- consumer of the follower that has stored nothing yet begins there (or at its own
-- configured start), never at whichever block its first leadership term happens to see.
CREATE TABLE chain_origins (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,
    PRIMARY KEY (chain, network)
);

-- The last block handled by a follower consumer that keeps no cursor of its own (the wallets'
-- and the bundler's trackers, whose writes are idempotent by block hash): where its next
-- leadership term begins.  Saved at most once a second and when a term ends, after the
-- block's writes: a term may repeat a second's blocks, never skip one.
CREATE TABLE chain_consumers (
    consumer TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,
    hash TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, chain, network)
);
