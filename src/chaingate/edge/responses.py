"""Responses the edge writes itself: the Date header and the headers of answers under
/dashboard (the error envelope every layer writes is ``chaingate.envelope``)."""

from __future__ import annotations

import time
from email.utils import formatdate

from chaingate.framing_constants import JSON_HEADERS

JSON = JSON_HEADERS  # with nosniff

# The headers of every answer under /dashboard: a strict Content-Security-Policy (scripts
# and styles from this origin only, no inline script or style), no framing, no sniffing, no
# referrer to other sites (sign-in links carry a token).  Defined here, below the dashboard,
# because the edge writes some answers there itself (a path it refuses); the dashboard's app
# adds them to all the others.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": with it browsers send "Origin: null" on the pages' own forms.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
# A JSON refusal the edge writes under /dashboard: JSON's lines (nosniff among them), the
# rest of the page headers, and no caching.
PAGE_REFUSAL = (
    JSON
    + b"".join(
        f"{name}: {value}\r\n".encode()
        for name, value in PAGE_HEADERS.items()
        if name != "X-Content-Type-Options"
    )
    + b"Cache-Control: no-store\r\n"
)


class DateHeader:
    """The ``Date:`` header line, formatted once per second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line
