"""``chaingate bench userops``: ERC-4337 operations to any bundler URL, side by side.

Each target is a bundler's JSON-RPC URL (chaingate's ``/v1/bundler/{chain}/{network}``, Alto,
another provider's).  ``--node`` is the chain's JSON-RPC (a devnet's anvil): it tells the
accounts' addresses (the factory's ``getAddress``), the base fee, and funds the accounts
(``anvil_setBalance``).  Every user owns one account and sends operations one after another
(see ``uops``); per operation it records:

* ``eth_sendUserOperation`` — the answer's latency; the answer must be the operation's own
  userOpHash (else a wrong answer); a JSON-RPC refusal or limit is said as such;
* ``receipt`` — submit to ``eth_getUserOperationReceipt`` answering (polled every 100 ms), its
  ``success`` true; one not there within ``--timeout`` is dropped.

The accept rate is the share of ``eth_sendUserOperation`` answered; operations per second is
``receipt``'s answered/s.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import gevent
from locust import User, task

from chaingate.aa.userop import CANONICAL_ENTRY_POINTS, require_version
from chaingate.benchsuite import chainsample, outcomes, uops
from chaingate.benchsuite.plan import BenchError, Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.scenarios.http import TargetUser
from chaingate.evm import abi
from chaingate.evm.addresses import checksum_address
from chaingate.evm.keys import PrivateKey

RECEIPT_POLL = 0.1  # seconds between eth_getUserOperationReceipt polls
ACCOUNT_BALANCE = hex(10**18)


class UserOpsScenario:
    def __init__(self, plan: Plan, recorder: Recorder) -> None:
        self.plan = plan
        self.recorder = recorder
        self.users = plan.users
        try:
            self.version = require_version(str(plan.options.get("version", "0.7")))
            self.factory = checksum_address(str(plan.options.get("factory", "")))
            given = str(plan.options.get("entry_point", ""))
            self.entry_point = checksum_address(given or CANONICAL_ENTRY_POINTS[self.version])
        except ValueError as exc:
            raise BenchError(str(exc)) from None
        self.node = str(plan.options.get("node", ""))
        self.owner = PrivateKey.generate()  # this run's accounts' owner: never reused
        self.chain_id = 0
        self.max_fee = 0
        self.accounts: dict[str, list[uops.Account]] = {}  # free accounts, by target name

    def _node(self, method: str, params: list[Any]) -> Any:
        rpc = chainsample.rpc_caller(self.node, {}, self.plan.timeout, lambda: None)
        try:
            return rpc(method, params)
        except chainsample.SampleError as exc:
            raise BenchError(f"--node {method}: {exc}") from None

    def prepare(self) -> None:
        self.chain_id = int(self._node("eth_chainId", []), 16)
        base_fee = int(self._node("eth_getBlockByNumber", ["latest", False])["baseFeePerGas"], 16)
        self.max_fee = 2 * base_fee + uops.PRIORITY_FEE  # room for the fee to rise meanwhile
        run = secrets.randbits(64) << 32  # salts of this run (and this process) alone
        for index, target in enumerate(self.plan.targets):
            accounts = []
            for slot in range(self.users):
                salt = run + index * 65536 + slot
                address = self._address(salt)
                self._node("anvil_setBalance", [address, ACCOUNT_BALANCE])
                accounts.append(uops.Account(address, salt))
            self.accounts[target.name] = accounts
            self._check_entry_point(target.name, target.url)
        self.recorder.notes["operations"] = (
            f"EntryPoint v{self.version} {self.entry_point}, SimpleAccountFactory "
            f"{self.factory}; {self.users} accounts per target, funded on the node"
        )

    def _address(self, salt: int) -> str:
        data = abi.encode_call("getAddress(address,uint256)", self.owner.address, salt)
        word = self._node("eth_call", [{"to": self.factory, "data": "0x" + data.hex()}, "latest"])
        if not isinstance(word, str) or len(word) != 66:
            raise BenchError(f"--factory {self.factory}: getAddress answered {word!r}")
        return checksum_address("0x" + word[-40:])

    def _check_entry_point(self, name: str, url: str) -> None:
        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_supportedEntryPoints", "params": []}
        self.recorder.setup_request(name)
        try:
            raw = chainsample.post(
                url, json.dumps(body).encode(), self.plan.key_headers(), self.plan.timeout
            )
            supported = [str(a).lower() for a in json.loads(raw).get("result", [])]
        except (chainsample.SampleError, ValueError, AttributeError, TypeError) as exc:
            self.recorder.check("supports the EntryPoint", name, False, str(exc))
            return
        ok = self.entry_point.lower() in supported
        self.recorder.check("supports the EntryPoint", name, ok, "" if ok else str(supported))

    def take(self, target: str) -> uops.Account:
        return self.accounts[target].pop()

    def give_back(self, target: str, account: uops.Account) -> None:
        self.accounts[target].append(account)

    def finish(self) -> None:
        """Nothing to clean: the accounts are this run's own."""

    def user_classes(self) -> list[type[User]]:
        return [
            type(
                f"Target{index}",
                (UserOpUser,),
                {
                    "target": target,
                    "scenario": self,
                    "host": target.url,
                    "timeout": self.plan.timeout,
                },
            )
            for index, target in enumerate(self.plan.targets)
        ]


