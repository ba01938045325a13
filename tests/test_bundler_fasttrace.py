"""The fast safe-mode path (``bundler.nativetrace``) against the exact JS-traced path, on real
anvil with the real EntryPoints v0.6 and v0.7.

Soundness, checked on every operation of tests/test_bundler_rules.py (the obeying entities and
each rule-breaker, both versions) and on real SimpleAccounts (deploying and deployed,
sponsored by the devnet's VerifyingPaymaster and self-paid):

* when the fast trace is accepted by the rules, the exact path accepts too, and the fast
  trace's storage and code hashes cover the exact trace's;
* ``validate_safe`` with the fast path gives the same verdict (result, or fault code and
  message) as without it.

The real SimpleAccount operations (v0.6, v0.7, v0.8) must take the fast path without the
struct log (``build_static``, static analysis of the code that ran, must prove it unneeded):
a deploying one's factory CREATE2 counted from its frame, the factory phase replayed alone
(``factory_oracle``: the targets of its EXTCODE*).  Wherever the static build works, its
trace is checked against the one built from the struct log (same opcodes, calls, code sizes,
out-of-gas; a superset of storage), and the verdict against the exact path's, on every
operation here.

The lean build (issue 34: callTracer and the called accounts' codes, no prestateTracer) is
built beside them on every operation here: where it builds, the same judgement, storage
contexts and code hashes covering the exact trace's (and naming nothing it did not call);
``RuleForeignReadAccount`` (clean code reading a bystander's slots) must be left to the
prestate.

Sans-IO tests: ``build_trace`` and ``build_static`` on hand-made traces (alignment, fallbacks,
what needs the struct log), and ``opcodes`` (the linear sweep, dead code and the metadata
trailer, GAS adjacency, reachability by selector).
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
import pytest

from chaingate.aa import accounts, paymaster, userop
from chaingate.aa.userop import UserOperation, Version
from chaingate.bundler import jscollector, nativetrace, opcodes, rules, safemode
from chaingate.bundler.errors import BundlerFault
from chaingate.bundler.safemode import validate_safe
from chaingate.bundler.simulation import (
    ValidationResult,
    decode_validation,
    simulations_for,
    validation_call,
)
from chaingate.bundler.tracecall import CodeAccess, Trace, trace_validation
from chaingate.chain.client import RpcCallError
from chaingate.devnet.rpc import DevnetRpc
from chaingate.evm import abi
from chaingate.evm.keccak import keccak256
from chaingate.evm.keys import PrivateKey
from tests.conftest import DEVNET_SIGNER
from tests.test_aa_devnet import NodeCaller
from tests.test_bundler_rules import (
    BALANCE,
    CONTEXT,
    CREATE,
    ENTRY_POINT_CALL,
    FACTORY_OK,
    FACTORY_OWN_STORAGE,
    FACTORY_SECOND_CREATE2,
    GAS,
    NO_CODE,
    OK,
    OOG,
    OWN_STORAGE,
    PRECOMPILES,
    READ_OTHER,
    TAGS,
    TIMESTAMP,
    VALUE_CALL,
    VERSIONS,
    WRITE_ASSOCIATED,
    WRITE_OTHER,
    Devnet,
    World,
    world,
)
from tests.test_bundler_rules import BANNED_BY_ACCOUNT as _BANNED

__all__ = ["world"]  # the fixture, imported from test_bundler_rules

CHAIN_ID = 31337


@pytest.fixture(scope="module")
def devnet(module_devnet: Devnet) -> Devnet:
    """This module's own devnet, not the session's: its operations deploy accounts and spend
    the paymasters' deposits, which other modules check."""
    return module_devnet


