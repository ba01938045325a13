"""One metadata document, start to end: the URI from the contract, the bytes, the fields.

For a token: ``tokenURI(id)`` (ERC-721) or ``uri(id)`` (ERC-1155, ``{id}`` substituted); when
the contract's standard is unknown (no ERC-165, no hint) both are asked in one batch and the
first that answers wins.  For a contract's own document (token id ''): ``contractURI()``
(ERC-7572).  An empty URI, or a contract without ``contractURI``, is a success with no
document.  Everything else that goes wrong raises ``Unavailable`` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.metadata.documents import DocumentSource, DocumentUnavailable
from chaingate.metadata.model import Standard, Trait
from chaingate.metadata.multicall import Call, Multicall, Result
from chaingate.metadata.nft import Document, DocumentError, parse_document
from chaingate.metadata.refresher import Unavailable
from chaingate.metadata.store import NftRow
from chaingate.metadata.tokencache import TokenCache
from chaingate.metadata.uris import shown_uri, substitute_id
from chaingate.rpc.errors import UpstreamError

_traits_encoder = msgspec.json.Encoder()
# How long a document fetch waits for the contract's standard (a probe is one batch).
STANDARD_WAIT = 20.0


def encode_traits(traits: list[Trait]) -> str:
    return _traits_encoder.encode(traits).decode()


def decode_traits(text: str | None) -> list[Trait]:
    if not text:
        return []
    try:
        return msgspec.json.decode(text, type=list[Trait])
    except msgspec.DecodeError:
        return []


def decode_uri(result: Result, max_bytes: int) -> str | None:
    """A string answer as text (None: reverted or not a string)."""
    if not result.ok or len(result.data) < 64:
        return None
    try:
        (raw,) = abi.decode(["bytes"], result.data)
    except ValueError:
        return None
    if len(raw) > max_bytes:
        raise Unavailable(f"URI longer than {max_bytes} bytes")
    return bytes(raw).decode("utf-8", errors="replace").strip()


class NftFetcher:
    def __init__(
        self,
        multicall: Callable[[], Multicall],
        tokens: TokenCache,
        documents: DocumentSource,
        *,
        max_url_chars: int,
    ) -> None:
        self._multicall = multicall
        self.tokens = tokens
        self.documents = documents
        self.max_url_chars = max_url_chars

    async def fetch(self, row: NftRow) -> NftRow:
        facts = (await self.tokens.get([row.contract], wait=STANDARD_WAIT))[row.contract]
        standard = facts.standard if facts.status == "ok" else None
        if row.token_id == "":
            return await self._contract_document(row, standard)
        token_id = int(row.token_id, 16)
        uri, standard = await self._token_uri(row.contract, token_id, standard)
        empty = msgspec.structs.replace(
            row,
            standard=standard,
            token_uri=None,
            name=None,
            description=None,
            image_url=None,
            animation_url=None,
            external_url=None,
            banner_url=None,
            traits=None,
        )
        if not uri:
            return empty
        if standard == "ERC1155":
            uri = substitute_id(uri, token_id)
        document = await self._document(uri, token_id if standard == "ERC1155" else None)
        return msgspec.structs.replace(
            empty,
            token_uri=shown_uri(uri),
            name=document.name,
            description=document.description,
            image_url=document.image_url,
            animation_url=document.animation_url,
            external_url=document.external_url,
            traits=encode_traits(document.traits) if document.traits else None,
        )

    async def _calls(self, calls: list[Call]) -> list[Result]:
        try:
            return await self._multicall().run(calls)
        except (UpstreamError, RpcCallError) as exc:
            raise Unavailable(f"node unreachable: {exc}") from None

    async def _token_uri(
        self, contract: str, token_id: int, standard: Standard | None
    ) -> tuple[str | None, Standard | None]:
        asks: list[tuple[Standard, bytes]] = []
        if standard != "ERC1155":
            asks.append(("ERC721", abi.encode_call("tokenURI(uint256)", token_id)))
        if standard != "ERC721":
            asks.append(("ERC1155", abi.encode_call("uri(uint256)", token_id)))
        results = await self._calls([Call(contract, data) for _, data in asks])
        limit = self.documents.max_bytes * 2
        for (kind, _), result in zip(asks, results, strict=True):
            uri = decode_uri(result, limit)
            if uri is not None:
                # The function that answered tells the standard unless the facts name an NFT
                # standard already (an ERC-20 guess must not skip the {id} substitution).
                return uri, standard if standard in ("ERC721", "ERC1155") else kind
        names = " / ".join("tokenURI" if kind == "ERC721" else "uri" for kind, _ in asks)
        raise Unavailable(f"{names} reverted or answered no string (does the token exist?)")

    async def _document(self, uri: str, token_id: int | None) -> Document:
        try:
            body = await self.documents.fetch(uri)
        except DocumentUnavailable as exc:
            raise Unavailable(str(exc)) from None
        try:
            return parse_document(body, max_url_chars=self.max_url_chars, token_id=token_id)
        except DocumentError as exc:
            raise Unavailable(str(exc)) from None

    async def _contract_document(self, row: NftRow, standard: Standard | None) -> NftRow:
        (result,) = await self._calls([Call(row.contract, abi.encode_call("contractURI()"))])
        uri = decode_uri(result, self.documents.max_bytes * 2)
        base = msgspec.structs.replace(row, standard=standard, token_uri=None)
        if not uri:  # no contractURI(): nothing more to know, and nothing failed
            return base
        document = await self._document(uri, None)
        return msgspec.structs.replace(
            base,
            token_uri=shown_uri(uri),
            name=document.name,
            description=document.description,
            image_url=document.image_url,
            external_url=document.external_url,
            banner_url=document.banner_url,
        )
