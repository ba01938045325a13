"""``chaingate bench ws``: WebSocket subscribers on every target, delivery delay and drops.

Each user is one connection with one subscription (``newHeads`` or ``logs``; on a Solana
network ``slotSubscribe``).  A push's delay is its arrival after the first arrival of the same
block, log or slot at any connection of this process, to any target: 0 for the fastest, and
how far behind the rest are.  A head (or slot) whose number skips ahead of the last one a
connection saw counts the ones between as dropped; two targets giving different hashes for
one block number count a wrong answer.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any

import gevent
from locust import User, constant, task

from chaingate.benchsuite import outcomes, rpcwire
from chaingate.benchsuite.plan import Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.targets import Target
from chaingate.benchsuite.wsclient import WsClient, WsError

SUBSCRIPTIONS = ("newHeads", "logs", "slotSubscribe")
SLOTS = "slotSubscribe"  # Solana's PubSub: its own method, pushes named slotNotification
FIRST_SEEN_KEPT = 4096  # pushes remembered for the delay's reference (bounded)
LISTEN_SLICE = 1.0  # seconds one task waits for a push: a stop waits at most this long


class WsScenario:
    def __init__(self, plan: Plan, recorder: Recorder) -> None:
        self.plan = plan
        self.recorder = recorder
        self.users = plan.users
        self.subscription = str(plan.options.get("subscribe", "newHeads"))
        self.first_seen: OrderedDict[str, float] = OrderedDict()
        self.oracle = rpcwire.Oracle()

    def params(self) -> list[Any]:
        if self.subscription == SLOTS:
            return []
        return [self.subscription] + ([{}] if self.subscription == "logs" else [])

    def subscribe_call(self, request_id: int) -> str:
        method = SLOTS if self.subscription == SLOTS else "eth_subscribe"
        return json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": self.params()}
        )

    def prepare(self) -> None:
        """One connection and subscription to every target, before the load."""
        for target in self.plan.targets:
            self.recorder.setup_request(target.name)
            try:
                client = WsClient(target.url, self.plan.key_headers(), self.plan.timeout)
                client.send_text(self.subscribe_call(1))
                answer = client.recv_text(self.plan.timeout)
                client.close()
            except (WsError, OSError) as exc:
                self.recorder.check("subscribes", target.name, False, str(exc))
                continue
            ok = answer is not None and "result" in _decoded(answer)
            self.recorder.check("subscribes", target.name, ok, "" if ok else str(answer)[:200])

    def first_arrival(self, key: str, now: float) -> float:
        first = self.first_seen.setdefault(key, now)
        if len(self.first_seen) > FIRST_SEEN_KEPT:
            self.first_seen.popitem(last=False)
        return first

    def finish(self) -> None:
        """Nothing arrives after the load, and nothing was made."""

    def user_classes(self) -> list[type[User]]:
        return [
            type(f"Target{index}", (WsUser,), {"target": target, "scenario": self})
            for index, target in enumerate(self.plan.targets)
        ]


class WsUser(User):
    abstract = True
    wait_time = constant(0)
    target: Target
    scenario: WsScenario

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.client: WsClient | None = None
        self.last_head: int | None = None

    def _record(self, name: str, outcome: str, ms: float, detail: str = "") -> None:
        failure = outcomes.Failure(outcome, detail) if outcome != outcomes.OK else None
        self.environment.events.request.fire(
            request_type="ws",
            name=name,
            response_time=ms,
            response_length=0,
            exception=failure,
            context={"target": self.target.name},
        )

    def _connect(self) -> None:
        scenario = self.scenario
        started = time.perf_counter()
        try:
            client = WsClient(self.target.url, scenario.plan.key_headers(), scenario.plan.timeout)
        except WsError as exc:
            self._record("connect", outcomes.of_status(exc.status), _ms(started), str(exc))
            gevent.sleep(1.0)  # a refused target is retried once a second, not in a tight loop
            return
        except OSError as exc:
            self._record("connect", outcomes.ERROR, _ms(started), repr(exc))
            gevent.sleep(1.0)
            return
        self._record("connect", outcomes.OK, _ms(started))
        started = time.perf_counter()
        client.send_text(scenario.subscribe_call(1))
        answer = client.recv_text(scenario.plan.timeout)
        reply = _decoded(answer) if answer else {}
        if "result" not in reply:
            error = reply.get("error", {})
            outcome = outcomes.of_rpc_error(error.get("code")) if error else outcomes.ERROR
            self._record("subscribe", outcome, _ms(started), str(answer)[:200])
            client.close()
            gevent.sleep(1.0)
            return
        self._record("subscribe", outcomes.OK, _ms(started))
        self.client = client

    @task
    def listen(self) -> None:
        if self.client is None:
            self._connect()
            return
        try:
            text = self.client.recv_text(LISTEN_SLICE)
        except (WsError, OSError) as exc:
            self._record(self.scenario.subscription, outcomes.ERROR, 0.0, str(exc))
            self.client = None
            return
        if text is None:
            return
        now = time.time()
        push = _decoded(text)
        result = push.get("params", {}).get("result")
        expected = "slotNotification" if self.scenario.subscription == SLOTS else "eth_subscription"
        if push.get("method") != expected or not isinstance(result, dict):
            self._record(self.scenario.subscription, outcomes.WRONG, 0.0, text[:200])
            return
        if self.scenario.subscription == "newHeads":
            self._head(result, now)
        elif self.scenario.subscription == SLOTS:
            self._slot(result, now)
        else:
            key = f"{result.get('blockHash')}:{result.get('logIndex')}"
            delay = (now - self.scenario.first_arrival(key, now)) * 1000
            self._record("logs", outcomes.OK, delay)

    def _head(self, head: dict[str, Any], now: float) -> None:
        number = int(head.get("number", "0x0"), 16)
        if self.last_head is not None and number > self.last_head + 1:
            for missing in range(self.last_head + 1, number):
                self._record("newHeads", outcomes.DROPPED, 0.0, f"block {missing} never pushed")
        self.last_head = max(number, self.last_head or 0)
        call = rpcwire.Call("newHeads", [number], comparable=True)
        differs = self.scenario.oracle.judge(call, head.get("hash"), self.target.name)
        delay = (now - self.scenario.first_arrival(str(head.get("hash")), now)) * 1000
        if differs:
            self._record("newHeads", outcomes.WRONG, delay, differs)
        else:
            self._record("newHeads", outcomes.OK, delay)

    def _slot(self, info: dict[str, Any], now: float) -> None:
        slot = info.get("slot")
        if not isinstance(slot, int):
            self._record(SLOTS, outcomes.WRONG, 0.0, f"no slot in {str(info)[:200]}")
            return
        if self.last_head is not None and slot > self.last_head + 1:
            for missing in range(self.last_head + 1, slot):
                self._record(SLOTS, outcomes.DROPPED, 0.0, f"slot {missing} never pushed")
        self.last_head = max(slot, self.last_head or 0)
        delay = (now - self.scenario.first_arrival(f"slot:{slot}", now)) * 1000
        self._record(SLOTS, outcomes.OK, delay)

    def on_stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def _decoded(text: str) -> dict[str, Any]:
    """A JSON object, or {} for anything else (then judged as a wrong answer)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def scenario(plan: Plan, recorder: Recorder) -> WsScenario:
    return WsScenario(plan, recorder)
