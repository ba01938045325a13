"""Demo assets and a little history, so every data feature has something real to show.

Two ERC-20s (6 and 18 decimals), an ERC-721 whose token URIs use the three forms a metadata
reader meets (``data:``, ``ipfs://``, ``https://``), an ERC-1155, a Multicall3 and Chainlink-style
USD price feeds for ETH and each token — all from ``contracts/*.sol``, deployed through the
deterministic deployer (zero salt), so their addresses depend only on bytecode and arguments.
Then mints, transfers, an airdrop, approvals, feed updates and burns among anvil's accounts.

And the odd contracts real chains are full of, which token data must survive: an ERC-20 whose
``name()``/``symbol()`` return bytes32 (MKR-style), one without ``decimals()``, one whose
``balanceOf`` reverts, a contract that logs Transfer without being a token, and an ERC-721 with
an ERC-7572 ``contractURI`` that emits ERC-4906 metadata updates.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chaingate.config.manifest import Contract, Kind
from chaingate.devnet.artifacts import Artifact
from chaingate.devnet.deploy import Planned, Tx, create2_tx
from chaingate.evm import abi

ZERO_SALT = bytes(32)
FEED_DECIMALS = 8  # what Chainlink's USD feeds use
# The devnet's https host: ``chaingate dev`` serves it from loopback (``devnet.docserver``).
METADATA_HOSTNAME = "metadata.chaingate.localhost"
METADATA_HOST = f"https://{METADATA_HOSTNAME}/devnet"
NATIVE_PRICE_FEED = "feed_eth_usd"


@dataclass(frozen=True)
class Token:
    name: str  # manifest name
    title: str
    symbol: str
    decimals: int
    usd_price: float


TOKENS = (
    Token("erc20_cgusd", "Chaingate Dollar", "CGUSD", 6, 1.0),
    Token("erc20_cgt", "Chaingate Token", "CGT", 18, 0.25),
)
ETH_USD = 3000.0
ETH_USD_NOW = 3012.34  # the history's second round, and what the price keeper pushes


def usd_answer(price: float) -> int:
    """A feed's answer for ``price`` dollars (8 decimals)."""
    return round(price * 10.0**FEED_DECIMALS)


_usd = usd_answer


def _planned(
    name: str,
    artifacts: Mapping[str, Artifact],
    contract_name: str,
    deployer: str,
    kind: Kind,
    types: Sequence[str],
    args: Sequence[object],
    *,
    symbol: str | None = None,
    decimals: int | None = None,
    price_feed: str | None = None,
    pair: str | None = None,
) -> Planned:
    artifact = artifacts[contract_name]
    init_code = artifact.bytecode + abi.encode(types, args)
    tx, address = create2_tx(name, deployer, ZERO_SALT, init_code, gas=3_000_000)
    contract = Contract(
        address="",
        kind=kind,
        canonical=False,
        source=artifact.source,
        block=0,
        symbol=symbol,
        decimals=decimals,
        price_feed=price_feed,
        pair=pair,
    )
    return Planned(name, tx, address, contract)


def deployments(artifacts: Mapping[str, Artifact], deployer: str) -> list[Planned]:
    planned = []
    for token in TOKENS:
        feed = f"feed_{token.symbol.lower()}_usd"
        planned.append(
            _planned(
                token.name,
                artifacts,
                "DevToken",
                deployer,
                "erc20",
                ["string", "string", "uint8", "address"],
                [token.title, token.symbol, token.decimals, deployer],
                symbol=token.symbol,
                decimals=token.decimals,
                price_feed=feed,
            )
        )
    feeds = [(NATIVE_PRICE_FEED, "ETH / USD", ETH_USD)] + [
        (f"feed_{t.symbol.lower()}_usd", f"{t.symbol} / USD", t.usd_price) for t in TOKENS
    ]
    for name, pair, price in feeds:
        planned.append(
            _planned(
                name,
                artifacts,
                "DevPriceFeed",
                deployer,
                "price_feed",
                ["uint8", "string", "int256", "address"],
                [FEED_DECIMALS, pair, _usd(price), deployer],
                pair=pair,
                decimals=FEED_DECIMALS,
            )
        )
    planned.append(
        _planned(
            "erc721_collection",
            artifacts,
            "DevCollection",
            deployer,
            "erc721",
            ["string", "string", "address"],
            ["Chaingate Devnet Collection", "CGDC", deployer],
            symbol="CGDC",
        )
    )
    planned.append(
        _planned(
            "erc1155_items",
            artifacts,
            "DevItems",
            deployer,
            "erc1155",
            ["string", "address"],
            [f"{METADATA_HOST}/items/{{id}}.json", deployer],
        )
    )
    planned += odd_contracts(artifacts, deployer)
    planned.append(_planned("multicall3", artifacts, "Multicall3", deployer, "multicall3", [], []))
    return planned


def _bytes32(text: str) -> bytes:
    return text.encode().ljust(32, b"\x00")


