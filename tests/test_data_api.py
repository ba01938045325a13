"""The token, NFT and transfer endpoints end to end: a gateway (keys on) following a devnet of
this module's own from genesis, with its indexer and metadata service, answering over HTTP.

Every answer is checked against the OpenAPI document (the client's response hook), and the
values against the chain itself: ``balanceOf``/``ownerOf``/``totalSupply`` by ``eth_call``, the
manifest's demo history.  The devnet's odd contracts (bytes32 symbol, no ``decimals()``, a
reverting ``balanceOf``, a Transfer emitter that is no token) are each a case here.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.keeper import refresh_price_feeds
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.gateway import Gateway
from chaingate.outbound import OutboundPolicy
from chaingate.store import open_store
from chaingate.twins import Impl
from tests.conftest import DEVNET_SIGNER, make_settings
from tests.helpers import GatewayHandle
from tests.test_auth import PEPPER

ZERO = "0x" + "00" * 20


@pytest.fixture(scope="module")
def chain() -> Iterator[tuple[AnvilProcess, Manifest]]:
    """A devnet of this module's own: its feeds get new rounds, its blocks reorganised."""
    with AnvilProcess() as node:
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
        )
        refresh_price_feeds(node.url, manifest)
        yield node, manifest


def eth_call(url: str, to: str, signature: str, *args: Any, out: str = "uint256") -> Any:
    with DevnetRpc(url) as rpc:
        raw = rpc.call(
            "eth_call",
            {"to": to, "data": "0x" + abi.encode_call(signature, *args).hex()},
            "latest",
        )
    return abi.decode([out], bytes.fromhex(raw[2:]))[0]


class Api:
    def __init__(self, handle: GatewayHandle, key: str, node: AnvilProcess, manifest: Manifest):
        self.handle = handle
        self.key = key
        self.node = node
        self.manifest = manifest

    def client(self) -> httpx.AsyncClient:
        return self.handle.client(headers={"X-API-Key": self.key})

    async def get(self, path: str, **params: Any) -> httpx.Response:
        async with self.client() as client:
            return await client.get(path, params=params)

    async def caught_up(self) -> None:
        """Until the index holds the node's head."""
        with DevnetRpc(self.node.url) as rpc:
            head = int(rpc.call("eth_blockNumber"), 16)
        assert self.handle.gateway.data is not None
        index = self.handle.gateway.data.readers["ethereum/devnet"]
        with trio.fail_after(30):
            while True:
                at = await index.at()
                if at is not None and at.block_number >= head:
                    return
                await trio.sleep(0.05)


@pytest.fixture
async def api(
    nursery: trio.Nursery, impl: Impl, chain: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> Api:
    return await start_api(nursery, impl, chain, tmp_path, f"sqlite://{tmp_path}/store.db")


async def start_api(
    nursery: trio.Nursery,
    impl: Impl,
    chain: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    store_url: str,
) -> Api:
    """A gateway (keys on) following ``chain`` from genesis on ``store_url``, caught up."""
    node, manifest = chain
    manifest_path = tmp_path / "manifest.json"
    manifest_path.write_bytes(dumps(manifest))
    settings = make_settings(
        [{"url": node.url, "name": "anvil"}],
        network={
            "finality_depth": 2,
            "block_time": 1.0,
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.02, "start_block": 0},
            "indexer": {"batch_seconds": 0.05},
        },
        auth={"enabled": True, "pepper": PEPPER, "refresh_interval": 0.1},
        store={"url": store_url},
        data_dir=str(tmp_path),
    )
    gateway = Gateway(
        settings, impl=impl, access_stream=io.BytesIO(), outbound_policy=OutboundPolicy.dev()
    )
    await nursery.start(gateway.run)
    store = open_store(store_url, tmp_path)
    async with store:
        account = await admin.ensure_account(AuthRows(store), "data@t", "enterprise")
        key, _ = await admin.create_key(
            AuthRows(store), PEPPER.encode(), account.id, "t", "test", admin.parse_scopes("")
        )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    result = Api(GatewayHandle(gateway, io.BytesIO()), key, node, manifest)
    await result.caught_up()
    return result


