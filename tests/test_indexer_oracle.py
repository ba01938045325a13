"""The judges of the indexer tests, and their own tests.

* ``recompute`` — a from-scratch recomputation of every balance, holding, supply and count
  from a list of logs, written independently of ``chaingate.data`` (its own topic rules, the
  ABI codec for every word), so a decoding bug in the indexer cannot hide in both;
* ``canonical`` — the canonical chain's logs and native transfers, read from the node;
* ``snapshot`` — everything the index holds, read from the store's tables with plain SQL;
* ``chain_truth`` — the contracts' own ``balanceOf``/``ownerOf``/``totalSupply`` at the head;
* ``assert_index_matches`` — all of them compared, with readable differences.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
import msgspec
import trio

from chaingate.config.manifest import Manifest
from chaingate.data.store import IndexRows
from chaingate.evm import abi
from chaingate.store import Store, open_store

ZERO = "0x" + "00" * 20
T_TRANSFER = abi.event_topic("Transfer(address,address,uint256)")
T_SINGLE = abi.event_topic("TransferSingle(address,address,address,uint256,uint256)")
T_BATCH = abi.event_topic("TransferBatch(address,address,address,uint256[],uint256[])")


class Expected(msgspec.Struct):
    """The index's content as a recomputation (or a snapshot) states it."""

    balances: dict[tuple[str, str], int]  # (holder, contract) -> balance, non-zero only
    holdings: dict[tuple[str, str, int], int]  # (holder, contract, id) -> quantity, non-zero
    tokens: dict[tuple[str, int], tuple[int, int]]  # (contract, id) -> (supply, holders)
    owners: dict[tuple[str, str], int]  # (contract, holder) -> ids held, non-zero
    # contract -> (standard, first block, transfers per standard, holders, supply, tokens,
    # owners)
    contracts: dict[str, tuple[str, int, tuple[int, int, int], int, int, int, int]]
    # (block, log index or -1, standard, contract, sender, receiver, token id, amount)
    transfers: list[tuple[int, int, str, str | None, str, str, int | None, int]]


def _address(topic: str) -> str | None:
    word = bytes.fromhex(topic[2:])
    if len(word) != 32 or any(word[:12]):
        return None
    return "0x" + word[12:].hex()


def decode_token_log(entry: dict[str, Any]) -> list[tuple[str, str, str, int | None, int]]:
    """(standard, sender, receiver, token id, amount) of a token transfer log; [] otherwise."""
    topics = [t.lower() for t in entry["topics"]]
    data = bytes.fromhex(entry["data"][2:])
    if not topics:
        return []
    if topics[0] == T_TRANSFER and len(topics) in (3, 4):
        sender, receiver = _address(topics[1]), _address(topics[2])
        if sender is None or receiver is None:
            return []
        if len(topics) == 3 and len(data) == 32:
            (value,) = abi.decode(["uint256"], data)
            return [("ERC20", sender, receiver, None, value)]
        if len(topics) == 4 and not data:
            (token_id,) = abi.decode(["uint256"], bytes.fromhex(topics[3][2:]))
            return [("ERC721", sender, receiver, token_id, 1)]
        return []
    if topics[0] in (T_SINGLE, T_BATCH) and len(topics) == 4:
        sender, receiver = _address(topics[2]), _address(topics[3])
        if sender is None or receiver is None:
            return []
        try:
            if topics[0] == T_SINGLE:
                if len(data) != 64:
                    return []
                token_id, value = abi.decode(["uint256", "uint256"], data)
                return [("ERC1155", sender, receiver, token_id, value)]
            ids, values = abi.decode(["uint256[]", "uint256[]"], data)
        except abi.AbiError:
            return []
        if len(ids) != len(values):
            return []
        return [("ERC1155", sender, receiver, i, v) for i, v in zip(ids, values, strict=True)]
    return []


