"""The Solana scenarios: getSlot, getBalance and a finalized getBlock, proxied by chaingate
(``solana/devnet`` in front of the devnet's Solana node) vs nginx in front of the same node vs
the node direct.

The node runs as a process of its own (``solnode.py``) at a validator's pace, so the head moves
every 400 ms while wrk runs: answers are checked alike modulo that (a slot within a few of the
node's), not byte for byte as the EVM scenarios are.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchkit import procs
from benchkit.scenarios import ALL_TARGETS, DIRECT, Scenario, WrongAnswer, _results, post
from chaingate.devnet.anvil import free_port, rpc_call

SOL = 10**9
# How far apart two answers' slots may be: the head moves every 400 ms between the check's
# requests to the targets (and a proxy may answer from a node one probe behind).
SLOT_SLACK = 10
SCENARIO_KEYS = ("solana-slot", "solana-balance", "solana-block")
# What the Solana scenarios call (and the readiness probes): --allowlists puts them on the list.
METHODS = frozenset({"getHealth", "getSlot", "getBalance", "getBlock"})
NOTES = {
    "solana-slot": "`getSlot` (finalized, the default); the head moves every 400 ms; coalescing on",
    "solana-balance": "`getBalance` of a funded account (finalized, the default)",
    "solana-block": "`getBlock` of a finalized slot holding a transfer: an answer that cannot "
    "change (chaingate may cache it)",
}


class SolanaNode:
    """``solnode.py``: the devnet's Solana node, a process in its own session."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.ws_port = free_port()
        script = Path(__file__).with_name("solnode.py")
        argv = [
            sys.executable, str(script), "--port", str(self.port), "--ws-port", str(self.ws_port),
        ]  # fmt: skip
        self.process = procs.ManagedProcess(
            "solana-node", argv, workdir / "solana-node.log", procs._child_env()
        )

    @property
    def url(self) -> str:
        return f"http://{procs.LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30.0) -> SolanaNode:
        self.process.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self.process.alive():
                raise procs.ServerFailed(f"solana node exited:\n{self.process.log_tail()}")
            try:
                rpc_call(self.url, "getHealth", timeout=1.0)
                return self
            except (OSError, RuntimeError, ValueError):
                if time.monotonic() > deadline:
                    raise procs.ServerFailed(
                        f"solana node not ready after {timeout:.0f}s:\n{self.process.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def version(self) -> str:
        found = rpc_call(self.url, "getVersion")
        return str(found.get("solana-core")) if isinstance(found, dict) else "unknown"

    def stop(self) -> None:
        self.process.stop()


def fund(url: str, say: Any, timeout: float = 60.0) -> tuple[str, int]:
    """An account airdropped 5 SOL, waited for until finalized: (its address, the slot of the
    block holding the airdrop)."""
    from solders.keypair import Keypair  # the bench's environment has chaingate's dependencies

    who = str(Keypair().pubkey())
    signature = str(rpc_call(url, "requestAirdrop", [who, 5 * SOL]))
    deadline = time.monotonic() + timeout
    say(f"[solana] airdrop to {who}: waiting for it to be finalized (32 slots, ~13 s)")
    while True:
        statuses = rpc_call(url, "getSignatureStatuses", [[signature]])
        status = statuses["value"][0] if isinstance(statuses, dict) else None
        if status and status.get("confirmationStatus") == "finalized":
            return who, int(status["slot"])
        if time.monotonic() > deadline:
            raise procs.ServerFailed(f"the airdrop {signature} was not finalized in {timeout}s")
        time.sleep(0.5)


def _call(method: str, params: list[Any]) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, separators=(",", ":")
    ).encode()


def build(account: str, slot: int) -> dict[str, Scenario]:
    block = [slot, {"maxSupportedTransactionVersion": 0, "rewards": False}]
    found = [
        Scenario("solana-slot", "(s1) Solana getSlot", _call("getSlot", []), ALL_TARGETS,
                 NOTES["solana-slot"]),
        Scenario("solana-balance", "(s2) Solana getBalance", _call("getBalance", [account]),
                 ALL_TARGETS, NOTES["solana-balance"]),
        Scenario("solana-block", "(s3) Solana getBlock, finalized", _call("getBlock", block),
                 ALL_TARGETS, NOTES["solana-block"]),
    ]  # fmt: skip
    return {scenario.key: scenario for scenario in found}


def _slot_of(result: Any) -> int | None:
    if isinstance(result, int):
        return result
    if isinstance(result, dict) and isinstance(result.get("context"), dict):
        slot = result["context"].get("slot")
        return slot if isinstance(slot, int) else None
    return None


def _settled(result: Any) -> Any:
    """What must be equal across targets: a slot-stamped answer's value (its slot is checked
    for closeness instead); a bare slot, nothing."""
    if isinstance(result, int):
        return None
    if isinstance(result, dict) and "context" in result:
        return result.get("value")
    return result


def check(
    scenario: Scenario,
    urls: dict[str, str],
    expected: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """Each target answers the request like the node: the same value (a block byte for byte),
    a slot within SLOT_SLACK of the node's."""
    reference = _results(post(urls[DIRECT], scenario.body, headers), scenario.body)
    for target in scenario.targets:
        answer = _results(post(urls[target], scenario.body, headers), scenario.body)
        if _settled(answer) != _settled(reference):
            raise WrongAnswer(
                f"{scenario.label}: {target} answered {str(answer)[:300]}, "
                f"the node answers {str(reference)[:300]}"
            )
        ours, theirs = _slot_of(answer), _slot_of(reference)
        if (ours is None) != (theirs is None) or (
            ours is not None and theirs is not None and abs(ours - theirs) > SLOT_SLACK
        ):
            raise WrongAnswer(f"{scenario.label}: {target} at slot {ours}, the node at {theirs}")
    return reference