class Node:
    """The bundler's node-client interface over anvil's HTTP endpoint, one kept-alive
    connection (so timings measure the node, not connection set-up)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.AsyncClient(timeout=60)

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        reply = (await self.client.post(self.url, json=body)).json()
        if "error" in reply:
            error = reply["error"]
            raise RpcCallError(method, error["code"], error["message"], error.get("data"))
        return reply["result"]


@pytest.fixture
async def node(devnet: Devnet) -> Any:
    client = Node(devnet[0].url)
    yield client
    await client.client.aclose()


Verdict = tuple[str, Any]


async def verdict(node: Node, op: UserOperation, ep: str, version: Version, fast: bool) -> Verdict:
    try:
        result, outcome = await validate_safe(node, op, ep, version, None, fast_path=fast)
    except BundlerFault as fault:
        return ("refused", (fault.code, fault.message, fault.data))
    return ("accepted", (result, outcome.code_hashes, outcome.storage))


async def fast_judgement(
    node: Node, op: UserOperation, ep: str, version: Version
) -> tuple[str, nativetrace.FastTrace | nativetrace.Fallback, ValidationResult | None]:
    """What the fast path alone decides: "accept", "fallback" (cannot build), "refuse"
    (the rules refuse the fast trace: the exact path then judges), "failed-op"."""
    fast = await nativetrace.fast_trace(node, op, ep, version, None)
    if isinstance(fast, nativetrace.Fallback):
        return "fallback", fast, None
    try:
        result = decode_validation(version, fast.data, fast.reverted)
    except BundlerFault:
        return "failed-op", fast, None
    try:
        rules.check_trace(fast.trace, result, op, entry_point=ep, version=version)
    except BundlerFault:
        return "refuse", fast, result
    return "accept", fast, result


def assert_covers(
    fast: Trace,
    exact: Trace,
    op: UserOperation,
    version: Version,
    *,
    slots: bool = True,
    hashes: bool = True,
) -> None:
    """The fast trace judged phases hold at least the exact trace's storage, the same calls,
    opcodes, code sizes and out-of-gas; its code hashes cover the exact ones.  ``slots=False``
    (the lean build, no prestate): the storage contexts only, and those of a judged phase are
    the sender's and the EntryPoint's alone (the rules judge no slot there).  ``hashes=False``:
    against a prestate-built trace, whose hashes are every account the call loaded (its
    caller too), more than the exact trace keeps."""
    exact_phases = rules._phases(exact, op, version)
    fast_phases = rules._phases(fast, op, version)
    assert set(fast_phases) == set(exact_phases)
    for role, want in exact_phases.items():
        got = fast_phases[role]
        assert (got.target, got.method, got.oog) == (want.target, want.method, want.oog), role
        assert got.opcodes == want.opcodes, role
        assert [(c.type, c.from_, c.to, c.method) for c in got.calls] == [
            (c.type, c.from_, c.to, c.method) for c in want.calls
        ], role
        assert [int(c.value, 16) for c in got.calls if c.type == "CALL"] == [
            int(c.value, 16) for c in want.calls if c.type == "CALL"
        ], role
        for address, access in want.code.items():
            if access.op.startswith("EXTCODE"):
                continue  # the fast path never judges a phase with EXTCODE*
            assert got.code[address].size == access.size, (role, address)
        if not slots:
            assert set(want.storage) <= set(got.storage), role
            assert set(got.storage) <= {op.sender.lower(), exact.entry_point}, role
            continue
        for contract, access in want.storage.items():
            assert set(access.r) | set(access.w) <= set(got.storage[contract].r), (role, contract)
            assert set(access.w) <= set(got.storage[contract].w), (role, contract)
    for address, digest in exact.code_hashes.items() if hashes else ():
        assert fast.code_hashes.get(address) == digest, address


Built = nativetrace.FastTrace | nativetrace.Fallback


async def both_builds(
    node: Node, op: UserOperation, ep: str, version: Version
) -> tuple[Built | str, Built, Built | str]:
    """``build_static`` and ``build_trace`` (from the struct log) on the same native traces,
    and the lean build (``_lean_build``: the frames' codes at the block, no prestate)."""
    tx, override = validation_call(op, ep, version, simulations_for(version))
    extra: dict[str, Any] = {"stateOverrides": override} if override else {}
    block = await node.call("eth_blockNumber")
    raw = {
        name: await node.call("debug_traceCall", [tx, block, {**config, **extra}])
        for name, config in (
            ("calls", {"tracer": "callTracer"}),
            ("prestate", {"tracer": "prestateTracer"}),
            ("steps", nativetrace._STRUCT_CONFIG),
        )
    }
    root = msgspec.convert(raw["calls"], nativetrace._Frame)
    prestate = msgspec.convert(raw["prestate"], dict[str, nativetrace._Account])
    steps = msgspec.convert(raw["steps"], nativetrace._StructLog).structLogs
    # A deploying operation's factory phase replayed alone, as fast_trace does: both builds
    # get the same verdict on its EXTCODE* targets.
    harmless = False
    replay: dict[str, Any] = {}
    if op.deploys:
        await nativetrace._replay_factory(node, op, ep, version, block, replay)
        harmless = nativetrace._vouched(root, op, ep, version, replay) is None
    static = nativetrace.build_static(
        root, prestate, op, entry_point=ep, version=version, factory_extcode_harmless=harmless
    )
    stepped = nativetrace.build_trace(
        steps, root, prestate, op, entry_point=ep, version=version,
        factory_extcode_harmless=harmless,
    )  # fmt: skip
    given = nativetrace._override_codes(override)
    assert given is not None
    lean = await nativetrace._lean_build(
        node, root, {}, given, block, op, ep, version, harmless, replay,
        shipped_entry_point=ep.lower() in given,  # the shipped EntryPointSimulations
    )  # fmt: skip
    return static, stepped, lean


async def check_static(node: Node, op: UserOperation, ep: str, version: Version) -> bool:
    """Where ``build_static`` builds a trace, the struct log's trace has the same judged
    opcodes, calls, code sizes and out-of-gas, and at most its storage; where the lean build
    does, the same, its storage contexts at least the struct log's (``SKIPPED["lean"]``: its
    trace, for ``check_sound`` to hold against the exact one).  Returns whether the struct log
    was skipped."""
    static, stepped, lean = await both_builds(node, op, ep, version)
    SKIPPED["lean"] = False
    if isinstance(lean, nativetrace.FastTrace):
        # Its conditions are the static build's and more.
        assert isinstance(static, nativetrace.FastTrace), (static, lean)
        assert isinstance(stepped, nativetrace.FastTrace), (stepped, lean)
        assert (lean.data, lean.reverted) == (stepped.data, stepped.reverted)
        assert_covers(lean.trace, stepped.trace, op, version, slots=False, hashes=False)
        for role, phase in rules._phases(stepped.trace, op, version).items():
            assert rules._phases(lean.trace, op, version)[role].code == phase.code, role
        LEAN_TRACES["last"] = lean.trace
        SKIPPED["lean"] = True
    if isinstance(static, str):
        return False
    assert isinstance(static, nativetrace.FastTrace), static
    assert isinstance(stepped, nativetrace.FastTrace), (stepped, static)
    assert (static.data, static.reverted) == (stepped.data, stepped.reverted)
    assert_covers(static.trace, stepped.trace, op, version)
    for role, phase in rules._phases(stepped.trace, op, version).items():
        assert rules._phases(static.trace, op, version)[role].code == phase.code, role
    assert static.trace.code_hashes == stepped.trace.code_hashes
    return True


SKIPPED: dict[str, bool] = {}  # op name -> struct log skipped, filled by check_sound's callers
LEAN_TRACES: dict[str, Trace] = {}  # the last lean trace check_static built


async def check_sound(node: Node, op: UserOperation, ep: str, version: Version) -> str:
    """Soundness and same final verdict for one operation; returns the fast path's decision
    (and records in ``SKIPPED["last"]`` whether it needed no struct log)."""
    exact = await verdict(node, op, ep, version, fast=False)
    SKIPPED["last"] = await check_static(node, op, ep, version)
    nativetrace.PLANS.clear()  # no hint from the last operation: the lean build is tried first
    lean_before = nativetrace.PRESTATE["skipped"]
    decision, fast, _ = await fast_judgement(node, op, ep, version)
    assert (nativetrace.PRESTATE["skipped"] > lean_before) == (
        SKIPPED["lean"] and decision != "fallback"
    ), decision
    if decision == "accept" or SKIPPED["lean"]:
        _, _, exact_trace = await trace_validation(node, op, ep, version, None)
        if SKIPPED["lean"]:  # the lean trace judged, whatever fast_trace returned
            lean = LEAN_TRACES["last"]
            assert_covers(lean, exact_trace, op, version, slots=False)
            # and no more than it called (another operation's sender, expected from the
            # last validation's plan, would drop this one when that one deploys)
            named = {op.sender.lower(), (op.paymaster or op.sender).lower()}
            assert set(lean.code_hashes) <= set(exact_trace.code_hashes) | named
            assert lean_verdict(lean, op, ep, version) == lean_verdict(exact_trace, op, ep, version)
    if decision == "accept":
        assert exact[0] == "accepted", (exact, fast)
        assert isinstance(fast, nativetrace.FastTrace)
        lean = SKIPPED["lean"]
        assert_covers(fast.trace, exact_trace, op, version, slots=not lean)
    nativetrace.PLANS.clear()
    final = await verdict(node, op, ep, version, fast=True)
    assert final[0] == exact[0]
    if exact[0] == "refused":
        assert final == exact  # the exact path's code, message and data
    else:
        # The same ValidationResult; the fast path's code hashes are a superset (every
        # account the call loaded), so "code changed before bundling" is at least as strict.
        assert final[1][0] == exact[1][0]
        assert exact[1][1].items() <= final[1][1].items()
        assert set(exact[1][2]) <= set(final[1][2])  # the storage STO-041 keeps apart
    return decision


def lean_verdict(trace: Trace, op: UserOperation, ep: str, version: Version) -> Any:
    """The rules on a trace with the ValidationResult its own output decodes to."""
    try:
        result = decode_validation(version, bytes.fromhex(trace.output[2:]), trace.reverted)
        rules.check_trace(trace, result, op, entry_point=ep, version=version)
    except BundlerFault as fault:
        return ("refused", fault.code, fault.message)
    return ("accepted", result)


# --- the rule-breakers of test_bundler_rules.py ------------------------------------------------

RULE_OPS: list[tuple[str, dict[str, Any]]] = [
    ("ok", {}),
    *[(f"account-{opcode}", {"mode": mode}) for mode, opcode, _ in _BANNED],
    *[
        (f"account-mode-{mode}", {"mode": mode})
        for mode in (OOG, VALUE_CALL, NO_CODE, ENTRY_POINT_CALL, WRITE_OTHER, READ_OTHER)
    ],
    ("account-write-associated", {"mode": WRITE_ASSOCIATED}),
    ("account-own-storage", {"mode": OWN_STORAGE}),
    ("account-precompiles", {"mode": PRECOMPILES}),
    *[
        (f"paymaster-{mode}", {"paymaster": "unstaked", "paymaster_mode": mode})
        for mode in (OK, TIMESTAMP, BALANCE, OWN_STORAGE, WRITE_ASSOCIATED, GAS, CREATE, CONTEXT)
    ],
    *[
        (f"staked-paymaster-{mode}", {"paymaster": "staked", "paymaster_mode": mode})
        for mode in (OK, TIMESTAMP, BALANCE, OWN_STORAGE, READ_OTHER, WRITE_ASSOCIATED)
    ]
    + [("staked-paymaster-write-other", {"paymaster": "staked", "paymaster_mode": WRITE_OTHER})],
    *[
        (f"factory-{mode}", {"factory_mode": mode})
        for mode in (FACTORY_OK, FACTORY_SECOND_CREATE2, FACTORY_OWN_STORAGE)
    ],
    (
        "deploying-staked-paymaster-associated",
        {"factory_mode": FACTORY_OK, "paymaster": "staked", "paymaster_mode": WRITE_ASSOCIATED},
    ),
    (
        "deploying-unstaked-paymaster-associated",
        {"factory_mode": FACTORY_OK, "paymaster": "unstaked", "paymaster_mode": WRITE_ASSOCIATED},
    ),
]


@pytest.mark.parametrize("version", VERSIONS)
async def test_rule_breakers_fast_path_is_sound(node: Node, world: World, version: Version) -> None:
    decisions: dict[str, str] = {}
    skipped: list[str] = []
    lean: list[str] = []
    for name, spec in RULE_OPS:
        kwargs = dict(spec)
        if "paymaster" in kwargs:
            kwargs["paymaster"] = (
                world.staked_paymaster if kwargs["paymaster"] == "staked" else world.paymaster
            )
        op = world.op(version, **kwargs)
        decisions[name] = await check_sound(node, op, world.entry_points[version], version)
        if SKIPPED["last"]:
            skipped.append(name)
        if SKIPPED["lean"]:
            lean.append(name)
    print(f"v{version} fast-path decisions:", decisions)
    print(f"v{version} lean (no prestate) for {len(lean)}/{len(RULE_OPS)}: {lean}")
    print(f"v{version} struct log skipped for {len(skipped)}/{len(RULE_OPS)}: {skipped}")
    # RuleAccount and RulePaymaster read their mode at run time, so their validation can
    # reach every banned opcode: static analysis must see that, whatever the mode.
    assert not [n for n in skipped if n.startswith(("account-", "paymaster-", "staked-"))]
    # The obeying account and the staked paymaster with its own storage are judged fast; each
    # rule-breaker is refused by the exact path (never accepted fast).
    assert decisions["ok"] == "accept"
    assert decisions["staked-paymaster-13"] == "accept"
    for name, _ in RULE_OPS:
        if (
            name.startswith(("account-", "factory-1", "factory-2"))
            and name != "account-own-storage"
        ):
            if name in ("account-write-associated", "account-precompiles"):
                continue  # allowed (needs keccak preimages / a precompile refused its input)
            assert decisions[name] != "accept", name


# --- real SimpleAccounts ---------------------------------------------------------------------


def simple_op(
    rpc: DevnetRpc,
    manifest: Any,
    version: Version,
    factory: accounts.AccountFactory,
    *,
    deployed: bool,
    sponsored: bool,
) -> UserOperation:
    """A SimpleAccount op sending 1 wei: deploying or of an account deployed just before,
    sponsored by the devnet VerifyingPaymaster or paying its own prefund."""
    tag = TAGS[version]
    entry_point = manifest.address(f"entry_point_{tag}")
    owner = PrivateKey.generate()
    salt = secrets.randbits(256)
    sender = factory.account_address(owner.address, salt)
    rpc.call("anvil_setBalance", sender, hex(10**18))
    factory_kwargs: dict[str, Any] = {
        "factory": factory.address,
        "factory_data": factory.factory_data(owner.address, salt),
    }
    if deployed:
        funder = "0x" + secrets.token_bytes(20).hex()
        if version == "0.8":  # its factory takes createAccount from the SenderCreator alone
            funder = nativetrace.sender_creator(entry_point)
        rpc.call("anvil_setBalance", funder, hex(10**18))
        rpc.call("anvil_impersonateAccount", funder)
        tx = {
            "from": funder,
            "to": factory.address,
            "input": "0x" + factory.factory_data(owner.address, salt).hex(),
            "gas": hex(2_000_000),
        }
        tx_hash = rpc.call("eth_sendTransaction", tx)
        deadline = time.monotonic() + 10
        while rpc.call("eth_getTransactionReceipt", tx_hash) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert rpc.call("eth_getCode", sender, "latest") != "0x"
        factory_kwargs = {}
    block = rpc.call("eth_getBlockByNumber", "latest", False)
    call_data = abi.encode_call(
        "execute(address,uint256,bytes)", "0x" + secrets.token_bytes(20).hex(), 1, b""
    )
    op = UserOperation(
        sender=sender,
        nonce=0,
        call_data=call_data,
        call_gas_limit=200_000,
        verification_gas_limit=1_000_000,
        pre_verification_gas=60_000,
        max_fee_per_gas=2 * int(block["baseFeePerGas"], 16) + 10**9,
        max_priority_fee_per_gas=10**9,
        paymaster_verification_gas_limit=200_000 if sponsored and version != "0.6" else 0,
        paymaster_post_op_gas_limit=50_000 if sponsored and version != "0.6" else 0,
        **factory_kwargs,
    )
    if sponsored:
        op = paymaster.sponsor(
            op,
            DEVNET_SIGNER,
            paymaster=manifest.address(f"verifying_paymaster_{tag}"),
            chain_id=CHAIN_ID,
            valid_until=max(int(block["timestamp"], 16), int(time.time())) + 3600,
            valid_after=0,
            version=version,
        )
    digest = userop.user_op_hash(op, entry_point=entry_point, chain_id=CHAIN_ID, version=version)
    return op.with_(signature=owner.sign_digest(accounts.owner_digest(digest, version)))


SHAPES = [(d, s) for d in (True, False) for s in (True, False)]


@pytest.mark.parametrize("version", VERSIONS)
async def test_real_simple_accounts_fast_path(devnet: Devnet, node: Node, version: Version) -> None:
    anvil, manifest = devnet
    tag = TAGS[version]
    entry_point = manifest.address(f"entry_point_{tag}")
    factory = await accounts.learn_factory(
        NodeCaller(anvil.url), manifest.address(f"simple_account_factory_{tag}"), version
    )
    with DevnetRpc(anvil.url) as rpc:
        ops = {
            shape: simple_op(rpc, manifest, version, factory, deployed=shape[0], sponsored=shape[1])
            for shape in SHAPES
        }
        others = {  # a second deploying operation of each shape
            s: simple_op(rpc, manifest, version, factory, deployed=False, sponsored=s)
            for s in (True, False)
        }
    for (deployed, sponsored), op in ops.items():
        decision = await check_sound(node, op, entry_point, version)
        if not deployed and version != "0.6":
            # After a validation of another deploying operation (the plan expects its
            # sender): this one's code hashes still name its own sender alone.
            other = others[sponsored]
            nativetrace.PLANS.clear()
            await nativetrace.fast_trace(node, other, entry_point, version, None)
            mine = await nativetrace.fast_trace(node, op, entry_point, version, None)
            assert isinstance(mine, nativetrace.FastTrace), mine
            assert other.sender.lower() not in mine.trace.code_hashes
        print(
            f"v{version} deployed={deployed} sponsored={sponsored}: {decision}, "
            f"struct log {'skipped' if SKIPPED['last'] else 'fetched'}, "
            f"prestate {'skipped' if SKIPPED['lean'] else 'fetched'}"
        )
        assert decision == "accept", (deployed, sponsored, decision)
        # SimpleAccount, ERC1967Proxy, VerifyingPaymaster and the EntryPoint's receive reach
        # nothing a rule judges for these selectors; the factory's CREATE2 counts by its
        # frame, its EXTCODESIZE targets by the replay: no struct log, deploying or not.
        assert SKIPPED["last"], (deployed, sponsored)
    # Timing: the fast path against the exact one, on every shape.
    for shape in SHAPES:
        op = ops[shape]
        before = dict(safemode.FAST_PATH)
        skipped_before = nativetrace.STRUCT_LOG["skipped"]
        fast_ms, exact_ms = [], []
        for _ in range(5):
            started = time.perf_counter()
            await validate_safe(node, op, entry_point, version, None)
            fast_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await validate_safe(node, op, entry_point, version, None, fast_path=False)
            exact_ms.append((time.perf_counter() - started) * 1000)
        assert safemode.FAST_PATH["fast"] - before["fast"] == 5
        assert nativetrace.STRUCT_LOG["skipped"] - skipped_before == 5
        print(
            f"v{version} deployed={shape[0]} sponsored={shape[1]}: validate_safe fast "
            f"{statistics.median(fast_ms):.1f} ms, exact {statistics.median(exact_ms):.1f} ms"
        )


@pytest.mark.parametrize("version", VERSIONS)
async def test_factory_reading_code_sizes_fast_path_is_sound(
    node: Node, world: World, version: Version
) -> None:
    """A factory phase running EXTCODESIZE: of a contract (accepted, fast), of the EntryPoint
    (OP-054), of an address without code (OP-041) — the replay must never let the fast path
    accept what the exact one refuses."""
    from chaingate.evm.addresses import create2_address

    reader = world.deploy("RuleReadingFactory", b"")
    account_init = world.artifacts["RuleMiniAccount"].bytecode
    ep = world.entry_points[version]
    decisions = {}
    for name, target, rule in (
        ("contract", world.store, ""),
        ("entry-point", ep, "OP-054"),
        ("no-code", "0x" + secrets.token_bytes(20).hex(), "OP-041"),
    ):
        salt = secrets.token_bytes(32)
        sender = create2_address(reader, salt, account_init)
        world.rpc.call("anvil_setBalance", sender, hex(10**18))
        op = world.op(version).with_(
            sender=sender,
            factory=reader,
            factory_data=abi.encode_call("deploy(bytes32,address)", salt, target),
        )
        decisions[name] = await check_sound(node, op, ep, version)
        exact = await verdict(node, op, ep, version, fast=False)
        assert exact[0] == ("refused" if rule else "accepted"), (name, exact)
        assert rule in str(exact[1]), (name, exact)
    assert decisions == {"contract": "accept", "entry-point": "fallback", "no-code": "fallback"}


@pytest.mark.parametrize("version", VERSIONS)
async def test_lean_build_is_sound_where_only_the_slots_decide(
    node: Node, world: World, version: Version
) -> None:
    """The lean build (callTracer and codes, no prestateTracer) against the exact path on
    accounts static analysis calls clean: ``RuleForeignReadAccount`` reading a bystander's
    unassociated slot (STO-033: refused) or its own entry there (associated: accepted) —
    the lean build must not judge either (their slots decide), the final verdicts are the
    exact path's — ``RuleMiniAccount`` (lean, accepted) and the same with a paymaster that
    has no code (the EntryPoint's own EXTCODESIZE check of it: AA30 on every path)."""
    ep = world.entry_points[version]
    foreign = world.deploy("RuleForeignReadAccount", abi.encode(["address"], [world.store]))
    mini = world.deploy("RuleMiniAccount", b"")
    for account in (foreign, mini):
        world.rpc.call("anvil_setBalance", account, hex(10**18))
    plain = world.op(version)
    no_code = "0x" + secrets.token_bytes(20).hex()
    # v0.6's EntryPoint checks the sender's code itself, and it is not the shipped
    # EntryPointSimulations: its EXTCODESIZE targets are not known without the prestate.
    shipped = version != "0.6"
    cases = {
        "unassociated": (plain.with_(sender=foreign, signature=b""), False, "STO-033"),
        "associated": (plain.with_(sender=foreign, signature=b"\1"), False, ""),
        "mini": (plain.with_(sender=mini), shipped, ""),
        "paymaster-no-code": (
            world.op(version, paymaster=no_code).with_(sender=mini),
            shipped,
            "AA30",
        ),
    }
    for name, (op, lean, refusal) in cases.items():
        await check_sound(node, op, ep, version)
        assert SKIPPED["lean"] == lean, name
        final = await verdict(node, op, ep, version, fast=True)
        assert final[0] == ("refused" if refusal else "accepted"), (name, final)
        assert refusal in str(final[1]), (name, final)
    # The plan (a hint per EntryPoint, factory and paymaster): after an operation that needed
    # the prestate the next one asks for it at once, and, its codes alone sufficing, the one
    # after that is lean again.
    nativetrace.PLANS.clear()
    counts = []
    for op in (cases["unassociated"][0], cases["mini"][0], cases["mini"][0]):
        before = dict(nativetrace.PRESTATE)
        await nativetrace.fast_trace(node, op, ep, version, None)
        counts.append({k: nativetrace.PRESTATE[k] - before[k] for k in before})
    lean_after = {"skipped": 1, "fetched": 0} if shipped else {"skipped": 0, "fetched": 1}
    assert counts == [{"skipped": 0, "fetched": 1}, {"skipped": 0, "fetched": 1}, lean_after]


class Refusing(Node):
    """The real node, refusing the debug_traceCall its ``refuse`` picks (a fault injector)."""

    def __init__(self, url: str, refuse: Any) -> None:
        super().__init__(url)
        self.refuse = refuse

    async def call(
        self, method: str, params: Sequence[Any] = (), *, retry_safe: bool = True
    ) -> Any:
        if method == "debug_traceCall" and self.refuse(list(params)):
            raise RpcCallError(method, -32000, "refused by the test")
        return await super().call(method, params, retry_safe=retry_safe)


def REFUSE_STRUCT_LOG(p: list[Any]) -> bool:
    return "tracer" not in p[2]


@pytest.mark.parametrize(
    "refuse",
    [
        lambda p: p[2].get("tracer") == "callTracer",  # the first pair, run concurrently
        REFUSE_STRUCT_LOG,  # the struct log, after the static build gave up
        lambda p: "from" in p[0],  # the replay (its own sender), beside the first pair
    ],
    ids=["call-tracer", "struct-log", "replay"],
)
async def test_a_node_refusing_a_native_trace_is_a_fallback(
    devnet: Devnet, world: World, refuse: Any
) -> None:
    """Never an exception out of the fast path (one raised in a nursery comes wrapped in a
    group): a Fallback, and the exact path then asks the node itself."""
    from chaingate.evm.addresses import create2_address

    reader = world.deploy("RuleReadingFactory", b"")
    salt = secrets.token_bytes(32)
    sender = create2_address(reader, salt, world.artifacts["RuleMiniAccount"].bytecode)
    world.rpc.call("anvil_setBalance", sender, hex(10**18))
    op = world.op("0.7").with_(
        sender=sender,
        factory=reader,
        factory_data=abi.encode_call("deploy(bytes32,address)", salt, world.store),
    )
    if refuse is REFUSE_STRUCT_LOG:
        # A deploying operation no longer asks for the struct log; RuleAccount's validation
        # can reach banned opcodes (in its other modes): the static build cannot do without.
        op = world.op("0.7")
    node = Refusing(devnet[0].url, refuse)
    try:
        got = await nativetrace.fast_trace(node, op, world.entry_points["0.7"], "0.7", None)
    finally:
        await node.client.aclose()
    assert isinstance(got, nativetrace.Fallback) and "refused by the test" in got.reason, got


# --- sans-IO: build_trace on hand-made traces ---------------------------------------------------

EP = "0x" + "ee" * 20
SENDER = "0x" + "11" * 20
OTHER = "0x" + "44" * 20
ECRECOVER = "0x" + "00" * 19 + "01"
VALIDATE = rules._VALIDATE_USER_OP["0.7"]


def frame(kind: str, frm: str, to: str, calls: list[Any] | None = None, **extra: Any) -> Any:
    raw = {"type": kind, "from": frm, "to": to, "input": extra.pop("input", "0x"), **extra}
    raw["calls"] = calls or []
    return raw


def build(
    steps: list[tuple[str, int]],
    calls: list[Any],
    prestate: dict[str, Any] | None = None,
    op: UserOperation | None = None,
) -> nativetrace.FastTrace | nativetrace.Fallback:
    root = msgspec.convert(
        frame("CALL", "0x" + "00" * 20, EP, calls, output="0x"), nativetrace._Frame
    )
    accounts_ = msgspec.convert(
        prestate or {EP: {"code": "0x60"}, SENDER: {"code": "0x60"}},
        dict[str, nativetrace._Account],
    )
    parsed = [nativetrace._Step(op=name, depth=depth) for name, depth in steps]
    plain = UserOperation(
        sender=SENDER,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=1,
        pre_verification_gas=1,
        max_fee_per_gas=1,
        max_priority_fee_per_gas=1,
    )
    return nativetrace.build_trace(
        parsed, root, accounts_, op or plain, entry_point=EP, version="0.7"
    )


def judge_unstaked(trace: Trace) -> rules.Outcome:
    """The rules on a hand-made trace of a plain operation of SENDER, nobody staked."""
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
    return rules.check_rules(trace, op, entry_point=EP, version="0.7", staked={})


def account_call(inner: list[Any] | None = None) -> Any:
    return frame("CALL", EP, SENDER, inner, input=VALIDATE + "00" * 4)


def test_build_aligns_precompile_calls_without_steps() -> None:
    ecrecover = frame("STATICCALL", SENDER, ECRECOVER)
    steps = [("PUSH1", 1), ("CALL", 1), ("PUSH1", 2), ("STATICCALL", 2), ("POP", 2)]
    steps += [("SLOAD", 2), ("RETURN", 2), ("POP", 1), ("STOP", 1)]
    prestate = {EP: {"code": "0x60"}, SENDER: {"code": "0x60", "storage": {"0x01": "0x0"}}}
    built = build(steps, [account_call([ecrecover])], prestate)
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    assert phase.target == SENDER and phase.method == VALIDATE
    assert phase.code == {ECRECOVER: CodeAccess(size=-1, op="STATICCALL")}
    assert [c.type for c in phase.calls] == ["CALL", "STATICCALL"]
    assert phase.storage[SENDER].r == {"0x01": 1} and phase.storage[SENDER].w == {}


def test_build_falls_back_when_frames_and_steps_disagree() -> None:
    steps = [("CALL", 1), ("PUSH1", 2), ("CALL", 2), ("STOP", 2), ("STOP", 1)]
    assert isinstance(build(steps, [account_call()]), nativetrace.Fallback)  # frame missing
    steps = [("CALL", 1), ("PUSH1", 2), ("STOP", 2), ("STOP", 1)]
    inner = [frame("CALL", SENDER, OTHER)]
    assert isinstance(build(steps, [account_call(inner)]), nativetrace.Fallback)  # left over
    steps = [("CALL", 1), ("PUSH1", 3), ("STOP", 1)]
    assert isinstance(build(steps, [account_call()]), nativetrace.Fallback)  # depth jump


@pytest.mark.parametrize(
    ("opcode", "why"),
    [
        ("EXTCODESIZE", "EXTCODESIZE"),
        ("EXTCODEHASH", "EXTCODEHASH"),
        ("TLOAD", "transient"),
        ("TSTORE", "transient"),
    ],
)
def test_build_falls_back_on_what_needs_the_stack(opcode: str, why: str) -> None:
    steps = [("CALL", 1), (opcode, 2), ("STOP", 2), ("STOP", 1)]
    built = build(steps, [account_call()])
    assert isinstance(built, nativetrace.Fallback) and why in built.reason
    # The same in a phase no rule judges (the EntryPoint calling itself) is fine.
    own = frame("STATICCALL", EP, EP, input="0x957122ab")
    steps = [("STATICCALL", 1), (opcode, 2), ("STOP", 2), ("CALL", 1), ("STOP", 2), ("STOP", 1)]
    assert isinstance(build(steps, [own, account_call()]), nativetrace.FastTrace)


def test_build_falls_back_on_unknown_opcode_log1_and_selfdestruct() -> None:
    for steps in (
        [("CALL", 1), ("opcode 0xc not defined", 2), ("STOP", 1)],
        [("LOG1", 1), ("CALL", 1), ("STOP", 2), ("STOP", 1)],
        [("CALL", 1), ("SELFDESTRUCT", 2), ("STOP", 1)],
    ):
        assert isinstance(build(steps, [account_call()]), nativetrace.Fallback), steps


def test_build_gas_rule_and_named_opcodes_by_context() -> None:
    impl = "0x" + "55" * 20
    delegate = frame("DELEGATECALL", SENDER, impl)
    steps = [("CALL", 1), ("GAS", 2), ("DELEGATECALL", 2), ("GAS", 3), ("POP", 3)]
    steps += [("TIMESTAMP", 3), ("SSTORE", 3), ("STOP", 3), ("STOP", 2), ("STOP", 1)]
    prestate = {EP: {"code": "0x60"}, SENDER: {"code": "0x60", "storage": {"0x05": "0x0"}}}
    prestate[impl] = {"code": "0x60"}
    built = build(steps, [account_call([delegate])], prestate)
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    # GAS before DELEGATECALL is fine; the one before POP counts; the implementation's code
    # runs in the sender's context (storage, opcodes).
    assert phase.opcodes == {"GAS": {SENDER: 1}, "TIMESTAMP": {SENDER: 1}}
    assert phase.storage[SENDER].w == {"0x05": 1}
    assert phase.code[impl].size == 1
    with pytest.raises(BundlerFault, match="OP-012"):
        judge_unstaked(built.trace)


def test_build_created_code_and_out_of_gas() -> None:
    made = "0x" + "66" * 20
    create = frame("CREATE", SENDER, made, output="0x6000")
    burn = frame("CALL", SENDER, made, error="out of gas")
    steps = [("CALL", 1), ("CREATE", 2), ("PUSH1", 3), ("RETURN", 3), ("CALL", 2)]
    steps += [("JUMPDEST", 3), ("JUMPDEST", 3), ("POP", 2), ("STOP", 2), ("STOP", 1)]
    built = build(steps, [account_call([create, burn])])
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    assert phase.code[made].size == 2  # created earlier in the trace: it has code now
    assert phase.oog and phase.opcodes == {"CREATE": {SENDER: 1}}
    odd = frame("CALL", SENDER, OTHER, error="stack underflow")
    steps = [("CALL", 1), ("CALL", 2), ("STOP", 2), ("STOP", 1)]
    assert isinstance(build(steps, [account_call([odd])]), nativetrace.Fallback)


# --- sans-IO: build_static on hand-made traces -------------------------------------------------

STATIC_EP_CODE = "0x00"  # the EntryPoint's code at depth 1: only LOG1/SELFDESTRUCT matter


def build_static(
    calls: list[Any],
    prestate: dict[str, Any],
    op: UserOperation | None = None,
    *,
    storage_known: bool = True,
    gas_used: int = 0,
) -> nativetrace.FastTrace | nativetrace.Fallback | str:
    root = msgspec.convert(
        frame("CALL", "0x" + "00" * 20, EP, calls, output="0x", gasUsed=hex(gas_used)),
        nativetrace._Frame,
    )
    accounts_ = msgspec.convert(prestate, dict[str, nativetrace._Account])
    plain = UserOperation(
        sender=SENDER,
        nonce=0,
        call_data=b"",
        call_gas_limit=1,
        verification_gas_limit=1,
        pre_verification_gas=1,
        max_fee_per_gas=1,
        max_priority_fee_per_gas=1,
    )
    return nativetrace.build_static(
        root, accounts_, op or plain, entry_point=EP, version="0.7", storage_known=storage_known
    )


def test_static_clean_code_needs_no_struct_log() -> None:
    impl = "0x" + "55" * 20
    # The sender's code: PUSH1 0 SLOAD POP, a PUSH32 whose data is TIMESTAMP bytes, STOP.
    sender_code = "0x6000545" + "0" + "7f" + "42" * 32 + "00"
    impl_code = "0x6001600055" + "00"  # SSTORE(1, 0), run in the sender's context
    prestate = {
        EP: {"code": STATIC_EP_CODE},
        SENDER: {"code": sender_code, "storage": {"0x01": "0x0"}},
        impl: {"code": impl_code},
    }
    ecrecover = frame("STATICCALL", SENDER, ECRECOVER)
    delegate = frame("DELEGATECALL", SENDER, impl)
    built = build_static([account_call([ecrecover, delegate])], prestate)
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    assert phase.opcodes == {}
    assert [c.type for c in phase.calls] == ["CALL", "STATICCALL", "DELEGATECALL"]
    assert phase.code == {
        ECRECOVER: CodeAccess(size=-1, op="STATICCALL"),
        impl: CodeAccess(size=6, op="DELEGATECALL"),
    }
    assert phase.storage[SENDER].w == {"0x01": 1}  # the implementation's SSTORE, sender's slot
    assert set(built.trace.code_hashes) == {SENDER, impl}


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("0x4200", "0x42"),  # TIMESTAMP
        ("0x5a5000", "GAS not followed"),
        ("0x3b00", "EXTCODESIZE"),
        ("0x5c00", "TLOAD"),
        ("0x0c00", "0x0c"),  # unassigned on Cancun
    ],
)
def test_static_needs_the_struct_log_for_judged_opcodes(code: str, why: str) -> None:
    prestate = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": code}}
    built = build_static([account_call()], prestate)
    assert isinstance(built, str) and why in built, built
    # In a phase no rule judges (the EntryPoint calling a helper), only SELFDESTRUCT and
    # unknown opcodes matter.
    helper = "0x" + "77" * 20
    prestate[helper] = {"code": code}
    own = frame("STATICCALL", EP, helper, input="0x957122ab")
    built = build_static([own, account_call()], {**prestate, SENDER: {"code": "0x00"}})
    assert isinstance(built, nativetrace.FastTrace) == (why != "0x0c"), built


