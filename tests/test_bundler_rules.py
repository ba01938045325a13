"""ERC-7562 rules through the JS tracer in debug_traceCall, against the real EntryPoints v0.6
and v0.7 on anvil.

The entities are tests/bundler_contracts/RuleBreakers.sol, compiled by the project's pinned
solc-js: an account, a paymaster and a factory that obey every rule in mode 0 and break one
rule family in each other mode (the mode travels in the operation: signature, paymasterData,
factoryData).  Every refused operation is also run through plain simulation (unsafe mode,
``simulation.simulate_validation``) and accepted there: the refusal is the rule's, not the
EntryPoint's.  The sans-IO rules are also checked on hand-made traces at the end.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler import rules, simulation
from chaingate.bundler.errors import BANNED_OPCODE, BundlerFault
from chaingate.bundler.safemode import validate_safe
from chaingate.bundler.tracecall import Call, CodeAccess, Phase, SlotAccess, Trace
from chaingate.chain.client import RpcCallError
from chaingate.config.manifest import Manifest
from chaingate.devnet.anvil import AnvilProcess
from chaingate.devnet.artifacts import Artifact
from chaingate.devnet.npm import cache_root
from chaingate.devnet.rpc import DevnetRpc
from chaingate.devnet.solc import compile_sources
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address, create2_address

Devnet = tuple[AnvilProcess, Manifest]
TAGS: dict[Version, str] = {"0.6": "v06", "0.7": "v07", "0.8": "v08"}
VERSIONS: list[Version] = ["0.6", "0.7", "0.8"]
SOURCE = Path(__file__).parent / "bundler_contracts" / "RuleBreakers.sol"

# RuleBreakers.sol's Breaks modes
OK, TIMESTAMP, NUMBER, GAS, BALANCE = 0, 1, 2, 3, 4
WRITE_OTHER, WRITE_ASSOCIATED, OOG, VALUE_CALL, NO_CODE = 5, 6, 7, 8, 9
ENTRY_POINT_CALL, CREATE, READ_OTHER, OWN_STORAGE, SELFBALANCE = 10, 11, 12, 13, 14
COINBASE, BASEFEE, ORIGIN, GASPRICE, BLOCKHASH = 15, 16, 17, 18, 19
PRECOMPILES, FAILING, CONTEXT = 20, 21, 22
# RuleFactory.deploy modes
FACTORY_OK, FACTORY_SECOND_CREATE2, FACTORY_OWN_STORAGE = 0, 1, 2


@pytest.fixture(scope="module")
def devnet(module_devnet: Devnet) -> Devnet:
    """This module's own devnet, not the session's: its operations deploy accounts and spend
    the paymasters' deposits, which other modules check."""
    return module_devnet


