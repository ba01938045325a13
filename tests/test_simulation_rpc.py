"""The simulation methods as clients meet them: on ``/v1/rpc`` beside the proxied methods (in a
batch, over WebSocket), Alchemy's names as aliases, scope ``rpc:read`` and the method table's
price, every bound a clear error (bundle size, trace size, answer size, time), bad params a
-32602 naming them, and how chaingate picks a node: probed once per upstream, eth_simulateV1
where an upstream has it, debug_traceCall where only that, a clear -32004 where neither (a stub
of such nodes stands in front of anvil).  Also ``POST /v1/simulate/{chain}``.  Both framing
twins; the keyed tests both stores.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio

from chaingate.aa.userop import CANONICAL_ENTRY_POINTS, UserOperation
from chaingate.bundler.rpcform import encode_user_operation
from chaingate.config import default_config_dir
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.evm import abi
from chaingate.rpc.local import load_costs
from chaingate.rpc.methods import MethodTable
from chaingate.simulation.methods import BUNDLER_METHODS, METHODS
from chaingate.twins import Impl, select
from tests.conftest import StartGateway
from tests.provider_stub import MissingMethodsStub
from tests.test_allowlists import restricted
from tests.test_auth import RPC, AuthStack, auth_settings, start_auth
from tests.test_dashboard import _stack, signed_in
from tests.ws_clients import Client

Devnet = tuple[AnvilProcess, Manifest]
ETHER = 10**18


def transfer(manifest: Manifest, amount: int = ETHER) -> dict[str, Any]:
    a, b = manifest.accounts[1], manifest.accounts[2]
    data = abi.encode_call("transfer(address,uint256)", b, amount)
    return {"from": a, "to": manifest.address("erc20_cgt"), "data": "0x" + data.hex()}


def airdrop(manifest: Manifest) -> dict[str, Any]:
    """One call, three Transfer logs."""
    a = manifest.accounts[1]
    data = abi.encode_call("airdrop(address[],uint256)", manifest.accounts[2:5], 1)
    return {"from": a, "to": manifest.address("erc20_cgt"), "data": "0x" + data.hex()}


async def start(
    start_gateway: StartGateway,
    devnet: Devnet,
    tmp_path: Path,
    network: dict[str, Any] | None = None,
    **sim: Any,
) -> Any:
    node, manifest = devnet
    path = tmp_path / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dumps(manifest))
    return await start_gateway(
        [node.url],
        network={"manifest": str(path), **(network or {})},
        simulation=sim or {"enabled": True},
        data_dir=str(tmp_path / "data"),
    )


async def test_aliases_answer_as_the_chaingate_methods(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    handle = await start(start_gateway, devnet, tmp_path)
    _, manifest = devnet
    tx = transfer(manifest)
    cases = {
        "simulateAssetChanges": [tx],
        "simulateAssetChangesBundle": [[tx, tx], "latest"],
        "simulateExecution": ["NESTED", tx, "latest", {}],
    }
    for name, params in cases.items():
        own = await handle.rpc(f"chaingate_{name}", params)
        alias = await handle.rpc(f"alchemy_{name}", params)
        assert "result" in own and own["result"] == alias["result"], (name, own)
    # Alchemy's older form of simulateExecution (no format) answers FLAT.
    flat = await handle.rpc("alchemy_simulateExecution", [tx])
    assert [c["type"] for c in flat["result"]["calls"]] == ["CALL"]
    assert flat["result"]["calls"][0]["decoded"]["methodName"] == "transfer"
    assert flat["result"]["logs"][0]["decoded"]["eventName"] == "Transfer"


async def test_a_batch_mixes_simulations_with_proxied_calls(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    handle = await start(start_gateway, devnet, tmp_path)
    _, manifest = devnet
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "chaingate_simulateAssetChanges",
            "params": [transfer(manifest)],
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "chaingate_simulateAssetChanges",
            "params": [{"to": "nope"}],
        },
        {"jsonrpc": "2.0", "id": 4, "method": "eth_blockNumber", "params": []},
    ]
    async with handle.client() as client:
        replies = (await client.post("/v1/rpc/ethereum/devnet", json=batch)).json()
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    assert replies[0]["result"] == "0x7a69" and replies[3]["result"].startswith("0x")
    assert replies[1]["result"]["changes"][0]["assetType"] == "ERC20"
    assert replies[2]["error"]["code"] == -32602
    service = handle.gateway.chain.services["ethereum/devnet"]
    assert service.stats["chaingate_simulateAssetChanges"].ok == 1
    assert service.stats["chaingate_simulateAssetChanges"].error == 1


async def test_a_simulation_over_websocket(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    # WebSockets are served where the chain is followed.
    follow = {"follower": {"enabled": True, "poll_interval": 0.05}, "indexer": {"enabled": False}}
    handle = await start(start_gateway, devnet, tmp_path, network=follow)
    _, manifest = devnet
    url = f"ws://127.0.0.1:{handle.port}/v1/ws/ethereum/devnet"
    client = await Client.open(url)
    try:
        reply = await client.call("alchemy_simulateAssetChanges", [transfer(manifest)])
    finally:
        await client.close()
    assert reply["result"]["changes"][0]["symbol"] is None  # no metadata service here


async def test_bad_params_are_named_never_a_500(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    handle = await start(start_gateway, devnet, tmp_path)
    _, manifest = devnet
    tx = transfer(manifest)
    cases: dict[str, tuple[str, Any, str]] = {
        "not a list": ("chaingate_simulateAssetChanges", {"tx": tx}, "params must be an array"),
        "no tx": ("chaingate_simulateAssetChanges", [], "expected 1 to 3 params"),
        "too many": ("chaingate_simulateAssetChanges", [tx, "latest", {}, 1], "expected 1 to 3"),
        "bad address": ("chaingate_simulateAssetChanges", [{**tx, "to": "0x12"}], "transaction.to"),
        "checksum": (
            "chaingate_simulateAssetChanges",
            [{**tx, "from": "0xF39FD6E51aad88F6F4ce6aB8827279cffFb92266"}],
            "EIP-55",
        ),
        "unknown field": ("chaingate_simulateAssetChanges", [{**tx, "colour": 1}], "unknown field"),
        "odd data": ("chaingate_simulateAssetChanges", [{**tx, "data": "0x123"}], "odd number"),
        "block": ("chaingate_simulateAssetChanges", [tx, "yesterday"], "block"),
        "overrides": (
            "chaingate_simulateAssetChanges",
            [tx, "latest", {"0x12": {}}],
            "stateOverrides",
        ),
        "override field": (
            "chaingate_simulateAssetChanges",
            [tx, "latest", {manifest.accounts[1]: {"balance": "0x1", "owner": "me"}}],
            "unknown field",
        ),
        "state and diff": (
            "chaingate_simulateAssetChanges",
            [tx, "latest", {manifest.accounts[1]: {"state": {}, "stateDiff": {}}}],
            "not both",
        ),
        "format": ("chaingate_simulateExecution", ["SIDEWAYS", tx], "FLAT or NESTED"),
        "empty bundle": ("chaingate_simulateAssetChangesBundle", [[]], "non-empty"),
        "userop": (
            "chaingate_simulateUserOperationAssetChanges",
            [{"sender": manifest.accounts[1]}, manifest.address("entry_point_v07")],
            "userOp.",
        ),
    }
    for name, (method, params, words) in cases.items():
        reply = await handle.rpc(method, params)
        assert reply["error"]["code"] == -32602, (name, reply)
        assert words in reply["error"]["message"], (name, reply)


async def test_every_bound_is_a_clear_error(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    _, manifest = devnet
    tx = transfer(manifest)
    small = await start(
        start_gateway, devnet, tmp_path / "a", max_bundle=2, max_logs=2, max_answer_bytes=200
    )
    too_many = await small.rpc("chaingate_simulateAssetChangesBundle", [[tx, tx, tx]])
    assert too_many["error"]["code"] == -32602
    assert "at most 2 per bundle" in too_many["error"]["message"]
    for engine in ("simulate_v1", "trace_call"):
        sized = await start(start_gateway, devnet, tmp_path / engine, engine=engine, max_logs=2)
        logs = await sized.rpc("chaingate_simulateAssetChanges", [airdrop(manifest)])
        assert logs["error"]["code"] == -32005, (engine, logs)
        assert logs["error"]["data"] == {"reason": "simulation_too_large", "limit": 2}
    answer = await small.rpc("chaingate_simulateExecution", [tx])
    assert answer["error"]["code"] == -32005 and answer["error"]["data"]["limit"] == 200
    slow = await start(start_gateway, devnet, tmp_path / "slow", timeout=1e-6)
    late = await slow.rpc("chaingate_simulateAssetChanges", [tx])
    assert late["error"]["code"] == -32005
    assert late["error"]["data"] == {"reason": "simulation_timeout", "limit": 1e-6}
    assert "simulation.timeout" in late["error"]["message"]
    # The gateway goes on answering.
    assert (await slow.rpc("eth_chainId"))["result"] == "0x7a69"


async def test_without_the_subsystem_the_methods_are_not_served(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    handle = await start(start_gateway, devnet, tmp_path, enabled=False)
    reply = await handle.rpc("chaingate_simulateAssetChanges", [transfer(devnet[1])])
    assert reply["error"]["code"] == -32601
    assert "its subsystem is off" in reply["error"]["message"]


async def test_a_node_without_simulate_v1_is_traced_and_probed_once(
    nursery: trio.Nursery, start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    node, manifest = devnet
    old = MissingMethodsStub(node.url, {"eth_simulateV1"})
    await nursery.start(old.serve)
    handle = await start_gateway([old.url])
    tx = transfer(manifest)
    first = await handle.rpc("chaingate_simulateAssetChanges", [tx])
    bundle = await handle.rpc("chaingate_simulateAssetChangesBundle", [[tx, tx]])
    assert first["result"]["changes"][0]["rawAmount"] == str(ETHER)
    assert [r["error"] for r in bundle["result"]] == [None, None]
    simulator = handle.gateway.simulation.simulators["ethereum/devnet"]
    assert simulator.capabilities.known == {
        "up0": {"simulate_v1": False, "call_tracer": True, "prestate_diff": True}
    }
    assert simulator.answered == {"simulate_v1": 0, "trace_call": 2}
    assert old.asked["eth_simulateV1"] == 1  # the probe, once: never asked again


async def test_a_node_that_can_do_neither_is_a_clear_error(
    nursery: trio.Nursery, start_gateway: StartGateway, devnet: Devnet
) -> None:
    node, manifest = devnet
    bare = MissingMethodsStub(node.url, {"eth_simulateV1", "debug_traceCall"})
    await nursery.start(bare.serve)
    handle = await start_gateway([bare.url])
    reply = await handle.rpc("chaingate_simulateAssetChanges", [transfer(manifest)])
    assert reply["error"]["code"] == -32004
    assert reply["error"]["data"]["needs"] == ["simulate_v1", "call_tracer"]
    trace = await handle.rpc("chaingate_simulateExecution", [transfer(manifest)])
    assert trace["error"]["code"] == -32004 and trace["error"]["data"]["needs"] == ["call_tracer"]


async def test_a_bundle_on_a_node_without_diff_mode_uses_the_other_upstream(
    nursery: trio.Nursery, start_gateway: StartGateway, devnet: Devnet
) -> None:
    """Two upstreams: one lacks eth_simulateV1 and the prestate tracer, the other has both."""
    node, manifest = devnet
    old = MissingMethodsStub(node.url, {"eth_simulateV1"}, {"prestateTracer"})
    new = MissingMethodsStub(node.url, set())
    for stub in (old, new):
        await nursery.start(stub.serve)
    handle = await start_gateway(
        [{"url": old.url, "name": "old"}, {"url": new.url, "name": "new"}],
        simulation={"engine": "trace_call"},
    )
    tx = transfer(manifest)
    bundle = await handle.rpc("chaingate_simulateAssetChangesBundle", [[tx, tx]])
    assert [r["error"] for r in bundle["result"]] == [None, None]
    assert old.asked.get("eth_getBlockByNumber", 0) == 0  # the bundle ran on "new" alone
    assert new.asked["debug_traceCall"] >= 4  # probes + two traces + one diff


def user_operation(**fields: Any) -> dict[str, Any]:
    """A v0.7 operation in its RPC form (unsigned: a simulation does not need it signed)."""
    op = UserOperation(
        nonce=0,
        call_data=b"",
        call_gas_limit=100_000,
        verification_gas_limit=500_000,
        pre_verification_gas=50_000,
        max_fee_per_gas=10**9,
        max_priority_fee_per_gas=10**9,
        **fields,
    )
    return encode_user_operation(op, "0.7")


class HeadlessBlocksStub(MissingMethodsStub):
    """anvil behind a node whose block headers come without a hash (geth's pending block)."""

    def _refusal(self, call: Any) -> dict[str, Any] | None:
        if call.get("method") == "eth_getBlockByNumber":
            return {"jsonrpc": "2.0", "id": call.get("id"), "result": {"hash": None}}
        return super()._refusal(call)


async def test_a_traced_bundle_on_the_pending_block_and_unreadable_headers(
    nursery: trio.Nursery, start_gateway: StartGateway, devnet: Devnet
) -> None:
    """The pending block has no hash to pin a bundle to (geth answers null, anvil one it
    cannot trace on): each trace names it.  A header the node answers unreadably is the
    node's fault (-32000, REST 502), never a 500 nor a failed batch."""
    node, manifest = devnet
    tx = transfer(manifest)
    traced = await start_gateway([node.url], simulation={"engine": "trace_call"})
    pending = await traced.rpc("chaingate_simulateAssetChangesBundle", [[tx, tx], "pending"])
    assert [r["error"] for r in pending.get("result", [])] == [None, None], pending
    assert pending["result"][1]["changes"][0]["rawAmount"] == str(ETHER)
    headless = HeadlessBlocksStub(node.url, set())
    await nursery.start(headless.serve)
    handle = await start_gateway([headless.url], simulation={"engine": "trace_call"})
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
        {"jsonrpc": "2.0", "id": 2, "method": "alchemy_simulateAssetChangesBundle",
         "params": [[tx, tx]]},
    ]  # fmt: skip
    async with handle.client() as client:
        rest = await client.post(
            "/v1/simulate/ethereum", json={"kind": "asset_changes", "transactions": [tx, tx]}
        )
        replies = (await client.post("/v1/rpc/ethereum/devnet", json=batch)).json()
    assert rest.status_code == 502, rest.text
    assert "unreadable" in rest.json()["error"]["message"]
    assert replies[0]["result"] == "0x7a69"
    assert replies[1]["error"]["code"] == -32000, replies


