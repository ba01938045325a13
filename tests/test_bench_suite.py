"""``chaingate bench``: the load-testing suite against real servers, and its parts alone.

The runs are real: ``chaingate serve`` (API keys on) in front of a bootstrapped devnet anvil,
and anvil itself as a second target; ``chaingate bench`` runs as its own process, as a user
runs it (locust monkey-patches a process with gevent, so it never runs inside pytest's).  A
report's figures are checked against what the target counted itself (chaingate's ``/metrics``).
The parts without locust (histogram, recorder, answer checks, results, report, compare) are
tested in process.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks

from chaingate.benchsuite import (
    chainsample,
    command,
    compare,
    hooksig,
    outcomes,
    report,
    results,
    rpcprofile,
    rpcwire,
)
from chaingate.benchsuite.histogram import Histogram
from chaingate.benchsuite.plan import users_at
from chaingate.benchsuite.recorder import Recorder
from chaingate.benchsuite.targets import TargetError, mask, parse_targets
from chaingate.config.manifest import Manifest, dumps
from chaingate.devnet.anvil import AnvilProcess, free_port, rpc_call
from chaingate.devnet.deploy import DETERMINISTIC_DEPLOYER
from chaingate.evm.keys import load_or_create_key
from tests.serve_process import ServeProcess
from tests.test_browser import CHROMIUM, node_modules
from tests.test_dev_lifecycle import Dev

RUN_TIMEOUT = 180  # a run of a few seconds; this only catches a hang
RPC_PATH = "/v1/rpc/ethereum/devnet"
ZERO_ADDRESS = "0x" + "00" * 20


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaingate", "bench", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def counter_sum(metrics: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels``."""
    total = 0.0
    for line in metrics.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


class Counts:
    """What chaingate counted between two reads of its /metrics: HTTP requests to the RPC
    route, and JSON-RPC calls (a batch's items one each)."""

    def __init__(self, before: str, after: str) -> None:
        self.requests = counter_sum(after, "chaingate_http_requests_total", route="rpc")
        self.requests -= counter_sum(before, "chaingate_http_requests_total", route="rpc")
        self.calls = counter_sum(after, "chaingate_rpc_calls_total")
        self.calls -= counter_sum(before, "chaingate_rpc_calls_total")


@pytest.fixture(scope="module")
def served(
    devnet: tuple[AnvilProcess, Manifest], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeProcess, AnvilProcess, str]]:
    node, _ = devnet
    # Webhooks to the bench's receiver on loopback, over plain HTTP: a devnet's settings.
    hooks = '[outbound]\nallow_cidrs = ["127.0.0.1/32"]\n[webhooks]\nallow_http = true\n'
    with ServeProcess(
        tmp_path_factory.mktemp("serve"), node.url, keys=True, follow=True, observability=hooks
    ) as serve:
        serve.start()
        yield serve, node, serve.create_key(plan="enterprise")


@pytest.fixture(scope="module")
def two_target_run(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, Counts]:
    serve, node, key = served
    out = tmp_path_factory.mktemp("two-targets")
    before = serve.metrics()
    done = bench(
        "rpc",
        "--target", f"chaingate={serve.base}{RPC_PATH}",
        "--target", f"anvil={node.url}",
        "--key", key,
        "--duration", "4",
        "--users", "3",
        "--out", str(out),
    )  # fmt: skip
    counts = Counts(before, serve.metrics())
    data = json.loads((out / "results.json").read_text()) if done.returncode in (0, 1) else {}
    return done, data, out, counts


