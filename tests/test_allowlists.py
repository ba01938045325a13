"""Per-key allowlists: each list refuses what it should and nothing else.

Units first (parsing, matching, the ``to`` of every transaction type), then each list end to
end through a real gateway with keys on, against real anvil, on both framing twins and both
stores; then ``chaingate keys update`` setting and clearing them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from eth_account import Account

from chaingate import cli
from chaingate.auth import admin, allowlists
from chaingate.auth.allowlists import AllowlistError, Policy, build
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.evm import rlp
from chaingate.evm.keys import PrivateKey
from chaingate.evm.tx import Eip1559, tx_target
from chaingate.store import open_store
from chaingate.twins import Impl
from tests.test_auth import PEPPER, RPC, AuthStack, auth_settings, start_auth
from tests.ws_clients import deploy_logger

LISTED = "0x" + "11" * 20
OTHER = "0x" + "22" * 20
# anvil's first dev account (its well-known test key).
DEV_KEY = bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")


def policy(**lists: list[str]) -> Policy:
    return Policy(build(**lists))


def params(*items: Any) -> bytes:
    return json.dumps(list(items)).encode()


# --- parsing ---------------------------------------------------------------------------------


def test_entries_are_normalised() -> None:
    assert allowlists.parse_origin(" HTTPS://App.Example.com:443/ ") == "https://app.example.com"
    assert allowlists.parse_origin("http://localhost:5173") == "http://localhost:5173"
    assert allowlists.parse_origin("https://*.example.com") == "https://*.example.com"
    assert allowlists.parse_ip("10.1.2.3/8") == "10.0.0.0/8"
    assert allowlists.parse_ip("2001:db8::1") == "2001:db8::1/128"
    assert allowlists.parse_contract("0x" + "aB" * 20) == "0x" + "ab" * 20


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (allowlists.parse_origin, "example.com"),  # no scheme
        (allowlists.parse_origin, "ftp://example.com"),
        (allowlists.parse_origin, "https://example.com/app"),  # a path is not an origin
        (allowlists.parse_origin, "https://ex*ample.com"),
        (allowlists.parse_origin, "https://*.[::1]"),
        (allowlists.parse_origin, "https://example.com:99999"),
        (allowlists.parse_origin, "null"),
        (allowlists.parse_ip, "10.0.0.0/33"),
        (allowlists.parse_ip, "localhost"),
        (allowlists.parse_method, "eth call"),
        (allowlists.parse_contract, "0x1234"),
    ],
)
def test_bad_entries_are_refused_with_a_reason(parse: Any, text: str) -> None:
    with pytest.raises(AllowlistError, match=r"\S"):
        parse(text)


def test_stored_form_round_trips_and_lists_are_bounded() -> None:
    lists = build(origins=["https://a.example"], methods=["eth_call"])
    text = allowlists.dumps(lists)
    assert text is not None and json.loads(text) == {
        "origins": ["https://a.example"],
        "methods": ["eth_call"],
    }
    assert allowlists.loads(text) == lists
    assert allowlists.dumps(build()) is None
    with pytest.raises(AllowlistError, match="at most 256"):
        build(methods=[f"m{i}" for i in range(257)])


# --- matching --------------------------------------------------------------------------------


def test_origin_list() -> None:
    p = policy(
        origins=["https://app.example.com", "https://*.example.org", "http://localhost:3000"]
    )
    for allowed in (
        b"https://app.example.com",
        b"https://APP.example.com",
        b"https://a.example.org",
        b"https://a.b.example.org",
        b"http://localhost:3000",
    ):
        assert p.origin_refusal(allowed) is None, allowed
    for refused in (
        b"http://app.example.com",  # scheme
        b"https://app.example.com:8443",  # port
        b"https://example.org",  # a wildcard is for subdomains, not the apex
        b"https://evilexample.org",
        b"https://example.org.evil.com",
        b"https://.example.org",
        b"https://a.example.org:443",  # browsers never send a default port
        b"http://localhost:3001",
        b"null",
    ):
        message = p.origin_refusal(refused)
        assert message is not None and "origin allowlist" in message, refused
        assert "https://app.example.com" in message and "https://*.example.org" in message
    missing = p.origin_refusal(None)
    assert missing is not None and "no Origin" in missing
    assert policy(methods=["eth_call"]).origin_refusal(None) is None  # no origin list


def test_ip_list() -> None:
    p = policy(ips=["203.0.113.0/24", "2001:db8::/32"])
    for allowed in ("203.0.113.7", "2001:db8:1::5", "::ffff:203.0.113.9"):
        assert p.peer_refusal(allowed) is None, allowed
    for refused in ("203.0.114.1", "127.0.0.1", "2001:db9::1", "unix", "::1"):
        message = p.peer_refusal(refused)
        assert message is not None and "IP allowlist (203.0.113.0/24, 2001:db8::/32)" in message
    assert policy(methods=["eth_call"]).peer_refusal("198.51.100.1") is None


def test_method_list() -> None:
    p = policy(methods=["eth_blockNumber", "eth_call"])
    assert p.call_refusal("eth_blockNumber", None) is None
    assert p.call_refusal("eth_call", params({"to": OTHER})) is None  # no contract list
    code, message = p.call_refusal("eth_sendRawTransaction", params("0x00")) or (0, "")
    assert code == allowlists.METHOD_NOT_SUPPORTED
    assert "method allowlist (eth_blockNumber, eth_call)" in message
    assert p.call_refusal(None, None) is not None


def _legacy(to: bytes) -> bytes:
    return rlp.encode([b"\x01", b"\x02", b"\x52\x08", to, b"", b"", b"\x1b", b"\x01", b"\x02"])


def _typed(kind: int, to: bytes) -> bytes:
    before = {1: 4, 2: 5, 3: 5, 4: 5}[kind]
    after = {1: 3, 2: 3, 3: 5, 4: 4}[kind]  # value, data, access list (+ blob fields, auths)
    fields: list[rlp.Item] = [b"\x01"] * before
    fields += [to, *[b""] * after, b"", b"\x01", b"\x02"]
    return bytes([kind]) + rlp.encode(fields)


def test_raw_transaction_target_of_every_type() -> None:
    to = bytes.fromhex(LISTED[2:])
    assert tx_target(_legacy(to)) == to
    assert tx_target(_legacy(b"")) is None  # a contract creation
    for kind in (1, 2, 3, 4):
        assert tx_target(_typed(kind, to)) == to, kind
    # EIP-4844's network form wraps the transaction with its blobs, commitments and proofs.
    inner = rlp.decode(_typed(3, to)[1:])
    wrapped = b"\x03" + rlp.encode([inner, [b"\x00" * 64], [b"\x01" * 48], [b"\x02" * 48]])
    assert tx_target(wrapped) == to
    for junk in (b"", b"\x05\xc0", b"\x02\xc3\x01\x02\x03", b"\xf8", _legacy(b"\x01" * 19)):
        with pytest.raises(ValueError, match=r"\S"):
            tx_target(junk)


def test_raw_transaction_target_of_real_signed_transactions() -> None:
    """eth-account's encodings (an independent implementation) of legacy, 2930 and 1559."""
    account = Account.from_key(DEV_KEY)
    base = {"nonce": 3, "gas": 21000, "to": LISTED, "value": 1, "chainId": 31337}
    for tx in (
        {**base, "gasPrice": 10},
        {**base, "gasPrice": 10, "accessList": [], "type": 1},
        {**base, "maxFeePerGas": 10, "maxPriorityFeePerGas": 1, "type": 2},
    ):
        raw = bytes(account.sign_transaction(tx).raw_transaction)
        assert tx_target(raw) == bytes.fromhex(LISTED[2:])


