"""The webhook delivery benchmark runs end to end (``bench/webhooks.py --smoke``).

20 webhooks of 10 watched addresses, 3 s loads: proves the harness (anvil mining airdrop
blocks on demand, the receiver in its own process, a real chaingate process with the follower
and the webhook service, webhooks created through the REST API, wrk's direct POSTs, the
report) and that every event the chain called for arrived, at its webhook's URL, signed.
Figures are checked for form, never against the targets: the real ones come from a full run,
reported by hand.  Needs wrk; without it the test is skipped loudly, except under ``CI=true``.
The py-spy profile is not run here (py-spy is no dependency); its parser is checked on a
recorded sample instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bench_data import report_table

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "webhooks.py"
IN_CI = os.environ.get("CI", "").lower() == "true"
TIMEOUT = 240  # the smoke run takes ~15 s; this only catches a hang
LOADS = ["warm-up (an event per webhook)", "throughput (200 events/s offered)"]

sys.path.insert(0, str(ROOT / "bench"))
from benchkit import hookprofile  # noqa: E402
from benchkit.hookload import (  # noqa: E402
    ANVIL_ARGS,
    PAYMASTER_SIGNER,
    AirdropLoad,
    MinedBlock,
    Recipients,
    analyse,
    percentile,
    watched_addresses,
)
from benchkit.hookreceiver import Record  # noqa: E402
from chaingate.devnet.anvil import AnvilProcess  # noqa: E402
from chaingate.devnet.bootstrap import bootstrap_devnet, default_cache_dir  # noqa: E402
from chaingate.devnet.rpc import DevnetRpc  # noqa: E402

# The default load's block: --rate 4000 x --block-interval 1 s, --per-tx 200.
FULL_BLOCK, PER_TX = 4000, 200


@pytest.mark.bench
def test_webhooks_bench_smoke(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        reason = "!!! BENCH NOT RUN: wrk missing; install with `apt-get install -y wrk` !!!"
        if IN_CI:
            pytest.fail(reason + " (CI=true: a missing tool is a broken CI image)")
        pytest.skip(reason)
    out = tmp_path / "webhooks.md"
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH), "--smoke", "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench/webhooks.py --smoke did not finish in {TIMEOUT}s: {exc}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    text = out.read_text()
    assert text in done.stdout  # printed as written
    assert "20 webhooks watching 200 addresses created" in done.stdout

    # Every event the chain called for arrived, at the right URL; nothing else did.
    correct = report_table(text, "## Delivered as the chain called for")
    assert [row["load"] for row in correct[:2]] == LOADS
    assert correct[2]["load"].startswith("paced (")
    for row in correct:
        assert int(row["events called for"]) > 0, row
        assert row["delivered"] == row["events called for"], row
        assert (row["missing"], row["unexpected"], row["misrouted"]) == ("0", "0", "0"), row
        assert int(row["repeated"]) >= 0, row
    assert correct[0]["events called for"] == "20"  # one per webhook
    assert correct[1]["events called for"] == "600"  # 6 blocks of 100 (0.5 s for 3 s)
    assert re.search(r"Signatures: 5 deliveries checked by hand .*: all valid\.", text)

    runs = report_table(text, "## Deliveries per second")
    assert [row["run"] for row in runs] == [
        "chaingate → receiver (deliveries)",
        "wrk → receiver (direct POST, c=16)",
    ]
    for row in runs:
        assert int(row["requests"]) > 0, row
        assert float(row["seconds"]) > 0, row
        assert float(row["req/s"]) > 0, row
        assert int(row["receiver connections"]) >= 1, row
        assert float(row["receiver CPU µs/req"]) >= 0, row
        assert row["errors"] == "0", row
    assert runs[0]["requests"] == "600"
    assert re.search(
        r"\*\*chaingate deliveries/s: \d+; target >= 2,000: (MET|NOT MET)\.  "
        r"chaingate/direct: \d+\.\d+\.\*\*",
        text,
    )

    latency = report_table(text, "## Block-to-delivery latency")
    assert [row["load"] for row in latency[:2]] == LOADS
    for row in latency:
        p50, p90, p99, top = (float(row[c]) for c in ("p50 ms", "p90 ms", "p99 ms", "max ms"))
        assert 0 < p50 <= p90 <= p99 <= top, row
        assert float(row["block's first event p50 ms"]) <= float(row["block's last event max ms"])
    assert re.search(
        r"\*\*p99 block-to-delivery at \d+ events/s: \d+ ms; target <= 500 ms: (MET|NOT MET)\.\*\*",
        text,
    )

    cpu = report_table(text, "## CPU: how the")
    assert [row["phase"] for row in cpu] == [*LOADS, cpu[2]["phase"], "direct POST (c=16)"]
    for row in cpu:
        for column in ("chaingate event loop", "anvil", "receiver", "bench (+ wrk)"):
            assert re.fullmatch(r"\d+%", row[column]), (column, row)
    assert int(cpu[-1]["receiver"].rstrip("%")) > 0  # wrk kept the receiver busy
    assert 'chaingate_webhook_deliveries_total{outcome="delivered"}' in text


def airdrop_block(
    node: AnvilProcess, cache_dir: Path | None = None
) -> tuple[AirdropLoad, int, list[str]]:
    """A devnet on ``node`` bootstrapped as the bench does, and a full-size block's recipients;
    the deployer's next nonce."""
    manifest = bootstrap_devnet(
        node.url, paymaster_signer=PAYMASTER_SIGNER, cache_dir=cache_dir, announce=print
    )
    with DevnetRpc(node.url) as rpc:
        nonce = int(rpc.call("eth_getTransactionCount", manifest.deployer, "latest"), 16)
    load = AirdropLoad(node.url, manifest.address("erc20_cgt"), manifest.deployer, PER_TX)
    recipients = Recipients(watched_addresses(FULL_BLOCK // PER_TX, PER_TX)).take(FULL_BLOCK)
    return load, nonce, recipients


def test_a_full_size_block_is_mined_whole(tmp_path: Path) -> None:
    """The smoke run's blocks hold two airdrops; the default load's hold 20 of 200 new holders
    (~99.4M gas).  On the node the bench starts, all 20 go into one block and none reverts —
    also when the devnet state it loads was cached by a node with a lower block gas limit, as
    bench/indexer_backfill.py's 100M (issue 27: that cut the bench's node to 100M)."""
    cache = tmp_path / "devnet"
    cache.mkdir()
    for compiled in default_cache_dir().glob("solc-*.json"):  # spares a compile, if there
        shutil.copy(compiled, cache)
    with AnvilProcess(extra=("--gas-limit", "100000000")) as other:
        bootstrap_devnet(other.url, paymaster_signer=PAYMASTER_SIGNER, cache_dir=cache)
    with AnvilProcess(extra=ANVIL_ARGS) as node:
        load, _, recipients = airdrop_block(node, cache)
        with load:
            mined = load.block(recipients)  # raises unless the block holds exactly those sent
            assert load.failed_transactions([mined]) == 0
    assert mined.recipients == tuple(recipients)


def test_a_block_left_short_says_which_transaction_and_where_it_went() -> None:
    """On a node whose block gas limit cannot hold the full block (100M), the bench's error
    names the airdrop left out, its nonce, and why it is still in the pool."""
    with AnvilProcess(extra=("--gas-limit", "100000000")) as node:
        load, nonce, recipients = airdrop_block(node)
        with load, pytest.raises(RuntimeError) as failed:
            load.block(recipients)
    message = str(failed.value)
    assert re.match(
        r"block \d+ holds 19 of the 20 airdrop transactions sent "
        r"\(gas used [\d,]+ of its limit 100,000,000\):\n",
        message,
    ), message
    last = f"(nonce {nonce + 19}): still in anvil's pool: its gas limit 6,060,000 did not fit"
    assert re.search(
        rf"\n  0x[0-9a-f]{{64}} {re.escape(last)} in the [\d,]+ the block had left$", message
    ), message


def block(number: int, mined_at: float, *recipients: str) -> MinedBlock:
    return MinedBlock(number, mined_at - 0.2, mined_at - 0.1, mined_at, recipients)


def test_analyse_checks_every_event_and_times_it() -> None:
    owner = {"0xa": 0, "0xb": 1, "0xc": 1}
    paths = {0: "/hooks/0", 1: "/hooks/1"}
    blocks = [block(10, 100.0, "0xa", "0xb"), block(11, 101.0, "0xc", "0xa")]
    records = [
        Record(100.05, "/hooks/0", "evt_1", 10, "0xa"),
        Record(100.25, "/hooks/1", "evt_2", 10, "0xb"),
        Record(100.30, "/hooks/1", "evt_2", 10, "0xb"),  # sent again: same id
        Record(101.10, "/hooks/0", "evt_3", 11, "0xc"),  # at the other webhook's URL
        Record(101.20, "/hooks/0", "evt_4", 11, "0xb"),  # nobody airdropped 0xb in 11
        Record(101.30, "/direct/0", "evt_1", 10, "0xa"),  # not a delivery
        Record(99.00, "/hooks/0", "evt_0", 9, "0xa"),  # another load's block
    ]
    found = analyse(blocks, records, owner, paths)
    assert (found.expected, found.delivered, found.missing) == (4, 3, 1)  # (11, 0xa) missing
    assert (found.unexpected, found.misrouted, found.repeated) == (1, 1, 1)
    assert not found.correct
    assert [round(ms) for ms in found.latencies_ms] == [50, 100, 250]
    assert [round(ms) for ms in found.block_done_ms] == [100, 250]
    assert [round(ms) for ms in found.block_first_ms] == [50, 100]
    assert found.backlog_at_end == 4 - 2  # two had arrived when block 11 was mined
    assert found.rate == pytest.approx(2 / 1.05)  # three arrivals over 1.05 s
    assert found.offered_per_s == pytest.approx(4 / 1.2)


def test_recipients_spread_each_block_over_the_webhooks() -> None:
    order = Recipients([["a0", "a1"], ["b0", "b1"], ["c0"]])
    assert order.take(2) == ["a0", "b0"]
    assert order.take(3) == ["c0", "a1", "b1"]
    assert order.take(2) == ["a0", "b0"]  # round again
    with pytest.raises(ValueError, match="only 5"):
        order.take(6)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0


# Three samples as py-spy's raw format writes them.
RAW = """\
<module> (chaingate:6);main (chaingate/cli.py:538);run (trio/_core/_run.py:2532);\
_send (chaingate/webhooks/delivery.py:500);headers (chaingate/webhooks/variants.py:170);\
standard_signature (chaingate/webhooks/signing.py:40);new (hmac.py:184) 4
<module> (chaingate:6);main (chaingate/cli.py:538);run (trio/_core/_run.py:2532);\
post (chaingate/outbound/fetch.py:90);send (chaingate/outbound/exchange.py:59) 4
<module> (chaingate:6);main (chaingate/cli.py:538);run (trio/_core/_run.py:2532);\
_connect (chaingate/outbound/fetch.py:311);connect (trio/_socket.py:1132) 2
unrolled_run (trio/_core/_run.py:2400);get_events (trio/_core/_io_epoll.py:250) 3
Thread._bootstrap (threading.py:1002);_run_sync (chaingate/store/sqlite.py:114);\
render (chaingate/webhooks/variants.py:140);checksum_address (chaingate/evm/addresses.py:27) 5
"""


class Used:
    loop = 0.001  # seconds over 10 deliveries: 100 µs each
    others = 0.0005


def test_profile_parts_per_thread_group(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    profile = hookprofile.parse(raw, "throughput", 100, Used(), delivered=10)
    assert profile.samples == 18
    assert profile.main == {
        "signing (HMAC-SHA256, both signature headers)": 4,
        "outbound HTTP (pool, h11, sockets)": 6,  # a trio connect for a delivery is its own
        hookprofile.RUNTIME: 3,  # the scheduler alone (a stack cut short counts here too)
    }
    assert profile.others == {"EIP-55 checksums (keccak), wherever called": 5}
    assert profile.inclusive["_send (chaingate/webhooks/delivery.py)"] == 4
    section = "\n".join(hookprofile.render(profile))
    assert "| outbound HTTP (pool, h11, sockets) | 46.2% | 46 |" in section
    assert "| **total (from /proc)** | 100% | **100** |" in section
    assert "| EIP-55 checksums (keccak), wherever called | 100.0% | 50 |" in section
