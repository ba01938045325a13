"""REST routes, defined once: what the edge admits, what the app dispatches, what OpenAPI says.

A resource module declares each endpoint with ``RestApi.route`` — method, path template,
scope, the Structs its path, query and body decode into, the Struct it answers with — and
writes the handler as a function of one typed ``Call``.  From that one declaration:

* the edge finds the route of a request (``match``) to check its scope and charge its compute
  units before the app sees it (``chaingate.edge.routes``);
* the app decodes the inputs, calls the handler and encodes the answer (``chaingate.api.app``);
* the OpenAPI document is generated (``chaingate.api.openapi``).

Path templates use ``{name}`` for one path segment.  A literal segment shadows a parameter
in the same place, whatever the method: ``{address}`` in ``GET /v1/wallets/{address}`` never
binds ``create`` (``POST /v1/wallets/create``), so ``GET /v1/wallets/create`` is a 405 with
``Allow: POST`` rather than a lookup of a wallet called "create".
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from chaingate.auth.gate import Principal

P = TypeVar("P")
Q = TypeVar("Q")
B = TypeVar("B")

_PARAM = re.compile(r"^\{([a-z_][a-z0-9_]*)\}$")

# Access levels besides a scope name: no key at all, or any valid key.
PUBLIC = "public"
ANY_KEY = "any"


class NoInput(msgspec.Struct, forbid_unknown_fields=True):
    """A request part that takes nothing (unknown query parameters are refused)."""


@dataclass
class Call(Generic[P, Q, B]):
    """One decoded request, as a handler sees it."""

    path: P
    query: Q
    body: B
    principal: Principal | None  # None on public routes


Handler = Callable[[Call[Any, Any, Any]], Awaitable[Any]]


@dataclass
class Route:
    method: str
    path: str
    name: str
    summary: str
    access: str  # a scope, ANY_KEY or PUBLIC
    handler: Handler
    path_type: type[msgspec.Struct] = NoInput
    query_type: type[msgspec.Struct] = NoInput
    body_type: type[msgspec.Struct] | None = None
    response_type: object = None
    status: int = 200
    errors: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    description: str = ""
    # Statuses answered with a body other than the error envelope (health's 503).
    other_responses: Mapping[int, Any] = field(default_factory=dict)
    # How long the edge may serve the same 200 answer again (0: never; see edge/restcache.py).
    cache_seconds: float = 0.0
    # Compute units of one call (from config/rest.toml; see RestApi.price).
    cu: int = 0
    # Each path segment: a literal ("v1") or a parameter ("{chain}" -> Param("chain")).
    segments: tuple[str | Param, ...] = field(default=(), repr=False)

    @property
    def key(self) -> str:
        """``"GET /v1/tokens/{chain}/balances/{address}"``: its name in config/rest.toml and
        in usage records."""
        return f"{self.method} {self.path}"

    @property
    def public(self) -> bool:
        return self.access == PUBLIC

    @property
    def scope(self) -> str | None:
        """The scope the edge requires (None: any valid key, or none on a public route)."""
        return None if self.access in (PUBLIC, ANY_KEY) else self.access


class RouteMatch(msgspec.Struct, frozen=True):
    route: Route
    params: dict[str, str]


class PricingError(ValueError):
    """config/rest.toml does not price every route, or prices one that does not exist."""


class RestApi:
    """The REST routes of one deployment (the same set everywhere: the OpenAPI document does
    not depend on configuration)."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._by_length: dict[int, list[Route]] = {}

    def route(
        self,
        method: str,
        path: str,
        *,
        name: str,
        summary: str,
        access: str,
        response: object,
        path_params: type[msgspec.Struct] = NoInput,
        query: type[msgspec.Struct] = NoInput,
        body: type[msgspec.Struct] | None = None,
        status: int = 200,
        errors: tuple[int, ...] = (),
        tags: tuple[str, ...] = (),
        description: str = "",
        other_responses: Mapping[int, Any] | None = None,
        cache_seconds: float = 0.0,
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            segments = tuple(_segment(part) for part in path.strip("/").split("/"))
            names = [s.name for s in segments if isinstance(s, Param)]
            fields = [f.name for f in msgspec.structs.fields(path_params)]
            if sorted(names) != sorted(fields):
                raise ValueError(f"{method} {path}: path parameters {names} != {fields}")
            route = Route(
                method=method,
                path=path,
                name=name,
                summary=summary,
                access=access,
                handler=handler,
                path_type=path_params,
                query_type=query,
                body_type=body,
                response_type=response,
                status=status,
                errors=errors,
                tags=tags,
                description=description,
                other_responses=dict(other_responses or {}),
                cache_seconds=cache_seconds,
                segments=segments,
            )
            if any(r.key == route.key for r in self.routes):
                raise ValueError(f"route defined twice: {route.key}")
            self.routes.append(route)
            self._by_length.setdefault(len(segments), []).append(route)
            return handler

        return register

    def shadowed(self, route: Route, index: int) -> frozenset[str]:
        """Literals other routes hold at ``index`` of a path shaped like ``route``'s up to it:
        what its parameter there must not bind."""
        head = route.segments[:index]
        found = set()
        for other in self._by_length.get(len(route.segments), ()):
            segment = other.segments[index]
            if isinstance(segment, str) and _same_shape(other.segments[:index], head):
                found.add(segment)
        return frozenset(found)

    def quart_rule(self, route: Route) -> str:
        """The route's werkzeug rule, each parameter kept off the literals that shadow it
        (the ``not`` converter, registered by the app)."""
        parts = []
        for index, segment in enumerate(route.segments):
            if isinstance(segment, str):
                parts.append(segment)
                continue
            shadows = self.shadowed(route, index)
            if shadows:
                parts.append(f"<not({', '.join(repr(s) for s in sorted(shadows))}):{segment.name}>")
            else:
                parts.append(f"<{segment.name}>")
        return "/" + "/".join(parts)

    def match(self, method: bytes | str, path: bytes | str) -> RouteMatch | None:
        """The route of a (normalised, decoded) path and method, with its parameters."""
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if isinstance(method, bytes):
            method = method.decode("latin-1")
        if method == "HEAD":
            method = "GET"
        if not path.startswith("/") or (path.endswith("/") and path != "/"):
            return None  # no route ends in "/": the app answers 404 for it
        parts = path[1:].split("/")
        for route in self._by_length.get(len(parts), ()):
            if route.method != method:
                continue
            params = _bind(route.segments, parts)
            if params is not None and not any(
                part in self.shadowed(route, i)
                for i, part in enumerate(parts)
                if isinstance(route.segments[i], Param)
            ):
                return RouteMatch(route, params)
        return None

    def only_public_at(self, path: bytes | str) -> bool:
        """Whether ``path`` has routes and every one is public: a request there with another
        method needs no key to be told which methods are allowed (405 with ``Allow``)."""
        methods = {route.method for route in self.routes}
        found = [m.route for m in (self.match(method, path) for method in methods) if m]
        return bool(found) and all(route.public for route in found)

    def price(self, costs: Mapping[str, int]) -> None:
        """Set every route's compute units from ``costs`` (route key -> units)."""
        keys = {route.key for route in self.routes}
        missing = sorted(keys - set(costs))
        unknown = sorted(set(costs) - keys)
        if missing or unknown:
            raise PricingError(
                "config/rest.toml must price exactly the REST routes"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            )
        for route in self.routes:
            cost = costs[route.key]
            if cost < 0:
                raise PricingError(f"{route.key}: compute units must be >= 0")
            route.cu = cost


class Param(msgspec.Struct, frozen=True):
    name: str


def _segment(part: str) -> str | Param:
    found = _PARAM.match(part)
    return Param(found[1]) if found else part


def _bind(segments: tuple[str | Param, ...], parts: list[str]) -> dict[str, str] | None:
    params: dict[str, str] = {}
    for segment, part in zip(segments, parts, strict=True):
        if isinstance(segment, Param):
            if not part:
                return None
            params[segment.name] = part
        elif segment != part:
            return None
    return params


def _same_shape(a: tuple[str | Param, ...], b: tuple[str | Param, ...]) -> bool:
    """Equal literals, parameters against parameters (whatever their names)."""
    return all(
        (isinstance(x, Param) and isinstance(y, Param)) or x == y for x, y in zip(a, b, strict=True)
    )
