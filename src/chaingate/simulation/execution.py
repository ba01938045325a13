"""What one simulated transaction did, read from either node answer (sans-IO).

Two answers carry it (``simulator.py`` asks for them):

* ``eth_simulateV1`` with ``traceTransfers``: the call's status, gas, return data and logs, the
  native transfers among them as ERC-7528 logs (``Transfer`` from ``0xEeee...EEeE``), internal
  ones included.  No call tree.
* ``debug_traceCall`` with ``callTracer`` and ``withLog``: the call tree, each frame with its
  value, input, output, error and the logs it emitted (``position``: how many of its sub-calls
  ran before each log).

Either becomes an ``Outcome``: ``events`` — native transfers and logs in execution order, only
those that took effect (a reverted frame undoes its own and its sub-frames' events; a reverted
transaction moved nothing) — plus status, gas, return or revert data, and the frame tree when
the answer had one.  The trace walk is bounded (``Bounds``): a trace past them is refused, never
half read.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "MAX_DEPTH",
    "NATIVE_TOKEN",
    "Bounds",
    "EventLog",
    "Frame",
    "NativeMove",
    "Outcome",
    "SimulatedCall",
    "TooLarge",
    "TraceLog",
    "from_simulate_v1",
    "from_trace",
    "in_order",
]

# ERC-7528: the address standing for the native currency in token-shaped events; eth_simulateV1
# logs native transfers from it.
NATIVE_TOKEN = "0xeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"  # noqa: S105 - an address
_TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
_VALUE_FRAMES = frozenset({"CALL", "CREATE", "CREATE2", "SELFDESTRUCT"})
# Calls nested deeper than this are refused (the EVM allows 1,024): a tree that deep is read
# and written as JSON by recursion, two levels a call, within the interpreter's limit.
MAX_DEPTH = 256


class TooLarge(Exception):
    """The answer passed a bound: ``what`` (frames or logs) and the ``limit``."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"the simulation's trace has more than {limit} {what}")
        self.what = what
        self.limit = limit


class Bounds(msgspec.Struct, frozen=True):
    frames: int
    logs: int


# --- the node's answers, as msgspec reads them -------------------------------------------------


class TraceLog(msgspec.Struct):
    address: str
    topics: list[str] = []
    data: str = "0x"
    position: str | None = None


class Frame(msgspec.Struct):
    """A callTracer frame (geth's shape, which anvil and erigon share)."""

    type: str
    sender: str = msgspec.field(name="from")
    to: str | None = None
    value: str | None = None
    gas: str | None = None
    gasUsed: str | None = None
    input: str = "0x"
    output: str | None = None
    error: str | None = None
    calls: list[Frame] = []
    logs: list[TraceLog] = []


class _SimLog(msgspec.Struct):
    address: str
    topics: list[str] = []
    data: str = "0x"


class _SimError(msgspec.Struct):
    message: str = ""
    code: int | None = None


class SimulatedCall(msgspec.Struct):
    """One call's result in eth_simulateV1's answer."""

    status: str
    gasUsed: str = "0x0"
    returnData: str = "0x"
    logs: list[_SimLog] = []
    error: _SimError | None = None


# --- the outcome ----------------------------------------------------------------------------


class NativeMove(msgspec.Struct, frozen=True, array_like=True):
    sender: str
    receiver: str
    value: int


class EventLog(msgspec.Struct, frozen=True, array_like=True):
    address: str
    topics: list[str]
    data: str


Event = NativeMove | EventLog


class Outcome(msgspec.Struct):
    ok: bool
    gas_used: int
    # The return data when ok, the revert data when not (empty for a failure without any).
    output: bytes
    # The node's words for a failure ("execution reverted", "out of gas"...), None when ok.
    failure: str | None
    events: list[Any]  # NativeMove | EventLog, in execution order
    root: Frame | None = None  # the call tree, when the answer had one


def _int(value: str | None) -> int:
    if not value:
        return 0
    try:
        return int(value, 16)
    except ValueError:
        return 0


def _bytes(value: str | None) -> bytes:
    if not value or value == "0x":
        return b""
    try:
        return bytes.fromhex(value[2:] if value[:2] in ("0x", "0X") else value)
    except ValueError:
        return b""


def _native_log(topics: list[str], data: str) -> NativeMove | None:
    """A traceTransfers log, as the transfer it stands for (None: not one)."""
    if len(topics) != 3 or topics[0].lower() != _TRANSFER or len(data) != 66:
        return None
    return NativeMove("0x" + topics[1][-40:].lower(), "0x" + topics[2][-40:].lower(), _int(data))


def from_simulate_v1(call: SimulatedCall, bounds: Bounds) -> Outcome:
    ok = _int(call.status) == 1
    gas = _int(call.gasUsed)
    if not ok:
        # Nothing a failed transaction did stays (some nodes still list its value's transfer).
        failure = call.error.message if call.error is not None else "execution failed"
        return Outcome(False, gas, _bytes(call.returnData), failure or "execution failed", [])
    if len(call.logs) > bounds.logs:
        raise TooLarge("logs", bounds.logs)
    events: list[Any] = []
    for log in call.logs:
        if log.address.lower() == NATIVE_TOKEN:
            move = _native_log(log.topics, log.data)
            if move is not None:
                if move.value:
                    events.append(move)
                continue
        events.append(EventLog(log.address.lower(), log.topics, log.data))
    return Outcome(True, gas, _bytes(call.returnData), None, events)


def in_order(frame: Frame) -> list[Frame | TraceLog]:
    """A frame's logs and sub-calls in the order they ran."""
    if not frame.logs:
        return list(frame.calls)
    keyed: list[tuple[int, int, Frame | TraceLog]] = [
        (index, 1, call) for index, call in enumerate(frame.calls)
    ]
    for log in frame.logs:
        at = _int(log.position) if log.position is not None else len(frame.calls)
        keyed.append((at, 0, log))
    keyed.sort(key=lambda entry: (entry[0], entry[1]))
    return [entry for _, _, entry in keyed]


def from_trace(root: Frame, bounds: Bounds) -> Outcome:
    """The events of a callTracer tree, bounded; every frame and log counted."""
    frames = logs = 0
    events: list[Any] = []
    # A frame with whether its events count (it and its callers succeeded) and its depth,
    # or a log to emit.
    stack: list[tuple[Frame, bool, int] | TraceLog] = [(root, True, 1)]
    while stack:
        item = stack.pop()
        if isinstance(item, TraceLog):
            events.append(EventLog(item.address.lower(), item.topics, item.data))
            continue
        frame, counts, depth = item
        frames += 1
        logs += len(frame.logs)
        if frames > bounds.frames:
            raise TooLarge("frames", bounds.frames)
        if logs > bounds.logs:
            raise TooLarge("logs", bounds.logs)
        if depth > MAX_DEPTH:
            raise TooLarge("levels of nested calls", MAX_DEPTH)
        counts = counts and frame.error is None
        if counts:
            value = _int(frame.value)
            if value and frame.type.upper() in _VALUE_FRAMES and frame.to:
                events.append(NativeMove(frame.sender.lower(), frame.to.lower(), value))
        # Logs and sub-calls interleaved as they ran: a log's position is the number of
        # sub-calls before it (none given: after them).  Pushed in reverse, popped in order.
        for entry in reversed(in_order(frame)):
            if isinstance(entry, Frame):
                stack.append((entry, counts, depth + 1))
            elif counts:
                stack.append(entry)
    ok = root.error is None
    output = _bytes(root.output)
    return Outcome(ok, _int(root.gasUsed), output, root.error, events if ok else [], root)