async def test_simulations_need_rpc_read_and_are_metered_at_their_price(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    stack: AuthStack = await start_auth(nursery, impl, auth_settings(anvil, store_url, tmp_path))
    reader, _ = await stack.key(scopes="rpc:read")
    other, _ = await stack.key(scopes="data:read")
    a, b = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", "0x" + "22" * 20  # a funded one
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "alchemy_simulateAssetChanges",
        "params": [{"from": a, "to": b, "value": "0x5"}],
    }
    async with stack.client(other) as client:
        refused = await client.post(RPC, json=call)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == -32002
    async with stack.client(reader) as client:
        answered = (await client.post(RPC, json=call)).json()
        assert "result" in answered, answered
        assert answered["result"]["changes"][0]["rawAmount"] == "5"
        await stack.handle.gateway.usage_writer.flush()  # what was metered, written now
        report = (await client.get("/v1/usage", params={"granularity": "minute"})).json()
    rows = {row["method"]: row for row in report["usage"]}
    assert rows["alchemy_simulateAssetChanges"]["compute_units"] == 100  # methods.toml
    assert rows["alchemy_simulateAssetChanges"]["requests"] == 1


async def test_rest_simulate(start_gateway: StartGateway, devnet: Devnet, tmp_path: Path) -> None:
    handle = await start(start_gateway, devnet, tmp_path, max_bundle=2)
    _, manifest = devnet
    tx = transfer(manifest)
    path = "/v1/simulate/ethereum"
    async with handle.client() as client:
        bundle = await client.post(path, json={"kind": "asset_changes", "transactions": [tx, tx]})
        trace = await client.post(
            path, json={"kind": "execution", "transactions": [tx], "format": "NESTED"}
        )
        over = await client.post(path, json={"kind": "asset_changes", "transactions": [tx] * 3})
        wrong = await client.post(path, json={"kind": "execution", "transactions": [tx, tx]})
        no_chain = await client.post("/v1/simulate/bitcoin", json={"kind": "asset_changes"})
        by_rpc = await handle.rpc("chaingate_simulateAssetChangesBundle", [[tx, tx]])
    assert bundle.status_code == 200, bundle.text
    assert bundle.json() == {
        "network": "ethereum/devnet",
        "kind": "asset_changes",
        "results": by_rpc["result"],
    }
    nested = trace.json()["results"][0]["calls"][0]
    assert nested["logs"][0]["decoded"]["eventName"] == "Transfer"
    assert over.status_code == 400 and "max_bundle" in over.json()["error"]["message"]
    assert wrong.status_code == 400 and "exactly one" in wrong.json()["error"]["message"]
    assert no_chain.status_code == 404


