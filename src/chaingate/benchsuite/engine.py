"""Runs a scenario on locust: one process, a master with workers, or a worker.

Every process that runs users prepares the scenario itself (draws its parameters, checks the
targets' answers) and records each request in its ``Recorder``.  A worker sends its recordings
with each of locust's periodic reports and a last time when its users have stopped, before it
tells the master it has stopped: so when the master's stop returns, it holds every request.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import gevent
from gevent.event import Event
from locust import User
from locust.env import Environment
from locust.rpc.protocol import Message

from chaingate.benchsuite import machine, outcomes, report, results
from chaingate.benchsuite.plan import Plan
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.shapes import shape_class

FINAL = "chaingate_final"  # a worker's last recordings, sent as its users have stopped
WORKER_WAIT = 60.0  # seconds the master waits for its workers to connect
FINAL_WAIT = 30.0  # seconds it waits for their last recordings once stopped
WORKER_LEAVE_DELAY = 1.0  # seconds a stopped worker leaves its last messages to go out
WORKER_EXIT_WAIT = 5.0  # seconds a local worker has to exit after the master quits

log = logging.getLogger("chaingate.bench")


class Scenario(Protocol):
    users: int  # users of each class at the shape's peak

    def prepare(self) -> None:
        """Draw parameters from the targets and check their answers (before any load)."""

    def user_classes(self) -> list[type[User]]: ...

    def finish(self) -> None:
        """After the load: what is still to arrive, and cleaning up what prepare made."""


ScenarioFactory = Callable[[Plan, Recorder], Scenario]


def _record_requests(environment: Environment, recorder: Recorder) -> None:
    def on_request(
        request_type: str,
        name: str,
        response_time: float,
        response_length: int,
        exception: BaseException | None = None,
        context: dict[str, Any] | None = None,
        **_: object,
    ) -> None:
        target = (context or {}).get("target")
        if target is None:
            return
        calls = int((context or {}).get("calls", 1))
        if isinstance(exception, outcomes.Failure):
            outcome, detail = exception.outcome, str(exception)
        elif exception is not None:
            outcome, detail = outcomes.ERROR, f"{type(exception).__name__}: {exception}"
        else:
            outcome, detail = outcomes.OK, ""
        recorder.record(target, name, outcome, response_time, calls, detail)

    def on_user_error(user_instance: User, exception: BaseException, tb: Any, **_: object) -> None:
        # A scenario's own bug: fails the run (a report of nothing measured must not pass).
        recorder.check("the scenario ran without raising", "", False, repr(exception))

    environment.events.request.add_listener(on_request)
    environment.events.user_error.add_listener(on_user_error)


def run(plan: Plan, make_scenario: ScenarioFactory) -> int:
    recorder = Recorder()
    scenario = make_scenario(plan, recorder)
    if plan.mode == "worker":
        return _run_worker(plan, scenario, recorder)
    if plan.mode == "master" or plan.workers:
        return _run_master(plan, scenario, recorder)
    return _run_local(plan, scenario, recorder)


def _environment(plan: Plan, scenario: Scenario, recorder: Recorder) -> Environment:
    classes = scenario.user_classes()
    shape = shape_class(plan.shape, plan.duration, scenario.users, plan.steps, len(classes))
    environment = Environment(
        user_classes=classes,
        shape_class=shape(),
        stop_timeout=plan.timeout + 1.0,  # users finish the request they are making
        catch_exceptions=True,
    )
    _record_requests(environment, recorder)
    return environment


class _Run:
    """Start and stop times of the load, and a stop on Ctrl-C or SIGTERM."""

    def __init__(self, environment: Environment) -> None:
        self.stopped = Event()
        self.started = 0.0
        self.ended = 0.0
        self.interrupted = False
        environment.events.test_stopping.add_listener(self._ending)
        environment.events.test_stop.add_listener(lambda **_: self.stopped.set())
        self._environment = environment
        for sig in (signal.SIGINT, signal.SIGTERM):
            gevent.signal_handler(sig, self._interrupt)

    def _ending(self, **_: object) -> None:
        if not self.ended:
            self.ended = time.time()

    def _interrupt(self) -> None:
        self.interrupted = True
        runner = self._environment.runner
        if runner is not None:
            gevent.spawn(runner.stop)

    def start(self) -> None:
        assert self._environment.runner is not None
        self.started = time.time()
        self._environment.runner.start_shape()


def _run_local(plan: Plan, scenario: Scenario, recorder: Recorder) -> int:
    busy = machine.busy_share()
    scenario.prepare()
    environment = _environment(plan, scenario, recorder)
    runner = environment.create_local_runner()
    run = _Run(environment)
    run.start()
    run.stopped.wait()
    runner.quit()
    scenario.finish()
    return _finish(plan, recorder, busy, run)


def _run_master(plan: Plan, scenario: Scenario, recorder: Recorder) -> int:
    busy = machine.busy_share()
    environment = _environment(plan, scenario, recorder)
    runner = environment.create_master_runner(plan.bind_host, plan.master_port)
    finals: set[str] = set()

    def on_worker_report(client_id: str, data: dict[str, Any], **_: object) -> None:
        if "chaingate" in data:
            recorder.absorb(client_id, data["chaingate"])

    def on_final(environment: Environment, msg: Message, **_: object) -> None:
        recorder.absorb(msg.node_id, msg.data)
        finals.add(msg.node_id)

    environment.events.worker_report.add_listener(on_worker_report)
    runner.register_message(FINAL, on_final)
    expected = plan.workers or plan.expect_workers
    processes = _spawn_workers(plan, runner.master_bind_port) if plan.workers else []
    try:
        deadline = time.monotonic() + WORKER_WAIT
        while len(runner.clients.ready) < expected:
            if time.monotonic() > deadline:
                print(f"error: {len(runner.clients.ready)} of {expected} workers connected")
                return 2
            if any(p.poll() is not None for p in processes):
                print("error: a worker exited before the run started (its output is above)")
                return 2
            gevent.sleep(0.1)
        workers = {client.id for client in runner.clients.ready}
        run = _Run(environment)
        run.start()
        run.stopped.wait()
        deadline = time.monotonic() + FINAL_WAIT
        while not workers <= finals and time.monotonic() < deadline:
            gevent.sleep(0.1)
        missing = workers - finals
        if missing:
            recorder.check("every worker's last report", "", False, f"missing: {sorted(missing)}")
        runner.quit()
    finally:
        _stop_workers(processes)
    return _finish(plan, recorder, busy, run)


def _run_worker(plan: Plan, scenario: Scenario, recorder: Recorder) -> int:
    scenario.prepare()
    environment = _environment(plan, scenario, recorder)
    runner = environment.create_worker_runner(plan.master_host, plan.master_port)

    def on_report(client_id: str, data: dict[str, Any], **_: object) -> None:
        data["chaingate"] = recorder.drain()

    def on_stop(**_: object) -> None:
        runner.send_message(FINAL, recorder.drain())
        gevent.spawn(leave)

    def leave() -> None:
        # A run is one-shot: once locust has told the master this worker stopped (right after
        # this event), the worker is done; it does not wait to be reused.
        gevent.sleep(WORKER_LEAVE_DELAY)
        runner.greenlet.kill(block=False)

    environment.events.report_to_master.add_listener(on_report)
    environment.events.test_stop.add_listener(on_stop)
    runner.greenlet.join()
    return 0


def _spawn_workers(plan: Plan, port: int) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "chaingate.benchsuite", *plan.argv]
    # The same arguments (the last of a repeated option wins): a worker, not a master.
    command += ["--workers", "0", "--worker", "--master-host", "127.0.0.1"]
    command += ["--master-port", str(port)]
    # Sessions of their own: a Ctrl-C reaches the master alone, which stops them in order.
    return [
        subprocess.Popen(command, env=os.environ.copy(), start_new_session=True)
        for _ in range(plan.workers)
    ]


def _stop_workers(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        try:
            process.wait(timeout=WORKER_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _finish(plan: Plan, recorder: Recorder, busy: float | None, run: _Run) -> int:
    settings = {**plan.settings(), **recorder.notes}
    if run.interrupted:
        settings["interrupted"] = "yes: stopped by a signal before the planned duration"
    data = results.build(
        recorder,
        scenario=plan.scenario,
        targets=plan.targets,
        settings=settings,
        machine=machine.describe(busy),
        started=run.started,
        stopped=run.ended or time.time(),
        checks=recorder.checks,
    )
    write_outputs(data, plan.out)
    print(summary_text(data, plan.out))
    wrong = any(t["outcomes"][outcomes.WRONG] for t in data["totals"].values())
    failed_checks = any(not c["ok"] for c in data["checks"])
    return 1 if wrong or failed_checks else 0


def write_outputs(data: dict[str, Any], out: Path) -> None:
    results.write(data, out)
    (out / "report.html").write_text(report.render(data))


def summary_text(data: dict[str, Any], out: Path) -> str:
    lines = [f"chaingate bench {data['scenario']}: {data['duration_s']:.1f} s"]
    for name, s in data["totals"].items():
        failures = ", ".join(
            f"{s['outcomes'][kind]} {kind}" for kind in outcomes.FAILURES if s["outcomes"][kind]
        )
        lat = s["latency_ms"]
        lines.append(
            f"  {name}: {s['requests']} requests, {s['rps']:.1f} answered/s, "
            f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, failures: {failures or 'none'}"
        )
    for ratio in data["ratios"]:
        lines.append(f"  {ratio['target']}/{ratio['baseline']} {ratio['label']}: {ratio['value']}")
    for check in data["checks"]:
        if not check["ok"]:
            lines.append(f"  check failed: {check['check']} {check['target']}: {check['detail']}")
    lines.append(f"report: {out / 'report.html'}")
    return "\n".join(lines)
