"""A fast webhook receiver for ``bench/webhooks.py``: HTTP/1.1 keep-alive, one thread, epoll.

Run as a process of its own, so that it never shares an interpreter (or a GIL) with what is
measured::

    python bench/benchkit/hookreceiver.py --out records.tsv [--samples 5]

It listens on a free loopback port and prints ``PORT <n>`` once it does.  Every request is
answered ``200`` with a two-byte body and the connection kept open; a request's body is not
decoded, only searched for what the bench needs to check and time a delivery: the event's
``"id"``, ``"block_number"`` and ``"to"`` (variant A's ``token_transfer`` data).  Each request
is recorded in memory as (arrival wall-clock time, path, id, block number, to); the arrival
time is taken when the request's last byte has been read, before the answer is sent.

Three GET paths are for the bench and are never recorded:

* ``/stats`` — JSON counts: requests recorded, distinct event ids under ``/hooks/``,
  connections accepted, the most open at once, requests refused (malformed or chunked);
* ``/dump`` — writes every record so far to ``--out`` (tab-separated, one per line) and
  answers how many;
* ``/samples`` — the first ``--samples`` requests under ``/hooks/``, headers and body (JSON),
  for the bench's signature check and for its direct-POST reference.

Standard library only: this file is also what a bench imports to read the records.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HOOKS_PREFIX = b"/hooks/"
MAX_HEAD = 64 * 1024  # a request head larger than this is refused
MAX_BODY = 16 * 1024 * 1024
RECV_BYTES = 256 * 1024
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _json_answer(payload: object) -> bytes:
    body = json.dumps(payload).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _string_after(body: bytes, marker: bytes) -> bytes:
    """The JSON string value that follows ``marker`` (``"name":"``), or b""."""
    start = body.find(marker)
    if start < 0:
        return b""
    start += len(marker)
    end = body.find(b'"', start)
    return body[start:end] if end > start else b""


def _int_after(body: bytes, marker: bytes) -> int:
    start = body.find(marker)
    if start < 0:
        return -1
    start += len(marker)
    end = start
    while end < len(body) and 48 <= body[end] <= 57:
        end += 1
    return int(body[start:end]) if end > start else -1


@dataclass(frozen=True)
class Record:
    at: float  # wall-clock seconds (time.time()) when the request had arrived
    path: str
    event_id: str
    block: int  # -1: no block number in the body
    to: str  # lowercase; "" when the body names none

    def line(self) -> str:
        return f"{self.at:.6f}\t{self.path}\t{self.event_id}\t{self.block}\t{self.to}\n"

    @classmethod
    def parse(cls, line: str) -> Record:
        at, path, event_id, block, to = line.rstrip("\n").split("\t")
        return cls(float(at), path, event_id, int(block), to)


def read_records(path: Path) -> list[Record]:
    with path.open() as lines:
        return [Record.parse(line) for line in lines if line.strip()]


@dataclass
class _Connection:
    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    closing: bool = False


class Receiver:
    def __init__(self, out: Path, samples: int) -> None:
        self.out = out
        self.sample_limit = samples
        self.samples: list[dict[str, object]] = []
        # (time, path, id, block, to) as found; decoded only when dumped.
        self.records: list[tuple[float, bytes, bytes, int, bytes]] = []
        self.event_ids: set[bytes] = set()
        self.accepted = 0
        self.open = 0
        self.max_open = 0
        self.refused = 0
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve_forever(self) -> None:
        while True:
            for key, mask in self.selector.select():
                if key.data is None:
                    self._accept()
                    continue
                conn: _Connection = key.data
                if mask & selectors.EVENT_WRITE:
                    self._flush(conn)
                if mask & selectors.EVENT_READ and not conn.closing:
                    self._read(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.selector.register(sock, selectors.EVENT_READ, _Connection(sock))
            self.accepted += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)

    def _close(self, conn: _Connection) -> None:
        self.selector.unregister(conn.sock)
        conn.sock.close()
        self.open -= 1

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        now = time.time()
        conn.inbox += data
        answers = self._requests(conn, now)
        if answers:
            conn.outbox += answers
            self._flush(conn)

    def _requests(self, conn: _Connection, now: float) -> bytes:
        """Answer every complete request in the connection's inbox (pipelining included)."""
        inbox = conn.inbox
        answers = bytearray()
        while not conn.closing:
            end = inbox.find(b"\r\n\r\n")
            if end < 0:
                if len(inbox) > MAX_HEAD:
                    answers += self._refuse(conn)
                break
            head = bytes(inbox[:end])
            lower = head.lower()
            if b"\r\ntransfer-encoding:" in lower:
                answers += self._refuse(conn)  # the bench's clients send Content-Length
                break
            length = 0
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                try:
                    length = int(lower[at + 17 : stop if stop >= 0 else None].strip())
                except ValueError:
                    length = -1
            if not 0 <= length <= MAX_BODY:
                answers += self._refuse(conn)
                break
            total = end + 4 + length
            if len(inbox) < total:
                break
            body = bytes(inbox[end + 4 : total])
            del inbox[:total]
            line_end = head.find(b"\r\n")
            method, _, rest = (head if line_end < 0 else head[:line_end]).partition(b" ")
            path = rest.rpartition(b" ")[0]
            answers += self._answer(method, path, head, body, now)
            if b"\r\nconnection: close" in lower:
                conn.closing = True
        return bytes(answers)

    def _refuse(self, conn: _Connection) -> bytes:
        self.refused += 1
        conn.closing = True
        return BAD

    def _answer(self, method: bytes, path: bytes, head: bytes, body: bytes, now: float) -> bytes:
        if method == b"GET":
            return self._control(path)
        event_id = _string_after(body, b'"id":"')
        block = _int_after(body, b'"block_number":')
        to = _string_after(body, b'"to":"').lower()
        self.records.append((now, path, event_id, block, to))
        if path.startswith(HOOKS_PREFIX):
            self.event_ids.add(event_id)
            if len(self.samples) < self.sample_limit:
                self.samples.append(_sample(path, head, body))
        return OK

    def _control(self, path: bytes) -> bytes:
        if path == b"/stats":
            return _json_answer(
                {
                    "requests": len(self.records),
                    "hook_events": len(self.event_ids),
                    "connections": self.accepted,
                    "max_open": self.max_open,
                    "refused": self.refused,
                }
            )
        if path == b"/dump":
            with self.out.open("w") as out:
                for at, where, event_id, block, to in self.records:
                    record = Record(at, where.decode(), event_id.decode(), block, to.decode())
                    out.write(record.line())
            return _json_answer({"records": len(self.records)})
        if path == b"/samples":
            return _json_answer(self.samples)
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    def _flush(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        del conn.outbox[:sent]
        if conn.outbox:
            self.selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        if conn.closing:
            self._close(conn)
            return
        if self.selector.get_key(conn.sock).events & selectors.EVENT_WRITE:
            self.selector.modify(conn.sock, selectors.EVENT_READ, conn)


def _sample(path: bytes, head: bytes, body: bytes) -> dict[str, object]:
    headers = []
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers.append([name.decode().strip(), value.decode().strip()])
    return {"path": path.decode(), "headers": headers, "body": body.decode()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="where /dump writes records")
    parser.add_argument("--samples", type=int, default=5, help="requests kept whole")
    args = parser.parse_args(argv)
    receiver = Receiver(args.out, args.samples)
    print(f"PORT {receiver.port}", flush=True)
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
