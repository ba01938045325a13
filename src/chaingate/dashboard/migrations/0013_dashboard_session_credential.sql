-- An admin-token session keeps an HMAC fingerprint of the token that opened it, checked on
-- every load: rotating the token ends those sessions ('' for password and link sessions).
ALTER TABLE dashboard_sessions ADD COLUMN credential TEXT NOT NULL DEFAULT '';