def test_static_gas_right_before_a_call_is_fine() -> None:
    # GAS CALL (the call underflows the stack here; what counts is which bytes can run).
    prestate = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": "0x5af100"}}
    assert isinstance(build_static([account_call()], prestate), nativetrace.FastTrace)


def test_static_needs_the_struct_log_for_what_only_steps_show() -> None:
    clean = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": "0x00"}}
    cases: list[tuple[list[Any], dict[str, Any], str]] = [
        # the EntryPoint may emit a LOG1 at depth 1 (BeforeExecution)
        ([account_call()], {**clean, EP: {"code": "0x60006000a100"}}, "LOG1"),
        ([account_call([frame("CALL", SENDER, OTHER, error="stack underflow")])], clean, "fail"),
        # code that ran but is not in the prestate
        ([account_call([frame("CALL", SENDER, OTHER)])], clean, "not in the prestate"),
        ([frame("DELEGATECALL", EP, SENDER)], clean, "DELEGATECALL"),
    ]
    for calls, prestate, why in cases:
        built = build_static(calls, prestate)
        assert isinstance(built, str) and why in built, (why, built)


def test_static_counts_creates_by_their_frames() -> None:
    """CREATE/CREATE2 reachable is no reason for the struct log: every one executed has a
    frame (anvil records one that fails its checks too, with its error: a fallback).  Each
    counts where it ran; the created code is there for calls after its frame, not within."""
    made = "0x" + "66" * 20
    inner_call = frame("CALL", made, made)
    create = frame("CREATE2", SENDER, made, [inner_call], input="0x6000", output="0x6001")
    after = frame("CALL", SENDER, made)
    prestate = {
        EP: {"code": STATIC_EP_CODE},
        SENDER: {"code": "0x6000600060006000f500"},
        made: {"code": "0x"},  # as the prestate lists a created account: before it
    }
    built = build_static([account_call([create, after])], prestate)
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    assert phase.opcodes == {"CREATE2": {SENDER: 1}}
    assert [c.type for c in phase.calls] == ["CALL", "CREATE2", "CALL", "CALL"]
    assert phase.code[made].size == 0  # first touched inside its own constructor
    never_ran = build_static([account_call()], prestate)
    assert isinstance(never_ran, nativetrace.FastTrace) and never_ran.trace.phases[0].opcodes == {}
    failed = frame("CREATE2", SENDER, made, error="insufficient balance for transfer")
    assert "failed" in str(build_static([account_call([failed])], prestate))
    with pytest.raises(BundlerFault, match="OP-031"):  # the account may not CREATE2
        judge_unstaked(built.trace)


