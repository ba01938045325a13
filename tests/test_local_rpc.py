"""The in-process JSON-RPC endpoint (``chaingate.rpc.local``) without a network: parsing,
dispatch, faults, notifications, batches and costs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaingate.rpc import local
from chaingate.rpc.local import LocalRpc, RpcFault


def endpoint() -> LocalRpc:
    rpc = LocalRpc("ethereum/devnet")

    async def echo(params: Any, principal: Any) -> Any:
        return {"params": params, "who": principal}

    async def refuse(params: Any, principal: Any) -> Any:
        raise RpcFault(-32001, "refused", {"rule": "x"})

    rpc.register("echo", echo, 5)
    rpc.register("refuse", refuse, 7)
    return rpc


async def answer(rpc: LocalRpc, body: bytes) -> Any:
    parsed = local.parse(body)
    if isinstance(parsed, bytes):
        return json.loads(parsed)
    replies, _ = await rpc.run(parsed, "acct")
    encoded = local.encode(parsed, replies)
    return None if encoded is None else json.loads(encoded)


async def test_a_call_is_answered_with_its_id_and_a_fault_with_its_code_and_data() -> None:
    rpc = endpoint()
    ok = await answer(rpc, b'{"jsonrpc":"2.0","id":"a","method":"echo","params":[1]}')
    assert ok == {"jsonrpc": "2.0", "id": "a", "result": {"params": [1], "who": "acct"}}
    refused = await answer(rpc, b'{"jsonrpc":"2.0","id":2,"method":"refuse"}')
    assert refused["error"] == {"code": -32001, "message": "refused", "data": {"rule": "x"}}
    unknown = await answer(rpc, b'{"jsonrpc":"2.0","id":3,"method":"eth_sendUserOperation"}')
    assert unknown["error"]["code"] == -32601
    assert "echo, refuse" in unknown["error"]["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"[]", -32600),
        (b'{"id":1,"method":"echo"}', -32600),  # no "jsonrpc": "2.0"
        (b'{"jsonrpc":"2.0","id":[1],"method":"echo"}', -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"echo"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"echo","params":5}', -32602),
        (b"7", -32600),
    ],
)
async def test_malformed_requests_get_the_standard_codes(body: bytes, code: int) -> None:
    reply = await answer(endpoint(), body)
    assert reply["error"]["code"] == code, reply


async def test_batches_keep_order_notifications_get_no_answer_and_sizes_are_bounded() -> None:
    rpc = endpoint()
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "echo"},
        {"jsonrpc": "2.0", "method": "echo"},  # a notification
        {"jsonrpc": "2.0", "id": 3, "method": "refuse"},
        5,
    ]
    replies = await answer(rpc, json.dumps(batch).encode())
    assert [r["id"] for r in replies] == [1, 3, None]
    assert "result" in replies[0] and replies[2]["error"]["code"] == -32600
    assert await answer(rpc, b'{"jsonrpc":"2.0","method":"echo"}') is None
    too_many = [{"jsonrpc": "2.0", "id": i, "method": "echo"} for i in range(local.MAX_BATCH + 1)]
    assert (await answer(rpc, json.dumps(too_many).encode()))["error"]["code"] == -32600
    parsed = local.parse(json.dumps(batch).encode())
    assert not isinstance(parsed, bytes)
    assert rpc.cost(parsed.calls) == 5 + 5 + 7 + 1  # a malformed call costs 1


def test_a_method_is_registered_once() -> None:
    rpc = endpoint()

    async def other(params: Any, principal: Any) -> Any:
        return None

    with pytest.raises(ValueError, match="twice"):
        rpc.register("echo", other, 1)
