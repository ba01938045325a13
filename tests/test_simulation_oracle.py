"""Simulated == what the chain does: every scenario is simulated through chaingate and then sent
for real on anvil (tests/simulation_oracle.py), on both engines (eth_simulateV1 and
debug_traceCall), both stores and both framing twins.

The scenarios: every asset type (native currency, ERC-20, ERC-721, ERC-1155 single and batch,
mints) and every approval (ERC-20 ``Approval``, ERC-721 ``Approval`` and ``ApprovalForAll``,
ERC-1155 ``ApprovalForAll``); native currency moved between contracts by a forwarding contract
(tests/simulation_contracts/SimForwarder.sol), a transfer undone inside a reverted inner call;
a bundle whose second transaction spends what the first received; reverts of each kind
(``Error(string)``, ``Panic``, a custom error) decoded; and, by hypothesis, random transfer
sequences on the devnet's tokens simulated as one bundle.
"""

from __future__ import annotations

import io
import secrets
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.artifacts import Artifact
from chaingate.devnet.npm import cache_root
from chaingate.devnet.solc import compile_sources
from chaingate.evm import abi
from chaingate.gateway import Gateway
from chaingate.twins import Impl
from tests.conftest import IN_CI, StartGateway, make_settings
from tests.helpers import GatewayHandle
from tests.simulation_oracle import Chain, check_against_chain

ENGINES = ["simulate_v1", "trace_call"]
SOURCE = Path(__file__).parent / "simulation_contracts" / "SimForwarder.sol"
ETHER = 10**18
EXAMPLES = 40 if IN_CI else 12


class World:
    """The devnet with the forwarder deployed and players holding every kind of asset."""

    def __init__(self, node: AnvilProcess, manifest: Manifest, forwarder: Artifact) -> None:
        self.node = node
        self.manifest = manifest
        self.chain = Chain(node.url)
        self.players = [a.lower() for a in manifest.accounts[1:5]]
        self.token = manifest.address("erc20_cgt").lower()
        self.stable = manifest.address("erc20_cgusd").lower()
        self.nft = manifest.address("erc721_collection").lower()
        self.items = manifest.address("erc1155_items").lower()
        deployer = manifest.deployer
        receipt = self.chain.send(
            {"from": deployer, "data": "0x" + forwarder.bytecode.hex(), "value": "0x0"}
        )
        self.forwarder = receipt["contractAddress"].lower()
        self.nfts: dict[str, int] = {}
        for player in self.players:
            for token in (self.token, self.stable):
                self.chain.send(
                    call(deployer, token, "mint(address,uint256)", player, 1000 * ETHER)
                )
            minted = self.chain.send(call(deployer, self.nft, "mint(address,string)", player, "x"))
            self.nfts[player] = int(minted["logs"][0]["topics"][3], 16)
            for item in (1, 2, 3):
                signature = "mint(address,uint256,uint256,string)"
                self.chain.send(call(deployer, self.items, signature, player, item, 50, ""))


def call(sender: str, to: str, signature: str, *args: Any, value: int = 0) -> dict[str, Any]:
    tx: dict[str, Any] = {
        "from": sender,
        "to": to,
        "data": "0x" + abi.encode_call(signature, *args).hex(),
    }
    if value:
        tx["value"] = hex(value)
    return tx


@pytest.fixture(scope="module")
def world(module_devnet: tuple[AnvilProcess, Manifest]) -> World:
    node, manifest = module_devnet
    artifacts = compile_sources(
        {SOURCE.name: SOURCE.read_text()}, cache_root() / "tests", announce=lambda _: None
    )
    return World(node, manifest, artifacts["SimForwarder"])


def gateway_sections(world: World, engine: str, store_url: str, data_dir: Path) -> dict[str, Any]:
    manifest_path = data_dir / "manifest.json"
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_bytes(dumps(world.manifest))
    return {
        "network": {
            "manifest": str(manifest_path),
            "follower": {"enabled": True, "poll_interval": 0.05},
            "indexer": {"enabled": True},
        },
        "store": {"url": store_url},
        "simulation": {"engine": engine},
        "data_dir": str(data_dir),
    }