def test_static_out_of_gas_and_code_less_targets() -> None:
    prestate = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": "0x00"}, OTHER: {"code": "0x"}}
    burn = frame("CALL", SENDER, OTHER, error="out of gas")
    built = build_static([account_call([burn])], prestate)
    assert isinstance(built, nativetrace.FastTrace), built
    (phase,) = built.trace.phases
    assert phase.oog and phase.code[OTHER].size == 0
    with pytest.raises(BundlerFault, match="OP-020"):
        judge_unstaked(built.trace)


def test_static_keccak_needs_counting_only_with_enough_gas() -> None:
    prestate = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": "0x6020600020" + "00"}}
    cheap = account_call()
    assert isinstance(build_static([cheap], prestate), nativetrace.FastTrace)
    costly = frame("CALL", EP, SENDER, input=VALIDATE, gasUsed=hex(nativetrace.KECCAK_GAS))
    built = build_static([costly], prestate)
    assert isinstance(built, str) and "KECCAK" in built


def test_lean_build_without_storage_only_where_the_rules_skip_the_slots() -> None:
    """``storage_known=False`` (codes only, no prestateTracer): a judged phase may touch the
    sender's and the EntryPoint's storage (STO-010, deposits: no slot is judged there), nothing
    else; an unjudged phase's storage is only named (STO-041); EXTCODE* anywhere needs the
    prestate (its targets' code hashes); enough gas to fill the collector's slots too."""
    impl = "0x" + "55" * 20
    helper = "0x" + "77" * 20
    sload = "0x6000545000"  # PUSH1 0 SLOAD POP STOP
    codes = {EP: {"code": STATIC_EP_CODE}, SENDER: {"code": "0x00"}, impl: {"code": sload}}
    in_sender = account_call([frame("DELEGATECALL", SENDER, impl)])
    built = build_static([in_sender], codes, storage_known=False)
    assert isinstance(built, nativetrace.FastTrace), built
    assert built.trace.phases[0].storage == {SENDER: nativetrace.SlotAccess()}
    judge_unstaked(built.trace)
    # The same code called (its own context): the slots are needed.
    in_impl = account_call([frame("CALL", SENDER, impl)])
    lean = build_static([in_impl], codes, storage_known=False)
    assert isinstance(lean, str) and "prestate" in lean, lean
    assert isinstance(build_static([in_impl], codes), nativetrace.FastTrace)
    # An unjudged phase (the EntryPoint calling a helper) reading its storage: named only.
    codes[helper] = {"code": sload}
    own = frame("STATICCALL", EP, helper, input="0x957122ab")
    built = build_static([own, account_call()], codes, storage_known=False)
    assert isinstance(built, nativetrace.FastTrace), built
    assert judge_unstaked(built.trace).storage == (helper,)
    # EXTCODE* in an unjudged phase: harmless to the rules, but its target's code hash.
    codes[helper] = {"code": "0x6000803b00"}
    lean = build_static([own, account_call()], codes, storage_known=False)
    assert isinstance(lean, str) and "EXTCODESIZE" in lean, lean
    assert isinstance(build_static([own, account_call()], codes), nativetrace.FastTrace)
    # Gas enough for MAX_SLOTS storage accesses (100 each), net of a refund.
    enough = nativetrace.STORAGE_ACCESS_GAS * jscollector.MAX_SLOTS * 4 // 5
    lean = build_static([in_sender], codes, storage_known=False, gas_used=enough)
    assert isinstance(lean, str) and "slots" in lean, lean
    assert isinstance(build_static([in_sender], codes, gas_used=enough), nativetrace.FastTrace)


