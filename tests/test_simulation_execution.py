"""The simulated call tree is the one the chain runs: a transaction is simulated through
chaingate (``chaingate_simulateExecution``, NESTED and FLAT), then sent for real on a snapshot
and traced by anvil itself (``debug_traceTransaction``); every frame's type, from, to, value,
input, output and error must match, and the logs must be the receipt's — a reverted inner
call's log absent from both.  Calls and logs are decoded where the ABI is known.  Both engines'
gateways answer it with a trace; both framing twins and stores (the oracle module's fixtures).
"""

from __future__ import annotations

from typing import Any

from tests.helpers import GatewayHandle
from tests.test_simulation_oracle import ETHER, World, call, sim, simulate, world

__all__ = ["sim", "world"]  # the oracle module's fixtures, used here

_FIELDS = ("type", "from", "to", "value", "input", "output", "error")


def shape(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame's facts (not its gas: a block's context differs) and its sub-calls'."""
    out = {field: (frame.get(field) or "").lower() for field in _FIELDS}
    out["value"] = out["value"] or "0x0"
    out["output"] = "" if out["output"] == "0x" else out["output"]
    out["calls"] = [shape(child) for child in frame.get("calls", [])]
    return out


def truth(world: World, tx: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(anvil's own call tree, the receipt's logs) of ``tx`` sent for real, then undone."""
    snapshot = world.chain.snapshot()
    try:
        receipt = world.chain.send(tx)
        config = {"tracer": "callTracer", "tracerConfig": {"withLog": True}}
        tree = world.chain.rpc.call("debug_traceTransaction", receipt["transactionHash"], config)
    finally:
        world.chain.revert(snapshot)
    return tree, receipt["logs"]


async def test_the_call_tree_and_logs_are_the_ones_the_chain_runs(
    sim: GatewayHandle, world: World
) -> None:
    a, b, c, d = world.players
    cases = [
        call(a, world.forwarder, "forwardThenFail(address)", b, value=1000),
        call(a, world.forwarder, "split(address[])", [b, c, d], value=3 * ETHER),
        call(
            a,
            world.items,
            "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)",
            a,
            c,
            [1, 3],
            [2, 5],
            b"",
        ),
    ]
    for tx in cases:
        nested = await simulate(sim, "chaingate_simulateExecution", ["NESTED", tx])
        flat = await simulate(sim, "chaingate_simulateExecution", ["FLAT", tx])
        tree, logs = truth(world, tx)
        (root,) = nested["calls"]
        assert shape(root) == shape(tree), tx
        # FLAT: the same frames depth first.
        order: list[dict[str, Any]] = []

        def walk(frame: dict[str, Any], into: list[dict[str, Any]]) -> None:
            into.append({k: v for k, v in shape(frame).items() if k != "calls"})
            for child in frame.get("calls", []):
                walk(child, into)

        walk(tree, order)
        assert [{k: v for k, v in shape(f).items() if k != "calls"} for f in flat["calls"]] == order
        seen = [(x["address"], x["topics"], x["data"]) for x in nested["logs"]]
        assert seen == [(x["address"].lower(), x["topics"], x["data"]) for x in logs]
        assert flat["logs"] == nested["logs"]


async def test_frames_and_logs_are_decoded_and_a_reverted_call_says_why(
    sim: GatewayHandle, world: World
) -> None:
    a, b, *_ = world.players
    tx = call(a, world.forwarder, "forwardThenFail(address)", b, value=1000)
    result = await simulate(sim, "chaingate_simulateExecution", ["NESTED", tx])
    (root,) = result["calls"]
    failed = next(child for child in root["calls"] if child.get("error"))
    assert failed["revertReason"] == "SimForwarder: inner refused"
    assert "error" not in result  # the transaction itself succeeded
    batch = call(
        a,
        world.items,
        "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)",
        a,
        b,
        [1, 2],
        [3, 4],
        b"",
    )
    traced = await simulate(sim, "chaingate_simulateExecution", [batch])
    decoded = traced["calls"][0]["decoded"]
    assert decoded["methodName"] == "safeBatchTransferFrom"
    assert decoded["inputs"][2] == {"name": "ids", "type": "uint256[]", "value": ["1", "2"]}
    event = traced["logs"][0]["decoded"]
    assert event["eventName"] == "TransferBatch"
    assert [i["name"] for i in event["inputs"]] == ["operator", "from", "to", "ids", "values"]
    reverted = await simulate(
        sim, "chaingate_simulateExecution", [call(a, world.forwarder, "failString()")]
    )
    assert reverted["error"] == "execution reverted: SimForwarder: refused"
    assert reverted["revertReason"] == "SimForwarder: refused"