def recompute(
    logs: Sequence[dict[str, Any]], natives: Iterable[tuple[int, int, str, str, int]] = ()
) -> Expected:
    """The index a perfect indexer would hold after these logs (canonical, any order)."""
    balances: defaultdict[tuple[str, str], int] = defaultdict(int)
    supply: defaultdict[str, int] = defaultdict(int)
    holdings: defaultdict[tuple[str, str, int], int] = defaultdict(int)
    token_supply: defaultdict[tuple[str, int], int] = defaultdict(int)
    counts: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    first: dict[str, tuple[int, int, str]] = {}
    transfers: list[tuple[int, int, str, str | None, str, str, int | None, int]] = []
    ordered = sorted(logs, key=lambda e: (int(e["blockNumber"], 16), int(e["logIndex"], 16)))
    for entry in ordered:
        block, index = int(entry["blockNumber"], 16), int(entry["logIndex"], 16)
        contract = entry["address"].lower()
        for standard, sender, receiver, token_id, amount in decode_token_log(entry):
            transfers.append((block, index, standard, contract, sender, receiver, token_id, amount))
            counts[contract][("ERC20", "ERC721", "ERC1155").index(standard)] += 1
            first.setdefault(contract, (block, index, standard))
            if standard == "ERC20":
                if sender != ZERO:
                    balances[(sender, contract)] -= amount
                if receiver != ZERO:
                    balances[(receiver, contract)] += amount
                if sender == ZERO and receiver != ZERO:
                    supply[contract] += amount
                if receiver == ZERO and sender != ZERO:
                    supply[contract] -= amount
                continue
            assert token_id is not None
            if sender != ZERO:
                holdings[(sender, contract, token_id)] -= amount
            if receiver != ZERO:
                holdings[(receiver, contract, token_id)] += amount
            if sender == ZERO and receiver != ZERO:
                token_supply[(contract, token_id)] += amount
            if receiver == ZERO and sender != ZERO:
                token_supply[(contract, token_id)] -= amount
    for block, tx_index, sender, receiver, value in natives:
        transfers.append((block, -1 - tx_index, "native", None, sender, receiver, None, value))
    holders: defaultdict[str, int] = defaultdict(int)
    for (_, contract), value in balances.items():
        holders[contract] += value > 0
    token_holders: defaultdict[tuple[str, int], int] = defaultdict(int)
    owners: defaultdict[tuple[str, str], int] = defaultdict(int)
    for (holder, contract, token_id), quantity in holdings.items():
        if quantity > 0:
            token_holders[(contract, token_id)] += 1
            owners[(contract, holder)] += 1
    distinct_owners: defaultdict[str, int] = defaultdict(int)
    for (contract, _), n in owners.items():
        distinct_owners[contract] += n > 0
    existing: defaultdict[str, int] = defaultdict(int)
    for (contract, _), s in token_supply.items():
        existing[contract] += s > 0
    tokens = {
        key: (token_supply.get(key, 0), token_holders.get(key, 0))
        for key in set(token_supply) | set(token_holders)
        if token_supply.get(key, 0) or token_holders.get(key, 0)
    }
    contracts = {
        c: (
            first[c][2],
            first[c][0],
            (counts[c][0], counts[c][1], counts[c][2]),
            holders[c],
            supply[c],
            existing[c],
            distinct_owners[c],
        )
        for c in first
    }
    return Expected(
        {k: v for k, v in balances.items() if v},
        {k: v for k, v in holdings.items() if v},
        tokens,
        {k: v for k, v in owners.items() if v},
        contracts,
        sorted(transfers, key=_transfer_order),
    )


