"""One metering record (issue 33): a request's sample goes through one sink, ``record``, that
writes the usage row and the latency together — on both twins, and from the Python path's
``book`` as from the lane."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chaingate import twins as impl_module
from chaingate.auth.gate import Principal, book, samples
from chaingate.auth.keygate import KeyGate
from chaingate.twintypes.metering import UNTIMED, Sample


@pytest.fixture(params=["compiled", "pure"])
def gate(request: pytest.FixtureRequest) -> KeyGate:
    if request.param == "pure":
        twin = impl_module.pure()
    else:
        try:
            twin = impl_module.compiled()
        except ImportError:
            pytest.skip("compiled modules not built")
    registry = SimpleNamespace(recent={}, used=set())
    return KeyGate(registry, twin.limiter, twin.fastlane)  # type: ignore[arg-type]


def _principal() -> Principal:
    twin = impl_module.pure()
    return Principal(
        key_id="k",
        account_id="a",
        limiter=twin.limiter.KeyLimiter(1.0, 1.0, 0.0),
        quota=twin.limiter.DayQuota(1, 0),
    )


def _books(gate: KeyGate) -> tuple[list[tuple[str, str, int, int, int]], list[tuple[str, str]]]:
    usage = [
        (network, method, r, u, e) for _k, _a, network, method, _m, r, u, e in gate.meter.drain()
    ]
    latency = [(network, method) for _a, network, method, _m, _c in gate.latency.drain()]
    return usage, latency


def test_one_sample_writes_usage_and_latency_in_one_record(gate: KeyGate) -> None:
    principal = _principal()
    gate.record(principal, "eth/main", "eth_call", 1, 26, 0, 0.01)
    assert _books(gate) == ([("eth/main", "eth_call", 1, 26, 0)], [("eth/main", "eth_call")])
    # Untimed: usage only.  Nothing to count: latency only (a batch's, under "batch").
    gate.record(principal, "eth/main", "eth_call", 1, 26, 1, UNTIMED)
    gate.record(principal, "eth/main", "batch", 0, 0, 0, 0.01)
    assert _books(gate) == ([("eth/main", "eth_call", 1, 26, 1)], [("eth/main", "batch")])
    # Units without a request (pushed notifications) are still usage.
    gate.record(principal, "eth/main", "eth_subscription", 0, 5, 0, UNTIMED)
    assert _books(gate) == ([("eth/main", "eth_subscription", 0, 5, 0)], [])


def test_the_python_path_books_a_request_as_samples(gate: KeyGate) -> None:
    principal = _principal()
    # A single call: one sample carries its usage and its latency, as the lane books it.
    assert samples(principal, "eth/main", [("eth_call", 1, 26, 0)], "eth_call", 0.5) == [
        Sample(principal, "eth/main", "eth_call", 1, 26, 0, 0.5)
    ]
    # A batch: a sample per row, untimed, and the latency under "batch".
    rows = [("eth_call", 1, 26, 0), ("eth_chainId", 1, 0, 1)]
    assert samples(principal, "eth/main", rows, "batch", 0.5) == [
        Sample(principal, "eth/main", "eth_call", 1, 26, 0),
        Sample(principal, "eth/main", "eth_chainId", 1, 0, 1),
        Sample(principal, "eth/main", "batch", seconds=0.5),
    ]
    book(gate, principal, "eth/main", rows, "batch", 0.5)
    assert _books(gate) == (
        [("eth/main", "eth_call", 1, 26, 0), ("eth/main", "eth_chainId", 1, 0, 1)],
        [("eth/main", "batch")],
    )
