"""eth_subscribe inside a WebSocket batch behaves as geth does.

geth (rpc/handler.go, ``handleBatch``) runs every call of a batch, subscriptions included,
answers them in one array in call order, and activates the new subscriptions only after that
array is written — so a client never gets a push for an id it has not been told.  Before this,
chaingate sent the batch to the RPC service, where ``eth_subscribe`` is no method (-32601).
"""

from __future__ import annotations

from chaingate.devnet.anvil import AnvilProcess
from tests.conftest import StartGateway
from tests.test_ws import FOLLOW, collect, following, mine, nothing_more, ws_url
from tests.ws_clients import Client


async def test_subscribe_in_a_batch_answers_each_call_in_order(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    await following(handle, anvil.url)
    client = await Client.open(ws_url(handle))
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
        {"jsonrpc": "2.0", "id": 2, "method": "eth_subscribe", "params": ["newHeads"]},
        {"jsonrpc": "2.0", "method": "eth_blockNumber", "params": []},  # a notification
        {"jsonrpc": "2.0", "id": 3, "method": "eth_subscribe", "params": ["nope"]},
        {"jsonrpc": "2.0", "id": 4, "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": 5, "method": "no_such_method", "params": []},
    ]
    await client.send(batch)
    answer = await client.recv()
    assert isinstance(answer, list), answer
    assert [reply["id"] for reply in answer] == [1, 2, 3, 4, 5]
    assert answer[0]["result"] == "0x7a69"
    sub = answer[1]["result"]
    assert isinstance(sub, str) and sub.startswith("0x")
    assert answer[2]["error"]["code"] == -32602  # an unknown subscription kind
    assert answer[3]["result"].startswith("0x")
    assert answer[4]["error"]["code"] == -32601
    # The subscription is live, and only after its id was sent.
    await mine(anvil.url)
    (push,) = await collect(client, 1)
    assert push["method"] == "eth_subscription" and push["params"]["subscription"] == sub
    # eth_unsubscribe in a batch too; then no more pushes.
    await client.send(
        [
            {"jsonrpc": "2.0", "id": 9, "method": "eth_unsubscribe", "params": [sub]},
            {"jsonrpc": "2.0", "id": 10, "method": "eth_unsubscribe", "params": [sub]},
        ]
    )
    answer = await client.recv()
    assert answer == [
        {"jsonrpc": "2.0", "id": 9, "result": True},
        {"jsonrpc": "2.0", "id": 10, "result": False},
    ]
    await mine(anvil.url)
    await nothing_more(client)
    await client.close()


async def test_batches_without_subscriptions_are_unchanged(
    start_gateway: StartGateway, anvil: AnvilProcess
) -> None:
    handle = await start_gateway([anvil.url], network=FOLLOW)
    client = await Client.open(ws_url(handle))
    # "subscribe" in a parameter only: the RPC service answers the batch, as before.
    await client.send([{"jsonrpc": "2.0", "id": "subscribe", "method": "eth_chainId"}])
    answer = await client.recv()
    assert answer == [{"jsonrpc": "2.0", "id": "subscribe", "result": "0x7a69"}]
    await client.send("[]")
    empty = await client.recv()
    assert empty["error"]["code"] == -32600
    await client.close()
