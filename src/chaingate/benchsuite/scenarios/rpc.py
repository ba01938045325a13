"""``chaingate bench rpc``: a realistic JSON-RPC read mix against every target side by side."""

from __future__ import annotations

import random

from locust import User, task

from chaingate.benchsuite import chainsample, outcomes, rpcprofile, rpcwire, solsample
from chaingate.benchsuite.plan import BenchError, Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.scenarios.http import TargetUser, settle


class RpcScenario:
    def __init__(self, plan: Plan, recorder: Recorder) -> None:
        self.plan = plan
        self.recorder = recorder
        self.users = plan.users
        self.profile = rpcprofile.load(str(plan.options.get("profile", "rpc")))
        self.oracle = rpcwire.Oracle()
        self.pool: chainsample.Pool | solsample.Pool | None = None
        self.kinds: list[str] = []
        self.weights: list[float] = []
        plan.options["profile"] = self.profile.name

    def prepare(self) -> None:
        first = self.plan.targets[0]
        rpc = chainsample.rpc_caller(
            first.url,
            self.plan.key_headers(),
            self.plan.timeout,
            lambda: self.recorder.setup_request(first.name),
        )
        try:
            pool: chainsample.Pool | solsample.Pool
            if self.profile.family == "solana":
                pool = solsample.sample(rpc, self.profile.sample_blocks, self.profile.lag)
            else:
                pool = chainsample.sample(rpc, self.profile.sample_blocks, self.profile.lag)
        except chainsample.SampleError as exc:
            raise BenchError(f"drawing parameters from {first.shown}: {exc}") from None
        self.pool = pool
        self.recorder.notes["parameters"] = f"from {first.name}: {pool.describe()}"
        mix = {k: w for k, w in self.profile.mix.items() if self._available(k)}
        skipped = sorted(set(self.profile.mix) - set(mix))
        if skipped:
            self.recorder.notes["skipped"] = ", ".join(skipped) + " (nothing on the chain to ask)"
        self.kinds, self.weights = list(mix), list(mix.values())
        self._preflight()

    def _preflight(self) -> None:
        """Each kind once to every target, answers compared, before any load."""
        rng = random.Random(1)  # noqa: S311 - a load mix, not a secret
        for kind in self.kinds:
            calls, batch = self.calls(kind, rng)
            for target in self.plan.targets:
                body, ids = rpcwire.body(calls, batch)
                self.recorder.setup_request(target.name, len(calls))
                try:
                    raw = chainsample.post(
                        target.url, body, self.plan.key_headers(), self.plan.timeout
                    )
                    outcome, detail = rpcwire.judge(
                        raw, calls, ids, batch, self.oracle, target.name
                    )
                except chainsample.SampleError as exc:
                    outcome, detail = outcomes.ERROR, str(exc)
                self.recorder.check(
                    f"{kind}: answered alike", target.name, outcome == outcomes.OK, detail
                )

    def _available(self, kind: str) -> bool:
        if kind == rpcprofile.BATCH:
            return True
        if isinstance(self.pool, solsample.Pool):
            return solsample.available(kind, self.pool)
        assert self.pool is not None
        return chainsample.available(kind, self.pool)

    def _call(self, kind: str, rng: random.Random) -> rpcwire.Call:
        if isinstance(self.pool, solsample.Pool):
            return solsample.make_call(kind, self.pool, rng)
        assert self.pool is not None
        return chainsample.make_call(kind, self.pool, rng, self.profile.logs_range)

    def calls(self, kind: str, rng: random.Random) -> tuple[list[rpcwire.Call], bool]:
        if kind != rpcprofile.BATCH:
            return [self._call(kind, rng)], False
        solana = isinstance(self.pool, solsample.Pool)
        unpinned = solsample.UNPINNED if solana else ("eth_blockNumber",)
        pinned = [k for k in self.kinds if k != rpcprofile.BATCH and k not in unpinned]
        pinned = pinned or ["getBalance" if solana else "eth_chainId"]
        return [self._call(rng.choice(pinned), rng) for _ in range(self.profile.batch_size)], True

    def finish(self) -> None:
        """Nothing arrives after the load, and nothing was made."""

    def user_classes(self) -> list[type[User]]:
        return [
            type(
                f"Target{index}",
                (RpcUser,),
                {
                    "target": target,
                    "scenario": self,
                    "host": target.url,
                    "timeout": self.plan.timeout,
                },
            )
            for index, target in enumerate(self.plan.targets)
        ]


class RpcUser(TargetUser):
    abstract = True
    scenario: RpcScenario

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.headers = {"Content-Type": "application/json", **self.scenario.plan.key_headers()}

    @task
    def request(self) -> None:
        scenario = self.scenario
        kind = self.rng.choices(scenario.kinds, scenario.weights)[0]
        calls, batch = scenario.calls(kind, self.rng)
        body, ids = rpcwire.body(calls, batch)
        with self.client.post(
            self.target.url,
            data=body,  # type: ignore[arg-type]  # bytes are sent as they are
            headers=self.headers,
            name=kind,
            catch_response=True,
            context={"target": self.target.name, "calls": len(calls)},
        ) as response:
            settle(
                response,
                lambda raw: rpcwire.judge(
                    raw, calls, ids, batch, scenario.oracle, self.target.name
                ),
            )


def scenario(plan: Plan, recorder: Recorder) -> RpcScenario:
    return RpcScenario(plan, recorder)