def test_contract_list() -> None:
    p = policy(contracts=[LISTED])
    listed = bytes.fromhex(LISTED[2:])
    ok = [
        ("eth_call", params({"to": LISTED.upper().replace("0X", "0x"), "data": "0x"}, "latest")),
        ("eth_estimateGas", params({"to": LISTED})),
        ("eth_getLogs", params({"address": LISTED, "fromBlock": "0x0"})),
        ("eth_getLogs", params({"address": [LISTED, LISTED]})),
        ("eth_newFilter", params({"address": LISTED})),
        ("eth_sendRawTransaction", params("0x" + _typed(2, listed).hex())),
        ("eth_getBalance", params(OTHER, "latest")),  # not a contract-targeting method
        ("eth_blockNumber", None),
    ]
    for method, raw in ok:
        assert p.call_refusal(method, raw) is None, method
    refused = [
        ("eth_call", params({"to": OTHER}), "contract 0x" + "22" * 20),
        ("eth_call", params({"data": "0x00"}), "creates a contract"),
        ("eth_getLogs", params({"address": [LISTED, OTHER]}), "contract 0x" + "22" * 20),
        ("eth_getLogs", params({"fromBlock": "0x0"}), "every contract's logs"),
        ("eth_getLogs", params({"address": []}), "every contract's logs"),
        ("eth_getLogs", params({"blockHash": "0x" + "00" * 32}), "every contract's logs"),
        (
            "eth_sendRawTransaction",
            params("0x" + _legacy(bytes(20)).hex()),
            "contract 0x" + "00" * 20,
        ),
        ("eth_sendRawTransaction", params("0x" + _legacy(b"").hex()), "creates a contract"),
        ("eth_sendRawTransaction", params("0xzz"), "malformed"),
        ("eth_call", b"[1]", "malformed"),
        ("eth_call", None, "malformed"),
    ]
    for method, raw, reason in refused:
        found = p.call_refusal(method, raw)
        assert found is not None, (method, raw)
        code, message = found
        assert code == allowlists.RESOURCE_UNAVAILABLE
        assert reason in message and f"contract allowlist ({LISTED})" in message, message


