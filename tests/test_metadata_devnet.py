"""Token metadata against real anvil: the devnet plus the odd contracts metadata must survive.

``meta_devnet`` is an anvil of this module's own (other suites share the session ``devnet``
and must not see feed updates or ERC-4906 changes), bootstrapped like ``chaingate dev`` (from
the state cache: well under a second), with the devnet's odd contracts (devnet/demo.py).

What is proven here: bytes32 names decoded, a token without ``decimals()``, a ``balanceOf``
that reverts, a Transfer emitter that is no token, ERC-165 telling 721 from 1155, all in one
upstream request through Multicall3 (and the same answers without it); USD prices from the
feeds with staleness; supply x price; balances formatted and priced exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from chaingate import twins as impl_module
from chaingate.chain.client import ChainClient
from chaingate.config import MetadataSettings, NetworkSettings, RpcSettings
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.metadata.multicall import Call, Multicall
from chaingate.metadata.service import MetadataService
from chaingate.outbound import Fetcher, OutboundPolicy
from chaingate.rpc.heads import parse_evm_head
from chaingate.rpc.pool import UpstreamPool
from chaingate.store import Store, open_store
from tests.conftest import DEVNET_SIGNER

ZERO_SALT = bytes(32)
METADATA_HOST = "https://metadata.chaingate.localhost/devnet"
PROBE = b'{"jsonrpc":"2.0","id":0,"method":"eth_blockNumber","params":[]}'
ETHER = 10**18

# The contract-level document of the updatable collection (ERC-7572), served by IPFS.
UPDATABLE_CONTRACT_DOC = (
    b'{"name":"Updatable (document)","description":"A collection whose metadata changes.",'
    b'"image":"ipfs://bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",'
    b'"banner_image":"ar://0123456789abcdefghijklmnopqrstuvwxyzABCDEFG",'
    b'"external_link":"https://example.org/updatable"}'
)


def ipfs_cid(document: bytes) -> str:
    """CIDv1 (raw, sha2-256, base32) of a document: what demo.ipfs_uri writes."""
    import base64
    import hashlib

    cid = bytes([0x01, 0x55, 0x12, 0x20]) + hashlib.sha256(document).digest()
    return "b" + base64.b32encode(cid).decode().lower().rstrip("=")


def bytes32(text: str) -> bytes:
    return text.encode().ljust(32, b"\x00")


# --- fixtures ----------------------------------------------------------------------------


@dataclass
class MetaDevnet:
    node: AnvilProcess
    manifest: Manifest

    def address(self, name: str) -> str:
        return self.manifest.address(name)


@pytest.fixture(scope="module")
def meta_devnet() -> Iterator[MetaDevnet]:
    with AnvilProcess() as node:
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, announce=lambda _: None
        )
        yield MetaDevnet(node, manifest)


@pytest.fixture
def chain(meta_devnet: MetaDevnet) -> Iterator[MetaDevnet]:
    """The module's devnet, put back as it was after the test (evm_snapshot / evm_revert)."""
    with DevnetRpc(meta_devnet.node.url) as rpc:
        snapshot = rpc.call("evm_snapshot")
    try:
        yield meta_devnet
    finally:
        with DevnetRpc(meta_devnet.node.url) as rpc:
            assert rpc.call("evm_revert", snapshot) is True


def send(url: str, sender: str, to: str, signature: str, *args: object) -> dict[str, Any]:
    """One transaction, mined (automine), its receipt."""
    with DevnetRpc(url) as rpc:
        tx_hash = rpc.call(
            "eth_sendTransaction",
            {
                "from": sender,
                "to": to,
                "input": "0x" + abi.encode_call(signature, *args).hex(),
                "gas": hex(1_000_000),
            },
        )
        deadline = time.monotonic() + 10
        while (receipt := rpc.call("eth_getTransactionReceipt", tx_hash)) is None:
            assert time.monotonic() < deadline, "transaction not mined"
            time.sleep(0.02)  # automine mines just after answering
    assert receipt["status"] == "0x1"
    result: dict[str, Any] = receipt
    return result


