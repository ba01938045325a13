-- Usage by network (issue 23: the overview shows requests, compute units and errors by
-- network).  The meter now counts per (key, network, method, minute); network is the
-- endpoint's 'chain/network', '' for REST calls (a route may read several networks).
-- Rows metered before this migration did not say which network they came from: they keep
-- network '' (shown as "(no network)" by the dashboard).  The network joins each table's
-- primary key, so the tables are rebuilt (SQLite cannot change a primary key in place).
-- Upgrading: stop every process, migrate, start (a process of an earlier version cannot write
-- usage into the rebuilt tables: its upsert names the old key).
-- Portable SQL: runs unchanged on SQLite and PostgreSQL.

CREATE TABLE usage_minutes_by_network (
    key_id TEXT NOT NULL,
    account_id TEXT NOT NULL,
    network TEXT NOT NULL,
    method TEXT NOT NULL,
    minute BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (key_id, network, method, minute)
);
INSERT INTO usage_minutes_by_network
    (key_id, account_id, network, method, minute, requests, compute_units, errors)
SELECT key_id, account_id, '', method, minute, requests, compute_units, errors
FROM usage_minutes;
DROP TABLE usage_minutes;
ALTER TABLE usage_minutes_by_network RENAME TO usage_minutes;
CREATE INDEX usage_minutes_account_minute ON usage_minutes (account_id, minute);
CREATE INDEX usage_minutes_minute ON usage_minutes (minute);

CREATE TABLE usage_hours_by_network (
    account_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    network TEXT NOT NULL,
    method TEXT NOT NULL,
    period BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (account_id, period, key_id, network, method)
);
INSERT INTO usage_hours_by_network
    (account_id, key_id, network, method, period, requests, compute_units, errors)
SELECT account_id, key_id, '', method, period, requests, compute_units, errors
FROM usage_hours;
DROP TABLE usage_hours;
ALTER TABLE usage_hours_by_network RENAME TO usage_hours;

CREATE TABLE usage_days_by_network (
    account_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    network TEXT NOT NULL,
    method TEXT NOT NULL,
    period BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    compute_units BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    PRIMARY KEY (account_id, period, key_id, network, method)
);
INSERT INTO usage_days_by_network
    (account_id, key_id, network, method, period, requests, compute_units, errors)
SELECT account_id, key_id, '', method, period, requests, compute_units, errors
FROM usage_days;
DROP TABLE usage_days;
ALTER TABLE usage_days_by_network RENAME TO usage_days;
-- The operator's page: every account's usage of one day.
CREATE INDEX usage_days_period ON usage_days (period);
