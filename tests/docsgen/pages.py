"""Which generated page comes from where."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.docsgen import (
    cli,
    configuration,
    errors,
    published,
    server,
    tables,
    webhooks,
    websocket,
)

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"

# Every generated page -> its generator.
PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration.render,
    "cli.md": cli.render,
    "methods.md": tables.methods,
    "plans.md": tables.plans,
    "errors.md": errors.render,
    "webhooks.md": webhooks.render,
    "websocket.md": websocket.render,
    "rest.md": lambda: published.rest(server.openapi()),
    "openapi.json": lambda: published.openapi_json(server.openapi()),
    "metrics.md": lambda: published.metrics(server.exposition()),
}


def stale(pages: dict[str, str]) -> list[str]:
    """The pages whose file differs from what was generated."""
    return [
        name
        for name, text in pages.items()
        if not (REFERENCE / name).is_file() or (REFERENCE / name).read_text() != text
    ]


def write(pages: dict[str, str]) -> None:
    for name, text in pages.items():
        (REFERENCE / name).write_text(text)
