"""The webhook bench's parts outside chaingate: the receiver process, the chain load, and the
figures made of what the receiver recorded.

* ``ReceiverProcess`` — ``hookreceiver.py`` as a child process (its own interpreter: it never
  competes with chaingate for a GIL, only for the cores), with the bench's view of it.
* ``watched_addresses`` / ``Recipients`` — the addresses the webhooks watch, and the order the
  load sends to them: one address of every webhook, then the next one of every webhook, so a
  block's events spread over as many webhooks (and URLs) as it has events.
* ``AirdropLoad`` — blocks mined on demand on anvil, each holding ``airdrop(address[],uint256)``
  transactions of the devnet's CGT token (one ERC-20 Transfer, hence one event, per recipient).
* ``analyse`` — what one load's blocks called for against what the receiver got: delivered,
  missing, unexpected, misrouted and repeated events, deliveries per second, and each event's
  block-to-delivery time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit import procs
from benchkit.hookreceiver import Record, read_records
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi

RECEIVER_SCRIPT = Path(__file__).resolve().with_name("hookreceiver.py")
AIRDROP = "airdrop(address[],uint256)"
# Gas of one airdrop: a new holder costs ~24,500 (a zero-to-nonzero SSTORE and a LOG3); the
# explicit limit spares anvil an estimate (a second execution of every transaction).
GAS_PER_RECIPIENT = 30_000
GAS_BASE = 60_000
# The bench's anvil: a block of the default load (20 airdrops of 200 new holders) uses ~99.4M
# gas, and anvil adds a transaction to a block only while the gas used so far plus its gas
# limit fit: 100M would leave the 20th out.
BLOCK_GAS_LIMIT = 1_000_000_000
ANVIL_ARGS = ("--gas-limit", str(BLOCK_GAS_LIMIT))
PAYMASTER_SIGNER = "0x" + "5a" * 20  # the devnet's; nothing here signs for the paymaster


class ReceiverFailed(Exception):
    """The receiver did not start, or answered its control requests wrongly."""


class ReceiverProcess:
    """``hookreceiver.py`` on a free loopback port, recording into ``workdir``."""

    def __init__(self, workdir: Path, samples: int = 5) -> None:
        self.records_path = workdir / "receiver-records.tsv"
        self.log_path = workdir / "receiver.log"
        argv = [
            sys.executable, str(RECEIVER_SCRIPT),
            "--out", str(self.records_path),
            "--samples", str(samples),
        ]  # fmt: skip
        self.process = procs.ManagedProcess("receiver", argv, self.log_path, dict(os.environ))
        self.port = 0

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    @property
    def base(self) -> str:
        return f"http://{procs.LOOPBACK}:{self.port}"

    def start(self, timeout: float = 10.0) -> ReceiverProcess:
        self.process.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise ReceiverFailed(f"the receiver exited:\n{self.process.log_tail()}")
            for line in self.process.log_tail(5).splitlines():
                if line.startswith("PORT "):
                    self.port = int(line.split()[1])
                    return self
            time.sleep(0.05)
        raise ReceiverFailed(f"the receiver printed no port in {timeout:.0f}s")

    def stop(self) -> None:
        self.process.stop()

    def _get(self, path: str, timeout: float = 60.0) -> Any:
        with urllib.request.urlopen(f"{self.base}{path}", timeout=timeout) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, int]:
        answer = self._get("/stats", timeout=10.0)
        if not isinstance(answer, dict):
            raise ReceiverFailed(f"/stats answered {answer!r:.200}")
        return {str(k): int(v) for k, v in answer.items()}

    def records(self) -> list[Record]:
        """Every request recorded so far (written to a file by the receiver, read here)."""
        self._get("/dump")
        return read_records(self.records_path)

    def samples(self) -> list[dict[str, Any]]:
        answer = self._get("/samples", timeout=10.0)
        if not isinstance(answer, list):
            raise ReceiverFailed(f"/samples answered {answer!r:.200}")
        return answer

    def wait_for(self, hook_events: int, timeout: float, stall: float = 30.0) -> dict[str, int]:
        """Until ``hook_events`` distinct events arrived under /hooks/ (or ``timeout``, or no
        new one for ``stall`` seconds); the last stats."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        seen, last_change = stats["hook_events"], time.monotonic()
        while stats["hook_events"] < hook_events:
            now = time.monotonic()
            if now > deadline or now - last_change > stall:
                break
            time.sleep(0.1)
            stats = self.stats()
            if stats["hook_events"] != seen:
                seen, last_change = stats["hook_events"], time.monotonic()
        return stats


# --- the watched addresses ----------------------------------------------------------------


def watched_addresses(webhooks: int, per_webhook: int) -> list[list[str]]:
    """``per_webhook`` addresses for each webhook, derived from a fixed seed (0x + lowercase
    hex), all distinct and none an account anyone holds a key of."""
    groups = []
    for hook in range(webhooks):
        group = []
        for n in range(per_webhook):
            seed = f"chaingate-bench-webhooks/{hook}/{n}".encode()
            group.append("0x" + hashlib.sha256(seed).digest()[:20].hex())
        groups.append(group)
    return groups


