"""The one exception type of the outbound fetcher, with a machine-readable reason."""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    BAD_URL = "bad_url"  # not http(s), userinfo, unparsable host or port, port not allowed
    BLOCKED_ADDRESS = "blocked_address"  # the name or an address it resolves to is refused
    RESOLVE_FAILED = "resolve_failed"  # the name does not resolve
    CONNECT_FAILED = "connect_failed"  # no allowed address accepted a connection in time
    TLS = "tls"  # handshake or certificate verification failed
    TIMEOUT = "timeout"  # the whole fetch (every redirect included) missed its deadline
    TOO_LARGE = "too_large"  # the body (inflated, if compressed) passed max_bytes
    BAD_CONTENT_TYPE = "bad_content_type"  # a 2xx answer of a media type the caller refused
    TOO_MANY_REDIRECTS = "too_many_redirects"
    HTTP_ERROR = "http_error"  # invalid HTTP, connection lost mid-answer, unknown encoding


class FetchError(Exception):
    """Why an outbound fetch failed.

    ``message`` names at most the origin (scheme, host, port) it was talking to: paths, query
    strings and userinfo may carry credentials (webhook URLs often embed a secret in the path),
    so they never appear in it.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
