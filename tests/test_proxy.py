"""The JSON-RPC proxy against a real anvil, on both framing implementations."""

from __future__ import annotations

import json
from typing import Any

import trio

from chaingate.auth.gate import ANONYMOUS, OpenGate
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from tests.conftest import StartGateway
from tests.helpers import exchange, parse_responses, post_bytes

RPC = "/v1/rpc/ethereum/devnet"
ACCOUNT = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"  # anvil's first default account


async def post_json(gw: Any, body: Any, path: str = RPC) -> Any:
    async with gw.client() as client:
        return await client.post(
            path, content=body if isinstance(body, bytes) else json.dumps(body)
        )


async def test_single_call_is_proxied_with_its_id(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    head = rpc_call(anvil.url, "eth_blockNumber")
    response = await post_json(
        gw, {"jsonrpc": "2.0", "id": 7, "method": "eth_blockNumber", "params": []}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"jsonrpc": "2.0", "id": 7, "result": head}


async def test_ids_are_echoed_byte_for_byte(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    for raw_id in [
        b"1",
        b"1.0",
        b"-5e3",
        b'"abc"',
        b'"a\\"b\\u00e9"',
        b"null",
        b"123456789012345678901234567890",
    ]:
        body = b'{"jsonrpc":"2.0","id":' + raw_id + b',"method":"eth_chainId"}'
        response = await post_json(gw, body)
        assert response.content == b'{"jsonrpc":"2.0","id":' + raw_id + b',"result":"0x7a69"}'


async def test_params_reach_the_node_as_sent(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    # Odd but valid whitespace and key order: the node must still understand the call.
    body = (
        b'{"params" : [ "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266" ,\n "latest" ], '
        b'"id":3, "jsonrpc":"2.0", "method":"eth_getBalance"}'
    )
    response = await post_json(gw, body)
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": rpc_call(anvil.url, "eth_getBalance", [ACCOUNT, "latest"]),
    }


async def test_batch_mixing_valid_invalid_and_unknown_items(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
        {"jsonrpc": "2.0", "id": "two", "method": "eth_noSuchMethod", "params": []},
        42,
        {"jsonrpc": "1.0", "id": 4, "method": "eth_blockNumber"},
        {"jsonrpc": "2.0", "method": "eth_blockNumber"},  # notification: no reply
        {"jsonrpc": "2.0", "id": None, "method": "net_version"},
        {"jsonrpc": "2.0", "id": 7, "method": "eth_getBalance", "params": [ACCOUNT, "latest"]},
        {"jsonrpc": "2.0", "id": 8, "method": "eth_blockNumber", "params": "bad"},
    ]
    response = await post_json(gw, batch)
    assert response.status_code == 200
    replies = response.json()
    assert [r["id"] for r in replies] == [1, "two", None, 4, None, 7, 8]  # request order
    assert replies[0]["result"] == "0x7a69"
    assert replies[1]["error"]["code"] == -32601
    assert replies[2]["error"]["code"] == -32600
    assert replies[3]["error"]["code"] == -32600
    assert replies[4]["result"] == "31337"
    assert replies[5]["result"].startswith("0x")
    assert replies[6]["error"]["code"] == -32600
    for reply in replies:
        assert reply["jsonrpc"] == "2.0"
        assert ("result" in reply) != ("error" in reply)


async def test_large_batch_keeps_order_across_upstream_chunks(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([{"url": anvil.url, "max_batch": 7}])
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "eth_getBalance", "params": [f"0x{i:040x}", "latest"]}
        for i in range(50)
    ]
    batch[10] = {
        "jsonrpc": "2.0",
        "id": 10,
        "method": "eth_sendTransaction",
        "params": [{"from": ACCOUNT, "to": ACCOUNT, "value": "0x0"}],
    }
    replies = (await post_json(gw, batch)).json()
    assert [r["id"] for r in replies] == list(range(50))
    assert all("result" in r for r in replies), replies


async def test_parse_errors_and_top_level_errors(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], rpc={"max_batch": 5})
    cases = {
        b'{"jsonrpc":"2.0",': -32700,
        b"": -32700,
        b"\xff\xfe": -32700,
        b"[]": -32600,
        b'"hello"': -32600,
        json.dumps(
            [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId"} for i in range(6)]
        ).encode(): -32600,
    }
    for body, code in cases.items():
        response = await post_json(gw, body)
        assert response.status_code == 200
        reply = response.json()
        assert reply["id"] is None and reply["error"]["code"] == code, (body, reply)


async def test_unknown_method_never_reaches_the_node(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url])
    before = rpc_call(node.url, "eth_blockNumber")
    reply = await gw.rpc("anvil_mine", ["0x5"])
    assert reply["error"]["code"] == -32601
    assert "anvil_mine" in reply["error"]["message"]
    # Had the call been forwarded, anvil would have mined five blocks.
    assert rpc_call(node.url, "eth_blockNumber") == before
    assert gw.gateway.chain.services["ethereum/devnet"].calls[("unknown", "error")] == 1


