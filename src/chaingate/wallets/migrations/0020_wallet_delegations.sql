-- EIP-7702 wallets (chaingate.wallets): the owner's own EOA, delegating to the network's
-- account code ('simple' wallets are SimpleAccounts a factory deploys).
ALTER TABLE wallets ADD COLUMN kind TEXT NOT NULL DEFAULT 'simple';

-- Derived from the chain (a type-4 transaction's authorization, seen by the follower, the
-- delegate read from the account's code after the block; the zero address when cleared):
-- the latest row of an address is its delegation now.  Emptied when the network's chain
-- changes, a block's rows undone when it is reorganised away.
CREATE TABLE wallet_delegations (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    address TEXT NOT NULL,
    block_number BIGINT NOT NULL,
    block_hash TEXT NOT NULL,
    tx_hash TEXT NOT NULL,            -- the block's last transaction authorising it
    delegate TEXT NOT NULL,
    set_at BIGINT NOT NULL,           -- the block's timestamp
    PRIMARY KEY (chain, network, address, block_hash)
);
CREATE INDEX wallet_delegations_latest ON wallet_delegations (chain, network, address, block_number);
