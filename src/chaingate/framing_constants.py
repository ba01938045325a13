"""Constants shared by the compiled and the pure framing modules (one source of truth)."""

from __future__ import annotations

# RFC 9110 token characters (method names, header names).
TOKEN_CHARS = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# A chunk-size line (size plus extensions) longer than this is refused.
CHUNK_LINE_MAX = 1024

# A Content-Length body still incomplete with at least this many bytes buffered has them set
# aside, so a large body is copied once, not once per read.
PARTIAL_BODY_MIN = 16384

# Marker for an Expect header other than 100-continue (answered with 417).
EXPECT_OTHER = 2

# States of a client connection in the edge loop (edgeloop: Conn.state).
IDLE, READING, BUSY, WRITING, LINGER, UPGRADED, CLOSED = 0, 1, 2, 3, 4, 5, 6

# Why an admission was refused (fastlane.KeyAdmission, auth.keygate.KeyGate.rejection).
ADMITTED, NO_READ_SCOPE, NO_WRITE_SCOPE, DAY_QUOTA, RATE = 0, 1, 2, 3, 4

# JSON-RPC error codes of refusals on JSON-RPC paths (chaingate.refusals): EIP-1474's "limit
# exceeded" and "resource unavailable".
LIMIT_EXCEEDED = -32005
RESOURCE_UNAVAILABLE = -32002

# JSON nesting deeper than this is refused (protects the scanner's recursion).
MAX_JSON_DEPTH = 128

# Every answer on the API's paths says nosniff: a browser never reads one as another type
# (HTML) than it is labelled, whatever it holds.  The JSON answers the edge writes itself (both
# twins) carry it in their static header bytes: they pay nothing per request for it.
NOSNIFF = b"X-Content-Type-Options: nosniff\r\n"
JSON_HEADERS = b"Content-Type: application/json\r\n" + NOSNIFF

REASONS: dict[int, bytes] = {
    100: b"Continue",
    101: b"Switching Protocols",
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    204: b"No Content",
    301: b"Moved Permanently",
    302: b"Found",
    304: b"Not Modified",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    409: b"Conflict",
    413: b"Content Too Large",
    414: b"URI Too Long",
    415: b"Unsupported Media Type",
    417: b"Expectation Failed",
    422: b"Unprocessable Content",
    426: b"Upgrade Required",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    505: b"HTTP Version Not Supported",
}
