"""A metadata JSON document → the fields chaingate shows (sans-IO).

The ERC-721/ERC-1155 metadata schemas and OpenSea's conventions, read leniently:

* ``name``, ``description`` (numbers become their text); ``image`` — else ``image_url``,
  ``imageUrl``, else ``image_data`` (raw SVG, turned into a ``data:image/svg+xml`` URI);
  ``animation_url``, ``external_url`` (``external_link`` in contract documents), and for
  contract documents (ERC-7572) ``banner_image``.
* ERC-1155: ``{id}`` inside those URLs is substituted like in the URI itself.
* traits from ``attributes`` — a list of ``{trait_type, value}`` (a bare value: trait_type
  ""), or an object ``{type: value}`` — else ``traits``, else ERC-1155 ``properties``.
  **Every value becomes a string**: strings as they are, integers in decimal, JSON decimals
  exactly as written (numbers are read as Decimal, never float: ``1.50`` stays ``"1.50"``),
  booleans ``"true"``/``"false"``, objects and arrays as compact JSON; ``null`` values are
  dropped.

Bounds: name 512 characters, description 10,000, trait type 256, trait value 1,024 (longer
ones cut with "…"), 100 traits, image/animation URLs ``max_url_chars`` (longer ones — huge
inline images — are dropped).  The document itself is bounded by the fetch (max_document_bytes).
"""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

import msgspec

from chaingate.metadata.model import Trait
from chaingate.metadata.uris import substitute_id
from chaingate.printable import unprintable

NAME_MAX = 512
DESCRIPTION_MAX = 10_000
TRAIT_TYPE_MAX = 256
TRAIT_VALUE_MAX = 1024
MAX_TRAITS = 100

_decoder = msgspec.json.Decoder(float_hook=Decimal)
_encoder = msgspec.json.Encoder(decimal_format="number")


class DocumentError(ValueError):
    """The document is not a JSON object we can read."""


class Document(msgspec.Struct, frozen=True, kw_only=True):
    name: str | None = None
    description: str | None = None
    image_url: str | None = None
    animation_url: str | None = None
    external_url: str | None = None
    banner_url: str | None = None
    traits: list[Trait] = []


def _clean(text: str, max_chars: int, *, keep_newlines: bool = False) -> str | None:
    kept = "".join(c for c in text if not unprintable(c) or (keep_newlines and c in "\n\t")).strip()
    if len(kept) > max_chars:
        kept = kept[: max_chars - 1].rstrip() + "…"
    return kept or None


def _decimal_text(value: Decimal) -> str:
    # Plain notation for ordinary exponents; 1e999999 would be a megabyte of zeros.
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and -100 <= exponent <= 100:
        return format(value, "f")
    return str(value)


def _scalar_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            return str(value)
        except ValueError:  # more digits than Python converts
            return None
    if isinstance(value, Decimal):
        return _decimal_text(value)
    if isinstance(value, str):
        return value
    return None


def _text(value: object, max_chars: int, *, keep_newlines: bool = False) -> str | None:
    text = _scalar_text(value)
    return None if text is None else _clean(text, max_chars, keep_newlines=keep_newlines)


def trait_value(value: object) -> str | None:
    """A trait value as a string (None for null: the trait is dropped)."""
    if value is None:
        return None
    if isinstance(value, list | dict):
        text = _encoder.encode(value).decode()
    else:
        scalar = _scalar_text(value)
        if scalar is None:
            return None
        text = scalar
    cleaned = _clean(text, TRAIT_VALUE_MAX)
    return cleaned if cleaned is not None else ""


def _trait(kind: object, value: object) -> Trait | None:
    shown = trait_value(value)
    if shown is None:
        return None
    return Trait(trait_type=_text(kind, TRAIT_TYPE_MAX) or "", value=shown)


def parse_traits(raw: object) -> list[Trait]:
    entries: list[tuple[Any, Any]] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict):
                kind = item.get("trait_type", item.get("type", item.get("name")))
                entries.append((kind, item.get("value")))
            else:
                entries.append(("", item))
    elif isinstance(raw, dict):
        for kind, value in raw.items():
            # ERC-1155 properties may be {"name": ..., "value": ...} objects.
            if isinstance(value, dict) and "value" in value:
                value = value["value"]
            entries.append((kind, value))
    traits: list[Trait] = []
    for kind, value in entries:
        trait = _trait(kind, value)
        if trait is not None:
            traits.append(trait)
            if len(traits) == MAX_TRAITS:
                break
    return traits


def _url(value: object, max_chars: int, token_id: int | None) -> str | None:
    if not isinstance(value, str):
        return None
    url = value.strip()
    if not url or len(url) > max_chars:
        return None
    return substitute_id(url, token_id) if token_id is not None else url


def _first(doc: dict[str, Any], *keys: str) -> object:
    for key in keys:
        value = doc.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def parse_document(body: bytes, *, max_url_chars: int, token_id: int | None = None) -> Document:
    """The fields of a metadata document; ``token_id`` given for ERC-1155 ({id} in URLs)."""
    body = body.removeprefix(b"\xef\xbb\xbf")
    try:
        doc = _decoder.decode(body)
    except (ValueError, RecursionError):  # DecodeError, and ints past 4300 digits
        raise DocumentError("metadata is not JSON") from None
    if not isinstance(doc, dict):
        raise DocumentError("metadata is not a JSON object")
    image = _first(doc, "image", "image_url", "imageUrl")
    if image is None and isinstance(doc.get("image_data"), str):
        svg = doc["image_data"].strip().encode()
        image = "data:image/svg+xml;base64," + base64.b64encode(svg).decode()
    traits_source = next(
        (doc[key] for key in ("attributes", "traits", "properties") if key in doc), None
    )
    return Document(
        name=_text(doc.get("name"), NAME_MAX),
        description=_text(doc.get("description"), DESCRIPTION_MAX, keep_newlines=True),
        image_url=_url(image, max_url_chars, token_id),
        animation_url=_url(doc.get("animation_url"), max_url_chars, token_id),
        external_url=_url(_first(doc, "external_url", "external_link"), max_url_chars, token_id),
        banner_url=_url(_first(doc, "banner_image", "banner_image_url"), max_url_chars, token_id),
        traits=parse_traits(traits_source),
    )
