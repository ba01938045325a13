-- Who asked for a refresh of an NFT or contract document, and when (issue 25): each account
-- has its own allowance of one accepted refresh per document per cool-down, whatever other
-- accounts asked.  The document's own nft_metadata.refresh_requested_at still spaces the
-- fetches its origin sees.  Rows older than the cool-down mean nothing and are pruned.
CREATE TABLE nft_refresh_requests (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    token_id TEXT NOT NULL,           -- as in nft_metadata ('' for the contract's document)
    account_id TEXT NOT NULL,         -- '' when API keys are off
    requested_at BIGINT NOT NULL,     -- the account's last accepted refresh of the document
    PRIMARY KEY (chain, network, contract, token_id, account_id)
);
CREATE INDEX nft_refresh_requests_age ON nft_refresh_requests (chain, network, requested_at);
