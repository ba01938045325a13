"""On-chain token facts per contract: memory, then the store, then one batched probe.

``get(contracts, wait)`` answers from memory (LRU) or the store; contracts never probed, or
whose probe failed and is due again, are probed in the background — all of them in one
Multicall batch — and the caller waits for that at most ``wait`` seconds.  A known answer is
served at once even when its periodic re-read (``refresh_interval``) is due; the re-read then
runs in the background.  Contracts the indexer reports (``note``) are probed by the background
loop in batches.  Total supply, which moves with every mint and burn, has its own short-lived
cache (``supplies``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
import trio

from chaingate.chain.client import RpcCallError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.metadata import tokens
from chaingate.metadata.model import STANDARDS, Standard, Status, TokenMetadata
from chaingate.metadata.multicall import Call, Multicall
from chaingate.metadata.refresher import next_retry_at
from chaingate.metadata.store import MetaRows, TokenRow
from chaingate.rpc.errors import UpstreamError
from chaingate.store import StoreError

log = logging.getLogger("chaingate.metadata")

PROBE_BATCH = 100  # contracts per probe: 800 calls, 100 eth_calls in one JSON-RPC batch
MAX_ENTRIES = 50_000
TOTAL_SUPPLY = abi.encode_call("totalSupply()")

# Told each probe's verdicts: lowercase contract -> whether a balance list shows it (False:
# read, and not an ERC-20).
VerdictListener = Callable[[Mapping[str, bool]], Awaitable[None]]


# A token's stored status, typed; anything else ("stale" is an NFT's) reads "failed".
_TOKEN_STATUSES: dict[str, Status] = {"ok": "ok", "pending": "pending", "failed": "failed"}


def _standard(value: str | None) -> Standard | None:
    return next((s for s in STANDARDS if s == value), None)


def to_metadata(row: TokenRow) -> TokenMetadata:
    status = _TOKEN_STATUSES.get(row.status, "failed")
    return TokenMetadata(
        contract=checksum_address(row.contract),
        standard=_standard(row.standard),
        name=row.name,
        symbol=row.symbol,
        decimals=row.decimals,
        total_supply=int(row.total_supply) if row.total_supply is not None else None,
        status=status,
        last_error=row.last_error,
        fetched_at=row.fetched_at,
        next_retry_at=row.next_retry_at,
    )


class TokenCache:
    def __init__(
        self,
        store: MetaRows,
        chain: str,
        network: str,
        multicall: Callable[[], Multicall],
        *,
        refresh_interval: float,
        supply_ttl: float,
        schedule: Sequence[float],
        max_attempts: int,
        clock: Callable[[], float] = time.time,
        scan_interval: float = 2.0,
    ) -> None:
        self.store = store
        self.chain = chain
        self.network = network
        self._multicall = multicall
        self.refresh_interval = refresh_interval
        self.supply_ttl = supply_ttl
        self.schedule = list(schedule)
        self.max_attempts = max_attempts
        self._clock = clock
        self.scan_interval = scan_interval
        self._rows: OrderedDict[str, TokenRow] = OrderedDict()
        self._probing: dict[str, trio.Event] = {}
        self._supply: dict[str, tuple[float, int | None]] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.probes = 0  # probe batches sent (tests read it)
        self.verdict_listeners: list[VerdictListener] = []

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # --- reading ---------------------------------------------------------------------------

    async def get(self, contracts: Sequence[str], wait: float) -> dict[str, TokenMetadata]:
        """Facts by lowercase address; ``pending`` ones when nothing is known within ``wait``."""
        wanted = list(dict.fromkeys(c.lower() for c in contracts))
        missing = [c for c in wanted if c not in self._rows]
        if missing:
            try:
                loaded = await self.store.load_token_rows(self.chain, self.network, missing)
            except StoreError as exc:
                log.warning("token metadata unreadable", extra={"fields": {"error": str(exc)}})
                loaded = {}
            for loaded_row in loaded.values():
                self._remember(loaded_row)
        now = self.now_ms()
        urgent: list[str] = []
        background: list[str] = []
        for contract in wanted:
            known = self._rows.get(contract)
            if known is None or (known.status != "ok" and _due(known, now, self._idle_ms())):
                urgent.append(contract)
            elif known.next_retry_at is not None and known.next_retry_at <= now:
                background.append(contract)
        if urgent or background:
            events = self._start_probe(urgent + background)
            if urgent and wait > 0:
                with trio.move_on_after(wait):
                    for contract in urgent:
                        await events[contract].wait()
        answer: dict[str, TokenMetadata] = {}
        for contract in wanted:
            row = self._rows.get(contract)
            if row is None:
                answer[contract] = TokenMetadata(contract=checksum_address(contract))
            else:
                self._rows.move_to_end(contract)
                answer[contract] = to_metadata(row)
        return answer

    def _idle_ms(self) -> int:
        return round((self.schedule[-1] if self.schedule else 0.0) * 1000)

    async def supplies(self, contracts: Sequence[str]) -> dict[str, int | None]:
        """``totalSupply()`` by lowercase address, at most ``supply_ttl`` old."""
        wanted = list(dict.fromkeys(c.lower() for c in contracts))
        now = self._clock()
        due = [c for c in wanted if self._supply.get(c, (0.0, None))[0] <= now]
        if due:
            try:
                results = await self._multicall().run([Call(c, TOTAL_SUPPLY) for c in due])
            except (UpstreamError, RpcCallError):
                results = []
            for contract, result in zip(due, results, strict=False):
                self._supply[contract] = (now + self.supply_ttl, tokens.decode_balance(result))
            if len(self._supply) > MAX_ENTRIES:
                self._supply.clear()  # crude but bounded; entries live seconds anyway
        return {c: self._supply.get(c, (0.0, None))[1] for c in wanted}

    # --- probing ---------------------------------------------------------------------------

    def _start_probe(self, contracts: Sequence[str]) -> dict[str, trio.Event]:
        """Events for each contract's probe; the ones not running yet start now, together."""
        events: dict[str, trio.Event] = {}
        fresh: list[str] = []
        for contract in contracts:
            event = self._probing.get(contract)
            if event is None:
                event = self._probing[contract] = trio.Event()
                fresh.append(contract)
            events[contract] = event
        if fresh:
            if self._nursery is None:
                raise RuntimeError("TokenCache.run() is not running")
            self._nursery.start_soon(self.probe, fresh)
        return events

    def refresh_soon(self, contract: str) -> None:
        """Re-read a contract's facts in the background (a refresh request)."""
        self._start_probe([contract.lower()])

    async def probe(self, contracts: Sequence[str]) -> None:
        """Probe ``contracts`` (lowercase) in batches and record the facts.  Never raises for
        a node or store failure: those become the rows' ``last_error``."""
        try:
            for start in range(0, len(contracts), PROBE_BATCH):
                await self._probe_batch(contracts[start : start + PROBE_BATCH])
        finally:
            for contract in contracts:
                event = self._probing.pop(contract, None)
                if event is not None:
                    event.set()

    async def _probe_batch(self, contracts: Sequence[str]) -> None:
        self.probes += 1
        known = {c: self._rows[c] for c in contracts if c in self._rows}
        try:
            stored = await self.store.load_token_rows(self.chain, self.network, contracts)
        except StoreError:
            stored = {}
        known.update(stored)
        now = self.now_ms()
        calls = [call for contract in contracts for call in tokens.probe_calls(contract)]
        rows: list[TokenRow]
        try:
            results = await self._multicall().run(calls)
        except (UpstreamError, RpcCallError) as exc:
            rows = [self._failed(c, known.get(c), str(exc), now) for c in contracts]
        else:
            rows = []
            for i, contract in enumerate(contracts):
                chunk = results[i * tokens.PROBE_COUNT : (i + 1) * tokens.PROBE_COUNT]
                hint = _standard(known[contract].standard_hint) if contract in known else None
                facts = tokens.interpret(chunk, hint)
                rows.append(
                    TokenRow(
                        contract=contract,
                        standard=facts.standard,
                        standard_hint=hint,
                        name=facts.name,
                        symbol=facts.symbol,
                        decimals=facts.decimals,
                        total_supply=None
                        if facts.total_supply is None
                        else str(facts.total_supply),
                        status="ok",
                        attempts=0,
                        fetched_at=now,
                        next_retry_at=now + round(self.refresh_interval * 1000),
                        updated_at=now,
                    )
                )
        # Listeners first: whoever reads a verdict from this cache finds it told already.
        await self._tell_verdicts(rows)
        for row in rows:
            self._remember(row)
        try:
            await self.store.save_token_rows(self.chain, self.network, rows)
        except StoreError as exc:
            log.warning("token metadata not saved", extra={"fields": {"error": str(exc)}})

    async def _tell_verdicts(self, rows: Sequence[TokenRow]) -> None:
        listed = {row.contract: not to_metadata(row).known_not_erc20 for row in rows}
        for listener in self.verdict_listeners:
            try:
                await listener(listed)
            except StoreError as exc:  # told again at the next probe (a re-read, daily)
                log.warning("token verdicts not recorded", extra={"fields": {"error": str(exc)}})

    def _failed(self, contract: str, row: TokenRow | None, error: str, now: int) -> TokenRow:
        base = row or TokenRow(contract=contract)
        attempts = base.attempts + 1
        return msgspec.structs.replace(
            base,
            # Facts read earlier stay served; only a contract never read is "failed".
            status="ok" if base.fetched_at is not None else "failed",
            last_error=f"node unreachable: {error}"[:1000],
            attempts=attempts,
            next_retry_at=next_retry_at(attempts, now, self.schedule, self.max_attempts),
            updated_at=now,
        )

    def _remember(self, row: TokenRow) -> None:
        self._rows[row.contract] = row
        self._rows.move_to_end(row.contract)
        while len(self._rows) > MAX_ENTRIES:
            self._rows.popitem(last=False)

    # --- the indexer's reports and the background loop ---------------------------------------

    async def note(self, hints: Sequence[tuple[str, str | None]]) -> None:
        """Contracts the indexer saw; new ones (or new hints) are probed in the background."""
        due = await self.store.note_token_contracts(
            self.chain, self.network, [(c.lower(), h) for c, h in hints], self.now_ms()
        )
        for contract in due:
            self._rows.pop(contract, None)  # re-read from the store after the probe
        if due:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await self._loop()
            finally:
                self._nursery = None

    async def _loop(self) -> None:
        while True:
            self._wake = trio.Event()
            try:
                due = await self.store.due_token_contracts(
                    self.chain, self.network, self.now_ms(), PROBE_BATCH
                )
            except StoreError as exc:
                log.warning("token metadata unreadable", extra={"fields": {"error": str(exc)}})
                due = []
            due = [c for c in due if c not in self._probing]
            if due:
                for contract in due:
                    self._probing[contract] = trio.Event()
                await self.probe(due)
                if len(due) == PROBE_BATCH:
                    continue
            with trio.move_on_after(self.scan_interval):
                await self._wake.wait()


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def _due(row: TokenRow, now: int, idle_ms: int) -> bool:
    """A row without good facts is probed when its retry is due, or — automatic attempts
    spent — when it has been left alone for the longest retry delay."""
    if row.next_retry_at is not None:
        return row.next_retry_at <= now
    return row.updated_at + idle_ms <= now
