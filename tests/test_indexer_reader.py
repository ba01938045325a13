"""The read model (``IndexReader``) over a real index: what the REST endpoints will answer.

Balances, owned NFTs, collections, tokens and transfers are compared with the independent
recomputation (``tests.test_indexer_oracle``), pages are walked to the end (a contract found
not to be an ERC-20 leaves pages and total alike), and a transfers cursor is shown to stay
valid while new blocks arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from chaingate.data.reader import IndexReader, InvalidCursor, TransferItem
from chaingate.data.store import IndexRows
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.evm import abi
from tests.conftest import DEVNET_SIGNER
from tests.test_indexer import Start, indexed_starter
from tests.test_indexer_oracle import ZERO, Node, assert_index_matches


@pytest.fixture
def start_indexed(nursery: trio.Nursery, tmp_path: Path) -> Start:
    return indexed_starter(nursery, tmp_path)


async def test_reader_answers_match_the_recomputation(
    start_indexed: Start, anvil_factory: Callable[..., AnvilProcess], store_url: str
) -> None:
    anvil = anvil_factory()
    manifest = bootstrap_devnet(anvil.url, paymaster_signer=DEVNET_SIGNER.address)
    node = Node(anvil.url)
    a = manifest.accounts
    cgt, usd = manifest.address("erc20_cgt"), manifest.address("erc20_cgusd")
    nft, items = manifest.address("erc721_collection"), manifest.address("erc1155_items")

    def call(sender: str, to: str, signature: str, *args: object) -> dict[str, str]:
        return {"from": sender, "to": to, "data": "0x" + abi.encode_call(signature, *args).hex()}

    # a[1] ends up with both tokens, several NFTs and items; three transfers to itself too.
    for _ in range(3):
        await node.send(call(manifest.deployer, nft, "mint(address,string)", a[1], "ipfs://x"))
    await node.send(call(manifest.deployer, cgt, "mint(address,uint256)", a[1], 12345))
    await node.send(call(a[1], cgt, "transfer(address,uint256)", a[1], 5))
    await node.send({"from": a[1], "to": a[1], "value": hex(7)})
    await node.send(
        call(manifest.deployer, items, "mint(address,uint256,uint256,string)", a[1], 9, 40, "")
    )
    run = await start_indexed(anvil.url, store_url)
    got = await assert_index_matches(run.store, node, manifest)
    reader: IndexReader = run.indexer.reader
    at = await reader.at()
    head = await node.head()
    assert at is not None and (at.block_number, at.block_hash) == head

    # Balances: positive only, by contract, paginated with a total.
    one = a[1].lower()
    want = sorted((c, b) for (h, c), b in got.balances.items() if h == one and b > 0)
    assert len(want) >= 2
    listed = []
    for offset in range(0, len(want), 2):
        page = await reader.balances(a[1].upper().replace("0X", "0x"), offset=offset, limit=2)
        assert page.total == len(want) and page.at == at and page.offset == offset
        listed += [(i.contract, i.balance) for i in page.items]
    assert listed == want
    assert (await reader.balances(a[1], offset=len(want))).items == []

    # A contract the metadata service found not to be an ERC-20 leaves the pages and their
    # total alike; found to be one again, it is back.
    verdicts = IndexRows(run.store)
    hidden = want[0][0]
    await verdicts.set_erc20_verdicts(reader.chain, reader.network, {hidden: False})
    await verdicts.set_erc20_verdicts(reader.chain, reader.network, {hidden: False})  # again
    pages = [await reader.balances(a[1], offset=o, limit=1) for o in range(len(want))]
    assert {p.total for p in pages} == {len(want) - 1}
    assert [(i.contract, i.balance) for p in pages for i in p.items] == want[1:]
    other_network = IndexReader(run.store, reader.chain, "elsewhere")
    await verdicts.set_erc20_verdicts(reader.chain, "elsewhere", {want[1][0]: False})
    assert (await reader.balances(a[1])).total == len(want) - 1  # per network
    assert (await other_network.balances(a[1])).total == 0
    await verdicts.set_erc20_verdicts(reader.chain, reader.network, {hidden: True})
    assert [(i.contract, i.balance) for i in (await reader.balances(a[1])).items] == want

    # Owned NFTs: ERC-721 and ERC-1155 with quantity, in (contract, token id) order.
    owned = []
    offset = 0
    while True:
        nfts = await reader.owned_nfts(a[1], offset=offset, limit=2)
        owned += nfts.items
        offset += 2
        if offset >= nfts.total:
            break
    want_nfts = sorted((c, i, q) for (h, c, i), q in got.holdings.items() if h == one and q > 0)
    assert [(n.contract, n.token_id, n.quantity) for n in owned] == want_nfts
    assert {n.standard for n in owned if n.contract == items.lower()} == {"ERC1155"}
    assert {n.standard for n in owned if n.contract == nft.lower()} == {"ERC721"}

    # Collections: supply (ids in existence) and owners.
    collection = await reader.collection(nft)
    assert collection is not None and collection.standard == "ERC721"
    live_ids = {i for (c, i), (s, _) in got.tokens.items() if c == nft.lower() and s > 0}
    assert collection.total_supply == len(live_ids)
    assert collection.num_owners == len({h for (c, h) in got.owners if c == nft.lower()})
    assert (await reader.collection(cgt)) is None  # not an NFT
    assert (await reader.collection("0x" + "00" * 19 + "01")) is None
    info = await reader.contract(cgt)
    assert info is not None and info.standards == ["ERC20"]
    assert info.erc20_holders == got.contracts[cgt.lower()][3]

    # One token: owner for ERC-721, holders for ERC-1155; a burned one has no owner.
    token = await reader.nft_token(nft, 1)
    assert token is not None and token.owner == a[2].lower()  # the demo moved #1 to a2
    assert await reader.nft_token(nft, 4) is None  # burned: no supply, no holder, no row
    item = await reader.nft_token(items, 1)
    assert item is not None and item.standard == "ERC1155" and item.owner is None
    want_holders = sorted(
        (h, q) for (h, c, i), q in got.holdings.items() if c == items.lower() and i == 1
    )
    assert [(h.address, h.quantity) for h in item.holders] == want_holders
    assert item.holders_total == len(want_holders)
    assert await reader.nft_token(nft, 999) is None

    # Transfers of a[1], newest first, through every page; filters; self transfers once.
    want_transfers = [t for t in got.transfers if one in (t[4], t[5])]
    items_seen: list[TransferItem] = []
    cursor = None
    while True:
        transfers = await reader.transfers(a[1], cursor=cursor, limit=3)
        items_seen += transfers.items
        cursor = transfers.next_cursor
        if cursor is None:
            break
    assert len(items_seen) == len(want_transfers)
    # Newest block first; within a block the order is the chain's (covered by the unit tests).
    numbers = [t.block_number for t in items_seen]
    assert numbers == sorted(numbers, reverse=True)
    assert sorted((t.block_number, t.sender, t.receiver, t.amount) for t in items_seen) == sorted(
        (t[0], t[4], t[5], t[7]) for t in want_transfers
    )
    assert sum(t.direction == "self" for t in items_seen) == 2  # the CGT and the ETH to itself
    outgoing = await reader.transfers(a[1], direction="out", limit=100)
    assert outgoing.items and all(t.sender == one for t in outgoing.items)
    incoming = await reader.transfers(a[1], direction="in", limit=100)
    assert incoming.items and all(t.receiver == one for t in incoming.items)
    assert len(outgoing.items) + len(incoming.items) - 2 == len(items_seen)
    only_cgt = await reader.transfers(a[1], contract=cgt.upper().replace("0X", "0x"), limit=100)
    assert only_cgt.items and all(t.contract == cgt.lower() for t in only_cgt.items)
    natives = [t for t in items_seen if t.standard == "native"]
    assert natives and all(t.contract is None and t.log_index is None for t in natives)
    last = items_seen[0].block_number
    ranged = await reader.transfers(a[1], from_block=last, to_block=last, limit=100)
    assert {t.block_number for t in ranged.items} == {last}

    # A cursor stays valid while blocks are added: the next page is what it was.
    first = await reader.transfers(a[1], limit=2)
    assert first.next_cursor is not None
    before = await reader.transfers(a[1], cursor=first.next_cursor, limit=4)
    await node.send(call(a[2], usd, "transfer(address,uint256)", a[1], 1))
    await assert_index_matches(run.store, node, manifest)
    after = await reader.transfers(a[1], cursor=first.next_cursor, limit=4)
    assert after.items == before.items
    newest = await reader.transfers(a[1], limit=1)
    assert newest.items[0].sender == a[2].lower() and newest.items[0].contract == usd.lower()
    with pytest.raises(InvalidCursor):
        await reader.transfers(a[1], cursor="nonsense")

    # Contracts in order of first appearance, paged.
    seen = []
    cursor = None
    while True:
        contracts = await reader.contracts_seen(cursor=cursor, limit=2)
        seen += contracts.items
        cursor = contracts.next_cursor
        if cursor is None:
            break
    assert [c.contract for c in seen] == sorted(
        got.contracts, key=lambda c: (got.contracts[c][1], c)
    )
    # The same reader works standalone on the store (a REST process without an indexer).
    standalone = IndexReader(run.store, "ethereum", "devnet")
    assert (await standalone.balances(a[1])).items == (await reader.balances(a[1])).items
    assert (await IndexReader(run.store, "ethereum", "other").at()) is None
    assert ZERO not in {b.contract for b in (await reader.balances(ZERO)).items}
    await node.aclose()