def test_lean_plan_reads_overridden_codes_and_frame_targets() -> None:
    assert nativetrace._override_codes(None) == {}
    assert nativetrace._override_codes({EP.upper(): {"code": "0x00"}}) == {
        EP.upper().lower(): "0x00"
    }
    assert nativetrace._override_codes({EP: {"code": "0x00", "balance": "0x1"}}) is None
    root = msgspec.convert(
        frame("CALL", SENDER, EP, [
            account_call([frame("STATICCALL", SENDER, ECRECOVER), frame("CALL", SENDER, OTHER)]),
            frame("CALL", EP, OTHER),
        ]),
        nativetrace._Frame,
    )  # fmt: skip
    assert nativetrace._frame_targets(root) == [SENDER, OTHER]


# --- sans-IO: the opcode sweep ------------------------------------------------------------------

TRAILER = bytes.fromhex("a2646970667358221220") + b"\x42" * 32 + bytes.fromhex("64736f6c634300081c")
TRAILER += (len(TRAILER)).to_bytes(2, "big")  # solc's: CBOR map, then its length


def test_sweep_skips_push_data() -> None:
    code = bytes([0x7F]) + bytes([0x42, 0xFF, 0x3B, 0x5A] * 8) + bytes([0x00])
    assert opcodes.profile(code).opcodes == {0x7F, 0x00}
    # A PUSH cut short by the end of the code: its data is padding, not opcodes.
    assert opcodes.profile(bytes([0x61, 0x42])).opcodes == {0x61}
    # Without the PUSH the same bytes are opcodes.
    assert {0x42, 0xFF} <= opcodes.profile(bytes([0x42, 0xFF])).opcodes


