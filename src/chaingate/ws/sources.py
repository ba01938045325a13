"""What feeds ``newPendingTransactions`` and ``syncing``: one poller per network, shared by all.

Both run only while someone subscribes (``Gated.active``), so an idle network costs its
upstreams nothing.

* **Pending transactions**: each upstream of the network gets its own pending-transaction
  filter (``eth_newPendingTransactionFilter``), polled with ``eth_getFilterChanges`` over the
  pool's existing keep-alive connections to that upstream — no WebSocket to any node, and no
  connection per subscriber.  Mempools overlap, so hashes are de-duplicated across upstreams
  (a bounded memory of recent hashes).  Subscribers that asked for whole transactions get
  them from the upstream that reported the hash (``eth_getTransactionByHash``, batched).
  A filter the node forgot (restart, expiry) is installed again.
* **Syncing**: ``eth_syncing`` through the network's ``ChainClient`` (pool failover), pushed
  whenever the answer changes; a new subscriber is told the current state at once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import trio

from chaingate.chain.client import ChainClient, RpcCallError
from chaingate.rpc.errors import BAD_RESPONSE, UpstreamError
from chaingate.rpc.pool import Upstream, UpstreamPool

log = logging.getLogger("chaingate.ws")

SEEN_HASHES = 50_000  # recent pending hashes remembered for de-duplication
FETCH_BATCH = 100  # eth_getTransactionByHash calls per upstream batch
MAX_FETCH = 1_000  # whole transactions fetched per poll at most (the rest: skipped)
MAX_BACKOFF = 5.0
UNINSTALL_TIMEOUT = 1.0


class Gated:
    """A poller that runs only while ``active()`` says so; ``changed()`` re-evaluates."""

    def __init__(self, active: Callable[[], bool]) -> None:
        self._active = active
        self._wake = trio.Event()
        self._scope: trio.CancelScope | None = None

    def changed(self) -> None:
        if self._active():
            self._wake.set()
        elif self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        while True:
            while not self._active():
                self._wake = trio.Event()
                await self._wake.wait()
            with trio.CancelScope() as scope:
                self._scope = scope
                if self._active():  # it may have gone while we were being scheduled
                    await self._poll()
            self._scope = None
            self.stopped()

    async def _poll(self) -> None:
        raise NotImplementedError

    def stopped(self) -> None:
        """Called after polling stopped because nobody subscribes any more."""


class _Reply(msgspec.Struct):
    id: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None


_encode = msgspec.json.encode
_decode_one = msgspec.json.Decoder(_Reply).decode
_decode_many = msgspec.json.Decoder(list[_Reply]).decode


async def upstream_call(
    upstream: Upstream, calls: Sequence[tuple[str, list[Any]]]
) -> list[Any | RpcCallError]:
    """Calls sent to this one upstream (not the pool's choice), within its own timeout:
    results in order, a node's error as its RpcCallError."""
    body = _encode(
        [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)]
    )
    if len(calls) == 1:
        body = body[1:-1]
    deadline = trio.current_time() + upstream.settings.timeout
    response = await upstream.send(body, deadline)
    try:
        replies = [_decode_one(response.body)] if len(calls) == 1 else _decode_many(response.body)
    except msgspec.DecodeError:
        raise UpstreamError(
            BAD_RESPONSE, f"HTTP {response.status}: not JSON-RPC", sent=True, upstream=upstream.name
        ) from None
    by_id = {reply.id: reply for reply in replies}
    results: list[Any | RpcCallError] = []
    for i, (method, _) in enumerate(calls):
        reply = by_id.get(i) if len(calls) > 1 else replies[0]
        if reply is None:
            results.append(RpcCallError(method, -32603, "no reply"))
        elif reply.error is not None:
            code, message = int(reply.error.get("code", 0)), str(reply.error.get("message"))
            results.append(RpcCallError(method, code, message))
        else:
            results.append(reply.result)
    return results


async def _one(upstream: Upstream, method: str, params: list[Any]) -> object:
    result = (await upstream_call(upstream, [(method, params)]))[0]
    if isinstance(result, RpcCallError):
        raise result
    return result