class Node:
    """The bundler's node-client interface over anvil's HTTP endpoint (a real client)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        async with httpx.AsyncClient(timeout=60) as client:
            reply = (await client.post(self.url, json=body)).json()
        if "error" in reply:
            error = reply["error"]
            raise RpcCallError(method, error["code"], error["message"], error.get("data"))
        return reply["result"]


class World:
    """The rule-breaking entities deployed on the devnet, funded and (some) staked."""

    def __init__(self, rpc: DevnetRpc, manifest: Manifest, artifacts: dict[str, Artifact]) -> None:
        self.rpc = rpc
        self.artifacts = artifacts
        self.funder = checksum_address(secrets.token_bytes(20))
        rpc.call("anvil_setBalance", self.funder, hex(10**24))
        rpc.call("anvil_impersonateAccount", self.funder)
        self.entry_points = {
            v: checksum_address(manifest.address(f"entry_point_{TAGS[v]}")) for v in VERSIONS
        }
        self.store = self.deploy("RuleStore", b"")
        store_arg = abi.encode(["address"], [self.store])
        self.account = self.deploy("RuleAccount", store_arg)
        self.paymaster = self.deploy("RulePaymaster", store_arg)
        self.staked_paymaster = self.deploy("RulePaymaster", store_arg)
        self.factory = self.deploy("RuleFactory", store_arg)
        self.account_init = artifacts["RuleAccount"].bytecode + store_arg
        for ep in self.entry_points.values():
            for who in (self.account, self.paymaster, self.staked_paymaster):
                self.send(ep, abi.encode_call("depositTo(address)", who), value=10**19)
            self.send(
                self.staked_paymaster,
                abi.encode_call("stake(address,uint32)", ep, rules.MIN_UNSTAKE_DELAY),
                value=rules.MIN_STAKE,
            )
        rpc.call("anvil_setBalance", self.account, hex(10**18))

    def send(self, to: str | None, data: bytes, value: int = 0) -> dict[str, Any]:
        tx: dict[str, Any] = {
            "from": self.funder,
            "input": "0x" + data.hex(),
            "gas": hex(5_000_000),
            "value": hex(value),
        }
        if to is not None:
            tx["to"] = to
        tx_hash = self.rpc.call("eth_sendTransaction", tx)
        deadline = time.monotonic() + 10
        while (receipt := self.rpc.call("eth_getTransactionReceipt", tx_hash)) is None:
            assert time.monotonic() < deadline, "transaction not mined"
            time.sleep(0.02)
        assert receipt["status"] == "0x1", receipt
        result: dict[str, Any] = receipt
        return result

    def deploy(self, name: str, args: bytes) -> str:
        receipt = self.send(None, self.artifacts[name].bytecode + args)
        return checksum_address(receipt["contractAddress"])

    def op(
        self,
        version: Version,
        *,
        mode: int = OK,
        paymaster: str | None = None,
        paymaster_mode: int = OK,
        factory_mode: int | None = None,
    ) -> UserOperation:
        sender, factory, factory_data = self.account, None, b""
        if factory_mode is not None:
            salt = secrets.token_bytes(32)
            sender = create2_address(self.factory, salt, self.account_init)
            factory, factory_data = (
                self.factory,
                abi.encode_call("deploy(bytes32,uint256)", salt, factory_mode),
            )
            self.rpc.call("anvil_setBalance", sender, hex(10**18))  # pays its own prefund
        return UserOperation(
            sender=sender,
            nonce=0,
            call_data=abi.encode_call("execute()"),
            call_gas_limit=100_000,
            verification_gas_limit=1_000_000,
            pre_verification_gas=50_000,
            max_fee_per_gas=2 * 10**9,
            max_priority_fee_per_gas=10**9,
            signature=abi.encode(["uint256"], [mode]),
            factory=factory,
            factory_data=factory_data,
            paymaster=paymaster,
            paymaster_verification_gas_limit=300_000 if paymaster else 0,
            paymaster_post_op_gas_limit=50_000 if paymaster else 0,
            paymaster_data=bytes([paymaster_mode]) if paymaster else b"",
        )


@pytest.fixture(scope="module")
def world(devnet: Devnet) -> World:
    node, manifest = devnet
    artifacts = compile_sources(
        {SOURCE.name: SOURCE.read_text()}, cache_root() / "devnet", announce=lambda _: None
    )
    return World(DevnetRpc(node.url), manifest, artifacts)


@pytest.fixture
def node(devnet: Devnet) -> Node:
    return Node(devnet[0].url)


async def safe(node: Node, world: World, op: UserOperation, version: Version) -> rules.Outcome:
    _, outcome = await validate_safe(node, op, world.entry_points[version], version, None)
    return outcome


async def refused(node: Node, world: World, op: UserOperation, version: Version) -> BundlerFault:
    """The fault safe mode raises; the same op passes plain simulation (unsafe mode)."""
    with pytest.raises(BundlerFault) as caught:
        await safe(node, world, op, version)
    await simulation.simulate_validation(node, op, world.entry_points[version], version, None)
    return caught.value


# --- the anvil facts the tracer relies on -----------------------------------------------------


async def test_anvil_runs_js_tracer_with_state_override_in_trace_config(node: Node) -> None:
    """debug_traceCall takes a JS tracer, and a state override as ``stateOverrides`` in the
    trace config (geth's place); a fourth parameter is refused."""
    target = "0x" + "ab" * 20
    tracer = "{ops: [], step: function (log) { this.ops.push(log.op.toString()); },"
    tracer += " fault: function () {}, result: function () { return this.ops; }}"
    override = {target: {"code": "0x6001600055"}}  # PUSH1 1 PUSH1 0 SSTORE
    ops = await node.call(
        "debug_traceCall",
        [{"to": target}, "latest", {"tracer": tracer, "stateOverrides": override}],
    )
    assert ops == ["PUSH1", "PUSH1", "SSTORE", "STOP"]
    with pytest.raises(RpcCallError):
        await node.call("debug_traceCall", [{"to": target}, "latest", {"tracer": tracer}, override])


# --- entities that obey -----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_obeying_account_paymaster_and_factory_pass(
    node: Node, world: World, version: Version
) -> None:
    outcome = await safe(node, world, world.op(version), version)
    assert world.account.lower() in outcome.code_hashes
    # The account writing balances[sender] in a bystander contract: associated storage.
    await safe(node, world, world.op(version, mode=WRITE_ASSOCIATED), version)
    # An unstaked paymaster that touches no storage; a staked one writing its own storage.
    await safe(node, world, world.op(version, paymaster=world.paymaster), version)
    await safe(
        node,
        world,
        world.op(version, paymaster=world.staked_paymaster, paymaster_mode=OWN_STORAGE),
        version,
    )
    # An unstaked factory deploying the sender with its one CREATE2, sender paying prefund.
    outcome = await safe(node, world, world.op(version, factory_mode=FACTORY_OK), version)
    assert world.factory.lower() in outcome.code_hashes