def test_sweep_metadata_trailer_and_dead_code() -> None:
    body = bytes.fromhex("6000545000")  # PUSH1 0 SLOAD POP STOP
    found = opcodes.profile(body + b"\xfe" + TRAILER).opcodes
    assert found == {0x60, 0x54, 0x50, 0x00}  # INVALID and the trailer are dead
    # A JUMPDEST in the "trailer" could be jumped to: what follows it counts.
    hidden = body + b"\xfe" + bytes([0xA2, 0x5B, 0x42, 0x00]) + TRAILER
    assert 0x42 in opcodes.profile(hidden).opcodes
    # Code that falls through into the trailer runs it.
    assert 0x42 in opcodes.profile(bytes.fromhex("600054") + TRAILER).opcodes
    # A PUSH whose data runs into the trailer shifts the boundaries: swept as they are.
    assert opcodes.profile(bytes.fromhex("7f") + TRAILER[:32]).opcodes == {0x7F}


def test_sweep_gas_adjacency() -> None:
    for code, lone in (
        ("5af1", False),  # GAS CALL
        ("5afa", False),  # GAS STATICCALL
        ("5af4", False),  # GAS DELEGATECALL
        ("5a50", True),  # GAS POP
        ("5a", True),  # GAS at the end: STOP follows
        ("00615af1", False),  # GAS inside dead PUSH data
        ("005a50", False),  # dead GAS
    ):
        assert opcodes.profile(bytes.fromhex(code)).lone_gas is lone, code


