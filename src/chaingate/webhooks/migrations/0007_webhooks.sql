-- Webhooks (chaingate.webhooks): subscriptions, the matcher's cursor per network, the durable
-- outbox of events, every delivery attempt, and the daily delivery quota.  Addresses and
-- hashes 0x + lowercase hex; timestamps epoch milliseconds.

CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,              -- wh_...
    account_id TEXT NOT NULL,
    url TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    chain_label TEXT NOT NULL,        -- the chain as the client named it
    event_type TEXT NOT NULL,         -- as the deployment's variant names it
    config TEXT NOT NULL,             -- JSON, normalised (chaingate.webhooks.filters)
    confirmations INTEGER NOT NULL,   -- deliver once the block is this deep (0: at once)
    status TEXT NOT NULL,             -- active | paused | disabled
    status_reason TEXT,               -- why the service paused or disabled it (NULL: the owner)
    -- HMAC keys: they sign, so they are kept as given (an API key is only ever compared and
    -- is hashed; a signing secret must be readable to sign with).
    secret TEXT NOT NULL,             -- whsec_...
    previous_secret TEXT,             -- after a rotation, until previous_secret_until
    previous_secret_until BIGINT,
    sequence BIGINT NOT NULL,         -- the last per-webhook event sequence number given
    matched_from BIGINT,              -- the first block matched with the current config
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX webhooks_account ON webhooks (account_id, created_at);
CREATE INDEX webhooks_network ON webhooks (chain, network);

-- Where each network's matcher is, and the version of the network's webhook set it matched
-- with: a change to the set bumps it, and the matcher's commit for a block succeeds only
-- with the version it matched under (else it re-matches), so an address added by PATCH is
-- matched from the block the PATCH answered with.
CREATE TABLE webhook_cursors (
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    block_number BIGINT,
    block_hash TEXT,
    filters_version BIGINT NOT NULL,
    PRIMARY KEY (chain, network)
);

-- The outbox: one row per event per webhook, written in the matcher's transaction.
CREATE TABLE webhook_events (
    id TEXT PRIMARY KEY,              -- evt_...: derived from what matched, stable
    webhook_id TEXT NOT NULL,
    account_id TEXT NOT NULL,
    chain TEXT NOT NULL,
    network TEXT NOT NULL,
    sequence BIGINT NOT NULL,         -- per webhook, in the order events were written
    event_type TEXT NOT NULL,
    block_number BIGINT,              -- NULL: not from a block (a ping, a pending transaction)
    block_hash TEXT,
    deliver_at_block BIGINT,          -- held until the network's matcher has reached it
    original_id TEXT,                 -- a compensating event: the event it takes back
    body TEXT NOT NULL,               -- exactly the bytes every attempt sends
    state TEXT NOT NULL,              -- pending | delivered | failed | cancelled
    attempts INTEGER NOT NULL,        -- every attempt so far
    retries INTEGER NOT NULL,         -- failed attempts of the current round (a replay resets)
    next_attempt_at BIGINT NOT NULL,
    lease_until BIGINT NOT NULL,      -- a delivery worker holds it until then
    created_at BIGINT NOT NULL,
    finished_at BIGINT,
    last_status INTEGER,
    last_error TEXT
);
CREATE INDEX webhook_events_due ON webhook_events (state, next_attempt_at, sequence);
CREATE INDEX webhook_events_webhook ON webhook_events (webhook_id, sequence);
CREATE INDEX webhook_events_block ON webhook_events (chain, network, block_hash);
CREATE INDEX webhook_events_original ON webhook_events (original_id);

CREATE TABLE webhook_attempts (
    event_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    webhook_id TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    url TEXT NOT NULL,
    request_headers TEXT NOT NULL,    -- JSON [[name, value], ...]
    status INTEGER,                   -- NULL: no HTTP answer (error says why)
    response_body TEXT,               -- the first KiB
    latency_ms INTEGER NOT NULL,
    error TEXT,
    PRIMARY KEY (event_id, attempt)
);
CREATE INDEX webhook_attempts_webhook ON webhook_attempts (webhook_id, started_at);

CREATE TABLE webhook_quota (
    account_id TEXT NOT NULL,
    day BIGINT NOT NULL,              -- days since the epoch (UTC)
    deliveries BIGINT NOT NULL,
    PRIMARY KEY (account_id, day)
);
