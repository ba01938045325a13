"""Token logos from a token list in the Uniswap format (https://tokenlists.org).

``parse_token_list`` (sans-IO) keeps, for one chain id, each token's ``logoURI`` when it is a
URL a client can load — http(s), or ipfs/ipns/ar (shown through the configured gateways by the
service).  ``data:`` logos and anything else are ignored.  A token without an entry has no
logo (``logo_url`` null), never a guessed one.  ``TokenList`` loads the list from a file or
an http(s) URL (through the outbound fetcher) and reloads it every ``refresh`` seconds; a
failed reload keeps the previous list.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import msgspec
import trio

from chaingate.metadata.uris import UriError, locate
from chaingate.outbound import Fetcher, FetchError, FetchLimits

log = logging.getLogger("chaingate.metadata")

MAX_LIST_BYTES = 16 << 20
MAX_TOKENS = 50_000  # the schema allows 10,000; aggregated lists go beyond
MAX_LOGO_CHARS = 2048
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")


class TokenListError(ValueError):
    """The list is not a token list."""


def parse_token_list(body: bytes, chain_id: int) -> dict[str, str]:
    """Lowercase address → logoURI, for the tokens of ``chain_id``."""
    try:
        data = msgspec.json.decode(body)
    except (ValueError, RecursionError):  # DecodeError, and ints past 4300 digits
        raise TokenListError("token list is not JSON") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        raise TokenListError("token list has no 'tokens' array")
    logos: dict[str, str] = {}
    for entry in tokens[:MAX_TOKENS]:
        if not isinstance(entry, dict) or entry.get("chainId") != chain_id:
            continue
        address, logo = entry.get("address"), entry.get("logoURI")
        if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
            continue
        if not isinstance(logo, str) or not logo or len(logo) > MAX_LOGO_CHARS:
            continue
        if _loadable(logo):
            logos.setdefault(address.lower(), logo.strip())
    return logos


def _loadable(uri: str) -> bool:
    try:
        return locate(uri, max_data_bytes=0).kind != "data"
    except UriError:
        return False


class TokenList:
    """The configured list's logos, reloaded in the background."""

    def __init__(
        self,
        source: str,
        chain_id: int,
        fetcher: Fetcher,
        *,
        refresh: float,
        timeout: float,
    ) -> None:
        self.source = source
        self._path = Path(source).expanduser()  # a file's path, when it is not a URL
        self.chain_id = chain_id
        self.fetcher = fetcher
        self.refresh = refresh
        self.timeout = timeout
        self.logos: dict[str, str] = {}
        self.loaded = False
        self.last_error: str | None = None

    def logo(self, contract: str) -> str | None:
        return self.logos.get(contract.lower())

    async def load(self) -> bool:
        """Read and parse the list once; False (previous list kept) when it failed."""
        try:
            body = await self._read()
            logos = parse_token_list(body, self.chain_id)
        except (OSError, FetchError, TokenListError) as exc:
            self.last_error = f"token list {self._shown()}: {exc}"
            log.warning("token list not loaded", extra={"fields": {"error": self.last_error}})
            return False
        self.logos, self.loaded, self.last_error = logos, True, None
        return True

    async def run(self) -> None:
        while True:
            await self.load()
            await trio.sleep(self.refresh)

    async def _read(self) -> bytes:
        if self.source.startswith(("http://", "https://")):
            limits = FetchLimits(max_bytes=MAX_LIST_BYTES, timeout=self.timeout)
            response = await self.fetcher.get(self.source, limits=limits)
            if not response.ok:
                raise TokenListError(f"HTTP {response.status}")
            return response.body
        path = trio.Path(self._path)
        if (await path.stat()).st_size > MAX_LIST_BYTES:
            raise TokenListError(f"larger than {MAX_LIST_BYTES} bytes")
        return await path.read_bytes()

    def _shown(self) -> str:
        # A URL's path or query may carry an access token: show the origin only.
        if self.source.startswith(("http://", "https://")):
            return self.source.split("/", 3)[2]
        return self.source