def test_logs_subscription_is_a_filter() -> None:
    p = policy(contracts=[LISTED])
    assert p.subscribe_refusal(["newHeads"]) is None
    assert p.subscribe_refusal(["logs", {"address": LISTED}]) is None
    assert p.subscribe_refusal(["logs", {"address": OTHER}]) is not None
    assert p.subscribe_refusal(["logs"]) is not None
    m = policy(methods=["eth_call"])
    refused = m.subscribe_refusal(["newHeads"])
    assert refused is not None and refused[0] == allowlists.METHOD_NOT_SUPPORTED


def test_unreadable_stored_lists_refuse_everything() -> None:
    p = Policy.refusing('{"origins": 5}')
    assert p.origin_refusal(b"https://a.example") is not None
    assert p.origin_refusal(None) is not None


# --- end to end ------------------------------------------------------------------------------


@pytest.fixture
async def stack(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, store_url: str, tmp_path: Path
) -> AuthStack:
    return await start_auth(nursery, impl, auth_settings(anvil, store_url, tmp_path))


async def restricted(stack: AuthStack, **lists: list[str]) -> tuple[str, str]:
    """A new key with these lists, in force in the gateway."""
    key, key_id = await stack.key()
    updated = await admin.update_allowlists(AuthRows(stack.store), key_id, lists, set())
    assert updated is not None and updated.allowlists is not None
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    return key, key_id


def call(method: str, *items: Any, id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": list(items)}


async def post(
    stack: AuthStack, key: str, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    async with stack.client(key) as client:
        return await client.post(RPC, json=body, headers=headers or {})


async def test_origin_list_end_to_end(stack: AuthStack) -> None:
    key, _ = await restricted(stack, origins=["https://app.example.com", "https://*.example.org"])
    for origin in ("https://app.example.com", "https://x.example.org"):
        ok = await post(stack, key, call("eth_blockNumber"), {"Origin": origin})
        assert ok.status_code == 200 and ok.json()["result"].startswith("0x")
        assert ok.headers["access-control-allow-origin"] == origin
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "https://example.org"}, {}):
        refused = await post(stack, key, call("eth_blockNumber"), headers)
        assert refused.status_code == 403, headers
        # On a JSON-RPC path the refusal is JSON-RPC, with the call's id.
        assert refused.json()["id"] == call("eth_blockNumber")["id"]
        error = refused.json()["error"]
        assert error["code"] == -32002 and error["data"] == {"status": 403, "code": "forbidden"}
        assert (
            "origin allowlist (https://app.example.com, https://*.example.org)" in error["message"]
        )
        assert "access-control-allow-origin" not in refused.headers  # the page reads nothing
    # REST too (any key-checked path goes through the same gate).
    async with stack.client(key) as client:
        rest = await client.get("/v1/webhooks", headers={"Origin": "https://evil.example"})
        assert rest.status_code == 403 and "origin allowlist" in rest.json()["error"]["message"]
    # A key without lists: any origin.
    free, _ = await stack.key()
    anywhere = await post(stack, free, call("eth_blockNumber"), {"Origin": "https://evil.example"})
    assert anywhere.status_code == 200
    assert anywhere.headers["access-control-allow-origin"] == "https://evil.example"


