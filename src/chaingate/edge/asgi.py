"""Hand non-RPC requests to the quart-trio ASGI app, in this process, on this port.

The edge has already read and bounded the whole request, so ``receive`` hands over the body in
one message; the response is collected and framed by the edge like any other (REST answers are
small JSON documents).  The app's lifespan (startup/shutdown hooks) runs as a task of the
gateway's nursery.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from chaingate.edge.responses import JSON
from chaingate.envelope import error_body
from chaingate.twintypes.http1 import Request

log = logging.getLogger("chaingate.asgi")

# Framing is the edge's job; the app's own framing headers are dropped.
_HOP_BY_HOP = frozenset({b"content-length", b"connection", b"transfer-encoding", b"keep-alive"})
ASGI_VERSION = {"version": "3.0", "spec_version": "2.3"}


class AsgiBridge:
    def __init__(self, app: Any, server: tuple[str, int] = ("127.0.0.1", 8000)) -> None:
        self._app = app
        self.server = server
        self._state: dict[str, Any] = {}
        self._shutdown_requested = trio.Event()

    async def lifespan(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the app's startup, report ready, and its shutdown once ``request_shutdown``."""
        startup_done = trio.Event()
        shutdown_done = trio.Event()
        failed: list[str] = []
        sent_startup = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_startup
            if not sent_startup:
                sent_startup = True
                return {"type": "lifespan.startup"}
            await self._shutdown_requested.wait()
            return {"type": "lifespan.shutdown"}

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.failed":
                failed.append(message.get("message", ""))
            if kind.startswith("lifespan.startup"):
                startup_done.set()
            elif kind.startswith("lifespan.shutdown"):
                shutdown_done.set()

        scope = {"type": "lifespan", "asgi": ASGI_VERSION, "state": self._state}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._app, scope, receive, send)
            await startup_done.wait()
            if failed:
                raise RuntimeError(f"ASGI app failed to start: {failed[0]}")
            task_status.started()
            await self._shutdown_requested.wait()
            with trio.move_on_after(5):
                await shutdown_done.wait()
            nursery.cancel_scope.cancel()

    def request_shutdown(self) -> None:
        self._shutdown_requested.set()

    async def handle(
        self,
        request: Request,
        path: bytes,
        peer: str,
        extra_headers: bytes = b"",
        principal: object = None,
    ) -> tuple[int, bytes, bytes]:
        """Run one request through the app; status, header lines and body for the edge.

        ``path`` is the edge's normalised (decoded) path — the one it authorised — and the
        app routes on exactly that.  The caller's principal (already authenticated by the
        edge) travels in the scope under ``chaingate.principal``; REST handlers read it."""
        body_sent = False
        done = trio.Event()
        status = 500
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            kind = message["type"]
            if kind == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
            elif kind == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    done.set()

        scope = {
            "type": "http",
            "asgi": ASGI_VERSION,
            "http_version": "1.1" if request.version == 11 else "1.0",
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": path.decode("utf-8"),
            "raw_path": request.path,
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": (peer, 0),
            "server": self.server,
            "state": dict(self._state),
            "chaingate.principal": principal,
        }
        try:
            await self._app(scope, receive, send)
        except Exception:
            log.exception("unhandled error in the REST app")
            return 500, JSON + extra_headers, error_body(500, "internal error")
        finally:
            done.set()
        lines = b"".join(
            name + b": " + value + b"\r\n"
            for name, value in headers
            if name.lower() not in _HOP_BY_HOP and b"\r" not in value and b"\n" not in value
        )
        return status, lines + extra_headers, b"".join(chunks)