@pytest.mark.parametrize("version", VERSIONS)
async def test_staked_paymaster_writing_senders_entry_while_deploying_passes(
    node: Node, world: World, version: Version
) -> None:
    """balances[sender] while the sender is deployed: STO-021 allows it to a staked entity."""
    op = world.op(
        version,
        factory_mode=FACTORY_OK,
        paymaster=world.staked_paymaster,
        paymaster_mode=WRITE_ASSOCIATED,
    )
    await safe(node, world, op, version)
    unstaked = op.with_(paymaster=world.paymaster)
    fault = await refused(node, world, unstaked, version)
    assert fault.code == BANNED_OPCODE and "STO-021" in fault.message
    assert fault.message.startswith(f"unstaked paymaster accessed {world.store.lower()} slot 0x")


@pytest.mark.parametrize("version", VERSIONS)
async def test_real_simple_account_sponsored_by_verifying_paymaster_passes(
    devnet: Devnet, node: Node, version: Version
) -> None:
    """What real clients send: SimpleAccountFactory (unstaked) deploying a SimpleAccount,
    the devnet's staked VerifyingPaymaster sponsoring (v0.6 writes senderNonce[sender])."""
    from chaingate.aa import accounts
    from chaingate.evm.keys import PrivateKey
    from tests.conftest import DEVNET_SIGNER
    from tests.test_aa_devnet import NodeCaller, build_op

    anvil, manifest = devnet
    tag = TAGS[version]
    factory = await accounts.learn_factory(
        NodeCaller(anvil.url), manifest.address(f"simple_account_factory_{tag}"), version
    )
    with DevnetRpc(anvil.url) as rpc:
        op, _ = build_op(rpc, manifest, version, factory, PrivateKey.generate(), DEVNET_SIGNER)
    entry_point = manifest.address(f"entry_point_{tag}")
    result, outcome = await validate_safe(node, op, entry_point, version, None)
    assert result.paymaster.stake >= rules.MIN_STAKE
    assert factory.address.lower() in outcome.code_hashes
    assert op.paymaster is not None and op.paymaster.lower() in outcome.code_hashes


# --- opcodes ------------------------------------------------------------------------------------

BANNED_BY_ACCOUNT = [
    (TIMESTAMP, "TIMESTAMP", "OP-011"),
    (NUMBER, "NUMBER", "OP-011"),
    (COINBASE, "COINBASE", "OP-011"),
    (BASEFEE, "BASEFEE", "OP-011"),
    (ORIGIN, "ORIGIN", "OP-011"),
    (GASPRICE, "GASPRICE", "OP-011"),
    (BLOCKHASH, "BLOCKHASH", "OP-011"),
    (GAS, "GAS", "OP-012"),
    (BALANCE, "BALANCE", "OP-080"),
    (SELFBALANCE, "SELFBALANCE", "OP-080"),
    (CREATE, "CREATE", "OP-032"),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("mode", "opcode", "rule"), BANNED_BY_ACCOUNT)