async def test_origin_list_on_the_websocket_handshake(stack: AuthStack) -> None:
    from tests.test_ws import refused

    key, _ = await restricted(stack, origins=["https://app.example.com"])
    url = f"ws://127.0.0.1:{stack.handle.port}/v1/ws/ethereum/devnet?apiKey={key}"
    status, body = await trio.to_thread.run_sync(
        lambda: refused(url, origin="https://evil.example")
    )
    assert (
        status == 403 and "origin allowlist (https://app.example.com)" in body["error"]["message"]
    )

    def allowed() -> Any:
        from websockets.sync.client import connect
        from websockets.typing import Origin

        origin = Origin("https://app.example.com")
        with connect(url, origin=origin, open_timeout=10) as ws:
            ws.send(json.dumps(call("eth_chainId")))
            return json.loads(ws.recv(timeout=10))

    assert (await trio.to_thread.run_sync(allowed))["result"] == "0x7a69"


async def test_method_and_contract_lists_over_the_websocket(stack: AuthStack) -> None:
    key, _ = await restricted(stack, methods=["eth_chainId", "eth_subscribe"], contracts=[LISTED])
    url = f"ws://127.0.0.1:{stack.handle.port}/v1/ws/ethereum/devnet?apiKey={key}"

    def session() -> list[Any]:
        from websockets.sync.client import connect

        replies = []
        with connect(url, open_timeout=10) as ws:
            for message in (
                call("eth_chainId", id=1),
                call("eth_blockNumber", id=2),
                call("eth_subscribe", "logs", {"address": OTHER}, id=3),
                call("eth_subscribe", "logs", {"address": LISTED}, id=4),
            ):
                ws.send(json.dumps(message))
                replies.append(json.loads(ws.recv(timeout=10)))
        return replies

    chain, block, other, listed = await trio.to_thread.run_sync(session)
    assert chain["result"] == "0x7a69"
    assert block["error"]["code"] == allowlists.METHOD_NOT_SUPPORTED
    assert "method allowlist (eth_chainId, eth_subscribe)" in block["error"]["message"]
    assert other["error"]["code"] == allowlists.RESOURCE_UNAVAILABLE
    assert f"contract allowlist ({LISTED})" in other["error"]["message"]
    assert listed["result"].startswith("0x")


async def test_ip_list_end_to_end(stack: AuthStack) -> None:
    elsewhere, _ = await restricted(stack, ips=["203.0.113.0/24", "2001:db8::/32"])
    refused = await post(stack, elsewhere, call("eth_blockNumber"))
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    assert "127.0.0.1" in message and "IP allowlist (203.0.113.0/24, 2001:db8::/32)" in message
    here, _ = await restricted(stack, ips=["127.0.0.0/8", "::1"])
    ok = await post(stack, here, call("eth_blockNumber"))
    assert ok.status_code == 200 and ok.json()["result"].startswith("0x")


async def test_method_list_end_to_end(stack: AuthStack) -> None:
    key, _ = await restricted(stack, methods=["eth_blockNumber", "eth_chainId"])
    ok = await post(stack, key, call("eth_chainId"))
    assert ok.status_code == 200 and ok.json()["result"] == "0x7a69"
    refused = await post(stack, key, call("eth_getBalance", "0x" + "00" * 20, "latest", id=7))
    assert refused.status_code == 403
    reply = refused.json()
    assert reply["id"] == 7 and reply["error"]["code"] == allowlists.METHOD_NOT_SUPPORTED
    assert "method allowlist (eth_blockNumber, eth_chainId)" in reply["error"]["message"]
    # A batch: the refused call gets its own error, the others are answered.
    batch = await post(
        stack,
        key,
        [call("eth_chainId", id=1), call("eth_gasPrice", id=2), call("eth_blockNumber", id=3)],
    )
    assert batch.status_code == 200
    by_id = {reply["id"]: reply for reply in batch.json()}
    assert by_id[1]["result"] == "0x7a69" and by_id[3]["result"].startswith("0x")
    assert by_id[2]["error"]["code"] == allowlists.METHOD_NOT_SUPPORTED


