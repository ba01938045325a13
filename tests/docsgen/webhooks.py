"""The webhook payload reference: every event type of both variants, rendered and signed by the
variants' own code from one example fact per kind.

A kind the model gains without an example here fails the generator (``EXAMPLES``), so a new
event type cannot ship undocumented.
"""

from __future__ import annotations

import base64
import json
import typing

from chaingate.webhooks import filters
from chaingate.webhooks.model import (
    BlockFact,
    BlockRef,
    InternalTransferFact,
    Kind,
    LogFact,
    Match,
    NftInfo,
    Token,
    TransactionFact,
    TransferFact,
    event_id,
    removal_id,
)
from chaingate.webhooks.variants import VARIANT_A, VARIANT_B, Variant
from tests.docsgen.markdown import GENERATED, code, table

WEBHOOK = "wh_01jd8x3k7q9m2v5c4b6n8p0r1s"
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
CHAIN, CHAIN_ID = "ethereum", 1
CREATED_MS = 1_764_000_000_123
TIMESTAMP = CREATED_MS // 1000
BLOCK = BlockRef(21_000_000, "0x" + "8a" * 32, 1_763_999_999)
TX = "0x" + "5c" * 32
ALICE = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc"
BOB = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
TOKEN = "0x0f6489a354251ea5aa3f37514e40aed748cca2e1"
NFT = "0xaf1ae372e2021e93ccd65f8b1afba7adeff57852"

_native = TransferFact(
    BLOCK, TX, 4, None, "native", None, BOB, ALICE, None, 1_500_000_000_000_000_000
)
_erc20 = TransferFact(
    BLOCK,
    TX,
    4,
    7,
    "ERC20",
    TOKEN,
    BOB,
    ALICE,
    None,
    2_500_000,
    token=Token(symbol="CGUSD", decimals=6, name="chaingate USD"),
)
_erc721 = TransferFact(
    BLOCK,
    TX,
    4,
    9,
    "ERC721",
    NFT,
    "0x" + "0" * 40,
    ALICE,
    1,
    1,
    nft=NftInfo(
        name="Gate #1",
        description="A chaingate devnet NFT",
        image_url="ipfs://bafy.../1.png",
        token_uri="ipfs://bafy.../1.json",
        status="ok",
    ),
)
_transaction = TransactionFact(
    BLOCK, TX, 4, BOB, TOKEN, 0, 12, "0xa9059cbb" + "00" * 64, status=1, gas_used=51_234
)
_pending = TransactionFact(None, TX, None, BOB, ALICE, 10**17, 13, "0x")
_log = LogFact(
    BLOCK,
    TX,
    4,
    7,
    TOKEN,
    (
        "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef",
        "0x" + "0" * 24 + BOB[2:],
        "0x" + "0" * 24 + ALICE[2:],
    ),
    "0x" + f"{2_500_000:064x}",
)
_internal = InternalTransferFact(BLOCK, TX, BOB, ALICE, 10**16, "CALL", (0, 1))
_block = BlockFact(BLOCK, "0x" + "7b" * 32, 14_250_000, 30_000_000, 7_000_000_000, 132)

# What each kind is shown with: (what the example is, the match).
EXAMPLES: dict[Kind, list[tuple[str, Match]]] = {
    "address_activity": [
        ("ETH received", Match(WEBHOOK, "address_activity", _native, ALICE, "incoming")),
        ("an ERC-20 sent", Match(WEBHOOK, "address_activity", _erc20, BOB, "outgoing")),
        (
            "a contract called",
            Match(WEBHOOK, "address_activity", _transaction, BOB, "outgoing"),
        ),
    ],
    "token_transfer": [("an ERC-20 transfer", Match(WEBHOOK, "token_transfer", _erc20))],
    "nft_transfer": [("an ERC-721 mint", Match(WEBHOOK, "nft_transfer", _erc721))],
    "mined_transaction": [
        ("a mined transaction", Match(WEBHOOK, "mined_transaction", _transaction))
    ],
    "log": [("an ERC-20 Transfer log", Match(WEBHOOK, "log", _log))],
    "internal_transfer": [
        (
            "ETH moved by a contract",
            Match(WEBHOOK, "internal_transfer", _internal, ALICE, "incoming"),
        )
    ],
    "new_block": [("a block", Match(WEBHOOK, "new_block", _block))],
    "pending_transaction": [
        (
            "a transaction in the mempool",
            Match(WEBHOOK, "pending_transaction", _pending, ALICE, "incoming"),
        )
    ],
}


def _render(variant: Variant, event_type: str, match: Match | None, sequence: int) -> str:
    evt = event_id(WEBHOOK, match.key if match is not None else "test")
    return variant.render(
        match,
        event_id=evt,
        webhook_id=WEBHOOK,
        event_type=event_type,
        chain_label=CHAIN,
        chain_id=CHAIN_ID,
        sequence=sequence,
        created_at_ms=CREATED_MS,
    )


