"""The request of each scenario, and the check that every target answers it alike."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from benchkit import distinct
from benchkit.evm import Contract

CHAINGATE, NGINX, DIRECT = "chaingate", "nginx", "direct"
BASELINE = "baseline"  # another chaingate build (bench/run.py --baseline)
ALL_TARGETS = (CHAINGATE, NGINX, DIRECT)
# A paced scenario (the latency target): its requests at this share of chaingate's peak for
# them, against chaingate and the node, for the p99 chaingate adds; nginx at the same rate shows
# what a proxy adds on this machine (three processes on its cores, not two).
PACED_FRACTION = 0.5
PACED_TOLERANCE = 0.10  # a paced run further off its rate is measured again, then flagged
PACED_TARGETS = (CHAINGATE, NGINX, DIRECT)
LATENCY_TARGET_MS = 1.0
LATENCY_NOTE = f"latency target: p99 added <= {LATENCY_TARGET_MS:.0f} ms"


@dataclass(frozen=True)
class Scenario:
    key: str  # the --scenarios name
    label: str  # the table's scenario column
    body: bytes
    targets: tuple[str, ...]
    note: str = ""
    # distinct-...: a file of request templates (benchkit/distinct.py), one per request in
    # turn; ``body`` is then the first of them, its ids filled in.
    requests: Path | None = None
    # A paced scenario: the one whose requests it sends, whose chaingate peak sets its rate.
    paces: Scenario | None = None


class WrongAnswer(Exception):
    """A target answered the scenario's request wrongly, or differently from the node."""


def _call(method: str, params: list[Any], call_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}