class UserOpUser(TargetUser):
    abstract = True
    scenario: UserOpsScenario

    def on_start(self) -> None:
        self.account = self.scenario.take(self.target.name)

    def on_stop(self) -> None:
        self.scenario.give_back(self.target.name, self.account)

    def _call(self, method: str, params: list[Any]) -> tuple[Any, str, str, float]:
        """(result, outcome, detail, ms) of one JSON-RPC call to the bundler, unrecorded."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        started = time.perf_counter()
        response = self.client.post(
            self.target.url,
            data=body,
            headers={"Content-Type": "application/json", **self.scenario.plan.key_headers()},
        )
        ms = (time.perf_counter() - started) * 1000
        if not response.status_code:
            return None, outcomes.ERROR, f"no answer: {getattr(response, 'error', None)!r}", ms
        outcome = outcomes.of_status(response.status_code)
        try:
            reply = json.loads(response.content or b"")
        except ValueError:
            return None, outcomes.WRONG, f"HTTP {response.status_code}: not JSON", ms
        if isinstance(reply, dict) and "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            found = outcomes.of_rpc_error(error.get("code"))
            return None, found, f"{method}: {error.get('code')} {error.get('message')}", ms
        if outcome != outcomes.OK or not isinstance(reply, dict) or "result" not in reply:
            return None, outcome if outcome != outcomes.OK else outcomes.WRONG, str(reply)[:200], ms
        return reply["result"], outcomes.OK, "", ms

    def _record(self, name: str, outcome: str, ms: float, detail: str = "") -> None:
        failure = outcomes.Failure(outcome, detail) if outcome != outcomes.OK else None
        self.environment.events.request.fire(
            request_type="rpc",
            name=name,
            response_time=ms,
            response_length=0,
            exception=failure,
            context={"target": self.target.name},
        )

    @task
    def operate(self) -> None:
        scenario = self.scenario
        built = uops.build(
            self.account,
            scenario.owner,
            factory=scenario.factory,
            entry_point=scenario.entry_point,
            chain_id=scenario.chain_id,
            version=scenario.version,
            max_fee=scenario.max_fee,
        )
        submitted = time.perf_counter()
        result, outcome, detail, ms = self._call(
            "eth_sendUserOperation", [built.rpc, scenario.entry_point]
        )
        if outcome == outcomes.OK and str(result).lower() != built.hash:
            outcome, detail = (
                outcomes.WRONG,
                f"answered {result}, the operation's hash is {built.hash}",
            )
        self._record("eth_sendUserOperation", outcome, ms, detail)
        if outcome != outcomes.OK:
            gevent.sleep(RECEIPT_POLL)  # a refusing bundler is not hammered
            return
        self.account.nonce += 1  # accepted: the next operation takes the next nonce
        deadline = submitted + scenario.plan.timeout
        while time.perf_counter() < deadline:
            receipt, outcome, detail, _ = self._call("eth_getUserOperationReceipt", [built.hash])
            waited = (time.perf_counter() - submitted) * 1000
            if outcome != outcomes.OK:
                self._record("receipt", outcome, waited, detail)
                return
            if receipt is not None:
                if isinstance(receipt, dict) and receipt.get("success") is True:
                    self._record("receipt", outcomes.OK, waited)
                else:
                    self._record("receipt", outcomes.WRONG, waited, f"not a success: {receipt}")
                return
            gevent.sleep(RECEIPT_POLL)
        self._record("receipt", outcomes.DROPPED, 0.0, f"{built.hash} not included in time")


def scenario(plan: Plan, recorder: Recorder) -> UserOpsScenario:
    return UserOpsScenario(plan, recorder)
