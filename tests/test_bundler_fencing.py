"""The bundler's fence (docs/decisions/cluster.md): each leadership term of ``bundler`` is
numbered in the store, a bundle transaction is recorded with its term before it is sent, and
the next leader finishes a recorded transaction the node does not know — sends the same bytes
— instead of bundling its operations again.  Real PostgreSQL, a real devnet (anvil)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest
import trio

from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.mempool import Entry
from chaingate.bundler.network import NOT_LEADING, BundlerNetwork
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.bundler.store import BundlerRows, Intent
from chaingate.cluster.leases import PgLeadership
from chaingate.cluster.roles import RoleKey
from chaingate.cluster.terms import RoleTerms
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.tx import tx_hash
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.store import open_store
from chaingate.twins import Impl
from tests.conftest import pg_schema
from tests.helpers import GatewayHandle
from tests.test_aa_devnet import TAGS
from tests.test_bundler_e2e import PATH, Bundler, sponsored_op, start_settings
from tests.test_bundler_store import entry as make_entry

ROLE = RoleKey("bundler", "ethereum", "devnet")


@pytest.fixture
def pg_url() -> Iterator[str]:
    with pg_schema() as url:
        yield url


def intents(url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tx_hash, nonce, term FROM bundler_intents ORDER BY created_at"
        ).fetchall()
    return [(str(h), int(n), int(t)) for h, n, t in rows]


def stored_term(url: str) -> int:
    """The bundler role's newest term, as the store holds it."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT term FROM role_terms WHERE role = %s AND chain = %s AND network = %s",
            (ROLE.role, ROLE.chain, ROLE.network),
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_deposed_term_records_and_writes_nothing(pg_url: str, tmp_path: Path) -> None:
    """The compare itself: once a later term began, the earlier term's record of a bundle and
    its other writes are refused whole, and the later term's go through."""
    async with open_store(pg_url, tmp_path) as store:
        await store.migrate()
        terms = RoleTerms(store)
        rows = BundlerRows(store)
        first = await terms.begin(ROLE)
        second = await terms.begin(ROLE)
        assert (first, second) == (1, 2) and stored_term(pg_url) == 2
        stale = Intent("0x" + "aa" * 32, 7, b"\x02stale", first)
        assert not await rows.record_submission("ethereum", "devnet", [], stale, fenced=True)
        entry = _entry()
        assert not await rows.save_bundler_entries("ethereum", "devnet", [entry], term=first)
        assert await rows.bundler_get("ethereum", "devnet", entry.hash) is None
        assert await rows.bundler_intent("ethereum", "devnet", stale.tx_hash) is None
        fresh = Intent("0x" + "bb" * 32, 7, b"\x02fresh", second)
        assert await rows.record_submission("ethereum", "devnet", [entry], fresh, fenced=True)
        assert await rows.bundler_intent("ethereum", "devnet", fresh.tx_hash) == fresh
        assert await rows.bundler_get("ethereum", "devnet", entry.hash) is not None


def _entry() -> Entry:
    """A stored operation row (its content does not matter to the fence)."""
    return make_entry(1)


def pg_gateway(
    node: AnvilProcess, manifest: Manifest, tmp_path: Path, pg_url: str, impl: Impl
) -> Gateway:
    """A gateway on PostgreSQL (so under leadership), bundling only when asked."""
    settings = start_settings(node, tmp_path, manifest, safe_mode=False, mode="manual")
    settings = msgspec.structs.replace(
        settings, store=msgspec.structs.replace(settings.store, url=pg_url)
    )
    return Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )


async def send_op(bundler: Bundler) -> str:
    op, expected = await sponsored_op(bundler, "0.7")
    entry_point = bundler.manifest.address(f"entry_point_{TAGS['0.7']}")
    sent = await bundler.result(
        "eth_sendUserOperation", encode_user_operation(op, "0.7"), entry_point
    )
    assert sent == expected
    return str(sent)