async def test_account_banned_opcode_refused(
    node: Node, world: World, version: Version, mode: int, opcode: str, rule: str
) -> None:
    fault = await refused(node, world, world.op(version, mode=mode), version)
    assert fault.code == BANNED_OPCODE
    # The reference bundler's wording first (what the compliance suite matches), then ours.
    assert fault.message.startswith(
        f"{'unstaked ' if rule == 'OP-080' else ''}account uses banned opcode: {opcode} [{rule}]"
    ), fault.message
    assert f"(account {world.account.lower()}" in fault.message
    assert fault.data == {"account": world.account.lower(), "rule": rule}


@pytest.mark.parametrize("version", VERSIONS)
async def test_paymaster_banned_opcode_refused_even_when_staked(
    node: Node, world: World, version: Version
) -> None:
    for pm in (world.paymaster, world.staked_paymaster):
        op = world.op(version, paymaster=pm, paymaster_mode=TIMESTAMP)
        fault = await refused(node, world, op, version)
        assert fault.code == BANNED_OPCODE
        assert fault.message.startswith("paymaster uses banned opcode: TIMESTAMP [OP-011]")
        assert f"(paymaster {pm.lower()}" in fault.message


@pytest.mark.parametrize("version", VERSIONS)
async def test_balance_allowed_for_staked_paymaster_only(
    node: Node, world: World, version: Version
) -> None:
    op = world.op(version, paymaster=world.paymaster, paymaster_mode=BALANCE)
    fault = await refused(node, world, op, version)
    assert fault.code == BANNED_OPCODE and "OP-080" in fault.message
    await safe(
        node,
        world,
        world.op(version, paymaster=world.staked_paymaster, paymaster_mode=BALANCE),
        version,
    )


# --- out of gas, calls, code ------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("mode", "rule"),
    [
        (OOG, "OP-020"),
        (VALUE_CALL, "OP-061"),
        (NO_CODE, "OP-041"),
        (ENTRY_POINT_CALL, "OP-054"),
    ],
)
async def test_account_call_rules(
    node: Node, world: World, version: Version, mode: int, rule: str
) -> None:
    fault = await refused(node, world, world.op(version, mode=mode), version)
    assert fault.code == BANNED_OPCODE and rule in fault.message, fault.message
    assert "account" in fault.message


# --- storage and stake --------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_account_writing_unassociated_storage_refused(
    node: Node, world: World, version: Version
) -> None:
    fault = await refused(node, world, world.op(version, mode=WRITE_OTHER), version)
    assert fault.code == BANNED_OPCODE and "STO-033" in fault.message
    assert world.store.lower() in fault.message


@pytest.mark.parametrize("version", VERSIONS)
async def test_unstaked_account_reading_other_storage_needs_stake(
    node: Node, world: World, version: Version
) -> None:
    fault = await refused(node, world, world.op(version, mode=READ_OTHER), version)
    assert fault.code == BANNED_OPCODE and "STO-033" in fault.message
    assert fault.message.startswith(f"unstaked account accessed {world.store.lower()} slot")


@pytest.mark.parametrize("version", VERSIONS)
async def test_unstaked_paymaster_with_storage_refused_staked_accepted(
    node: Node, world: World, version: Version
) -> None:
    op = world.op(version, paymaster=world.paymaster, paymaster_mode=OWN_STORAGE)
    fault = await refused(node, world, op, version)
    # -32502 as the reference bundler answers (not -32505: stake checks outside the trace).
    assert fault.code == BANNED_OPCODE and "STO-031" in fault.message
    assert fault.message.startswith("unstaked paymaster accessed paymaster slot 0x")
    assert f"(paymaster {world.paymaster.lower()}" in fault.message
    # The same paymaster code, staked: accepted; the sender's associated storage too.
    for mode in (OWN_STORAGE, READ_OTHER, WRITE_ASSOCIATED):
        op = world.op(version, paymaster=world.staked_paymaster, paymaster_mode=mode)
        await safe(node, world, op, version)
    # ...but even staked, a write to a slot nobody is associated with is refused.
    op = world.op(version, paymaster=world.staked_paymaster, paymaster_mode=WRITE_OTHER)
    fault = await refused(node, world, op, version)
    assert fault.code == BANNED_OPCODE and "STO-033" in fault.message


