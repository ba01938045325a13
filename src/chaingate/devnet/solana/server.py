"""The node's edge: Solana JSON-RPC over HTTP/1.1 on loopback (trio + h11), and the slot clock.

Everything else is ``rpc`` over a ``Ledger``; this module only moves bytes and time.  Requests
are answered one at a time on the trio thread, so the ledger needs no lock.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import h11
import trio

from chaingate.devnet.solana import rpc, snapshot
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.pubsub import Hub
from chaingate.devnet.solana.wsedge import serve_pubsub

log = logging.getLogger("chaingate.devnet.solana")
SLOT_SECONDS = 0.4
SAVE_SECONDS = 2.0
MAX_BODY_BYTES = 1024 * 1024
IDLE_SECONDS = 60.0


async def run_clock(
    ledger: Ledger,
    slot_seconds: float = SLOT_SECONDS,
    now: Callable[[], float] = time.time,
) -> None:
    """Advance a slot every ``slot_seconds`` until cancelled (late ticks do not pile up)."""
    deadline = trio.current_time()
    while True:
        deadline = max(deadline + slot_seconds, trio.current_time())
        await trio.sleep_until(deadline)
        ledger.advance(now())


async def run_saver(ledger: Ledger, path: Path, interval: float = SAVE_SECONDS) -> None:
    """Save the ledger to ``path`` every ``interval`` seconds and once more when cancelled."""
    try:
        while True:
            await trio.sleep(interval)
            _save(ledger, path)
    finally:
        _save(ledger, path)  # on stop too: a restart loses nothing


def _save(ledger: Ledger, path: Path) -> None:
    try:
        snapshot.save(ledger, path)
    except OSError as exc:  # a full disk costs the save, not the node
        log.warning("solana node: could not save its state to %s: %s", path, exc)


class Endpoints(NamedTuple):
    http: str
    ws: str


async def serve(
    ledger: Ledger,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ws_port: int = 0,
    slot_seconds: float | None = SLOT_SECONDS,
    state_path: Path | None = None,
    task_status: trio.TaskStatus[Endpoints] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``ledger`` (JSON-RPC over HTTP, PubSub over WebSocket) until cancelled; started
    with both URLs.  ``slot_seconds=None`` leaves the slots to whoever calls
    ``ledger.advance`` (a test driving the clock by hand).  With ``state_path`` the ledger is
    saved there (``snapshot.load`` resumes it)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    hub = Hub(ledger)
    async with trio.open_nursery() as nursery:
        ws = await nursery.start(functools.partial(serve_pubsub, hub, host=host, port=ws_port))
        if slot_seconds is not None:
            nursery.start_soon(run_clock, ledger, slot_seconds)
        if state_path is not None:
            nursery.start_soon(run_saver, ledger, state_path)
        await nursery.start(trio.serve_listeners, functools.partial(_connection, ledger), listeners)
        task_status.started(Endpoints(f"http://{host}:{bound}", ws))


async def _connection(ledger: Ledger, stream: trio.SocketStream) -> None:
    """One client's connection; whatever goes wrong in it ends it, never the server."""
    async with stream:
        try:
            await _serve_connection(ledger, stream)
        except Exception:
            log.exception("solana node: a connection failed")


async def _serve_connection(ledger: Ledger, stream: trio.SocketStream) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    while True:
        request = None  # an idle client is let go
        with trio.move_on_after(IDLE_SECONDS):
            request = await _request(connection, stream)
        if request is None:
            return
        target, body = request
        if body is None:
            status, reply = 413, b"request too large\n"
        elif target == b"/health":
            status, reply = 200, b"ok"
        else:
            status, reply = 200, rpc.answer(ledger, body)
        if not await _respond(connection, stream, status, reply):
            return
        if connection.our_state is h11.MUST_CLOSE:
            return
        try:
            connection.start_next_cycle()
        except h11.LocalProtocolError:
            return


async def _request(
    connection: h11.Connection, stream: trio.SocketStream
) -> tuple[bytes, bytes | None] | None:
    """The next request's target and body (None: too large); None when the client is gone."""
    target = b"/"
    body = bytearray()
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            target = event.target
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return target, bytes(body) if len(body) <= MAX_BODY_BYTES else None
        else:
            return None


async def _respond(
    connection: h11.Connection, stream: trio.SocketStream, status: int, body: bytes
) -> bool:
    kind = "application/json" if status == 200 and body[:1] in (b"{", b"[") else "text/plain"
    headers = [("content-type", kind), ("content-length", str(len(body)))]
    data = connection.send(h11.Response(status_code=status, headers=headers)) or b""
    data += connection.send(h11.Data(data=body)) or b""
    data += connection.send(h11.EndOfMessage()) or b""
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True