async def open_client(nursery: trio.Nursery, url: str) -> ChainClient:
    net = msgspec.convert(
        {"upstreams": [{"url": url, "name": "up0"}], "chain_id": 31337, "testnet": True},
        NetworkSettings,
    )
    pool = UpstreamPool(
        "ethereum/devnet",
        net,
        RpcSettings(probe_interval=0.2),
        impl_module.select(),
        PROBE,
        parse_evm_head,
    )
    await nursery.start(pool.run)
    return ChainClient(pool)


class Clock:
    """Wall-clock time that a test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


async def open_store_for(url: str, tmp_path: Path) -> Store:
    store = open_store(url, tmp_path)
    await store.open()
    await store.migrate()
    return store


async def start_service(
    nursery: trio.Nursery,
    devnet: MetaDevnet,
    store: Store,
    *,
    fetcher: Fetcher | None = None,
    clock: Callable[[], float] = time.time,
    manifest: bool = True,
    **settings: Any,
) -> MetadataService:
    client = await open_client(nursery, devnet.node.url)
    service = MetadataService(
        "ethereum",
        "devnet",
        msgspec.convert(settings, MetadataSettings),
        client,
        store,
        fetcher or Fetcher(OutboundPolicy.dev()),
        manifest=devnet.manifest if manifest else None,
        chain_id=devnet.manifest.chain_id,
        clock=clock,
    )
    await nursery.start(service.run)
    return service


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    store = await open_store_for(f"sqlite://{tmp_path}/meta.db", tmp_path)
    try:
        yield store
    finally:
        await store.aclose()


def refresh_feeds(devnet: MetaDevnet) -> None:
    """Push a fresh round to every feed (the cached devnet state may be days old)."""
    manifest = devnet.manifest
    prices = {manifest.native_price_feed: 3012_34000000}
    for token in manifest.of_kind("erc20").values():
        if token.price_feed:
            prices[token.price_feed] = {"CGUSD": 10**8, "CGT": 25_000_000}[token.symbol or ""]
    for feed, answer in prices.items():
        send(
            devnet.node.url,
            manifest.deployer,
            manifest.address(feed),
            "updateAnswer(int256)",
            answer,
        )


# --- the extra contracts are what they claim ---------------------------------------------


def test_extra_contracts_behave_as_their_cases_need(meta_devnet: MetaDevnet) -> None:
    with DevnetRpc(meta_devnet.node.url) as rpc:

        def call(name: str, signature: str, *args: object) -> Any:
            return rpc.call(
                "eth_call",
                {
                    "to": meta_devnet.address(name),
                    "input": "0x" + abi.encode_call(signature, *args).hex(),
                },
                "latest",
            )

        assert call("erc20_bytes32", "symbol()") == "0x" + bytes32("CGB32").hex()  # raw bytes32
        with pytest.raises(Exception, match="revert"):
            call("erc20_no_decimals", "decimals()")
        with pytest.raises(Exception, match="revert"):
            call("erc20_broken_balance", "balanceOf(address)", meta_devnet.manifest.accounts[1])
        with pytest.raises(Exception, match="revert"):
            call("transfer_emitter", "totalSupply()")
        logs = rpc.call(
            "eth_getLogs",
            {
                "address": meta_devnet.address("transfer_emitter"),
                "fromBlock": "0x0",
                "toBlock": "latest",
            },
        )
    assert len(logs) == 1
    assert logs[0]["topics"][0] == abi.event_topic("Transfer(address,address,uint256)")


# --- token facts through the service ------------------------------------------------------


async def test_token_facts_of_every_kind_in_one_upstream_request(
    nursery: trio.Nursery, meta_devnet: MetaDevnet, store: Store
) -> None:
    service = await start_service(nursery, meta_devnet, store)
    assert service.multicall.address == meta_devnet.manifest.address("multicall3")
    names = [
        "erc20_cgusd",
        "erc20_cgt",
        "erc20_bytes32",
        "erc20_no_decimals",
        "erc20_broken_balance",
        "transfer_emitter",
        "erc721_collection",
        "erc1155_items",
    ]
    eoa = meta_devnet.manifest.accounts[5]
    before = service.client.calls
    found = await service.tokens([meta_devnet.address(n) for n in names] + [eoa], wait=10)
    assert service.client.calls - before == 1  # 9 contracts x 8 calls: one JSON-RPC batch
    by_name = {n: found[checksum_address(meta_devnet.address(n))] for n in names}
    facts = {n: (m.standard, m.name, m.symbol, m.decimals, m.status) for n, m in by_name.items()}
    assert facts == {
        "erc20_cgusd": ("ERC20", "Chaingate Dollar", "CGUSD", 6, "ok"),
        "erc20_cgt": ("ERC20", "Chaingate Token", "CGT", 18, "ok"),
        "erc20_bytes32": ("ERC20", "Chaingate Bytes32", "CGB32", 18, "ok"),
        "erc20_no_decimals": ("ERC20", "Chaingate Raw Units", "CGRAW", None, "ok"),
        "erc20_broken_balance": ("ERC20", "Chaingate Broken Balances", "CGBRK", 18, "ok"),
        "transfer_emitter": (None, None, None, None, "ok"),
        "erc721_collection": ("ERC721", "Chaingate Devnet Collection", "CGDC", None, "ok"),
        "erc1155_items": ("ERC1155", None, None, None, "ok"),
    }
    assert by_name["erc20_cgt"].total_supply == 1_000_995 * ETHER
    assert found[checksum_address(eoa)].standard is None  # no code: not a token
    # Cached: asking again reaches no node.
    before = service.client.calls
    again = await service.token(meta_devnet.address("erc20_bytes32"), wait=10)
    assert again.symbol == "CGB32" and service.client.calls == before
    # Stored: a second service (a restart) answers from the store without a probe.
    second = await start_service(nursery, meta_devnet, store)
    before = second.client.calls
    assert (await second.token(meta_devnet.address("erc20_no_decimals"), wait=10)).decimals is None
    assert second.client.calls == before


async def test_a_chain_without_multicall3_uses_batched_eth_calls(
    nursery: trio.Nursery, meta_devnet: MetaDevnet, store: Store
) -> None:
    # No manifest, no setting: the canonical 0xcA11...CA11 is looked for and is not there.
    service = await start_service(nursery, meta_devnet, store, manifest=False)
    assert service.multicall.address is None
    contracts = [meta_devnet.address(n) for n in ("erc20_bytes32", "erc20_no_decimals")]
    before = service.client.calls
    found = await service.tokens(contracts, wait=10)
    assert service.client.calls - before == 1  # 16 eth_calls, one JSON-RPC batch
    assert [(m.symbol, m.decimals) for m in found.values()] == [("CGB32", 18), ("CGRAW", None)]


async def test_without_multicall_the_same_facts_come_from_batched_eth_calls(
    nursery: trio.Nursery, meta_devnet: MetaDevnet
) -> None:
    client = await open_client(nursery, meta_devnet.node.url)
    names = ["erc20_bytes32", "erc20_no_decimals", "transfer_emitter", "erc1155_items"]
    calls = [
        Call(meta_devnet.address(n), abi.encode_call(sig))
        for n in names
        for sig in ("symbol()", "decimals()")
    ]
    via_multicall = await Multicall(client, meta_devnet.manifest.address("multicall3")).run(calls)
    plain = await Multicall(client, None).run(calls)
    # An address that is not a Multicall3 (an EOA): every aggregate fails, calls go one by one.
    bogus = await Multicall(client, meta_devnet.manifest.accounts[7]).run(calls)
    assert via_multicall == plain == bogus
    assert [r.ok for r in plain] == [True, True, True, False, False, False, False, False]


async def test_balances_skip_a_reverting_balance_of_without_failing_the_others(
    nursery: trio.Nursery, meta_devnet: MetaDevnet, store: Store
) -> None:
    service = await start_service(nursery, meta_devnet, store)
    a1 = meta_devnet.manifest.accounts[1]
    names = ["erc20_cgusd", "erc20_broken_balance", "erc20_bytes32", "transfer_emitter"]
    balances = await service.token_balances(a1, [meta_devnet.address(n) for n in names])
    assert list(balances.values()) == [4_875 * 10**6, None, 1_000 * ETHER, None]


async def test_prices_from_feeds_with_staleness_and_market_cap(
    nursery: trio.Nursery, chain: MetaDevnet, store: Store
) -> None:
    refresh_feeds(chain)
    clock = Clock()
    service = await start_service(nursery, chain, store, clock=clock, max_feed_age=3600)
    cgt = chain.address("erc20_cgt")
    assert await service.price_usd(None) == Decimal("3012.34")
    assert await service.price_usd(chain.address("erc20_cgusd")) == Decimal(1)
    info = await service.token_info(cgt, wait=10)
    assert (info.total_supply, info.formatted_total_supply) == (
        str(1_000_995 * ETHER),
        "1000995",
    )
    assert (info.price_usd, info.market_cap_usd) == ("0.25", "250248.75")
    # No feed configured: no price, never a guess.
    assert await service.price_usd(chain.address("erc20_bytes32")) is None
    raw = await service.token_info(chain.address("erc20_no_decimals"), wait=10)
    assert (raw.formatted_total_supply, raw.price_usd, raw.market_cap_usd) == (
        "12345",
        None,
        None,
    )
    # Two hours later (feeds not updated): older than max_feed_age, so no price at all.
    clock.advance(7200)
    quote = (await service.quotes([cgt]))[cgt]
    assert quote.price is None and "older than 3600" in (quote.error or "")
    stale = await service.token_info(cgt, wait=10)
    assert (stale.price_usd, stale.market_cap_usd) == (None, None)
    # The chain's time moves on too and a new round comes: fresh again (after the ttl).
    with DevnetRpc(chain.node.url) as rpc:
        rpc.call("evm_increaseTime", 7200)
    send(
        chain.node.url,
        chain.manifest.deployer,
        chain.manifest.address("feed_cgt_usd"),
        "updateAnswer(int256)",
        30_000_000,
    )
    clock.advance(30)
    assert await service.price_usd(cgt) == Decimal("0.3")


async def test_describe_balances_formats_prices_and_leaves_out_non_tokens(
    nursery: trio.Nursery, chain: MetaDevnet, store: Store
) -> None:
    refresh_feeds(chain)
    service = await start_service(nursery, chain, store)
    raw = {
        chain.address("erc20_cgusd"): 4_875 * 10**6,
        chain.address("erc20_cgt"): 12 * ETHER + 5 * 10**17,
        chain.address("erc20_no_decimals"): 12_345,
        chain.address("transfer_emitter"): 5 * ETHER,
        chain.address("erc721_collection"): 1,
    }
    described = await service.describe_balances(raw, wait=10)
    shown = {
        info.symbol: (info.balance, info.formatted_balance, info.usd_value, info.decimals)
        for info in described.values()
    }
    assert shown == {
        "CGUSD": ("4875000000", "4875", "4875", 6),
        "CGT": ("12500000000000000000", "12.5", "3.125", 18),
        "CGRAW": ("12345", "12345", None, None),
    }


async def test_logos_from_a_token_list_file_or_url(
    nursery: trio.Nursery, meta_devnet: MetaDevnet, store: Store, tmp_path: Path
) -> None:
    from tests.test_outbound_support import HttpServer, reply

    cid = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi"
    cgusd, cgt = meta_devnet.address("erc20_cgusd"), meta_devnet.address("erc20_cgt")
    odd = meta_devnet.address("erc20_bytes32")
    listing = msgspec.json.encode(
        {
            "name": "devnet",
            "tokens": [
                {"chainId": 31337, "address": cgusd, "logoURI": "https://logos.example/cgusd.png"},
                {"chainId": 31337, "address": cgt.lower(), "logoURI": f"ipfs://{cid}/cgt.png"},
                {"chainId": 1, "address": odd, "logoURI": "https://logos.example/mainnet.png"},
            ],
        }
    )
    path = tmp_path / "tokens.json"
    path.write_bytes(listing)
    server = await HttpServer({"/tokens.json": reply(body=listing)}).start(nursery)
    for source in (str(path), f"http://127.0.0.1:{server.port}/tokens.json"):
        service = await start_service(
            nursery, meta_devnet, store, token_list=source, ipfs_gateways=["https://gw.example"]
        )
        with trio.fail_after(10):
            while service.token_list is None or not service.token_list.loaded:
                await trio.sleep(0.02)
        assert service.logo_url(cgusd) == "https://logos.example/cgusd.png"
        assert service.logo_url(cgt) == f"https://gw.example/ipfs/{cid}/cgt.png"
        assert service.logo_url(odd) is None  # listed for another chain only
        described = await service.describe_balances({cgusd: 1, odd: 2}, wait=10)
        assert [b.logo_url for b in described.values()] == [
            "https://logos.example/cgusd.png",
            None,
        ]
    assert len(server.requests) == 1