async def test_passthrough_forwards_unknown_methods_when_enabled(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url], network={"passthrough": True})
    before = int(rpc_call(node.url, "eth_blockNumber"), 16)
    reply = await gw.rpc("anvil_mine", ["0x3"])
    assert "error" not in reply, reply
    assert int(rpc_call(node.url, "eth_blockNumber"), 16) == before + 3


async def test_notification_alone_gets_204(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    response = await post_json(gw, {"jsonrpc": "2.0", "method": "eth_blockNumber"})
    assert response.status_code == 204
    assert response.content == b""
    response = await post_json(
        gw,
        [{"jsonrpc": "2.0", "method": "eth_chainId"}, {"jsonrpc": "2.0", "method": "net_version"}],
    )
    assert response.status_code == 204


async def test_node_errors_pass_through_as_json_rpc_errors(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    # A malformed raw transaction: the node refuses it; the client sees the node's own error.
    response = await post_json(
        gw,
        {"jsonrpc": "2.0", "id": 1, "method": "eth_sendRawTransaction", "params": ["0xdeadbeef"]},
    )
    assert response.status_code == 200
    reply = response.json()
    assert (
        reply["id"] == 1 and isinstance(reply["error"]["code"], int) and reply["error"]["message"]
    )


async def test_static_answers_are_cached_and_the_header_says_so(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    service = gw.gateway.chain.services["ethereum/devnet"]
    first = await post_json(gw, {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"})
    second = await post_json(gw, {"jsonrpc": "2.0", "id": 2, "method": "eth_chainId"})
    assert first.headers["x-cache"] == "MISS"
    assert second.headers["x-cache"] == "HIT"
    assert second.json() == {"jsonrpc": "2.0", "id": 2, "result": "0x7a69"}
    assert service.cache.hits == 1 and service.cache_hits["eth_chainId"] == 1
    # Not cacheable: always a miss, never a lying HIT.
    for _ in range(2):
        response = await post_json(gw, {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"})
        assert response.headers["x-cache"] == "MISS"
    batch = await post_json(
        gw,
        [
            {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"},
            {"jsonrpc": "2.0", "id": 2, "method": "eth_blockNumber"},
        ],
    )
    assert batch.headers["x-cache"] == "PARTIAL"


async def test_finalized_blocks_and_receipts_are_cached_recent_ones_are_not(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url])  # finality_depth = 2
    tx = rpc_call(
        node.url, "eth_sendTransaction", [{"from": ACCOUNT, "to": ACCOUNT, "value": "0x1"}]
    )
    receipt = None
    with trio.fail_after(5):  # anvil may mine the transaction a moment after accepting it
        while receipt is None:
            receipt = rpc_call(node.url, "eth_getTransactionReceipt", [tx])
            await trio.sleep(0.02)
    assert isinstance(receipt, dict)
    block_hash = receipt["blockHash"]
    service = gw.gateway.chain.services["ethereum/devnet"]

    async def fetch(method: str, params: list[Any]) -> tuple[str, Any]:
        response = await post_json(
            gw, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        )
        return response.headers["x-cache"], response.json()["result"]

    # The block is the head: not final, so never cached.
    await trio.sleep(0.5)
    assert (await fetch("eth_getBlockByHash", [block_hash, False]))[0] == "MISS"
    assert (await fetch("eth_getBlockByHash", [block_hash, False]))[0] == "MISS"
    rpc_call(node.url, "anvil_mine", ["0x3"])
    await trio.sleep(0.5)  # a probe sees the new head
    assert (
        service.pool.head is not None and service.pool.head >= int(receipt["blockNumber"], 16) + 3
    )
    # The lane's bound of what is final moves with the agreed head (RpcService._head_moved).
    assert service.route.finalized == service.pool.head - 2
    miss = await fetch("eth_getTransactionReceipt", [tx])
    hit = await fetch("eth_getTransactionReceipt", [tx])
    assert (miss[0], hit[0]) == ("MISS", "HIT") and miss[1] == hit[1] == receipt
    miss = await fetch("eth_getBlockByHash", [block_hash, False])
    hit = await fetch("eth_getBlockByHash", [block_hash, False])
    assert (miss[0], hit[0]) == ("MISS", "HIT") and hit[1]["hash"] == block_hash
    number = receipt["blockNumber"]
    assert [(await fetch("eth_getBlockByNumber", [number, False]))[0] for _ in range(2)] == [
        "MISS",
        "HIT",
    ]
    assert [(await fetch("eth_getBlockByNumber", ["latest", False]))[0] for _ in range(2)] == [
        "MISS",
        "MISS",
    ]


async def test_identical_concurrent_reads_share_one_upstream_call(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url], rpc={"probe_interval": 60})
    service = gw.gateway.chain.services["ethereum/devnet"]
    results: list[Any] = []
    async with gw.client() as client:

        async def call(i: int) -> None:
            body = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "eth_getBalance",
                "params": [ACCOUNT, "latest"],
            }
            results.append((await client.post(RPC, json=body)).json())

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(call, i)
    assert sorted(r["id"] for r in results) == list(range(40))
    assert len({r["result"] for r in results}) == 1
    assert service.coalesced > 0
    assert service.calls[("eth_getBalance", "ok")] == 40


async def test_writes_are_never_coalesced(start_gateway: StartGateway, anvil_factory: Any) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url], network={"passthrough": True})
    signed = [
        rpc_call(
            node.url,
            "eth_signTransaction",
            [
                {
                    "from": ACCOUNT,
                    "to": ACCOUNT,
                    "value": "0x0",
                    "nonce": hex(n),
                    "gas": "0x5208",
                    "gasPrice": "0x3b9aca00",
                }
            ],
        )
        for n in range(1)
    ]
    # The same raw transaction sent twice at once must reach the node twice (the second is
    # refused by the node, not silently merged by us).
    replies: list[Any] = []
    async with gw.client() as client:

        async def send() -> None:
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "eth_sendRawTransaction",
                "params": [signed[0]],
            }
            replies.append((await client.post(RPC, json=body)).json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(send)
    service = gw.gateway.chain.services["ethereum/devnet"]
    assert service.coalesced == 0
    assert (
        service.calls[("eth_sendRawTransaction", "ok")]
        + service.calls[("eth_sendRawTransaction", "error")]
        == 2
    )
    assert sum("result" in r for r in replies) >= 1


async def test_pipelined_requests_on_one_connection_answer_in_order(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    methods = ["eth_chainId", "eth_blockNumber", "net_version", "eth_getBalance", "eth_chainId"]
    data = b"".join(
        post_bytes(
            RPC,
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": m,
                    "params": [ACCOUNT, "latest"] if m == "eth_getBalance" else [],
                }
            ).encode(),
        )
        for i, m in enumerate(methods)
    )
    data += b"GET /v1/health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    raw = await exchange(gw.port, data)
    responses = parse_responses(raw, ["POST"] * len(methods) + ["GET"])
    assert [r.status for r in responses] == [200] * (len(methods) + 1)
    assert [r.json()["id"] for r in responses[:-1]] == list(range(len(methods)))
    assert responses[-1].json()["status"] == "ok"


async def test_unknown_chain_or_network_is_404_not_found(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    gw = await start_gateway([anvil.url])
    for path in [
        "/v1/rpc/ethereum/mainnet",
        "/v1/rpc/dogechain/devnet",
        "/v1/rpc/ethereum",
        "/v1/rpc/ethereum/devnet/extra",
    ]:
        response = await post_json(gw, {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}, path)
        assert response.status_code == 404, path
        assert response.json() == {
            "error": {"code": "not_found", "message": "unknown chain or network", "status": 404}
        }


async def test_rpc_path_requires_post(start_gateway: StartGateway, anvil: AnvilProcess) -> None:
    gw = await start_gateway([anvil.url])
    async with gw.client() as client:
        response = await client.get(RPC)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["error"]["status"] == 405


async def test_compute_units_follow_the_method_table(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    admitted: list[tuple[bool, bool, int, int, int]] = []

    class RecordingGate(OpenGate):
        def admit(
            self, principal: Any, reads: bool, writes: bool, requests: int, cu: int, tcu: int
        ) -> None:
            admitted.append((reads, writes, requests, cu, tcu))

    gw = await start_gateway([anvil.url])
    service = gw.gateway.chain.services["ethereum/devnet"]
    service._gate = RecordingGate()  # the seam issue 3 fills with keys and limits

    class RecordingAdmission(gw.gateway.impl.fastlane.OpenAdmission):  # type: ignore[misc,name-defined]
        def admit(
            self, principal: Any, reads: bool, writes: bool, requests: int, cu: int, tcu: int
        ) -> None:
            admitted.append((reads, writes, requests, cu, tcu))

    gw.gateway.front.lane.admission = RecordingAdmission(ANONYMOUS)  # the fast lane's seam
    slot = "0x0"
    await gw.rpc("eth_blockNumber")
    await gw.rpc("eth_getStorageAt", [ACCOUNT, slot, "latest"])
    await gw.rpc("eth_getStorageAt", [ACCOUNT, slot, "0x0"])
    await gw.rpc("eth_getStorageAt", [ACCOUNT, slot, "earliest"])
    await gw.rpc("eth_sendRawTransaction", ["0xdeadbeef"])
    async with gw.client() as client:
        await client.post(
            RPC,
            json=[
                {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"},
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "eth_getStorageAt",
                    "params": [ACCOUNT, slot, "0x1"],
                },
                {"jsonrpc": "2.0", "id": 3, "method": "eth_noSuch"},
            ],
        )
    assert admitted == [
        (True, False, 1, 1, 1),
        (True, False, 1, 5, 5),
        (True, False, 1, 20, 20),  # a historical tag scales both weights
        (True, False, 1, 20, 20),
        (False, True, 1, 20, 40),
        (True, False, 2, 21, 21),
    ]


async def test_malformed_block_tags_are_invalid_params_without_reaching_the_node(
    start_gateway: StartGateway, anvil_factory: Any
) -> None:
    node = anvil_factory()
    gw = await start_gateway([node.url], rpc={"probe_interval": 60})
    upstream = gw.gateway.chain.services["ethereum/devnet"].pool.upstreams[0]
    await trio.sleep(0.2)
    before = upstream.health.requests
    for tag in ["latestt", "0x", "0xZZ", 12, None, "0x" + "1" * 65, True]:
        reply = await gw.rpc("eth_getBalance", [ACCOUNT, tag])
        assert reply["error"]["code"] == -32602, (tag, reply)
    async with gw.client() as client:
        batch = await client.post(
            RPC,
            json=[
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "eth_getStorageAt",
                    "params": [ACCOUNT, "0x0", "nope"],
                },
                {
                    "jsonrpc": "2.0",
                    "method": "eth_getStorageAt",
                    "params": [ACCOUNT, "0x0", "nope"],
                },
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "eth_getBalance",
                    "params": [ACCOUNT, "latest"],
                },
            ],
        )
    replies = batch.json()
    assert [r["id"] for r in replies] == [1, 3]
    assert replies[0]["error"]["code"] == -32602 and "result" in replies[1]
    assert upstream.health.requests - before == 1  # only the valid batch item went upstream
    # Well-formed references reach the node, whatever it then finds.
    after = upstream.health.requests
    for tag in ["latest", "earliest", "0x0", "0x" + "ab" * 32, {"blockNumber": "0x0"}]:
        reply = await gw.rpc("eth_getBalance", [ACCOUNT, tag])
        assert reply.get("error", {}).get("code") != -32602, (tag, reply)
    assert upstream.health.requests - after == 5