class Recipients:
    """The watched addresses in sending order: the n-th address of every webhook before the
    (n+1)-th of any; round and round."""

    def __init__(self, groups: Sequence[Sequence[str]]) -> None:
        width = max((len(g) for g in groups), default=0)
        self.order = [g[n] for n in range(width) for g in groups if n < len(g)]
        self.next = 0

    def take(self, count: int) -> list[str]:
        if count > len(self.order):
            raise ValueError(f"{count} recipients in one block, but only {len(self.order)}")
        taken = [self.order[(self.next + i) % len(self.order)] for i in range(count)]
        self.next = (self.next + count) % len(self.order)
        return taken


# --- the chain load -----------------------------------------------------------------------


@dataclass(frozen=True)
class MinedBlock:
    number: int
    sent_at: float  # wall clock (time.time()) when its first transaction was sent
    mine_called: float  # when evm_mine was called
    mined_at: float  # when evm_mine returned: the block is the node's head
    recipients: tuple[str, ...]  # one Transfer (one event) each


class AirdropLoad:
    """Blocks of CGT airdrops from the deployer, mined on demand (automine off meanwhile)."""

    def __init__(self, url: str, token: str, sender: str, per_tx: int) -> None:
        self.rpc = DevnetRpc(url)
        self.token = token
        self.sender = sender
        self.per_tx = per_tx

    def __enter__(self) -> AirdropLoad:
        self.rpc.call("evm_setAutomine", False)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.rpc.call("evm_setAutomine", True)
        finally:
            self.rpc.close()

    def block(self, recipients: Sequence[str]) -> MinedBlock:
        """One block holding an airdrop of 1 unit to each of ``recipients`` (``per_tx`` a
        transaction), checked to hold exactly the transactions sent."""
        calls = []
        for start in range(0, len(recipients), self.per_tx):
            chunk = list(recipients[start : start + self.per_tx])
            tx = {
                "from": self.sender,
                "to": self.token,
                "data": "0x" + abi.encode_call(AIRDROP, chunk, 1).hex(),
                "gas": hex(GAS_BASE + GAS_PER_RECIPIENT * len(chunk)),
            }
            calls.append(("eth_sendTransaction", [tx]))
        sent_at = time.time()
        hashes = self.rpc.batch(calls)
        mine_called = time.time()
        self.rpc.call("evm_mine")
        mined_at = time.time()
        head = self.rpc.call("eth_getBlockByNumber", "latest", False)
        if sorted(head.get("transactions") or []) != sorted(hashes):
            raise RuntimeError(self.not_whole(head, hashes))
        return MinedBlock(
            int(head["number"], 16), sent_at, mine_called, mined_at, tuple(recipients)
        )

    def not_whole(self, head: Mapping[str, Any], sent: Sequence[str]) -> str:
        """What became of each transaction sent for the block ``head`` but not in it — its
        nonce, and whether it is mined elsewhere, still in anvil's pool (and why it did not
        fit) or gone — and which transactions in it the bench did not send."""
        included = list(head.get("transactions") or [])
        left_out = [h for h in sent if h not in included]
        foreign = [h for h in included if h not in sent]
        used, limit = int(head["gasUsed"], 16), int(head["gasLimit"], 16)
        found = self.rpc.batch([("eth_getTransactionByHash", [h]) for h in left_out + foreign])
        found_left_out, found_foreign = found[: len(left_out)], found[len(left_out) :]
        lines = [
            f"block {int(head['number'], 16)} holds {len(included) - len(foreign)} of the "
            f"{len(sent)} airdrop transactions sent (gas used {used:,} of its limit {limit:,}):"
        ]
        for tx_hash, tx in zip(left_out, found_left_out, strict=True):
            if tx is None:
                lines.append(f"  {tx_hash}: unknown to the node (dropped, or replaced in its pool)")
                continue
            where = "still in anvil's pool"
            if tx.get("blockNumber") is not None:
                where = f"mined in block {int(tx['blockNumber'], 16)} instead"
            elif used + int(tx["gas"], 16) > limit:
                where += (
                    f": its gas limit {int(tx['gas'], 16):,} did not fit in the "
                    f"{limit - used:,} the block had left"
                )
            lines.append(f"  {tx_hash} (nonce {int(tx['nonce'], 16)}): {where}")
        for tx_hash, tx in zip(foreign, found_foreign, strict=True):
            sender = f"{tx['from']} nonce {int(tx['nonce'], 16)}" if tx else "an unknown sender"
            lines.append(f"  {tx_hash} (from {sender}): in the block, not sent by the bench")
        return "\n".join(lines)

    def failed_transactions(self, blocks: Iterable[MinedBlock]) -> int:
        """Transactions of these blocks whose receipt says they reverted."""
        failed = 0
        for block in blocks:
            receipts = self.rpc.call("eth_getBlockReceipts", hex(block.number))
            failed += sum(1 for r in receipts or [] if r.get("status") != "0x1")
        return failed


