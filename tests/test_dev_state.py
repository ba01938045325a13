"""What ``chaingate dev`` keeps in its data dir, piece by piece: the lock, the saved chain (on
real anvil), the dev keys (on both stores).  ``tests/test_dev_lifecycle.py`` runs the command.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from chaingate.auth import apikeys
from chaingate.auth.plans import Plans
from chaingate.auth.store import AuthRows
from chaingate.config.manifest import load_manifest
from chaingate.devnet import chainfile, persist, statedump
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.bootstrap import definition_key
from chaingate.devnet.chainfile import ChainFileError, SavedChain
from chaingate.devnet.devkeys import DEV_EMAIL, DEV_LIMITS, DevKeys, issue_dev_keys
from chaingate.devnet.lock import DataDirBusy, DataDirLock
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm.keys import PrivateKey
from chaingate.store import open_store
from tests.conftest import DEVNET_SIGNER

PEPPER = b"dev-state-test-pepper-" + b"x" * 32


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the data dir lock ---------------------------------------------------------------------


def test_a_second_holder_is_refused_with_the_data_dir_and_the_holders_pid(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with DataDirLock(data_dir):
        # Another process: flock is per open file, so this is what a second chaingate dev sees.
        probe = (
            "import sys; from pathlib import Path; from chaingate.devnet.lock import *\n"
            "try:\n    DataDirLock(Path(sys.argv[1])).acquire()\n"
            "except DataDirBusy as exc:\n    print(exc.pid, exc); sys.exit(3)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe, str(data_dir)], capture_output=True, text=True
        )
        assert result.returncode == 3, result.stderr
        assert result.stdout.startswith(f"{os.getpid()} ")
        busy = f"the data dir {data_dir} is in use by another chaingate dev (pid {os.getpid()})"
        assert busy in result.stdout
        # In this process too (another open file description).
        with pytest.raises(DataDirBusy) as refused:
            DataDirLock(data_dir).acquire()
        assert refused.value.pid == os.getpid()
    # Released: free again, and the pid is gone from the file.
    assert (data_dir / "chaingate-dev.lock").read_text() == ""
    with DataDirLock(data_dir) as again:
        assert again.path.read_text() == f"{os.getpid()}\n"
        assert mode(again.path) == 0o600


def test_a_test_node_keeps_its_evicted_states_in_a_temporary_directory() -> None:
    """anvil writes the states it evicts from memory under ~/.foundry by default; a node of
    the tests (or the bench) keeps them in a directory of its own, gone when it stops."""
    with AnvilProcess() as node:
        assert node._cache is not None
        cache = Path(node._cache.name)
        assert not cache.is_relative_to(Path.home())
        with DevnetRpc(node.url) as rpc:
            rpc.call("anvil_mine", "0x400")  # enough blocks for anvil to evict states to disk
        assert [p.name for p in cache.iterdir() if p.name.startswith("anvil-state-")]
    assert not cache.exists()


# --- the saved chain -----------------------------------------------------------------------


def _saved(**fields: object) -> SavedChain:
    values: dict[str, object] = {
        "schema": chainfile.SCHEMA,
        "id": "ab" * 16,
        "genesis": "0x" + "11" * 32,
        "head": 7,
        "head_hash": "0x" + "22" * 32,
        "saved_at": 1,
        "anvil": "anvil/v1.7.1",
        "definition": "cd" * 16,
        "state": "0x1f8b",
    }
    values.update(fields)
    return SavedChain(**values)  # type: ignore[arg-type]


def test_chain_file_round_trips_owner_only_and_refuses_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / chainfile.CHAIN_FILE
    with pytest.raises(ChainFileError, match="no saved chain"):
        chainfile.load(path)
    saved = _saved()
    chainfile.save(path, saved)
    assert chainfile.load(path) == saved
    assert mode(path) == 0o600
    assert saved.identity == f"{saved.genesis}:{saved.id}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging file left
    path.write_bytes(msgspec.json.encode(_saved(schema=2)))
    with pytest.raises(ChainFileError, match="schema 2"):
        chainfile.load(path)
    path.write_text('{"schema": 1, "id": ')  # cut short, as by a crash of a non-atomic write
    with pytest.raises(ChainFileError, match="not a saved chain"):
        chainfile.load(path)
    aside = chainfile.set_aside(path)
    assert aside == tmp_path / f"{chainfile.CHAIN_FILE}.unusable" and not path.exists()
    assert chainfile.set_aside(path) is None


def _prepare(node: AnvilProcess, data_dir: Path, said: list[str]) -> persist.Prepared:
    def renew() -> None:  # a fresh anvil on the same port, as chaingate dev's node does
        said.append("renewed")
        node.stop()
        node.start()

    return persist.prepare(
        node.url,
        chain_path=data_dir / chainfile.CHAIN_FILE,
        manifest_path=data_dir / "devnet-manifest.json",
        paymaster_signer=DEVNET_SIGNER.address,
        renew=renew,
        announce=said.append,
    )


def _block(url: str, number: str) -> dict[str, str]:
    with DevnetRpc(url) as rpc:
        block: dict[str, str] = rpc.call("eth_getBlockByNumber", number, False)
    return block


def test_a_saved_chain_continues_on_a_new_anvil_and_a_lost_one_starts_anew(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    path = tmp_path / chainfile.CHAIN_FILE
    with AnvilProcess() as node:
        first = _prepare(node, tmp_path, said)
        assert first.new_because == f"no saved chain in {path}"
        assert chainfile.load(path) == first.saved
        with DevnetRpc(node.url) as rpc:
            rpc.call("anvil_mine", "0x4")
            rpc.call("anvil_setBalance", DEVNET_SIGNER.address, "0x1234")
        saved = persist.save(node.url, path, first.saved, if_moved=True)
        assert saved is not None and saved.head == first.saved.head + 4
        assert (saved.id, saved.genesis) == (first.saved.id, first.saved.genesis)
        assert persist.save(node.url, path, saved, if_moved=True) is None  # nothing new
        head = _block(node.url, "latest")
    assert head["hash"] == saved.head_hash
    with AnvilProcess() as node:
        second = _prepare(node, tmp_path, said)
        assert second.new_because is None
        assert second.saved == saved and second.manifest == first.manifest
        assert _block(node.url, "latest") == head  # the same chain, block for block
        with DevnetRpc(node.url) as rpc:
            assert rpc.call("eth_getBalance", DEVNET_SIGNER.address, "latest") == "0x1234"
            logs = rpc.call("eth_getLogs", {"fromBlock": "0x0"})
        assert len(logs) >= 23  # the demo history with it
    assert said[-1] == f"devnet: continuing the chain saved in {path} (block {saved.head})"
    assert load_manifest(tmp_path / "devnet-manifest.json") == first.manifest
    # Lost: a new chain with a new identity, and it says why.
    path.unlink()
    with AnvilProcess() as node:
        third = _prepare(node, tmp_path, said)
    assert third.new_because == f"no saved chain in {path}"
    assert third.saved.id != saved.id and third.saved.identity != saved.identity
    # Unreadable (cut short by a crash): set aside, a new chain, said in one line.
    path.write_text(path.read_text()[:100])
    with AnvilProcess() as node:
        fourth = _prepare(node, tmp_path, said)
    assert fourth.new_because is not None and "unusable" in fourth.new_because
    assert said[-2].startswith("devnet: ") and "starting a new chain" in said[-2]
    assert (tmp_path / f"{chainfile.CHAIN_FILE}.unusable").exists()
    assert fourth.saved.identity not in (saved.identity, third.saved.identity)


def test_a_state_that_does_not_load_as_saved_is_not_taken_for_the_chain(tmp_path: Path) -> None:
    said: list[str] = []
    path = tmp_path / chainfile.CHAIN_FILE
    with AnvilProcess() as node:
        first = _prepare(node, tmp_path, said)
    # The file claims another head than its state holds (edited, or from elsewhere).
    chainfile.save(path, msgspec.structs.replace(first.saved, head_hash="0x" + "00" * 32))
    with AnvilProcess() as node:
        second = _prepare(node, tmp_path, said)
        head = _block(node.url, "latest")
    assert second.new_because is not None and "did not load" in second.new_because
    assert second.saved.id != first.saved.id and second.saved.head_hash == head["hash"]
    assert any("did not load" in line for line in said) and "renewed" in said


def test_a_chain_saved_with_other_contracts_is_not_continued(tmp_path: Path) -> None:
    """Continued, it would lack (or hold other) contracts than this code's manifest names."""
    said: list[str] = []
    path = tmp_path / chainfile.CHAIN_FILE
    with AnvilProcess() as node:
        first = _prepare(node, tmp_path, said)
    assert first.saved.definition == definition_key(announce=said.append)
    chainfile.save(path, msgspec.structs.replace(first.saved, definition="an older devnet"))
    with AnvilProcess() as node:
        second = _prepare(node, tmp_path, said)
    assert second.saved.id != first.saved.id
    assert second.new_because is not None and "contracts changed" in second.new_because
    assert any(line.endswith("starting a new chain") for line in said)
    assert chainfile.load(path.with_name(f"{path.name}.previous")).id == first.saved.id


