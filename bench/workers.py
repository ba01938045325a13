"""chaingate serve --workers 2 against 1: proxied and cached RPC paths, with the CPU split.

    python bench/workers.py [--duration 10] [--rounds 3] [--connections 256] [--threads 2]
                            [--pipeline N] [--out PATH]

One anvil, one PostgreSQL schema (fresh, dropped at the end), Redis for the shared limits, API
keys on (one key, sent by every request): the configuration ``--workers N`` needs.  Both
``chaingate serve`` process trees (1 worker, 2 workers) run at once and each scenario is
driven by wrk against them in turns (1, 2, 1, 2...; the report takes the median of
``--rounds`` turns): req/s and latency from wrk, CPU seconds of every process from /proc
(chaingate's workers and parent, anvil, wrk), so the report shows where the 2 cores went.
The load generator and the node share the machine with chaingate: read the ratios, and the
CPU split beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import psycopg  # noqa: E402

from benchkit import evm  # noqa: E402
from benchkit.wrkload import lua_script, parse_result  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, free_port  # noqa: E402

PG_URL = os.environ.get("CHAINGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CHAINGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TICKS = os.sysconf("SC_CLK_TCK")


def scenarios(contract: str) -> dict[str, bytes]:
    def call(method: str, params: list[object]) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()

    return {
        "block (proxied, coalesced)": call("eth_blockNumber", []),
        "chainid (cached)": call("eth_chainId", []),
        "call (proxied eth_call)": call("eth_call", [{"to": contract, "data": "0x"}, "latest"]),
    }


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


def tree(pid: int) -> list[int]:
    found = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return found
    for child in children:
        found += tree(int(child))
    return found


def config_text(port: int, anvil_url: str, data_dir: Path, store_url: str, workers: int) -> str:
    return (
        f'data_dir = "{data_dir}"\n'
        f'[server]\nhost = "127.0.0.1"\nport = {port}\nworkers = {workers}\nshutdown_grace = 2.0\n'
        "[observability]\naccess_log = false\n"
        f'[store]\nurl = "{store_url}"\n'
        f'[auth]\nredis_url = "{REDIS_URL}"\n'
        "[chains.ethereum.devnet]\nchain_id = 31337\ntestnet = true\n"
        "[chains.ethereum.devnet.follower]\nenabled = false\n"
        f'[[chains.ethereum.devnet.upstreams]]\nname = "anvil"\nurl = "{anvil_url}"\n'
    )


def wait_ready(url: str, process: subprocess.Popen[bytes], workers: int) -> None:
    deadline = time.monotonic() + 60
    seen: set[int] = set()
    while len(seen) < workers:
        if process.poll() is not None:
            raise SystemExit(f"chaingate serve exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("chaingate serve did not start")
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=2) as answer:
                seen.add(json.loads(answer.read())["worker"])
        except OSError:
            time.sleep(0.2)


def run_wrk(
    url: str, body: bytes, key: str, opts: argparse.Namespace, workdir: Path
) -> dict[str, float]:
    script = workdir / f"load-{secrets.token_hex(4)}.lua"
    script.write_text(lua_script(body, None, (("X-API-Key", key),), pipeline=opts.pipeline))
    argv = [
        "wrk", f"-t{opts.threads}", f"-c{opts.connections}", f"-d{opts.duration}s",
        "--timeout", "5s", "-s", str(script), url,
    ]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wrk_cpu = 0.0
    while process.poll() is None:
        wrk_cpu = max(wrk_cpu, cpu_seconds([process.pid]))
        time.sleep(0.2)
    assert process.stdout is not None
    result = parse_result(process.stdout.read().decode())
    return {
        "rps": result.rps,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "errors": result.errors,
        "wrk_cpu_s": wrk_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pipeline",
        type=int,
        default=1,
        help="requests wrk writes at once per connection (less of its CPU per request)",
    )
    parser.add_argument("--out", default="")
    opts = parser.parse_args()
    rows: list[dict[str, Any]] = []
    schema = f"cg_bench_{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as tmp, AnvilProcess() as anvil:
        workdir = Path(tmp)
        contract = evm.deploy(anvil.url).address
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        store_url = f"{PG_URL}?options=-c%20search_path%3D{schema}"
        pepper = secrets.token_hex(32)
        env = {**os.environ, "CHAINGATE_AUTH__PEPPER": pepper}
        servers: dict[int, tuple[subprocess.Popen[bytes], str, str]] = {}
        try:
            # Both process trees up at once, measured in turns (1, 2, 1, 2, ...): the machine's
            # other load drifts, and each ratio compares runs minutes apart at most.
            for workers in (1, 2):
                port = free_port()
                config = workdir / f"w{workers}.toml"
                config.write_text(config_text(port, anvil.url, workdir, store_url, workers))
                chaingate = [sys.executable, "-m", "chaingate"]
                made = subprocess.run(
                    [*chaingate, "keys", "--config", str(config), "create", "--email",
                     f"bench{workers}@workers", "--plan", "enterprise", "--env", "test"],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                key = next(
                    w.strip() for w in made.stdout.splitlines() if w.strip().startswith("svc_")
                )
                server = subprocess.Popen(
                    [*chaingate, "serve", "--config", str(config)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(workdir / f"w{workers}.log", "wb"),  # noqa: SIM115
                )
                url = f"http://127.0.0.1:{port}"
                servers[workers] = (server, f"{url}/v1/rpc/ethereum/devnet", key)
                wait_ready(url, server, workers)
            time.sleep(1.0)
            for turn in range(opts.rounds):
                for name, body in scenarios(contract).items():
                    for workers, (server, rpc, key) in servers.items():
                        warm = argparse.Namespace(**{**vars(opts), "duration": 1})
                        run_wrk(rpc, body, key, warm, workdir)
                        before = (cpu_seconds(tree(server.pid)), cpu_seconds([anvil.pid or 0]))
                        started = time.monotonic()
                        row: dict[str, Any] = dict(run_wrk(rpc, body, key, opts, workdir))
                        if row["errors"]:
                            print(f"!! {row['errors']} errors", flush=True)
                        wall = time.monotonic() - started
                        row["chaingate_cpu"] = (cpu_seconds(tree(server.pid)) - before[0]) / wall
                        row["anvil_cpu"] = (cpu_seconds([anvil.pid or 0]) - before[1]) / wall
                        row["wrk_cpu"] = row.pop("wrk_cpu_s") / wall
                        row.update(scenario=name, workers=workers, turn=turn)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            for server, _, _ in servers.values():
                server.send_signal(signal.SIGTERM)
            for server, _, _ in servers.values():
                server.wait(timeout=30)
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    lines = [
        f"wrk -t{opts.threads} -c{opts.connections}, {opts.duration} s x {opts.rounds} turns,"
        f" pipeline depth {opts.pipeline}",
        "",
        "| scenario | workers | req/s (median of turns) | ratio | p99 ms | errors"
        " | CPU chaingate | µs CPU/request | anvil | wrk |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def median(scenario: str, workers: int, field: str) -> float:
        values = sorted(
            float(r[field]) for r in rows if r["scenario"] == scenario and r["workers"] == workers
        )
        return values[len(values) // 2]

    for name in scenarios("0x"):
        one = median(name, 1, "rps")
        for workers in (1, 2):
            rps, cpu = median(name, workers, "rps"), median(name, workers, "chaingate_cpu")
            errors = sum(
                int(r["errors"]) for r in rows if r["scenario"] == name and r["workers"] == workers
            )
            lines.append(
                f"| {name} | {workers} | {rps:,.0f} | {rps / one:.2f}x |"
                f" {median(name, workers, 'p99_ms'):.2f} | {errors} | {cpu:.2f} |"
                f" {cpu / rps * 1e6:.1f} | {median(name, workers, 'anvil_cpu'):.2f} |"
                f" {median(name, workers, 'wrk_cpu'):.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