class PendingSource(Gated):
    """Pending transaction hashes from every upstream, de-duplicated, to ``deliver``."""

    def __init__(
        self,
        pool: UpstreamPool,
        interval: float,
        active: Callable[[], bool],
        wants_full: Callable[[], bool],
        deliver: Callable[[str, Any], Awaitable[None]],
    ) -> None:
        super().__init__(active)
        self._pool = pool
        self._interval = interval
        self._wants_full = wants_full
        self._deliver = deliver
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.polls = 0
        self.errors = 0

    async def _poll(self) -> None:
        async with trio.open_nursery() as nursery:
            for upstream in self._pool.upstreams:
                nursery.start_soon(self._follow, upstream)

    async def _follow(self, upstream: Upstream) -> None:
        filter_id: object = None
        backoff = self._interval
        try:
            while True:
                try:
                    if filter_id is None:
                        filter_id = await _one(upstream, "eth_newPendingTransactionFilter", [])
                    hashes = await _one(upstream, "eth_getFilterChanges", [filter_id])
                    self.polls += 1
                    if hashes:
                        await self._take(upstream, hashes)
                    backoff = self._interval
                except (RpcCallError, UpstreamError) as exc:
                    # Filter gone (node restarted, filter expired) or node down: start over.
                    self.errors += 1
                    if filter_id is not None:
                        log.info(
                            "pending filter lost; installing a new one",
                            extra={"fields": {"upstream": upstream.name, "error": str(exc)[:200]}},
                        )
                    filter_id = None
                    backoff = min(MAX_BACKOFF, backoff * 2)
                await trio.sleep(backoff)
        finally:
            if filter_id is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(UNINSTALL_TIMEOUT):
                    try:
                        await _one(upstream, "eth_uninstallFilter", [filter_id])
                    except (RpcCallError, UpstreamError):
                        pass

    async def _take(self, upstream: Upstream, hashes: object) -> None:
        if not isinstance(hashes, list):
            return
        seen = self._seen
        fresh = []
        for tx_hash in hashes:
            if not isinstance(tx_hash, str):
                continue
            key = tx_hash.lower()
            if key in seen:
                continue
            seen[key] = None
            if len(seen) > SEEN_HASHES:
                seen.popitem(last=False)
            fresh.append(tx_hash)
        if not fresh:
            return
        full: dict[str, Any] = {}
        if self._wants_full():
            wanted = fresh[:MAX_FETCH]
            for start in range(0, len(wanted), FETCH_BATCH):
                chunk = wanted[start : start + FETCH_BATCH]
                try:
                    results = await upstream_call(
                        upstream, [("eth_getTransactionByHash", [h]) for h in chunk]
                    )
                except UpstreamError:
                    break
                for tx_hash, tx in zip(chunk, results, strict=True):
                    if isinstance(tx, dict):
                        full[tx_hash] = tx
        for tx_hash in fresh:
            await self._deliver(tx_hash, full.get(tx_hash))

    def stopped(self) -> None:
        self._seen.clear()


class SyncingSource(Gated):
    """``eth_syncing`` polled while subscribed; ``deliver`` gets each new state."""

    def __init__(
        self,
        client: ChainClient,
        interval: float,
        active: Callable[[], bool],
        deliver: Callable[[Any], Awaitable[None]],
    ) -> None:
        super().__init__(active)
        self._client = client
        self._interval = interval
        self._deliver = deliver
        self.current: object = None  # last state pushed; None: not known yet

    async def _poll(self) -> None:
        while True:
            try:
                result = await self._client.call("eth_syncing")
            except (RpcCallError, UpstreamError):
                result = None
            if result is not None:
                # geth's shape: false, or {"syncing": true, "status": {...progress...}}
                state = False if result is False else {"syncing": True, "status": result}
                if state != self.current:
                    self.current = state
                    await self._deliver(state)
            await trio.sleep(self._interval)

    def stopped(self) -> None:
        self.current = None