def _headers(variant: Variant, body: str) -> list[tuple[str, str]]:
    parsed = json.loads(body)
    return variant.headers(
        event_id=parsed["id"],
        event_type=parsed.get("event_type") or parsed.get("type"),
        body=body.encode(),
        timestamp=TIMESTAMP,
        secrets=[SECRET],
    )


def _pretty(body: str) -> str:
    return "```json\n" + json.dumps(json.loads(body), indent=2) + "\n```\n\n"


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def _variant(variant: Variant, title: str) -> list[str]:
    name = variant.name
    out = [f"## Variant {name.upper()} {{#variant-{name}}}\n\n", title + "\n\n"]
    kinds = set(typing.get_args(Kind)) - {"test"}
    missing = [k for k in variant.event_types.values() if k not in EXAMPLES]
    if missing or not set(EXAMPLES) <= kinds:
        raise ValueError(f"tests/docsgen/webhooks.py needs an example of {missing}")
    delays = ", ".join(_duration(d) for d in variant.retry_delays)
    after = (
        "the webhook is paused (and its owner told by e-mail when SMTP is set)"
        if variant.exhausted == "pause"
        else "the event is marked failed"
    )
    out.append(
        f"**Retries:** after a failed attempt (no answer within the timeout, or a status other "
        f"than 2xx) the event is sent again after {delays}; after the last, {after}.  A 410 "
        "answer disables the webhook at once.\n\n"
    )
    sample_body = _render(variant, variant.type_name("test"), None, 1)
    out.append(f"### Headers {{#headers-{name}}}\n\n")
    out.append(
        f"Every attempt carries these (here for the ping below, signed with the secret "
        f"{code(SECRET)}):\n\n"
    )
    out.append(
        table(["Header", "Value"], ([code(k), code(v)] for k, v in _headers(variant, sample_body)))
    )
    out.append("\n")
    out.append(f"### The ping: {code(variant.type_name('test'))} {{#ping-{name}}}\n\n")
    out.append("`POST /v1/webhooks/{id}/test` sends it.\n\n" + _pretty(sample_body))
    sequence = 2
    for event_type, kind in variant.event_types.items():
        anchor = f"{name}-{event_type.lower().replace('_', '-')}"
        keys = filters._KEYS.get(kind, ())
        required = filters._REQUIRED.get(kind, ())
        out.append(f"### {code(event_type)} {{#{anchor}}}\n\n")
        if keys:
            needed = (
                f"required: {code(required[0])}"
                if len(required) == 1
                else "at least one of " + ", ".join(map(code, required))
            )
            out.append(
                "Filter keys (`config`): " + ", ".join(map(code, keys)) + f" ({needed}).\n\n"
            )
        else:
            out.append("Filter keys (`config`): none (every block).\n\n")
        for what, match in EXAMPLES[kind]:
            out.append(f"{what[0].upper() + what[1:]}:\n\n")
            out.append(_pretty(_render(variant, event_type, match, sequence)))
            sequence += 1
    first_type, first_kind = next(iter(variant.event_types.items()))
    original = _render(variant, first_type, EXAMPLES[first_kind][0][1], 2)
    new_id = removal_id(json.loads(original)["id"])
    removed = variant.render_removal(original, new_id, sequence, CREATED_MS + 60_000)
    out.append(f"### After a reorg {{#removed-{name}}}\n\n")
    out.append(
        "When a block that produced events is reorganised away, each of its delivered events is "
        "taken back by a new one: the same type and `data` byte for byte, `removed: true`, and "
        "the original's id.  Here, the first example above taken back:\n\n"
    )
    out.append(_pretty(removed))
    return out


INTRO = """\
# Webhook payloads

What a receiver gets, for every event type.  A deployment speaks one of two variants, chosen by
`[webhooks] variant` (`"a"` by default): they differ in event names, envelope, signature header
and retry schedule.  Both also carry the [Standard Webhooks](https://www.standardwebhooks.com/)
headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`), so its libraries verify either.
Every example below is rendered and signed by chaingate's own code.

* `id` is stable: the same event sent again (a retry, a replay, a restart) has the same id —
  de-duplicate on it.
* `sequence` grows with every event of a webhook; `removed: true` marks an event taken back
  after a reorg.
* Amounts are decimal strings (raw units; `valueFormatted` or `symbol`/`decimals` to show them);
  addresses are EIP-55, hashes lowercase hex.

How to verify a signature, and what to answer: [Receiving webhooks](../guides/webhooks.md).

"""


def render() -> str:
    out = [GENERATED, INTRO]
    out += _variant(
        VARIANT_A,
        "The variant's signature: `X-Service-Signature` is the hex HMAC-SHA256, keyed with the "
        "whole secret string, of `<X-Service-Timestamp>.<body>` (two values, comma-separated, "
        "while a rotated secret overlaps).",
    )
    out += _variant(
        VARIANT_B,
        "The variant's signature: `X-Cloud-Signature` is `sha256=` and the hex HMAC-SHA256, keyed "
        "with the whole secret string, of the body (two, comma-separated, while a rotated secret "
        "overlaps).",
    )
    return "".join(out)
