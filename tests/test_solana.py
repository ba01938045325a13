"""Solana networks through chaingate's request pipeline, against the devnet's real Solana node
(``chaingate.devnet.solana``: LiteSVM behind Solana's JSON-RPC), both twins.

Two RPC nodes of one cluster are two servers over one ledger (``SolanaNode``): they see the
same chain, as a provider's nodes do, and either can be taken down mid-run.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.system_program import TransferParams, transfer
from solders.transaction import Transaction

from chaingate import config
from chaingate.auth.gate import ANONYMOUS
from chaingate.config.network import Network
from chaingate.devnet.anvil import free_port
from chaingate.devnet.npm import cache_root
from chaingate.devnet.solana import devstate, server
from chaingate.devnet.solana.ledger import Ledger
from chaingate.rpc.service import RpcService
from chaingate.twins import Impl
from tests.conftest import StartGateway
from tests.helpers import GatewayHandle, read_dev_banner
from tests.test_auth import keyed_settings, start_auth

SOL = 10**9
SLOT_SECONDS = 0.05
URL = "/v1/rpc/solana/devnet"
ROOT = Path(__file__).resolve().parents[1]
TOKEN_PROGRAM = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA"


class SolanaNode:
    """One RPC node of the cluster: the ledger served on a port of its own until ``stop``."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.scope = trio.CancelScope()
        self.url = ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                endpoints = await nursery.start(
                    functools.partial(server.serve, self.ledger, slot_seconds=None)
                )
                self.url = endpoints.http
                task_status.started()

    def stop(self) -> None:
        self.scope.cancel()


async def cluster(nursery: trio.Nursery, nodes: int) -> tuple[Ledger, list[SolanaNode]]:
    """A ledger whose slots advance every SLOT_SECONDS, served by ``nodes`` RPC nodes."""
    ledger = Ledger(genesis_time=time.time(), confirmed_depth=1, finalized_depth=3)
    nursery.start_soon(server.run_clock, ledger, SLOT_SECONDS)
    served = []
    for _ in range(nodes):
        node = SolanaNode(ledger)
        await nursery.start(node.run)
        served.append(node)
    return ledger, served


def solana_network(nodes: list[SolanaNode], *, testnet: bool = True) -> dict[str, Any]:
    return {
        "family": "solana",
        "testnet": testnet,
        "finality_depth": 0,
        "block_time": SLOT_SECONDS,
        "max_head_lag": 64,
        "upstreams": [{"url": node.url, "name": f"node{i}"} for i, node in enumerate(nodes)],
    }


async def gateway_for(
    start_gateway: StartGateway, nodes: list[SolanaNode], **sections: Any
) -> GatewayHandle:
    chains = {"solana": {"devnet": solana_network(nodes)}}
    chains["solana"].update(sections.pop("networks", {}))
    return await start_gateway(["http://127.0.0.1:1"], chains=chains, **sections)


def service_of(gw: GatewayHandle, network: str = "devnet") -> RpcService:
    service: RpcService = gw.gateway.chain.services[Network("solana", network, "solana")]
    return service


def call(method: str, *params: Any, id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": list(params)}


async def rpc(client: httpx.AsyncClient, method: str, *params: Any) -> tuple[Any, str]:
    """(reply, X-Cache) of one call through chaingate."""
    response = await client.post(URL, json=call(method, *params))
    assert response.status_code == 200, response.text
    return response.json(), response.headers.get("x-cache", "")


async def result_of(client: httpx.AsyncClient, method: str, *params: Any) -> Any:
    reply, _ = await rpc(client, method, *params)
    assert "result" in reply, reply
    return reply["result"]


async def signed_transfer(
    client: httpx.AsyncClient, payer: Keypair, to: Pubkey, lamports: int
) -> str:
    """A transfer signed on the latest blockhash chaingate reports, base64."""
    latest = await result_of(client, "getLatestBlockhash", {"commitment": "processed"})
    blockhash = Hash.from_string(latest["value"]["blockhash"])
    ix = transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=to, lamports=lamports))
    tx = Transaction([payer], Message([ix], payer.pubkey()), blockhash)
    return base64.b64encode(bytes(tx)).decode()


