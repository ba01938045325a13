-- The indexer (chaingate.data): ERC-20 balances, NFT holdings, supplies and holder counts,
-- and every transfer, per chain/network.  Portable SQL (SQLite and PostgreSQL).
--
-- Representation: addresses and hashes are lowercase 0x-hex text.  Amounts (balances,
-- quantities, supplies) are signed decimal text of any length — SQLite has no 256-bit integer,
-- the API answers decimal strings anyway, and a sum over a broken contract may leave 256 bits
-- or go negative; the indexer reads, adds and writes them in Python.  Token ids are 64
-- lowercase hex digits (exactly 256 bits), so text order is numeric order.  A row whose
-- amount or count is zero is deleted, never kept.

CREATE TABLE idx_cursors (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,           -- the last block whose effects are in the index
    hash TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (chain, network)
);

-- Hashes of the last blocks indexed: a block delivered again at a height we hold is a replay
-- when its hash matches, else the chain changed and the index rewinds.
CREATE TABLE idx_blocks (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    number BIGINT NOT NULL,
    hash TEXT NOT NULL,
    parent_hash TEXT NOT NULL,
    PRIMARY KEY (chain, network, number)
);

-- Every transfer (native, ERC-20, ERC-721, ERC-1155 — a batch's items one row each), which is
-- also the journal: undoing blocks reads their rows back and applies them negated.
CREATE TABLE idx_transfers (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    block_number BIGINT NOT NULL,
    seq INTEGER NOT NULL,             -- position in the block (native value, then logs, in order)
    block_hash TEXT NOT NULL,
    block_time BIGINT NOT NULL,       -- the block's timestamp, Unix seconds
    tx_hash TEXT NOT NULL,
    tx_index INTEGER NOT NULL,
    log_index INTEGER NULL,           -- NULL for a native transfer
    standard TEXT NOT NULL,           -- native | ERC20 | ERC721 | ERC1155
    contract TEXT NULL,               -- NULL for a native transfer
    sender TEXT NOT NULL,             -- 0x00..00 for a mint
    receiver TEXT NOT NULL,           -- 0x00..00 for a burn
    token_id TEXT NULL,               -- 64 hex digits for ERC-721/1155, else NULL
    amount TEXT NOT NULL,             -- decimal (1 for ERC-721)
    PRIMARY KEY (chain, network, block_number, seq)
);
-- An address's transfers, newest first, out and in.
CREATE INDEX idx_transfers_sender ON idx_transfers (chain, network, sender, block_number, seq);
CREATE INDEX idx_transfers_receiver
    ON idx_transfers (chain, network, receiver, block_number, seq);

-- Every contract that emitted a token transfer, with its counters.
CREATE TABLE idx_contracts (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    standard TEXT NOT NULL,           -- the standard of its first transfer
    first_block BIGINT NOT NULL,      -- the block of its first transfer
    erc20_transfers BIGINT NOT NULL,  -- transfers seen per standard (a hybrid has several)
    erc721_transfers BIGINT NOT NULL,
    erc1155_transfers BIGINT NOT NULL,
    holders BIGINT NOT NULL,          -- ERC-20: addresses with a positive balance
    supply TEXT NOT NULL,             -- ERC-20: minted minus burned, decimal
    tokens BIGINT NOT NULL,           -- NFT: token ids with a positive supply
    owners BIGINT NOT NULL,           -- NFT: addresses holding at least one token id
    PRIMARY KEY (chain, network, contract)
);
-- "Contracts seen since": new token contracts in the order they appeared.
CREATE INDEX idx_contracts_seen ON idx_contracts (chain, network, first_block, contract);

-- ERC-20 balances; an address's list in contract order is the primary key's order.
CREATE TABLE idx_balances (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    holder TEXT NOT NULL,
    contract TEXT NOT NULL,
    balance TEXT NOT NULL,            -- decimal, raw units
    PRIMARY KEY (chain, network, holder, contract)
);

-- NFTs held: 1 per ERC-721 owner, the quantity for ERC-1155.
CREATE TABLE idx_nft_holdings (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    holder TEXT NOT NULL,
    contract TEXT NOT NULL,
    token_id TEXT NOT NULL,
    quantity TEXT NOT NULL,           -- decimal
    PRIMARY KEY (chain, network, holder, contract, token_id)
);
-- The owner (ERC-721) or holders (ERC-1155) of one token.
CREATE INDEX idx_nft_holdings_token
    ON idx_nft_holdings (chain, network, contract, token_id, holder);

-- Token ids with a positive quantity per (contract, holder): ERC-721 balanceOf, and what
-- makes an address one of a collection's owners.
CREATE TABLE idx_nft_owners (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    holder TEXT NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (chain, network, contract, holder)
);

-- Per token: supply minted minus burned (1 for a live ERC-721) and its number of holders.
CREATE TABLE idx_nft_tokens (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    token_id TEXT NOT NULL,
    supply TEXT NOT NULL,             -- decimal
    holders BIGINT NOT NULL,
    PRIMARY KEY (chain, network, contract, token_id)
);
