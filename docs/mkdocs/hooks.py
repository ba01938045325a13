"""MkDocs hooks of chaingate's site (``mkdocs.yml``, ``hooks:``).

* Every decision record (``docs/decisions/*.md``) is in the menu, under "Decisions", without
  listing them by hand: a new subsystem's file is never an orphan page.
* Nothing is fetched from another host: a built page that loads a script, a stylesheet, a
  font, an image or a frame from ``http(s)://`` or ``//`` is a warning, which ``--strict``
  makes an error (the site works offline, from ``file://``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.chaingate")

DECISIONS = "decisions"
# An attribute that makes the browser fetch something, pointing off the site.
_REMOTE = re.compile(
    r"""<(script|link|img|iframe|source|video|audio)\b[^>]*?\b(src|href)\s*=\s*["']?"""
    r"""((?:https?:)?//[^"'\s>]+)""",
    re.IGNORECASE,
)
_CSS_REMOTE = re.compile(r"""(?:@import|url\()\s*["']?((?:https?:)?//[^"')\s]+)""", re.IGNORECASE)
# A <link> that only names a page (rel="canonical", alternate, next...) fetches nothing.
_FETCHING_RELS = ("stylesheet", "preload", "prefetch", "preconnect", "dns-prefetch", "icon")


def on_config(config: Any) -> Any:
    """Fill the "Decisions" menu with every decision record, its index page first."""
    docs = Path(config["docs_dir"])
    records = sorted(p.relative_to(docs).as_posix() for p in (docs / DECISIONS).glob("*.md"))
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Decisions" in entry:
            listed = [item for item in entry["Decisions"] if isinstance(item, str)]
            entry["Decisions"] = listed + [r for r in records if r not in listed]
    return config


def _fetches(tag: str) -> bool:
    if not tag.lower().startswith("<link"):
        return True
    rel = re.search(r"""\brel\s*=\s*["']?([^"'>]+)""", tag, re.IGNORECASE)
    return rel is not None and any(word in rel.group(1).lower() for word in _FETCHING_RELS)


def remote_resources(html: str) -> list[str]:
    """The off-site URLs a page would make the browser fetch."""
    found = []
    for match in _REMOTE.finditer(html):
        tag = html[match.start() : html.find(">", match.start()) + 1]
        if _fetches(tag):
            found.append(match.group(3))
    found.extend(m.group(1) for m in _CSS_REMOTE.finditer(html))
    return found


def on_post_page(output: str, page: Any, config: Any) -> str:
    for url in remote_resources(output):
        log.warning(
            "%s loads %s from another host: the site must work offline", page.file.src_uri, url
        )
    return output


def on_post_build(config: Any) -> None:
    """The theme's own stylesheets and scripts: no @import or url() off the site either."""
    site = Path(config["site_dir"])
    for path in [*site.rglob("*.css"), *site.rglob("*.js")]:
        if path.suffix == ".css":
            for url in _CSS_REMOTE.findall(path.read_text(errors="replace")):
                log.warning("%s loads %s from another host", path.relative_to(site), url)
