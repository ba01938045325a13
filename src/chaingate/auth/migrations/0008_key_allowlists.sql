-- Per-key allowlists (Alchemy's and Infura's "security" settings): allowed origins, client IP
-- ranges, JSON-RPC methods and contract addresses.  One JSON object (chaingate.auth.allowlists),
-- NULL when the key has none: every list is optional and rarely set, and the key registry
-- reads the whole row anyway.
ALTER TABLE api_keys ADD COLUMN allowlists TEXT NULL;
