-- The operator's page: accounts newest first, a page at a time.
CREATE INDEX accounts_created_at ON accounts (created_at);
