-- One-time messages shown after a redirect (a new API key): encrypted with a key derived
-- from the session's cookie token (the row alone reveals nothing), read once, short-lived.
CREATE TABLE dashboard_flashes (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    body TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