def funded(ledger: Ledger, lamports: int = 10 * SOL) -> Keypair:
    payer = Keypair()
    ledger.airdrop(payer.pubkey(), lamports)
    return payer


async def one_node_gateway(
    nursery: trio.Nursery, start_gateway: StartGateway
) -> tuple[Ledger, Keypair, GatewayHandle, RpcService]:
    """A one-node cluster, a funded payer and a gateway in front: (ledger, payer, gateway, its
    solana/devnet service)."""
    ledger, nodes = await cluster(nursery, 1)
    payer = funded(ledger)
    gw = await gateway_for(start_gateway, nodes)
    return ledger, payer, gw, service_of(gw)


def landed(ledger: Ledger, signature: str) -> int:
    """How many blocks hold the transaction."""
    return sum(
        1
        for block in ledger.blocks.values()
        for executed in block.transactions
        if executed.signature == signature
    )


async def wait_until(check: Any, limit: float = 10.0) -> None:
    with trio.fail_after(limit):
        while not check():
            await trio.sleep(0.02)


async def node_direct(url: str, body: Any) -> Any:
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.post(url, json=body)).json()


def test_a_solana_network_gets_its_familys_defaults_unless_it_sets_them() -> None:
    def network(**fields: Any) -> Any:
        upstream = {"url": "http://127.0.0.1:8899"}
        solana = {"family": "solana", "upstreams": [upstream], **fields}
        evm = {"upstreams": [upstream]}
        data = {"chains": {"solana": {"mainnet": solana}, "ethereum": {"mainnet": evm}}}
        chains = config.from_mapping(data, environ={}).chains
        return chains["solana"]["mainnet"], chains["ethereum"]["mainnet"]

    solana, evm = network()
    assert (solana.finality_depth, solana.block_time, solana.max_head_lag) == (0, 0.4, 128)
    assert (evm.finality_depth, evm.block_time, evm.max_head_lag) == (64, 12.0, 5)
    solana, _ = network(finality_depth=32, max_head_lag=50)
    assert (solana.finality_depth, solana.block_time, solana.max_head_lag) == (32, 0.4, 50)


# --- reads, errors, batches --------------------------------------------------------------


