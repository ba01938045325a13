"""Where chaingate's CPU goes per ERC-4337 operation, measured so that load does not matter.

    python bench/bundler_profile.py [--ops 200] [--warmup 100] [--versions 0.7,0.8]
                                    [--deploy] [--unsafe] [--tool cprofile|callgrind]
                                    [--concurrency 32] [--top 40] [--out DIR]

bench/bundler.py's setup (anvil bootstrapped as the devnet, one ``chaingate serve`` in safe
mode, follower polling every 50 ms, the same SimpleAccount operations of distinct senders)
and its load: per EntryPoint version a warm-up (sent, receipts awaited, unmeasured), then
``--ops`` operations at ``--concurrency`` (the "send" window), then every receipt awaited (the
"receipts" window: each read once, in order, waiting at the first not there yet, so the client's
polling costs about one request per operation however long bundling takes) — admission,
bundling, the follower's receipts: what one operation costs the process, end to end:

* ``cprofile`` — the serving process runs under ``benchkit/profshim.py`` (cProfile with the
  thread's CPU clock, main thread, switched on and off by signals around the load): Python
  calls per operation (independent of load) and CPU µs per operation by function (own and
  inclusive; the profiler inflates them ~2-3x, the shares are the point).
* ``callgrind`` — the serving process runs under ``valgrind --tool=callgrind
  --instr-atstart=no``, instrumentation switched on around the load with
  ``callgrind_control``: instructions per operation, every thread, independent of load.  The
  process's timers (the follower's polls, the bundling loop) run by the wall clock while
  callgrind slows it ~50x, so an idle window of the same length is measured after the load
  and subtracted.

Writes the raw profiles to ``--out`` (default a temporary directory) and prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from benchkit import bundlerload, procs  # noqa: E402
from benchkit.bundlerops import TAGS, BuiltOp, build_ops  # noqa: E402
from bundler import (  # noqa: E402
    RECEIPT_TIMEOUT,
    Target,
    _versions,
    configure_chaingate,
    fund,
    give_record,
)
from chaingate.config.manifest import dumps  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess, rpc_call  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet  # noqa: E402
from chaingate.evm.keys import PrivateKey, load_or_create_key  # noqa: E402


def say(text: str) -> None:
    print(text, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--versions", type=_versions, default=("0.7", "0.8"))
    parser.add_argument("--deploy", action="store_true")
    parser.add_argument("--unsafe", action="store_true", help="chaingate in unsafe mode")
    parser.add_argument("--tool", choices=("cprofile", "callgrind"), default="cprofile")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


class Profiled:
    """The serving process under a profiler, switched on and off around a load."""

    def __init__(self, tool: str, out: Path, server: procs.ChaingateServer) -> None:
        self.tool, self.out, self.server = tool, out, server
        python = sys.executable
        base = [*procs.chaingate_command(), "serve", "--config", str(server.config_path)]
        if tool == "cprofile":
            argv = [python, "-m", "benchkit.profshim", str(out / "current.prof"), "--", *base[1:]]
            server._env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(BENCH_DIR), server._env.get("PYTHONPATH")])
            )
        else:
            argv = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}/callgrind.%p",
                python,
                *base,
            ]
        self.argv = argv
        self.server.process = procs.ManagedProcess(
            "chaingate", argv, out / "chaingate.log", server._env
        )

    @property
    def pid(self) -> int:
        pid = self.server.process.pid
        assert pid is not None
        return pid

    def on(self) -> None:
        if self.tool == "cprofile":
            os.kill(self.pid, signal.SIGUSR1)
        else:
            subprocess.run(
                ["callgrind_control", "-z", str(self.pid)], check=True, capture_output=True
            )
            subprocess.run(
                ["callgrind_control", "-i", "on", str(self.pid)], check=True, capture_output=True
            )

    def off(self, name: str) -> Path:
        if self.tool == "cprofile":
            os.kill(self.pid, signal.SIGUSR2)
            written = self.out / "current.prof"
            deadline = time.monotonic() + 60
            while not written.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the profile was not written")
                time.sleep(0.1)
            time.sleep(0.5)
            final = self.out / f"{name}.prof"
            written.rename(final)
            return final
        subprocess.run(
            ["callgrind_control", "-i", "off", str(self.pid)], check=True, capture_output=True
        )
        subprocess.run(
            ["callgrind_control", "-d", name, str(self.pid)], check=True, capture_output=True
        )
        dumps = sorted(self.out.glob(f"callgrind.{self.pid}.*"), key=lambda p: p.stat().st_mtime)
        final = self.out / f"{name}.callgrind"
        dumps[-1].rename(final)
        return final


_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)


def instructions(path: Path) -> int:
    found = _TOTALS.findall(path.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def cprofile_summary(path: Path, ops: int, top: int) -> list[str]:
    stats = pstats.Stats(str(path))
    rows = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in rows.values())
    calls = sum(nc for (_cc, nc, _tt, _ct, _callers) in rows.values())
    lines = [
        f"main thread CPU under cProfile: {total / ops * 1e6:.0f} µs/op; "
        f"Python/C calls: {calls / ops:.0f}/op"
    ]

    def name(key: tuple[str, int, str]) -> str:
        file, line, func = key
        short = file.split("/src/")[-1].split("site-packages/")[-1]
        return f"{short}:{line}({func})" if line else func

    lines.append(f"\nby own time (top {top}): µs/op | calls/op | function")
    for key, (_cc, nc, tt, _ct, _c) in sorted(rows.items(), key=lambda r: -r[1][2])[:top]:
        lines.append(f"{tt / ops * 1e6:8.1f} | {nc / ops:8.2f} | {name(key)}")
    lines.append(f"\nby inclusive time, chaingate's (top {top}): µs/op | calls/op | function")
    ours = [(k, v) for k, v in rows.items() if "chaingate/" in k[0]]
    for key, (_cc, nc, _tt, ct, _c) in sorted(ours, key=lambda r: -r[1][3])[:top]:
        lines.append(f"{ct / ops * 1e6:8.1f} | {nc / ops:8.2f} | {name(key)}")
    return lines


def send(target: Target, ops: list[BuiltOp], entry_point: str, concurrency: int) -> list[str]:
    sent = bundlerload.send_all(target.url, target.headers, ops, entry_point, concurrency)
    if sent.errors:
        raise RuntimeError(f"refused: {dict(sent.errors)}")
    return [s.op.hash for s in sent.accepted]


def await_receipts(target: Target, hashes: list[str]) -> int:
    """Every receipt read once, in order, waiting (unpolled, 0.25 s) at the first not there
    yet: about one ``eth_getUserOperationReceipt`` per operation however long bundling takes
    (a window's cost is then the operations', not the client's polling).  The polls made."""
    conn = bundlerload.Connection(target.url, target.headers)
    deadline = time.monotonic() + RECEIPT_TIMEOUT * 10
    polls = 0
    try:
        for h in hashes:
            while True:
                polls += 1
                reply = conn.call("eth_getUserOperationReceipt", [h])
                if isinstance(reply.get("result"), dict):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no receipt for {h}: {reply}")
                time.sleep(0.25)
    finally:
        conn.close()
    return polls


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    out = opts.out or Path(tempfile.mkdtemp(prefix="chaingate-bundler-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        anvil = AnvilProcess()
        stack.callback(anvil.stop)
        anvil.start()
        manifest = bootstrap_devnet(
            anvil.url, paymaster_signer=PrivateKey.generate().address, announce=say
        )
        manifest_path = out / "devnet-manifest.json"
        manifest_path.write_bytes(dumps(manifest))
        chain_id = int(str(rpc_call(anvil.url, "eth_chainId")), 16)
        owner = PrivateKey.generate()
        count = 1 + opts.warmup + opts.ops
        ops = {
            v: build_ops(
                anvil.url,
                manifest,
                v,
                owner,
                [secrets.randbits(128) for _ in range(count)],
                deploy=opts.deploy,
                chain_id=chain_id,
            )
            for v in opts.versions
        }
        key_file = out / "bundler.key"
        fund(anvil.url, load_or_create_key(key_file).address)
        server = procs.ChaingateServer(
            out, "chaingate", anvil.url, access_log=True, coalesce=True, auth=None
        )
        configure_chaingate(server, manifest_path, key_file, safe=not opts.unsafe)
        profiled = Profiled(opts.tool, out, server)
        stack.callback(server.stop)
        server.start(timeout=600.0 if opts.tool == "callgrind" else 60.0)
        target = Target(
            "chaingate",
            f"{server.base}/v1/bundler/ethereum/devnet",
            server.process.pid,
            contextlib.ExitStack(),
        )
        for version in opts.versions:
            entry_point = manifest.address(f"entry_point_{TAGS[version]}")
            if opts.deploy:
                give_record(
                    target, manifest.address(f"simple_account_factory_{TAGS[version]}"), entry_point
                )
            batch = ops[version]
            await_receipts(target, send(target, batch[: 1 + opts.warmup], entry_point, 8))  # warm
            say(f"v{version}: warm; measuring {opts.ops} operations")
            load = batch[1 + opts.warmup :]
            windows: list[tuple[str, Path, float]] = []
            started = time.monotonic()
            profiled.on()
            hashes = send(target, load, entry_point, opts.concurrency)
            windows.append(("send", profiled.off(f"v{version}-send"), time.monotonic() - started))
            started = time.monotonic()
            profiled.on()
            polls = await_receipts(target, hashes)
            say(f"v{version}: {polls} receipt polls for {len(hashes)} operations")
            windows.append(
                ("receipts", profiled.off(f"v{version}-receipts"), time.monotonic() - started)
            )
            for window, path, seconds in windows:
                say(f"\n## v{version} {window}: {len(hashes)} operations, {seconds:.1f} s ({path})")
                if opts.tool == "cprofile":
                    say("\n".join(cprofile_summary(path, len(hashes), opts.top)))
                    continue
                loaded = instructions(path)
                profiled.on()
                time.sleep(seconds)
                idle = instructions(profiled.off(f"v{version}-{window}-idle"))
                say(
                    f"instructions {loaded:,} loaded, {idle:,} idle for as long; per operation "
                    f"{(loaded - idle) / len(hashes):,.0f} ({loaded / len(hashes):,.0f} without "
                    "the idle subtracted)"
                )
    say(f"profiles in {out}")
    shutil.rmtree(out / "chaingate-data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