async def test_rest_a_network_without_simulations_is_not_found_and_counted(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    handle = await start(start_gateway, devnet, tmp_path)
    service = handle.gateway.simulation
    del service.simulators["ethereum/devnet"]  # configured, but not simulated
    body = {"kind": "asset_changes", "transactions": [transfer(devnet[1])]}
    async with handle.client() as client:
        answer = await client.post("/v1/simulate/ethereum", json=body)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
    assert "not served for ethereum/devnet" in answer.json()["error"]["message"]
    method = "chaingate_simulateAssetChangesBundle"
    assert service.counts[("ethereum/devnet", method, "refused")] == 1


async def test_rest_bounds_have_their_statuses(
    start_gateway: StartGateway, devnet: Devnet, tmp_path: Path
) -> None:
    _, manifest = devnet
    body = {"kind": "asset_changes", "transactions": [airdrop(manifest)]}
    large = await start(start_gateway, devnet, tmp_path / "a", max_logs=1)
    slow = await start(start_gateway, devnet, tmp_path / "b", timeout=1e-6)
    answers: dict[str, httpx.Response] = {}
    for name, handle in (("large", large), ("slow", slow)):
        async with handle.client() as client:
            answers[name] = await client.post("/v1/simulate/ethereum", json=body)
    assert answers["large"].status_code == 422
    assert answers["large"].json()["error"]["code"] == "simulation_too_large"
    assert answers["slow"].status_code == 504
    assert answers["slow"].json()["error"]["code"] == "simulation_timeout"


def test_the_method_table_prices_every_simulation_method() -> None:
    """Each method the subsystem serves is in methods.toml as a local method (and the bundler's
    in bundler.toml): a new method cannot be served unpriced."""
    table = MethodTable.load(default_config_dir() / "methods.toml").family("evm")
    for method in METHODS:
        assert table[method].local and table[method].scope == "rpc:read", method
    costs = load_costs(default_config_dir() / "bundler.toml")
    for method in BUNDLER_METHODS:
        assert costs[method] == table[method].cu


async def test_the_dashboards_api_reference_shows_the_simulations(
    nursery: trio.Nursery, anvil: AnvilProcess, tmp_path: Path
) -> None:
    stack = await _stack(nursery, select(), anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    client = await signed_in(stack, "reference@example.com")
    async with aclosing(client):
        page = await client.get("/dashboard/reference")
    assert page.status_code == 200
    for name in METHODS:
        assert f"<code>{name}</code>" in page.text, name
    assert "/v1/simulate/{chain}" in page.text
    assert "[userOperation, entryPoint, block?, stateOverrides?]" in page.text


async def test_a_keys_contract_allowlist_holds_for_simulations_as_for_eth_call(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> None:
    stack = await start_auth(nursery, impl, auth_settings(anvil, store_url, tmp_path))
    listed, other = "0x" + "11" * 20, "0x" + "22" * 20
    key, _ = await restricted(stack, contracts=[listed])
    sender = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"  # anvil's funded first account
    answers = {}
    async with stack.client(key) as client:
        for name, to in (("listed", listed), ("other", other)):
            params = [{"from": sender, "to": to, "value": "0x1"}]
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "chaingate_simulateAssetChanges",
                "params": params,
            }
            answers[name] = (await client.post(RPC, json=body)).json()
        bundle = [{"from": sender, "to": listed}, {"from": sender, "to": other}]
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "alchemy_simulateAssetChangesBundle",
            "params": [bundle],
        }
        answers["bundle"] = (await client.post(RPC, json=body)).json()
        rest = await client.post(
            "/v1/simulate/ethereum-devnet",
            json={"kind": "execution", "transactions": [{"from": sender, "to": other}]},
        )
        ops = {
            "op sender": user_operation(sender=other),
            "op factory": user_operation(sender=listed, factory=other),
            "op paymaster": user_operation(sender=listed, paymaster=other),
        }
        for name, op in ops.items():
            body = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "alchemy_simulateUserOperationAssetChanges",
                "params": [op, CANONICAL_ENTRY_POINTS["0.7"]],
            }
            answers[name] = (await client.post(RPC, json=body)).json()
        body["params"] = [user_operation(sender=listed, factory=listed, paymaster=listed)]
        body["params"].append(CANONICAL_ENTRY_POINTS["0.7"])
        answers["op listed"] = (await client.post(RPC, json=body)).json()
    assert answers["listed"]["result"]["changes"][0]["to"] == listed
    assert answers["op listed"].get("error", {}).get("code") != -32002, answers["op listed"]
    for name in ("other", "bundle", *ops):
        assert answers[name]["error"]["code"] == -32002, answers[name]
        assert "contract allowlist" in answers[name]["error"]["message"]
    assert rest.status_code == 403, rest.text
    # The key's fault, not the node's: counted as refused, never as failed.
    counts = stack.handle.gateway.simulation.counts
    assert not any(outcome == "failed" for (_, _, outcome) in counts), counts
    assert sum(n for (_, _, outcome), n in counts.items() if outcome == "refused") == 6