async def test_contract_list_end_to_end(stack: AuthStack, anvil: AnvilProcess) -> None:
    logger = await trio.to_thread.run_sync(deploy_logger, anvil.url)
    key, _ = await restricted(stack, contracts=[logger, LISTED])
    emit = "0x" + "00" * 64  # the logger's two topics: the call runs (and reaches the node)
    ok = await post(stack, key, call("eth_call", {"to": logger, "data": emit}, "latest"))
    assert ok.status_code == 200 and "result" in ok.json()
    logs = await post(stack, key, call("eth_getLogs", {"address": logger, "fromBlock": "0x0"}))
    assert logs.status_code == 200 and isinstance(logs.json()["result"], list)
    for body in (
        call("eth_call", {"to": OTHER, "data": "0x"}, "latest"),
        call("eth_getLogs", {"fromBlock": "0x0"}),
        call("eth_getLogs", {"address": [logger, OTHER]}),
    ):
        refused = await post(stack, key, body)
        assert refused.status_code == 403, body
        assert refused.json()["error"]["code"] == allowlists.RESOURCE_UNAVAILABLE
        assert f"contract allowlist ({logger}, {LISTED})" in refused.json()["error"]["message"]
    # A signed transaction is judged by its own ``to``; a refused one never reaches the node.
    signer = PrivateKey(DEV_KEY)
    nonce = int(
        str(rpc_call(anvil.url, "eth_getTransactionCount", [signer.address, "pending"])), 16
    )

    def signed(to: str, n: int) -> str:
        tx = Eip1559(
            chain_id=31337,
            nonce=n,
            max_priority_fee_per_gas=1,
            max_fee_per_gas=10**11,
            gas=21000,
            to=to,
        )
        return "0x" + tx.sign(signer).hex()

    refused = await post(stack, key, call("eth_sendRawTransaction", signed(OTHER, nonce)))
    assert refused.status_code == 403 and "contract 0x" + "22" * 20 in refused.text
    pending = rpc_call(anvil.url, "eth_getTransactionCount", [signer.address, "pending"])
    assert int(str(pending), 16) == nonce
    sent = await post(stack, key, call("eth_sendRawTransaction", signed(LISTED, nonce)))
    assert sent.status_code == 200 and sent.json()["result"].startswith("0x"), sent.text


async def test_lists_change_and_clear_within_a_refresh(stack: AuthStack) -> None:
    key, key_id = await restricted(stack, methods=["eth_chainId"])
    assert (await post(stack, key, call("eth_blockNumber"))).status_code == 403
    await admin.update_allowlists(
        AuthRows(stack.store), key_id, {"methods": ["eth_blockNumber"]}, set()
    )
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    assert (await post(stack, key, call("eth_blockNumber"))).status_code == 200
    assert (await post(stack, key, call("eth_chainId"))).status_code == 403
    await admin.update_allowlists(AuthRows(stack.store), key_id, {}, {"all"})
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    assert (await post(stack, key, call("eth_chainId"))).status_code == 200


# --- chaingate keys update -------------------------------------------------------------------


def test_cli_sets_and_clears_lists(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "chaingate.toml"
    config_file.write_text(
        f'data_dir = "{tmp_path}"\n[store]\nurl = "{store_url}"\n[auth]\npepper = "{PEPPER}"\n'
    )
    base = ["keys", "--config", str(config_file)]
    assert cli.main([*base, "create", "--email", "cli@example.com"]) == 0
    key_id = capsys.readouterr().out.split()[1]
    assert key_id.startswith("key_")

    def stored() -> dict[str, Any]:
        async def read() -> str | None:
            store = open_store(store_url, tmp_path)
            async with store:
                rows = [row for row in await AuthRows(store).list_keys() if row.id == key_id]
                return rows[0].allowlists

        text = trio.run(read)
        return json.loads(text) if text else {}

    update = [*base, "update", key_id]
    assert (
        cli.main(
            [
                *update,
                "--allow-origin",
                "https://*.Example.com",
                "--allow-origin",
                "http://localhost:5173",
                "--allow-ip",
                "10.0.0.0/8,2001:db8::/32",
                "--allow-method",
                "eth_call",
                "--allow-contract",
                LISTED,
            ]
        )
        == 0
    )
    assert stored() == {
        "origins": ["https://*.example.com", "http://localhost:5173"],
        "ips": ["10.0.0.0/8", "2001:db8::/32"],
        "methods": ["eth_call"],
        "contracts": [LISTED],
    }
    assert cli.main([*update, "--allow-method", "eth_chainId", "--clear", "ips"]) == 0
    assert stored() == {
        "origins": ["https://*.example.com", "http://localhost:5173"],
        "methods": ["eth_chainId"],
        "contracts": [LISTED],
    }
    capsys.readouterr()
    assert cli.main([*base, "list"]) == 0
    assert "allow=" in capsys.readouterr().out
    # Bad input: a clear error, nothing stored.
    assert cli.main([*update, "--allow-origin", "example.com"]) == 2
    assert "not an origin" in capsys.readouterr().out
    assert cli.main([*update, "--allow-method", "eth_call", "--clear", "methods"]) == 2
    assert cli.main([*update]) == 2
    assert cli.main([*base, "update", "key_nope", "--clear", "all"]) == 1
    assert stored()["methods"] == ["eth_chainId"]
    assert cli.main([*update, "--clear", "all"]) == 0
    assert stored() == {}
