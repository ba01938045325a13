"""The webhook matcher across leadership terms: each term goes on from the stored cursor (another
process may have led the network meanwhile), and a cursor write that does not find the cursor
where this writer left it changes nothing (compare-and-set), on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from chaingate.auth.store import AuthRows
from chaingate.chain.events import Apply, Block, BlockHeader, ChainEvent, header_from_rpc
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.store import Store, open_store
from chaingate.webhooks.blockmatcher import NetworkMatcher
from chaingate.webhooks.store import WebhookCursorMoved, WebhookRows
from chaingate.webhooks.variants import VARIANT_A
from tests.test_metadata_devnet import open_client

CHAIN, NETWORK = "ethereum", "devnet"


def block_hash(number: int) -> str:
    return f"0x{number:064x}"


def block(number: int) -> Block:
    header = BlockHeader(
        number=number,
        hash=block_hash(number),
        parent_hash=block_hash(number - 1),
        timestamp=number,
        gas_used=0,
        gas_limit=30_000_000,
        base_fee_per_gas=None,
        transaction_count=0,
        fields={},
    )
    return Block(header=header, logs=[], transactions=[])


@contextlib.asynccontextmanager
async def opened(url: str, data_dir: Path) -> AsyncIterator[Store]:
    store = open_store(url, data_dir)
    async with store:
        await store.migrate()
        yield store


async def stored_cursor(store: Store) -> tuple[int, str] | None:
    _, cursor, _ = await WebhookRows(store).load_webhook_filters(CHAIN, NETWORK)
    return cursor


async def until_cursor(store: Store, number: int) -> None:
    with trio.fail_after(10):
        while (cursor := await stored_cursor(store)) is None or cursor[0] != number:
            await trio.sleep(0.02)


async def term(store: Store, matcher: NetworkMatcher, blocks: list[int], tip: int) -> None:
    """One leadership term: the matcher runs, is handed ``blocks`` (live), then is cancelled
    once the stored cursor is at ``tip``."""
    send, receive = trio.open_memory_channel[ChainEvent](16)
    async with trio.open_nursery() as nursery:
        await nursery.start(matcher.run, receive)
        for number in blocks:
            await send.send(Apply(block(number), live=True))
        await until_cursor(store, tip)
        nursery.cancel_scope.cancel()


async def test_a_new_term_goes_on_from_the_cursor_another_process_left(
    store_url: str, tmp_path: Path
) -> None:
    async with opened(store_url, tmp_path) as store:
        # No chain client: a block that does not extend the cursor could not be caught up,
        # so the second term commits block 11 only if it adopted the stored cursor (10).
        matcher = NetworkMatcher(CHAIN, NETWORK, store, None, VARIANT_A, chain_id=31337)
        await term(store, matcher, [1, 2, 3], tip=3)
        assert await stored_cursor(store) == (3, block_hash(3))

        # Another process leads the network meanwhile and takes the cursor to block 10.
        await WebhookRows(store).move_webhook_cursor(
            CHAIN, NETWORK, (10, block_hash(10)), expect=(3, block_hash(3))
        )

        await term(store, matcher, [11], tip=11)
        assert await stored_cursor(store) == (11, block_hash(11))
        assert matcher.cursor == (11, block_hash(11))
        assert matcher.stats["errors"] == 0


async def test_cursor_writes_are_compare_and_set(store_url: str, tmp_path: Path) -> None:
    async with opened(store_url, tmp_path) as store:
        rows = WebhookRows(store)
        assert await rows.commit_matches(
            CHAIN, NETWORK, 0, (5, block_hash(5)), [], lambda *_: "", expect=None
        )
        # A writer that still believes the cursor is at 3 changes nothing.
        with pytest.raises(WebhookCursorMoved):
            await rows.commit_matches(
                CHAIN, NETWORK, 0, (4, block_hash(4)), [], lambda *_: "", expect=(3, block_hash(3))
            )
        with pytest.raises(WebhookCursorMoved):
            await rows.move_webhook_cursor(
                CHAIN, NETWORK, (2, block_hash(2)), expect=(3, block_hash(3))
            )
        with pytest.raises(WebhookCursorMoved):
            await rows.revert_matches(
                CHAIN,
                NETWORK,
                block_hash(3),
                (2, block_hash(2)),
                VARIANT_A.render_removal,
                lambda i: i + "-removed",
                expect=(3, block_hash(3)),
            )
        assert await stored_cursor(store) == (5, block_hash(5))
        # The writer that left it at 5 moves it on.
        assert await rows.commit_matches(
            CHAIN, NETWORK, 0, (6, block_hash(6)), [], lambda *_: "", expect=(5, block_hash(5))
        )
        assert await stored_cursor(store) == (6, block_hash(6))


async def test_an_event_another_writer_inserts_meanwhile_is_kept_once(tmp_path: Path) -> None:
    """PostgreSQL's COPY path: the existence check takes no lock, so another transaction may
    insert the same event id between the check and the write; the write then skips it (ON
    CONFLICT DO NOTHING) instead of failing the whole batch."""
    import psycopg

    from chaingate.store.base import new_id
    from chaingate.webhooks.model import event_id
    from chaingate.webhooks.outbox import NewEvent
    from tests.conftest import pg_schema
    from tests.test_webhook_delivery import add_events, make_webhook

    with pg_schema() as url:
        async with opened(url, tmp_path) as store:
            account = await AuthRows(store).create_account("owner@example.com", "free")
            hook = await make_webhook(store, account.id, "https://example.com/", VARIANT_A)
            (first,) = await add_events(store, VARIANT_A, hook, 1)
            racing = event_id(hook.id, f"test|{new_id('')}")
            other = event_id(hook.id, f"test|{new_id('')}")
            events = [
                NewEvent(id=i, webhook_id=hook.id, event_type=VARIANT_A.type_name("test"))
                for i in (racing, other)
            ]
            with psycopg.connect(url) as conn:
                # Another writer's transaction holds the same id, not yet committed.
                conn.execute(
                    "INSERT INTO webhook_events SELECT %s, webhook_id, account_id, chain,"
                    " network, sequence + 100, event_type, block_number, block_hash,"
                    " deliver_at_block, original_id, body, state, attempts, retries,"
                    " next_attempt_at, lease_until, created_at"
                    " FROM webhook_events WHERE id = %s",
                    (racing, first),
                )
                written: list[int] = []

                async def write() -> None:
                    written.append(await WebhookRows(store).add_events(events, lambda *_: "{}"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(write)
                    await trio.sleep(0.5)  # the write has checked, and waits on that row
                    conn.commit()
            assert written == [1]  # ``other`` only
            with psycopg.connect(url) as conn:
                rows = conn.execute(
                    "SELECT id FROM webhook_events WHERE id = ANY(%s)", ([racing, other],)
                ).fetchall()
            assert sorted(r[0] for r in rows) == sorted([racing, other])


async def test_a_matcher_behind_catches_up_many_blocks_per_transaction(
    store_url: str, tmp_path: Path, anvil_factory: Callable[..., AnvilProcess]
) -> None:
    """A restart that finds the cursor 300 blocks behind the follower fetches the blocks in
    between and commits them as the backlog is: a handful of transactions, not one each."""
    anvil = anvil_factory()
    rpc_call(anvil.url, "anvil_mine", [hex(301)])
    headers = [
        header_from_rpc(rpc_call(anvil.url, "eth_getBlockByNumber", [hex(n), False]))
        for n in (1, 301)
    ]
    first, last = (Block(header=h, logs=[], transactions=[]) for h in headers)
    async with opened(store_url, tmp_path) as store, trio.open_nursery() as nursery:
        client = await open_client(nursery, anvil.url)
        matcher = NetworkMatcher(CHAIN, NETWORK, store, client, VARIANT_A, chain_id=31337)
        send, receive = trio.open_memory_channel[ChainEvent](16)
        await nursery.start(matcher.run, receive)
        await send.send(Apply(first, live=True))
        await until_cursor(store, 1)
        commits = matcher.stats["commits"]
        await send.send(Apply(last, live=True))  # 2..300 were never handed to it
        await until_cursor(store, 301)
        assert await stored_cursor(store) == (301, last.header.hash)
        assert matcher.stats["caught_up_blocks"] == 299
        assert matcher.stats["commits"] - commits <= 3  # 299 blocks in one, then block 301
        nursery.cancel_scope.cancel()
