"""``chaingate bench SUBCOMMAND``: the arguments, and which workload runs.

Parsing and ``compare`` need no locust; a workload imports it (through ``engine``) only once its
arguments are known to be good.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaingate.benchsuite import compare, plan, results
from chaingate.benchsuite.numbers import (
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from chaingate.benchsuite.targets import TargetError, parse_targets

KEY_ENV = "CHAINGATE_BENCH_KEY"
REPO_BENCH = Path(__file__).resolve().parents[3] / "bench"
# Workloads still run by a script of bench/ against a devnet it starts itself.
SCRIPTS = {
    "proxy": ("run.py", "raw proxy throughput with wrk: chaingate, nginx and the node compared"),
    "alto": ("bundler.py", "chaingate's bundler against Alto on a devnet of its own"),
}


def _common(parser: argparse.ArgumentParser, default_users: int) -> None:
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="an endpoint to load (repeat for side by side); the first is the ratios' baseline",
    )
    parser.add_argument(
        "--key", help=f"API key sent as X-API-Key to every target (default: ${KEY_ENV})"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=30.0, help="seconds of load (30)"
    )
    parser.add_argument(
        "--users",
        type=positive_int,
        default=default_users,
        help=f"users per target ({default_users})",
    )
    parser.add_argument("--shape", choices=plan.SHAPES, default="steady")
    parser.add_argument("--steps", type=positive_int, default=4, help="steps of --shape step (4)")
    parser.add_argument(
        "--timeout", type=positive_float, default=10.0, help="per request, seconds (10)"
    )
    parser.add_argument("--out", type=Path, help="report directory (bench-results/<name>-<time>)")
    parser.add_argument(
        "--workers",
        type=non_negative_int,
        default=0,
        help="local worker processes to run the users (0: none)",
    )
    parser.add_argument(
        "--master", action="store_true", help="run as a master for workers on other machines"
    )
    parser.add_argument("--expect-workers", type=positive_int, default=1, help="--master: how many")
    parser.add_argument("--master-bind", default="*", help="--master: address to listen on")
    parser.add_argument("--master-port", type=port, default=5557)
    parser.add_argument(
        "--worker", action="store_true", help="run users for the master at --master-host"
    )
    parser.add_argument("--master-host", default="127.0.0.1")
    parser.add_argument("--verbose", action="store_true", help="locust's own log lines too")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chaingate bench",
        description="Load tests against any endpoint(s), side by side: HTML report, JSON, CSV.",
    )
    commands = parser.add_subparsers(dest="workload", required=True)
    rpc = commands.add_parser("rpc", help="a JSON-RPC read mix drawn from the chain")
    _common(rpc, default_users=10)
    rpc.add_argument(
        "--profile",
        default="rpc",
        help="shipped profile name (rpc; solana, for a Solana network) or TOML file (default: rpc)",
    )
    ws = commands.add_parser("ws", help="WebSocket subscribers: delivery delay and drops")
    _common(ws, default_users=20)
    ws.add_argument(
        "--subscribe", choices=("newHeads", "logs", "slotSubscribe"), default="newHeads"
    )
    rest = commands.add_parser("rest", help="the data endpoints with addresses from the chain")
    _common(rest, default_users=10)
    rest.add_argument("--chain", default="ethereum-devnet", help="dataset (ethereum-devnet)")
    rest.add_argument(
        "--rpc", help="JSON-RPC URL to draw addresses from (default: the first target's)"
    )
    ops = commands.add_parser(
        "userops", help="ERC-4337 operations to bundlers: accept rate, answer, receipt time"
    )
    _common(ops, default_users=4)
    ops.add_argument("--node", required=True, help="the chain's JSON-RPC (a devnet's anvil)")
    ops.add_argument("--factory", required=True, help="the SimpleAccountFactory's address")
    ops.add_argument("--entry-point-version", choices=("0.6", "0.7"), default="0.7")
    ops.add_argument("--entry-point", help="default: the version's canonical address")
    hooks = commands.add_parser(
        "webhooks", help="signed webhook deliveries: latency from the block, drops, signatures"
    )
    _common(hooks, default_users=10)
    hooks.add_argument("--chain", default="ethereum-devnet", help="dataset (ethereum-devnet)")
    hooks.add_argument(
        "--drive", help="a devnet node's JSON-RPC URL: send transfers between its accounts"
    )
    hooks.add_argument(
        "--rate", type=positive_float, default=5.0, help="--drive: transactions/s (5)"
    )
    hooks.add_argument(
        "--grace", type=non_negative_float, default=10.0, help="seconds to await stragglers"
    )
    hooks.add_argument("--receiver", default="127.0.0.1:0", help="HOST:PORT the receiver binds")
    hooks.add_argument("--receiver-url", help="URL the targets post to (default: the bound one)")
    for name, (script, text) in SCRIPTS.items():
        wrapped = commands.add_parser(
            name, help=f"{text} (bench/{script}; its own options follow)", add_help=False
        )
        wrapped.add_argument("script_args", nargs=argparse.REMAINDER)
    comparison = commands.add_parser("compare", help="two runs' results.json side by side")
    comparison.add_argument("a", type=Path)
    comparison.add_argument("b", type=Path)
    comparison.add_argument("--out", type=Path, help="also write compare.html there")
    return parser


def _plan(args: argparse.Namespace, argv: list[str], options: dict[str, Any]) -> plan.Plan:
    if args.workers and (args.master or args.worker):
        raise plan.BenchError("--workers N runs its own workers: not with --master/--worker")
    try:
        schemes = ("ws", "wss") if args.workload == "ws" else ("http", "https")
        targets = parse_targets(args.target, schemes)
    except TargetError as exc:
        raise plan.BenchError(str(exc)) from None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    mode = "worker" if args.worker else "master" if args.master else "local"
    out = args.out or Path("bench-results") / f"{args.workload}-{stamp}"
    if mode != "worker":  # a worker writes nothing: its master does
        try:
            results.check_writable(out)
        except OSError as exc:
            raise plan.BenchError(f"--out {out}: cannot write the report there ({exc})") from None
    return plan.Plan(
        scenario=args.workload,
        targets=targets,
        users=args.users,
        duration=args.duration,
        shape=args.shape,
        steps=args.steps,
        key=args.key or os.environ.get(KEY_ENV) or None,
        timeout=args.timeout,
        out=out,
        mode=mode,
        workers=args.workers,
        expect_workers=args.expect_workers,
        master_host=args.master_host,
        master_port=args.master_port,
        bind_host=args.master_bind,
        argv=argv,
        options=options,
    )


def _run_script(script: str, script_args: list[str]) -> int:
    path = REPO_BENCH / script
    if not path.exists():
        print(f"error: {path} not found: this workload runs from a source checkout of chaingate")
        return 2
    os.execv(sys.executable, [sys.executable, str(path), *script_args])  # noqa: S606


def _compare(args: argparse.Namespace) -> int:
    try:
        a, b = results.load(args.a), results.load(args.b)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    names = (str(args.a), str(args.b))
    print(compare.text(a, b, names))
    if args.out:
        print(f"report: {compare.write(a, b, names, args.out)}")
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The workload's own settings, as the report's header shows them."""
    if args.workload == "rpc":
        return {"profile": args.profile}
    if args.workload == "ws":
        return {"subscribe": args.subscribe}
    if args.workload == "rest":
        return {"chain": args.chain, "rpc": args.rpc or "the first target's"}
    if args.workload == "userops":
        return {
            "node": args.node,
            "factory": args.factory,
            "version": args.entry_point_version,
            "entry_point": args.entry_point or "",
        }
    return {
        "chain": args.chain,
        "drive": args.drive or "none: the chain's own traffic",
        "rate": args.rate,
        "grace": args.grace,
        "receiver": args.receiver,
        "receiver_url": args.receiver_url or "",
    }