async def test_reads_reach_the_node_and_its_errors_come_back_unchanged(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, nodes = await cluster(nursery, 1)
    alice = funded(ledger, 3 * SOL)
    gw = await gateway_for(start_gateway, nodes)
    service = service_of(gw)
    async with gw.client() as client:
        balance = await result_of(
            client, "getBalance", str(alice.pubkey()), {"commitment": "processed"}
        )
        assert balance["value"] == 3 * SOL
        # An EVM method is not a Solana one: -32601, never forwarded.
        evm, _ = await rpc(client, "eth_blockNumber")
        assert evm["error"]["code"] == -32601
        assert service.stats["eth_blockNumber"].ok == 0
        # The genesis hash never changes: cached from the first answer, honestly labelled.
        first, second = [await rpc(client, "getGenesisHash") for _ in range(2)]
        assert (first[1], second[1]) == ("MISS", "HIT")
        assert first[0]["result"] == second[0]["result"] == ledger.genesis_hash
        # The node's own error (-32016, minContextSlot not reached), byte for byte its own.
        ahead = call("getBalance", str(alice.pubkey()), {"minContextSlot": 10**9})
        proxied = (await client.post(URL, json=ahead)).json()
        direct = await node_direct(nodes[0].url, ahead)
        assert proxied["error"]["code"] == -32016
        # (the slot moves on between the two calls)
        proxied_slot = proxied["error"]["data"].pop("contextSlot")
        assert proxied_slot <= direct["error"]["data"].pop("contextSlot")
        assert proxied["error"] == direct["error"]
        # A preflight failure (-32002, with the simulation in data) passes through too.
        broke = Keypair()
        tx = await signed_transfer(client, broke, alice.pubkey(), 1)
        refused, _ = await rpc(client, "sendTransaction", tx, {"encoding": "base64"})
        assert refused["error"]["code"] == -32002
        assert refused["error"]["data"]["err"] == "AccountNotFound"
        # A slot that is not one: -32602 from chaingate, in Solana's words, never forwarded.
        bad, _ = await rpc(client, "getBlock", "5")
        assert bad["error"] == {
            "code": -32602,
            "message": "invalid params: the slot must be a non-negative integer",
        }
        assert service.stats["getBlock"].ok == 0
        # A batch: each reply in place, the unknown method refused by chaingate alone.
        batch = [call("getSlot", id=1), call("eth_chainId", id=2), call("getHealth", id=3)]
        replies = (await client.post(URL, json=batch)).json()
        assert [reply["id"] for reply in replies] == [1, 2, 3]
        assert isinstance(replies[0]["result"], int)
        assert replies[1]["error"]["code"] == -32601
        assert replies[2]["result"] == "ok"
    # The pool's head is the finalized slot (the probe's getSlot at the default commitment).
    await wait_until(lambda: (service.pool.head or -1) >= 3)
    assert service.pool.head is not None
    assert service.pool.head <= ledger.slot("finalized")


# --- the commitment-aware cache ----------------------------------------------------------


async def test_only_finalized_blocks_and_transactions_are_cached(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, payer, gw, service = await one_node_gateway(nursery, start_gateway)
    async with gw.client() as client:
        tx = await signed_transfer(client, payer, Keypair().pubkey(), SOL // 100)
        signature = await result_of(client, "sendTransaction", tx, {"encoding": "base64"})
        slot = ledger.signatures[signature].slot
        # Before it is final: a confirmed read answers, and is never cached.
        confirmed = {"commitment": "confirmed"}
        await wait_until(lambda: ledger.slot("confirmed") >= slot)
        seen = [await rpc(client, "getTransaction", signature, confirmed) for _ in range(2)]
        assert [cache for _, cache in seen] == ["MISS", "MISS"]
        assert seen[0][0]["result"]["slot"] == slot
        # Once the pool's finalized slot passes it: a miss, then hits with the same bytes.
        await wait_until(lambda: (service.pool.head or -1) >= slot)
        for method, params in [
            ("getTransaction", (signature,)),
            ("getTransaction", (signature, {"encoding": "base64"})),
            ("getBlock", (slot,)),
            ("getBlockTime", (slot,)),
        ]:
            first, second = [await rpc(client, method, *params) for _ in range(2)]
            assert (first[1], second[1]) == ("MISS", "HIT"), (method, params)
            assert first[0] == second[0]
        block = (await rpc(client, "getBlock", slot))[0]["result"]
        assert signature in [t["transaction"]["signatures"][0] for t in block["transactions"]]
        # The same block asked at confirmed: answered, never cached.
        again = [await rpc(client, "getBlock", slot, confirmed) for _ in range(2)]
        assert [cache for _, cache in again] == ["MISS", "MISS"]
        assert again[0][0]["result"]["blockhash"] == block["blockhash"]
        # A block above the finalized slot: read at confirmed, answered, never cached.
        recent = ledger.slot("confirmed")
        above = [await rpc(client, "getBlock", recent, confirmed) for _ in range(2)]
        assert [cache for _, cache in above] == ["MISS", "MISS"]
        assert "result" in above[0][0]
        # A balance can always change.
        balances = [await rpc(client, "getBalance", str(payer.pubkey())) for _ in range(2)]
        assert [cache for _, cache in balances] == ["MISS", "MISS"]
        # A batch: the cached calls hit, the others go to the node (PARTIAL).
        mixed = [call("getBlock", slot, id=1), call("getSlot", id=2)]
        response = await client.post(URL, json=mixed)
        assert response.headers["x-cache"] == "PARTIAL"
        assert response.json()[0]["result"] == block


async def test_identical_reads_in_flight_share_one_node_call(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    _, alice, gw, service = await one_node_gateway(nursery, start_gateway)
    body = call("getBalance", str(alice.pubkey()), {"commitment": "processed"})
    answers: list[Any] = []

    async def ask(client: httpx.AsyncClient) -> None:
        answers.append((await client.post(URL, json=body)).json())

    before = service.coalesced
    async with gw.client() as client, trio.open_nursery() as askers:
        for _ in range(40):
            askers.start_soon(ask, client)
    assert all(answer["result"]["value"] == 10 * SOL for answer in answers)
    assert service.coalesced > before  # some joined a call already in flight


# --- writes: broadcast, once; the faucet on test networks only --------------------------


async def test_a_transaction_goes_to_every_node_lands_once_and_is_metered_once(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, nodes = await cluster(nursery, 2)
    payer = funded(ledger)
    # Probes once at the start, then not for a minute: every request a node counts is ours.
    gw = await gateway_for(start_gateway, nodes, rpc={"probe_interval": 60})
    service = service_of(gw)
    upstreams = service.pool.upstreams
    await wait_until(lambda: all(u.health.requests >= 1 for u in upstreams))
    async with gw.client() as client:
        tx = await signed_transfer(client, payer, Keypair().pubkey(), SOL // 100)
        later = await signed_transfer(client, payer, Keypair().pubkey(), SOL // 50)
        before = [u.health.requests for u in upstreams]
        reply, _ = await rpc(client, "sendTransaction", tx, {"encoding": "base64"})
    signature = reply["result"]
    # Both nodes were sent it (the second said it had already processed it).
    await wait_until(lambda: [u.health.requests for u in upstreams] == [n + 1 for n in before])
    assert landed(ledger, signature) == 1
    assert (service.stats["sendTransaction"].ok, service.stats["sendTransaction"].error) == (1, 0)
    # The handler's own usage: one call, its units once.
    answered = await service.handle(
        json.dumps(call("sendTransaction", later, {"encoding": "base64"})).encode(), ANONYMOUS
    )
    assert answered.body is not None
    second = json.loads(answered.body)["result"]
    assert answered.usage == [("sendTransaction", 1, 20, 0)]
    await wait_until(lambda: [u.health.requests for u in upstreams] == [n + 2 for n in before])
    assert landed(ledger, second) == 1


async def test_reads_fail_over_and_a_send_lands_once_when_a_node_dies(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, nodes = await cluster(nursery, 2)
    payer = funded(ledger)
    gw = await gateway_for(start_gateway, nodes)
    failed: list[Any] = []
    async with gw.client() as client:
        for i in range(120):
            if i == 40:
                nodes[0].stop()  # mid-run: its connections drop, its port closes
            reply, _ = await rpc(client, "getBalance", str(payer.pubkey()))
            if "result" not in reply:
                failed.append(reply)
        assert failed == []
        tx = await signed_transfer(client, payer, Keypair().pubkey(), SOL // 100)
        signature = await result_of(client, "sendTransaction", tx, {"encoding": "base64"})
    assert landed(ledger, signature) == 1
    down = [u.name for u in service_of(gw).pool.upstreams if u.health.state_down]
    assert down == ["node0"]


async def test_a_node_behind_by_slots_is_ranked_last(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, nodes = await cluster(nursery, 2)
    payer = funded(ledger)
    # A third node stuck at its genesis slot: a node that stopped following the cluster.
    stuck = SolanaNode(Ledger(genesis_time=time.time()))
    await nursery.start(stuck.run)
    await wait_until(lambda: ledger.slot("finalized") > 40)
    network = {**solana_network([*nodes, stuck]), "max_head_lag": 10}
    gw = await start_gateway(["http://127.0.0.1:1"], chains={"solana": {"devnet": network}})
    pool = service_of(gw).pool
    behind = pool.upstreams[2]
    await wait_until(lambda: behind.health.lag > 10)
    assert [u.name for u in pool.ranked()][-1] == "node2"
    assert not behind.health.state_down  # behind, not broken: still a last resort
    async with gw.client() as client:
        for _ in range(20):
            reply, _ = await rpc(
                client, "getBalance", str(payer.pubkey()), {"commitment": "processed"}
            )
            assert reply["result"]["value"] == 10 * SOL  # never the stuck node's answer (0)


async def test_the_faucet_answers_on_test_networks_only(
    start_gateway: StartGateway, nursery: trio.Nursery
) -> None:
    ledger, nodes = await cluster(nursery, 1)
    mainnet = {"mainnet": solana_network(nodes, testnet=False)}
    gw = await gateway_for(start_gateway, nodes, networks=mainnet)
    alice = Keypair().pubkey()
    async with gw.client() as client:
        refused = (
            await client.post(
                "/v1/rpc/solana/mainnet", json=call("requestAirdrop", str(alice), SOL)
            )
        ).json()
        signature = await result_of(client, "requestAirdrop", str(alice), SOL)
    assert refused["error"]["code"] == -32601
    assert "requestAirdrop" in refused["error"]["message"]
    assert service_of(gw, "mainnet").stats["requestAirdrop"].ok == 0
    assert ledger.signatures[signature].post_balances[1] == SOL
    assert landed(ledger, signature) == 1


async def test_keys_scopes_and_usage_work_on_solana_as_on_evm(
    nursery: trio.Nursery, impl: Impl, store_url: str, tmp_path: Path
) -> None:
    ledger, nodes = await cluster(nursery, 2)
    payer = funded(ledger)
    settings = keyed_settings(
        ["http://127.0.0.1:1"],
        store_url,
        tmp_path,
        chains={"solana": {"devnet": solana_network(nodes)}},
    )
    stack = await start_auth(nursery, impl, settings)
    reader, _ = await stack.key(scopes="rpc:read")
    writer, _ = await stack.key(scopes="rpc:read,rpc:write")
    async with stack.client(reader) as client:
        latest = await result_of(client, "getLatestBlockhash", {"commitment": "processed"})
        blockhash = Hash.from_string(latest["value"]["blockhash"])
        ix = transfer(
            TransferParams(from_pubkey=payer.pubkey(), to_pubkey=Keypair().pubkey(), lamports=SOL)
        )
        tx = base64.b64encode(bytes(Transaction([payer], Message([ix], payer.pubkey()), blockhash)))
        send = call("sendTransaction", tx.decode(), {"encoding": "base64"})
        # chaingate's refusal, shaped as on EVM: -32002 with the HTTP status, 403.
        refused = await client.post(URL, json=send)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == -32002 and error["data"]["status"] == 403
    assert "rpc:write" in error["message"]
    async with stack.client(writer) as client:
        sent = (await client.post(URL, json=send)).json()
        await client.post(URL, json=call("getProgramAccounts", TOKEN_PROGRAM))
        await trio.sleep(0.6)  # the usage writer flushes every 0.2 s here
        report = (await client.get("/v1/usage", params={"granularity": "minute"})).json()
    assert landed(ledger, sent["result"]) == 1
    rows = {row["method"]: row for row in report["usage"]}
    # Sent to both nodes, metered once.
    assert (rows["sendTransaction"]["requests"], rows["sendTransaction"]["compute_units"]) == (
        1,
        20,
    )
    # No token account yet: an answer of two bytes ("[]"), one started KiB on top of 20.
    assert rows["getProgramAccounts"]["compute_units"] == 21


# --- getProgramAccounts: priced by its answer, bounded ----------------------------------


async def test_program_accounts_are_priced_by_their_size_and_bounded(
    start_gateway: StartGateway, nursery: trio.Nursery, tmp_path: Path
) -> None:
    ledger, nodes = await cluster(nursery, 1)
    keys = [Keypair() for _ in range(3)]
    devstate.bootstrap(ledger, keys, Keypair(), time.time())  # a mint, three token accounts
    table = (ROOT / "config" / "methods.toml").read_text()
    bounded = re.sub(r"max_bytes = \d+", "max_bytes = 1000", table)
    assert bounded != table
    methods = tmp_path / "methods.toml"
    methods.write_text(bounded)
    gw = await gateway_for(start_gateway, nodes, rpc={"methods_file": str(methods)})
    service = service_of(gw)
    everything = call("getProgramAccounts", TOKEN_PROGRAM, {"encoding": "base64"})
    mint_only = call(
        "getProgramAccounts", TOKEN_PROGRAM, {"encoding": "base64", "filters": [{"dataSize": 82}]}
    )
    async with gw.client() as client:
        over = (await client.post(URL, json=everything)).json()
        fits = (await client.post(URL, json=mint_only)).json()
        batch = (
            await client.post(URL, json=[{**mint_only, "id": 7}, {**everything, "id": 8}])
        ).json()
    direct = await node_direct(nodes[0].url, everything)
    assert len(json.dumps(direct["result"])) > 1000  # the node would have sent it all
    assert over["error"]["code"] == -32005
    assert over["error"]["data"] == {"reason": "answer_too_large", "limit": 1000}
    assert len(fits["result"]) == 1 and fits["result"][0]["account"]["space"] == 82
    assert [reply["id"] for reply in batch] == [7, 8]
    assert batch[0]["result"] == fits["result"] and batch[1]["error"]["code"] == -32005
    # Priced: 20 units, plus one per started KiB of the answer.
    answered = await service.handle(json.dumps(mint_only).encode(), ANONYMOUS)
    assert answered.body is not None
    size = len(json.dumps(json.loads(answered.body)["result"], separators=(",", ":")))
    assert answered.usage == [("getProgramAccounts", 1, 20 + -(-size // 1024), 0)]
    assert service.refused["answer_too_large"] >= 2


# --- chaingate dev serves solana/devnet ---------------------------------------------------


def _dev(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_DATA_HOME=str(tmp_path / "home" / "share"),
        CHAINGATE_CACHE_DIR=str(cache_root()),
        PYTHONUNBUFFERED="1",
    )
    argv = [sys.executable, "-m", "chaingate", "dev", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data")]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _banner(process: subprocess.Popen[str]) -> str:
    text = read_dev_banner(process, limit=120)
    assert "chaingate dev is up." in text, text
    return text


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        assert process.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def _solana_lines(text: str) -> list[str]:
    """The banner's Solana curl lines, as a shell would run them."""
    section = text.split("\nSolana:\n", 1)[1]
    commands = re.findall(r"(curl -s \S+/v1/rpc/solana/devnet.*?-d '[^']*')", section, re.DOTALL)
    return [command.replace("\\\n", " ") for command in commands]


def _run(command: str) -> Any:
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=15)
    return json.loads(done.stdout)


def test_chaingate_dev_serves_solana_devnet_and_resumes_it(tmp_path: Path) -> None:
    port = free_port()
    process = _dev(tmp_path, port)
    try:
        text = _banner(process)
        manifest = devstate.load_manifest(tmp_path / "data")
        first = manifest.accounts[0]
        assert first.pubkey in text and manifest.mint.address in text
        balance_line, token_line, slot_line = _solana_lines(text)
        assert "X-API-Key: svc_test_" in balance_line
        balance = _run(balance_line)["result"]["value"]
        assert 0 < balance <= first.lamports  # funded (the mint's rent and fees came out of it)
        tokens = _run(token_line)["result"]["value"]
        assert (tokens["amount"], tokens["decimals"]) == (str(first.tokens), 6)
        slot = _run(slot_line)["result"]
        # The key in the URL, as the banner prints it, for clients that take only a URL.
        keyed = re.search(r"^ {12}(http://\S+/v1/rpc/solana/devnet/svc_test_\S+)$", text, re.M)
        assert keyed, text
        by_url = httpx.post(keyed.group(1), json=call("getGenesisHash"), timeout=10).json()
        assert by_url["result"] == manifest.genesis_hash
        keypair = Keypair.from_json(Path(first.keypair_file).read_text())
        assert str(keypair.pubkey()) == first.pubkey
    finally:
        _stop(process)
    saved = tmp_path / "data" / "solana" / devstate.LEDGER_FILE
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600  # the faucet's key is in it
    again = _dev(tmp_path, port)
    try:
        text = _banner(again)
        assert "solana: continuing the ledger saved in" in text
        assert devstate.load_manifest(tmp_path / "data").mint == manifest.mint
        balance_line, _, slot_line = _solana_lines(text)
        assert _run(balance_line)["result"]["value"] == balance
        assert _run(slot_line)["result"] > slot
    finally:
        _stop(again)
    assert "Traceback" not in text
