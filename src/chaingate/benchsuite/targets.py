"""Targets named on the command line: ``--target [NAME=]URL``, and how a URL is shown.

A key may sit in a URL's path (chaingate's ``/v1/rpc/{chain}/{network}/{key}``, most
providers' ``/v2/{key}``) or its query: reports and logs show URLs with it masked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,40}$")
# A path segment that looks like a credential: long and made of token characters.
_SECRETISH = re.compile(r"^[A-Za-z0-9_-]{20,}$")
_KEY_PARAMS = re.compile(r"(?i)((?:api[_-]?)?key|token|secret)=[^&]*")


class TargetError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    name: str
    url: str

    @property
    def shown(self) -> str:
        return mask(self.url)


def mask(url: str) -> str:
    parts = urlsplit(url)
    segments = [s[:4] + "…" if _SECRETISH.match(s) else s for s in parts.path.split("/")]
    query = _KEY_PARAMS.sub(lambda m: m.group(1) + "=…", parts.query)
    netloc = parts.netloc.rsplit("@", 1)[-1]  # user:password@ never shown
    return urlunsplit((parts.scheme, netloc, "/".join(segments), query, ""))


def parse_targets(specs: list[str], schemes: tuple[str, ...] = ("http", "https")) -> list[Target]:
    if not specs:
        raise TargetError("at least one --target URL is needed")
    targets: list[Target] = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = "", spec
        parts = urlsplit(url)
        if parts.scheme not in schemes or not parts.hostname:
            raise TargetError(f"--target {mask(url)!r}: expected a {'/'.join(schemes)} URL")
        if name and not _NAME.match(name):
            raise TargetError(f"--target name {name!r}: letters, digits, _ . : - (at most 40)")
        targets.append(Target(name or f"{parts.hostname}:{parts.port or ''}".rstrip(":"), url))
    names = [t.name for t in targets]
    for index, target in enumerate(targets):
        if names.count(target.name) > 1:  # the same host twice: tell them apart by position
            targets[index] = Target(f"{target.name}#{index + 1}", target.url)
    return targets
