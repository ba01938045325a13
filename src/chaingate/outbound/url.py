"""URLs an outbound request may be made to (sans-IO).

Strict on purpose: only http and https, no userinfo (credentials in URLs end up in logs, and
``http://good.example@evil.example/`` tricks people), no whitespace, control characters or
backslashes (parsers disagree about them), no IPv6 zone ids, and no numeric host names other
than dotted-quad IPv4 (``http://2130706433/`` or ``http://0x7f.1/`` are 127.0.0.1 to some
resolvers).  Everything refused raises FetchError(BAD_URL) with a message that does not
repeat the URL.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from urllib.parse import quote, urljoin, urlsplit

from chaingate.outbound.errors import FetchError, Reason
from chaingate.outbound.policy import IPAddress

MAX_URL_LENGTH = 8192
DEFAULT_PORTS = {"http": 80, "https": 443}

_FORBIDDEN = re.compile(r"[\x00-\x20\x7f\\]")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")
# Characters left as they are in a request target; everything else is percent-encoded.
_TARGET_SAFE = "/?[]@!$&'()*+,;=%:-._~"


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """One parsed, validated URL: where to connect and what to ask for."""

    scheme: str
    host: str  # lowercase ASCII (IDNA) name, or an IP literal without brackets
    ip: IPAddress | None  # set when the URL names an address rather than a host name
    port: int
    path: str  # origin-form request target: path and query, never empty

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def authority(self) -> str:
        """``host[:port]`` as the Host header wants it (IPv6 literals in brackets)."""
        host = f"[{self.host}]" if self.ip is not None and self.ip.version == 6 else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def origin(self) -> str:
        """What error messages may show: no path or query (they may hold secrets)."""
        return f"{self.scheme}://{self.authority}"

    @property
    def url(self) -> str:
        return self.origin + self.path

    def same_origin(self, other: Target) -> bool:
        return (self.scheme, self.host, self.port) == (other.scheme, other.host, other.port)


def _bad(message: str) -> FetchError:
    return FetchError(Reason.BAD_URL, message)


def _host_name(raw: str) -> str:
    try:
        name = raw.encode("idna").decode("ascii")
    except UnicodeError:
        raise _bad("the host name is not a valid internationalised name") from None
    name = name.lower().removesuffix(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _bad("the host name is not a valid DNS name")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        raise _bad("numeric host names other than dotted-quad IPv4 are ambiguous")
    return name


def parse_url(url: str) -> Target:
    if len(url) > MAX_URL_LENGTH:
        raise _bad(f"URL longer than {MAX_URL_LENGTH} characters")
    if _FORBIDDEN.search(url):
        raise _bad("URL contains whitespace, control characters or a backslash")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _bad("URL has an invalid authority or port") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise _bad("only http and https URLs may be fetched")
    if "@" in parts.netloc:
        raise _bad("URLs with userinfo (credentials) are refused")
    raw_host = parts.hostname or ""
    if not raw_host:
        raise _bad("URL has no host")
    ip: IPAddress | None = None
    if parts.netloc.startswith("["):
        if "%" in raw_host:
            raise _bad("IPv6 zone identifiers are refused")
        try:
            ip = ipaddress.IPv6Address(raw_host)
        except ValueError:
            raise _bad("bracketed host is not an IPv6 address") from None
        host = ip.compressed
    else:
        try:
            ip = ipaddress.IPv4Address(raw_host)
            host = str(ip)
        except ValueError:
            host = _host_name(raw_host)
    if port == 0:
        raise _bad("port 0 is not a destination")
    path = quote(parts.path or "/", safe=_TARGET_SAFE)
    if not path.startswith("/"):
        path = "/" + path
    if parts.query:
        path += "?" + quote(parts.query, safe=_TARGET_SAFE)
    return Target(scheme, host, ip, port or DEFAULT_PORTS[scheme], path)


def follow_redirect(current: Target, location: str) -> Target:
    """The target a ``Location`` header (absolute or relative) points to from ``current``."""
    if len(location) > MAX_URL_LENGTH or _FORBIDDEN.search(location):
        raise _bad("redirect Location is not a valid URL")
    return parse_url(urljoin(current.url, location))