@pytest.fixture(params=ENGINES)
async def sim(
    request: pytest.FixtureRequest,
    world: World,
    start_gateway: StartGateway,
    store_url: str,
    tmp_path: Path,
) -> GatewayHandle:
    sections = gateway_sections(world, request.param, store_url, tmp_path / "gateway")
    handle = await start_gateway([world.node.url], **sections)
    # The tokens' facts known before the first simulation (a loaded machine may take longer to
    # probe them than a simulation waits).
    data = handle.gateway.data
    assert data is not None
    await data.metadata["ethereum/devnet"].tokens([world.token, world.nft], wait=30)
    return handle


async def simulate(handle: GatewayHandle, method: str, params: list[Any]) -> Any:
    reply = await handle.rpc(method, params)
    assert "result" in reply, reply
    return reply["result"]


async def test_every_asset_type_and_approval_as_the_chain_does_it(
    sim: GatewayHandle, world: World
) -> None:
    a, b, c, _ = world.players
    nft_a = world.nfts[a]
    cases: list[tuple[dict[str, Any], list[Any]]] = [
        ({"from": a, "to": b, "value": hex(3 * ETHER // 2)}, [("NATIVE", None, None, a)]),
        (call(a, world.token, "transfer(address,uint256)", b, 12 * ETHER), []),
        (call(a, world.token, "approve(address,uint256)", c, 5 * ETHER), []),
        (call(a, world.nft, "transferFrom(address,address,uint256)", a, b, nft_a), []),
        (call(a, world.nft, "approve(address,uint256)", c, nft_a), []),
        (call(a, world.nft, "setApprovalForAll(address,bool)", c, True), []),
        (
            call(
                a,
                world.items,
                "safeTransferFrom(address,address,uint256,uint256,bytes)",
                a,
                b,
                2,
                7,
                b"",
            ),
            [],
        ),
        (
            call(
                a,
                world.items,
                "safeBatchTransferFrom(address,address,uint256[],uint256[],bytes)",
                a,
                c,
                [1, 3],
                [4, 9],
                b"",
            ),
            [],
        ),
        (call(a, world.items, "setApprovalForAll(address,bool)", b, True), []),
        (call(world.manifest.deployer, world.token, "mint(address,uint256)", c, 77), []),
    ]
    seen: set[tuple[str, str]] = set()
    for tx, watch in cases:
        result = await simulate(sim, "chaingate_simulateAssetChanges", [tx])
        assert result["error"] is None, result
        assert result["changes"], tx
        seen.update((ch["assetType"], ch["changeType"]) for ch in result["changes"])
        check_against_chain(world.chain, [tx], [result], watch=watch)
    assert seen == {
        ("NATIVE", "TRANSFER"),
        ("ERC20", "TRANSFER"),
        ("ERC20", "APPROVE"),
        ("ERC721", "TRANSFER"),
        ("ERC721", "APPROVE"),
        ("ERC1155", "TRANSFER"),
        ("ERC1155", "APPROVE"),
    }


async def test_changes_carry_the_metadata_services_facts(sim: GatewayHandle, world: World) -> None:
    a, b, *_ = world.players
    tx = call(a, world.token, "transfer(address,uint256)", b, 3 * ETHER // 2)
    (change,) = (await simulate(sim, "chaingate_simulateAssetChanges", [tx]))["changes"]
    assert change == {
        "assetType": "ERC20",
        "changeType": "TRANSFER",
        "from": a,
        "to": b,
        "rawAmount": str(3 * ETHER // 2),
        "amount": "1.5",
        "contractAddress": world.token,
        "tokenId": None,
        "decimals": 18,
        "symbol": "CGT",
        "name": "Chaingate Token",
        "logo": None,
    }
    (nft,) = (
        await simulate(
            sim,
            "chaingate_simulateAssetChanges",
            [call(a, world.nft, "transferFrom(address,address,uint256)", a, b, world.nfts[a])],
        )
    )["changes"]
    assert nft["assetType"] == "ERC721" and nft["tokenId"] == hex(world.nfts[a])
    assert nft["decimals"] == 0 and nft["rawAmount"] == "1"
    native = await simulate(sim, "chaingate_simulateAssetChanges", [{"from": a, "to": b}])
    assert native["changes"] == [] and native["error"] is None  # no value moved, nothing to say


async def test_internal_native_transfers_through_a_forwarding_contract(
    sim: GatewayHandle, world: World
) -> None:
    a, b, c, d = world.players
    fwd = world.forwarder
    split = call(a, fwd, "split(address[])", [b, c, d], value=3 * ETHER + 2)
    result = await simulate(sim, "chaingate_simulateAssetChanges", [split])
    moves = [(ch["from"], ch["to"], int(ch["rawAmount"])) for ch in result["changes"]]
    assert moves == [(a, fwd, 3 * ETHER + 2), (fwd, b, ETHER), (fwd, c, ETHER), (fwd, d, ETHER)]
    check_against_chain(world.chain, [split], [result], watch=[("NATIVE", None, None, fwd)])
    # Half goes out; the inner call that sends one more wei reverts, and its transfer with it.
    undone = call(a, fwd, "forwardThenFail(address)", b, value=1000)
    result = await simulate(sim, "chaingate_simulateAssetChanges", [undone])
    assert [(ch["from"], ch["to"], ch["rawAmount"]) for ch in result["changes"]] == [
        (a, fwd, "1000"),
        (fwd, b, "500"),
    ]
    check_against_chain(world.chain, [undone], [result], watch=[("NATIVE", None, None, b)])
    # Tokens and native currency in one call, through an approval (an unlimited one: a spent
    # allowance shrinks without an event, so no log could tell what is left of a limited one).
    approve = call(a, world.token, "approve(address,uint256)", fwd, 2**256 - 1)
    pull = call(
        a, fwd, "pull(address,address,address,uint256)", world.token, a, c, 4 * ETHER, value=ETHER
    )
    both = await simulate(sim, "chaingate_simulateAssetChangesBundle", [[approve, pull]])
    kinds = [(ch["assetType"], ch["changeType"]) for ch in both[1]["changes"]]
    assert kinds == [("NATIVE", "TRANSFER"), ("ERC20", "TRANSFER"), ("NATIVE", "TRANSFER")]
    check_against_chain(world.chain, [approve, pull], both)


async def test_a_bundle_spends_what_its_first_transaction_received(
    sim: GatewayHandle, world: World
) -> None:
    a, b, *_ = world.players
    fresh = "0x" + secrets.token_hex(20)
    # Gas money for the real run (simulations charge none): the same before either runs.
    world.chain.rpc.call("anvil_setBalance", fresh, hex(ETHER))
    first = call(a, world.token, "transfer(address,uint256)", fresh, 100 * ETHER)
    second = call(fresh, world.token, "transfer(address,uint256)", b, 60 * ETHER)
    third = {"from": fresh, "to": b, "value": hex(ETHER // 2)}
    alone = await simulate(sim, "chaingate_simulateAssetChanges", [second])
    assert alone["error"]["revert"]["name"] == "InsufficientBalance"  # nothing to spend alone
    bundle = await simulate(
        sim, "alchemy_simulateAssetChangesBundle", [[first, second, third], "latest"]
    )
    assert [r["error"] for r in bundle] == [None, None, None]
    assert [ch["rawAmount"] for ch in bundle[1]["changes"]] == [str(60 * ETHER)]
    check_against_chain(
        world.chain,
        [first, second, third],
        bundle,
        watch=[("ERC20", world.token, None, fresh), ("NATIVE", None, None, fresh)],
    )


async def test_reverts_of_each_kind_move_nothing_and_say_why(
    sim: GatewayHandle, world: World
) -> None:
    a, b, *_ = world.players
    fwd = world.forwarder
    too_much = call(a, world.token, "transfer(address,uint256)", b, 10**30)
    cases = {
        "Error": call(a, fwd, "failString()", value=5),
        "Panic": call(a, fwd, "failPanic(uint256)", 0),
        "custom": call(a, fwd, "failCustom()"),
        "custom token": too_much,
    }
    errors = {}
    for name, tx in cases.items():
        result = await simulate(sim, "chaingate_simulateAssetChanges", [tx])
        assert result["changes"] == [], name  # the value sent with it did not move either
        check_against_chain(world.chain, [tx], [result], watch=[("NATIVE", None, None, a)])
        errors[name] = result["error"]
    assert errors["Error"]["revert"] == {
        "kind": "Error",
        "message": "SimForwarder: refused",
        "reason": "SimForwarder: refused",
    }
    assert errors["Error"]["message"] == "execution reverted: SimForwarder: refused"
    assert errors["Panic"]["revert"]["kind"] == "Panic" and errors["Panic"]["revert"]["code"] == 18
    assert "division or modulo by zero" in errors["Panic"]["message"]
    # Unknown to chaingate: its selector and data, nothing guessed.
    refused = abi.selector("Refused(uint256,address)")
    assert errors["custom"]["revert"] == {
        "kind": "custom",
        "message": errors["custom"]["data"],
        "selector": "0x" + refused.hex(),
    }
    assert bytes.fromhex(errors["custom"]["data"][2:]) == refused + abi.encode(
        ["uint256", "address"], [7, a]
    )
    # The devnet token's own error, known by name.
    assert errors["custom token"]["revert"]["name"] == "InsufficientBalance"
    assert errors["custom token"]["message"] == "execution reverted: InsufficientBalance()"


# --- random transfer sequences -------------------------------------------------------------

PLAYER = st.integers(0, 3)
SHARE = st.integers(0, 110)  # percent of the sender's balance: past 100 the transfer reverts
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("erc20"), st.sampled_from(["token", "stable"]), PLAYER, PLAYER, SHARE),
        st.tuples(st.just("native"), PLAYER, PLAYER, st.integers(0, 3 * ETHER)),
        st.tuples(st.just("nft"), PLAYER, PLAYER),
        st.tuples(st.just("item"), PLAYER, PLAYER, st.integers(1, 3), st.integers(0, 60)),
        st.tuples(st.just("approve"), PLAYER, PLAYER, st.integers(0, 10**20)),
    ),
    min_size=1,
    max_size=6,
)


def transaction(world: World, op: tuple[Any, ...]) -> dict[str, Any]:
    """The transaction an operation stands for (amounts from the state before the bundle, so
    a later transfer may spend more than is left: it reverts, in the simulation as for real)."""
    p = world.players
    if op[0] == "erc20":
        token = world.token if op[1] == "token" else world.stable
        held = world.chain.balance(("ERC20", token, None, p[op[2]]))
        return call(p[op[2]], token, "transfer(address,uint256)", p[op[3]], held * op[4] // 100)
    if op[0] == "native":
        return {"from": p[op[1]], "to": p[op[2]], "value": hex(op[3])}
    if op[0] == "nft":  # the sender's own token, which it may have given away already
        token_id = world.nfts[p[op[1]]]
        return call(
            p[op[1]],
            world.nft,
            "transferFrom(address,address,uint256)",
            p[op[1]],
            p[op[2]],
            token_id,
        )
    if op[0] == "item":
        held = world.chain.balance(("ERC1155", world.items, op[3], p[op[1]]))
        signature = "safeTransferFrom(address,address,uint256,uint256,bytes)"
        return call(
            p[op[1]], world.items, signature, p[op[1]], p[op[2]], op[3], held * op[4] // 40, b""
        )
    return call(p[op[1]], world.token, "approve(address,uint256)", p[op[2]], op[3])


@settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPERATIONS)
@pytest.mark.parametrize("engine", ENGINES)
async def test_random_transfer_sequences_simulate_exactly_as_they_run(
    world: World, impl: Impl, tmp_path: Path, engine: str, ops: list[tuple[Any, ...]]
) -> None:
    # Fixtures outlive examples: each example runs its own gateway in its own nursery.
    txs = [transaction(world, op) for op in ops]
    with tempfile.TemporaryDirectory(dir=tmp_path) as data_dir:
        settings_ = make_settings(
            [world.node.url], simulation={"engine": engine}, data_dir=str(data_dir)
        )
        gateway = Gateway(settings_, impl=impl)
        async with trio.open_nursery() as nursery:
            await nursery.start(gateway.run)
            handle = GatewayHandle(gateway, io.BytesIO())
            results = await simulate(handle, "chaingate_simulateAssetChangesBundle", [txs])
            gateway.shutdown()
    p = world.players
    watch: list[Any] = [("NATIVE", None, None, holder) for holder in p]
    watch += [
        (kind, t, None, h)
        for kind, t in (("ERC20", world.token), ("ERC20", world.stable))
        for h in p
    ]
    watch += [("ERC721", world.nft, world.nfts[owner], h) for owner in p for h in p]
    watch += [("ERC1155", world.items, item, h) for item in (1, 2, 3) for h in p]
    allowances = [("allowance", world.token, o, s) for o in p for s in p]
    check_against_chain(world.chain, txs, results, watch=watch, watch_approvals=allowances)
