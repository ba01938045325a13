"""The WebSocket reference: subscription kinds, the frames chaingate writes, close codes and
limits — each read from the code that implements them.

Pushes and replies are built with the socket layer's own functions; close codes are found by
reading the package's calls to ``close(<code>, "<reason>")``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import msgspec

from chaingate.auth.plans import Limits
from chaingate.ws import protocol, registry, solana_methods
from chaingate.ws.endpoint import WS_SCOPE
from chaingate.ws.solana_hub import SolanaHub
from tests.docsgen.markdown import GENERATED, code, table

SUBSCRIPTION = "0x9cef478923ff08bf67fde6c64013158d"

# Meaning of the close codes, by RFC 6455 section 7.4.1.
CLOSE_MEANINGS = {
    1000: "Normal closure.",
    1001: "Going away: the server is shutting down (reconnect to another process).",
    1006: "Abnormal: the connection dropped without a closing handshake.",
    1008: "Policy violation: the key was revoked, or the client read too slowly and its "
    "queue of pushes overflowed (`[ws] send_queue_bytes`).",
    1009: "Message too big (`[ws] max_message_bytes`).",
    1011: "Internal error: chaingate failed to serve this one connection (a bug, logged with a "
    "trace on the server); the other connections go on.  Reconnect.",
    1012: "Service restart: a Solana network's upstream PubSub connection was lost (connect "
    "and subscribe again; `?gaps=notify` keeps the subscriptions instead, see "
    "[Solana subscriptions](#solana)).",
}


def _close_calls() -> dict[int, set[str]]:
    """code -> the reasons written with it, from every ``.close(<int>, "<text>")`` call."""
    root = Path(protocol.__file__).parent
    found: dict[int, set[str]] = {}
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "close"
                and len(node.args) >= 1
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, int)
            ):
                reason = ""
                if len(node.args) > 1:
                    arg = node.args[1]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        reason = arg.value
                    elif isinstance(arg, ast.JoinedStr):
                        reason = "".join(
                            v.value if isinstance(v, ast.Constant) else "…" for v in arg.values
                        )
                found.setdefault(node.args[0].value, set()).add(reason)
    return found


def _frame(raw: bytes) -> str:
    return "```json\n" + json.dumps(json.loads(raw), indent=2) + "\n```\n\n"


RESULTS = {
    "newHeads": "each new block's header, as the node gives it (`number`, `hash`, `parentHash`, "
    "`timestamp`, `baseFeePerGas`, …), once per block in chain order; after a reorg the new "
    "chain's headers follow.",
    "logs": "each matching log object (`address`, `topics`, `data`, `blockNumber`, "
    "`transactionHash`, `logIndex`, `removed`); after a reorg the logs of the dropped blocks "
    'come again with `"removed": true` (newest first), then the new chain\'s.  Parameters: '
    '`{"address": …, "topics": […]}` as `eth_getLogs` takes them (no block range).',
    "newPendingTransactions": "transaction hashes entering the nodes' mempools, de-duplicated "
    "across upstreams; with the parameter `true`, whole transaction objects.",
    "syncing": "the node's `eth_syncing` whenever it changes (`false` once in sync); the "
    "current value right after the subscription.",
}


def render() -> str:
    out = [GENERATED]
    out.append(
        "# WebSocket messages\n\n"
        "`GET /v1/ws/{chain}/{network}?apiKey=KEY` upgrades to a WebSocket on the server's one "
        f"port (the key may also go in `X-API-Key` or `Authorization: Bearer`; it needs "
        f"{code(WS_SCOPE)}).  A refused upgrade is an HTTP answer in the REST error envelope "
        "(401, 403, 429 past the plan's connections).  Over the socket, every message is "
        "JSON-RPC 2.0 text: `eth_subscribe`/`eth_unsubscribe`, and any other call, answered "
        "exactly as `POST /v1/rpc/{chain}/{network}` would answer it (batches too).\n\n"
    )
    out.append("## Subscriptions {#subscriptions}\n\n")
    out.append(
        table(
            ["`eth_subscribe` kind", "Pushes"],
            ([code(kind), RESULTS.get(kind, "")] for kind in registry.KINDS),
        )
    )
    missing = [k for k in registry.KINDS if k not in RESULTS]
    if missing:
        raise ValueError(f"tests/docsgen/websocket.py: describe the subscription kind(s) {missing}")
    out.append("\n## Frames {#frames}\n\n")
    out.append("The acknowledgement of `eth_subscribe` carries the subscription id:\n\n")
    out.append(_frame(protocol.result_reply(b"1", msgspec.json.encode(SUBSCRIPTION))))
    out.append("Every push names it (here a `newHeads` push, shortened):\n\n")
    result = msgspec.json.encode({"number": "0x1406f40", "hash": "0x" + "8a" * 32})
    push = protocol.Push(result)
    frame = push.frame(protocol.push_prefix(SUBSCRIPTION))
    payload = frame[len(push.header) :]
    out.append(_frame(payload))
    out.append(
        f"A push costs compute units by size: {protocol.CU_PER_BYTE:g} per byte of the message, "
        f"rounded up, at least 1 (this one: {push.cu}).\n\n"
    )
    out.append("An error names the call's id:\n\n")
    out.append(
        _frame(
            protocol.error_reply(
                b"2",
                protocol.INVALID_PARAMS,
                "unsupported subscription 'blocks'; supported: " + ", ".join(registry.KINDS),
            )
        )
    )
    out.append(
        "Codes: `-32602` bad parameters (a filter over the plan's caps says which limit in "
        "`data`), `-32005` over a limit (subscriptions per connection, filter bytes), "
        "`-32002` refused (the key, the network), and the proxy's own — see "
        "[Errors](errors.md#json-rpc).\n\n"
    )
    out.append(_solana())
    out.append("## Closing {#close-codes}\n\n")
    rows = []
    for number, reasons in sorted(_close_calls().items()):
        shown = "; ".join(code(r) for r in sorted(reasons) if r)
        rows.append([str(number), CLOSE_MEANINGS.get(number, ""), shown])
    out.append(table(["Close code", "Meaning", "Reason text"], rows))
    out.append(
        "\nchaingate pings a client silent for `[ws] ping_interval` seconds and closes it when no "
        "pong comes within `[ws] pong_timeout`.\n\n"
    )
    out.append("## Limits {#limits}\n\n")
    plan_caps = [f for f in Limits.__struct_fields__ if f.startswith("ws_")]
    out.append(
        "Per plan ([Plans and limits](plans.md#plans)): "
        + ", ".join(map(code, plan_caps))
        + ".  Per server, whatever the plan ([configuration](configuration.md#ws)): the `[ws]` "
        "section.  A connection over the plan's count is refused with 429; a subscription over "
        "it is a JSON-RPC error.\n"
    )
    return "".join(out)


def _solana() -> str:
    """Solana's PubSub on ``/v1/ws/solana/{network}``: its methods, frames and gap notice."""
    out = ["## Solana subscriptions {#solana}\n\n"]
    out.append(
        "On a Solana network (`/v1/ws/solana/{network}?apiKey=KEY`) the socket speaks Solana's "
        "PubSub: "
        + ", ".join(code(m) for m in sorted(solana_methods.NOTIFICATIONS))
        + " and their `…Unsubscribe`, with Solana's params, passed to the network's upstream "
        "PubSub (its `ws_url`) unchanged.  Every client asking the same method and params "
        "shares one upstream subscription; ids are integers of the client's own.  A "
        "`signatureSubscribe` ends after its notification, as on Solana.  Other calls are "
        "answered as `POST /v1/rpc/solana/{network}` answers them.  Params over "
        f"{solana_methods.MAX_PARAMS_BYTES:,} bytes are `-32602`; an upstream's error comes "
        "back unchanged; unsubscribing an id that is not the connection's (or has ended) is "
        f"`-32602` {code(solana_methods.INVALID_SUBSCRIPTION_ID)}, as on Solana.\n\n"
    )
    out.append("A notification, under the client's own id (here a `slotNotification`):\n\n")
    slot = msgspec.json.encode({"parent": 311, "root": 280, "slot": 312})
    frame, cu = solana_methods.Notification("slotNotification", slot).frame(solana_methods.tail(7))
    out.append(_frame(_payload(frame)))
    out.append(
        f"Pushes cost compute units by size as above (this one: {cu}), billed as "
        f"{code(SolanaHub.push_method)}.\n\n"
    )
    out.append(
        "When the upstream PubSub connection is lost, chaingate subscribes again on the next "
        "upstream, and no client misses notifications without being told: by default the "
        "connections of the clients subscribed on it are closed with `1012` (connect and "
        "subscribe again).  A client that connected with `?gaps=notify` keeps its "
        "subscriptions instead and, before a subscription's next notification, is told with "
        f"a {code(solana_methods.GAP_METHOD)} notification under that subscription's id: "
        "notifications between `lostAt` and `resumedAt` (unix seconds) may be missing.  (Not "
        "the default: client libraries such as @solana/kit hand any notification carrying a "
        "subscription's id to that subscription, whatever its method.)\n\n"
    )
    gap = solana_methods.gap_result("upstream lost", 1765100000.125, 1765100000.731, "node-b")
    notice, _ = solana_methods.Notification(solana_methods.GAP_METHOD, gap).frame(
        solana_methods.tail(7)
    )
    out.append(_frame(_payload(notice)))
    return "".join(out)


def _payload(frame: bytes) -> bytes:
    """A server frame's payload (its header is 2, 4 or 10 bytes, by the length byte)."""
    n = frame[1] & 0x7F
    return frame[2 if n < 126 else 4 if n == 126 else 10 :]