def _encode(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def batch_calls(accounts: list[str], contract: Contract) -> list[dict[str, Any]]:
    """20 calls: node facts, fees, balances of ten accounts, code, storage and a contract call."""
    methods: list[tuple[str, list[Any]]] = [
        ("eth_blockNumber", []),
        ("eth_chainId", []),
        ("eth_gasPrice", []),
        ("net_version", []),
        ("eth_getTransactionCount", [contract.deployer, "latest"]),
        ("eth_getCode", [contract.address, "latest"]),
        ("eth_getStorageAt", [contract.address, "0x0", "latest"]),
        ("eth_call", [{"to": contract.address, "data": "0x"}, "latest"]),
    ]
    methods += [("eth_getBalance", [account, "latest"]) for account in accounts]
    methods += [("eth_blockNumber", []), ("eth_chainId", [])]
    methods = methods[:20]
    if len(methods) != 20:
        raise ValueError(f"need 10 unlocked accounts for a 20-call batch, got {len(accounts)}")
    return [_call(method, params, index) for index, (method, params) in enumerate(methods, 1)]


def paced(of: Scenario, key: str, prefix: str, note: str = LATENCY_NOTE) -> Scenario:
    """``of``'s requests paced at PACED_FRACTION of chaingate's peak for them; ``prefix`` is
    the label's "(x)"."""
    own = of.label.split(" ", 1)
    label = f"{prefix} {own[1]} paced at {PACED_FRACTION:.0%} of {own[0]} peak"
    return Scenario(key, label, of.body, PACED_TARGETS, note, of.requests, paces=of)


def build(accounts: list[str], contract: Contract) -> dict[str, Scenario]:
    block = _encode(_call("eth_blockNumber", []))
    eth_call = [{"to": contract.address, "data": "0x"}, "latest"]
    peak = Scenario("block", "(a) eth_blockNumber", block, ALL_TARGETS, "proxied, coalescing on")
    scenarios = [
        peak,
        Scenario(
            "block-nocoalesce",
            "(a') eth_blockNumber, coalesce off",
            block,
            (CHAINGATE,),
            "second chaingate process with [rpc] coalesce = false",
        ),
        Scenario(
            "chainid",
            "(b) eth_chainId (cached)",
            _encode(_call("eth_chainId", [])),
            (CHAINGATE, DIRECT, NGINX),
            "static cache in chaingate; nginx for reference",
        ),
        Scenario(
            "batch",
            "(c) batch of 20",
            _encode(batch_calls(accounts, contract)),
            ALL_TARGETS,
            "eth_blockNumber, eth_chainId, eth_gasPrice, net_version, nonce, code, storage, "
            "eth_call, 10x eth_getBalance",
        ),
        Scenario(
            "call",
            "(d) eth_call",
            _encode(_call("eth_call", eth_call)),
            ALL_TARGETS,
            "hand-assembled contract returning storage slot 0",
        ),
        paced(peak, "paced", "(e)"),
    ]
    return {scenario.key: scenario for scenario in scenarios}


DISTINCT_NOTES = {
    "balance": "`eth_getBalance` at latest of 10,000 addresses in turn (holders of the devnet's "
    "tokens)",
    "call": "`eth_call` at latest of `balanceOf(holder)`, 10,000 holders in turn, on CGT and "
    "CGUSD alternately",
    "receipt": "`eth_getTransactionReceipt` of the mined CGT transfers in turn (within 64 "
    "blocks of the head: not cached)",
    "logs": "`eth_getLogs` of CGT Transfers to one recipient over 1-7 blocks around its "
    "transfer (one log each), the transfers in turn",
    "mix": "the four kinds above drawn at random with weights "
    + ", ".join(f"{kind} {weight}" for kind, weight in distinct.MIX_WEIGHTS.items()),
    "batch": f"batches of {distinct.BATCH_SIZE} calls drawn as the mix's",
}


def build_distinct(chain: distinct.Chain, directory: Path) -> dict[str, Scenario]:
    """The ``distinct-...`` scenarios, their templates written under ``directory``, and each
    one paced (``paced-distinct-...``)."""
    found = {}
    for index, (kind, note) in enumerate(DISTINCT_NOTES.items()):
        path = distinct.write(chain, kind, directory)
        first = distinct.render(distinct.read(path)[0])
        label = f"(f{index + 1}) distinct {kind}"
        key = f"distinct-{kind}"
        found[key] = Scenario(key, label, first, ALL_TARGETS, note + "; every id its own", path)
        note = f"{LATENCY_NOTE}; the requests of (f{index + 1}), every id its own"
        found[f"paced-{key}"] = paced(found[key], f"paced-{key}", f"(e-f{index + 1})", note)
    return found


def _calls(scenario: Scenario) -> list[dict[str, Any]]:
    bodies = (
        [scenario.body]
        if scenario.requests is None
        else [distinct.render(line) for line in distinct.read(scenario.requests)]
    )
    calls: list[dict[str, Any]] = []
    for body in bodies:
        request = json.loads(body)
        calls += request if isinstance(request, list) else [request]
    return calls


def methods(scenario: Scenario) -> set[str]:
    """The JSON-RPC methods the scenario's requests call."""
    return {call["method"] for call in _calls(scenario)}


def call_targets(scenario: Scenario) -> set[str]:
    """The addresses the scenario's ``eth_call`` requests target."""
    return {
        call["params"][0]["to"]
        for call in _calls(scenario)
        if call["method"] == "eth_call" and call["params"] and "to" in call["params"][0]
    }


def _decoded(url: str, coding: str, data: bytes) -> bytes:
    """The answer's body with its Content-Encoding (set with --accept-encoding) undone."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return data
    if coding == "gzip":
        return zlib.decompress(data, wbits=31)
    if coding == "deflate":
        return zlib.decompress(data)
    if coding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise WrongAnswer(
        f"{url}: answered with Content-Encoding {coding!r}, which the check cannot undo"
    )


def post(
    url: str, body: bytes, headers: Mapping[str, str] | None = None, timeout: float = 10.0
) -> Any:
    request = urllib.request.Request(
        url, body, {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if response.status != 200:
            raise WrongAnswer(f"{url}: HTTP {response.status}")
        coding = response.headers.get("Content-Encoding", "")
        return json.loads(_decoded(url, coding, response.read()))


def _results(reply: Any, body: bytes) -> Any:
    """The result(s) of a reply, checked for shape, ids and errors."""
    request = json.loads(body)
    if isinstance(request, list):
        if not isinstance(reply, list) or len(reply) != len(request):
            raise WrongAnswer(f"batch of {len(request)} answered by {str(reply)[:200]}")
        if [item.get("id") for item in reply] != [item["id"] for item in request]:
            raise WrongAnswer("batch replies are not in request order")
        return [_single(item, call["id"]) for item, call in zip(reply, request, strict=True)]
    return _single(reply, request["id"])


def _single(reply: Any, call_id: Any) -> Any:
    if not isinstance(reply, dict) or reply.get("jsonrpc") != "2.0" or reply.get("id") != call_id:
        raise WrongAnswer(f"malformed reply: {str(reply)[:200]}")
    if "error" in reply or "result" not in reply:
        raise WrongAnswer(f"error reply: {str(reply)[:200]}")
    return reply["result"]


def check(
    scenario: Scenario,
    urls: dict[str, str],
    expected: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """Send the request once to each target and to the node, with the same ``headers`` (the
    API key when auth is on) as wrk's load; all must agree (and match ``expected`` when given)."""
    reference = _results(post(urls[DIRECT], scenario.body, headers), scenario.body)
    if expected is not None and reference != expected:
        raise WrongAnswer(f"{scenario.label}: the node answered {reference}, expected {expected}")
    for target in scenario.targets:
        answer = _results(post(urls[target], scenario.body, headers), scenario.body)
        if answer != reference:
            raise WrongAnswer(
                f"{scenario.label}: {target} answered {str(answer)[:300]}, "
                f"the node answers {str(reference)[:300]}"
            )
    return reference


def check_distinct(
    scenario: Scenario, urls: dict[str, str], headers: Mapping[str, str] | None, samples: int = 8
) -> Any:
    """``check`` of ``samples`` of the scenario's templates spread over its file; a null result
    (an unknown receipt, say) is wrong too."""
    if scenario.requests is None:
        return check(scenario, urls, None, headers)
    lines = distinct.read(scenario.requests)
    step = max(1, len(lines) // samples)
    answer: Any = None
    for index in range(0, len(lines), step)[:samples]:
        sample = dataclasses.replace(scenario, body=distinct.render(lines[index], index + 1))
        answer = check(sample, urls, None, headers)
        if answer is None or (isinstance(answer, list) and None in answer):
            raise WrongAnswer(f"{scenario.label}: the node answered null to {lines[index][:200]}")
    return answer
