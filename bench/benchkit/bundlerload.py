"""Driving a bundler over JSON-RPC: concurrent ``eth_sendUserOperation``, receipt polling.

Plain threads, each with one keep-alive ``http.client`` connection: a bundler spends
milliseconds validating an operation, the client microseconds sending it, so the client is
never what limits the rate.  Every answer is checked: an operation counts as accepted only when
the bundler answers the userOpHash computed locally.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from benchkit.bundlerops import BuiltOp

POLL_INTERVAL = 0.02  # between two rounds of receipt polls of one waiter
REQUEST_TIMEOUT = 60.0


class Connection:
    """One keep-alive JSON-RPC connection to ``url`` (reconnects after a failure)."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http:// URL: {url}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path or "/"
        self.headers = {"Content-Type": "application/json", **headers}
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, params: Sequence[Any]) -> dict[str, Any]:
        """The JSON-RPC reply object; a transport failure or non-JSON answer becomes an
        ``{"error": {"message": ...}}`` reply so the caller counts it like any refusal."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=REQUEST_TIMEOUT
                )
            self.conn.request("POST", self.path, body.encode(), self.headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return {"error": {"message": f"transport: {type(exc).__name__}: {exc}"}}
        try:
            reply = json.loads(raw)
        except ValueError:
            return {"error": {"message": f"HTTP {response.status}: {raw[:200]!r}"}}
        if not isinstance(reply, dict):
            return {"error": {"message": f"HTTP {response.status}: not a reply object"}}
        if response.status != 200 and "error" not in reply:
            reply["error"] = {"message": f"HTTP {response.status}"}
        return reply

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def error_text(reply: Mapping[str, Any]) -> str:
    """The error's code and message on one line (it goes into a markdown table)."""
    error = reply.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = " ".join(str(error.get("message", error)).split())[:160]
        return f"{code}: {message}" if code is not None else message
    return " ".join(str(error).split())[:160]


@dataclass(frozen=True)
class Sent:
    op: BuiltOp
    started: float  # monotonic, request written
    answered: float  # monotonic, answer read
    error: str | None  # None: accepted with the expected hash


@dataclass
class SendResult:
    sent: list[Sent]
    seconds: float  # first request to last answer

    @property
    def accepted(self) -> list[Sent]:
        return [s for s in self.sent if s.error is None]

    @property
    def errors(self) -> Counter[str]:
        return Counter(s.error for s in self.sent if s.error is not None)

    @property
    def rate(self) -> float:
        return len(self.accepted) / self.seconds if self.seconds > 0 else 0.0


def send_one(conn: Connection, op: BuiltOp, entry_point: str) -> Sent:
    started = time.monotonic()
    reply = conn.call("eth_sendUserOperation", [op.rpc, entry_point])
    answered = time.monotonic()
    error = None
    if "error" in reply:
        error = error_text(reply)
    elif str(reply.get("result", "")).lower() != op.hash:
        error = f"answered {str(reply.get('result'))[:80]}, not the userOpHash {op.hash}"
    return Sent(op, started, answered, error)


def send_all(
    url: str,
    headers: Mapping[str, str],
    ops: Sequence[BuiltOp],
    entry_point: str,
    concurrency: int,
) -> SendResult:
    """Every operation sent once, ``concurrency`` at a time."""
    queue = list(reversed(ops))
    lock = threading.Lock()
    sent: list[Sent] = []

    def worker() -> None:
        conn = Connection(url, headers)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    op = queue.pop()
                result = send_one(conn, op, entry_point)
                with lock:
                    sent.append(result)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(concurrency, len(ops))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not sent:
        return SendResult([], 0.0)
    first = min(s.started for s in sent)
    last = max(s.answered for s in sent)
    return SendResult(sent, last - first)


@dataclass
class Receipts:
    seen: dict[str, float] = field(default_factory=dict)  # userOpHash -> monotonic first seen
    success: dict[str, bool] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)


def poll_receipts(
    url: str,
    headers: Mapping[str, str],
    hashes: Sequence[str],
    *,
    timeout: float,
    pollers: int = 4,
) -> Receipts:
    """Poll ``eth_getUserOperationReceipt`` for every hash until each has a receipt or
    ``timeout`` passes; ``pollers`` threads share the hashes."""
    found = Receipts()
    lock = threading.Lock()
    deadline = time.monotonic() + timeout
    shares = [list(hashes[i::pollers]) for i in range(pollers)]

    def poller(share: list[str]) -> None:
        conn = Connection(url, headers)
        try:
            while share and time.monotonic() < deadline:
                waiting = []
                for h in share:
                    reply = conn.call("eth_getUserOperationReceipt", [h])
                    now = time.monotonic()
                    result = reply.get("result")
                    with lock:
                        if "error" in reply:
                            found.errors[error_text(reply)] += 1
                            waiting.append(h)
                        elif isinstance(result, dict):
                            found.seen[h] = now
                            found.success[h] = bool(result.get("success"))
                        else:
                            waiting.append(h)
                share = waiting
                if share:
                    time.sleep(POLL_INTERVAL)
        finally:
            conn.close()

    threads = [threading.Thread(target=poller, args=(share,)) for share in shares if share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


@dataclass(frozen=True)
class Latency:
    samples: list[float]  # seconds, submit to receipt, of operations that got one
    refused: Counter[str]
    no_receipt: int
    failed: int  # receipts with success false


def latency_run(
    url: str,
    headers: Mapping[str, str],
    ops: Sequence[BuiltOp],
    entry_point: str,
    *,
    workers: int,
    timeout: float,
) -> Latency:
    """``workers`` clients, each sending one operation and polling its receipt (every
    POLL_INTERVAL) before sending the next: submit-to-receipt latency under a light load."""
    queue = list(reversed(ops))
    lock = threading.Lock()
    samples: list[float] = []
    refused: Counter[str] = Counter()
    missing = 0
    failed = 0

    def worker() -> None:
        nonlocal missing, failed
        conn = Connection(url, headers)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    op = queue.pop()
                sent = send_one(conn, op, entry_point)
                if sent.error is not None:
                    with lock:
                        refused[sent.error] += 1
                    continue
                deadline = sent.started + timeout
                receipt: Any = None
                while time.monotonic() < deadline:
                    receipt = conn.call("eth_getUserOperationReceipt", [op.hash]).get("result")
                    if isinstance(receipt, dict):
                        break
                    time.sleep(POLL_INTERVAL)
                now = time.monotonic()
                with lock:
                    if not isinstance(receipt, dict):
                        missing += 1
                    else:
                        samples.append(now - sent.started)
                        failed += 0 if receipt.get("success") else 1
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(workers, len(ops))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Latency(sorted(samples), refused, missing, failed)


def percentile(samples: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile of sorted ``samples`` (None when there are none)."""
    if not samples:
        return None
    rank = max(1, min(len(samples), math.ceil(share * len(samples))))
    return samples[rank - 1]