# --- tokens ------------------------------------------------------------------------------------


async def test_balances_are_the_chains_with_metadata_and_usd_values(api: Api) -> None:
    m = api.manifest
    holder = m.accounts[1]
    response = await api.get(f"/v1/tokens/ethereum/balances/{holder.lower()}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["address"] == checksum_address(holder) and body["chain"] == "ethereum"
    assert body["page"] == 1 and body["limit"] == 50
    assert isinstance(body["block_number"], int) and body["block_hash"].startswith("0x")
    tokens = {t["contract"]: t for t in body["tokens"]}
    assert body["total"] >= len(tokens)
    assert list(tokens) == sorted(tokens, key=str.lower)  # stable order: by contract
    for name in ("erc20_cgusd", "erc20_cgt", "erc20_bytes32", "erc20_no_decimals"):
        address = checksum_address(m.address(name))
        on_chain = eth_call(api.node.url, address, "balanceOf(address)", holder)
        assert tokens[address]["balance"] == str(on_chain), name
    usd = tokens[checksum_address(m.address("erc20_cgusd"))]
    assert (usd["symbol"], usd["decimals"]) == ("CGUSD", 6)
    assert usd["formatted_balance"] == "4875"  # 5,000 minted, 125 sent on
    assert usd["usd_value"] is not None and float(usd["usd_value"]) == 4875.0
    bytes32 = tokens[checksum_address(m.address("erc20_bytes32"))]
    assert (bytes32["symbol"], bytes32["name"]) == ("CGB32", "Chaingate Bytes32")  # not hex
    raw = tokens[checksum_address(m.address("erc20_no_decimals"))]
    assert raw["decimals"] is None and raw["formatted_balance"] == "12345"
    assert raw["usd_value"] is None  # no feed: never invented
    assert all(t["logo_url"] is None for t in tokens.values())  # no token list configured


async def test_a_transfer_emitter_is_not_listed_as_a_token(api: Api) -> None:
    receiver = api.manifest.accounts[2]  # got 5 "tokens" from the emitter's fake Transfer
    body = (await api.get(f"/v1/tokens/ethereum/balances/{receiver}")).json()
    emitter = checksum_address(api.manifest.address("transfer_emitter"))
    assert emitter not in {t["contract"] for t in body["tokens"]}


async def test_balances_total_is_what_the_pages_hold(
    nursery: trio.Nursery,
    impl: Impl,
    chain: tuple[AnvilProcess, Manifest],
    tmp_path: Path,
    store_url: str,
) -> None:
    """The banner's holder got CGUSD, CGT and the emitter's fake Transfer: ``total`` counts the
    tokens listed, not the emitter — on both stores, paged one by one too, asked as soon as the
    index has caught up (the emitter may still be being probed)."""
    api = await start_api(nursery, impl, chain, tmp_path, store_url)
    m = api.manifest
    holder = m.accounts[2]
    emitter = checksum_address(m.address("transfer_emitter"))
    whole = (await api.get(f"/v1/tokens/ethereum/balances/{holder}")).json()
    listed = [t["contract"] for t in whole["tokens"]]
    assert emitter not in listed and {"CGUSD", "CGT"} <= {t["symbol"] for t in whole["tokens"]}
    assert whole["total"] == len(listed), whole
    paged = []
    for page in range(1, len(listed) + 2):
        one = (await api.get(f"/v1/tokens/ethereum/balances/{holder}", limit=1, page=page)).json()
        assert one["total"] == len(listed), one
        paged += [t["contract"] for t in one["tokens"]]
        assert len(one["tokens"]) == (1 if page <= len(listed) else 0), one
    assert paged == listed


async def test_token_metadata_reads_supply_and_price_on_chain(api: Api) -> None:
    m = api.manifest
    cgt = checksum_address(m.address("erc20_cgt"))
    body = (await api.get(f"/v1/tokens/ethereum/metadata/{cgt}")).json()
    supply = eth_call(api.node.url, cgt, "totalSupply()")
    assert body["total_supply"] == str(supply)
    assert (body["name"], body["symbol"], body["decimals"]) == ("Chaingate Token", "CGT", 18)
    assert body["price_usd"] is not None and float(body["price_usd"]) == 0.25
    assert float(body["market_cap_usd"]) == pytest.approx(supply / 10**18 * 0.25)


@pytest.mark.parametrize(
    ("name", "message"),
    [("transfer_emitter", "not a token"), ("erc721_collection", "ERC721"), (None, "not a token")],
)
async def test_token_metadata_of_what_is_no_erc20_is_404(
    api: Api, name: str | None, message: str
) -> None:
    address = api.manifest.address(name) if name else api.manifest.accounts[6]
    response = await api.get(f"/v1/tokens/ethereum/metadata/{address}")
    assert response.status_code == 404, response.text
    assert message in response.json()["error"]["message"]


async def test_a_wrong_checksum_and_an_unknown_chain_are_refused(api: Api) -> None:
    address = checksum_address(api.manifest.accounts[1])
    wrong = address[:2] + address[2:].swapcase()
    if wrong[2:].lower() == wrong[2:] or wrong[2:].upper() == wrong[2:]:
        wrong = address[:-1] + ("A" if address[-1] != "A" else "B")  # still mixed case
    response = await api.get(f"/v1/tokens/ethereum/balances/{wrong}")
    assert response.status_code == 400
    assert "address" in response.json()["error"]["message"]
    response = await api.get(f"/v1/tokens/bitcoin/balances/{address}")
    assert response.status_code == 404
    response = await api.get(f"/v1/tokens/ethereum/balances/{address}", limit=101)
    assert response.status_code == 400 and "'limit'" in response.json()["error"]["message"]


# --- NFTs --------------------------------------------------------------------------------------


async def test_nft_metadata_from_a_data_uri_with_the_owner_from_the_index(api: Api) -> None:
    m = api.manifest
    collection = m.address("erc721_collection")
    body = (await api.get(f"/v1/nfts/ethereum/metadata/{collection}/1")).json()
    owner = eth_call(api.node.url, collection, "ownerOf(uint256)", 1, out="address")
    assert body["owner"] == checksum_address(owner) == checksum_address(m.accounts[2])
    assert (body["name"], body["standard"], body["token_id"]) == ("Devnet #1", "ERC721", "1")
    assert body["metadata_status"] == "ok" and body["image_url"].startswith("data:image/svg")
    # The burned token 4 and a token never minted: 404 (0x-hex ids are accepted too).
    for token_id in ("0x4", "99"):
        missing = await api.get(f"/v1/nfts/ethereum/metadata/{collection}/{token_id}")
        assert missing.status_code == 404, token_id


async def test_an_unreachable_document_says_why_instead_of_staying_silent(api: Api) -> None:
    items = api.manifest.address("erc1155_items")  # id 2 uses the https {id} template
    body = (await api.get(f"/v1/nfts/ethereum/metadata/{items}/2")).json()
    assert body["standard"] == "ERC1155" and body["owner"] is None and body["holders"] == 1
    assert body["supply"] == "5"
    # Nothing serves the devnet's https host here: the answer says so (refused by name).
    assert body["metadata_status"] in ("pending", "failed")
    if body["metadata_status"] == "failed":
        assert "metadata.chaingate.localhost" in body["metadata_error"]


async def test_collection_counts_come_from_the_index(api: Api) -> None:
    m = api.manifest
    collection = m.address("erc721_collection")
    body = (await api.get(f"/v1/nfts/ethereum/collection/{collection}")).json()
    # Minted 1-4 to a1, a2, a3, a1; 1 sent to a2; 4 burned: tokens 1, 2, 3 held by a2, a3.
    assert (body["total_supply"], body["num_owners"]) == (3, 2)
    assert (body["name"], body["symbol"], body["standard"]) == (
        "Chaingate Devnet Collection",
        "CGDC",
        "ERC721",
    )
    assert body["floor_price_eth"] is None and body["floor_price_usd"] is None


async def test_owned_nfts_are_listed_from_the_index_and_paged(api: Api) -> None:
    m = api.manifest
    owner = m.accounts[2]
    first = (await api.get(f"/v1/nfts/ethereum/owned/{owner}", limit=2)).json()
    assert first["total"] >= 4  # collection 1 and 2, item 2, the updatable collection's token
    assert len(first["nfts"]) == 2
    rest = (await api.get(f"/v1/nfts/ethereum/owned/{owner}", limit=2, page=2)).json()
    seen = [(n["contract"], n["token_id"]) for n in first["nfts"] + rest["nfts"]]
    assert len(set(seen)) == len(seen)
    everything = (await api.get(f"/v1/nfts/ethereum/owned/{owner}")).json()["nfts"]
    held = {(n["contract"], n["token_id"]): n for n in everything}
    collection = checksum_address(m.address("erc721_collection"))
    assert {(collection, "1"), (collection, "2")} <= set(held)
    item = held[(checksum_address(m.address("erc1155_items")), "2")]
    assert item["standard"] == "ERC1155" and item["quantity"] == "5"


async def test_a_refresh_is_accepted_then_cooled_down(api: Api) -> None:
    collection = api.manifest.address("erc721_collection")
    async with api.client() as client:
        first = await client.post(f"/v1/nfts/ethereum/metadata/{collection}/2/refresh")
        again = await client.post(f"/v1/nfts/ethereum/metadata/{collection}/2/refresh")
    assert first.status_code == 202 and first.json()["status"] == "accepted"
    assert again.status_code == 429 and int(again.headers["retry-after"]) > 0


async def test_each_account_has_its_own_refresh_allowance(api: Api) -> None:
    # Issue 25, item 7: one account's refreshes never refuse another's.
    gateway = api.handle.gateway
    assert gateway.store is not None and gateway.keys is not None
    account = await admin.ensure_account(AuthRows(gateway.store), "other@t", "enterprise")
    other, _ = await admin.create_key(
        AuthRows(gateway.store), PEPPER.encode(), account.id, "o", "test"
    )
    await gateway.keys.refresh()
    path = f"/v1/nfts/ethereum/metadata/{api.manifest.address('erc721_collection')}/1/refresh"
    async with api.client() as client:
        first = await client.post(path)
        again = await client.post(path)
    async with api.handle.client(headers={"X-API-Key": other}) as client:
        theirs = await client.post(path)
        theirs_again = await client.post(path)
    assert first.status_code == 202 and again.status_code == 429
    assert theirs.status_code == 202, theirs.text
    assert theirs_again.status_code == 429 and int(theirs_again.headers["retry-after"]) > 0
    # Accepted for a fetch no later than where the first one cools down (5 minutes).
    scheduled = [
        datetime.fromisoformat(r.json()["scheduled_at"].replace("Z", "+00:00")).timestamp()
        for r in (first, theirs)
    ]
    assert scheduled[0] <= scheduled[1] <= scheduled[0] + 300 + 1


# --- transfers ---------------------------------------------------------------------------------


async def test_transfers_list_native_and_token_transfers_newest_first(api: Api) -> None:
    m = api.manifest
    a4 = m.accounts[4]  # 1 ETH from the deployer; 1 CGT from a2; the CGT airdrop
    body = (await api.get(f"/v1/transfers/ethereum/{a4}")).json()
    kinds = {(t["type"], t["direction"]) for t in body["transfers"]}
    assert ("native", "in") in kinds and ("erc20", "in") in kinds
    numbers = [t["block_number"] for t in body["transfers"]]
    assert numbers == sorted(numbers, reverse=True)
    native = next(t for t in body["transfers"] if t["type"] == "native")
    assert native["value"] == str(10**18) and native["contract"] is None
    cgt = checksum_address(m.address("erc20_cgt"))
    only = (await api.get(f"/v1/transfers/ethereum/{a4}", contract=cgt)).json()
    assert only["transfers"] and {t["contract"] for t in only["transfers"]} == {cgt}
    outgoing = (await api.get(f"/v1/transfers/ethereum/{a4}", direction="out")).json()
    assert all(t["direction"] in ("out", "self") for t in outgoing["transfers"])
    page = (await api.get(f"/v1/transfers/ethereum/{a4}", limit=1)).json()
    assert page["next_cursor"] is not None
    following = (
        await api.get(f"/v1/transfers/ethereum/{a4}", limit=1, cursor=page["next_cursor"])
    ).json()
    assert following["transfers"][0] != page["transfers"][0]
    for cursor in ("zzz", "99999999999999999999:0", "1:99999999999999999999"):
        bad = await api.get(f"/v1/transfers/ethereum/{a4}", cursor=cursor)
        assert bad.status_code == 400 and "'cursor'" in bad.json()["error"]["message"], cursor


# --- a reorg -----------------------------------------------------------------------------------


async def test_a_balance_taken_by_a_reorg_is_given_back(api: Api) -> None:
    m = api.manifest
    usd = m.address("erc20_cgusd")
    sender, receiver = m.accounts[1], m.accounts[7]
    path = f"/v1/tokens/ethereum/balances/{receiver}"

    def holding(body: dict[str, Any]) -> str | None:
        found = [t for t in body["tokens"] if t["contract"] == checksum_address(usd)]
        return found[0]["balance"] if found else None

    before = holding((await api.get(path)).json())
    with DevnetRpc(api.node.url) as rpc:
        snapshot = rpc.call("evm_snapshot")
        tx = rpc.call(
            "eth_sendTransaction",
            {
                "from": sender,
                "to": usd,
                "input": "0x" + abi.encode_call("transfer(address,uint256)", receiver, 777).hex(),
            },
        )
        # anvil answers before it has mined the block: the head must include the transfer.
        with trio.fail_after(10):
            while rpc.call("eth_getTransactionReceipt", tx) is None:
                await trio.sleep(0.02)
    await api.caught_up()
    moved = holding((await api.get(path)).json())
    assert int(moved or 0) == int(before or 0) + 777
    with DevnetRpc(api.node.url) as rpc:
        assert rpc.call("evm_revert", snapshot) is True
        rpc.call("anvil_mine", "0x3")  # the new branch: longer, without the transfer
    await api.caught_up()
    with trio.fail_after(10):
        while holding((await api.get(path)).json()) != before:
            await trio.sleep(0.05)
    on_chain = eth_call(api.node.url, usd, "balanceOf(address)", receiver)
    assert int(before or 0) == on_chain


async def test_a_popular_page_is_computed_once_a_second_and_never_across_blocks(api: Api) -> None:
    path = f"/v1/tokens/ethereum/balances/{api.manifest.accounts[1]}"
    first = await api.get(path)
    again = await api.get(path)
    assert again.headers["x-cache"] == "HIT" and again.content == first.content
    # A test key must not be served what a live key was (test keys may not see mainnet): the
    # environment is part of the key, so this is computed afresh.
    gateway = api.handle.gateway
    assert gateway.store is not None
    account = await admin.ensure_account(AuthRows(gateway.store), "live@t", "enterprise")
    live, _ = await admin.create_key(
        AuthRows(gateway.store), PEPPER.encode(), account.id, "t", "live", admin.parse_scopes("")
    )
    assert gateway.keys is not None
    await gateway.keys.refresh()
    async with api.handle.client(headers={"X-API-Key": live}) as client:
        assert (await client.get(path)).headers["x-cache"] == "MISS"
    # A new block: the cached answer dies with it.
    with DevnetRpc(api.node.url) as rpc:
        rpc.call("anvil_mine", "0x1")
    await api.caught_up()
    fresh = await api.get(path)
    assert fresh.headers["x-cache"] == "MISS"
    assert fresh.json()["block_number"] > first.json()["block_number"]


def test_the_price_keeper_leaves_fresh_feeds_alone(chain: tuple[AnvilProcess, Manifest]) -> None:
    node, manifest = chain
    assert refresh_price_feeds(node.url, manifest) == 0  # the fixture's round is fresh
    # An hour and more later (by the clock the keeper is given), every feed gets a round.
    assert refresh_price_feeds(node.url, manifest, now=time.time() + 7200) == 3