def _transfer_order(t: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("" if v is None else v for v in t)


# --- the node ----------------------------------------------------------------------------------


class Node:
    """Async JSON-RPC to anvil (the gateway under test may share this event loop)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.AsyncClient(timeout=60)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, *params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        reply = (await self.http.post(self.url, json=body)).json()
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def batch(self, calls: Sequence[tuple[str, list[Any]]]) -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(calls), 500):
            chunk = calls[start : start + 500]
            body = [
                {"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                for i, (m, p) in enumerate(chunk)
            ]
            replies = (await self.http.post(self.url, json=body)).json()
            by_id = {r["id"]: r for r in replies}
            out.extend(by_id[i].get("result", by_id[i].get("error")) for i in range(len(chunk)))
        return out

    async def head(self) -> tuple[int, str]:
        block = await self.call("eth_getBlockByNumber", "latest", False)
        return int(block["number"], 16), block["hash"]

    async def send(self, tx: dict[str, Any]) -> dict[str, Any]:
        """Send from an unlocked account and wait until it is mined (status 0 or 1)."""
        tx = {"gas": hex(1_000_000), **tx}
        tx_hash = await self.call("eth_sendTransaction", tx)
        with trio.fail_after(20):
            while True:
                receipt = await self.call("eth_getTransactionReceipt", tx_hash)
                if receipt is not None:
                    return dict(receipt)
                await trio.sleep(0.005)

    async def eth_call(self, to: str, data: bytes) -> bytes | None:
        """None when the call reverts."""
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "eth_call",
            "params": [{"to": to, "data": "0x" + data.hex()}, "latest"],
        }
        reply = (await self.http.post(self.url, json=body)).json()
        if "error" in reply:
            return None
        return bytes.fromhex(reply["result"][2:])

    async def calls(self, calls: Sequence[tuple[str, bytes]], block: str) -> list[bytes | None]:
        answers = await self.batch(
            [("eth_call", [{"to": to, "data": "0x" + data.hex()}, block]) for to, data in calls]
        )
        return [bytes.fromhex(a[2:]) if isinstance(a, str) else None for a in answers]


async def canonical(node: Node, head: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Every log of blocks 0..head, and the native transfers (block, tx index, from, to,
    value) of successful value-carrying transactions, read from the node."""
    logs = await node.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head)})
    blocks = await node.batch([("eth_getBlockByNumber", [hex(n), True]) for n in range(head + 1)])
    valued = [tx for block in blocks for tx in block["transactions"] if int(tx["value"], 16) > 0]
    receipts = await node.batch([("eth_getTransactionReceipt", [tx["hash"]]) for tx in valued])
    natives = []
    for tx, receipt in zip(valued, receipts, strict=True):
        if int(receipt["status"], 16) == 1:
            to = tx["to"] or receipt["contractAddress"]
            natives.append(
                (
                    int(tx["blockNumber"], 16),
                    int(tx["transactionIndex"], 16),
                    tx["from"].lower(),
                    to.lower(),
                    int(tx["value"], 16),
                )
            )
    return logs, natives


# --- the index -----------------------------------------------------------------------------------


async def snapshot(store: Store, chain: str = "ethereum", network: str = "devnet") -> Any:
    """(cursor, Expected) as the store's tables hold them."""

    def read(tx: Any) -> Any:
        where = (chain, network)

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return list(tx.query(sql + " WHERE chain = ? AND network = ?", where))

        cursor = rows("SELECT number, hash FROM idx_cursors")
        balances = {
            (h, c): int(b) for h, c, b in rows("SELECT holder, contract, balance FROM idx_balances")
        }
        holdings = {
            (h, c, int(t, 16)): int(q)
            for h, c, t, q in rows(
                "SELECT holder, contract, token_id, quantity FROM idx_nft_holdings"
            )
        }
        tokens = {
            (c, int(t, 16)): (int(s), int(n))
            for c, t, s, n in rows("SELECT contract, token_id, supply, holders FROM idx_nft_tokens")
        }
        owners = {
            (c, h): int(n)
            for c, h, n in rows("SELECT contract, holder, tokens FROM idx_nft_owners")
        }
        contracts = {
            c: (s, int(f), (int(a), int(b), int(d)), int(h), int(sp), int(t), int(o))
            for c, s, f, a, b, d, h, sp, t, o in rows(
                "SELECT contract, standard, first_block, erc20_transfers, erc721_transfers,"
                " erc1155_transfers, holders, supply, tokens, owners FROM idx_contracts"
            )
        }
        transfers = [
            (
                int(n),
                int(li) if li is not None else -1 - int(ti),
                std,
                c,
                s,
                r,
                int(t, 16) if t is not None else None,
                int(a),
            )
            for n, ti, li, std, c, s, r, t, a in rows(
                "SELECT block_number, tx_index, log_index, standard, contract, sender, receiver,"
                " token_id, amount FROM idx_transfers"
            )
        ]
        blocks = {int(n): h for n, h in rows("SELECT number, hash FROM idx_blocks")}
        state = Expected(
            balances, holdings, tokens, owners, contracts, sorted(transfers, key=_transfer_order)
        )
        return (cursor[0] if cursor else None), state, blocks

    return await store.run_transaction(read, write=False)