# --- the factory -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_factory_second_create2_refused(node: Node, world: World, version: Version) -> None:
    fault = await refused(
        node, world, world.op(version, factory_mode=FACTORY_SECOND_CREATE2), version
    )
    assert fault.code == BANNED_OPCODE and "OP-031" in fault.message
    assert fault.message.startswith("factory uses banned opcode: CREATE2 [OP-031]")


@pytest.mark.parametrize("version", VERSIONS)
async def test_unstaked_factory_with_storage_needs_stake(
    node: Node, world: World, version: Version
) -> None:
    fault = await refused(node, world, world.op(version, factory_mode=FACTORY_OWN_STORAGE), version)
    assert fault.code == BANNED_OPCODE and "STO-031" in fault.message
    assert f"(factory {world.factory.lower()}" in fault.message


# --- sans-IO rules on hand-made traces ---------------------------------------------------------

SENDER = "0x" + "11" * 20
FACTORY = "0x" + "22" * 20
PAYMASTER = "0x" + "33" * 20
EP = "0x" + "ee" * 20
TOKEN = "0x" + "44" * 20


def plain_op(**changes: Any) -> UserOperation:
    op = UserOperation(
        sender=SENDER,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=1,
        pre_verification_gas=1,
        max_fee_per_gas=1,
        max_priority_fee_per_gas=1,
    )
    return op.with_(**changes)


def account_phase(**fields: Any) -> Phase:
    return Phase(target=SENDER, method=rules._VALIDATE_USER_OP["0.7"], **fields)


def judge(phases: list[Phase], op: UserOperation | None = None, **staked: bool) -> rules.Outcome:
    trace = Trace(
        phases=phases, keccak=KECCAK, entry_point=EP, overflow=False, output="0x", error=None
    )
    stakes: dict[rules.Role, bool] = {role: staked.get(role, False) for role in rules.ROLES}
    return rules.check_rules(trace, op or plain_op(), entry_point=EP, version="0.7", staked=stakes)


# keccak(pad(SENDER) . slot 0): the mapping entry balances[SENDER] at slot 0.
KECCAK = ["0x" + "00" * 12 + "11" * 20 + "00" * 32]
BALANCE_SLOT = rules._associated_slots(KECCAK, [SENDER])[SENDER][0]


def word(value: int) -> str:
    return "0x" + value.to_bytes(32, "big").hex()


def test_rules_associated_slot_span() -> None:
    for offset in (0, 1, 127):
        judge([account_phase(storage={TOKEN: SlotAccess(w={word(BALANCE_SLOT + offset): 1})})])
    with pytest.raises(BundlerFault) as caught:
        judge([account_phase(storage={TOKEN: SlotAccess(w={word(BALANCE_SLOT + 128): 1})})])
    assert caught.value.code == BANNED_OPCODE
    # The slot equal to the address itself is associated too.
    judge([account_phase(storage={TOKEN: SlotAccess(r={word(int(SENDER, 16)): 1})})])


def test_rules_deploying_sender_associated_storage_needs_staked_factory() -> None:
    op = plain_op(factory=FACTORY, factory_data=b"\x01")
    phase = account_phase(storage={TOKEN: SlotAccess(r={word(BALANCE_SLOT): 1})})
    with pytest.raises(BundlerFault) as caught:
        judge([phase], op)
    assert caught.value.code == BANNED_OPCODE and "STO-021" in caught.value.message
    judge([phase], op, factory=True)
    judge([phase], op, account=True)


def test_rules_entry_point_calls_and_value() -> None:
    deposit = Call("CALL", PAYMASTER, EP, rules._DEPOSIT_TO, "0x5")
    fallback = Call("CALL", SENDER, EP, "0x", "0x5")
    judge([account_phase(calls=[deposit, fallback])])
    stranger = Call("CALL", TOKEN, EP, "0x", "0x5")
    with pytest.raises(BundlerFault, match="OP-054"):
        judge([account_phase(calls=[stranger])])
    with pytest.raises(BundlerFault, match="OP-061"):
        judge([account_phase(calls=[Call("CALL", SENDER, TOKEN, "0x", "0x1")])])
    # DELEGATECALL frames carry the caller's value: not a value transfer.
    judge([account_phase(calls=[Call("DELEGATECALL", SENDER, TOKEN, "0x", "0x1")])])