# A selector dispatcher: 0xaabbccdd -> SLOAD, 0x11223344 -> TIMESTAMP, else STOP.
DISPATCH = bytes.fromhex(
    "600035" "60e01c" "80" "63aabbccdd" "14" "601a" "57"
    "6311223344" "14" "601f" "57" "00"
    "5b600054" "00"
    "5b42" "00"
)  # fmt: skip


def test_reachable_follows_the_selector() -> None:
    assert 0x42 in opcodes.profile(DISPATCH).opcodes
    first = opcodes.reachable(DISPATCH, 0xAABBCCDD)
    assert first is not None and 0x54 in first.opcodes and 0x42 not in first.opcodes
    second = opcodes.reachable(DISPATCH, 0x11223344)
    assert second is not None and 0x42 in second.opcodes and 0x54 not in second.opcodes
    neither = opcodes.reachable(DISPATCH, 0)
    assert neither is not None and not {0x42, 0x54} & neither.opcodes
    # The cache answers by (hash, selector).
    cache = opcodes.ProfileCache(2)
    assert cache.get(b"h", DISPATCH, 0xAABBCCDD) == first
    assert cache.get(b"h", DISPATCH) == opcodes.profile(DISPATCH)
    cache.get(b"i", DISPATCH, 0x11223344)
    assert len(cache) == 2  # bounded: the oldest went


