"""Real traffic: the ``distinct-...`` scenarios of bench/run.py, where no two requests are alike.

``prepare()`` gives the devnet (bootstrapped as ``chaingate dev`` serves it) what such traffic
reads: 10,000 holders of the devnet's two ERC-20s (CGT and CGUSD, airdropped), then ``transfers``
CGT transfers, one to each of the first holders, mined ``PER_BLOCK`` to a block as the chain's
last blocks.  ``write()`` turns that into request templates, one JSON body per line, each ``@``
an id that wrk's Lua script fills in with a counter (``benchkit/wrkload.py``), so every request
carries its own id and the scenario's requests cycle through the file's different parameters.

Nothing here is cached by chaingate: balances and calls are at ``latest``, logs are never
cached, and the receipts' blocks stay within the network's ``finality_depth`` (64) of the head
(nothing is mined during the bench), so every request is proxied to the node.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaingate.config.manifest import Manifest
from chaingate.devnet.deploy import manual_mining
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi

HOLDERS = 10_000
AIRDROP_CHUNK = 400  # recipients per airdrop transaction (~10M gas: two fit in a block)
PER_BLOCK = 50  # receipt transfers mined to a block: 2,000 stay within 64 blocks of the head
FINALITY_DEPTH = 64  # chaingate's default [chains.*] finality_depth: deeper receipts are cached
BALANCE_OF = "0x70a08231"
TRANSFER_TOPIC = abi.event_topic("Transfer(address,address,uint256)")
ID = "@"  # the id placeholder of a template; no parameter contains it

# The mix's weights: those of `chaingate bench rpc`'s default profile (profiles/rpc.toml) for the
# four kinds whose requests differ from one another.
MIX_WEIGHTS = {"balance": 20, "call": 20, "receipt": 15, "logs": 10}
BATCH_SIZE = 20


@dataclass(frozen=True)
class Transfer:
    tx_hash: str
    block: int
    recipient: str


@dataclass(frozen=True)
class Chain:
    holders: tuple[str, ...]
    tokens: tuple[str, ...]  # CGT, CGUSD
    transfers: tuple[Transfer, ...]


def holder(index: int) -> str:
    """A deterministic address of no one (no key): the index's hash."""
    return "0x" + hashlib.sha256(f"chaingate-bench-holder-{index}".encode()).hexdigest()[:40]


def _word(address: str) -> str:
    return address.removeprefix("0x").lower().rjust(64, "0")


def _mined(rpc: DevnetRpc, hashes: Sequence[str]) -> list[dict[str, Any]]:
    """Mine one block and return the receipts of ``hashes``, all of which it must hold."""
    rpc.call("evm_mine")
    receipts = rpc.batch([("eth_getTransactionReceipt", [h]) for h in hashes])
    for tx_hash, receipt in zip(hashes, receipts, strict=True):
        if not isinstance(receipt, dict) or receipt.get("status") != "0x1":
            raise RuntimeError(f"bench transaction {tx_hash} not mined or failed: {receipt}")
    return receipts


def _send(
    rpc: DevnetRpc, sender: str, nonce: int, txs: Sequence[tuple[str, bytes, int]]
) -> list[str]:
    """``eth_sendTransaction`` of (to, data, gas) from ``sender`` with nonces from ``nonce``."""
    calls = [
        (
            "eth_sendTransaction",
            [{"from": sender, "to": to, "data": "0x" + data.hex(), "gas": hex(gas),
              "nonce": hex(nonce + i)}],
        )
        for i, (to, data, gas) in enumerate(txs)
    ]  # fmt: skip
    return [str(h) for h in rpc.batch(calls)]


