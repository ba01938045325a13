"""What a server publishes about itself, from a server built here but never started: the
OpenAPI document ``GET /v1/openapi.json`` serves and the families ``GET /metrics`` renders.

It is ``chaingate dev``'s configuration (the shipped ``config/dev.toml``: every subsystem on)
with every optional part switched on too (shared limits through Redis), so that no family an
operator can meet is missing.  Nothing is connected: building the gateway opens no socket.
test_docs_snippets.py checks that the running ``chaingate dev`` publishes the same.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import tomllib
from typing import Any

from chaingate import config
from chaingate.api.openapi import document
from chaingate.gateway import Gateway


@functools.cache
def gateway() -> Gateway:
    data: dict[str, Any] = tomllib.loads((config.default_config_dir() / "dev.toml").read_text())
    data_dir = tempfile.mkdtemp(prefix="chaingate-docsgen-")
    atexit.register(shutil.rmtree, data_dir, ignore_errors=True)
    data["data_dir"] = data_dir
    data.setdefault("auth", {}).update(pepper="docs-" + "p" * 32, redis_url="redis://127.0.0.1:1")
    data.setdefault("observability", {})["admin_token"] = "docs"
    settings = config.from_mapping(data, config_dir=config.default_config_dir(), environ={})
    return Gateway(settings)


def openapi() -> dict[str, Any]:
    return document(gateway().front.rest)


def exposition() -> str:
    return gateway().registry.render().decode()
