-- Smart wallets, gas policies and sponsorships (chaingate.wallets).  Addresses and hashes are
-- 0x + lowercase hex; timestamps epoch milliseconds unless named *_s (seconds, as the chain
-- counts them); wei amounts decimal text (uint256 does not fit a BIGINT); USD amounts whole
-- micro-dollars (BIGINT), so limits are summed exactly by the database.

-- A wallet an account created through the API.  The address is a function of (factory, owner,
-- salt), so two accounts may hold the same one: each has its own row (and neither controls
-- it; its owner key does).
CREATE TABLE wallets (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    account_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    salt TEXT NOT NULL,               -- decimal uint256
    version TEXT NOT NULL,            -- the EntryPoint version: 0.6 | 0.7
    factory TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, address, account_id)
);
CREATE INDEX wallets_account ON wallets (account_id, created_at);

-- Derived from the chain (the EntryPoint's AccountDeployed, seen by the follower): emptied
-- when the network's chain changes, undone when its block is reorganised away.
CREATE TABLE wallet_deployments (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    block_number BIGINT NOT NULL,
    block_hash TEXT NOT NULL,
    tx_hash TEXT NOT NULL,
    deployed_at BIGINT NOT NULL,      -- the block's timestamp
    PRIMARY KEY (chain, network, address)
);
CREATE INDEX wallet_deployments_block ON wallet_deployments (chain, network, block_number);

CREATE TABLE gas_policies (
    id TEXT PRIMARY KEY,              -- gp_...
    account_id TEXT NOT NULL,
    name TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    chain_label TEXT NOT NULL,        -- the chain as the client named it
    rules TEXT NOT NULL,              -- JSON, normalised (chaingate.wallets.rules)
    status TEXT NOT NULL,             -- active | paused
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    -- Bumped by every reservation: the UPDATE that locks the row, so concurrent sponsor
    -- requests of one policy check its limits one after another, across processes too.
    reservations BIGINT NOT NULL
);
CREATE INDEX gas_policies_account ON gas_policies (account_id, created_at);

-- One signed sponsorship: reserved when signed, settled by the EntryPoint's
-- UserOperationEvent, released once its signature has expired unused.
CREATE TABLE sponsorships (
    id TEXT PRIMARY KEY,              -- sp_...
    policy_id TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    sender TEXT NOT NULL,
    user_op_hash TEXT NOT NULL,
    day BIGINT NOT NULL,              -- UTC day number of the reservation
    created_at BIGINT NOT NULL,
    valid_until_s BIGINT NOT NULL,    -- the paymaster signature's validUntil
    released_at BIGINT NOT NULL,      -- after this, unsettled, it no longer counts
    estimated_wei TEXT NOT NULL,      -- the worst case: every gas limit x maxFeePerGas
    estimated_usd BIGINT NOT NULL,
    usd_per_eth TEXT NOT NULL,        -- the feed's price when signed (settlement uses it too)
    settled_block BIGINT NULL,
    settled_block_hash TEXT NULL,
    settled_tx TEXT NULL,
    actual_wei TEXT NULL,
    actual_usd BIGINT NULL,
    success BOOLEAN NULL
);
CREATE INDEX sponsorships_policy ON sponsorships (policy_id, created_at);
CREATE INDEX sponsorships_sender ON sponsorships (policy_id, sender, day);
CREATE INDEX sponsorships_hash ON sponsorships (chain, network, user_op_hash);
CREATE INDEX sponsorships_settled ON sponsorships (chain, network, settled_block);
