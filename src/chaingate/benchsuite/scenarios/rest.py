"""``chaingate bench rest``: the data endpoints (balances, token metadata, NFTs, transfers) with
addresses and contracts drawn from the chain, against every target side by side.

A target is a chaingate base URL (``http://host:8000``); ``--chain`` names the dataset
(``ethereum-devnet``).  Parameters come from the chain's recent blocks over JSON-RPC
(``--rpc URL``; default: the first target's ``/v1/rpc/{chain}/{network}``).  Each answer must be
a 200 JSON object about what was asked (its ``address``/``contract`` echoed); token metadata must
be the same on every target, and balances too when two targets answer at the same block.
"""

from __future__ import annotations

import random

import msgspec
from locust import User, task

from chaingate.benchsuite import chainsample, outcomes, rpcwire
from chaingate.benchsuite.plan import BenchError, Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.scenarios.http import TargetUser, settle

# Request kind -> (weight, path template); {a} an address, {c} a token contract.
KINDS = {
    "token balances": (40, "/v1/tokens/{chain}/balances/{a}?limit=50"),
    "token metadata": (20, "/v1/tokens/{chain}/metadata/{c}"),
    "nfts owned": (20, "/v1/nfts/{chain}/owned/{a}?limit=50"),
    "transfers": (20, "/v1/transfers/{chain}/{a}"),
}


MAX_TOKENS = 20  # token contracts probed for metadata before the load


def default_rpc(base: str, chain: str) -> str:
    return f"{base.rstrip('/')}/v1/rpc/{chain.replace('-', '/', 1)}"


class RestScenario:
    def __init__(self, plan: Plan, recorder: Recorder) -> None:
        self.plan = plan
        self.recorder = recorder
        self.users = plan.users
        self.chain = str(plan.options.get("chain", "ethereum-devnet"))
        given = str(plan.options.get("rpc", ""))
        self.rpc_url = given if "://" in given else default_rpc(plan.targets[0].url, self.chain)
        self.oracle = rpcwire.Oracle()
        self.addresses: list[str] = []
        self.contracts: list[str] = []
        self.kinds: list[str] = []
        self.weights: list[int] = []

    def prepare(self) -> None:
        first = self.plan.targets[0]
        on_first = self.rpc_url.startswith(first.url.rstrip("/"))

        def count() -> None:
            if on_first:
                self.recorder.setup_request(first.name)

        rpc = chainsample.rpc_caller(
            self.rpc_url, self.plan.key_headers(), self.plan.timeout, count
        )
        try:
            pool = chainsample.sample(rpc, 32, 2)
        except chainsample.SampleError as exc:
            raise BenchError(f"drawing addresses over JSON-RPC: {exc}") from None
        self.addresses = sorted(set(pool.holders) | set(pool.addresses))
        self.contracts = self._described(pool.tokens[:MAX_TOKENS])
        self.recorder.notes["parameters"] = (
            f"{pool.describe()}; {len(self.contracts)} token contracts with metadata"
        )
        usable = {k: v for k, v in KINDS.items() if "{c}" not in v[1] or self.contracts}
        self.kinds = list(usable)
        self.weights = [weight for weight, _ in usable.values()]
        self._preflight()

    def _described(self, tokens: list[str]) -> list[str]:
        """The contracts the first target describes: a Transfer of three topics is also what
        some contracts that are not ERC-20s emit, and those have no token metadata."""
        first = self.plan.targets[0]
        kept = []
        for token in tokens:
            self.recorder.setup_request(first.name)
            path = KINDS["token metadata"][1].format(chain=self.chain, c=token)
            try:
                chainsample.get(
                    first.url.rstrip("/") + path, self.plan.key_headers(), self.plan.timeout
                )
            except chainsample.SampleError:
                continue
            kept.append(token)
        return kept

    def _preflight(self) -> None:
        """Each kind once to every target, answers compared, before any load."""
        rng = random.Random(1)  # noqa: S311 - a load mix, not a secret
        for kind in self.kinds:
            path, subject = self.request(kind, rng)
            for target in self.plan.targets:
                self.recorder.setup_request(target.name)
                try:
                    raw = chainsample.get(
                        target.url.rstrip("/") + path, self.plan.key_headers(), self.plan.timeout
                    )
                    outcome, detail = self.judge(kind, path, subject, raw, target.name)
                except chainsample.SampleError as exc:
                    outcome, detail = outcomes.ERROR, str(exc)
                ok = outcome == outcomes.OK
                self.recorder.check(f"{kind}: answered alike", target.name, ok, detail)

    def request(self, kind: str, rng: random.Random) -> tuple[str, str]:
        """(path, the address or contract the answer must be about)."""
        template = KINDS[kind][1]
        subject = rng.choice(self.contracts if "{c}" in template else self.addresses)
        return template.format(chain=self.chain, a=subject, c=subject), subject

    def judge(self, kind: str, path: str, subject: str, raw: bytes, target: str) -> tuple[str, str]:
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return outcomes.WRONG, f"not JSON: {raw[:80]!r}"
        if not isinstance(body, dict):
            return outcomes.WRONG, "not a JSON object"
        echoed = body.get("address") or body.get("contract")
        if isinstance(echoed, str) and echoed.lower() != subject.lower():
            return outcomes.WRONG, f"{kind}: about {echoed}, asked {subject}"
        if kind == "token metadata":
            differs = self.oracle.judge(rpcwire.Call(path, [], True), body, target)
        elif kind == "token balances" and body.get("block_hash"):
            at = rpcwire.Call(path, [body["block_hash"]], True)  # same block, same balances
            differs = self.oracle.judge(at, body.get("tokens"), target)
        else:
            differs = None
        return (outcomes.WRONG, differs) if differs else (outcomes.OK, "")

    def finish(self) -> None:
        """Nothing arrives after the load, and nothing was made."""

    def user_classes(self) -> list[type[User]]:
        return [
            type(
                f"Target{index}",
                (RestUser,),
                {
                    "target": target,
                    "scenario": self,
                    "host": target.url,
                    "timeout": self.plan.timeout,
                },
            )
            for index, target in enumerate(self.plan.targets)
        ]


class RestUser(TargetUser):
    abstract = True
    scenario: RestScenario

    @task
    def request(self) -> None:
        scenario = self.scenario
        kind = self.rng.choices(scenario.kinds, scenario.weights)[0]
        path, subject = scenario.request(kind, self.rng)
        with self.client.get(
            self.target.url.rstrip("/") + path,
            headers=scenario.plan.key_headers(),
            name=kind,
            catch_response=True,
            context={"target": self.target.name},
        ) as response:
            settle(response, lambda raw: scenario.judge(kind, path, subject, raw, self.target.name))


def scenario(plan: Plan, recorder: Recorder) -> RestScenario:
    return RestScenario(plan, recorder)
