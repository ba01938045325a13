-- Which chain each chain/network's derived state was built from (the follower's cursor and
-- window today; indexes, wallets and webhooks later).  When the node serves another chain
-- (a devnet started afresh), that state is reset before anything reads it (Store.reset_network).

CREATE TABLE chain_identities (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    identity TEXT NOT NULL,           -- opaque to the store; e.g. genesis hash and a chain id
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network)
);
