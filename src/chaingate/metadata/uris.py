"""Token URIs: ``{id}`` substitution, the schemes metadata lives under, gateway URLs (sans-IO).

* ERC-1155 ``{id}``: replaced by the id as 64 lowercase hex digits, no ``0x`` (EIP-1155).
* ``data:`` (RFC 2397): base64 or percent-encoded; a bare JSON object as a "URI" too.
* ``ipfs://<cid>/<path>`` — also ``ipfs://ipfs/<cid>``, ``/ipfs/<cid>``, a bare CID, and any
  ``http(s)://host/ipfs/<cid>/…`` (content-addressed: every gateway serves the same bytes, so
  it goes through ours, the original URL last); ``ipns://<name>/<path>``.  CIDv0 and v1, each
  checked by decoding (``cid.is_cid``).  Gateway form: ``<gateway>/ipfs/<cid><path>``.
* ``ar://<tx>/<path>``: ``<arweave gateway>/<tx><path>``.
* ``http(s)://``: fetched as is (whitespace and other unsafe characters percent-encoded).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Sequence
from typing import Literal
from urllib.parse import quote, unquote_to_bytes, urlsplit, urlunsplit

from chaingate.metadata.cid import is_cid

UINT256_MAX = (1 << 256) - 1
MAX_URL_CHARS = 8192  # the outbound fetcher's own bound
_SAFE = "/%:@!$&'()*+,;=-._~"  # kept as is in paths and queries; the rest is percent-encoded
_DECIMAL_ID = re.compile(r"[0-9]{1,78}")
_HEX_ID = re.compile(r"0[xX][0-9a-fA-F]{1,64}")
_ARWEAVE_TX = re.compile(r"[A-Za-z0-9_-]{43}")
_IPNS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")

Kind = Literal["data", "ipfs", "ipns", "ar", "http"]


class UriError(ValueError):
    """A URI we cannot use; the message says why without repeating it (it may be huge)."""


def parse_token_id(text: str) -> int:
    """A token id as a client writes it: decimal digits, or 0x-hex (both up to uint256)."""
    if _DECIMAL_ID.fullmatch(text):
        value = int(text)
    elif _HEX_ID.fullmatch(text):
        value = int(text[2:], 16)
    else:
        raise ValueError("a token id is decimal digits or 0x-hex")
    if value > UINT256_MAX:
        raise ValueError("a token id is at most 2**256 - 1")
    return value


def token_id_hex(token_id: int) -> str:
    """64 lowercase hex digits: EIP-1155's ``{id}`` form, and how ids are stored."""
    if not 0 <= token_id <= UINT256_MAX:
        raise ValueError("token id out of uint256 range")
    return f"{token_id:064x}"


def substitute_id(uri: str, token_id: int) -> str:
    """EIP-1155: every ``{id}`` becomes the id as 64 lowercase hex digits."""
    return uri.replace("{id}", token_id_hex(token_id))


@dataclasses.dataclass(frozen=True, slots=True)
class Location:
    """Where a document is.  ``root``: the CID (ipfs), name (ipns) or transaction (ar);
    ``path``: percent-encoded, "" or starting with ``/`` (query included);
    ``url``: the http(s) URL (for ipfs found inside an http URL: that URL, tried last)."""

    kind: Kind
    media_type: str | None = None
    data: bytes | None = None
    root: str | None = None
    path: str = ""
    url: str | None = None


def _encode_path(path: str) -> str:
    return quote(path, safe=_SAFE)


def _split_query(text: str) -> tuple[str, str]:
    text = text.split("#", 1)[0]
    body, sep, query = text.partition("?")
    return body, (f"?{_encode_path(query)}" if sep and query else "")


def _content_path(root_and_path: str) -> tuple[str, str]:
    """``<root>[/path][?query]`` → (root, encoded path with query)."""
    body, query = _split_query(root_and_path)
    root, sep, path = body.partition("/")
    return root, (_encode_path("/" + path) if sep else "") + query


def _ipfs(rest: str, url: str | None = None) -> Location:
    rest = rest.lstrip("/")
    if rest[:5].lower() == "ipfs/":
        rest = rest[5:]
    cid, path = _content_path(rest)
    if not is_cid(cid):
        raise UriError("ipfs URI does not name a valid CID")
    return Location("ipfs", root=cid, path=path, url=url)


def _data(body: str, max_bytes: int) -> Location:
    header, sep, payload = body.partition(",")
    if not sep:
        raise UriError("data: URI without a comma")
    params = [p.strip().lower() for p in header.split(";")]
    media_type = params[0] or "text/plain"
    if len(payload) > 2 * max_bytes:  # before decoding anything: base64 is 4/3, escapes 3/1
        raise UriError(f"data: URI larger than {max_bytes} bytes")
    if "base64" in params[1:]:
        text = payload
        if "%" in text:
            text = unquote_to_bytes(text).decode("ascii", errors="replace")
        text = "".join(text.split())
        text += "=" * (-len(text) % 4)
        try:
            altchars = b"-_" if ("-" in text or "_" in text) else None
            data = base64.b64decode(text, altchars=altchars, validate=True)
        except (binascii.Error, ValueError):
            raise UriError("data: URI is not valid base64") from None
    else:
        data = unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise UriError(f"data: URI larger than {max_bytes} bytes")
    return Location("data", media_type=media_type, data=data)