def open_index_store(url: str, data_dir: Any) -> Store:
    return open_store(url, data_dir)


def _diff(name: str, got: dict[Any, Any], want: dict[Any, Any]) -> list[str]:
    problems = []
    for key in sorted(set(got) | set(want), key=repr):
        if got.get(key) != want.get(key):
            problems.append(f"{name}[{key}]: index {got.get(key)!r} != expected {want.get(key)!r}")
    return problems[:20]


def compare(got: Expected, want: Expected) -> list[str]:
    problems = []
    for field in ("balances", "holdings", "tokens", "owners", "contracts"):
        problems += _diff(field, getattr(got, field), getattr(want, field))
    if got.transfers != want.transfers:
        extra = sorted(set(got.transfers) - set(want.transfers), key=_transfer_order)[:5]
        missing = sorted(set(want.transfers) - set(got.transfers), key=_transfer_order)[:5]
        problems.append(
            f"transfers differ ({len(got.transfers)} vs {len(want.transfers)}):"
            f" extra {extra}, missing {missing}"
        )
    return problems


# --- the contracts themselves --------------------------------------------------------------------


async def chain_truth(node: Node, manifest: Manifest, got: Expected, block: str) -> list[str]:
    """Compare the index with the demo contracts' own answers at ``block``."""
    problems: list[str] = []
    accounts = [a.lower() for a in manifest.accounts]
    for name in ("erc20_cgusd", "erc20_cgt"):
        token = manifest.address(name).lower()
        holders = sorted({h for h, c in got.balances if c == token} | set(accounts))
        answers = await node.calls(
            [(token, abi.encode_call("balanceOf(address)", h)) for h in holders]
            + [(token, abi.encode_call("totalSupply()"))],
            block,
        )
        for holder, answer in zip(holders, answers, strict=False):
            assert answer is not None, f"{name}.balanceOf({holder}) reverted"
            (value,) = abi.decode(["uint256"], answer)
            if value != got.balances.get((holder, token), 0):
                problems.append(
                    f"{name}.balanceOf({holder}) = {value},"
                    f" index {got.balances.get((holder, token))}"
                )
        (total,) = abi.decode(["uint256"], answers[-1] or b"")
        if token in got.contracts and total != got.contracts[token][4]:
            problems.append(f"{name}.totalSupply() = {total}, index {got.contracts[token][4]}")
    nft = manifest.address("erc721_collection").lower()
    ids = sorted(
        {i for (c, i) in got.tokens if c == nft} | {i for (_, c, i) in got.holdings if c == nft}
    )
    seen_ids = sorted(set(ids) | {t[6] for t in got.transfers if t[3] == nft and t[6] is not None})
    answers = await node.calls(
        [(nft, abi.encode_call("ownerOf(uint256)", i)) for i in seen_ids], block
    )
    for token_id, answer in zip(seen_ids, answers, strict=True):
        owner = None if answer is None else abi.decode(["address"], answer)[0].lower()
        index_owners = [
            h for (h, c, i), q in got.holdings.items() if c == nft and i == token_id and q > 0
        ]
        if ([owner] if owner else []) != index_owners:
            problems.append(f"ownerOf({token_id}) = {owner}, index {index_owners}")
    nft_holders = sorted({h for (c, h) in got.owners if c == nft} | set(accounts))
    answers = await node.calls(
        [(nft, abi.encode_call("balanceOf(address)", h)) for h in nft_holders]
        + [(nft, abi.encode_call("totalSupply()"))],
        block,
    )
    for holder, answer in zip(nft_holders, answers, strict=False):
        (value,) = abi.decode(["uint256"], answer or b"")
        if value != got.owners.get((nft, holder), 0):
            problems.append(
                f"721 balanceOf({holder}) = {value}, index {got.owners.get((nft, holder))}"
            )
    (supply,) = abi.decode(["uint256"], answers[-1] or b"")
    if nft in got.contracts and supply != got.contracts[nft][5]:
        problems.append(f"721 totalSupply() = {supply}, index {got.contracts[nft][5]}")
    items = manifest.address("erc1155_items").lower()
    item_ids = sorted({t[6] for t in got.transfers if t[3] == items and t[6] is not None})
    item_holders = sorted({h for (h, c, _) in got.holdings if c == items} | set(accounts))
    pairs = [(h, i) for h in item_holders for i in item_ids]
    answers = await node.calls(
        [(items, abi.encode_call("balanceOf(address,uint256)", h, i)) for h, i in pairs], block
    )
    for (holder, token_id), answer in zip(pairs, answers, strict=True):
        (value,) = abi.decode(["uint256"], answer or b"")
        if value != got.holdings.get((holder, items, token_id), 0):
            problems.append(
                f"1155 balanceOf({holder}, {token_id}) = {value},"
                f" index {got.holdings.get((holder, items, token_id))}"
            )
    return problems