def _scenario_factory(workload: str) -> Callable[..., Any]:
    # Each import brings locust in (gevent patches the process): only once arguments are good.
    if workload == "rpc":
        from chaingate.benchsuite.scenarios import rpc

        return rpc.scenario
    if workload == "ws":
        from chaingate.benchsuite.scenarios import ws

        return ws.scenario
    if workload == "userops":
        from chaingate.benchsuite.scenarios import userops

        return userops.scenario
    if workload == "webhooks":
        from chaingate.benchsuite.scenarios import webhooks

        return webhooks.scenario
    from chaingate.benchsuite.scenarios import rest

    return rest.scenario


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SCRIPTS:  # every argument is the script's, --help too
        return _run_script(SCRIPTS[argv[0]][0], argv[1:])
    args = build_parser().parse_args(argv)
    if args.workload == "compare":
        return _compare(args)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        run_plan = _plan(args, argv, _options(args))
        make_scenario = _scenario_factory(args.workload)
        from chaingate.benchsuite import engine  # imports locust: gevent patches this process

        return engine.run(run_plan, make_scenario)
    except plan.BenchError as exc:
        print(f"error: {exc}")
        return 2
    except Exception as exc:  # a clear line, not a traceback, for a bad target
        if args.verbose:
            raise
        print(f"error: {type(exc).__name__}: {exc}")
        return 2