def test_rpc_two_targets_one_report_whose_figures_match_the_servers_metrics(
    two_target_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, Counts],
) -> None:
    done, data, out, counts = two_target_run
    assert done.returncode == 0, done.stdout + done.stderr
    cg, anvil = data["totals"]["chaingate"], data["totals"]["anvil"]
    # Every request chaingate counted was one the bench sent and recorded: the load's own
    # requests plus those drawing parameters and checking answers before it.
    assert cg["requests"] > 50 and anvil["requests"] > 50
    assert counts.requests == cg["requests"] + cg["setup_requests"]
    assert counts.calls == cg["calls"] + cg["setup_calls"]
    assert cg["calls"] > cg["requests"]  # batches were in the mix
    # Correct before fast: every answer right, the same on both targets.
    for summary in (cg, anvil):
        assert summary["answered"] == summary["requests"], summary["outcomes"]
    assert data["checks"] and all(check["ok"] for check in data["checks"])
    # Parameters came from the chain: the bootstrapped devnet holds transactions and logs.
    assert re.search(
        r"[1-9]\d* transactions, [1-9]\d* log emitters", data["settings"]["parameters"]
    )
    # The series adds up to the totals, second by second.
    assert sum(p["requests"] for p in data["series"]["chaingate"]) == cg["requests"]
    assert sum(data["histogram"]["counts"]["anvil"]) == anvil["answered"]
    # Ratios of the second target to the first, in the JSON and in the page.
    rps = next(r for r in data["ratios"] if r["metric"] == "rps")
    assert rps["value"] == pytest.approx(anvil["rps"] / cg["rps"], rel=1e-2)
    page = (out / "report.html").read_text()
    assert "anvil / chaingate" in page and f"{rps['value']:.3f}" in page
    assert page.count("<svg") >= 5  # throughput, failures, latency, a histogram per target
    assert "<script" not in page and not re.search(r'(src|href)="https?:', page)
    assert data["machine"]["cores"] >= 1 and "load_average_before" in data["machine"]
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0] == "section,target,name,t,metric,value"
    assert f"totals,chaingate,,,requests,{cg['requests']}" in rows
    assert "X-API-Key header" in page and data["settings"]["API key"] == "X-API-Key header"
    assert done.stdout.count(" requests, ") == 2


def test_report_draws_its_charts_in_chromium_with_nothing_fetched(
    two_target_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, Counts],
    tmp_path: Path,
) -> None:
    """The page as a person sees it: Debian's chromium driven by Playwright, as
    tests/test_browser.py does; the PNG is what the README's screenshot is made of."""
    if not Path(CHROMIUM).exists() or shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and node are part of CI (.ci/run installs them)")
        pytest.skip("needs Debian's chromium and Node.js")
    _, _, out, _ = two_target_run
    shown = screenshot(out / "report.html", tmp_path / "report.png")
    assert shown["requests"] == [(out / "report.html").as_uri()]  # no CDN, no font, no script
    charts = {chart["title"]: chart for chart in shown["charts"]}
    for title in ("Throughput (answered requests per second)", "Latency percentiles per second"):
        assert charts[title]["width"] > 300 and charts[title]["lines"] >= 2, charts[title]
    for target in ("chaingate", "anvil"):
        assert charts[f"Latency histogram: {target}"]["bars"] >= 3
    assert (tmp_path / "report.png").stat().st_size > 20_000


