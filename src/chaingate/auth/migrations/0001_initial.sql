-- Accounts, API keys and per-minute usage.  Portable SQL: runs unchanged on SQLite and
-- PostgreSQL.  Timestamps are epoch milliseconds; usage_minutes.minute is epoch minutes.

CREATE TABLE accounts (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL,
    plan TEXT NOT NULL,
    limits TEXT NULL,                 -- JSON: per-account overrides (enterprise)
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
-- find_account_by_email, and the caches polling accounts_changed_since.
CREATE INDEX accounts_email ON accounts (email);
CREATE INDEX accounts_updated_at ON accounts (updated_at);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts (id),
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,             -- display prefix only, e.g. svc_test_Ab12
    key_hash TEXT NOT NULL UNIQUE,    -- the key itself is never stored
    environment TEXT NOT NULL,        -- live | test
    scopes TEXT NOT NULL,             -- space-separated; '' means all
    created_at BIGINT NOT NULL,
    last_used_at BIGINT NULL,
    revoked_at BIGINT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX api_keys_updated_at ON api_keys (updated_at);
CREATE INDEX api_keys_account_id ON api_keys (account_id);

CREATE TABLE usage_minutes (
    key_id TEXT NOT NULL,
    account_id TEXT NOT NULL,
    method TEXT NOT NULL,
    minute BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (key_id, method, minute)
);
CREATE INDEX usage_minutes_account_minute ON usage_minutes (account_id, minute);
-- day_totals scans one day across all accounts (and pruning old rows would too).
CREATE INDEX usage_minutes_minute ON usage_minutes (minute);
