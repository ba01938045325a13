-- Token and NFT metadata (chaingate.metadata): what each contract says about itself on chain,
-- and the metadata documents of tokens (and of contracts: ERC-7572 contractURI), with their
-- fetch status and retry schedule.  Addresses are 0x + 40 lowercase hex digits; token ids
-- 64 lowercase hex digits (zero-padded, so text order is numeric order and ERC-4906 ranges
-- are a BETWEEN); timestamps epoch milliseconds.

CREATE TABLE token_metadata (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    standard TEXT NULL,               -- ERC20 | ERC721 | ERC1155; NULL: not a token (when ok)
    standard_hint TEXT NULL,          -- what the indexer saw in the logs
    name TEXT NULL,
    symbol TEXT NULL,
    decimals INTEGER NULL,            -- NULL: no decimals() (raw units)
    total_supply TEXT NULL,           -- decimal uint256 at fetched_at
    status TEXT NOT NULL,             -- ok | pending | failed
    last_error TEXT NULL,
    attempts INTEGER NOT NULL,        -- failed attempts since the last success
    fetched_at BIGINT NULL,
    next_retry_at BIGINT NULL,        -- next probe (a retry, or the periodic re-read)
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, contract)
);
CREATE INDEX token_metadata_due ON token_metadata (chain, network, next_retry_at);

CREATE TABLE nft_metadata (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    token_id TEXT NOT NULL,           -- 64 hex digits; '' is the contract's own document
    standard TEXT NULL,
    token_uri TEXT NULL,              -- {id} substituted; data: URIs shortened
    name TEXT NULL,
    description TEXT NULL,
    image_url TEXT NULL,
    animation_url TEXT NULL,
    external_url TEXT NULL,
    banner_url TEXT NULL,             -- contract documents
    traits TEXT NULL,                 -- JSON array of {"trait_type", "value"} (strings)
    status TEXT NOT NULL,             -- ok | stale | pending | failed
    last_error TEXT NULL,
    attempts INTEGER NOT NULL,        -- failed attempts since the last success or refresh
    fetched_at BIGINT NULL,
    next_retry_at BIGINT NULL,        -- when a fetch is due (NULL: none scheduled)
    priority INTEGER NOT NULL,        -- 1: a client waits for it; fetched before background work
    refresh_requested_at BIGINT NULL, -- the last accepted refresh request (cool-down)
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network, contract, token_id)
);
CREATE INDEX nft_metadata_due ON nft_metadata (chain, network, next_retry_at);