def test_reachable_gives_up_on_unknown_jumps_and_opcodes() -> None:
    unknown_jump = bytes.fromhex("600035565b4200")  # JUMP to CALLDATALOAD(0)
    assert opcodes.reachable(unknown_jump, 0) is None
    cache = opcodes.ProfileCache()
    assert 0x42 in cache.get(b"j", unknown_jump, 0).opcodes  # the whole sweep instead
    assert opcodes.reachable(bytes.fromhex("0c00"), 0) is None  # unassigned


def test_reachable_knows_a_tested_word() -> None:
    # CALLER DUP1 ISZERO PUSH1 8 JUMPI STOP; 8: JUMPDEST PUSH1 14 JUMPI STOP;
    # 14: JUMPDEST TIMESTAMP STOP.  The second JUMPI tests the word the first found zero.
    code = bytes.fromhex("33801560085700005b600e5700005b4200")
    assert 0x42 in opcodes.profile(code).opcodes
    found = opcodes.reachable(code, 0)
    assert found is not None and 0x42 not in found.opcodes
    # Without the ISZERO the second test is of a word known non-zero: TIMESTAMP runs.
    code = bytes.fromhex("33806008570000005b600e5700005b4200")
    found = opcodes.reachable(code, 0)
    assert found is not None and 0x42 in found.opcodes


def test_code_cache_decodes_hashes_and_stays_bounded() -> None:
    cache = opcodes.CodeCache(max_chars=12)
    code, digest = cache.get("0x6000")
    assert (code, digest) == (bytes.fromhex("6000"), keccak256(bytes.fromhex("6000")))
    assert cache.get("0x6000")[0] is code  # kept
    assert cache.get("0x") == (b"", keccak256(b""))
    cache.get("0x60016002")  # 6 + 2 + 10 characters: the oldest goes
    assert cache.get("0x6000")[0] is not code
    with pytest.raises(ValueError, match="hex"):
        cache.get("0x6g")
    with pytest.raises(ValueError, match="hex"):
        cache.get("6000")


def test_code_cache_finds_an_equal_text_and_never_a_lookalike() -> None:
    """A node's answer is a new string: found by its length and tail, then compared whole."""
    cache = opcodes.CodeCache(max_chars=10_000)
    body = "60" * 100
    code, _ = cache.get("0x" + body)
    assert cache.get("".join(["0x", body]))[0] is code  # equal text, another object
    lookalike = "0x61" + body[2:]  # same length, same last 64 characters
    assert cache.get(lookalike)[0] == bytes.fromhex(lookalike[2:]) != code
    assert cache.get("0x" + body)[0] == code
    with pytest.raises(ValueError, match="hex"):
        cache.get("0xzz" + body[2:])


def test_opcode_table_is_the_collectors() -> None:
    assert set(opcodes.EFFECTS) == jscollector._ASSIGNED


# --- the factory phase replayed alone (sans-IO) ------------------------------------------------

CREATOR = "0x" + "cc" * 20
FACTORY = "0x" + "22" * 20
UNKNOWN = ("0x" + "91" * 20, "0x" + "92" * 20)


def factory_call(**extra: Any) -> Any:
    inner = frame("CALL", CREATOR, FACTORY, input="0x12345678", output="0x" + "00" * 12 + "11" * 20)
    return frame("CALL", EP, CREATOR, [inner], input=rules._CREATE_SENDER + "00" * 32, **extra)


def typed(raw: Any) -> nativetrace._Frame:
    return msgspec.convert(raw, nativetrace._Frame)


def accounts_with(**codes: str) -> dict[str, nativetrace._Account]:
    accounts = {CREATOR: "0x6001", FACTORY: "0x6002", SENDER: "0x", **codes}
    return {a: nativetrace._Account(code=c) for a, c in accounts.items()}


def oracle(phase: Any, replay: Any, state: dict[str, Any]) -> str | None:
    op = UserOperation(
        sender=SENDER, nonce=0, call_data=b"", call_gas_limit=1, verification_gas_limit=1,
        pre_verification_gas=1, max_fee_per_gas=1, max_priority_fee_per_gas=1,
        factory=FACTORY, factory_data=b"\x01",
    )  # fmt: skip
    return nativetrace.factory_oracle(phase, replay, state, op, entry_point=EP, unknowable=UNKNOWN)


def test_factory_oracle_vouches_only_for_a_replay_that_touched_no_code_less_account() -> None:
    phase = typed(factory_call())
    replay = msgspec.structs.replace(phase, from_=UNKNOWN[0], gas="0x999")
    # The sender (being deployed), precompiles and the replay's own sender and coinbase.
    state = accounts_with(**{ECRECOVER: "0x", UNKNOWN[0]: "0x", UNKNOWN[1]: "0x"})
    assert oracle(phase, replay, state) is None
    assert "EntryPoint" in (oracle(phase, replay, accounts_with(**{EP: "0x60"})) or "")
    assert "no code" in (oracle(phase, replay, accounts_with(**{OTHER: "0x"})) or "")
    # Another path when replayed (another output, a reverted inner call): no verdict.
    changed = msgspec.structs.replace(replay, output="0x01")
    assert "another path" in (oracle(phase, changed, state) or "")
    inner = msgspec.structs.replace(replay.calls[0], error="execution reverted")
    assert "another path" in (
        oracle(phase, msgspec.structs.replace(replay, calls=[inner]), state) or ""
    )


def test_factory_phase_and_its_replay_call() -> None:
    root = typed(
        frame("CALL", "0x" + "00" * 20, EP, [frame("CALL", EP, SENDER), factory_call(gas="0x10")])
    )
    phase = nativetrace.factory_phase(root)
    assert phase is not None and phase.to == CREATOR
    op = UserOperation(
        sender=SENDER, nonce=0, call_data=b"", call_gas_limit=1, verification_gas_limit=0x10,
        pre_verification_gas=1, max_fee_per_gas=1, max_priority_fee_per_gas=1,
        factory=FACTORY, factory_data=b"\x01\x02",
    )  # fmt: skip
    creator = nativetrace.sender_creator(EP)
    create_sender = abi.encode_call("createSender(bytes)", op.init_code)
    # v0.6/v0.7: the whole phase, createSender(initCode) from a random sender.
    assert nativetrace.replay_call(op, EP, "0.7", UNKNOWN[0]) == {
        "from": UNKNOWN[0],
        "to": creator,
        "input": "0x" + create_sender.hex(),
        "gas": hex(0x10 + nativetrace.REPLAY_GAS + 16 * len(create_sender)),
    }
    assert nativetrace.replayed_frame(phase, "0.7") is phase
    # v0.8's SenderCreator answers its EntryPoint alone: the factory's call, from it.
    assert nativetrace.replay_call(op, EP, "0.8", UNKNOWN[0]) == {
        "from": creator,
        "to": FACTORY,
        "input": "0x0102",
        "gas": hex(0x10 + nativetrace.REPLAY_GAS + 16 * 2),
    }
    assert nativetrace.replayed_frame(phase, "0.8") is phase.calls[0]
    assert nativetrace.factory_phase(typed(frame("CALL", "0x" + "00" * 20, EP, []))) is None
