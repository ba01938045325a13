"""eth_getLogs ranges: the limit states itself, wide ranges are split and merged in order.

The chain: anvil cannot mine 50,000 blocks in a test's time (mining slows with height:
~20 s per 1,000 blocks at 10,000 deep), so its genesis is block 45,000 (anvil's ``--init``
honours a genesis ``number``) and 5,000 real blocks are mined on top, with logs at a few
heights.  A query from block 0 to the head spans 50,000 blocks: the gateway splits it into
parts of ``upstream_block_range`` and the merged answer must equal anvil's own answer to the
same query in one call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import trio

from chaingate.auth.store import AuthRows
from chaingate.config import LogRangeSettings
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.rpc.logranges import LogRanges, Split
from tests.test_auth import AuthStack, stack  # noqa: F401  (the fixture)

GENESIS = 45_000
MINED = 5_000
DEV = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"
# A contract whose every call logs its calldata with the caller as topic 0:
# CALLDATACOPY(0, 0, CALLDATASIZE); LOG1(0, CALLDATASIZE, CALLER); STOP — and its constructor.
RUNTIME = "365f5f3733365fa100"
INITCODE = "0x6009600a5f3960095ff3" + RUNTIME


def _send(url: str, to: str | None, data: str) -> dict[str, Any]:
    tx: dict[str, Any] = {"from": DEV, "data": data}
    if to is not None:
        tx["to"] = to
    tx_hash = rpc_call(url, "eth_sendTransaction", [tx])
    for _ in range(200):  # anvil mines right after answering
        receipt = rpc_call(url, "eth_getTransactionReceipt", [tx_hash])
        if isinstance(receipt, dict):
            assert receipt["status"] == "0x1"
            return receipt
        time.sleep(0.01)
    raise AssertionError(f"{tx_hash} not mined")


def _mine(url: str, blocks: int) -> None:
    while blocks:
        step = min(blocks, 1000)
        rpc_call(url, "anvil_mine", [hex(step)], timeout=120)
        blocks -= step


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AnvilProcess, list[str]]]:
    """An anvil whose head is block 50,000 or so, with logs of two contracts at a few heights."""
    genesis = tmp_path_factory.mktemp("genesis") / "genesis.json"
    genesis.write_text(
        json.dumps(
            {
                "config": {"chainId": 31337},
                "number": hex(GENESIS),
                "timestamp": "0x0",
                "gasLimit": hex(30_000_000),
                "difficulty": "0x0",
                "alloc": {DEV: {"balance": hex(10**24)}},
            }
        )
    )
    with AnvilProcess(extra=["--init", str(genesis)]) as node:
        url = node.url
        emitters = [str(_send(url, None, INITCODE)["contractAddress"]) for _ in range(2)]
        for index, gap in enumerate((700, 1200, 1500, 1100)):
            _send(url, emitters[index % 2], "0x" + f"{index:02x}" * 40)
            _mine(url, gap)
        _send(url, emitters[0], "0x" + "ff" * 3)
        _mine(url, GENESIS + MINED - int(str(rpc_call(url, "eth_blockNumber")), 16))
        yield node, emitters


async def _rpc(client: httpx.AsyncClient, url: str, body: Any) -> Any:
    response = await client.post(url, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _call(params: Any, id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": "eth_getLogs", "params": [params]}


LOGS = {"max_block_range": 60_000, "upstream_block_range": 2_000, "split_concurrency": 4}


async def test_wide_range_split_and_merged_equals_anvil(
    start_gateway: Any, chain: tuple[AnvilProcess, list[str]]
) -> None:
    node, emitters = chain
    handle = await start_gateway([node.url], network={"logs": LOGS})
    service = handle.gateway.chain.services["ethereum/devnet"]
    head = int(str(rpc_call(node.url, "eth_blockNumber")), 16)
    assert head >= 50_000
    whole = {"fromBlock": "0x0", "toBlock": hex(head)}
    expected = rpc_call(node.url, "eth_getLogs", [whole], timeout=60)
    assert isinstance(expected, list) and len(expected) == 5
    async with httpx.AsyncClient() as client:
        url = handle.rpc_url()
        for query in (whole, {"fromBlock": "earliest", "toBlock": "latest"}, {"fromBlock": "0x0"}):
            calls_before = service.logs.split_calls if service.logs else 0
            reply = await _rpc(client, url, _call(query))
            assert reply == {"jsonrpc": "2.0", "id": 1, "result": expected}
            assert service.logs is not None
            # 50,000 blocks in parts of at most 2,000: at least 25 upstream calls.
            assert service.logs.split_calls - calls_before >= 25
        # An address filter: only that contract's logs, in order, still split.
        only = {**whole, "address": emitters[1]}
        reply = await _rpc(client, url, _call(only))
        assert reply["result"] == rpc_call(node.url, "eth_getLogs", [only], timeout=60)
        assert [entry["address"] for entry in reply["result"]] == [emitters[1]] * 2
        # Nothing matches: an empty list, never an error.
        nobody = {**whole, "address": "0x" + "00" * 19 + "01"}
        assert (await _rpc(client, url, _call(nobody)))["result"] == []
        # A blockHash filter is forwarded untouched.
        block_hash = expected[0]["blockHash"]
        by_hash = await _rpc(client, url, _call({"blockHash": block_hash}))
        assert by_hash["result"] == [expected[0]]
        # In a batch: the split call and a plain one, each answered at its place.
        batch = [_call(whole, 7), {"jsonrpc": "2.0", "id": 8, "method": "eth_chainId"}]
        replies = await _rpc(client, url, batch)
        assert replies[0] == {"jsonrpc": "2.0", "id": 7, "result": expected}
        assert replies[1]["id"] == 8 and replies[1]["result"] == "0x7a69"


async def test_over_the_ceiling_is_the_documented_error(
    start_gateway: Any, chain: tuple[AnvilProcess, list[str]]
) -> None:
    node, _ = chain
    handle = await start_gateway([node.url], network={"logs": LOGS})
    service = handle.gateway.chain.services["ethereum/devnet"]
    async with httpx.AsyncClient() as client:
        url = handle.rpc_url()
        requests_before = sum(u.health.requests for u in service.pool.upstreams)
        wide = {"fromBlock": "0x0", "toBlock": hex(69_999)}
        reply = await _rpc(client, url, _call(wide, 3))
        error = reply["error"]
        assert reply["id"] == 3
        assert error["code"] == -32005
        assert "the limit is 60000 blocks" in error["message"]
        assert "70000 blocks asked" in error["message"]
        assert error["data"] == {
            "reason": "block_range_too_large",
            "limit": 60_000,
            "requested": 70_000,
            "setting": "logs.max_block_range",
            "suggested": {"fromBlock": "0x0", "toBlock": hex(59_999)},
        }
        # Refused before any node is asked (probes aside: they do not touch getLogs).
        assert service.stats["eth_getLogs"].error == 1
        # The suggested range works.
        fits = await _rpc(client, url, _call(error["data"]["suggested"]))
        assert isinstance(fits.get("result"), list), fits
        # In a batch, the refused call gets its error and the others run.
        batch = [_call(wide, 1), {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId"}]
        replies = await _rpc(client, url, batch)
        assert replies[0]["error"]["code"] == -32005 and replies[1]["result"] == "0x7a69"
        assert sum(u.health.requests for u in service.pool.upstreams) > requests_before


def test_plan_lowers_the_network_limit_never_raises_it() -> None:
    ranges = LogRanges(LogRangeSettings(max_block_range=10_000, upstream_block_range=1_000))
    assert ranges.limit(0) == (10_000, "logs.max_block_range")
    assert ranges.limit(2_000) == (
        2_000,
        "logs_max_block_range (plan)",
    )
    assert ranges.limit(50_000) == (10_000, "logs.max_block_range")
    plan_limit = ranges.limit(2_000)
    refused = ranges.plan(b'[{"fromBlock":"0x0","toBlock":"0xbb8"}]', 5_000, plan_limit)
    assert isinstance(refused, bytes)
    error = msgspec.json.decode(refused)
    assert error["data"]["limit"] == 2_000 and error["data"]["setting"].endswith("(plan)")
    # Forwarded untouched: fits one call, blockHash, unreadable, inverted.
    head = 5_000
    for params in (
        b'[{"fromBlock":"0x0","toBlock":"0x3e7"}]',
        b'[{"blockHash":"0x' + b"11" * 32 + b'"}]',
        b'[{"fromBlock":12}]',
        b'[{"fromBlock":"0x10","toBlock":"0x1"}]',
        b"[]",
    ):
        assert ranges.plan(params, head, ranges.limit(0)) is None, params
    # "latest" is the head: 0..latest at head 5,000 is 5,001 blocks, split.
    assert isinstance(ranges.plan(b'[{"fromBlock":"0x0"}]', head, ranges.limit(0)), Split)
    # No head known yet: decided after asking a node.
    assert isinstance(ranges.plan(b'[{"fromBlock":"0x0"}]', None, ranges.limit(0)), Split)


async def test_parts_a_node_refuses_are_halved_and_merged_in_order() -> None:
    """A stub node (no provider with a range cap runs here) that refuses more than 300 blocks
    per call, as providers do, and logs one entry per 100th block."""
    ranges = LogRanges(LogRangeSettings(max_block_range=0, upstream_block_range=1_000))
    asked: list[tuple[int, int]] = []

    async def stub(method: str, params: bytes) -> tuple[bytes | None, bytes | None]:
        if method == "eth_blockNumber":
            return b'"0x1388"', None
        query = msgspec.json.decode(params)[0]
        first, last = int(query["fromBlock"], 16), int(query["toBlock"], 16)
        asked.append((first, last))
        await trio.sleep(0.001 * (last % 7))  # answers out of order
        if last - first + 1 > 300:
            return None, b'{"code":-32602,"message":"query exceeds max block range 300"}'
        logs = [{"blockNumber": hex(n)} for n in range(first, last + 1) if n % 100 == 0]
        return msgspec.json.encode(logs), None

    split = ranges.plan(b'[{"fromBlock":"0x1","toBlock":"0x1388"}]', 5_000, ranges.limit(0))
    assert isinstance(split, Split)
    result, error = await ranges.fetch(split, stub, ranges.limit(0), 1 << 20, b"{}")
    assert error is None and result is not None
    numbers = [int(entry["blockNumber"], 16) for entry in msgspec.json.decode(result)]
    assert numbers == list(range(100, 5_001, 100))
    # The span settles near what the node takes: most calls are answered, not refused.
    refused = sum(1 for first, last in asked if last - first + 1 > 300)
    assert refused < len(asked) / 2, asked
    # A refusal that a smaller range cannot cure ends it, with the node's error.

    async def bad_filter(method: str, params: bytes) -> tuple[bytes | None, bytes | None]:
        if method == "eth_blockNumber":
            return b'"0x1388"', None
        return None, b'{"code":-32602,"message":"invalid address"}'

    result, error = await ranges.fetch(split, bad_filter, ranges.limit(0), 1 << 20, b"{}")
    assert result is None and error == b'{"code":-32602,"message":"invalid address"}'
    # Over the answer bound: the caller's error.

    async def big(method: str, params: bytes) -> tuple[bytes | None, bytes | None]:
        if method == "eth_blockNumber":
            return b'"0x1388"', None
        return b'["' + b"x" * 1000 + b'"]', None

    result, error = await ranges.fetch(split, big, ranges.limit(0), 3000, b'{"too":"large"}')
    assert result is None and error == b'{"too":"large"}'


async def test_a_plan_lowers_the_limit_for_its_keys(stack: AuthStack) -> None:
    """config/plans.toml: free keys get 5,000 blocks, growth keys the network's 10,000."""
    free, _ = await stack.key(plan="free")
    growth, _ = await stack.key(plan="growth")
    query = _call({"fromBlock": "0x0", "toBlock": hex(6_000)})  # 6,001 blocks
    async with stack.client(free) as client:
        refused = (await client.post("/v1/rpc/ethereum/devnet", json=query)).json()
    assert refused["error"]["code"] == -32005
    assert refused["error"]["data"]["limit"] == 5_000
    assert refused["error"]["data"]["setting"] == "logs_max_block_range (plan)"
    async with stack.client(growth) as client:
        answered = (await client.post("/v1/rpc/ethereum/devnet", json=query)).json()
    assert isinstance(answered.get("result"), list), answered


async def test_a_plans_limit_below_one_upstream_call_is_kept_and_follows_plan_changes(
    stack: AuthStack,
) -> None:
    """A range that one upstream call would take (2,000 blocks) but the key's plan does not:
    the lane reads the plan's limit from the key (``Principal.logs_range``), which follows the
    account's plan when it changes."""
    key, _ = await stack.key(plan="free", email="logs-plan@t")
    rows = AuthRows(stack.store)
    account = await rows.find_account_by_email("logs-plan@t")
    assert account is not None
    query = _call({"fromBlock": "0x0", "toBlock": hex(150)})  # 151 blocks
    for plan_blocks, refused in ((100, True), (200, False), (150, True)):
        await rows.set_plan(account.id, "free", json.dumps({"logs_max_block_range": plan_blocks}))
        await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
        async with stack.client(key) as client:
            answer = (await client.post("/v1/rpc/ethereum/devnet", json=query)).json()
        if refused:
            assert answer["error"]["code"] == -32005, answer
            assert answer["error"]["data"]["limit"] == plan_blocks
            assert answer["error"]["data"]["setting"] == "logs_max_block_range (plan)"
        else:
            assert isinstance(answer.get("result"), list), answer