async def test_no_bundle_before_the_term_has_begun(
    nursery: trio.Nursery,
    impl: Impl,
    module_devnet: tuple[AnvilProcess, Manifest],
    pg_url: str,
    tmp_path: Path,
) -> None:
    """Under PostgreSQL leadership the lease alone is not enough: a process whose lease is
    granted but whose term has not begun (its bump of ``role_terms`` waits on the row, which
    another transaction holds) bundles nothing — sendBundleNow answers -32002, nothing is
    recorded, signed or sent.  Once the term has begun and the mempool is loaded, it does."""
    node, manifest = module_devnet
    async with open_store(pg_url, tmp_path) as store:
        await store.migrate()
        assert await RoleTerms(store).begin(ROLE) == 1  # an earlier leader's term
    blocker = psycopg.connect(pg_url)  # its open transaction holds the role's row
    try:
        blocker.execute(
            "SELECT term FROM role_terms WHERE role = %s AND chain = %s AND network = %s"
            " FOR UPDATE",
            (ROLE.role, ROLE.chain, ROLE.network),
        )
        gateway = pg_gateway(node, manifest, tmp_path, pg_url, impl)
        await nursery.start(gateway.run)
        assert gateway.bundler is not None and gateway.store is not None
        net = gateway.bundler.networks["ethereum/devnet"]
        submitter = net.submitter
        assert submitter is not None
        with trio.fail_after(30):
            while not gateway.leadership.holds(ROLE):
                await trio.sleep(0.05)
        bundler = Bundler(GatewayHandle(gateway, io.BytesIO()), node, manifest)
        sent = await send_op(bundler)  # accepted: any process admits operations
        with DevnetRpc(node.url) as rpc:
            before = rpc.call("eth_getTransactionCount", submitter.address, "pending")
        assert net.fenced and net.term is None and gateway.leadership.holds(ROLE)

        refused = await bundler.call("debug_bundler_sendBundleNow")
        assert refused["error"]["code"] == NOT_LEADING, refused
        with DevnetRpc(node.url) as rpc:
            assert rpc.call("eth_getTransactionCount", submitter.address, "pending") == before
        assert intents(pg_url) == []
        row = await BundlerRows(gateway.store).bundler_get("ethereum", "devnet", sent)
        assert row is not None and (row.status, row.bundle_tx) == ("pending", None)
    finally:
        blocker.rollback()
        blocker.close()

    # The term begins (2) and loads: bundled as usual, recorded under that term.
    with trio.fail_after(30):
        while net.term is None:
            await trio.sleep(0.05)
    assert net.term == 2
    await bundler.result("debug_bundler_sendBundleNow")
    receipt = await bundler.receipt(sent)
    assert receipt["success"] is True
    assert [t for _, _, t in intents(pg_url)] == [2]


async def test_a_deposed_terms_requeue_writes_nothing(
    nursery: trio.Nursery,
    impl: Impl,
    module_devnet: tuple[AnvilProcess, Manifest],
    pg_url: str,
    tmp_path: Path,
) -> None:
    """A leader deposed during its own load finds a bundle in flight that the node does not
    know and nobody recorded: its operations would go back to pending — over what the next
    leader may have recorded since.  Fenced by its term, that requeue writes nothing; the
    newest term's load does put them back."""
    node, manifest = module_devnet
    gateway = pg_gateway(node, manifest, tmp_path, pg_url, impl)
    await nursery.start(gateway.run)
    assert gateway.bundler is not None and gateway.store is not None
    net = gateway.bundler.networks["ethereum/devnet"]
    with trio.fail_after(30):
        while net.term is None:
            await trio.sleep(0.05)
    first = net.term
    bundler = Bundler(GatewayHandle(gateway, io.BytesIO()), node, manifest)
    sent = await send_op(bundler)
    rows = BundlerRows(gateway.store)
    stored = await rows.bundler_get("ethereum", "devnet", sent)
    assert stored is not None
    lost_tx = "0x" + "ee" * 32  # never sent: unknown to the node, no intent recorded
    in_flight = stored.with_(status="submitted", bundle_tx=lost_tx)
    assert await rows.save_bundler_entries("ethereum", "devnet", [in_flight], term=first)
    later = await RoleTerms(gateway.store).begin(ROLE)  # another process's term began

    net.mempool.forget_live()
    with pytest.raises(BundlerFault) as refused:
        await net.load(first)  # the deposed leader's load
    assert refused.value.code == NOT_LEADING
    row = await rows.bundler_get("ethereum", "devnet", sent)
    assert row is not None and (row.status, row.bundle_tx) == ("submitted", lost_tx)
    assert net.term is None  # and it serves no term: it bundles nothing
    refused_bundle = await bundler.call("debug_bundler_sendBundleNow")
    assert refused_bundle["error"]["code"] == NOT_LEADING, refused_bundle

    # The newest term's load settles the same bundle: its operation is pending again.
    net.mempool.forget_live()
    await net.load(later)
    row = await rows.bundler_get("ethereum", "devnet", sent)
    assert row is not None and (row.status, row.bundle_tx) == ("pending", None)
    assert net.term == later


