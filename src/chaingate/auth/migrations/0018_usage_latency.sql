-- Latency per account (issue 23: the overview's latency is the account's, by network and by
-- method).  The gateway keeps a request-latency histogram per (account, network, method,
-- minute) beside the usage meter, and add_usage adds it here in the usage rows' transaction,
-- to minute, hour and day rows (granularity 1, 60, 1440 minutes; period: epoch minutes at
-- its start).  Counts per
-- bucket of chaingate.obs.metrics.LATENCY_BUCKETS, b15 above the last bound: the layout of
-- latency_rollups.  network is '' for REST calls; method is "batch" for a batch request (the
-- usage rows count its calls, this its one answer).  Nothing was measured before: no rows to
-- carry over, existing tables untouched.
-- Portable SQL: runs unchanged on SQLite and PostgreSQL.

CREATE TABLE usage_latency (
    granularity INTEGER NOT NULL,
    period BIGINT NOT NULL,
    account_id TEXT NOT NULL,
    network TEXT NOT NULL,
    method TEXT NOT NULL,
    b0 BIGINT NOT NULL, b1 BIGINT NOT NULL, b2 BIGINT NOT NULL, b3 BIGINT NOT NULL,
    b4 BIGINT NOT NULL, b5 BIGINT NOT NULL, b6 BIGINT NOT NULL, b7 BIGINT NOT NULL,
    b8 BIGINT NOT NULL, b9 BIGINT NOT NULL, b10 BIGINT NOT NULL, b11 BIGINT NOT NULL,
    b12 BIGINT NOT NULL, b13 BIGINT NOT NULL, b14 BIGINT NOT NULL, b15 BIGINT NOT NULL,
    PRIMARY KEY (account_id, granularity, period, network, method)
);
-- The prune: old minute and hour rows of every account.
CREATE INDEX usage_latency_granularity_period ON usage_latency (granularity, period);
