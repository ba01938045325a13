"""The dashboard's web layer: sessions, CSRF, security headers, and what every page shares.

* Sessions: a random token in an HttpOnly, SameSite=Strict cookie (``Secure`` and the
  ``__Host-`` prefix outside dev); the store keeps its SHA-256 only, so a session can be
  listed and revoked, and a leaked database holds no usable cookie.  A session is created only
  by a successful sign-in, with a new token: a cookie planted before sign-in is never promoted
  (no session fixation).
* CSRF: every form carries a token.  Signed in, it is the session's own (random, kept with the
  session); before sign-in, an HMAC of a pre-session cookie.  A POST without the right token is
  refused (403), and so is one whose ``Origin`` names another host.
* Headers: a strict Content-Security-Policy (scripts and styles from this origin only, no
  inline script or style), ``frame-ancestors 'none'``, no referrer to other sites (sign-in
  links carry a token), no caching of pages — on every answer under the prefix
  (``edge.responses.PAGE_HEADERS``, added app-wide by ``chaingate.dashboard.install``).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import ipaddress
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, TypeVarTuple
from urllib.parse import urlsplit

import msgspec
import trio
from Crypto.Cipher import AES
from quart import Response, g, redirect, render_template, request
from quart.typing import ResponseReturnValue
from werkzeug.sansio.response import Response as SansioResponse
from werkzeug.wrappers.response import Response as WerkzeugResponse

from chaingate.api.chains import ChainNames
from chaingate.api.deps import ApiDeps
from chaingate.api.errors import ApiError
from chaingate.auth.store import AuthRows
from chaingate.config import DashboardSettings
from chaingate.config.network import Network
from chaingate.dashboard.restcalls import RestCalls
from chaingate.dashboard.sharedthrottle import SharedLoginThrottle
from chaingate.dashboard.store import DashboardRows, Session
from chaingate.dashboard.throttle import InProcessThrottle, SignInThrottle
from chaingate.framing_constants import MAX_JSON_DEPTH
from chaingate.jsondepth import too_deep

PREFIX = "/dashboard"
MAX_FORM_FIELD = 10_000  # characters: bounded input
MAX_PAGE = 99_999
FLASH_TTL_MS = 5 * 60_000
_SMALL_INT_DIGITS = 9  # below int()'s digit limit, and a count no page needs more of


class HashingBusy(Exception):
    """Too many password checks are waiting for a CPU: answer 429 rather than queue more."""


T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class PasswordHashing:
    """scrypt (~16 MiB, tens of ms of CPU each) on its own limiter, one thread per CPU, with
    a bounded queue: unauthenticated requests cannot take every core and thread, or
    hundreds of MiB, by sending sign-ins side by side."""

    def __init__(self, threads: int | None = None, max_waiting: int | None = None) -> None:
        threads = threads or os.cpu_count() or 1
        self.limiter = trio.CapacityLimiter(threads)
        self.max_waiting = max_waiting if max_waiting is not None else 4 * threads

    async def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        if self.limiter.statistics().tasks_waiting >= self.max_waiting:
            raise HashingBusy
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)


@dataclass
class Dashboard:
    """What the pages read from: the same services the REST API uses."""

    rows: DashboardRows
    accounts: AuthRows
    rest: RestCalls
    api: ApiDeps
    settings: DashboardSettings
    pepper: bytes
    admin_token: str
    health: Callable[[], dict[str, Any]]
    upstreams: Callable[[], list[dict[str, Any]]] = list
    bundlers: Mapping[Network, Any] = field(default_factory=dict)
    keys_refresh: Callable[[], Awaitable[None]] | None = None
    clock: Callable[[], float] = time.time
    hashing: PasswordHashing = field(default_factory=PasswordHashing)
    # Set: processes share state through this Redis, and so does sign-in throttling.
    redis_url: str = ""
    throttle: SignInThrottle = field(init=False)
    shared_throttle: SharedLoginThrottle | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        s = self.settings
        limits = (s.login_failures_per_account, s.login_failures_per_address, s.login_window)
        if self.redis_url:
            self.shared_throttle = SharedLoginThrottle(self.redis_url, *limits)
            self.throttle = self.shared_throttle
        else:
            self.throttle = InProcessThrottle(*limits)
        self._secret = hmac.new(self.pepper, b"chaingate dashboard", hashlib.sha256).digest()
        self._proxies = [ipaddress.ip_network(cidr) for cidr in s.trusted_proxies]

    # --- the client behind a reverse proxy ---------------------------------------------------

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in self._proxies)

    def client_address(self) -> str:
        """The client's address: the peer's, or, from a trusted proxy, the nearest address
        in X-Forwarded-For that is not itself a trusted proxy (the left part of the header
        is whatever the client sent, so it is read from the right)."""
        address = peer()
        if not self._trusted(address):
            return address
        forwarded = request.headers.get("X-Forwarded-For", "")[:2000].split(",")
        for hop in reversed(forwarded):
            hop = hop.strip()
            if hop and not self._trusted(hop):
                return hop[:64]
            address = hop or address
        return address

    def site_host(self) -> str:
        """The host the browser addressed: from a trusted proxy, its X-Forwarded-Host (a
        proxy may rewrite Host), else the Host header."""
        if self._trusted(peer()):
            forwarded = request.headers.get("X-Forwarded-Host", "")
            if forwarded:
                return forwarded.split(",")[-1].strip()
        return request.headers.get("Host", "")

    def same_origin(self) -> bool:
        """A POST's Origin (when the browser sends one) names this site."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        return origin != "null" and urlsplit(origin).netloc == self.site_host()

    # --- cookies -----------------------------------------------------------------------------

    @property
    def session_cookie(self) -> str:
        return "__Host-cg_session" if self.settings.secure_cookie else "cg_session"

    @property
    def pre_cookie(self) -> str:
        return "__Host-cg_pre" if self.settings.secure_cookie else "cg_pre"

    def set_cookie(
        self, response: SansioResponse, name: str, value: str, max_age: int | None
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path="/",
            secure=self.settings.secure_cookie,
            httponly=True,
            samesite="Strict",
        )

    def clear_cookie(self, response: SansioResponse, name: str) -> None:
        self.set_cookie(response, name, "", 0)

    # --- CSRF --------------------------------------------------------------------------------

    def pre_token(self, pre: str) -> str:
        return hmac.new(self._secret, b"pre:" + pre.encode(), hashlib.sha256).hexdigest()

    def csrf_token(self) -> str:
        """The token the current page's forms carry."""
        session: Session | None = g.get("session")
        if session is not None:
            return session.csrf
        pre = g.get("pre") or request.cookies.get(self.pre_cookie, "")
        if not pre or len(pre) > 100:
            pre = g.pre = secrets.token_urlsafe(24)
            g.new_pre = True
        return self.pre_token(pre)

    def csrf_ok(self, supplied: str) -> bool:
        session: Session | None = g.get("session")
        if session is not None:
            expected = session.csrf
        else:
            pre = request.cookies.get(self.pre_cookie, "")
            if not pre:
                return False
            expected = self.pre_token(pre)
        return bool(supplied) and hmac.compare_digest(supplied.encode(), expected.encode())

    # --- the request's session ---------------------------------------------------------------

    async def load_session(self) -> Session | None:
        token = request.cookies.get(self.session_cookie, "")
        if not token or len(token) > 100:
            return None
        session = await self.rows.live_session(token, self.settings.session_idle_minutes * 60_000)
        if session is not None and not session.account_id:
            # Opened with the admin token: only while that token is still the configured one.
            current = self.admin_fingerprint()
            if not current or not hmac.compare_digest(session.credential, current):
                return None
        return session

    def admin_fingerprint(self) -> str:
        """What an admin-token session keeps of the token: an HMAC, so a leaked database
        holds no token, and a rotated token no longer matches."""
        if not self.admin_token:
            return ""
        token = self.admin_token.encode()
        return hmac.new(self._secret, b"admin token:" + token, hashlib.sha256).hexdigest()

    # --- one-time flashes (a new key shown after a redirect) ---------------------------------

    def _flash_cipher(self, nonce: bytes) -> Any:
        token = request.cookies.get(self.session_cookie, "")
        key = hmac.new(self._secret, b"flash:" + token.encode(), hashlib.sha256).digest()
        return AES.new(key, AES.MODE_GCM, nonce=nonce)

    async def put_flash(self, text: str) -> str:
        """Keep ``text`` for this session's next page (read once, within FLASH_TTL); it is
        encrypted with a key only the session's cookie yields, so the row holds no secret."""
        session: Session = g.session
        nonce = secrets.token_bytes(12)
        sealed, tag = self._flash_cipher(nonce).encrypt_and_digest(text.encode())
        body = base64.urlsafe_b64encode(nonce + tag + sealed).decode()
        return await self.rows.put_flash(session.id, body, FLASH_TTL_MS)

    async def take_flash(self, flash_id: str) -> str | None:
        session: Session | None = g.get("session")
        if session is None or not flash_id or len(flash_id) > 64:
            return None
        body = await self.rows.take_flash(flash_id, session.id)
        if body is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(body)
            opened = self._flash_cipher(raw[:12]).decrypt_and_verify(raw[28:], raw[12:28])
        except ValueError:
            return None
        return bytes(opened).decode()

    async def start_session(self, account_id: str, operator: bool) -> WerkzeugResponse:
        """Sign in: a new session (a new token, whatever cookie came in) and the way home."""
        token, _ = await self.rows.create_session(
            account_id,
            operator,
            self.client_address(),
            request.headers.get("User-Agent", ""),
            self.settings.session_max_hours * 3_600_000,
            credential="" if account_id else self.admin_fingerprint(),
        )
        response = redirect(f"{PREFIX}/" if account_id else f"{PREFIX}/operator", 303)
        self.set_cookie(
            response, self.session_cookie, token, self.settings.session_max_hours * 3600
        )
        self.clear_cookie(response, self.pre_cookie)
        return response


