-- The dashboard (issue 23): sign-in credentials, sessions, one-time sign-in links, and the
-- rollups its pages read so that none scans per-minute usage over days (usage_hours,
-- usage_days, written in the transaction of add_usage) or latency samples (latency_rollups).
-- Portable SQL: runs unchanged on SQLite and PostgreSQL.  Times are epoch milliseconds;
-- usage periods are epoch minutes at the start of the hour / UTC day.

CREATE TABLE dashboard_credentials (
    account_id TEXT PRIMARY KEY REFERENCES accounts (id),
    password_hash TEXT NULL,          -- scrypt$N$r$p$salt$hash (chaingate.dashboard.passwords)
    operator INTEGER NOT NULL,        -- 1: sees every account and the upstreams
    updated_at BIGINT NOT NULL
);

CREATE TABLE dashboard_sessions (
    id TEXT PRIMARY KEY,              -- SHA-256 of the token in the cookie: never the token
    account_id TEXT NOT NULL,         -- '' for an operator signed in with the admin token
    operator INTEGER NOT NULL,
    csrf TEXT NOT NULL,
    address TEXT NOT NULL,
    user_agent TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT NULL
);
CREATE INDEX dashboard_sessions_account ON dashboard_sessions (account_id, created_at);

CREATE TABLE dashboard_signin_links (
    id TEXT PRIMARY KEY,              -- SHA-256 of the token in the link
    account_id TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at BIGINT NULL
);

CREATE TABLE usage_hours (
    account_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    method TEXT NOT NULL,
    period BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (account_id, period, key_id, method)
);

CREATE TABLE usage_days (
    account_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    method TEXT NOT NULL,
    period BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (account_id, period, key_id, method)
);

-- The operator's page: every account's usage of one day.
CREATE INDEX usage_days_period ON usage_days (period);

-- What was metered before this migration, rolled up once.
INSERT INTO usage_hours
    (account_id, key_id, method, period, requests, compute_units, errors)
SELECT account_id, key_id, method, (minute / 60) * 60,
       SUM(requests), SUM(compute_units), SUM(errors)
FROM usage_minutes
GROUP BY account_id, key_id, method, (minute / 60) * 60;

INSERT INTO usage_days
    (account_id, key_id, method, period, requests, compute_units, errors)
SELECT account_id, key_id, method, (minute / 1440) * 1440,
       SUM(requests), SUM(compute_units), SUM(errors)
FROM usage_minutes
GROUP BY account_id, key_id, method, (minute / 1440) * 1440;

-- Request latency of the whole deployment by edge route (rpc, bundler, rest, ...), sampled
-- from the histogram of each process once a minute: counts per bucket of
-- chaingate.obs.metrics.LATENCY_BUCKETS (b15: above the last bound).  granularity is
-- 1, 60 or 1440 (minutes); every sample is added to all three in one transaction.
CREATE TABLE latency_rollups (
    granularity INTEGER NOT NULL,
    period BIGINT NOT NULL,
    route TEXT NOT NULL,
    b0 BIGINT NOT NULL, b1 BIGINT NOT NULL, b2 BIGINT NOT NULL, b3 BIGINT NOT NULL,
    b4 BIGINT NOT NULL, b5 BIGINT NOT NULL, b6 BIGINT NOT NULL, b7 BIGINT NOT NULL,
    b8 BIGINT NOT NULL, b9 BIGINT NOT NULL, b10 BIGINT NOT NULL, b11 BIGINT NOT NULL,
    b12 BIGINT NOT NULL, b13 BIGINT NOT NULL, b14 BIGINT NOT NULL, b15 BIGINT NOT NULL,
    PRIMARY KEY (granularity, period, route)
);
