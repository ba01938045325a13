"""The devnet that shows everything: real anvil, real contracts, answers read back over JSON-RPC.

Most tests share the session's ``devnet`` fixture (one anvil, bootstrapped once); the start-up
test starts its own nodes with an empty cache to measure a first and a second start.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chaingate import cli
from chaingate.config.manifest import (
    Manifest,
    ManifestError,
    load_manifest,
    loads,
    save_manifest,
)
from chaingate.devnet import erc4337, state_cache
from chaingate.devnet.anvil import AnvilProcess, free_port
from chaingate.devnet.bootstrap import bootstrap_devnet
from chaingate.devnet.npm import cache_root
from chaingate.devnet.rpc import DevnetRpc, RpcError
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address, create2_address, create_address
from chaingate.evm.keys import PrivateKey, load_or_create_key, recover_address
from tests.conftest import DEVNET_SIGNER
from tests.helpers import read_dev_banner

Devnet = tuple[AnvilProcess, Manifest]
TRANSFER = abi.event_topic("Transfer(address,address,uint256)")
ZERO_TOPIC = "0x" + "00" * 32
ETHER = 10**18

# Mainnet addresses, written out here independently of the bootstrap's own table.
MAINNET = {
    "entry_point_v06": "0x5FF137D4b0FDCD49DcA30c7CF57E578a026d2789",
    "entry_point_v07": "0x0000000071727De22E5E9d8BAf0edAc6f37da032",
    "simple_account_factory_v06": "0x9406Cc6185a346906296840746125a0E44976454",
    "simple_account_factory_v07": "0x91E60e0613810449d098b0b5Ec8b51A0FE8c8985",
}


def call(url: str, to: str, signature: str, returns: str, *args: Any) -> tuple[Any, ...]:
    """eth_call ``signature`` on ``to`` and decode ``returns`` (``"(uint256,string)"``)."""
    with DevnetRpc(url) as rpc:
        data = rpc.call(
            "eth_call",
            {"to": to, "input": "0x" + abi.encode_call(signature, *args).hex()},
            "latest",
        )
    return abi.decode(returns, bytes.fromhex(data[2:]))


def one(url: str, to: str, signature: str, returns: str, *args: Any) -> Any:
    return call(url, to, signature, f"({returns})", *args)[0]


# --- EVM primitives ------------------------------------------------------------------------


def test_keys_derive_anvils_first_account_and_sign_recoverably(tmp_path: Path) -> None:
    key = PrivateKey.from_hex("0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")
    assert key.address == "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
    assert "ac0974" not in repr(key) and key.address in repr(key)
    digest = bytes(range(32))
    signature = key.sign_digest(digest)
    assert len(signature) == 65 and signature[64] in (27, 28)
    assert recover_address(digest, signature) == key.address
    with pytest.raises(ValueError, match="not a valid secp256k1"):
        PrivateKey(bytes(32))  # zero is not a key
    path = tmp_path / "signer.key"
    created = load_or_create_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_or_create_key(path).address == created.address


def test_addresses_match_known_vectors() -> None:
    # EIP-1014's first example; anvil's first deployment from its first account.
    assert create2_address(bytes(20), bytes(32), b"\x00") == (
        "0x4D1A2e2bB4F88F0250f26Ffff098B0b30B26BF38"
    )
    assert create_address("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266", 0) == (
        "0x5FbDB2315678afecb367f032d93F642f64180aa3"
    )
    assert checksum_address("0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed") == (
        "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"  # EIP-55's first example
    )


def test_abi_round_trips_nested_dynamic_types_and_matches_solidity_layout() -> None:
    assert abi.selector("transfer(address,uint256)").hex() == "a9059cbb"
    types = ["uint8", "int256", "string", "(address,bool,bytes)[]", "bytes32", "uint256[2]"]
    values = [
        7,
        -5,
        "héllo",
        [("0x" + "11" * 20, True, b"\x01\x02"), ("0x" + "22" * 20, False, b"")],
        b"\xaa" * 32,
        [1, 2],
    ]
    decoded = abi.decode(types, abi.encode(types, values))
    assert decoded[:3] == (7, -5, "héllo")
    assert decoded[3] == [
        (checksum_address("0x" + "11" * 20), True, b"\x01\x02"),
        (checksum_address("0x" + "22" * 20), False, b""),
    ]
    assert decoded[4:] == (b"\xaa" * 32, [1, 2])
    # Solidity's documented example: f(uint256,uint32[],bytes10,bytes) with (0x123, [0x456,
    # 0x789], "1234567890", "Hello, world!").
    encoded = abi.encode_call(
        "f(uint256,uint32[],bytes10,bytes)", 0x123, [0x456, 0x789], b"1234567890", b"Hello, world!"
    )
    words = [encoded[4 + i : 4 + i + 32].hex() for i in range(0, len(encoded) - 4, 32)]
    assert encoded[:4].hex() == "8be65246"
    assert [int(w, 16) for w in words[:2]] == [0x123, 0x80]
    assert int(words[3], 16) == 0xE0 and int(words[4], 16) == 2
    with pytest.raises(abi.AbiError):
        abi.encode(["uint8"], [256])


def test_manifest_round_trips_and_refuses_other_schemas(devnet: Devnet, tmp_path: Path) -> None:
    _, manifest = devnet
    path = save_manifest(manifest, tmp_path / "m.json")
    assert load_manifest(path) == manifest
    assert DEVNET_SIGNER.hex()[2:] not in path.read_text()  # the signer's address, never its key
    raw = json.loads(path.read_text())
    raw["schema"] = 99
    with pytest.raises(ManifestError):
        loads(json.dumps(raw))
    with pytest.raises(ManifestError):
        load_manifest(tmp_path / "missing.json")
    with pytest.raises(KeyError, match="no contract 'nope'"):
        manifest.address("nope")


# --- ERC-4337 ------------------------------------------------------------------------------


def test_erc4337_contracts_sit_at_their_mainnet_addresses(devnet: Devnet) -> None:
    node, manifest = devnet
    for name, address in MAINNET.items():
        contract = manifest.contract(name)
        assert contract.address == address and contract.canonical, name
    assert not manifest.contract("verifying_paymaster_v07").canonical
    with DevnetRpc(node.url) as rpc:
        codes = rpc.batch([("eth_getCode", [a, "latest"]) for a in MAINNET.values()])
    assert all(len(code) > 1000 for code in codes)


def test_npm_bytecode_reproduces_the_canonical_addresses() -> None:
    # The bootstrap asserts this before deploying; check the same fact from the artifacts.
    from chaingate.devnet.artifacts import aa_artifacts
    from chaingate.devnet.deploy import DETERMINISTIC_DEPLOYER

    artifacts = aa_artifacts(erc4337.ARTIFACTS)
    ep06 = create2_address(DETERMINISTIC_DEPLOYER, bytes(32), artifacts["entry_point_v06"].bytecode)
    ep07 = create2_address(
        DETERMINISTIC_DEPLOYER,
        erc4337.V07_ENTRY_POINT_SALT,
        artifacts["entry_point_v07"].bytecode,
    )
    assert (ep06, ep07) == (MAINNET["entry_point_v06"], MAINNET["entry_point_v07"])
    for tag in ("v06", "v07"):
        init = artifacts[f"simple_account_factory_{tag}"].bytecode + abi.encode(
            ["address"], [MAINNET[f"entry_point_{tag}"]]
        )
        assert (
            create2_address(DETERMINISTIC_DEPLOYER, bytes(32), init)
            == (MAINNET[f"simple_account_factory_{tag}"])
        )


@pytest.mark.parametrize("tag", ["v06", "v07"])
def test_entry_point_nonces(devnet: Devnet, tag: str) -> None:
    node, manifest = devnet
    entry_point = manifest.address(f"entry_point_{tag}")
    someone = manifest.accounts[5]
    # A 2D nonce: the key in the high 192 bits, sequence 0.
    assert one(node.url, entry_point, "getNonce(address,uint192)", "uint256", someone, 0) == 0
    assert one(node.url, entry_point, "getNonce(address,uint192)", "uint256", someone, 7) == (
        7 << 64
    )


@pytest.mark.parametrize("tag", ["v06", "v07"])
def test_factory_predicts_where_create_account_deploys(devnet: Devnet, tag: str) -> None:
    node, manifest = devnet
    factory = manifest.address(f"simple_account_factory_{tag}")
    owner, salt = manifest.accounts[6], 42
    predicted = one(node.url, factory, "getAddress(address,uint256)", "address", owner, salt)
    created = one(node.url, factory, "createAccount(address,uint256)", "address", owner, salt)
    assert predicted == created
    with DevnetRpc(node.url) as rpc:
        assert rpc.call("eth_getCode", predicted, "latest") == "0x"  # simulated, not sent
    implementation = one(node.url, factory, "accountImplementation()", "address")
    assert one(node.url, implementation, "entryPoint()", "address") == manifest.address(
        f"entry_point_{tag}"
    )


@pytest.mark.parametrize("tag", ["v06", "v07"])
def test_verifying_paymaster_is_ours_funded_and_staked(devnet: Devnet, tag: str) -> None:
    node, manifest = devnet
    paymaster = manifest.contract(f"verifying_paymaster_{tag}")
    entry_point = manifest.address(paymaster.entry_point or "")
    assert manifest.paymaster_signer == DEVNET_SIGNER.address
    assert one(node.url, paymaster.address, "verifyingSigner()", "address") == (
        DEVNET_SIGNER.address
    )
    assert one(node.url, paymaster.address, "owner()", "address") == manifest.deployer
    deposit = one(node.url, entry_point, "balanceOf(address)", "uint256", paymaster.address)
    assert deposit == erc4337.PAYMASTER_DEPOSIT > 0
    # getDepositInfo: (deposit, staked, stake, unstakeDelaySec, withdrawTime)
    info = call(
        node.url,
        entry_point,
        "getDepositInfo(address)",
        "((uint256,bool,uint112,uint32,uint48))",
        paymaster.address,
    )[0]
    assert info[1] is True and info[2] == erc4337.PAYMASTER_STAKE and info[3] == 86_400


def test_entry_point_simulations_is_deployed(devnet: Devnet) -> None:
    node, manifest = devnet
    simulations = manifest.contract("entry_point_simulations_v07")
    assert simulations.version == "0.7" and not simulations.canonical
    with DevnetRpc(node.url) as rpc:
        assert len(rpc.call("eth_getCode", simulations.address, "latest")) > 1000


# --- demo assets ---------------------------------------------------------------------------


def test_erc20s_answer_with_their_history(devnet: Devnet) -> None:
    node, manifest = devnet
    a1, a2, a3 = manifest.accounts[1:4]
    usd, cgt = manifest.address("erc20_cgusd"), manifest.address("erc20_cgt")
    assert one(node.url, usd, "decimals()", "uint8") == 6
    assert one(node.url, cgt, "decimals()", "uint8") == 18
    assert one(node.url, usd, "symbol()", "string") == "CGUSD"
    assert one(node.url, cgt, "symbol()", "string") == "CGT"
    assert manifest.contract("erc20_cgusd").decimals == 6
    # Minted 5,000 and 2,500; a1 sent a2 125.
    assert one(node.url, usd, "balanceOf(address)", "uint256", a1) == 4_875 * 10**6
    assert one(node.url, usd, "balanceOf(address)", "uint256", a2) == 2_625 * 10**6
    assert one(node.url, usd, "allowance(address,address)", "uint256", a2, a3) == 100 * 10**6
    # a3: minted 1,000, airdropped 10, burned 5.  Supply: 1,001,000 minted less the burn.
    assert one(node.url, cgt, "balanceOf(address)", "uint256", a3) == 1_005 * ETHER
    assert one(node.url, cgt, "totalSupply()", "uint256") == 1_000_995 * ETHER


def _decode_cid(uri: str) -> bytes:
    text = uri.removeprefix("ipfs://")
    assert text.startswith("b")  # CIDv1, base32
    body = text[1:].upper()
    return base64.b32decode(body + "=" * (-len(body) % 8))


def test_erc721_token_uris_in_all_three_forms(devnet: Devnet) -> None:
    node, manifest = devnet
    nft = manifest.address("erc721_collection")
    uris = [one(node.url, nft, "tokenURI(uint256)", "string", i) for i in (1, 2, 3)]
    prefix = "data:application/json;base64,"
    assert uris[0].startswith(prefix)
    metadata = json.loads(base64.b64decode(uris[0][len(prefix) :]))
    assert metadata["name"] == "Devnet #1" and metadata["image"].startswith("data:image/svg+xml")
    cid = _decode_cid(uris[1])
    assert cid[:4] == bytes([0x01, 0x55, 0x12, 0x20]) and len(cid) == 36  # raw, sha2-256
    assert uris[2].startswith("https://") and uris[2].endswith("/3.json")
    assert one(node.url, nft, "supportsInterface(bytes4)", "bool", bytes.fromhex("80ac58cd"))
    # Token 1 changed hands; token 4 was burned.
    assert one(node.url, nft, "ownerOf(uint256)", "address", 1) == manifest.accounts[2]
    assert one(node.url, nft, "totalSupply()", "uint256") == 3
    with pytest.raises(RpcError):
        one(node.url, nft, "tokenURI(uint256)", "string", 4)


def test_erc1155_balances_and_uris(devnet: Devnet) -> None:
    node, manifest = devnet
    items = manifest.address("erc1155_items")
    a1, a2, a3 = manifest.accounts[1:4]
    balance = "balanceOf(address,uint256)"
    assert one(node.url, items, balance, "uint256", a1, 1) == 90
    assert one(node.url, items, balance, "uint256", a3, 1) == 10
    assert one(node.url, items, balance, "uint256", a2, 2) == 5
    assert one(node.url, items, balance, "uint256", a3, 3) == 0  # burned
    assert one(node.url, items, "uri(uint256)", "string", 1).startswith("data:application/json")
    assert one(node.url, items, "uri(uint256)", "string", 2).endswith("/items/{id}.json")
    assert one(node.url, items, "uri(uint256)", "string", 3).startswith("ipfs://b")
    assert one(node.url, items, "supportsInterface(bytes4)", "bool", bytes.fromhex("d9b67a26"))


def test_multicall3_aggregate3_batches_two_reads(devnet: Devnet) -> None:
    node, manifest = devnet
    usd, cgt = manifest.address("erc20_cgusd"), manifest.address("erc20_cgt")
    calls = [
        (usd, False, abi.encode_call("decimals()")),
        (cgt, False, abi.encode_call("symbol()")),
        (usd, True, abi.encode_call("nonexistent()")),  # allowed to fail
    ]
    results = one(
        node.url,
        manifest.address("multicall3"),
        "aggregate3((address,bool,bytes)[])",
        "(bool,bytes)[]",
        calls,
    )
    assert results[0][0] and abi.decode(["uint8"], results[0][1]) == (6,)
    assert results[1][0] and abi.decode(["string"], results[1][1]) == ("CGT",)
    assert results[2][0] is False


def test_price_feeds_answer_like_chainlink(devnet: Devnet) -> None:
    node, manifest = devnet
    eth = manifest.address(manifest.native_price_feed)
    assert one(node.url, eth, "decimals()", "uint8") == 8
    assert one(node.url, eth, "description()", "string") == "ETH / USD"
    round_id, answer, started, updated, answered_in = call(
        node.url, eth, "latestRoundData()", "(uint80,int256,uint256,uint256,uint80)"
    )
    assert (round_id, answer, answered_in) == (2, 3012_34000000, 2)  # updated once
    assert 0 < started <= updated
    priced = [t for t in manifest.of_kind("erc20").values() if t.price_feed is not None]
    assert {t.symbol for t in priced} == {"CGUSD", "CGT"}  # the odd tokens have no feed
    for token in priced:
        feed = manifest.address(token.price_feed or "")
        assert one(node.url, feed, "description()", "string") == f"{token.symbol} / USD"
        assert one(node.url, feed, "latestRoundData()", "(uint80,int256,uint256,uint256,uint80)")
    usd_feed = manifest.address("feed_cgusd_usd")
    assert (
        call(node.url, usd_feed, "latestRoundData()", "(uint80,int256,uint256,uint256,uint80)")[1]
        == 10**8
    )


def test_history_left_transfer_logs(devnet: Devnet) -> None:
    node, manifest = devnet
    expected = {"erc20_cgusd": 4, "erc20_cgt": 13, "erc721_collection": 6}
    with DevnetRpc(node.url) as rpc:
        logs = rpc.call(
            "eth_getLogs",
            {
                "fromBlock": "0x0",
                "toBlock": hex(manifest.block),
                "address": [manifest.address(name) for name in expected],
                "topics": [TRANSFER],
            },
        )
    by_contract: dict[str, list[dict[str, Any]]] = {}
    for log in logs:
        by_contract.setdefault(checksum_address(log["address"]), []).append(log)
    for name, count in expected.items():
        assert len(by_contract[manifest.address(name)]) == count, name
    burns = [log for log in logs if log["topics"][2] == ZERO_TOPIC]
    assert len(burns) == 2  # one CGT burn, one NFT burn
    mints = [log for log in logs if log["topics"][1] == ZERO_TOPIC]
    assert len(mints) == 3 + 2 + 4


# --- start-up, cache, chaingate dev --------------------------------------------------------


def test_second_start_reuses_the_cache(tmp_path: Path) -> None:
    """The first start compiles and deploys; the second loads the cached state and does
    neither.  How long each takes is printed, not asserted: a timed test fails on a busy
    machine, and docs/start.md's figures come from `chaingate dev`'s own lines."""
    cache = tmp_path / "cache"
    said: list[str] = []
    times = []
    manifests = []
    starts: list[int] = []  # where each start's lines end in `said`
    ends: list[int] = []  # where each iteration's lines end (the first bootstraps twice)
    # The cache's maker and its user started with other block gas limits, as the benches do
    # (issue 27): the state loads, the gas limit stays the loading node's own.
    for gas_limit in (100_000_000, 1_000_000_000):
        started = time.monotonic()
        with AnvilProcess(extra=("--gas-limit", str(gas_limit))) as node:
            manifest = bootstrap_devnet(
                node.url,
                paymaster_signer=DEVNET_SIGNER.address,
                cache_dir=cache,
                announce=said.append,
            )
            times.append(time.monotonic() - started)
            manifests.append(manifest)
            starts.append(len(said))
            with DevnetRpc(node.url) as rpc:
                logs = rpc.call("eth_getLogs", {"fromBlock": "0x0", "topics": [TRANSFER]})
                rpc.call("evm_mine")
                mined = rpc.call("eth_getBlockByNumber", "latest", False)
            assert len(logs) >= 23  # the history came back with the state
            assert int(mined["gasLimit"], 16) == gas_limit
            if len(manifests) == 1:
                # Bootstrapping a node that already has it keeps every CREATE2 contract.
                again = bootstrap_devnet(
                    node.url,
                    paymaster_signer=DEVNET_SIGNER.address,
                    cache_dir=cache,
                    announce=said.append,
                )
                for name, contract in manifest.contracts.items():
                    if contract.kind != "paymaster":
                        assert again.address(name) == contract.address, name
        ends.append(len(said))
    print(f"devnet start: first {times[0]:.2f}s, second {times[1]:.2f}s")
    assert manifests[0] == manifests[1]
    first, second = said[: starts[0]], said[ends[0] : starts[1]]
    # What took the first start's seconds is said as it happens: compiling, then deploying.
    assert first[0].startswith("devnet: compiling the demo contracts") and first[0].endswith("...")
    assert first[1].startswith("devnet: compiled in ")
    assert re.fullmatch(r"devnet: \d+ contracts deployed in [\d.]+s \(state cached.*\)", first[2])
    # The second start neither compiles nor deploys: it loads the state the first one cached.
    assert not any("compil" in line or "deployed in" in line for line in second), second
    assert "loaded from cache" in second[-1]
    assert len(list(cache.glob("state-*.manifest.json"))) == 1  # the non-fresh run cached nothing


def test_a_cache_entry_that_does_not_hold_up_is_discarded(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with AnvilProcess() as node:
        manifest = bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, cache_dir=cache, announce=print
        )
    state_path = cache / f"state-{manifest.cache_key}.hex"
    with AnvilProcess() as node, DevnetRpc(node.url) as rpc:
        empty_state = rpc.call("anvil_dumpState")
    state_path.write_text(empty_state)  # a state that lost its contracts
    with AnvilProcess() as node, pytest.raises(RuntimeError, match="missing"):
        bootstrap_devnet(
            node.url, paymaster_signer=DEVNET_SIGNER.address, cache_dir=cache, announce=print
        )
    assert state_cache.load(cache, manifest.cache_key) is None


def test_a_node_without_the_deployment_proxy_is_refused(tmp_path: Path) -> None:
    from chaingate.devnet.deploy import DETERMINISTIC_DEPLOYER

    with AnvilProcess() as node:
        with DevnetRpc(node.url) as rpc:
            rpc.call("anvil_setCode", DETERMINISTIC_DEPLOYER, "0x")
        with pytest.raises(RuntimeError, match="no deterministic deployment proxy"):
            bootstrap_devnet(
                node.url,
                paymaster_signer=DEVNET_SIGNER.address,
                cache_dir=tmp_path,
                announce=print,
            )


def test_dev_settings_name_the_manifest_under_the_data_dir(tmp_path: Path) -> None:
    args = argparse.Namespace(
        port=0, host="127.0.0.1", data_dir=str(tmp_path), anvil_port=0, paymaster_key=None
    )
    settings = cli._dev_settings(args, "http://127.0.0.1:8545")
    assert settings.chains["ethereum"]["devnet"].manifest == str(tmp_path / cli.DEVNET_MANIFEST)


def test_chaingate_dev_writes_the_manifest_its_settings_name(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chaingate",
            "dev",
            "--port",
            str(free_port()),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A home of its own too: nothing of this run may reach the user's.
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("CHAINGATE_")},
            "HOME": str(tmp_path / "home"),
            "XDG_DATA_HOME": str(tmp_path / "home" / "share"),
            "CHAINGATE_CACHE_DIR": str(cache_root()),
        },
    )
    try:
        text = read_dev_banner(process)
        assert "chaingate dev is up." in text, text
        path = data_dir / cli.DEVNET_MANIFEST
        assert f"manifest  {path}" in text
        manifest = load_manifest(path)
        key = PrivateKey.from_hex((data_dir / cli.PAYMASTER_KEY_FILE).read_text())
        assert manifest.paymaster_signer == key.address
        assert key.hex()[2:] not in text  # the key itself is never printed
        anvil_url = re.search(r"anvil\s+(http://\S+)", text)
        assert anvil_url, text
        entry_point = manifest.address("entry_point_v07")
        assert (
            one(
                anvil_url.group(1),
                entry_point,
                "getNonce(address,uint192)",
                "uint256",
                manifest.deployer,
                0,
            )
            == 0
        )
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert process.stdout is not None
    assert code == 0, process.stdout.read()
