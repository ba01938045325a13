"""What a fetch returns, and the media-type check callers ask for."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    """A complete answer.  Any status is an answer: 4xx/5xx and (for POST) 3xx are returned,
    not raised — webhook delivery records them, the metadata fetcher checks ``ok``."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]  # names lowercased, in the order received
    body: bytes
    url: str  # the URL that answered, after redirects

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)

    @property
    def media_type(self) -> str | None:
        """``type/subtype`` of Content-Type, lowercased, without parameters."""
        return media_type(self.header("content-type"))


def media_type(value: str | None) -> str | None:
    if value is None:
        return None
    kind = value.split(";", 1)[0].strip().lower()
    return kind or None


def media_type_allowed(value: str | None, allowed: tuple[str, ...]) -> bool:
    """Does Content-Type ``value`` match one of ``allowed`` (``type/subtype`` or ``type/*``)?"""
    kind = media_type(value)
    if kind is None:
        return False
    major = kind.split("/", 1)[0]
    return any(entry in (kind, f"{major}/*") for entry in allowed)