# The updatable collection's own document (ERC-7572 contractURI), on IPFS.
UPDATABLE_DOCUMENT = (
    b'{"name":"Updatable (document)","description":"A collection whose metadata changes.",'
    b'"image":"ipfs://bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",'
    b'"banner_image":"ar://0123456789abcdefghijklmnopqrstuvwxyzABCDEFG",'
    b'"external_link":"https://example.org/updatable"}'
)


def odd_contracts(artifacts: Mapping[str, Artifact], deployer: str) -> list[Planned]:
    return [
        _planned(
            "erc20_bytes32",
            artifacts,
            "DevBytes32Token",
            deployer,
            "erc20",
            ["bytes32", "bytes32", "address"],
            [_bytes32("Chaingate Bytes32"), _bytes32("CGB32"), deployer],
            symbol="CGB32",
            decimals=18,
        ),
        _planned(
            "erc20_no_decimals",
            artifacts,
            "DevNoDecimalsToken",
            deployer,
            "erc20",
            ["string", "string", "address"],
            ["Chaingate Raw Units", "CGRAW", deployer],
            symbol="CGRAW",
        ),
        _planned(
            "erc20_broken_balance",
            artifacts,
            "DevBrokenToken",
            deployer,
            "erc20",
            ["string", "string", "address"],
            ["Chaingate Broken Balances", "CGBRK", deployer],
            symbol="CGBRK",
            decimals=18,
        ),
        _planned(
            "transfer_emitter", artifacts, "DevTransferEmitter", deployer, "not_a_token", [], []
        ),
        _planned(
            "erc721_updatable",
            artifacts,
            "DevUpdatableCollection",
            deployer,
            "erc721",
            ["string", "string", "string", "string", "address"],
            [
                "Chaingate Updatable",
                "CGUP",
                f"{METADATA_HOST}/updatable/",
                ipfs_uri(UPDATABLE_DOCUMENT),
                deployer,
            ],
            symbol="CGUP",
        ),
    ]


def _metadata(name: str, description: str, colour: str) -> bytes:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64">'
        f'<rect width="64" height="64" fill="{colour}"/></svg>'
    )
    image = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    return json.dumps(
        {"name": name, "description": description, "image": image}, separators=(",", ":")
    ).encode()


def data_uri(document: bytes) -> str:
    return "data:application/json;base64," + base64.b64encode(document).decode()


def ipfs_uri(document: bytes) -> str:
    """ipfs:// of the document's real CIDv1 (raw codec, sha2-256), so a gateway could serve it."""
    cid = bytes([0x01, 0x55, 0x12, 0x20]) + hashlib.sha256(document).digest()
    return "ipfs://b" + base64.b32encode(cid).decode().lower().rstrip("=")


TOKEN_2_DOCUMENT = _metadata("Devnet #2", "Metadata on IPFS.", "#1aa36f")
ITEM_3_DOCUMENT = _metadata("Devnet item 3", "A one-of-one item.", "#7a4fd0")


def token_uris() -> list[str]:
    """URIs of collection tokens 1..4 (the 4th is burned by the history)."""
    return [
        data_uri(_metadata("Devnet #1", "On-chain metadata (data: URI).", "#2f6fdf")),
        ipfs_uri(TOKEN_2_DOCUMENT),
        f"{METADATA_HOST}/collection/3.json",
        data_uri(_metadata("Devnet #4", "Minted to be burned.", "#d04a3a")),
    ]


def item_uris() -> dict[int, str]:
    """ERC-1155 ids with their own URI; others use the contract's {id} template."""
    return {
        1: data_uri(_metadata("Devnet item 1", "A fungible item.", "#e0a800")),
        3: ipfs_uri(ITEM_3_DOCUMENT),
    }


def ipfs_documents() -> dict[str, bytes]:
    """The documents the devnet names by ``ipfs://`` URI, by CID (what a gateway serves)."""
    return {
        ipfs_uri(document).removeprefix("ipfs://"): document
        for document in (TOKEN_2_DOCUMENT, ITEM_3_DOCUMENT, UPDATABLE_DOCUMENT)
    }


def https_documents() -> dict[str, bytes]:
    """The documents the devnet names by ``https://`` URL (``METADATA_HOST``), by URL."""
    item_2 = f"{METADATA_HOST}/items/{{id}}.json".replace("{id}", f"{2:064x}")
    return {
        f"{METADATA_HOST}/collection/3.json": _metadata(
            "Devnet #3", "Metadata over https://.", "#c0508f"
        ),
        item_2: _metadata("Devnet item 2", "By the collection's {id} template.", "#3a8fd0"),
        # The updatable collection: its base URI + the decimal token id (both minted).
        **{
            f"{METADATA_HOST}/updatable/{token_id}": _metadata(
                f"Updatable #{token_id}", "Base URI + token id, over https://.", "#5a5a5a"
            )
            for token_id in (1, 2)
        },
    }


def served_documents() -> dict[str, bytes]:
    """What ``chaingate dev``'s document server answers, by URL path: the IPFS documents
    under ``/ipfs/<cid>`` and the https host's under their own paths."""
    served = {f"/ipfs/{cid}": document for cid, document in ipfs_documents().items()}
    prefix = f"https://{METADATA_HOSTNAME}"
    served.update({url.removeprefix(prefix): doc for url, doc in https_documents().items()})
    return served