def test_a_continued_chain_without_its_manifest_or_with_another_signer_is_completed(
    tmp_path: Path,
) -> None:
    """The chain is kept; what the manifest lacks is deployed onto it (never the history)."""
    said: list[str] = []
    manifest_path = tmp_path / "devnet-manifest.json"
    with AnvilProcess() as node:
        first = _prepare(node, tmp_path, said)
    manifest_path.unlink()
    with AnvilProcess() as node:
        second = _prepare(node, tmp_path, said)
        assert second.new_because is None and second.saved.id == first.saved.id
        assert second.manifest.contracts.keys() == first.manifest.contracts.keys()
        for name, contract in first.manifest.contracts.items():
            if contract.kind != "paymaster":  # CREATE2: found where they were
                assert second.manifest.address(name) == contract.address, name
        assert load_manifest(manifest_path) == second.manifest
        assert second.saved.head >= first.saved.head
        assert _block(node.url, hex(first.saved.head))["hash"] == first.saved.head_hash
    other = PrivateKey(b"\x07" * 32)
    with AnvilProcess() as node:
        third = persist.prepare(
            node.url,
            chain_path=tmp_path / chainfile.CHAIN_FILE,
            manifest_path=manifest_path,
            paymaster_signer=other.address,
            renew=lambda: None,
            announce=said.append,
        )
        assert third.new_because is None and third.saved.id == first.saved.id
        assert third.manifest.paymaster_signer == other.address
        paymaster = third.manifest.address("verifying_paymaster_v07")
        assert paymaster != first.manifest.address("verifying_paymaster_v07")
        with DevnetRpc(node.url) as rpc:
            assert rpc.call("eth_getCode", paymaster, "latest") != "0x"
    assert chainfile.load(tmp_path / chainfile.CHAIN_FILE) == third.saved  # saved with them