async def test_a_lease_lost_during_the_send_is_finished_not_bundled_again(
    nursery: trio.Nursery,
    impl: Impl,
    module_devnet: tuple[AnvilProcess, Manifest],
    pg_url: str,
    tmp_path: Path,
) -> None:
    """The leader records its bundle transaction and its request leaves for the node; the
    lease is taken away (its PostgreSQL session ended) before the node sees it.  The next
    term finds the record, sends the same bytes, and bundles nothing else; the first request,
    arriving late, changes nothing: one transaction, its nonce used once, the operation
    included once, by the recorded transaction."""
    node, manifest = module_devnet
    settings = start_settings(node, tmp_path, manifest, safe_mode=False, mode="manual")
    settings = msgspec.structs.replace(
        settings, store=msgspec.structs.replace(settings.store, url=pg_url)
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    leadership = gateway.leadership
    assert isinstance(leadership, PgLeadership)
    assert gateway.bundler is not None
    net: BundlerNetwork = gateway.bundler.networks["ethereum/devnet"]
    submitter = net.submitter
    assert submitter is not None
    with trio.fail_after(30):
        while not (leadership.holds(ROLE) and net.term is not None):
            await trio.sleep(0.05)
    first_term = net.term
    bundler = Bundler(GatewayHandle(gateway, io.BytesIO()), node, manifest)

    def nonce(block: str) -> int:
        with DevnetRpc(node.url) as rpc:
            return int(rpc.call("eth_getTransactionCount", submitter.address, block), 16)

    op, expected = await sponsored_op(bundler, "0.7")
    entry_point = manifest.address(f"entry_point_{TAGS['0.7']}")
    sent = await bundler.result(
        "eth_sendUserOperation", encode_user_operation(op, "0.7"), entry_point
    )
    assert sent == expected
    before = nonce("latest")

    # The first request to send the bundle is on its way: held, delivered after the handover.
    real_send = submitter.send_raw
    in_flight: list[bytes] = []
    left = trio.Event()
    arrive = trio.Event()

    async def send_later(raw: bytes) -> None:
        if not in_flight:
            in_flight.append(raw)
            left.set()
            await arrive.wait()
        await real_send(raw)

    submitter.send_raw = send_later  # type: ignore[method-assign]
    first_answer: dict[str, Any] = {}

    async def send_bundle_now() -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "debug_bundler_sendBundleNow", "params": []}
        async with httpx.AsyncClient(base_url=bundler.handle.base, timeout=120) as client:
            first_answer.update((await client.post(PATH, json=body)).json())

    nursery.start_soon(send_bundle_now)
    with trio.fail_after(30):
        await left.wait()
    recorded = intents(pg_url)
    assert [(h, n) for h, n, _ in recorded] == [(tx_hash(in_flight[0]), before)]
    assert recorded[0][2] == first_term

    # The lease is taken away: its session ends (as when the leader's connection dies).
    session = leadership._session
    assert session is not None
    lease_pid = session.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lease_pid,))
    # The next term (this process again, the only one: as another would) settles the record.
    with trio.fail_after(30):
        while not (leadership.holds(ROLE) and net.term is not None and net.term > first_term):
            await trio.sleep(0.05)
    receipt = await bundler.receipt(sent)
    assert receipt["success"] is True
    assert receipt["receipt"]["transactionHash"] == tx_hash(in_flight[0])
    assert net.bundles["finished"] == 1
    # The operation was not put back to be bundled a second time.
    assert not net.mempool.has_pending()

    arrive.set()  # the first request arrives at last
    with trio.fail_after(30):
        while not first_answer:
            await trio.sleep(0.05)
    # The deposed term's bundle call ends refused, having written nothing more.
    assert first_answer["error"]["code"] == NOT_LEADING, first_answer
    await bundler.result("debug_bundler_sendBundleNow")  # nothing to bundle: no transaction
    assert nonce("latest") == before + 1  # the nonce used once, by one transaction
    assert [(h, n) for h, n, _ in intents(pg_url)] == [(tx_hash(in_flight[0]), before)]
    status = await bundler.result("chaingate_getUserOperationStatus", sent)
    assert status["status"] == "included", status