async def wait_until_indexed(store: Store, node: Node, limit: float = 30) -> tuple[int, str]:
    """Until the index's cursor is the node's head (and the head stays put)."""
    with trio.fail_after(limit):
        while True:
            head = await node.head()
            cursor = await IndexRows(store).index_cursor("ethereum", "devnet")
            if cursor is not None and (cursor.number, cursor.hash) == head:
                return head
            await trio.sleep(0.02)


async def assert_index_matches(store: Store, node: Node, manifest: Manifest) -> Expected:
    """The index equals the recomputation over the canonical chain and the contracts' own
    answers at the head; returns what it holds."""
    number, block_hash = await wait_until_indexed(store, node)
    cursor, got, blocks = await snapshot(store)
    assert cursor == (number, block_hash)
    logs, natives = await canonical(node, number)
    # The head did not move while we read.
    assert await node.head() == (number, block_hash)
    problems = compare(got, recompute(logs, natives))
    problems += await chain_truth(node, manifest, got, hex(number))
    # The recent block hashes are the canonical ones.
    canonical_blocks = await node.batch(
        [("eth_getBlockByNumber", [hex(n), False]) for n in sorted(blocks)]
    )
    for n, block in zip(sorted(blocks), canonical_blocks, strict=True):
        if block["hash"] != blocks[n]:
            problems.append(f"idx_blocks[{n}] = {blocks[n]}, canonical {block['hash']}")
    assert not problems, "\n".join(problems)
    return got


# --- the judges' own tests ---------------------------------------------------------------------


def _log(block: int, index: int, address: str, topics: list[str], data: bytes) -> dict[str, Any]:
    return {
        "address": address,
        "topics": topics,
        "data": "0x" + data.hex(),
        "blockNumber": hex(block),
        "logIndex": hex(index),
    }


def _topic(address: str) -> str:
    return "0x" + "00" * 12 + address[2:]


def test_recompute_follows_mints_transfers_and_burns() -> None:
    a, b, token, nft = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "11" * 20, "0x" + "22" * 20
    word = abi.encode(["uint256"], [7])
    logs = [
        _log(1, 0, token, [T_TRANSFER, _topic(ZERO), _topic(a)], abi.encode(["uint256"], [10])),
        _log(2, 0, token, [T_TRANSFER, _topic(a), _topic(b)], abi.encode(["uint256"], [10])),
        _log(2, 1, nft, [T_TRANSFER, _topic(ZERO), _topic(a), "0x" + word.hex()], b""),
        _log(3, 0, nft, [T_TRANSFER, _topic(a), _topic(ZERO), "0x" + word.hex()], b""),
        # Neither shape: ignored.
        _log(3, 1, token, [T_TRANSFER, _topic(a)], abi.encode(["uint256"], [1])),
    ]
    want = recompute(logs)
    assert want.balances == {(b, token): 10}
    assert want.holdings == {}
    assert want.contracts[token] == ("ERC20", 1, (2, 0, 0), 1, 10, 0, 0)
    assert want.contracts[nft] == ("ERC721", 2, (0, 2, 0), 0, 0, 0, 0)
    assert len(want.transfers) == 4