def _http(uri: str) -> Location:
    try:
        parts = urlsplit(uri.strip())
    except ValueError:
        raise UriError("http URI does not parse") from None
    if not parts.netloc:
        raise UriError("http URI has no host")
    url = urlunsplit(
        (
            parts.scheme.lower(),
            parts.netloc,
            _encode_path(parts.path or "/"),
            _encode_path(parts.query),
            "",
        )
    )
    if len(url) > MAX_URL_CHARS:
        raise UriError(f"URL longer than {MAX_URL_CHARS} characters")
    segments = parts.path.split("/")
    if len(segments) > 2 and segments[1] == "ipfs" and is_cid(segments[2]):
        rest = "/".join(segments[2:]) + (f"?{parts.query}" if parts.query else "")
        return _ipfs(rest, url=url)
    return Location("http", url=url)


def locate(uri: str, *, max_data_bytes: int) -> Location:
    """Where ``uri`` points; UriError for a scheme or form we do not fetch."""
    uri = uri.strip()
    if not uri:
        raise UriError("empty URI")
    lower = uri[:8].lower()
    if lower.startswith("data:"):
        return _data(uri[5:], max_data_bytes)
    if uri.startswith("{"):  # some contracts return the JSON itself
        if len(uri) > max_data_bytes:
            raise UriError(f"inline document larger than {max_data_bytes} bytes")
        return Location("data", media_type="application/json", data=uri.encode())
    if len(uri) > MAX_URL_CHARS:
        raise UriError(f"URI longer than {MAX_URL_CHARS} characters")
    if lower.startswith("ipfs://"):
        return _ipfs(uri[7:])
    if lower.startswith("ipfs:/"):
        return _ipfs(uri[6:])
    if uri.startswith("/ipfs/"):
        return _ipfs(uri[6:])
    if lower.startswith("ipns://"):
        name, path = _content_path(uri[7:].lstrip("/"))
        if not _IPNS_NAME.fullmatch(name):
            raise UriError("ipns URI does not name a key or domain")
        return Location("ipns", root=name, path=path)
    if lower.startswith("ar://"):
        tx, path = _content_path(uri[5:])
        if not _ARWEAVE_TX.fullmatch(tx):
            raise UriError("ar URI does not name an Arweave transaction")
        return Location("ar", root=tx, path=path)
    if lower.startswith(("http://", "https://")):
        return _http(uri)
    if is_cid(uri.split("/", 1)[0]):
        return _ipfs(uri)
    raise UriError("unsupported URI scheme (data:, ipfs://, ipns://, ar://, http(s):// only)")


def _base(gateway: str) -> str:
    return gateway.rstrip("/")


def gateway_url(location: Location, gateway: str) -> str:
    """An ipfs/ipns location through one gateway (path form)."""
    assert location.root is not None
    return f"{_base(gateway)}/{location.kind}/{location.root}{location.path}"


def fetch_urls(location: Location, ipfs_gateways: Sequence[str], arweave_gateway: str) -> list[str]:
    """The URLs to try for a location, in order (none for data:)."""
    if location.kind in ("ipfs", "ipns"):
        urls = [gateway_url(location, gateway) for gateway in ipfs_gateways]
        if location.url is not None and location.url not in urls:
            urls.append(location.url)
        return urls
    if location.kind == "ar":
        return [f"{_base(arweave_gateway)}/{location.root}{location.path}"]
    if location.kind == "http":
        assert location.url is not None
        return [location.url]
    return []


def public_url(
    uri: str | None, *, ipfs_gateway: str, arweave_gateway: str, max_chars: int
) -> str | None:
    """The HTTP form a client can load (``image_gateway_url``); data: URIs are their own
    form (browsers load them); None for what has no such form."""
    if not uri:
        return None
    try:
        location = locate(uri, max_data_bytes=max_chars)
    except UriError:
        return None
    if location.kind == "data":
        return (
            uri.strip() if len(uri) <= max_chars and uri.lstrip()[:5].lower() == "data:" else None
        )
    if location.kind in ("ipfs", "ipns"):
        return gateway_url(location, ipfs_gateway) if ipfs_gateway else location.url
    if location.kind == "ar":
        return f"{_base(arweave_gateway)}/{location.root}{location.path}"
    return location.url


def shown_uri(uri: str, max_chars: int = 2048) -> str:
    """A URI as stored and shown: data: URIs by media type and size only (they can be
    megabytes and say nothing a client needs), others bounded."""
    uri = uri.strip()
    if uri[:5].lower() == "data:":
        header = uri[5:].split(",", 1)[0][:100]
        return f"data:{header},… ({len(uri)} characters)"
    return uri if len(uri) <= max_chars else uri[:max_chars] + "…"
