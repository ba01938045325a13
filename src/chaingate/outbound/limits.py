"""Per-call limits of an outbound fetch."""

from __future__ import annotations

import dataclasses

MAX_REDIRECTS = 3  # the ceiling callers may lower, never raise
DEFAULT_MAX_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class FetchLimits:
    """Bounds on one fetch.

    ``timeout`` covers everything — resolution, connects, TLS, every redirect, the last body
    byte — so a server trickling its answer is cut there.  ``connect_timeout`` bounds each
    connection attempt (TLS handshake included); the next allowed address is tried after it.
    ``max_bytes`` bounds the body after decompression.  ``content_types``: media types a 2xx
    answer may have (``"application/json"``, ``"image/*"``); None accepts any.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    timeout: float = 10.0
    connect_timeout: float = 3.0
    content_types: tuple[str, ...] | None = None
    max_redirects: int = MAX_REDIRECTS
    max_header_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if not 0 <= self.max_redirects <= MAX_REDIRECTS:
            raise ValueError(f"max_redirects must be between 0 and {MAX_REDIRECTS}")
        if self.max_bytes < 0 or self.max_header_bytes <= 0:
            raise ValueError("byte limits must be positive")
        if self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.content_types is not None:
            lowered = tuple(kind.strip().lower() for kind in self.content_types)
            object.__setattr__(self, "content_types", lowered)