async def gather(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run a page's independent reads at once (a store with a connection pool answers them
    side by side); the first error cancels the others and is raised."""
    results: list[Any] = [None] * len(calls)

    async def one(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        results[index] = await call()

    try:
        async with trio.open_nursery() as nursery:
            for index, call in enumerate(calls):
                nursery.start_soon(one, index, call)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if all(isinstance(leaf, Exception) for leaf in leaves):
            raise leaves[0] from None  # an ApiError as the page expects it
        raise
    return results


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


def peer() -> str:
    client = request.scope.get("client")
    return str(client[0]) if client else ""


def small_int(value: str, field: str, high: int, low: int = 1) -> int:
    """A whole number from ``low`` to ``high`` typed by a client, else a 400 naming ``field``.

    ASCII digits only and a bounded length: ``str.isdigit`` also accepts characters such as
    "²" that ``int`` refuses, and ``int`` refuses more than 4300 digits."""
    text = value.strip()
    if text.isascii() and text.isdigit() and len(text) <= _SMALL_INT_DIGITS:
        number = int(text)
        if low <= number <= high:
            return number
    raise ApiError(400, f"invalid field '{field}': expected a whole number from {low} to {high}")


def page_number(field: str = "page") -> str:
    """The query's page number (1 when absent), as the REST handlers read it."""
    value = request.args.get(field, "")
    return str(small_int(value, field, MAX_PAGE)) if value else "1"


