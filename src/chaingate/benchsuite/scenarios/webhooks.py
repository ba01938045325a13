"""``chaingate bench webhooks``: signed deliveries, block to arrival, against every target.

For each target (a chaingate base URL) the bench creates ``--users`` ``address_activity``
webhooks through ``POST /v1/webhooks``, each with its own URL on a receiver of the bench's own
(``--receiver HOST:PORT``; ``--receiver-url`` if the targets reach it by another name), and
deletes them at the end.  Every delivery's Standard Webhooks signature is checked with its
webhook's secret (a bad one is a wrong answer).

With ``--drive URL`` (a devnet node whose accounts are unlocked, e.g. ``chaingate dev``'s anvil)
one locust user sends value transfers at ``--rate`` per second from its first account to the
others, which the webhooks watch: a delivery's latency is its arrival after the send began
(anvil mines during the call), and every (transaction, webhook) that has not arrived ``--grace``
seconds after the load is counted as dropped.  Without ``--drive`` the webhooks watch addresses
active in the chain's recent blocks and a delivery's latency is its arrival after its block's
timestamp (one-second resolution).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import gevent
import msgspec
from gevent.pywsgi import WSGIServer
from locust import User, constant, constant_throughput, task

from chaingate.benchsuite import chainsample, hooksig, outcomes
from chaingate.benchsuite.plan import BenchError, Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.scenarios.rest import default_rpc
from chaingate.benchsuite.targets import Target

MAX_BODY = 1024 * 1024  # one delivery larger than this is refused (413) and counted wrong
SENDS_KEPT = 100_000  # transactions remembered for expectations (bounded)
VALUE_WEI = hex(1)


@dataclass
class Hook:
    target: Target
    id: str
    secret: str
    watched: str  # the address it watches (lowercase)
    delivered: set[str] = field(default_factory=set)  # transaction hashes seen


class WebhooksScenario:
    def __init__(self, plan: Plan, recorder: Recorder) -> None:
        if plan.mode != "local" or plan.workers:
            raise BenchError("webhooks runs in one process: the receiver is in it")
        self.plan = plan
        self.recorder = recorder
        self.chain = str(plan.options.get("chain", "ethereum-devnet"))
        given = str(plan.options.get("drive", ""))
        self.drive = given if "://" in given else ""
        self.rate = float(plan.options.get("rate", 5.0))
        self.grace = float(plan.options.get("grace", 10.0))
        self.users = 1  # the driver (idle without --drive)
        self.hooks: dict[str, Hook] = {}  # by receiver path
        self.sent: dict[str, tuple[float, str]] = {}  # tx hash -> (sent at, recipient)
        self.block_times: dict[int, float] = {}
        self.sender = ""
        self.recipients: list[str] = []
        self.server: WSGIServer | None = None
        self.receiver_url = ""
        # Deliveries of transactions not (yet) known as the bench's: by hash, hook and arrival.
        self.early: dict[str, list[tuple[Hook, float]]] = {}
        self.duplicates = 0

    # Before the load.

    def prepare(self) -> None:
        self._start_receiver()
        if self.drive:
            accounts = self._drive_rpc("eth_accounts", [])
            if not isinstance(accounts, list) or len(accounts) < 2:
                raise BenchError(f"--drive {self.drive}: needs two unlocked accounts or more")
            self.sender = str(accounts[0]).lower()
            watched = [str(a).lower() for a in accounts[1:]]
        else:
            first = self.plan.targets[0]
            rpc = chainsample.rpc_caller(
                default_rpc(first.url, self.chain),
                self.plan.key_headers(),
                self.plan.timeout,
                lambda: self.recorder.setup_request(first.name),
            )
            try:
                pool = chainsample.sample(rpc, 32, 0)
            except chainsample.SampleError as exc:
                raise BenchError(f"drawing addresses over JSON-RPC: {exc}") from None
            watched = pool.addresses
        for target_index, target in enumerate(self.plan.targets):
            for index in range(self.plan.users):
                address = watched[index % len(watched)]
                self._create(target, target_index, index, address)
        self.recipients = sorted({hook.watched for hook in self.hooks.values()})
        # --users counts webhooks here; the load itself is one driver (idle without --drive).
        self.recorder.notes["users per target"] = "none: one driver sends the transactions"
        self.recorder.notes["webhooks"] = (
            f"{self.plan.users} per target, address_activity, each watching one of "
            f"{len(self.recipients)} addresses; receiver {self.receiver_url}"
        )

    def _start_receiver(self) -> None:
        spec = str(self.plan.options.get("receiver", "127.0.0.1:0"))
        host, _, port = spec.rpartition(":")
        try:
            self.server = WSGIServer((host or "127.0.0.1", int(port)), self._app, log=None)
            self.server.start()
        except (OSError, ValueError) as exc:
            raise BenchError(f"--receiver {spec}: {exc}") from None
        bound = f"http://{host or '127.0.0.1'}:{self.server.server_port}"
        self.receiver_url = str(self.plan.options.get("receiver_url") or bound).rstrip("/")

    def _create(self, target: Target, target_index: int, index: int, address: str) -> None:
        path = f"/hook/{target_index}/{index}"
        body = {
            "url": self.receiver_url + path,
            "chain": self.chain,
            "event_type": "address_activity",
            "config": {"addresses": [address]},
        }
        self.recorder.setup_request(target.name)
        try:
            raw = chainsample.post(
                target.url.rstrip("/") + "/v1/webhooks",
                json.dumps(body).encode(),
                self.plan.key_headers(),
                self.plan.timeout,
            )
            created = json.loads(raw)
            hook = Hook(target, str(created["id"]), str(created["signing_secret"]), address)
        except (chainsample.SampleError, ValueError, KeyError, TypeError) as exc:
            self.finish()  # the webhooks made so far are deleted
            raise BenchError(f"creating a webhook on {target.shown}: {exc}") from None
        self.hooks[path] = hook

    # The receiver (gevent's WSGI server, in this process).

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        arrived = time.time()
        length = int(environ.get("CONTENT_LENGTH") or 0)
        hook = self.hooks.get(environ.get("PATH_INFO", ""))
        if hook is None or length > MAX_BODY:
            start_response("404 Not Found" if hook is None else "413 Too Large", [])
            return [b""]
        body = environ["wsgi.input"].read(length)
        start_response("200 OK", [("Content-Type", "text/plain")])
        self._judge(hook, environ, body, arrived)
        return [b"ok"]

    def _judge(self, hook: Hook, environ: dict[str, Any], body: bytes, arrived: float) -> None:
        def record(outcome: str, ms: float, detail: str = "") -> None:
            self.recorder.record(hook.target.name, "delivery", outcome, ms, 1, detail)

        signed = hooksig.verify(
            hook.secret,
            environ.get("HTTP_WEBHOOK_ID", ""),
            environ.get("HTTP_WEBHOOK_TIMESTAMP", ""),
            body,
            environ.get("HTTP_WEBHOOK_SIGNATURE", ""),
        )
        if not signed:
            record(outcomes.WRONG, 0.0, "signature does not verify with the webhook's secret")
            return
        try:
            event = msgspec.json.decode(body)
            data = event["data"]
            tx_hash, number = str(data["tx_hash"]).lower(), int(data["block_number"])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            record(outcomes.WRONG, 0.0, f"not an address_activity event: {body[:100]!r}")
            return
        if tx_hash in hook.delivered:
            self.duplicates += 1  # at least once: a retry after a lost answer is allowed
            return
        hook.delivered.add(tx_hash)
        if self.drive:
            sent = self.sent.get(tx_hash)
            if sent is not None:
                record(outcomes.OK, (arrived - sent[0]) * 1000)
            elif len(self.early) < SENDS_KEPT:
                # Before the send's answer (the bench was slower than chaingate), or another
                # sender's: settled when the send returns, or counted as foreign at the end.
                self.early.setdefault(tx_hash, []).append((hook, arrived))
        else:
            record(outcomes.OK, (arrived - self._block_time(hook.target, number)) * 1000)

    def _block_time(self, target: Target, number: int) -> float:
        if number not in self.block_times:
            rpc = chainsample.rpc_caller(
                default_rpc(target.url, self.chain),
                self.plan.key_headers(),
                self.plan.timeout,
                lambda: self.recorder.setup_request(target.name),
            )
            block = rpc("eth_getBlockByNumber", [hex(number), False])
            self.block_times[number] = int(block["timestamp"], 16)
        return self.block_times[number]

    # The load: transactions on the devnet.

    def _drive_rpc(self, method: str, params: list[Any]) -> object:
        rpc = chainsample.rpc_caller(self.drive, {}, self.plan.timeout, lambda: None)
        try:
            return rpc(method, params)
        except chainsample.SampleError as exc:
            raise BenchError(f"--drive: {method}: {exc}") from None

    def send(self, count: int) -> None:
        recipient = self.recipients[count % len(self.recipients)]
        tx = {"from": self.sender, "to": recipient, "value": VALUE_WEI}
        started = time.time()  # anvil mines during the call: latency counts from its start
        tx_hash = str(self._drive_rpc("eth_sendTransaction", [tx])).lower()
        if len(self.sent) >= SENDS_KEPT:
            return
        self.sent[tx_hash] = (started, recipient)
        for hook, arrived in self.early.pop(tx_hash, []):
            self.recorder.record(
                hook.target.name, "delivery", outcomes.OK, (arrived - started) * 1000
            )

    def user_classes(self) -> list[type[User]]:
        pace = constant_throughput(self.rate) if self.drive else constant(1.0)
        return [type("Driver", (DriverUser,), {"scenario": self, "wait_time": pace})]

    # After the load.

    def finish(self) -> None:
        """What is still on its way gets ``--grace`` seconds; then the webhooks are deleted."""
        if self.drive and self.sent:
            deadline = time.monotonic() + self.grace
            while time.monotonic() < deadline and self._missing():
                gevent.sleep(0.1)
            for hook, tx_hash in self._missing():
                self.recorder.record(
                    hook.target.name,
                    "delivery",
                    outcomes.DROPPED,
                    0.0,
                    1,
                    f"{tx_hash} to {hook.watched} never delivered",
                )
            self.recorder.notes["transactions sent"] = (
                f"{len(self.sent)} at {self.rate:g}/s to {len(self.recipients)} watched addresses"
            )
        foreign = sum(len(hooks) for hooks in self.early.values())
        if foreign or self.duplicates:
            self.recorder.notes["other deliveries"] = (
                f"{foreign} of transactions the bench did not send, "
                f"{self.duplicates} repeated (at-least-once retries)"
            )
        for hook in self.hooks.values():
            url = f"{hook.target.url.rstrip('/')}/v1/webhooks/{hook.id}"
            try:
                chainsample.request("DELETE", url, self.plan.key_headers(), self.plan.timeout)
            except chainsample.SampleError as exc:
                self.recorder.check("webhook deleted", hook.target.name, False, str(exc))
        self.hooks.clear()
        if self.server is not None:
            self.server.stop(timeout=1)

    def _missing(self) -> list[tuple[Hook, str]]:
        return [
            (hook, tx_hash)
            for hook in self.hooks.values()
            for tx_hash, (_, recipient) in self.sent.items()
            if recipient == hook.watched and tx_hash not in hook.delivered
        ]


class DriverUser(User):
    abstract = True
    scenario: WebhooksScenario

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.count = 0

    @task
    def transact(self) -> None:
        if self.scenario.drive:
            self.scenario.send(self.count)
            self.count += 1


def scenario(plan: Plan, recorder: Recorder) -> WebhooksScenario:
    return WebhooksScenario(plan, recorder)