def paced_blocks(
    load: AirdropLoad,
    recipients: Recipients,
    *,
    events_per_block: int,
    interval: float,
    duration: float,
) -> list[MinedBlock]:
    """A block of ``events_per_block`` events every ``interval`` seconds for ``duration``
    (a block whose sending and mining overran its slot delays the next, never skips it)."""
    count = max(1, math.ceil(duration / interval))
    started = time.monotonic()
    blocks = []
    for n in range(count):
        delay = started + n * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        blocks.append(load.block(recipients.take(events_per_block)))
    return blocks


# --- what arrived -------------------------------------------------------------------------


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (nan when empty)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Delivered:
    """One load's blocks against what the receiver recorded for them."""

    blocks: int
    expected: int  # events the blocks call for (one per recipient)
    delivered: int  # of those, how many arrived (at least once)
    missing: int
    unexpected: int  # events of these blocks nobody asked for
    misrouted: int  # arrived at another webhook's URL than the one watching the recipient
    repeated: int  # requests beyond the first for the same event id
    offered_per_s: float  # events the load made per second (first block sent to last mined)
    first_arrival: float  # wall clock
    last_arrival: float
    rate: float  # distinct events delivered per second, first arrival to last
    during_load_rate: float  # ... counting only those that arrived while blocks were mined
    backlog_at_end: int  # events mined but not yet delivered when the last block was mined
    latencies_ms: tuple[float, ...]  # block mined (evm_mine returned) -> arrival, ascending
    block_done_ms: tuple[float, ...]  # block mined -> its last event's arrival, ascending
    block_first_ms: tuple[float, ...]  # block mined -> its first event's arrival, ascending
    mine_ms: tuple[float, ...]  # how long each evm_mine call took, ascending

    @property
    def correct(self) -> bool:
        return not (self.missing or self.unexpected or self.misrouted)


def analyse(
    blocks: Sequence[MinedBlock],
    records: Iterable[Record],
    owner: Mapping[str, int],
    path_of: Mapping[int, str],
) -> Delivered:
    """``owner``: watched address -> webhook index; ``path_of``: webhook index -> its URL path.
    Only records under /hooks/ of these blocks count."""
    by_number = {b.number: b for b in blocks}
    expected = {(b.number, to) for b in blocks for to in b.recipients}
    first: dict[tuple[int, str], float] = {}
    ids: dict[str, int] = {}
    requests = unexpected_requests = misrouted = 0
    unexpected: set[tuple[int, str]] = set()
    for record in records:
        if record.block not in by_number or not record.path.startswith("/hooks/"):
            continue
        requests += 1
        ids[record.event_id] = ids.get(record.event_id, 0) + 1
        key = (record.block, record.to)
        if key not in expected:
            unexpected_requests += 1
            unexpected.add(key)
            continue
        hook = owner.get(record.to)
        if hook is None or path_of.get(hook) != record.path:
            misrouted += 1
        if key not in first or record.at < first[key]:
            first[key] = record.at
    latencies = []
    done: dict[int, float] = {}
    began: dict[int, float] = {}
    for (number, _), at in first.items():
        mined = by_number[number].mined_at
        latencies.append((at - mined) * 1000)
        done[number] = max(done.get(number, at), at)
        began[number] = min(began.get(number, at), at)
    arrivals = sorted(first.values())
    first_sent = min((b.sent_at for b in blocks), default=0.0)
    last_mined = max((b.mined_at for b in blocks), default=0.0)
    first_mined = min((b.mined_at for b in blocks), default=0.0)
    during = sum(1 for at in arrivals if at <= last_mined)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    load_span = last_mined - first_mined
    return Delivered(
        blocks=len(blocks),
        expected=len(expected),
        delivered=len(first),
        missing=len(expected) - len(first),
        unexpected=len(unexpected),
        misrouted=misrouted,
        repeated=requests - unexpected_requests - len(first),
        offered_per_s=len(expected) / (last_mined - first_sent) if last_mined > first_sent else 0.0,
        first_arrival=arrivals[0] if arrivals else math.nan,
        last_arrival=arrivals[-1] if arrivals else math.nan,
        rate=(len(arrivals) - 1) / span if span > 0 else 0.0,
        during_load_rate=during / load_span if load_span > 0 else 0.0,
        backlog_at_end=len(expected) - during,
        latencies_ms=tuple(sorted(latencies)),
        block_done_ms=tuple(sorted((done[n] - by_number[n].mined_at) * 1000 for n in done)),
        block_first_ms=tuple(sorted((began[n] - by_number[n].mined_at) * 1000 for n in began)),
        mine_ms=tuple(sorted((b.mined_at - b.mine_called) * 1000 for b in blocks)),
    )