def json_object(text: str, field: str) -> dict[str, Any]:
    """A form field holding a JSON object (empty: ``{}``), else a 400 naming ``field``.

    Its depth is checked before it is decoded, as a REST body's is: the decoder recurses per
    level, and a field nested a thousand deep would otherwise end in a RecursionError."""
    data = text.strip().encode() or b"{}"
    if too_deep(data):
        raise ApiError(400, f"invalid field '{field}': nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"invalid field '{field}': not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"invalid field '{field}': expected a JSON object")
    return value


def chain_names(dash: Dashboard) -> list[str]:
    """The EVM chains' names, for a form's chain choice."""
    names = ChainNames(dash.api.evm_networks)
    return sorted({names.name_of(key) for key in dash.api.evm_networks})


def form_value(form: Mapping[str, object], name: str, default: str = "") -> str:
    value = form.get(name, default)
    return str(value)[:MAX_FORM_FIELD]


async def page(template: str, status: int = 200, **context: object) -> Response:
    html = await render_template(f"dashboard/{template}", **context)
    return Response(html, status=status, mimetype="text/html")


P = ParamSpec("P")
# A page's view function.
View = Callable[P, Awaitable[ResponseReturnValue]]


def signed_in(view: View[P]) -> View[P]:
    """Pages of an account: the signed-in session's account, else the sign-in page."""

    @functools.wraps(view)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> ResponseReturnValue:
        session: Session | None = g.get("session")
        if session is None:
            return redirect(f"{PREFIX}/signin", 303)
        if not session.account_id:  # an operator signed in with the admin token
            return redirect(f"{PREFIX}/operator", 303)
        return await view(*args, **kwargs)

    return wrapper


def operator_only(view: View[P]) -> View[P]:
    @functools.wraps(view)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> ResponseReturnValue:
        session: Session | None = g.get("session")
        if session is None:
            return redirect(f"{PREFIX}/signin", 303)
        if not session.operator:
            return await page("error.html", 404, message="no such page")
        return await view(*args, **kwargs)

    return wrapper
