"""Read-your-writes: after a transaction went to upstream X, its sender's nonce comes from X.

Two real anvils behind the gateway, each behind an HTTP relay (tests/http_relay.py):

* A is the fast one (ranked first by latency), and its relay answers ``eth_sendRawTransaction``
  with 429 — a stub of a provider rate-limiting writes — so the pool sends the transaction to
* B, 20 ms slower, which mines it: B's head is one block ahead of A's and only B knows the
  sender's new nonce.

The client then reads its nonce 100 times at once.  With read-your-writes every answer is the
new nonce; with it off (the test parameter) the reads go to the fast, stale A — the test
shows the stale values it catches then, so it is known to detect the fault.

Without the feature, where a read goes is the latency ranking's choice, and 100 reads at once
on a busy machine can make A look slower than B (the next probe round then ranks B first):
so the off case asserts what each relay served, never where the ranking will send a read.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from chaingate.config import ReadYourWritesSettings
from chaingate.devnet.anvil import rpc_call
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey
from chaingate.evm.tx import Eip1559
from chaingate.rpc.stickiness import Stickiness
from tests.http_relay import HttpRelay

DEV_KEY = PrivateKey(
    bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")
)


def _nonce(url: str, address: str) -> int:
    return int(str(rpc_call(url, "eth_getTransactionCount", [address, "latest"])), 16)


@pytest.mark.parametrize("read_your_writes", [True, False], ids=["on", "off"])
async def test_nonce_never_goes_backwards(
    nursery: trio.Nursery, start_gateway: Any, anvil_factory: Any, read_your_writes: bool
) -> None:
    fast, slow = anvil_factory(), anvil_factory()
    served: dict[str, list[bytes]] = {"a": [], "b": []}  # every body each relay got

    def at_a(body: bytes) -> bool:
        served["a"].append(body)
        return b"eth_sendRawTransaction" in body

    def at_b(body: bytes) -> float:
        served["b"].append(body)
        return 0.02

    def asked(relay: str, method: bytes) -> bool:
        return any(method in body for body in served[relay])

    relay_a = HttpRelay(fast.port, refuse=at_a)
    relay_b = HttpRelay(slow.port, delay=at_b)
    await nursery.start(relay_a.serve)
    await nursery.start(relay_b.serve)
    handle = await start_gateway(
        [
            {"url": f"http://127.0.0.1:{relay_a.port}", "name": "a"},
            {"url": f"http://127.0.0.1:{relay_b.port}", "name": "b"},
        ],
        network={"read_your_writes": {"enabled": read_your_writes, "window": 30.0}},
    )
    pool = handle.gateway.chain.services["ethereum/devnet"].pool

    async def fast_ranked_first() -> None:
        """Until probes rank A first, clear of B by half B's extra 20 ms (not at the moment
        the two latency averages cross, when one slow probe of A ranks B first again)."""
        with trio.fail_after(10):
            while True:
                a, b = (u.health.latency for u in pool.upstreams)
                if [u.name for u in pool.ranked()] == ["a", "b"] and a and b - a > 0.01:
                    return
                await trio.sleep(0.05)

    await fast_ranked_first()

    sender = DEV_KEY.address
    nonce = _nonce(fast.url, sender)
    assert _nonce(slow.url, sender) == nonce
    raw = Eip1559(
        chain_id=31337,
        nonce=nonce,
        max_priority_fee_per_gas=10**9,
        max_fee_per_gas=10**11,
        gas=21_000,
        to="0x" + "22" * 20,
        value=1,
    ).sign(DEV_KEY)
    async with httpx.AsyncClient(
        base_url=handle.base, limits=httpx.Limits(max_connections=100), timeout=20
    ) as client:

        async def rpc(method: str, params: list[Any]) -> Any:
            body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            response = await client.post("/v1/rpc/ethereum/devnet", json=body)
            reply = response.json()
            assert "result" in reply, reply
            return reply["result"]

        tx_hash = await rpc("eth_sendRawTransaction", ["0x" + raw.hex()])
        assert tx_hash == "0x" + keccak256(raw).hex()
        assert relay_a.refused == 1  # A refused it: B took it
        with trio.fail_after(10):
            while _nonce(slow.url, sender) != nonce + 1:
                await trio.sleep(0.02)
        assert _nonce(fast.url, sender) == nonce  # A never saw it: the heads differ

        seen: list[int] = []
        await fast_ranked_first()  # as the reads start: without the feature they go to A

        async def read() -> None:
            seen.append(int(await rpc("eth_getTransactionCount", [sender, "latest"]), 16))

        async with trio.open_nursery() as readers:
            for _ in range(100):
                readers.start_soon(read)
        receipt = await rpc("eth_getTransactionReceipt", [tx_hash])
        by_hash = await rpc("eth_getTransactionByHash", [tx_hash])

    stale = [value for value in seen if value != nonce + 1]
    assert len(seen) == 100
    if read_your_writes:
        assert stale == []
        assert receipt is not None and receipt["status"] == "0x1"
        assert by_hash is not None and by_hash["hash"] == tx_hash
        sticky = handle.gateway.chain.services["ethereum/devnet"].sticky
        assert sticky is not None and sticky.routed >= 102
        # Every read went to B, none to the fast ranked-first A.
        for method in (b"eth_getTransactionCount", b"eth_getTransactionReceipt"):
            assert asked("b", method) and not asked("a", method)
    else:
        # Without the feature the same reads go to the fast upstream and see the old nonce.
        assert stale, "the fault was not reproduced: the test would not detect it"
        assert asked("a", b"eth_getTransactionCount")
        # The receipt is stale too where it was read: null from A, the receipt from B (the
        # ranking may have turned to B by then; a read is never retried on a null answer).
        assert (receipt is not None) == asked("b", b"eth_getTransactionReceipt")
        assert (by_hash is not None) == asked("b", b"eth_getTransactionByHash")


def test_window_and_bounded_memory() -> None:
    sticky = Stickiness(ReadYourWritesSettings(window=5.0, max_entries=4))
    raws = []
    for nonce in range(3):
        raw = Eip1559(
            chain_id=1,
            nonce=nonce,
            max_priority_fee_per_gas=1,
            max_fee_per_gas=2,
            gas=21_000,
            to=None,
        ).sign(DEV_KEY)
        raws.append(raw)
        tx_hash = "0x" + keccak256(raw).hex()
        sticky.note_send(b'["0x%s"]' % raw.hex().encode(), b'"%s"' % tx_hash.encode(), "x", 0.0)
    # One sender and three hashes were noted; the LRU keeps four keys at most.
    assert len(sticky) == 4
    sender = DEV_KEY.address.lower()
    assert sticky.route("eth_getTransactionCount", b'["%s","latest"]' % sender.encode(), 1.0)
    mixed_case = b'["0x%s","pending"]' % sender[2:].upper().encode()
    assert sticky.route("eth_getTransactionCount", mixed_case, 1.0) == "x"
    assert sticky.route("eth_getBalance", b'["%s","latest"]' % sender.encode(), 1.0) is None
    last_hash = "0x" + keccak256(raws[-1]).hex()
    assert sticky.route("eth_getTransactionReceipt", b'["%s"]' % last_hash.encode(), 4.9) == "x"
    # Past the window: forgotten (and dropped).
    assert sticky.route("eth_getTransactionReceipt", b'["%s"]' % last_hash.encode(), 5.1) is None
    assert len(sticky) == 3
    # Junk is no route and no error.
    sticky.note_send(b'["0xzz"]', b"null", "y", 0.0)
    sticky.note_send(b'["0x04ff"]', b'"0xab"', "y", 0.0)
    assert sticky.undecodable == 2
    assert sticky.route("eth_getTransactionReceipt", b'["0xAB"]', 1.0) == "y"
    assert sticky.route("eth_getTransactionCount", b"[1]", 1.0) is None