def test_rules_code_access() -> None:
    judge([account_phase(code={"0x" + "00" * 19 + "01": CodeAccess(-1, "STATICCALL")})])
    judge([account_phase(code={SENDER: CodeAccess(0, "EXTCODESIZE")})])  # OP-042
    with pytest.raises(BundlerFault, match="OP-041"):
        judge([account_phase(code={TOKEN: CodeAccess(0, "EXTCODEHASH")})])
    with pytest.raises(BundlerFault, match="OP-062"):
        judge([account_phase(code={"0x" + "00" * 18 + "01ff": CodeAccess(0, "CALL")})])
    with pytest.raises(BundlerFault, match="OP-054"):
        judge([account_phase(ext={"EXTCODEHASH": {SENDER: 1}})])


def test_rules_create2_only_once_only_sender() -> None:
    op = plain_op(factory=FACTORY, factory_data=b"\x01")
    create_sender = rules._CREATE_SENDER

    def factory_phase(*created: str) -> Phase:
        calls = [Call("CREATE2", FACTORY, to, "0x", "0x0") for to in created]
        opcodes = {"CREATE2": {FACTORY: len(created)}} if created else {}
        return Phase(target=EP, method=create_sender, calls=calls, opcodes=opcodes)

    judge([factory_phase(SENDER), account_phase()], op)
    with pytest.raises(BundlerFault, match="OP-031") as caught:
        judge([factory_phase(TOKEN), account_phase()], op)
    assert f"(factory {FACTORY}" in caught.value.message
    with pytest.raises(BundlerFault, match="OP-031"):
        judge([factory_phase(SENDER, TOKEN), account_phase()], op)
    # The sender may CREATE while it is being deployed (OP-032), never otherwise.
    creating = account_phase(opcodes={"CREATE": {SENDER: 1}})
    judge([factory_phase(SENDER), creating], op)
    with pytest.raises(BundlerFault, match="OP-032"):
        judge([creating])


def test_rules_unstaked_paymaster_context_accepted() -> None:
    """EREP-050 as the reference bundler and the compliance suite apply it (its "regression"
    case): an unstaked paymaster returning a context is accepted."""
    op = plain_op(paymaster=PAYMASTER)
    phases = [account_phase()]
    trace = Trace(phases=phases, keccak=[], entry_point=EP, overflow=False, output="0x", error=None)
    none = simulation.StakeInfo(0, 0)
    result = simulation.ValidationResult(
        pre_op_gas=1,
        prefund=1,
        sig_failed=False,
        valid_after=0,
        valid_until=2**48 - 1,
        paymaster_context=b"ctx",
        sender=none,
        factory=none,
        paymaster=none,
    )
    rules.check_trace(trace, result, op, entry_point=EP, version="0.7")


@pytest.mark.parametrize("version", VERSIONS)
async def test_unstaked_paymaster_returning_a_context_accepted(
    node: Node, world: World, version: Version
) -> None:
    op = world.op(version, paymaster=world.paymaster, paymaster_mode=CONTEXT)
    result, _ = await validate_safe(node, op, world.entry_points[version], version, None)
    assert result.paymaster_context == b"a context"
    assert result.paymaster.stake == 0


@pytest.mark.parametrize("version", VERSIONS)
async def test_calls_to_precompiles_with_little_gas_accepted(
    node: Node, world: World, version: Version
) -> None:
    """OP-062 allows precompiles: one refusing 1,000 gas (ecrecover, the pairing) is not the
    validation running out of gas (OP-020) — on the exact path and the fast one."""
    op = world.op(version, mode=PRECOMPILES)
    for fast in (False, True):
        await validate_safe(node, op, world.entry_points[version], version, None, fast_path=fast)


def test_rules_overflow_and_unknown_opcode() -> None:
    trace = Trace(phases=[], keccak=[], entry_point=EP, overflow=True, output="0x", error=None)
    with pytest.raises(BundlerFault, match="too large"):
        rules.check_rules(
            trace, plain_op(), entry_point=EP, version="0.7", staked={"account": True}
        )
    with pytest.raises(BundlerFault, match="OP-013"):
        judge([account_phase(opcodes={"opcode 0x0c not defined": {SENDER: 1}})])
