"""A big batch's memory, on a real ``chaingate serve`` process (issue 39, item 2).

500 ``eth_call``s against a real anvil, each answered with 0.6 MB (a state override makes the
called code return 300,000 bytes): 300 MB of answers, of which the answer bound
(``rpc.max_answer_bytes``, 64 MiB) keeps ~58 MiB.  The process's peak RSS — the kernel's
high-water mark, reset just before the batch, so nothing is missed between samples — may grow
by at most twice the bound.  The gateway is first warmed with a keyed request: from then on
that key's requests take the fast lane, where the batch once peaked at +245 MiB (+187 through
the handler; docs/decisions/hardening.md, issue 39).  The compiled framing, what runs by
default: the pure twin makes more temporaries (+182 MiB, and 38 s for this batch) and is not
held to this bound.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from chaingate.devnet.anvil import AnvilProcess
from tests.serve_process import ServeProcess

RPC = "/v1/rpc/ethereum/devnet"
BOUND = 64 << 20  # rpc.max_answer_bytes, the default
CALLS = 500
BIG = "0x" + "ab" * 20  # an address whose code (a state override) returns RESULT_BYTES zeros
RESULT_BYTES = 300_000  # 0.6 MB of hex in each result
RETURN_ZEROS = "0x62" + RESULT_BYTES.to_bytes(3, "big").hex() + "6000f3"  # RETURN(0, n)


def big_call(call_id: int) -> dict[str, Any]:
    """A distinct call (its calldata, which the code ignores), so none joins another."""
    call = {"to": BIG, "data": f"0x{call_id:08x}"}
    params = [call, "latest", {BIG: {"code": RETURN_ZEROS}}]
    return {"jsonrpc": "2.0", "id": call_id, "method": "eth_call", "params": params}


def status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def settled_rss(pid: int) -> int:
    """The RSS once it stops moving (a background task may still be finishing)."""
    last = status_bytes(pid, "VmRSS")
    for _ in range(50):
        time.sleep(0.2)
        now = status_bytes(pid, "VmRSS")
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


def reset_peak(pid: int) -> None:
    """From now on VmHWM is the peak since this moment (Linux >= 4.0, our own child)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def test_a_big_batch_peaks_within_twice_the_answer_bound(
    anvil: AnvilProcess, tmp_path: Path
) -> None:
    with ServeProcess(tmp_path, anvil.url, keys=True).start() as serve:
        assert serve.process is not None
        pid = serve.process.pid
        key = serve.create_key()
        headers = {"X-API-Key": key}
        with httpx.Client(base_url=serve.base, headers=headers, timeout=180) as client:
            warm = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
            assert client.post(RPC, json=warm).json()["result"] == "0x7a69"
            baseline = settled_rss(pid)
            reset_peak(pid)
            response = client.post(RPC, json=[big_call(i) for i in range(CALLS)])
            peak = status_bytes(pid, "VmHWM")
        assert response.status_code == 200
        replies = response.json()
        assert [r["id"] for r in replies] == list(range(CALLS))
        results = [r for r in replies if "result" in r]
        refused = [r for r in replies if "error" in r]
        assert all(len(r["result"]) == 2 + 2 * RESULT_BYTES for r in results)
        assert 1 <= len(results) <= BOUND // (2 * RESULT_BYTES)
        assert {r["error"]["data"]["reason"] for r in refused} == {"answer_too_large"}
        assert len(response.content) <= BOUND + CALLS * 512
        grown = peak - baseline
        assert grown <= 2 * BOUND, f"RSS peaked {grown >> 20} MiB over {baseline >> 20} MiB"
        # Given back: what the batch held is freed (no answer, reply or body left behind).
        assert settled_rss(pid) - baseline < 16 << 20
