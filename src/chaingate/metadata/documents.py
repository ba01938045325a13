"""Getting a metadata document's bytes from its URI, through the SSRF-safe fetcher.

``data:`` URIs are decoded in place.  IPFS/IPNS go to each configured gateway in turn, each
attempt bounded by ``gateway_timeout``: a gateway that fails, answers non-2xx or hangs costs
one timeout, then the next is asked (an ``http(s)://…/ipfs/<cid>`` URL's own host last).
Arweave goes to its gateway, http(s) to its server, bounded by ``fetch_timeout``.  Every
answer is bounded by ``max_bytes``.  Error messages name origins only, never paths (gateway
URLs may carry access tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from chaingate.metadata.uris import UriError, fetch_urls, locate
from chaingate.outbound import Fetcher, FetchError, FetchLimits

ACCEPT = "application/json, text/plain;q=0.9, */*;q=0.5"
MAX_ERROR_CHARS = 600


class DocumentUnavailable(Exception):
    """No document: why, for ``last_error``."""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")


class DocumentSource:
    def __init__(
        self,
        fetcher: Fetcher,
        *,
        ipfs_gateways: Sequence[str],
        arweave_gateway: str,
        gateway_timeout: float,
        fetch_timeout: float,
        max_bytes: int,
    ) -> None:
        self.fetcher = fetcher
        self.ipfs_gateways = list(ipfs_gateways)
        self.arweave_gateway = arweave_gateway
        self.gateway_timeout = gateway_timeout
        self.fetch_timeout = fetch_timeout
        self.max_bytes = max_bytes

    async def fetch(self, uri: str) -> bytes:
        """The document's bytes; DocumentUnavailable when every way to get them failed."""
        try:
            location = locate(uri, max_data_bytes=self.max_bytes)
        except UriError as exc:
            raise DocumentUnavailable(str(exc)) from None
        if location.kind == "data":
            assert location.data is not None
            return location.data
        timeout = self.fetch_timeout if location.kind == "http" else self.gateway_timeout
        limits = FetchLimits(
            max_bytes=self.max_bytes, timeout=timeout, connect_timeout=min(3.0, timeout)
        )
        failures: list[str] = []
        for url in fetch_urls(location, self.ipfs_gateways, self.arweave_gateway):
            try:
                response = await self.fetcher.get(url, headers={"Accept": ACCEPT}, limits=limits)
            except FetchError as exc:
                failures.append(str(exc))
                continue
            if response.ok:
                return response.body
            failures.append(f"{_origin(url)}: HTTP {response.status}")
        if not failures:
            raise DocumentUnavailable("no gateway configured for this URI")
        message = "; ".join(failures)
        if len(message) > MAX_ERROR_CHARS:
            message = message[: MAX_ERROR_CHARS - 1] + "…"
        raise DocumentUnavailable(message)
