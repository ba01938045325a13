"""Socket I/O on the hot path: try the non-blocking call first, wait only when it would block.

trio's ``SocketStream`` checkpoints on every send and receive, which costs two trips through
the scheduler per request even when the kernel is ready.  Here a ready socket is served with a
plain system call and the task only parks (``wait_readable``/``wait_writable``) when it must;
loops that can run without ever parking call ``trio.lowlevel.checkpoint`` themselves.
"""

from __future__ import annotations

import errno
import os
import socket

import trio
from trio._core._run import SystemClock  # trio's default clock (exported by no public name)
from trio.lowlevel import current_clock, notify_closing, wait_readable, wait_writable

RECV_SIZE = 65536


async def recv_some(sock: socket.socket, size: int = RECV_SIZE) -> bytes:
    """Bytes from ``sock``; b"" at end of stream.  Tries the read before waiting."""
    while True:
        try:
            return sock.recv(size)
        except BlockingIOError:
            await wait_readable(sock)


async def send_all(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data``; parks only when the kernel's send buffer is full."""
    try:
        sent = sock.send(data)
    except BlockingIOError:
        sent = 0
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    while view:
        await wait_writable(sock)
        try:
            sent = sock.send(view)
        except BlockingIOError:
            continue
        view = view[sent:]


def quick_ack(sock: socket.socket | trio.socket.SocketType) -> None:
    """ACK what was just read at once rather than up to 40 ms later.

    A node that does not set TCP_NODELAY (anvil, many HTTP servers) holds its next small
    answer until its previous one is acknowledged (Nagle); our kernel delays that ACK while we
    have nothing to send (delayed ACK).  With requests pipelined on one connection, an answer
    queued behind another then waits for the delayed-ACK timer: measured here, a ~40 ms stall
    about once a second at one request at a time, many times a second under load.  Linux
    leaves quick-ACK mode by itself, so it is asked for after every read.
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    except OSError:
        pass  # not TCP (a test's socket pair), or the connection is gone


def clock_offset() -> float | None:
    """The current run's clock as an offset from ``time.perf_counter()`` when it is trio's own
    ``SystemClock`` (whose time is ``offset + perf_counter()``); None for any other clock
    (tests' ``MockClock``), whose time only ``trio.current_time()`` tells.

    ``trio.current_time()`` costs two Python frames (trio's generated wrapper, then the
    clock's method); the hot path reads the clock a few times per upstream exchange, so it
    reads ``offset + perf_counter()`` itself where it can: the same float, no frame."""
    clock = current_clock()
    return clock.offset if type(clock) is SystemClock else None


def try_send(sock: socket.socket, data: bytes) -> int:
    """Send what the kernel takes right now without waiting; the count of bytes taken."""
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0


def close_socket(sock: socket.socket) -> None:
    """Close, first waking any task parked on the socket (it sees ClosedResourceError)."""
    if sock.fileno() >= 0:
        notify_closing(sock)
        sock.close()


async def connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket with TCP_NODELAY; tries each resolved address."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, address in infos:
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            try:
                sock.connect(address)
            except BlockingIOError:
                await wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code)) from None
        except OSError as exc:
            close_socket(sock)
            last = exc
            continue
        except BaseException:
            close_socket(sock)
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise last or OSError(errno.EHOSTUNREACH, f"no address for {host}")
