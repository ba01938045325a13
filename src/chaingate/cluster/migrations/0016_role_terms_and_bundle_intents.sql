-- Leadership terms (chaingate.cluster.terms): each new leader of a role bumps its role's term
-- inside its lease; a write that a deposed leader must not make compares the term in its own
-- transaction.
CREATE TABLE role_terms (
    role TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    term BIGINT NOT NULL,
    PRIMARY KEY (role, chain, network)
);

-- Bundle transactions recorded before they are sent (chaingate.bundler.store): the signed
-- transaction, its nonce and the term of the leader that signed it, so the next leader
-- finishes it (sends the same bytes) rather than bundling its operations a second time.
CREATE TABLE bundler_intents (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    tx_hash TEXT NOT NULL,
    nonce BIGINT NOT NULL,
    raw TEXT NOT NULL,
    term BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, tx_hash)
);
CREATE INDEX bundler_intents_created ON bundler_intents (chain, network, created_at);
