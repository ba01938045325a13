"""Solana subscriptions' sans-IO parts: keys, routing by upstream id, sharing, failover."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from chaingate.ws.solana_hub import SolanaHub
from chaingate.ws.solana_methods import (
    MAX_PARAMS_BYTES,
    Key,
    Notification,
    ParamsError,
    subscription_key,
    tail,
)
from chaingate.ws.solana_router import Acked, Notify, Refused, Router

PK = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"


class Sink:
    """A client, as the router sees one: held and compared by identity, never called."""


def sent(router: Router) -> list[dict[str, Any]]:
    return [json.loads(message) for message in router.take_outbox()]


def answer(request_id: int, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "result": result, "id": request_id}).encode()


def notification(method: str, upstream_id: int, result: Any) -> bytes:
    params = {"result": result, "subscription": upstream_id}
    return json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()


def frame_json(frame: bytes) -> Any:
    n = frame[1] & 0x7F
    return json.loads(frame[2 if n < 126 else 4 :])


def test_keys_ignore_member_order_and_are_bounded() -> None:
    a = subscription_key(
        "accountSubscribe", [PK, {"encoding": "base64", "commitment": "confirmed"}]
    )
    b = subscription_key(
        "accountSubscribe", [PK, {"commitment": "confirmed", "encoding": "base64"}]
    )
    assert a == b
    assert a != subscription_key("accountSubscribe", [PK])  # defaults are not guessed
    assert subscription_key("slotSubscribe", None) == Key("slotSubscribe", b"[]")
    with pytest.raises(ParamsError, match="expected an array"):
        subscription_key("slotSubscribe", {"x": 1})
    with pytest.raises(ParamsError, match=str(MAX_PARAMS_BYTES)):
        subscription_key("programSubscribe", [PK, {"filters": ["x" * MAX_PARAMS_BYTES]}])
    with pytest.raises(ParamsError):
        subscription_key("blockSubscribe", ["all"])
    assert json.loads(a.request(7)) == {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "accountSubscribe",
        "params": [PK, {"commitment": "confirmed", "encoding": "base64"}],
    }


def test_notification_frames_carry_each_clients_id_and_cost() -> None:
    push = Notification("slotNotification", b'{"parent":1,"root":0,"slot":2}')
    short, cu = push.frame(tail(7))
    long, _ = push.frame(tail(123456))
    assert frame_json(short)["params"] == {
        "result": {"parent": 1, "root": 0, "slot": 2},
        "subscription": 7,
    }
    assert frame_json(long)["params"]["subscription"] == 123456
    assert cu == -(-(len(short) - 2) * 4 // 100)


def test_clients_share_one_upstream_subscription_routed_by_its_id() -> None:
    router = Router()
    key = subscription_key("slotSubscribe", [])
    one, two = Sink(), Sink()
    assert router.join(key, one, b"1", 0.0) is None  # not connected: waits
    assert router.take_outbox() == []
    router.connected_again()
    [request] = sent(router)
    assert request["method"] == "slotSubscribe"
    assert router.join(key, two, b'"b"', 0.0) is None  # the same key: no second request
    assert router.take_outbox() == []
    acked = router.receive(answer(request["id"], 42))
    assert isinstance(acked, Acked) and not acked.resumed
    assert [(m.sink, w.id_raw) for m, w in acked.joined] == [(one, b"1"), (two, b'"b"')]
    first, second = (m for m, _ in acked.joined)
    assert first.id != second.id
    third = router.join(key, Sink(), b"3", 0.0)  # live already: a member at once
    assert third is not None and router.take_outbox() == []
    pushed = router.receive(notification("slotNotification", 42, {"slot": 5}))
    assert isinstance(pushed, Notify) and not pushed.ended
    assert pushed.members == [first, second, third]
    assert router.receive(notification("slotNotification", 41, {"slot": 5})) is None
    assert router.receive(notification("rootNotification", 42, 5)) is None
    # Leaving: the upstream's goes with the last member.
    assert router.leave(first) and not router.leave(first)
    assert router.leave(second) and router.take_outbox() == []
    assert router.leave(third)
    [unsubscribe] = sent(router)
    assert (unsubscribe["method"], unsubscribe["params"]) == ("slotUnsubscribe", [42])
    assert router.receive(answer(unsubscribe["id"], True)) is None
    assert router.channels == {}


def test_everyone_leaving_before_the_answer_unsubscribes_when_it_comes() -> None:
    router = Router()
    router.connected_again()
    sink = Sink()
    router.join(subscription_key("rootSubscribe", []), sink, b"1", 0.0)
    [request] = sent(router)
    router.forget(sink)
    assert router.channels == {}
    assert router.receive(answer(request["id"], 9)) is None
    [unsubscribe] = sent(router)
    assert (unsubscribe["method"], unsubscribe["params"]) == ("rootUnsubscribe", [9])


def test_upstream_errors_answer_every_waiter_unchanged() -> None:
    router = Router()
    router.connected_again()
    key = subscription_key("accountSubscribe", ["bad"])
    a, b = Sink(), Sink()
    router.join(key, a, b"1", 0.0)
    router.join(key, b, b"2", 0.0)
    [request] = sent(router)
    error = {"code": -32602, "message": "Invalid param: WrongSize"}
    reply = json.dumps({"jsonrpc": "2.0", "error": error, "id": request["id"]}).encode()
    refused = router.receive(reply)
    assert isinstance(refused, Refused)
    assert [w.sink for w in refused.waiters] == [a, b]
    assert json.loads(refused.error) == error
    assert router.channels == {}
    with pytest.raises(ValueError, match="not a JSON-RPC message"):
        router.receive(b"not json")


def test_a_signature_subscription_ends_with_its_notification() -> None:
    router = Router()
    router.connected_again()
    key = subscription_key("signatureSubscribe", ["sig", {"commitment": "confirmed"}])
    router.join(key, Sink(), b"1", 0.0)
    [request] = sent(router)
    acked = router.receive(answer(request["id"], 3))
    assert isinstance(acked, Acked)
    done = router.receive(notification("signatureNotification", 3, {"value": {"err": None}}))
    assert isinstance(done, Notify) and done.ended and len(done.members) == 1
    assert router.channels == {} and router.take_outbox() == []  # Solana ended it itself
    assert router.receive(notification("signatureNotification", 3, {})) is None


def test_a_lost_upstream_resubscribes_everything_and_names_who_missed_what() -> None:
    router = Router()
    router.connected_again()
    slots = subscription_key("slotSubscribe", [])
    member_sink, waiting_sink = Sink(), Sink()
    router.join(slots, member_sink, b"1", 0.0)
    acked = router.receive(answer(sent(router)[0]["id"], 1))
    assert isinstance(acked, Acked)
    [(member, _)] = acked.joined
    stopped = router.lost(100.0)
    assert stopped == [member]
    router.join(slots, waiting_sink, b"2", 0.0)  # joins while no upstream: waits
    assert router.take_outbox() == []
    assert router.receive(notification("slotNotification", 1, {})) is None  # old ids gone
    router.connected_again()
    [again] = sent(router)
    assert again["method"] == "slotSubscribe"
    resumed = router.receive(answer(again["id"], 77))
    assert isinstance(resumed, Acked)
    assert resumed.resumed == [member] and resumed.lost_at == 100.0
    assert [w.sink for _, w in resumed.joined] == [waiting_sink]  # no gap: it had none
    pushed = router.receive(notification("slotNotification", 77, {}))
    assert isinstance(pushed, Notify) and len(pushed.members) == 2
    # A second loss: only the time of the new one counts.
    router.lost(200.0)
    router.connected_again()
    again = sent(router)[0]
    later = router.receive(answer(again["id"], 78))
    assert isinstance(later, Acked) and later.lost_at == 200.0 and len(later.resumed) == 2


def test_waiters_nobody_answers_expire() -> None:
    router = Router()
    sink = Sink()
    router.join(subscription_key("slotSubscribe", []), sink, b"1", 5.0)
    assert router.expire(4.0) == []
    [(channel, waiter)] = router.expire(6.0)
    assert waiter.sink is sink and channel.key.method == "slotSubscribe"
    assert router.channels == {}


class PushSink:
    """A client connection as the hub drives it: records what it is handed."""

    closing = False
    gap_notices = False

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.frames: list[bytes] = []
        self.closed: tuple[int, str] | None = None

    def push(self, frame: bytes, cu: int) -> None:
        if self.fail:
            raise RuntimeError("a bug in one connection's push")
        self.frames.append(frame)

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def ended(self, member: Any) -> None:
        pass


async def test_a_push_that_fails_costs_that_client_only() -> None:
    hub = SolanaHub("solana/devnet", [], 5.0)
    router = hub.router
    router.connected_again()
    key = subscription_key("slotSubscribe", [])
    sinks = [PushSink(), PushSink(fail=True), PushSink()]
    for n, sink in enumerate(sinks):
        router.join(key, sink, b"%d" % n, 0.0)  # type: ignore[arg-type]
    [request] = sent(router)
    router.receive(answer(request["id"], 9))
    outcome = router.receive(notification("slotNotification", 9, {"slot": 5}))
    assert isinstance(outcome, Notify) and len(outcome.members) == 3
    await hub._apply(outcome)
    good = [sinks[0], sinks[2]]
    assert [len(s.frames) for s in good] == [1, 1] and all(s.closed is None for s in good)
    assert frame_json(sinks[2].frames[0])["params"]["result"] == {"slot": 5}
    assert sinks[1].closed == (1011, "internal error")


def test_a_client_going_away_drops_only_what_it_waits_for() -> None:
    router = Router()
    router.connected_again()
    gone, stays = Sink(), Sink()
    keys = [subscription_key("accountSubscribe", [f"{PK[:-1]}{c}"]) for c in "ABC"]
    for key in keys:
        router.join(key, gone, b"1", 0.0)
    router.join(keys[0], stays, b"2", 0.0)
    requests = sent(router)
    assert len(requests) == 3
    router.forget(gone)
    # The keys only it waited for are given up (unsubscribed when their answers come).
    assert list(router.channels) == [keys[0]]
    assert [w.sink for w in router.channels[keys[0]].waiting] == [stays]
    router.forget(gone)  # twice: nothing more
    acked = router.receive(answer(requests[0]["id"], 4))
    assert isinstance(acked, Acked) and [w.sink for _, w in acked.joined] == [stays]
    assert router.receive(answer(requests[1]["id"], 5)) is None
    assert [m["method"] for m in sent(router)] == ["accountUnsubscribe"]
    assert router.expire(10.0) == []  # nobody waits any more


class RefusedSink(PushSink):
    def __init__(self, fail: bool = False) -> None:
        super().__init__(fail)
        self.errors: list[bytes] = []

    def refused(self, id_raw: bytes, error: bytes) -> None:
        if self.fail:
            raise RuntimeError("a bug in one connection's refusal")
        self.errors.append(error)


async def test_a_failure_telling_one_client_of_an_expiry_ends_neither_hub_nor_others() -> None:
    hub = SolanaHub("solana/devnet", [], 0.02)
    sinks = [RefusedSink(fail=True), RefusedSink()]
    long_ago = trio.current_time() - 10
    for n, sink in enumerate(sinks):
        key = subscription_key("accountSubscribe", [f"{PK[:-1]}{'AB'[n]}"])
        hub.router.join(key, sink, b"%d" % n, long_ago)  # type: ignore[arg-type]
    with trio.move_on_after(0.2):
        await hub._expire()  # runs until cancelled: it must not raise
    assert sinks[0].closed == (1011, "internal error")
    assert len(sinks[1].errors) == 1 and json.loads(sinks[1].errors[0])["code"] == -32002
    assert hub.router.channels == {}
