"""Parameters drawn from a chain's recent blocks: addresses, transactions, log emitters.

Requests are built from what the chain really holds, a few blocks behind its head so that every
target (a node, a gateway, a provider lagging a block) has them, and pinned to those blocks so
each has one right answer.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaingate.benchsuite.rpcwire import Call

TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
BALANCE_OF = "0x70a08231"  # balanceOf(address)
ZERO_ADDRESS = "0x" + "00" * 20
MAX_TOKENS = 20  # token contracts probed with balanceOf before the load
MAX_ACCOUNTS = 20  # addresses probed with eth_getCode for accounts without code


class SampleError(RuntimeError):
    pass


class RateLimited(SampleError):
    """A 429: the target's rate limit, to wait out (``retry_after`` seconds), not a failure."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# Drawing parameters through a rate-limited key (a Free plan's 10 requests a second) waits for
# its allowance: at most this many waits per call, each at most MAX_RETRY_AFTER seconds.
RATE_LIMIT_WAITS = 10
MAX_RETRY_AFTER = 5.0


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> bytes:
    """One POST of a JSON body, the raw answer; a clear error for anything but a 2xx."""
    # http(s) only: parse_targets refuses any other scheme.
    request = urllib.request.Request(  # noqa: S310
        url, data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    return _fetch(request, timeout)


def get(url: str, headers: dict[str, str], timeout: float) -> bytes:
    """One GET, the raw answer; a clear error for anything but a 2xx."""
    return request("GET", url, headers, timeout)


def request(method: str, url: str, headers: dict[str, str], timeout: float) -> bytes:
    """One request without a body (GET, DELETE), the raw answer; an error but for a 2xx."""
    return _fetch(urllib.request.Request(url, headers=headers, method=method), timeout)  # noqa: S310


def _fetch(request: urllib.request.Request, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            data: bytes = answer.read()
            return data
    except urllib.error.HTTPError as exc:
        message = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        if exc.code == 429:
            raise RateLimited(message, _retry_after(exc.headers.get("Retry-After"))) from None
        raise SampleError(message) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SampleError(str(exc)) from None


def _retry_after(value: str | None) -> float:
    """Retry-After's seconds (1 when absent or a date), bounded by MAX_RETRY_AFTER."""
    try:
        seconds = float(value or "1")
    except ValueError:
        return 1.0
    return min(max(seconds, 0.1), MAX_RETRY_AFTER) if math.isfinite(seconds) else 1.0


Rpc = Callable[[str, list[Any]], Any]  # (method, params) -> result


def rpc_caller(url: str, headers: dict[str, str], timeout: float, count: Callable[[], None]) -> Rpc:
    def call(method: str, params: list[Any]) -> object:
        payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        for waits in range(RATE_LIMIT_WAITS + 1):
            count()
            try:
                raw = post(url, payload.encode(), headers, timeout)
                break
            except RateLimited as limited:
                if waits == RATE_LIMIT_WAITS:
                    raise
                time.sleep(limited.retry_after)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise SampleError(f"{method}: the answer is not JSON") from None
        if not isinstance(answer, dict) or "result" not in answer:
            raise SampleError(f"{method}: {str(answer)[:200]}")
        return answer["result"]

    return call


@dataclass
class Pool:
    chain_id: str
    head: int
    blocks: list[int]
    addresses: list[str]
    transactions: list[str]
    contracts: list[str]  # log emitters
    holders: list[str] = field(default_factory=list)  # recipients of Transfer logs
    tokens: list[str] = field(default_factory=list)  # ERC-20s: Transfer logs of 3 topics
    # Blocks whose state the node still holds (a full node prunes old state, an archive node
    # does not): balances and calls are pinned to these.
    state_blocks: list[int] = field(default_factory=list)
    # Addresses without code at the newest of those: an eth_call to one answers "0x".  (A
    # contract runs its fallback on empty calldata: it may revert or, as the deterministic
    # deployer does, run out of gas.)
    accounts: list[str] = field(default_factory=list)

    def describe(self) -> str:
        low, high = (self.blocks[0], self.blocks[-1]) if self.blocks else (0, 0)
        return (
            f"blocks {low} to {high} (head {self.head}): {len(self.addresses)} addresses, "
            f"{len(self.transactions)} transactions, {len(self.contracts)} log emitters, "
            f"{len(self.tokens)} tokens answering balanceOf, {len(self.accounts)} accounts "
            f"without code; state read at {len(self.state_blocks)} of the blocks"
        )


def sample(rpc: Rpc, blocks: int, lag: int) -> Pool:
    head = int(rpc("eth_blockNumber", []), 16)
    chain_id = str(rpc("eth_chainId", []))
    newest = max(head - lag, 0)
    numbers = list(range(max(newest - blocks + 1, 0), newest + 1))
    addresses: set[str] = set()
    transactions: list[str] = []
    for number in numbers:
        block = rpc("eth_getBlockByNumber", [hex(number), True])
        if not isinstance(block, dict):
            raise SampleError(f"block {number}: {str(block)[:100]}")
        addresses.add(str(block.get("miner") or ZERO_ADDRESS).lower())
        for tx in block.get("transactions") or []:
            transactions.append(tx["hash"])
            for party in (tx.get("from"), tx.get("to")):
                if party:
                    addresses.add(party.lower())
    logs = rpc("eth_getLogs", [{"fromBlock": hex(numbers[0]), "toBlock": hex(numbers[-1])}])
    contracts = sorted({str(log["address"]).lower() for log in logs})
    erc20 = [
        log
        for log in logs
        if len(log.get("topics", [])) == 3 and log["topics"][0] == TRANSFER_TOPIC
    ]
    holders = sorted({"0x" + log["topics"][2][-40:] for log in erc20})
    tokens = sorted({str(log["address"]).lower() for log in erc20})
    pool = Pool(chain_id, head, numbers, sorted(addresses), transactions, contracts, holders)
    pool.state_blocks = _state_window(rpc, numbers, pool.addresses[0])
    if pool.state_blocks:
        pool.tokens = _answering(rpc, tokens[:MAX_TOKENS], holders or pool.addresses, pool)
        if not pool.tokens:
            pool.accounts = _without_code(rpc, pool.addresses[:MAX_ACCOUNTS], pool)
    return pool


def _answering(rpc: Rpc, tokens: list[str], holders: list[str], pool: Pool) -> list[str]:
    """The tokens whose ``balanceOf`` answers (a contract emitting an ERC-20-like Transfer may
    still revert it): calls to the rest would measure reverts."""
    kept = []
    for token in tokens:
        call = _balance_of(token, holders[0], pool.state_blocks[-1])
        try:
            rpc(call.method, call.params)
        except SampleError:
            continue
        kept.append(token)
    return kept


def _without_code(rpc: Rpc, addresses: list[str], pool: Pool) -> list[str]:
    """The addresses that hold no code at the newest state block (externally owned)."""
    newest = hex(pool.state_blocks[-1])
    return [a for a in addresses if rpc("eth_getCode", [a, newest]) in ("0x", "0x0")]


def _balance_of(token: str, holder: str, block: int) -> Call:
    data = BALANCE_OF + holder[2:].rjust(64, "0")
    return Call("eth_call", [{"to": token, "data": data}, hex(block)], comparable=True)


def _state_window(rpc: Rpc, numbers: list[int], address: str) -> list[int]:
    """The sampled blocks from the oldest whose state the node answers for, to the newest."""
    for index, number in enumerate(numbers):
        try:
            rpc("eth_getBalance", [address, hex(number)])
        except SampleError:
            continue
        return numbers[index:]
    return []


def make_call(kind: str, pool: Pool, rng: random.Random, logs_range: int) -> Call:
    """One request of ``kind`` with parameters drawn from ``pool``."""
    block = rng.choice(pool.blocks)
    state_block = rng.choice(pool.state_blocks) if pool.state_blocks else block
    if kind == "eth_blockNumber":
        return Call(kind, [], comparable=False)  # the head moves: checked for shape only
    if kind == "eth_chainId":
        return Call(kind, [], comparable=True)
    if kind == "eth_getBalance":
        return Call(kind, [rng.choice(pool.addresses), hex(state_block)], comparable=True)
    if kind == "eth_call":
        if pool.tokens:
            holder = rng.choice(pool.holders or pool.addresses)
            return _balance_of(rng.choice(pool.tokens), holder, state_block)
        # A chain without tokens: a call to an account without code, answered "0x".
        return Call(kind, [{"to": rng.choice(pool.accounts), "data": "0x"}, hex(state_block)], True)
    if kind == "eth_getTransactionReceipt":
        return Call(kind, [rng.choice(pool.transactions)], comparable=True)
    if kind == "eth_getBlockByNumber":
        return Call(kind, [hex(block), False], comparable=True)
    if kind == "eth_getLogs":
        low = max(pool.blocks[0], block - logs_range + 1)
        return Call(kind, [{"fromBlock": hex(low), "toBlock": hex(block)}], comparable=True)
    raise ValueError(f"unknown request kind {kind!r}")


def available(kind: str, pool: Pool) -> bool:
    """Whether the chain holds what ``kind`` needs: a receipt a transaction, a balance state."""
    if kind == "eth_getTransactionReceipt":
        return bool(pool.transactions)
    if kind == "eth_getBalance":
        return bool(pool.state_blocks)
    if kind == "eth_call":
        return bool(pool.state_blocks) and bool(pool.tokens or pool.accounts)
    return True