def screenshot(report_html: Path, png: Path, width: int = 1360, height: int = 0) -> dict[str, Any]:
    """Chromium's view of a report: its charts, what it fetched, a PNG of its top ``height``
    pixels (0: all of it).  docs/bench-report.png was taken with this."""
    script = png.parent / "report_page.mjs"
    shutil.copyfile(Path(__file__).parent / "node" / "report_page.mjs", script)
    (png.parent / "node_modules").symlink_to(node_modules())
    done = subprocess.run(
        [shutil.which("node") or "node", str(script), CHROMIUM, report_html.as_uri(), str(png),
         str(width), str(height)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_distributed_run_master_and_two_workers_counts_what_the_target_saw(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path: Path
) -> None:
    serve, _, key = served
    before = serve.metrics()
    done = bench(
        "rpc",
        "--target", f"{serve.base}{RPC_PATH}/{key}",  # the key in the URL this time
        "--duration", "4",
        "--users", "4",
        "--workers", "2",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    counts = Counts(before, serve.metrics())
    data = json.loads((tmp_path / "results.json").read_text())
    (summary,) = data["totals"].values()
    assert data["settings"]["load processes"] == "master + 2 workers"
    assert summary["requests"] > 50 and summary["answered"] == summary["requests"]
    # Each worker drew its own parameters (setup requests); the sum is what chaingate saw.
    assert summary["setup_requests"] > 0
    assert counts.requests == summary["requests"] + summary["setup_requests"]
    assert counts.calls == summary["calls"] + summary["setup_calls"]
    # The key in the URL never reaches the report.
    assert key not in (tmp_path / "report.html").read_text()
    assert key not in (tmp_path / "results.json").read_text()


def test_master_and_a_worker_started_apart_step_shape(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path: Path
) -> None:
    """--master/--worker as across machines (here both on loopback), with the step shape."""
    serve, _, key = served
    port = str(free_port())
    common = ["rpc", "--target", f"{serve.base}{RPC_PATH}", "--key", key, "--users", "4"]
    common += ["--duration", "4", "--shape", "step", "--steps", "2", "--master-port", port]
    before = serve.metrics()
    command = [sys.executable, "-m", "chaingate", "bench", *common]
    master = subprocess.Popen(
        [*command, "--master", "--master-bind", "127.0.0.1", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    worker = subprocess.Popen(
        [*command, "--worker", "--master-host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = master.communicate(timeout=RUN_TIMEOUT)
        worker.communicate(timeout=30)
    finally:
        for process in (master, worker):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert master.returncode == 0, output
    data = json.loads((tmp_path / "results.json").read_text())
    (summary,) = data["totals"].values()
    counts = Counts(before, serve.metrics())
    assert counts.requests == summary["requests"] + summary["setup_requests"]
    assert data["settings"]["shape"] == "step (2 steps)"
    assert data["settings"]["load processes"] == "master + 1 workers"


def test_refusals_and_rate_limits_are_reported_as_such_not_as_slow(
    devnet: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    # A server of its own: bad keys make chaingate throttle this address's failed logins.
    node, _ = devnet
    (tmp_path / "serve").mkdir()
    with ServeProcess(tmp_path / "serve", node.url, keys=True) as serve:
        serve.start()
        free = serve.create_key(plan="free")  # 10 requests per second
        url = f"{serve.base}{RPC_PATH}"
        # The bench draws its parameters through the first target's key: a limited one is
        # waited for (its 429s' Retry-After), not a failed setup.  30 calls: 3 seconds' worth.
        attempts: list[int] = []
        rpc = chainsample.rpc_caller(f"{url}/{free}", {}, 10.0, lambda: attempts.append(1))
        heads = [rpc("eth_blockNumber", []) for _ in range(30)]
        assert all(isinstance(h, str) and h.startswith("0x") for h in heads)
        assert len(attempts) >= 30
        time.sleep(1.1)  # the key's allowance back for the bench
        done = bench(
            "rpc",
            "--target", f"limited={url}/{free}",
            "--target", f"refused={url}/svc_test_{'x' * 43}",
            "--duration", "3",
            "--users", "2",
            "--out", str(tmp_path / "out"),
        )  # fmt: skip
    results = tmp_path / "out" / "results.json"
    assert results.exists(), f"no results: {done.stdout}{done.stderr}"
    data = json.loads(results.read_text())
    limited, refused = data["totals"]["limited"], data["totals"]["refused"]
    # A bad key is refused (401), then its address is throttled (429): never an answer.
    assert refused["outcomes"]["refused"] > 0
    assert (
        refused["outcomes"]["refused"] + refused["outcomes"]["rate_limited"]
        == (refused["requests"])
    )
    assert refused["latency_ms"]["p50"] is None  # no answer, so no latency
    assert limited["outcomes"]["ok"] > 0 and limited["outcomes"]["rate_limited"] > 0
    assert limited["outcomes"]["error"] == limited["outcomes"]["wrong"] == 0
    # The refused target failed its checks before the load: the exit code says so.
    assert done.returncode == 1, done.stdout + done.stderr
    assert any(not c["ok"] and c["target"] == "refused" for c in data["checks"])
    page = (tmp_path / "out" / "report.html").read_text()
    assert "refused" in page and "rate-limited" in page


def test_ws_subscribers_get_every_head_from_chaingate_and_anvil(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path: Path
) -> None:
    serve, node, key = served
    ws_base = serve.base.replace("http://", "ws://")
    before = serve.metrics()
    command = [sys.executable, "-m", "chaingate", "bench", "ws", "--key", key, "--users", "3"]
    command += ["--target", f"chaingate={ws_base}/v1/ws/ethereum/devnet"]
    command += ["--target", f"anvil={node.url.replace('http://', 'ws://')}"]
    command += ["--duration", "10", "--out", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Blocks once the subscribers are connected (chaingate counts its own; anvil's are
        # spawned in the same step), however long the bench took to start on a busy machine.
        deadline = time.monotonic() + RUN_TIMEOUT / 2
        while counter_sum(serve.metrics(), "chaingate_ws_subscriptions", kind="newHeads") < 3:
            assert process.poll() is None and time.monotonic() < deadline, "never subscribed"
            time.sleep(0.1)
        time.sleep(1.0)
        for _ in range(4):
            rpc_call(node.url, "evm_mine")
            time.sleep(0.4)
        output, _ = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output
    data = json.loads((tmp_path / "results.json").read_text())
    heads = {name: data["by_name"][name]["newHeads"] for name in ("chaingate", "anvil")}
    for name, summary in heads.items():
        assert summary["outcomes"]["dropped"] == summary["outcomes"]["wrong"] == 0, name
        assert summary["answered"] >= 3 * 4, (name, summary)  # 3 connections, 4 blocks
        assert data["by_name"][name]["subscribe"]["answered"] == 3
    # Every head chaingate pushed arrived, and nothing else.
    pushed = counter_sum(serve.metrics(), "chaingate_ws_pushes_total", kind="newHeads")
    pushed -= counter_sum(before, "chaingate_ws_pushes_total", kind="newHeads")
    assert pushed == heads["chaingate"]["answered"]


def test_rest_data_endpoints_with_addresses_from_the_chain(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path: Path
) -> None:
    serve, _, key = served
    before = serve.metrics()
    done = bench(
        "rest", "--target", f"chaingate={serve.base}", "--key", key,
        "--duration", "3", "--users", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    after = serve.metrics()
    data = json.loads((tmp_path / "results.json").read_text())
    summary = data["totals"]["chaingate"]
    assert summary["requests"] > 20 and summary["answered"] == summary["requests"]
    assert set(data["by_name"]["chaingate"]) == {
        "token balances", "token metadata", "nfts owned", "transfers"
    }  # fmt: skip
    # Drawing addresses (JSON-RPC), probing tokens and checking answers, then the load.
    seen = sum(
        counter_sum(after, "chaingate_http_requests_total", route=route)
        - counter_sum(before, "chaingate_http_requests_total", route=route)
        for route in ("rpc", "rest")
    )
    assert seen == summary["requests"] + summary["setup_requests"]


def test_webhooks_every_transaction_delivered_signed_as_chaingate_counted(
    served: tuple[ServeProcess, AnvilProcess, str], tmp_path: Path
) -> None:
    serve, node, key = served
    before = serve.metrics()
    done = bench(
        "webhooks", "--target", f"chaingate={serve.base}", "--key", key, "--drive", node.url,
        "--rate", "5", "--users", "3", "--duration", "4", "--grace", "5", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    delivery = data["by_name"]["chaingate"]["delivery"]
    sent = int(data["settings"]["transactions sent"].split()[0])
    # Each transfer goes to an address exactly one webhook watches: one delivery each, each
    # signature verified, none missing.
    assert sent >= 10 and delivery["answered"] == delivery["requests"] == sent, data["samples"]
    assert delivery["latency_ms"]["p50"] is not None
    delivered = counter_sum(
        serve.metrics(), "chaingate_webhook_deliveries_total", outcome="delivered"
    )
    delivered -= counter_sum(before, "chaingate_webhook_deliveries_total", outcome="delivered")
    assert delivered == sent
    # The bench deleted the webhooks it made.
    listed = httpx.get(f"{serve.base}/v1/webhooks", headers={"X-API-Key": key}, timeout=10)
    assert listed.status_code == 200 and listed.json()["total"] == 0, listed.text


def test_userops_every_operation_accepted_and_included_as_the_bundler_counted(
    devnet: tuple[AnvilProcess, Manifest], tmp_path: Path
) -> None:
    """chaingate's bundler (its own key, unsafe mode) in front of the devnet."""
    node, manifest = devnet
    (tmp_path / "manifest.json").write_bytes(dumps(manifest))
    bundler_key = load_or_create_key(tmp_path / "bundler.key")
    rpc_call(node.url, "anvil_setBalance", [bundler_key.address, hex(10**21)])
    serve = ServeProcess(tmp_path, node.url, keys=True, follow=True)
    config = serve.config.read_text().replace(
        "testnet = true\n", f'testnet = true\nmanifest = "{tmp_path}/manifest.json"\n', 1
    )
    config += f'[bundler]\nkey_file = "{tmp_path}/bundler.key"\nsafe_mode = false\n'
    serve.config.write_text(config)
    with serve:
        serve.start()
        key = serve.create_key(plan="enterprise")
        before = serve.metrics()
        done = bench(
            "userops", "--target", f"chaingate={serve.base}/v1/bundler/ethereum/devnet",
            "--key", key, "--node", node.url,
            "--factory", manifest.address("simple_account_factory_v07"),
            "--users", "3", "--duration", "4", "--out", str(tmp_path / "out"),
        )  # fmt: skip
        accepted = counter_sum(serve.metrics(), "chaingate_bundler_operations_accepted_total")
        accepted -= counter_sum(before, "chaingate_bundler_operations_accepted_total")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    sent = data["by_name"]["chaingate"]["eth_sendUserOperation"]
    receipts = data["by_name"]["chaingate"]["receipt"]
    # Every operation answered with its own hash, every one included with success.
    assert sent["requests"] >= 6 and sent["answered"] == sent["requests"] == accepted
    assert receipts["answered"] == receipts["requests"] == sent["requests"]
    assert receipts["latency_ms"]["p50"] > sent["latency_ms"]["p50"]  # inclusion takes longer
    assert all(check["ok"] for check in data["checks"])


def test_webhook_signatures_checked_as_standard_webhooks_makes_them() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    body = b'{"data": 1}'
    stamp = datetime.fromtimestamp(1_700_000_000, UTC)
    signature = standardwebhooks.Webhook(secret).sign("msg_1", stamp, body.decode())
    assert hooksig.verify(secret, "msg_1", "1700000000", body, signature)
    assert hooksig.verify(secret, "msg_1", "1700000000", body, f"v1,bm90 {signature}")
    assert not hooksig.verify(secret, "msg_1", "1700000000", body + b" ", signature)
    assert not hooksig.verify(secret, "msg_2", "1700000000", body, signature)


def test_compare_puts_two_runs_side_by_side(
    two_target_run: tuple[subprocess.CompletedProcess[str], dict[str, Any], Path, Counts],
    tmp_path: Path,
) -> None:
    _, data, out, _ = two_target_run
    other = json.loads(json.dumps(data))
    other["totals"]["chaingate"]["rps"] = data["totals"]["chaingate"]["rps"] * 2
    (tmp_path / "b.json").write_text(json.dumps(other))
    done = bench(
        "compare", str(out / "results.json"), str(tmp_path / "b.json"), "--out", str(tmp_path)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(
        row for row in done.stdout.splitlines() if "chaingate" in row and "answered/s" in row
    )
    assert line.split()[-1] == "2.000"
    assert "answered/s" in (tmp_path / "compare.html").read_text()


def test_bad_arguments_get_a_clear_error(tmp_path: Path) -> None:
    done = bench("rpc", "--target", "ftp://example", "--out", str(tmp_path))
    assert done.returncode != 0 and "expected a http/https URL" in done.stdout + done.stderr
    nobody = f"http://127.0.0.1:{free_port()}/"
    done = bench("rpc", "--target", nobody, "--duration", "1", "--out", str(tmp_path))
    assert done.returncode == 2 and "error: drawing parameters from" in done.stdout
    done = bench("compare", str(tmp_path / "missing.json"), str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "missing.json" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    # The proxy workload is bench/run.py, unchanged: its own options.
    done = bench("proxy", "--help")
    assert done.returncode == 0 and "--scenarios" in done.stdout


# Every numeric option of every workload, and the values each must refuse.
NUMERIC_OPTIONS = {
    "--duration": ("nan", "inf", "-inf", "0", "-1"),
    "--timeout": ("nan", "infinity", "0", "-0.5"),
    "--users": ("0", "-3", "nan", "1.5"),
    "--steps": ("0", "inf"),
    "--workers": ("-1", "nan"),
    "--expect-workers": ("0", "nan"),
    "--master-port": ("0", "65536", "nan"),
}
WORKLOAD_ARGS = {
    "rpc": [],
    "ws": [],
    "rest": [],
    "userops": ["--node", "http://127.0.0.1:1/", "--factory", ZERO_ADDRESS],
    "webhooks": [],
}


def refusal(*argv: str) -> str:
    """What ``chaingate bench`` (its own parser, in process: no locust) says refusing argv."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit) as exited:
        command.build_parser().parse_args(list(argv))
    assert exited.value.code == 2, argv
    return errors.getvalue()


@pytest.mark.parametrize("workload", list(WORKLOAD_ARGS))
def test_numeric_options_refuse_nan_infinity_and_non_positive_naming_the_option(
    workload: str,
) -> None:
    options = dict(NUMERIC_OPTIONS)
    if workload == "webhooks":
        options |= {"--rate": ("nan", "inf", "0", "-1"), "--grace": ("nan", "inf", "-1")}
    for option, values in options.items():
        for value in values:
            said = refusal(workload, *WORKLOAD_ARGS[workload], f"{option}={value}")
            assert f"argument {option}: " in said and repr(value) in said, said
    # The values a run takes are still taken.
    args = command.build_parser().parse_args(
        [workload, *WORKLOAD_ARGS[workload], "--duration", "0.5", "--timeout", "2"]
    )
    assert (args.duration, args.timeout) == (0.5, 2.0)


def test_a_nan_duration_is_refused_by_the_command_at_once(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/"
    started = time.monotonic()
    done = bench("rpc", "--target", nobody, "--duration", "nan", "--out", str(tmp_path / "r"))
    assert done.returncode == 2 and "argument --duration: expected a finite number" in done.stderr
    assert time.monotonic() - started < RUN_TIMEOUT / 2 and not (tmp_path / "r").exists()


def test_an_unwritable_out_is_refused_before_any_load(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    nobody = f"http://127.0.0.1:{free_port()}/"  # never asked: --out is checked first
    done = bench("rpc", "--target", nobody, "--duration", "1", "--out", str(blocker / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: --out {blocker / 'out'}: cannot write the report there" in done.stdout
    assert "drawing parameters" not in done.stdout and "Traceback" not in done.stderr


def test_compare_of_a_file_that_is_not_results_json_names_it(tmp_path: Path) -> None:
    report_page, binary = tmp_path / "report.html", tmp_path / "chart.png"
    report_page.write_text("<!doctype html><p>a report</p>\n")
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    other = tmp_path / "other.json"
    other.write_text('{"format": "something-else/2"}')
    expected = "expected a chaingate bench results.json (format chaingate-bench/1)"
    for path, why in (
        (report_page, "not JSON (Expecting value at line 1 column 1)"),
        (binary, "not text"),
        (other, "JSON, but not of this format"),
    ):
        done = bench("compare", str(path), str(path))
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout.strip() == f"error: {path}: {why}: {expected}"


def test_rpc_against_chaingate_dev_answers_every_call(tmp_path: Path) -> None:
    """``chaingate dev`` as a user has it after a CREATE2 deployment (what forge does through
    the deterministic deployer) and some blocks: no token moved in the blocks the parameters
    are drawn from, so eth_call goes to accounts — never to the deployer, whose code runs out of
    gas on empty calldata (the first start of a new devnet drew them from such blocks too)."""
    run = Dev(tmp_path, tmp_path / "data")
    try:
        test_key, _ = run.up()
        rpc_call(run.anvil_url, "anvil_mine", ["0x28"])  # the demo's history out of the window
        sender = rpc_call(run.anvil_url, "eth_accounts", [])[0]
        deploy = {"from": sender, "to": DETERMINISTIC_DEPLOYER, "data": "0x" + "00" * 33}
        rpc_call(run.anvil_url, "eth_sendTransaction", [deploy])  # salt 0, empty init code
        rpc_call(run.anvil_url, "anvil_mine", ["0x2"])  # the profile's lag: 2 blocks
        out = tmp_path / "out"
        done = bench(
            "rpc", "--target", f"dev={run.url}{RPC_PATH}", "--key", test_key,
            "--duration", "2", "--users", "2", "--out", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads((out / "results.json").read_text())
        checks = {c["check"]: c for c in data["checks"]}
        assert checks["eth_call: answered alike"]["ok"], checks
        assert all(c["ok"] for c in checks.values()), checks
        assert "0 tokens answering balanceOf" in data["settings"]["parameters"]
        calls = data["by_name"]["dev"]["eth_call"]
        assert calls["requests"] > 0 and calls["answered"] == calls["requests"], calls
    finally:
        run.kill()


def test_serve_never_imports_locust() -> None:
    assert "gevent" not in sys.modules  # nor does pytest's process (trio's tests run here)
    probe = "import sys, chaingate.cli; print('locust' in sys.modules or 'gevent' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# The parts without locust.


def test_histogram_percentiles_and_merge_by_addition() -> None:
    a, b = Histogram(), Histogram()
    for ms in range(1, 101):
        (a if ms % 2 else b).add(float(ms))
    a.merge(Histogram.from_dict(json.loads(json.dumps(b.to_dict()))))
    assert a.total == 100 and a.max_ms == 100.0
    assert a.percentile(0.5) == pytest.approx(50, rel=0.02)
    assert a.percentile(0.99) == pytest.approx(99, rel=0.02)
    assert sum(a.bins(results.HISTOGRAM_EDGES_MS)) == 100
    assert Histogram().percentile(0.5) is None


def test_recorder_drain_and_absorb_keep_every_request_once() -> None:
    clock = iter(range(1000, 2000))
    worker, master = Recorder(clock=lambda: next(clock)), Recorder()
    worker.record("t", "eth_call", outcomes.OK, 2.0)
    worker.setup_request("t", calls=3)
    master.absorb("w1", worker.drain())
    worker.record("t", "eth_call", outcomes.RATE_LIMITED, 1.0, detail="429")
    master.absorb("w1", worker.drain())  # setup counts are resent, taken once
    total = master.targets["t"].total()
    assert total.requests == 2 and total.outcomes == {"ok": 1, "rate_limited": 1}
    assert total.latency.total == 1  # a refusal's time is not a latency
    assert master.setup("t") == (1, 3)
    assert master.targets["t"].samples["rate_limited"] == ["eth_call: 429"]


def test_answers_are_judged_ids_errors_and_agreement_across_targets() -> None:
    oracle = rpcwire.Oracle()
    call = rpcwire.Call("eth_getBalance", ["0xab", "0x1"], comparable=True)
    _, ids = rpcwire.body([call], batch=False)

    def answer(**fields: Any) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": ids[0], **fields}).encode()

    assert rpcwire.judge(answer(result="0x5"), [call], ids, False, oracle, "a")[0] == "ok"
    outcome, detail = rpcwire.judge(answer(result="0x6"), [call], ids, False, oracle, "b")
    assert outcome == "wrong" and "differs from a" in detail
    wrong_id = json.dumps({"jsonrpc": "2.0", "id": 0, "result": "0x5"}).encode()
    assert rpcwire.judge(wrong_id, [call], ids, False, oracle, "a")[0] == "wrong"
    limited = answer(error={"code": -32005, "message": "limit"})
    assert rpcwire.judge(limited, [call], ids, False, oracle, "a")[0] == "rate_limited"
    refused = answer(error={"code": -32002, "message": "key"})
    assert rpcwire.judge(refused, [call], ids, False, oracle, "a")[0] == "refused"
    # A batch answered out of order is right; one with an id missing is not.
    calls = [call, rpcwire.Call("eth_chainId", [], comparable=True)]
    _, batch_ids = rpcwire.body(calls, batch=True)
    items = [{"jsonrpc": "2.0", "id": batch_ids[1], "result": "0x7a69"},
             {"jsonrpc": "2.0", "id": batch_ids[0], "result": "0x5"}]  # fmt: skip
    assert rpcwire.judge(json.dumps(items).encode(), calls, batch_ids, True, oracle, "a")[0] == "ok"
    short = json.dumps(items[:1]).encode()
    assert rpcwire.judge(short, calls, batch_ids, True, oracle, "a")[0] == "wrong"
    # Blocks compare by hash: a provider's extra fields are not a difference.
    block = rpcwire.Call("eth_getBlockByNumber", ["0x1", False], comparable=True)
    assert oracle.judge(block, {"hash": "0x1", "size": "0x2"}, "a") is None
    assert oracle.judge(block, {"hash": "0x1", "totalDifficulty": "0x0"}, "b") is None


def test_targets_are_named_and_keys_in_urls_masked() -> None:
    key = "svc_test_" + "k" * 43
    a, b, c = parse_targets(
        [
            f"gw=http://h:8000{RPC_PATH}/{key}",
            "https://x.example/v2?apikey=a",
            "https://x.example/v3",
        ]
    )
    assert (a.name, b.name, c.name) == ("gw", "x.example#2", "x.example#3")
    assert key not in a.shown and a.shown.endswith("/svc_…")
    assert b.shown == "https://x.example/v2?apikey=…"
    assert mask("http://user:pw@h/") == "http://h/"
    with pytest.raises(TargetError):
        parse_targets(["bad name!=http://h/"])
    with pytest.raises(TargetError):
        parse_targets([])


def test_profiles_load_and_bad_ones_are_refused(tmp_path: Path) -> None:
    profile = rpcprofile.load("rpc")
    assert profile.mix["batch"] > 0 and profile.batch_size == 10
    bad = tmp_path / "bad.toml"
    bad.write_text("[mix]\neth_sendRawTransaction = 1\n")
    with pytest.raises(rpcprofile.ProfileError, match="unknown"):
        rpcprofile.load(str(bad))
    with pytest.raises(rpcprofile.ProfileError, match="no shipped profile"):
        rpcprofile.load("nope")


def test_load_shapes() -> None:
    assert [users_at("step", t, 40, 8, 4) for t in (0, 10, 20, 39)] == [2, 4, 6, 8]
    assert [users_at("spike", t, 10, 10, 4) for t in (0, 5, 9)] == [2, 10, 2]
    assert users_at("steady", 3, 10, 7, 4) == 7


def test_report_and_compare_of_a_run_without_answers() -> None:
    recorder = Recorder()
    recorder.record("a", "eth_call", outcomes.ERROR, 1.0, detail="reset")
    data = results.build(
        recorder, scenario="rpc", targets=parse_targets(["a=http://h/"]), settings={},
        machine={"host": "h", "cores": 2, "cpu": "c", "system": "s", "python": "3",
                 "load_average_before": "0", "busy_before": None},
        started=time.time() - 2, stopped=time.time(), checks=[],
    )  # fmt: skip
    page = report.render(data)
    assert "1 errors" in page and "reset" in page
    assert compare.rows(data, data)[0][:2] == ["a", "answered/s"]
