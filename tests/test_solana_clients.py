"""Real Solana clients through chaingate, with an API key, against the devnet's Solana node.

solana-py (PyPI ``solana``, asyncio: it runs in a worker thread beside trio) and
``@solana/kit`` (npm, pinned, run with Node: ``tests/solana_kit.py``) move SOL and SPL tokens
through ``/v1/rpc/solana/devnet`` in front of ``chaingate.devnet.solana`` (LiteSVM behind
Solana's JSON-RPC: real programs, real signatures), and confirm what they send either by
polling ``getSignatureStatuses`` or by ``signatureSubscribe`` on ``/v1/ws/solana/devnet``.
Every flow checks its outcome on the node itself, not only through chaingate: balances, token
amounts and signature statuses.

The failover test puts two nodes behind one network (the same snapshot loaded twice: the same
accounts, the same blockhash per slot; two ledgers, so a transfer reaches a node only if
chaingate sends it there), kills the one the transfers reached in the middle of a read load and
of a run of transfers, and counts: no read fails, every transfer lands on the survivor exactly
once.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from solana.exceptions import SolanaRpcException
from solana.rpc.async_api import AsyncClient
from solana.rpc.commitment import Confirmed, Finalized, Processed
from solana.rpc.core import RPCException
from solana.rpc.models import MemcmpOpts
from solana.rpc.websocket_api import SolanaWsClient
from solders.commitment_config import CommitmentLevel
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.rpc.config import RpcContextConfig
from solders.rpc.requests import GetBalance, GetSlot, GetTokenAccountBalance, batch_to_json
from solders.rpc.responses import (
    AccountNotification,
    GetBalanceResp,
    GetSlotResp,
    GetTokenAccountBalanceResp,
    SignatureNotification,
    batch_from_json,
)
from solders.signature import Signature
from solders.system_program import CreateAccountParams, TransferParams, create_account, transfer
from solders.transaction import VersionedTransaction
from spl.token.constants import TOKEN_PROGRAM_ID
from spl.token.instructions import (
    create_associated_token_account,
    get_associated_token_address,
    initialize_mint2,
    mint_to,
    transfer_checked,
)
from spl.token.models import InitializeMint2Params, MintToParams, TransferCheckedParams

from chaingate import config
from chaingate.devnet.solana import snapshot
from chaingate.devnet.solana.ledger import Ledger
from chaingate.devnet.solana.server import Endpoints, serve
from chaingate.twins import Impl
from tests.solana_kit import run_kit
from tests.test_auth import AuthStack, keyed_settings, start_auth

SOL = 10**9
RPC = "/v1/rpc/solana/devnet"
WS = "/v1/ws/solana/devnet"
SLOT_SECONDS = 0.1
FINALIZED_DEPTH = 4
UNUSED_EVM = "http://127.0.0.1:1"  # make_settings' ethereum/devnet: never called here


# --- the stack: the node(s) in the test's nursery, chaingate with keys in front ---------------


@dataclass
class Node:
    """One devnet Solana node served in the test's nursery; ``kill`` drops it at once (its
    listener and every open connection closed, as when the process dies)."""

    urls: Endpoints
    scope: trio.CancelScope

    def kill(self) -> None:
        self.scope.cancel()


async def start_node(nursery: trio.Nursery, ledger: Ledger) -> Node:
    async def run(*, task_status: trio.TaskStatus[Node]) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                urls = await inner.start(partial(serve, ledger, slot_seconds=SLOT_SECONDS))
                task_status.started(Node(urls, scope))

    node: Node = await nursery.start(run)
    return node


def solana_settings(upstreams: list[Endpoints], tmp_path: Path) -> config.Settings:
    return keyed_settings(
        [UNUSED_EVM],
        f"sqlite://{tmp_path}/store.db",
        tmp_path,
        chains={
            "solana": {
                "devnet": {
                    "family": "solana",
                    "testnet": True,
                    "finality_depth": 0,  # the probe's getSlot is the finalized slot
                    "upstreams": [
                        {"url": urls.http, "ws_url": urls.ws, "name": f"node{i}"}
                        for i, urls in enumerate(upstreams)
                    ],
                }
            }
        },
    )


async def start_stack(
    nursery: trio.Nursery,
    impl: Impl,
    tmp_path: Path,
    upstreams: list[Endpoints],
    plan: str = "growth",
) -> tuple[AuthStack, str]:
    stack = await start_auth(nursery, impl, solana_settings(upstreams, tmp_path), io.BytesIO())
    key, _ = await stack.key(plan)
    return stack, key


async def one_node_stack(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> tuple[Ledger, Node, AuthStack, str]:
    """One node on a new ledger, chaingate in front of it with a growth key: (ledger, node,
    stack, key)."""
    ledger = Ledger(genesis_time=time.time(), finalized_depth=FINALIZED_DEPTH)
    node = await start_node(nursery, ledger)
    stack, key = await start_stack(nursery, impl, tmp_path, [node.urls])
    return ledger, node, stack, key


def in_asyncio(flow: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    """Run an asyncio coroutine function (solana-py's world) in a worker thread."""
    return trio.to_thread.run_sync(lambda: asyncio.run(flow()))


# --- solana-py building blocks ----------------------------------------------------------------


def client(url: str, key: str | None = None) -> AsyncClient:
    headers = {"X-API-Key": key} if key is not None else None
    return AsyncClient(url, commitment=Confirmed, timeout=10, extra_headers=headers)


async def confirmed(rpc: AsyncClient, signature: Signature) -> None:
    """Confirmed by polling getSignatureStatuses (solana-py's confirm_transaction), asserting
    the transaction succeeded."""
    statuses = await rpc.confirm_transaction(signature, Confirmed, sleep_seconds=0.05)
    [status] = statuses.value
    assert status is not None and status.err is None, status


async def send(rpc: AsyncClient, payer: Keypair, signers: list[Keypair], ixs: list[Any]) -> Any:
    blockhash = (await rpc.get_latest_blockhash(Confirmed)).value.blockhash
    tx = VersionedTransaction(Message.new_with_blockhash(ixs, payer.pubkey(), blockhash), signers)
    signature = (await rpc.send_transaction(tx)).value
    assert signature == tx.signatures[0]  # chaingate hands back the node's answer unchanged
    await confirmed(rpc, signature)
    return signature


async def airdrop(rpc: AsyncClient, who: Pubkey, lamports: int) -> None:
    await confirmed(rpc, (await rpc.request_airdrop(who, lamports)).value)


# --- solana-py through chaingate: SOL, an SPL mint, token accounts, filters, simulation --------


async def test_solana_py_through_chaingate(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> None:
    _, node, stack, key = await one_node_stack(nursery, impl, tmp_path)
    gateway = f"{stack.handle.base}{RPC}"
    outcome = await in_asyncio(lambda: _solana_py_flow(gateway, key, node.urls.http))
    # The batch, with solders' own request builders and parsers, the key in the URL this time.
    who = outcome["bob_ata"]
    confirmed = CommitmentLevel.Confirmed  # the default, finalized, trails these new accounts
    body = batch_to_json([GetSlot(id=0), GetBalance(outcome["bob"], RpcContextConfig(confirmed),
                          id=1), GetTokenAccountBalance(who, confirmed, id=2)])  # fmt: skip
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(f"{gateway}/{key}", content=body,
                                headers={"content-type": "application/json"})  # fmt: skip
    assert reply.status_code == 200, reply.text
    slot, balance, tokens = batch_from_json(
        reply.text, [GetSlotResp, GetBalanceResp, GetTokenAccountBalanceResp]
    )
    assert isinstance(slot, GetSlotResp) and slot.value >= outcome["slot"] - FINALIZED_DEPTH
    assert isinstance(balance, GetBalanceResp) and balance.value == outcome["bob_lamports"]
    assert isinstance(tokens, GetTokenAccountBalanceResp) and tokens.value.amount == "1250000"
    # No key, no answer: the gate is really in front of all of the above.
    async with httpx.AsyncClient(timeout=10) as http:
        refused = await http.post(gateway, json={"jsonrpc": "2.0", "id": 1, "method": "getSlot"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] < 0


async def _solana_py_flow(gateway: str, key: str, direct: str) -> dict[str, Any]:
    payer, bob, mint = Keypair(), Keypair(), Keypair()
    async with client(gateway, key) as rpc, client(direct) as node:
        assert await rpc.is_connected()
        assert (await rpc.get_genesis_hash()).value == (await node.get_genesis_hash()).value
        await airdrop(rpc, payer.pubkey(), 10 * SOL)
        assert (await rpc.get_balance(payer.pubkey())).value == 10 * SOL

        # SOL: a transfer, its fee, both balances, its status, its transaction.
        pay = transfer(
            TransferParams(from_pubkey=payer.pubkey(), to_pubkey=bob.pubkey(), lamports=SOL)
        )
        sent = await send(rpc, payer, [payer], [pay])
        assert (await node.get_balance(bob.pubkey())).value == SOL  # on the node itself
        assert (await rpc.get_balance(bob.pubkey())).value == SOL
        assert (await rpc.get_balance(payer.pubkey())).value == 9 * SOL - 5000
        [status] = (await rpc.get_signature_statuses([sent])).value
        assert status is not None and status.err is None and status.slot > 0
        got = (await rpc.get_transaction(sent, max_supported_transaction_version=0)).value
        assert got is not None and got.transaction.meta is not None
        assert got.transaction.meta.fee == 5000
        assert [entry.signature for entry in (await rpc.get_signatures_for_address(
            bob.pubkey())).value] == [sent]  # fmt: skip

        # An SPL mint, two associated token accounts, a mint to one, a transfer to the other.
        rent = (await rpc.get_minimum_balance_for_rent_exemption(82)).value
        payer_ata = get_associated_token_address(payer.pubkey(), mint.pubkey())
        bob_ata = get_associated_token_address(bob.pubkey(), mint.pubkey())
        await send(rpc, payer, [payer, mint], [
            create_account(CreateAccountParams(
                from_pubkey=payer.pubkey(), to_pubkey=mint.pubkey(), lamports=rent, space=82,
                owner=TOKEN_PROGRAM_ID,
            )),
            initialize_mint2(InitializeMint2Params(
                decimals=6, program_id=TOKEN_PROGRAM_ID, mint=mint.pubkey(),
                mint_authority=payer.pubkey(),
            )),
            create_associated_token_account(payer.pubkey(), payer.pubkey(), mint.pubkey()),
            create_associated_token_account(payer.pubkey(), bob.pubkey(), mint.pubkey()),
            mint_to(MintToParams(
                program_id=TOKEN_PROGRAM_ID, mint=mint.pubkey(), dest=payer_ata,
                mint_authority=payer.pubkey(), amount=5_000_000,
            )),
        ])  # fmt: skip
        moved = await send(rpc, payer, [payer], [
            transfer_checked(TransferCheckedParams(
                program_id=TOKEN_PROGRAM_ID, source=payer_ata, mint=mint.pubkey(),
                dest=bob_ata, owner=payer.pubkey(), amount=1_250_000, decimals=6,
            ))
        ])  # fmt: skip
        for reader in (rpc, node):
            mine = (await reader.get_token_account_balance(payer_ata)).value
            theirs = (await reader.get_token_account_balance(bob_ata)).value
            assert (mine.amount, theirs.amount, theirs.ui_amount_string) == (
                "3750000",
                "1250000",
                "1.25",
            )
        assert (await rpc.get_token_supply(mint.pubkey())).value.amount == "5000000"
        meta = (await rpc.get_transaction(moved)).value.transaction.meta
        assert meta is not None
        post = {b.owner: b.ui_token_amount.amount for b in meta.post_token_balances}
        assert post == {payer.pubkey(): "3750000", bob.pubkey(): "1250000"}

        # getProgramAccounts with filters: token accounts (165 bytes) of this mint, both.
        holders = await rpc.get_program_accounts(
            TOKEN_PROGRAM_ID,
            encoding="base64",
            filters=[165, MemcmpOpts(offset=0, bytes=str(mint.pubkey()))],
        )
        assert sorted(str(a.pubkey) for a in holders.value) == sorted(
            map(str, [payer_ata, bob_ata])
        )
        # ... and of this owner alone (the owner is at offset 32): bob's account only.
        bobs = await rpc.get_program_accounts(
            TOKEN_PROGRAM_ID,
            encoding="base64",
            filters=[165, MemcmpOpts(offset=32, bytes=str(bob.pubkey()))],
        )
        assert [a.pubkey for a in bobs.value] == [bob_ata]
        assert bytes(bobs.value[0].account.data)[:32] == bytes(mint.pubkey())

        # simulateTransaction: a transfer that would succeed, and one that cannot.
        blockhash = (await rpc.get_latest_blockhash()).value.blockhash
        fine = _transfer_tx(payer, bob.pubkey(), 7, blockhash)
        simulated = (
            await rpc.simulate_transaction(fine, sig_verify=True, accounts_addresses=[bob.pubkey()])
        ).value
        assert simulated.err is None and simulated.units_consumed
        assert simulated.accounts is not None and simulated.accounts[0].lamports == SOL + 7
        assert (await node.get_balance(bob.pubkey())).value == SOL  # a simulation moves nothing
        too_much = _transfer_tx(bob, payer.pubkey(), 50 * SOL, blockhash)
        failed = (await rpc.simulate_transaction(too_much)).value
        assert failed.err is not None and "InstructionError" in str(failed.err)
        assert any("insufficient lamports" in line for line in failed.logs or [])
        # Solana's own preflight failure, passed through unchanged.
        with pytest.raises((RPCException, SolanaRpcException)) as refused:
            await rpc.send_transaction(too_much)
        assert "custom program error: 0x1" in str(refused.value)
        assert (await node.get_balance(payer.pubkey())).value == (
            await rpc.get_balance(payer.pubkey(), Processed)
        ).value
        slot = (await rpc.get_slot(Processed)).value
        bob_lamports = (await node.get_balance(bob.pubkey())).value
    return {"bob": bob.pubkey(), "bob_ata": bob_ata, "slot": slot, "bob_lamports": bob_lamports}


def _transfer_tx(
    payer: Keypair, to: Pubkey, lamports: int, blockhash: Hash
) -> VersionedTransaction:
    ix = transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=to, lamports=lamports))
    message = Message.new_with_blockhash([ix], payer.pubkey(), blockhash)
    return VersionedTransaction(message, [payer])


async def test_solana_py_confirms_by_signature_subscribe(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> None:
    ledger, _, stack, key = await one_node_stack(nursery, impl, tmp_path)
    gateway = f"{stack.handle.base}{RPC}"
    ws = f"ws://127.0.0.1:{stack.handle.port}{WS}?apiKey={key}"
    payer, bob = Keypair(), Keypair()
    status = await in_asyncio(lambda: _subscribed_flow(gateway, ws, key, payer, bob.pubkey()))
    # The notification's slot is where the transfer is on the node, and it moved the lamports.
    signature, slot = status
    assert str(signature) in ledger.signatures
    assert ledger.signatures[str(signature)].slot == slot
    account = ledger.account(bob.pubkey(), ledger.head)
    assert account is not None and account.lamports == SOL


async def _subscribed_flow(
    gateway: str, ws_url: str, key: str, payer: Keypair, bob: Pubkey
) -> tuple[Signature, int]:
    async with client(gateway, key) as rpc, SolanaWsClient(ws_url) as ws:
        await airdrop(rpc, payer.pubkey(), 2 * SOL)
        await ws.account_subscribe(pubkey=bob, commitment=Confirmed)
        blockhash = (await rpc.get_latest_blockhash()).value.blockhash
        tx = _transfer_tx(payer, bob, SOL, blockhash)
        signature = (await rpc.send_transaction(tx)).value
        await ws.signature_subscribe(signature=signature, commitment=Confirmed)
        account = await _next(ws, AccountNotification)
        assert account.result.value.lamports == SOL
        status = await _next(ws, SignatureNotification)
        assert status.result.value.err is None
        [polled] = (await rpc.get_signature_statuses([signature])).value
        assert polled is not None and polled.slot == status.result.context.slot
        return signature, status.result.context.slot


async def _next(ws: SolanaWsClient, kind: type) -> Any:
    async with asyncio.timeout(10):
        while not isinstance(notification := await ws.recv(), kind):
            pass
    return notification


# --- @solana/kit (Node) through chaingate, the key in the URL ---------------------------------


@pytest.mark.parametrize("confirm", ["signatureSubscribe", "getSignatureStatuses"])
async def test_solana_kit_through_chaingate(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path, confirm: str
) -> None:
    _, node, stack, key = await one_node_stack(nursery, impl, tmp_path)
    url = f"{stack.handle.base}{RPC}/{key}"
    # signatureSubscribe: kit's own sendAndConfirmTransactionFactory over chaingate's
    # WebSocket; getSignatureStatuses: polled over HTTP.
    ws = f"ws://127.0.0.1:{stack.handle.port}{WS}?apiKey={key}"
    args = [url, ws if confirm == "signatureSubscribe" else "-"]
    got = await trio.to_thread.run_sync(run_kit, "solana_kit.mjs", args, tmp_path / "node")
    assert got["confirmedBy"] == confirm
    hubs = stack.handle.gateway.front.ws.solana_hubs.values()
    pushed = sum(hub.pushes for hub in hubs)
    # Through chaingate's WebSocket: its hub pushed kit the notifications it confirmed by.
    assert pushed > 0 if confirm == "signatureSubscribe" else pushed == 0
    assert got["airdropped"] == str(5 * SOL) and got["bobLamports"] == str(SOL)
    assert (got["bobTokens"], got["bobTokenOwner"]) == ("1250000", got["bob"])
    assert got["tokenBalance"]["amount"] == "1250000" and got["tokenBalance"]["decimals"] == 6
    assert got["holders"] == sorted([got["payerAta"], got["bobAta"]])
    # kit reads every JSON number as a bigint: the report has them as strings.
    assert got["simulatedErr"] == {"InstructionError": ["0", {"Custom": "1"}]}
    assert any("insufficient lamports" in line for line in got["simulatedLogs"])
    assert got["refusal"] is not None and "custom program error: 0x1" in str(got["refusal"])
    by_id = {item["id"]: item["result"] for item in got["batch"]}
    assert by_id[1]["value"] == SOL and by_id[2]["value"]["amount"] == "1250000"
    assert by_id[3] >= 1
    # What kit saw through chaingate is what the node holds.
    async with httpx.AsyncClient(timeout=10) as http:
        await _node_agrees(http, node.urls.http, got)


async def _node_agrees(http: httpx.AsyncClient, node: str, got: dict[str, Any]) -> None:
    async def result(method: str, *params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        return (await http.post(node, json=body)).json()["result"]

    confirmed = {"commitment": "confirmed"}
    assert (await result("getBalance", got["bob"], confirmed))["value"] == SOL
    fee = 5000
    payer = (await result("getBalance", got["payer"], confirmed))["value"]
    rent = await result("getMinimumBalanceForRentExemption", 82)
    ata_rent = await result("getMinimumBalanceForRentExemption", 165)
    # The airdrop, less one SOL, three fees (the mint's transaction has two signers) and rent.
    assert payer == 5 * SOL - SOL - fee - 2 * fee - fee - rent - 2 * ata_rent
    signatures = [got["transfer"], got["createMint"], got["tokenTransfer"]]
    statuses = (await result("getSignatureStatuses", signatures))["value"]
    assert all(s is not None and s["err"] is None for s in statuses), statuses
    amount = await result("getTokenAccountBalance", got["bobAta"], confirmed)
    assert amount["value"]["amount"] == "1250000"


# --- failover: two nodes behind one network, one killed mid-run ---------------------------------

READERS = 4
TRANSFERS = 12
KILL_AFTER = 5  # transfers confirmed before node 0 dies


@dataclass
class Tally:
    ok: int = 0
    failed: list[str] = field(default_factory=list)


def twin_ledgers(payer: Keypair) -> tuple[Ledger, Ledger]:
    """Two nodes of one cluster, as far as LiteSVM goes: one snapshot loaded twice gives the
    same accounts and, slot for slot, the same blockhashes (LiteSVM derives each from the
    last), so a transaction signed against either lands on both."""
    now = time.time()
    base = Ledger(genesis_time=now, finalized_depth=FINALIZED_DEPTH)
    base.airdrop(payer.pubkey(), 100 * SOL)
    data = snapshot.dumps(base)
    return snapshot.loads(data, now=now), snapshot.loads(data, now=now)


async def test_failover_reads_keep_answering_and_a_sent_transfer_lands_once(
    nursery: trio.Nursery, impl: Impl, tmp_path: Path
) -> None:
    payer = Keypair()
    ledgers = twin_ledgers(payer)
    nodes = [await start_node(nursery, ledger) for ledger in ledgers]
    # An unlimited plan: the read load is not to be throttled (a 429 would count as a failure).
    stack, key = await start_stack(
        nursery, impl, tmp_path, [n.urls for n in nodes], plan="enterprise"
    )
    gateway = f"{stack.handle.base}{RPC}"
    recipients = [Keypair().pubkey() for _ in range(TRANSFERS)]

    killed: list[int] = []

    def kill(last: Signature) -> None:
        """Kill the node the last transfer reached (node 0 if both have it): the one whose
        loss would lose transfers if chaingate had sent them to it alone."""
        victim = 0 if str(last) in ledgers[0].signatures else 1
        killed.append(victim)
        nodes[victim].kill()

    reads, sent = await in_asyncio(
        lambda: _under_load(
            gateway, key, payer, recipients, lambda last: trio.from_thread.run_sync(kill, last)
        )
    )
    assert reads.failed == [] and reads.ok > 50, (reads.ok, reads.failed[:5])
    assert len(sent) == TRANSFERS and len(killed) == 1
    survivor = ledgers[1 - killed[0]]
    # The node killed held the transfers sent before: had they gone to it alone, they were lost.
    assert all(str(s) in ledgers[killed[0]].signatures for s in sent[:KILL_AFTER])
    assert not any(str(s) in ledgers[killed[0]].signatures for s in sent[KILL_AFTER:])
    async with httpx.AsyncClient(timeout=10) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "getSignatureStatuses",
                "params": [[str(s) for s in sent], {"searchTransactionHistory": True}]}  # fmt: skip
        statuses = (await http.post(nodes[1 - killed[0]].urls.http, json=body)).json()
    statuses = statuses["result"]["value"]
    # Every transfer on the surviving node, each exactly once: its status, and each recipient
    # holding exactly what was sent to it (a second landing would be refused as a duplicate
    # or, re-signed, show twice in the balance).
    assert all(s is not None and s["err"] is None for s in statuses), statuses
    for index, who in enumerate(recipients):
        account = survivor.account(who, survivor.head)
        assert account is not None and account.lamports == _amount(index), index
        assert len(survivor.by_address.get(who, [])) == 1, index
    fees = 5000 * TRANSFERS
    payer_account = survivor.account(payer.pubkey(), survivor.head)
    assert payer_account is not None
    assert payer_account.lamports == 100 * SOL - fees - sum(map(_amount, range(TRANSFERS)))


def _amount(index: int) -> int:
    return SOL // 100 + index  # above the rent-exempt minimum of an empty account


async def _under_load(
    gateway: str,
    key: str,
    payer: Keypair,
    recipients: list[Pubkey],
    kill: Callable[[Signature], None],
) -> tuple[Tally, list[Signature]]:
    reads = Tally()
    stop = asyncio.Event()

    async def reader(rpc: AsyncClient, index: int) -> None:
        while not stop.is_set():
            try:
                if index % 2:
                    assert (await rpc.get_balance(payer.pubkey(), Processed)).value > 0
                else:
                    assert (await rpc.get_slot(Processed)).value > 0
                reads.ok += 1
            except Exception as exc:  # a failed read is what this test counts
                reads.failed.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.005)

    sent: list[Signature] = []
    async with client(gateway, key) as rpc:
        tasks = [asyncio.create_task(reader(rpc, i)) for i in range(READERS)]
        try:
            for index, who in enumerate(recipients):
                if index == KILL_AFTER:
                    kill(sent[-1])
                # A finalized blockhash: both nodes know it whatever slot each is at.
                blockhash = (await rpc.get_latest_blockhash(Finalized)).value.blockhash
                tx = _transfer_tx(payer, who, _amount(index), blockhash)
                signature = (await rpc.send_transaction(tx)).value
                assert signature == tx.signatures[0]  # one answer, whatever nodes it reached
                await confirmed(rpc, signature)
                sent.append(signature)
            await asyncio.sleep(0.5)  # reads go on a moment on the survivor alone
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    return reads, sent
