-- Contracts the metadata service found not to be ERC-20s (an NFT, or a contract that logs
-- Transfer without being a token), per network (chaingate.data; issue 39): the balances list
-- leaves them out in its query, so a page and its total count the same rows.  Written from
-- each probe's verdict; a contract found to be an ERC-20 again is deleted.  Seeded from the
-- verdicts already stored (token_metadata: read 'ok', a standard other than ERC20).
-- Portable SQL: runs unchanged on SQLite and PostgreSQL.

CREATE TABLE idx_not_erc20 (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    contract TEXT NOT NULL,
    PRIMARY KEY (chain, network, contract)
);
INSERT INTO idx_not_erc20 (chain, network, contract)
SELECT chain, network, contract FROM token_metadata
WHERE status = 'ok' AND (standard IS NULL OR standard <> 'ERC20');