def _header(number: int, parent: str, stamp: int) -> dict[str, object]:
    return {
        "number": hex(number),
        "parentHash": parent,
        "stateRoot": "0x" + "5" * 64,
        "transactionsRoot": "0x" + "7" * 64,
        "receiptsRoot": "0x" + "8" * 64,
        "timestamp": hex(stamp),
        "mixHash": "0x" + "0" * 64,
    }


def test_a_dump_is_cut_down_to_the_chain_its_head_runs_through() -> None:
    """What anvil dumps after a load: its own genesis beside the loaded one, and a block a
    revert left above the best; only the chain from the head down is kept."""
    zero = "0x" + "00" * 32
    genesis = {"header": _header(0, zero, 100)}
    stray_genesis = {"header": _header(0, zero, 200)}  # the fresh node's own
    one = {"header": _header(1, "0xg0", 101)}
    two = {"header": _header(2, "0xb1", 102)}
    reverted = {"header": _header(3, "0xb2", 103)}
    dump = {
        "best_block_number": 2,
        "blocks": [two, stray_genesis, reverted, one, genesis],
        "transactions": [
            {"block_hash": "0xb1", "block_number": 1, "info": "kept"},
            {"block_hash": "0xb3", "block_number": 3, "info": "reverted"},
            {"block_hash": "0xother", "block_number": 1, "info": "of another block 1"},
        ],
        "accounts": {"0x01": {}},
    }
    asked: list[str] = []

    def block_by_hash(block_hash: str) -> dict[str, object] | None:
        asked.append(block_hash)
        return {"hash": "0xg0", **genesis["header"]} if block_hash == "0xg0" else None

    cleaned, hashes = statedump.canonical_only(dump, "0xb2", block_by_hash)
    assert cleaned["blocks"] == [genesis, one, two]
    assert [tx["info"] for tx in cleaned["transactions"]] == ["kept"]
    assert cleaned["accounts"] == dump["accounts"]
    assert hashes == {2: "0xb2", 1: "0xb1", 0: "0xg0"}
    assert asked == ["0xg0"]  # the node is asked only where a height is ambiguous
    assert statedump.decode(statedump.encode(cleaned)) == cleaned
    with pytest.raises(statedump.DumpError, match="cannot tell"):
        statedump.canonical_only(dump, "0xb2", lambda h: {"hash": h, **_header(0, zero, 300)})
    with pytest.raises(statedump.DumpError, match="no block 1"):
        statedump.canonical_only({**dump, "blocks": [two, genesis]}, "0xb2", block_by_hash)
    with pytest.raises(statedump.DumpError, match="unreadable"):
        statedump.decode("0x1f8b00")