def _call(label: str, sender: str, to: str, signature: str, *args: object, **kw: int) -> Tx:
    return Tx(label, sender, to, abi.encode_call(signature, *args), **kw)


def seed(addresses: Mapping[str, str], deployer: str, accounts: Sequence[str]) -> list[Tx]:
    """The deployer's mints, airdrop, feed update and ETH send (one sender: runs in order)."""
    a1, a2, a3, a4 = accounts[1:5]
    usd, cgt = addresses["erc20_cgusd"], addresses["erc20_cgt"]
    nft, items = addresses["erc721_collection"], addresses["erc1155_items"]
    mint = "mint(address,uint256)"
    txs = [
        _call("mint CGUSD", deployer, usd, mint, deployer, 1_000_000 * 10**6, gas=100_000),
        _call("mint CGUSD", deployer, usd, mint, a1, 5_000 * 10**6, gas=100_000),
        _call("mint CGUSD", deployer, usd, mint, a2, 2_500 * 10**6, gas=100_000),
        _call("mint CGT", deployer, cgt, mint, deployer, 1_000_000 * 10**18, gas=100_000),
        _call("mint CGT", deployer, cgt, mint, a3, 1_000 * 10**18, gas=100_000),
        _call(
            "airdrop CGT",
            deployer,
            cgt,
            "airdrop(address[],uint256)",
            list(accounts[1:10]),
            10 * 10**18,
            gas=600_000,
        ),
    ]
    owners = [a1, a2, a3, a1]
    for owner, uri in zip(owners, token_uris(), strict=True):
        txs.append(
            _call("mint NFT", deployer, nft, "mint(address,string)", owner, uri, gas=1_000_000)
        )
    own_uris = item_uris()
    for owner, item_id, amount in ((a1, 1, 100), (a2, 2, 5), (a3, 3, 1)):
        txs.append(
            _call(
                "mint item",
                deployer,
                items,
                "mint(address,uint256,uint256,string)",
                owner,
                item_id,
                amount,
                own_uris.get(item_id, ""),
                gas=1_000_000,
            )
        )
    txs.append(
        _call(
            "update ETH / USD",
            deployer,
            addresses[NATIVE_PRICE_FEED],
            "updateAnswer(int256)",
            _usd(ETH_USD_NOW),
            gas=150_000,
        )
    )
    txs.append(Tx("send ETH", deployer, a4, value=10**18, gas=21_000))
    txs += [
        _call(
            "mint CGB32",
            deployer,
            addresses["erc20_bytes32"],
            mint,
            a1,
            1_000 * 10**18,
            gas=100_000,
        ),
        _call(
            "mint CGRAW", deployer, addresses["erc20_no_decimals"], mint, a1, 12_345, gas=100_000
        ),
        _call(
            "mint CGBRK",
            deployer,
            addresses["erc20_broken_balance"],
            mint,
            a1,
            7 * 10**18,
            gas=100_000,
        ),
        _call(
            "fake Transfer",
            deployer,
            addresses["transfer_emitter"],
            "emitTransfer(address,address,uint256)",
            a1,
            a2,
            5 * 10**18,
            gas=100_000,
        ),
        _call(
            "mint CGUP", deployer, addresses["erc721_updatable"], "mint(address)", a1, gas=200_000
        ),
        _call(
            "mint CGUP", deployer, addresses["erc721_updatable"], "mint(address)", a2, gas=200_000
        ),
    ]
    return txs


def history(addresses: Mapping[str, str], accounts: Sequence[str]) -> list[Tx]:
    """The other accounts' transfers, approvals and burns (each only on its own holdings)."""
    a1, a2, a3, a4 = accounts[1:5]
    usd, cgt = addresses["erc20_cgusd"], addresses["erc20_cgt"]
    nft, items = addresses["erc721_collection"], addresses["erc1155_items"]
    transfer = "transfer(address,uint256)"
    return [
        _call("CGUSD transfer", a1, usd, transfer, a2, 125 * 10**6, gas=100_000),
        _call(
            "NFT transfer", a1, nft, "transferFrom(address,address,uint256)", a1, a2, 1, gas=100_000
        ),
        _call("NFT burn", a1, nft, "burn(uint256)", 4, gas=400_000),
        _call(
            "item transfer",
            a1,
            items,
            "safeTransferFrom(address,address,uint256,uint256,bytes)",
            a1,
            a3,
            1,
            10,
            b"",
            gas=100_000,
        ),
        _call("CGUSD approve", a2, usd, "approve(address,uint256)", a3, 100 * 10**6, gas=100_000),
        _call("CGT transfer", a2, cgt, transfer, a4, 10**18, gas=100_000),
        _call("CGT burn", a3, cgt, "burn(uint256)", 5 * 10**18, gas=100_000),
        _call("item burn", a3, items, "burn(address,uint256,uint256)", a3, 3, 1, gas=100_000),
        Tx("send ETH", a3, a1, value=5 * 10**17, gas=21_000),
    ]