def prepare(url: str, manifest: Manifest, transfers: int, say: Callable[[str], None]) -> Chain:
    """Airdrop both tokens to the holders, then mine the transfers; see the module's doc."""
    if not 0 < transfers <= HOLDERS or transfers > (FINALITY_DEPTH - 4) * PER_BLOCK:
        raise ValueError(f"transfers must be 1..{(FINALITY_DEPTH - 4) * PER_BLOCK}")
    tokens = (manifest.contract("erc20_cgt").address, manifest.contract("erc20_cgusd").address)
    holders = tuple(holder(i) for i in range(HOLDERS))
    sender = manifest.deployer
    made: list[Transfer] = []
    with DevnetRpc(url) as rpc, manual_mining(rpc):
        nonce = int(rpc.call("eth_getTransactionCount", sender, "pending"), 16)
        airdrop = "airdrop(address[],uint256)"
        drops = [
            (token, abi.encode_call(airdrop, list(holders[i : i + AIRDROP_CHUNK]), 1),
             30_000 * AIRDROP_CHUNK + 200_000)
            for token in tokens
            for i in range(0, HOLDERS, AIRDROP_CHUNK)
        ]  # fmt: skip
        for i in range(0, len(drops), 2):
            _mined(rpc, _send(rpc, sender, nonce, drops[i : i + 2]))
            nonce += len(drops[i : i + 2])
        say(f"distinct: {HOLDERS} holders of CGT and CGUSD ({len(drops)} airdrops)")
        transfer = "transfer(address,uint256)"
        for start in range(0, transfers, PER_BLOCK):
            chunk = holders[start : min(transfers, start + PER_BLOCK)]
            txs = [(tokens[0], abi.encode_call(transfer, to, 1), 100_000) for to in chunk]
            hashes = _send(rpc, sender, nonce, txs)
            nonce += len(txs)
            for receipt, to in zip(_mined(rpc, hashes), chunk, strict=True):
                made.append(Transfer(str(receipt["transactionHash"]),
                                     int(receipt["blockNumber"], 16), to))  # fmt: skip
    say(f"distinct: {len(made)} CGT transfers in blocks {made[0].block}..{made[-1].block}")
    return Chain(holders, tokens, tuple(made))


def _template(method: str, params: list[Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ID, "method": method, "params": params}


def balance(chain: Chain, i: int) -> dict[str, Any]:
    return _template("eth_getBalance", [chain.holders[i % len(chain.holders)], "latest"])


def call(chain: Chain, i: int) -> dict[str, Any]:
    """``balanceOf`` of holder i on one token, the other for the next i."""
    token = chain.tokens[i % len(chain.tokens)]
    data = BALANCE_OF + _word(chain.holders[i % len(chain.holders)])
    return _template("eth_call", [{"to": token, "data": data}, "latest"])


def receipt(chain: Chain, i: int) -> dict[str, Any]:
    return _template(
        "eth_getTransactionReceipt", [chain.transfers[i % len(chain.transfers)].tx_hash]
    )


def logs(chain: Chain, i: int) -> dict[str, Any]:
    """CGT Transfers to transfer i's recipient over 1-7 blocks around its block (one log)."""
    rng = random.Random(i)
    made = chain.transfers[i % len(chain.transfers)]
    first, last = chain.transfers[0].block, chain.transfers[-1].block
    low = max(first, made.block - rng.randrange(4))
    high = min(last, made.block + rng.randrange(4))
    topics = [TRANSFER_TOPIC, None, "0x" + _word(made.recipient)]
    span = {"fromBlock": hex(low), "toBlock": hex(high), "address": chain.tokens[0]}
    return _template("eth_getLogs", [{**span, "topics": topics}])


KINDS: dict[str, Callable[[Chain, int], dict[str, Any]]] = {
    "balance": balance,
    "call": call,
    "receipt": receipt,
    "logs": logs,
}


def _mixed(chain: Chain, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` requests drawn with MIX_WEIGHTS, each kind's parameters taken in turn."""
    rng = random.Random(seed)
    kinds = rng.choices(list(MIX_WEIGHTS), list(MIX_WEIGHTS.values()), k=count)
    turn = dict.fromkeys(MIX_WEIGHTS, 0)
    picked = []
    for kind in kinds:
        picked.append(KINDS[kind](chain, turn[kind]))
        turn[kind] += 1
    return picked


def _line(payload: object) -> str:
    return json.dumps(payload, separators=(",", ":")).replace(f'"id":"{ID}"', f'"id":{ID}')


def templates(chain: Chain, key: str) -> list[str]:
    """The request templates of scenario ``distinct-<key>``, one JSON text each."""
    if key in KINDS:
        count = HOLDERS if key in ("balance", "call") else len(chain.transfers)
        return [_line(KINDS[key](chain, i)) for i in range(count)]
    if key == "mix":
        return [_line(request) for request in _mixed(chain, HOLDERS, 38)]
    if key == "batch":
        calls = _mixed(chain, HOLDERS, 20)
        return [_line(calls[i : i + BATCH_SIZE]) for i in range(0, HOLDERS, BATCH_SIZE)]
    raise ValueError(f"no distinct scenario {key!r}")


def render(template: str, first_id: int = 1) -> bytes:
    """A template with its ids filled in from ``first_id`` on, as the Lua script does."""
    parts = template.split(ID)
    text = parts[0] + "".join(f"{first_id + i}{part}" for i, part in enumerate(parts[1:]))
    return text.encode()


def write(chain: Chain, key: str, directory: Path) -> Path:
    path = directory / f"distinct-{key}.jsonl"
    path.write_text("\n".join(templates(chain, key)) + "\n")
    return path


def read(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line]
