"""``solana/devnet``'s state under the dev data dir: the ledger (resumed), the dev keypairs, the
demo SPL mint and its token accounts, and the manifest that names them.

Files (under ``<data dir>/solana/``): ``ledger.msgpack`` (``snapshot``, saved by the node while it
runs), ``dev-<i>.json`` and ``mint.json`` (keypairs in the Solana CLI's format, a JSON array of
64 bytes, mode 0600: ``solana-keygen``, solana-py's ``Keypair.from_json`` and @solana/kit's
``createKeyPairSignerFromBytes`` read them), and ``manifest.json`` (public keys only, plus the
keypair files' paths).  The keypairs outlive a lost ledger: a new ledger funds the same keys and
mints at the same address, so pasted curl lines keep working.

Sans-IO but for reading and writing those files; the node (``server``) serves the ledger.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import NamedTuple

import msgspec
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.system_program import CreateAccountParams, TransferParams, create_account, transfer
from solders.token.associated import get_associated_token_address
from solders.transaction import Transaction, VersionedTransaction

from chaingate.devnet.solana import codec, snapshot
from chaingate.devnet.solana.ledger import Ledger, TransactionRefused

SCHEMA = 1
DIRECTORY = "solana"
LEDGER_FILE = "ledger.msgpack"
MANIFEST_FILE = "manifest.json"
MINT_FILE = "mint.json"
DEV_ACCOUNTS = 3
SOL = 10**9
DEV_LAMPORTS = 1000 * SOL  # each dev keypair's balance on a new ledger
MINT_DECIMALS = 6
MINT_SYMBOL = "CGT"
DEV_TOKENS = 1_000_000 * 10**MINT_DECIMALS  # each dev keypair's token balance on a new ledger
MINT_SIZE = 82
ASSOCIATED_TOKEN_PROGRAM = Pubkey.from_string("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")


class DevAccount(msgspec.Struct, frozen=True):
    pubkey: str
    keypair_file: str  # the Solana CLI's keypair format
    lamports: int  # funded with this many on a new ledger
    token_account: str  # its associated token account of the demo mint
    tokens: int  # minted to it on a new ledger (raw units, MINT_DECIMALS decimals)


class DevMint(msgspec.Struct, frozen=True):
    address: str
    program: str  # SPL Token
    decimals: int
    symbol: str
    authority: str  # mint authority: the first dev account


class SolanaManifest(msgspec.Struct, frozen=True):
    schema: int
    network: str
    genesis_hash: str
    accounts: list[DevAccount]
    mint: DevMint


class Prepared(NamedTuple):
    ledger: Ledger
    manifest: SolanaManifest
    state_path: Path
    note: str  # one line for the user: continued or new, and why


def _keypair(path: Path) -> Keypair:
    """The keypair kept at ``path``, created (mode 0600) on first use."""
    try:
        return Keypair.from_bytes(bytes(json.loads(path.read_text())))
    except FileNotFoundError:
        pass
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a Solana keypair file: {exc}") from None
    keypair = Keypair()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(list(bytes(keypair))))
    return keypair


def _send(ledger: Ledger, payer: Keypair, signers: list[Keypair], ixs: list[Instruction]) -> None:
    blockhash = Hash.from_string(ledger.blocks[ledger.head].blockhash)
    tx = Transaction(signers, Message(ixs, payer.pubkey()), blockhash)
    executed = ledger.execute(VersionedTransaction.from_legacy(tx))
    if executed.err is not None:
        raise TransactionRefused(executed.err)


def _mint_instructions(authority: Keypair, mint: Keypair, rent: int) -> list[Instruction]:
    create = create_account(
        CreateAccountParams(
            from_pubkey=authority.pubkey(),
            to_pubkey=mint.pubkey(),
            lamports=rent,
            space=MINT_SIZE,
            owner=codec.TOKEN_PROGRAM,
        )
    )
    # InitializeMint2: tag 20, decimals, mint authority, no freeze authority.
    data = bytes([20, MINT_DECIMALS]) + bytes(authority.pubkey()) + b"\x00" + bytes(32)
    initialize = Instruction(codec.TOKEN_PROGRAM, data, [AccountMeta(mint.pubkey(), False, True)])
    return [create, initialize]


def _token_account_instructions(
    authority: Keypair, mint: Pubkey, owner: Pubkey, amount: int
) -> list[Instruction]:
    account = get_associated_token_address(owner, mint)
    create = Instruction(  # CreateIdempotent
        ASSOCIATED_TOKEN_PROGRAM,
        bytes([1]),
        [
            AccountMeta(authority.pubkey(), True, True),
            AccountMeta(account, False, True),
            AccountMeta(owner, False, False),
            AccountMeta(mint, False, False),
            AccountMeta(codec.SYSTEM_PROGRAM, False, False),
            AccountMeta(codec.TOKEN_PROGRAM, False, False),
        ],
    )
    mint_to = Instruction(  # MintTo: tag 7, amount
        codec.TOKEN_PROGRAM,
        bytes([7]) + struct.pack("<Q", amount),
        [
            AccountMeta(mint, False, True),
            AccountMeta(account, False, True),
            AccountMeta(authority.pubkey(), True, False),
        ],
    )
    return [create, mint_to]


def bootstrap(ledger: Ledger, keys: list[Keypair], mint: Keypair, now: float) -> None:
    """Fund ``keys``, create the demo mint (the first key its authority) and give every key
    tokens; then advance past the finalized depth, so the state answers at every commitment."""
    authority = keys[0]
    for key in keys:
        ledger.airdrop(key.pubkey(), DEV_LAMPORTS)
    rent = ledger.svm.minimum_balance_for_rent_exemption(MINT_SIZE)
    _send(ledger, authority, [authority, mint], _mint_instructions(authority, mint, rent))
    for key in keys:
        ixs = _token_account_instructions(authority, mint.pubkey(), key.pubkey(), DEV_TOKENS)
        _send(ledger, authority, [authority], ixs)
    # A tiny transfer, so the history (getSignaturesForAddress, a block with a transfer) is
    # not empty either.
    tip = transfer(
        TransferParams(from_pubkey=keys[0].pubkey(), to_pubkey=keys[1].pubkey(), lamports=1)
    )
    _send(ledger, keys[0], [keys[0]], [tip])
    for _ in range(ledger.finalized_depth + 1):
        ledger.advance(now)


def _funded(ledger: Ledger, keys: list[Keypair], mint: Pubkey) -> bool:
    """Does the ledger hold the dev accounts and the demo mint (a resumed one should)?"""
    head = ledger.head
    mint_account = ledger.account(mint, head)
    if mint_account is None or mint_account.owner != codec.TOKEN_PROGRAM:
        return False
    return all(ledger.account(key.pubkey(), head) is not None for key in keys)


def prepare(data_dir: Path, now: float, network: str = "solana/devnet") -> Prepared:
    """The ledger to serve (resumed from the data dir, else new and bootstrapped) and the
    manifest, written.  Raises OSError or ValueError for a data dir it cannot use."""
    home = data_dir / DIRECTORY
    home.mkdir(parents=True, exist_ok=True)
    keys = [_keypair(home / f"dev-{i}.json") for i in range(DEV_ACCOUNTS)]
    mint = _keypair(home / MINT_FILE)
    state_path = home / LEDGER_FILE
    ledger: Ledger | None = None
    note = ""
    try:
        ledger = snapshot.load(state_path, now=now)
    except FileNotFoundError:
        note = f"solana: a new ledger (none saved in {home})"
    except (snapshot.SnapshotError, ValueError, OSError) as exc:
        unusable = state_path.with_name(LEDGER_FILE + ".unusable")
        os.replace(state_path, unusable)
        note = f"solana: {state_path} could not be resumed ({exc}); set aside, a new ledger"
    if ledger is not None and not _funded(ledger, keys, mint.pubkey()):
        ledger = None
        note = "solana: the saved ledger lacks the dev accounts or the mint; a new ledger"
    if ledger is None:
        ledger = Ledger(genesis_time=now)
        bootstrap(ledger, keys, mint, now)
        snapshot.save(ledger, state_path)
    else:
        note = f"solana: continuing the ledger saved in {home} (slot {ledger.head})"
    manifest = SolanaManifest(
        schema=SCHEMA,
        network=network,
        genesis_hash=ledger.genesis_hash,
        accounts=[
            DevAccount(
                pubkey=str(key.pubkey()),
                keypair_file=str(home / f"dev-{i}.json"),
                lamports=DEV_LAMPORTS,
                token_account=str(get_associated_token_address(key.pubkey(), mint.pubkey())),
                tokens=DEV_TOKENS,
            )
            for i, key in enumerate(keys)
        ],
        mint=DevMint(
            address=str(mint.pubkey()),
            program=str(codec.TOKEN_PROGRAM),
            decimals=MINT_DECIMALS,
            symbol=MINT_SYMBOL,
            authority=str(keys[0].pubkey()),
        ),
    )
    _write(home / MANIFEST_FILE, msgspec.json.format(msgspec.json.encode(manifest)))
    return Prepared(ledger=ledger, manifest=manifest, state_path=state_path, note=note)


def load_manifest(data_dir: Path) -> SolanaManifest:
    path = data_dir / DIRECTORY / MANIFEST_FILE
    return msgspec.json.decode(path.read_bytes(), type=SolanaManifest)


def _write(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data + b"\n")
    os.replace(temporary, path)