def test_save_and_restore_cycles_keep_one_genesis_the_parent_of_block_one(
    tmp_path: Path,
) -> None:
    """Without the cut, every load added the fresh node's genesis to the next dump and
    block 0 became any of them."""
    said: list[str] = []
    path = tmp_path / chainfile.CHAIN_FILE
    with AnvilProcess() as node:
        saved = _prepare(node, tmp_path, said).saved
    for _ in range(4):
        with AnvilProcess(extra=["--timestamp", str(1_700_000_000 + _)]) as node:
            persist.restore(node.url, saved)
            with DevnetRpc(node.url) as rpc:
                rpc.call("anvil_mine", "0x1")
            new = persist.save(node.url, path, saved, if_moved=True)
            assert new is not None
            saved = new
            genesis, one = _block(node.url, "0x0"), _block(node.url, "0x1")
            assert genesis["hash"] == one["parentHash"] == saved.genesis
        dump = statedump.decode(saved.state)
        numbers = sorted(int(b["header"]["number"], 16) for b in dump["blocks"])
        assert numbers == list(range(saved.head + 1))


# --- dev keys ------------------------------------------------------------------------------


async def test_dev_keys_are_kept_while_valid_and_replaced_when_not(
    store_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "dev-keys.json"
    async with open_store(store_url, tmp_path) as store:
        await store.migrate()
        # An account from an older data dir (the plan's limits, no overrides of its own).
        await AuthRows(store).create_account(DEV_EMAIL, "growth")
        first = await issue_dev_keys(store, PEPPER, path)
        assert first.new == ("test", "live")
        # Sized for development: every limit of its plan overridden, unlimited (0).
        dev = await AuthRows(store).find_account_by_email(DEV_EMAIL)
        assert dev is not None and dev.limits == DEV_LIMITS
        limits = Plans.load(Path("config/plans.toml")).limits(dev.plan, dev.limits)
        assert set(msgspec.structs.asdict(limits).values()) == {0}
        assert Plans.load(Path("config/plans.toml")).limits(dev.plan).requests_per_second > 0
        assert apikeys.environment_of(first.keys.test.encode()) == "test"
        assert apikeys.environment_of(first.keys.live.encode()) == "live"
        assert msgspec.json.decode(path.read_bytes(), type=DevKeys) == first.keys
        assert mode(path) == 0o600
        # Restarted: the same keys, nothing new, nothing revoked.
        path.chmod(0o644)
        again = await issue_dev_keys(store, PEPPER, path)
        assert (again.keys, again.new) == (first.keys, ())
        assert mode(path) == 0o600
        account = await AuthRows(store).find_account_by_email(DEV_EMAIL)
        assert account is not None
        rows = await AuthRows(store).list_keys(account.id)
        assert [r.revoked_at for r in rows] == [None, None]
        # The test key revoked meanwhile (`chaingate keys revoke`): only it is replaced.
        test_row = next(r for r in rows if r.environment == "test")
        await AuthRows(store).revoke_key(test_row.id)
        third = await issue_dev_keys(store, PEPPER, path)
        assert third.new == ("test",)
        assert third.keys.live == first.keys.live and third.keys.test != first.keys.test
        # A key in the file the store does not know (another store, another pepper): replaced,
        # and the dev keys nobody holds any more are revoked.
        other = await issue_dev_keys(store, b"another pepper", path)
        assert other.new == ("test", "live")
        active = [r for r in await AuthRows(store).list_keys(account.id) if r.revoked_at is None]
        assert len(active) == 2
        assert {r.key_hash for r in active} == {
            apikeys.hash_key(b"another pepper", k.encode())
            for k in (other.keys.test, other.keys.live)
        }
        # A damaged file: new keys written over it.
        path.write_text("{not json")
        fixed = await issue_dev_keys(store, PEPPER, path)
        assert fixed.new == ("test", "live")
        assert msgspec.json.decode(path.read_bytes(), type=DevKeys) == fixed.keys
