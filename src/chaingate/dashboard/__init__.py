"""The dashboard at ``/dashboard/``: server-rendered pages on the REST app, same port.

``install`` adds its blueprint (templates and static files are package data) to the REST
app.  Every page reads and writes through the services and route handlers the REST API uses
(``restcalls``), so a rule lives in one place.  The web layer (sessions, CSRF, headers) is
``web``; each group of pages is a module of ``pages``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup
from quart import Blueprint, Response, g, redirect, request
from quart_trio import QuartTrio
from werkzeug.wrappers.response import Response as WerkzeugResponse

from chaingate.api.errors import ApiError
from chaingate.dashboard.web import (
    PREFIX,
    Dashboard,
    form_value,
    page,
)
from chaingate.edge.responses import PAGE_HEADERS
from chaingate.printable import code_point, first_hidden_in_url, hidden_in_url

__all__ = ["Dashboard", "install"]


def install(app: QuartTrio, dash: Dashboard) -> Blueprint:
    from chaingate.dashboard.pages import gas, keys, operator, reference, signin, usage, webhooks

    blueprint = Blueprint(
        "dashboard",
        __name__,
        url_prefix=PREFIX,
        template_folder="templates",
        static_folder="static",
        static_url_path="/static",
    )

    @blueprint.before_request
    async def before() -> Response | None:
        if request.endpoint == "dashboard.static":
            return None
        g.session = await dash.load_session()
        if request.method not in ("GET", "HEAD"):
            form = await request.form
            if not dash.same_origin() or not dash.csrf_ok(form_value(form, "csrf")):
                return await page(
                    "error.html",
                    403,
                    title="Refused",
                    message="This form was refused: its CSRF token is missing or wrong (it "
                    "may have expired, or come from another site). Reload the page and retry.",
                )
        return None

    @blueprint.errorhandler(ApiError)
    async def refused(exc: ApiError) -> Response:
        # A page's own bad input (a page number, a JSON field) read outside its form handling.
        return await page("error.html", exc.status, title="Refused", message=exc.message)

    @blueprint.after_app_request
    async def after(response: Response) -> Response:
        # On the app, not the blueprint: every answer under /dashboard — the app's own 404
        # and 405 for paths no page has, the bare path's redirect — not only the pages'.
        if request.path != PREFIX and not request.path.startswith(PREFIX + "/"):
            return response
        for name, value in PAGE_HEADERS.items():  # defined by the edge: it writes some too
            response.headers[name] = value
        if request.endpoint != "dashboard.static":
            response.headers["Cache-Control"] = "no-store"
        if g.get("new_pre"):
            dash.set_cookie(response, dash.pre_cookie, g.pre, 3600)
        return response

    @blueprint.app_context_processor
    async def shared() -> dict[str, Any]:
        return {
            "csrf_token": dash.csrf_token,
            "current": g.get("session"),
            "prefix": PREFIX,
        }

    @blueprint.app_template_filter("ms_time")
    def ms_time(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")

    @blueprint.app_template_filter("url_shown")
    def url_shown(url: str) -> Markup:
        """A URL as it is, but each character that would hide or reorder what is read (a
        bidirectional override, a zero-width or other space) named in a marked box: a URL
        stored before such URLs were refused cannot display as another."""
        return Markup("").join(
            Markup('<mark class="hidden-char">{}</mark>').format(code_point(c))
            if hidden_in_url(c)
            else c
            for c in url
        )

    @blueprint.app_template_test("with_hidden_chars")
    def with_hidden_chars(url: str) -> bool:
        return first_hidden_in_url(url) is not None

    for module in (signin, usage, keys, webhooks, gas, reference, operator):
        module.register(blueprint, dash)
    app.register_blueprint(blueprint)

    async def bare() -> WerkzeugResponse:  # "/dashboard" without its slash: werkzeug would 404 it
        return redirect(f"{PREFIX}/", 308)

    app.add_url_rule(PREFIX, "dashboard_bare", bare, methods=["GET"])
    return blueprint
