"""The devnet's local Solana node (chaingate.devnet.solana): slots and commitments driven by
hand through the JSON-RPC layer, then solana-py (a client nobody here wrote) over HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from solana.exceptions import SolanaRpcException
from solana.rpc.async_api import AsyncClient
from solana.rpc.commitment import Confirmed, Finalized, Processed
from solana.rpc.core import RPCException
from solana.rpc.models import DataSliceOpts, MemcmpOpts, TokenAccountOpts
from solana.rpc.websocket_api import SolanaWsClient
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import Message, MessageV0
from solders.pubkey import Pubkey
from solders.rpc.config import RpcTransactionLogsFilterMentions
from solders.rpc.requests import (
    GetBalance,
    GetSlot,
    GetVersion,
    IsBlockhashValid,
    batch_to_json,
)
from solders.rpc.responses import (
    AccountNotification,
    GetBalanceResp,
    GetSlotResp,
    GetVersionResp,
    IsBlockhashValidResp,
    LogsNotification,
    ProgramNotification,
    SignatureNotification,
    SlotNotification,
    batch_from_json,
)
from solders.signature import Signature
from solders.system_program import ID as SYSTEM_PROGRAM_ID
from solders.system_program import CreateAccountParams, TransferParams, create_account, transfer
from solders.transaction import Transaction, VersionedTransaction
from spl.token.constants import TOKEN_2022_PROGRAM_ID, TOKEN_PROGRAM_ID
from spl.token.instructions import (
    create_associated_token_account,
    get_associated_token_address,
    initialize_mint2,
    mint_to,
    transfer_checked,
)
from spl.token.models import InitializeMint2Params, MintToParams, TransferCheckedParams

from chaingate.devnet.solana import rpc, server, snapshot
from chaingate.devnet.solana.ledger import MAX_PROCESSING_AGE, Ledger
from chaingate.devnet.solana.pubsub import Hub
from chaingate.devnet.solana.server import Endpoints, serve

SOL = 10**9


def call(ledger: Ledger, method: str, *params: Any) -> Any:
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return msgspec.json.decode(rpc.answer(ledger, body))


def result(ledger: Ledger, method: str, *params: Any) -> Any:
    reply = call(ledger, method, *params)
    assert "result" in reply, reply
    return reply["result"]


def signed_transfer(ledger: Ledger, payer: Keypair, to: Pubkey, lamports: int) -> str:
    blockhash = Hash.from_string(ledger.blocks[ledger.head].blockhash)
    ix = transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=to, lamports=lamports))
    tx = Transaction([payer], Message([ix], payer.pubkey()), blockhash)
    return base64.b64encode(bytes(tx)).decode()


# --- the ledger by hand: no clock, no HTTP -------------------------------------------------


def test_commitments_are_distinct_slots_and_reads_honour_them() -> None:
    ledger = Ledger(genesis_time=1_700_000_000, confirmed_depth=1, finalized_depth=3)
    for i in range(5):
        ledger.advance(1_700_000_001 + i)
    assert [result(ledger, "getSlot", {"commitment": c}) for c in ("processed", "confirmed")] == [
        5,
        4,
    ]
    assert result(ledger, "getSlot") == 2  # finalized by default, as a validator answers
    alice = Keypair().pubkey()
    signature = result(ledger, "requestAirdrop", str(alice), 2 * SOL)
    balance = {
        c: result(ledger, "getBalance", str(alice), {"commitment": c})["value"]
        for c in ("processed", "confirmed", "finalized")
    }
    assert balance == {"processed": 2 * SOL, "confirmed": 0, "finalized": 0}
    status = result(ledger, "getSignatureStatuses", [signature])["value"][0]
    assert status["confirmationStatus"] == "processed" and status["slot"] == 5
    ledger.advance(1_700_000_010)
    reply = result(ledger, "getBalance", str(alice), {"commitment": "confirmed"})
    assert reply == {
        "context": {"apiVersion": reply["context"]["apiVersion"], "slot": 5},
        "value": 2 * SOL,
    }
    assert result(ledger, "getBalance", str(alice))["value"] == 0
    # minContextSlot: the finalized slot (3) is below 4, so Solana's -32016 with contextSlot.
    error = call(ledger, "getBalance", str(alice), {"minContextSlot": 4})["error"]
    assert error == {
        "code": -32016,
        "message": "Minimum context slot has not been reached",
        "data": {"contextSlot": 3},
    }
    # A block is read at confirmed or finalized only; the open slot is not one yet.
    assert call(ledger, "getBlock", 6, {"commitment": "confirmed"})["error"]["code"] == -32004
    assert call(ledger, "getBlock", 5, {"commitment": "processed"})["error"]["code"] == -32602
    block = result(ledger, "getBlock", 5, {"commitment": "confirmed"})
    assert [tx["transaction"]["signatures"][0] for tx in block["transactions"]] == [signature]
    assert block["blockhash"] != block["previousBlockhash"] and block["parentSlot"] == 4
    for _ in range(2):
        ledger.advance(1_700_000_011)
    assert result(ledger, "getBalance", str(alice))["value"] == 2 * SOL
    status = result(ledger, "getSignatureStatuses", [signature])["value"][0]
    assert status["confirmationStatus"] == "finalized" and status["confirmations"] is None


def test_blockhashes_expire_and_history_is_bounded() -> None:
    ledger = Ledger(genesis_time=1_700_000_000, finalized_depth=2, history=MAX_PROCESSING_AGE + 10)
    payer = Keypair()
    result(ledger, "requestAirdrop", str(payer.pubkey()), SOL)
    old = result(ledger, "getLatestBlockhash", {"commitment": "processed"})["value"]
    assert old["lastValidBlockHeight"] == ledger.head + MAX_PROCESSING_AGE
    stale = signed_transfer(ledger, payer, Keypair().pubkey(), 1000)
    for i in range(MAX_PROCESSING_AGE + 1):
        ledger.advance(1_700_000_001 + i)
    assert result(ledger, "isBlockhashValid", old["blockhash"])["value"] is False
    error = call(ledger, "sendTransaction", stale, {"encoding": "base64"})["error"]
    assert error["code"] == -32002
    assert error["message"] == "Transaction simulation failed: Blockhash not found"
    assert error["data"]["err"] == "BlockhashNotFound"
    for i in range(20):
        ledger.advance(1_700_001_000 + i)
    assert len(ledger.blocks) == MAX_PROCESSING_AGE + 10
    first = ledger.first_available()
    error = call(ledger, "getBlock", 0)["error"]
    assert error["code"] == -32001
    assert error["message"] == (
        f"Block 0 cleaned up, does not exist on node. First available block: {first}"
    )
    assert result(ledger, "getBlocks", 0, first + 2) == [first, first + 1, first + 2]
    assert result(ledger, "getBlocksWithLimit", 0, 2) == [first, first + 1]
    assert result(ledger, "getFirstAvailableBlock") == first


def test_preflight_errors_are_solana_shaped() -> None:
    ledger = Ledger(genesis_time=1_700_000_000, finalized_depth=1)
    payer = Keypair()
    result(ledger, "requestAirdrop", str(payer.pubkey()), SOL)
    too_much = signed_transfer(ledger, payer, Keypair().pubkey(), 10 * SOL)
    error = call(ledger, "sendTransaction", too_much, {"encoding": "base64"})["error"]
    assert error["code"] == -32002
    assert error["message"] == (
        "Transaction simulation failed: Error processing Instruction 0: custom program error: 0x1"
    )
    assert error["data"]["err"] == {"InstructionError": [0, {"Custom": 1}]}
    assert any("insufficient lamports" in line for line in error["data"]["logs"])
    # skipPreflight: the failed transaction lands, and its fee is charged.
    signature = result(
        ledger, "sendTransaction", too_much, {"encoding": "base64", "skipPreflight": True}
    )
    status = result(ledger, "getSignatureStatuses", [signature])["value"][0]
    assert status["err"] == {"InstructionError": [0, {"Custom": 1}]}
    assert status["status"] == {"Err": {"InstructionError": [0, {"Custom": 1}]}}
    balance = result(ledger, "getBalance", str(payer.pubkey()), {"commitment": "processed"})
    assert balance["value"] == SOL - 5000
    tampered = bytearray(base64.b64decode(signed_transfer(ledger, payer, payer.pubkey(), 1)))
    tampered[5] ^= 1
    error = call(
        ledger, "sendTransaction", base64.b64encode(tampered).decode(), {"encoding": "base64"}
    )["error"]
    assert error == {"code": -32003, "message": "Transaction signature verification failure"}
    assert call(ledger, "sendTransaction", "not base58!")["error"]["code"] == -32602
    assert call(ledger, "getNothing")["error"] == {"code": -32601, "message": "Method not found"}
    # No encoding asked: the legacy "binary" form, data a bare base58 string, as a validator.
    info = result(ledger, "getAccountInfo", str(payer.pubkey()))["value"]
    assert info["data"] == "" and info["rentEpoch"] == 2**64 - 1 and info["space"] == 0
    many = result(ledger, "getMultipleAccounts", [str(payer.pubkey())])["value"]
    assert many[0]["data"] == ["", "base64"]


def _bad_params(key: str) -> Iterator[list[Any]]:
    values: list[Any] = [None, 1, -1, 2**70, "x", key, [], [key], {}, True, 1.5, "base64"]
    configs: list[Any] = [
        {"encoding": 5},
        {"encoding": "binary"},
        {"commitment": 5},
        {"commitment": "x"},
        {"minContextSlot": "a"},
        {"dataSlice": 5},
        {"dataSlice": {"offset": -1, "length": 2}},
        {"filters": 5},
        {"filters": [5]},
        {"filters": [{"memcmp": {"offset": "a"}}]},
        {"filters": [{"memcmp": {"offset": 0, "bytes": "!!", "encoding": "base64"}}]},
        {"limit": "a"},
        {"before": 5},
        {"transactionDetails": 5},
        {"accounts": {"addresses": 5}},
        {"maxSupportedTransactionVersion": "a"},
        {"mint": 5},
        {"programId": "x"},
    ]
    yield from ([value] for value in values)
    for value in (key, 1, "x"):
        yield from ([value, cfg] for cfg in configs)
    yield from ([key, {"mint": key}, cfg] for cfg in configs)


def test_bad_input_is_a_clear_error_never_an_internal_one() -> None:
    ledger = Ledger(genesis_time=1_700_000_000, finalized_depth=1)
    key = str(Keypair().pubkey())
    result(ledger, "requestAirdrop", key, SOL)
    ledger.advance(1_700_000_001)
    hub = Hub(ledger)
    subscriptions = ["accountSubscribe", "logsSubscribe", "programSubscribe", "signatureSubscribe"]
    for method in [*rpc.METHODS, *subscriptions]:
        for params in _bad_params(key):
            body = msgspec.json.encode(
                {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            )
            if method in rpc.METHODS:
                reply = msgspec.json.decode(rpc.answer(ledger, body))
            else:
                reply = msgspec.json.decode(hub.answer(body, lambda frame: None, set()))
            assert reply.get("error", {}).get("code") != -32603, (method, params, reply)
    ledger.advance(1_700_000_002)  # and the subscriptions made on the way notify without failing


def test_a_snapshot_resumes_accounts_history_and_blockhashes(tmp_path: Path) -> None:
    ledger = Ledger(genesis_time=1_700_000_000, finalized_depth=2)
    payer, bob = Keypair(), Keypair()
    result(ledger, "requestAirdrop", str(payer.pubkey()), SOL)
    sent = result(
        ledger,
        "sendTransaction",
        signed_transfer(ledger, payer, bob.pubkey(), SOL // 100),
        {"encoding": "base64"},
    )
    failed = result(
        ledger,
        "sendTransaction",
        signed_transfer(ledger, payer, bob.pubkey(), 10 * SOL),
        {"encoding": "base64", "skipPreflight": True},
    )
    for i in range(4):
        ledger.advance(1_700_000_001 + i)
    pending = signed_transfer(ledger, payer, bob.pubkey(), 7)  # signed before the restart
    questions: list[tuple[str, tuple[Any, ...]]] = [
        ("getBalance", (str(payer.pubkey()),)),
        ("getBalance", (str(bob.pubkey()), {"commitment": "processed"})),
        ("getSignatureStatuses", ([sent, failed],)),
        ("getSignaturesForAddress", (str(bob.pubkey()),)),
        ("getTransaction", (sent,)),
        ("getBlock", (1,)),
        ("getGenesisHash", ()),
        ("getIdentity", ()),
    ]
    before = [result(ledger, method, *params) for method, params in questions]
    snapshot.save(ledger, tmp_path / "solana.state")

    resumed = snapshot.load(tmp_path / "solana.state", now=1_700_000_100)
    assert resumed.head == ledger.head + 1
    after = [result(resumed, method, *params) for method, params in questions]
    for (method, _), old, new in zip(questions, before, after, strict=True):
        if isinstance(old, dict) and "context" in old:
            old, new = old["value"], new["value"]
        if method == "getSignatureStatuses":  # one slot more has passed
            for status in (*old, *new):
                status.pop("confirmations")
                status.pop("confirmationStatus")
        assert old == new, method
    landed = result(resumed, "sendTransaction", pending, {"encoding": "base64"})
    assert result(resumed, "getSignatureStatuses", [landed])["value"][0]["err"] is None
    (tmp_path / "bad.state").write_bytes(b"not msgpack")
    with pytest.raises(snapshot.SnapshotError):
        snapshot.load(tmp_path / "bad.state", now=0)


# --- solana-py over HTTP, the node on its own clock ------------------------------------------


@contextlib.contextmanager
def running(ledger: Ledger, state_path: Path | None = None) -> Iterator[Endpoints]:
    """The node served from a trio thread (solana-py is asyncio: it runs in the test's)."""
    started: queue.Queue[tuple[Endpoints, trio.lowlevel.TrioToken, trio.CancelScope]] = (
        queue.Queue()
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(serve, ledger, slot_seconds=0.05, state_path=state_path)
            )
            started.put((urls, trio.lowlevel.current_trio_token(), nursery.cancel_scope))

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    urls, token, scope = started.get(timeout=30)
    try:
        yield urls
    finally:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(30)


@pytest.fixture
def node() -> Iterator[Endpoints]:
    with running(Ledger(genesis_time=time.time(), confirmed_depth=1, finalized_depth=4)) as urls:
        yield urls


def test_the_node_saves_its_state_on_stop_and_resumes_from_it(tmp_path: Path) -> None:
    state = tmp_path / "solana.state"
    who = Keypair().pubkey()
    with running(Ledger(genesis_time=time.time(), finalized_depth=2), state) as urls:
        asyncio.run(_airdrop(urls.http, who))
    resumed = snapshot.load(state, now=time.time())
    with running(resumed) as urls:
        assert asyncio.run(_balance(urls.http, who)) == SOL


async def _airdrop(url: str, who: Pubkey) -> None:
    async with AsyncClient(url, commitment=Processed) as client:
        signature = (await client.request_airdrop(who, SOL)).value
        await client.confirm_transaction(signature, Processed, sleep_seconds=0.05)


async def _balance(url: str, who: Pubkey) -> int:
    async with AsyncClient(url, commitment=Processed) as client:
        return (await client.get_balance(who)).value


def test_solana_py_transfers_sol_and_tokens(node: Endpoints) -> None:
    asyncio.run(_sol_and_tokens(node.http))


async def _send(client: AsyncClient, payer: Keypair, signers: list[Keypair], ixs: list[Any]) -> Any:
    blockhash = (await client.get_latest_blockhash()).value
    tx = VersionedTransaction(
        Message.new_with_blockhash(ixs, payer.pubkey(), blockhash.blockhash), signers
    )
    signature = (await client.send_transaction(tx)).value
    statuses = await client.confirm_transaction(
        signature,
        Confirmed,
        sleep_seconds=0.05,
        last_valid_block_height=blockhash.last_valid_block_height,
    )
    assert statuses.value[0] is not None and statuses.value[0].err is None
    return signature


async def _finalized(client: AsyncClient, slot: int) -> None:
    async with asyncio.timeout(10):  # the node's clock finalizes a slot 4 slots (0.2 s) on
        while (await client.get_slot(Finalized)).value < slot:
            await asyncio.sleep(0.05)


async def _sol_and_tokens(url: str) -> None:
    payer, bob, mint = Keypair(), Keypair(), Keypair()
    async with AsyncClient(url, commitment=Confirmed) as client:
        assert await client.is_connected()
        assert (await client.get_version()).value.solana_core
        airdrop = (await client.request_airdrop(payer.pubkey(), 10 * SOL)).value
        await client.confirm_transaction(airdrop, Confirmed, sleep_seconds=0.05)
        assert (await client.get_balance(payer.pubkey())).value == 10 * SOL

        sent = await _send(
            client,
            payer,
            [payer],
            [
                transfer(
                    TransferParams(from_pubkey=payer.pubkey(), to_pubkey=bob.pubkey(), lamports=SOL)
                )
            ],
        )
        assert (await client.get_balance(bob.pubkey())).value == SOL
        assert (await client.get_balance(bob.pubkey(), Processed)).value == SOL
        got = (await client.get_transaction(sent, max_supported_transaction_version=0)).value
        assert got is not None and got.transaction.meta is not None
        assert got.transaction.meta.fee == 5000
        assert got.transaction.meta.post_balances[1] == SOL
        history = (await client.get_signatures_for_address(bob.pubkey())).value
        assert [entry.signature for entry in history] == [sent]
        block = (await client.get_block(got.slot, max_supported_transaction_version=0)).value
        assert sent in [tx.transaction.signatures[0] for tx in block.transactions]
        assert (await client.get_block_time(got.slot)).value == block.block_time
        await _finalized(client, got.slot)  # getBlocks answers at finalized only
        assert got.slot in (await client.get_blocks(got.slot)).value
        assert (await client.get_transaction_count()).value >= 2

        rent = (await client.get_minimum_balance_for_rent_exemption(82)).value
        payer_ata = get_associated_token_address(payer.pubkey(), mint.pubkey())
        bob_ata = get_associated_token_address(bob.pubkey(), mint.pubkey())
        await _send(
            client,
            payer,
            [payer, mint],
            [
                create_account(
                    CreateAccountParams(
                        from_pubkey=payer.pubkey(),
                        to_pubkey=mint.pubkey(),
                        lamports=rent,
                        space=82,
                        owner=TOKEN_PROGRAM_ID,
                    )
                ),
                initialize_mint2(
                    InitializeMint2Params(
                        decimals=6,
                        program_id=TOKEN_PROGRAM_ID,
                        mint=mint.pubkey(),
                        mint_authority=payer.pubkey(),
                    )
                ),
                create_associated_token_account(payer.pubkey(), payer.pubkey(), mint.pubkey()),
                create_associated_token_account(payer.pubkey(), bob.pubkey(), mint.pubkey()),
                mint_to(
                    MintToParams(
                        program_id=TOKEN_PROGRAM_ID,
                        mint=mint.pubkey(),
                        dest=payer_ata,
                        mint_authority=payer.pubkey(),
                        amount=5_000_000,
                    )
                ),
            ],
        )
        moved = await _send(
            client,
            payer,
            [payer],
            [
                transfer_checked(
                    TransferCheckedParams(
                        program_id=TOKEN_PROGRAM_ID,
                        source=payer_ata,
                        mint=mint.pubkey(),
                        dest=bob_ata,
                        owner=payer.pubkey(),
                        amount=1_250_000,
                        decimals=6,
                    )
                )
            ],
        )
        meta = (await client.get_transaction(moved)).value.transaction.meta
        assert meta is not None
        pre = {b.owner: b.ui_token_amount.amount for b in meta.pre_token_balances}
        post = {b.owner: b.ui_token_amount.amount for b in meta.post_token_balances}
        assert pre == {payer.pubkey(): "5000000", bob.pubkey(): "0"}
        assert post == {payer.pubkey(): "3750000", bob.pubkey(): "1250000"}
        balance = (await client.get_token_account_balance(bob_ata)).value
        assert (balance.amount, balance.decimals, balance.ui_amount_string) == (
            "1250000",
            6,
            "1.25",
        )
        assert (await client.get_token_supply(mint.pubkey())).value.amount == "5000000"
        owned = await client.get_token_accounts_by_owner_json_parsed(
            bob.pubkey(), TokenAccountOpts(mint=mint.pubkey())
        )
        [account] = owned.value
        assert account.pubkey == bob_ata
        assert account.account.data.parsed["info"]["tokenAmount"]["amount"] == "1250000"
        holders = await client.get_program_accounts(
            TOKEN_PROGRAM_ID,
            encoding="base64",
            filters=[165, MemcmpOpts(offset=0, bytes=str(mint.pubkey()))],
        )
        assert sorted(str(a.pubkey) for a in holders.value) == sorted(
            map(str, [payer_ata, bob_ata])
        )
        finalized = await client.get_program_accounts(
            TOKEN_PROGRAM_ID,
            Finalized,
            encoding="base64",
            filters=[MemcmpOpts(offset=0, bytes=str(mint.pubkey()))],
        )
        assert len(finalized.value) <= 2  # what finalized sees trails confirmed

        await _simulate_and_refuse(client, payer, bob)


async def _simulate_and_refuse(client: AsyncClient, payer: Keypair, bob: Keypair) -> None:
    blockhash = (await client.get_latest_blockhash()).value.blockhash
    too_much = VersionedTransaction(
        Message.new_with_blockhash(
            [
                transfer(
                    TransferParams(
                        from_pubkey=bob.pubkey(), to_pubkey=payer.pubkey(), lamports=50 * SOL
                    )
                )
            ],
            bob.pubkey(),
            blockhash,
        ),
        [bob],
    )
    simulated = (await client.simulate_transaction(too_much, sig_verify=True)).value
    assert simulated.err is not None and "InstructionError" in str(simulated.err)
    assert simulated.units_consumed and simulated.logs
    with pytest.raises((RPCException, SolanaRpcException)) as refused:
        await client.send_transaction(too_much)
    assert "custom program error: 0x1" in str(refused.value)


def test_a_batch_through_solders_parsers(node: Endpoints) -> None:
    who = Keypair().pubkey()
    body = batch_to_json([GetSlot(id=0), GetBalance(who, id=1), GetVersion(id=2)])
    reply = httpx.post(node.http, content=body, headers={"content-type": "application/json"})
    slot, balance, version = batch_from_json(
        reply.text, [GetSlotResp, GetBalanceResp, GetVersionResp]
    )
    assert isinstance(slot, GetSlotResp) and isinstance(balance, GetBalanceResp)
    assert balance.value == 0 and isinstance(version, GetVersionResp)
    assert httpx.post(node.http, content=b"[]").json()["error"]["code"] == -32600
    assert httpx.post(node.http, content=b"{").json()["error"]["code"] == -32700


def test_solana_py_reads_the_node_and_its_accounts(node: Endpoints) -> None:
    asyncio.run(_reads(node.http))


def _blockhash_valid(url: str, blockhash: Hash) -> bool:
    """isBlockhashValid, which solana-py does not wrap: solders' request and parser."""
    reply = httpx.post(url, content=IsBlockhashValid(blockhash).to_json())
    return bool(IsBlockhashValidResp.from_json(reply.text).value)


async def _reads(url: str) -> None:
    payer, bob = Keypair(), Keypair()
    async with AsyncClient(url, commitment=Confirmed) as client:
        assert (await client.get_genesis_hash()).value
        assert (await client.get_identity()).value.identity
        processed = (await client.get_slot(Processed)).value
        assert (await client.get_slot(Confirmed)).value <= processed
        assert (await client.get_block_height(Processed)).value >= processed  # no skipped slots
        epoch = (await client.get_epoch_info(Processed)).value
        assert epoch.absolute_slot >= processed and epoch.slots_in_epoch > 0
        schedule = (await client.get_epoch_schedule()).value
        assert schedule.warmup and schedule.slots_per_epoch >= epoch.slots_in_epoch  # warm-up
        assert (await client.get_slot_leader()).value == (
            await client.get_identity()
        ).value.identity
        first = (await client.get_first_available_block()).value
        assert (await client.get_minimum_ledger_slot()).value == first
        airdrop = (await client.request_airdrop(payer.pubkey(), 3 * SOL)).value
        await client.confirm_transaction(airdrop, Confirmed, sleep_seconds=0.05)
        latest = (await client.get_latest_blockhash()).value
        assert _blockhash_valid(url, latest.blockhash) is True
        assert _blockhash_valid(url, Hash.new_unique()) is False

        pay = transfer(
            TransferParams(from_pubkey=payer.pubkey(), to_pubkey=bob.pubkey(), lamports=SOL)
        )
        message = MessageV0.try_compile(payer.pubkey(), [pay], [], latest.blockhash)
        assert (await client.get_fee_for_message(message)).value == 5000
        v0 = VersionedTransaction(message, [payer])
        # A fresh, unsigned draft simulated with a replaced blockhash, and the accounts after it.
        draft = VersionedTransaction.populate(
            MessageV0.try_compile(payer.pubkey(), [pay], [], Hash.default()), [Signature.default()]
        )
        simulated = (
            await client.simulate_transaction(
                draft, replace_recent_blockhash=True, accounts_addresses=[bob.pubkey()]
            )
        ).value
        assert simulated.err is None and simulated.replacement_blockhash is not None
        assert simulated.accounts is not None and simulated.accounts[0].lamports == SOL
        signature = (await client.send_transaction(v0)).value
        await client.confirm_transaction(signature, Confirmed, sleep_seconds=0.05)
        [status] = (await client.get_signature_statuses([signature])).value
        assert status is not None and status.err is None
        got = (
            await client.get_transaction(signature, "base64", max_supported_transaction_version=0)
        ).value
        assert got is not None and got.transaction.version == 0
        parsed = (
            await client.get_transaction(
                signature, "jsonParsed", max_supported_transaction_version=0
            )
        ).value
        assert parsed is not None
        keys = parsed.transaction.transaction.message.account_keys
        assert [(k.pubkey, k.signer, k.writable) for k in keys][:2] == [
            (payer.pubkey(), True, True),
            (bob.pubkey(), False, True),
        ]

        both = [payer.pubkey(), bob.pubkey(), Keypair().pubkey()]
        for encoding in ("base64", "base58", "base64+zstd"):
            accounts = (await client.get_multiple_accounts(both, encoding=encoding)).value
            assert [a.lamports if a else None for a in accounts] == [
                3 * SOL - SOL - 5000,
                SOL,
                None,
            ]
        sliced = await client.get_account_info(
            payer.pubkey(), data_slice=DataSliceOpts(offset=0, length=0)
        )
        assert sliced.value is not None and sliced.value.data == b""
        fees = (await client.get_recent_prioritization_fees([payer.pubkey()])).value
        assert fees and all(fee.prioritization_fee == 0 for fee in fees)


def test_solana_py_pubsub_slots_signatures_accounts_logs(node: Endpoints) -> None:
    asyncio.run(_pubsub(node))


async def _next(ws: SolanaWsClient, kind: type) -> Any:
    """The next notification of ``kind`` (slot notifications keep coming meanwhile)."""
    async with asyncio.timeout(10):  # the node's clock notifies within a few 50 ms slots
        while not isinstance(notification := await ws.recv(), kind):
            pass
    return notification


async def _pubsub(node: Endpoints) -> None:
    payer, bob = Keypair(), Keypair()
    async with (
        AsyncClient(node.http, commitment=Confirmed) as client,
        SolanaWsClient(node.ws) as ws,
    ):
        slots = await ws.slot_subscribe()
        first = (await _next(ws, SlotNotification)).result
        second = (await _next(ws, SlotNotification)).result
        assert second.slot == first.slot + 1 and second.parent == first.slot
        await ws.unsubscribe(slots)

        airdrop = (await client.request_airdrop(payer.pubkey(), 2 * SOL)).value
        await client.confirm_transaction(airdrop, Confirmed, sleep_seconds=0.05)
        await ws.account_subscribe(pubkey=bob.pubkey(), commitment=Confirmed)
        await ws.program_subscribe(
            program_id=SYSTEM_PROGRAM_ID,
            commitment=Confirmed,
            filters=[0],
        )
        await ws.logs_subscribe(
            filter_=RpcTransactionLogsFilterMentions(bob.pubkey()), commitment=Confirmed
        )
        blockhash = (await client.get_latest_blockhash()).value.blockhash
        pay = transfer(
            TransferParams(from_pubkey=payer.pubkey(), to_pubkey=bob.pubkey(), lamports=SOL)
        )
        tx = VersionedTransaction(
            Message.new_with_blockhash([pay], payer.pubkey(), blockhash), [payer]
        )
        signature = (await client.send_transaction(tx)).value
        await ws.signature_subscribe(signature=signature, commitment=Finalized)
        account = await _next(ws, AccountNotification)
        assert account.result.value.lamports == SOL
        owned = await _next(ws, ProgramNotification)
        assert owned.result.value.pubkey in (payer.pubkey(), bob.pubkey())
        logs = await _next(ws, LogsNotification)
        assert logs.result.value.signature == signature and logs.result.value.err is None
        status = await _next(ws, SignatureNotification)
        assert status.result.value.err is None
        finalized = (await client.get_signature_statuses([signature])).value[0]
        assert finalized is not None and finalized.slot == status.result.context.slot


def test_an_idle_or_broken_client_never_stops_the_node(
    node: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "IDLE_SECONDS", 0.1)
    host, port = node.http.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as idle:
        assert idle.recv(1) == b""  # let go after IDLE_SECONDS
    with socket.create_connection((host, int(port))) as broken:
        broken.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        broken.recv(4096)
    body = {"jsonrpc": "2.0", "id": 1, "method": "getHealth"}
    assert httpx.post(node.http, json=body).json()["result"] == "ok"
    big = httpx.post(node.http, content=b"[" + b" " * (server.MAX_BODY_BYTES + 1) + b"]")
    assert big.status_code == 413


def test_token_2022_accounts_with_extensions(node: Endpoints) -> None:
    asyncio.run(_token_2022(node.http))


async def _token_2022(url: str) -> None:
    payer, mint = Keypair(), Keypair()
    async with AsyncClient(url, commitment=Confirmed) as client:
        airdrop = (await client.request_airdrop(payer.pubkey(), SOL)).value
        await client.confirm_transaction(airdrop, Confirmed, sleep_seconds=0.05)
        rent = (await client.get_minimum_balance_for_rent_exemption(82)).value
        ata = get_associated_token_address(payer.pubkey(), mint.pubkey(), TOKEN_2022_PROGRAM_ID)
        create = CreateAccountParams(
            from_pubkey=payer.pubkey(),
            to_pubkey=mint.pubkey(),
            lamports=rent,
            space=82,
            owner=TOKEN_2022_PROGRAM_ID,
        )
        init = InitializeMint2Params(
            decimals=2,
            program_id=TOKEN_2022_PROGRAM_ID,
            mint=mint.pubkey(),
            mint_authority=payer.pubkey(),
        )
        mint_some = MintToParams(
            program_id=TOKEN_2022_PROGRAM_ID,
            mint=mint.pubkey(),
            dest=ata,
            mint_authority=payer.pubkey(),
            amount=12345,
        )
        ixs = [
            create_account(create),
            initialize_mint2(init),
            create_associated_token_account(
                payer.pubkey(), payer.pubkey(), mint.pubkey(), TOKEN_2022_PROGRAM_ID
            ),
            mint_to(mint_some),
        ]
        await _send(client, payer, [payer, mint], ixs)
        info = (await client.get_account_info(ata)).value
        assert info is not None and len(info.data) > 165  # the ImmutableOwner extension
        balance = (await client.get_token_account_balance(ata)).value
        assert (balance.amount, balance.ui_amount_string) == ("12345", "123.45")
        owned = await client.get_token_accounts_by_owner_json_parsed(
            payer.pubkey(), TokenAccountOpts(program_id=TOKEN_2022_PROGRAM_ID)
        )
        [account] = owned.value
        assert account.account.data.program == "spl-token-2022"
        assert account.account.data.parsed["info"]["tokenAmount"]["amount"] == "12345"
