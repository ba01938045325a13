"""What the HTTP workloads share: a user bound to one target, and an answer judged in order —
no answer, then the status (a refusal or a limit is said as such), then the body."""

from __future__ import annotations

import random
from collections.abc import Callable

from locust import constant
from locust.contrib.fasthttp import FastHttpUser, ResponseContextManager

from chaingate.benchsuite import outcomes
from chaingate.benchsuite.targets import Target


class TargetUser(FastHttpUser):
    abstract = True
    wait_time = constant(0)
    max_retries = 0  # a retry would be a second request the report does not count
    insecure = False
    target: Target
    timeout: float

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.network_timeout = self.connection_timeout = self.timeout
        super().__init__(*args, **kwargs)
        self.rng = random.Random()  # noqa: S311 - a load mix, not a secret


def settle(
    response: ResponseContextManager, judge_body: Callable[[bytes], tuple[str, str]]
) -> None:
    """Mark ``response`` a success or a failure carrying its outcome."""
    if not response.status_code:  # no answer: refused connection, reset, timeout
        error = response.request_meta.get("exception")
        response.failure(outcomes.Failure(outcomes.ERROR, f"no answer: {error!r}"))
        return
    outcome = outcomes.of_status(response.status_code)
    if outcome != outcomes.OK:
        text = (response.content or b"")[:120]
        response.failure(outcomes.Failure(outcome, f"HTTP {response.status_code}: {text!r}"))
        return
    outcome, detail = judge_body(response.content or b"")
    if outcome == outcomes.OK:
        response.success()
    else:
        response.failure(outcomes.Failure(outcome, detail))
