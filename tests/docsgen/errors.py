"""The errors reference: every HTTP error code the server writes, every JSON-RPC error code its
source defines, and the reasons an upstream failure carries.

The JSON-RPC codes are found by reading every module of the package (``ast``, nothing
imported): a module-level constant in the JSON-RPC error range is a code chaingate answers
with.  Each needs a meaning: the standard's (below) or the comment written beside it; a code
with neither fails the generator.
"""

from __future__ import annotations

import ast
import inspect
import json
from collections import defaultdict
from pathlib import Path

import chaingate
from chaingate.envelope import ERROR_CODES, error_body
from chaingate.framing_constants import REASONS
from chaingate.rpc import errors as upstream_errors
from tests.docsgen.markdown import GENERATED, code, json_block, table

# What the standards say the codes mean (JSON-RPC 2.0, EIP-1474, ERC-7769 for the bundler).
STANDARD = {
    -32700: "Parse error: the body is not valid JSON (or not UTF-8, or nested too deep).",
    -32600: "Invalid request: not a JSON-RPC 2.0 call (or a batch over the limit, or empty).",
    -32601: "Method not found: not in the method table (and the network has no passthrough), "
    "or not served on this endpoint.",
    -32602: "Invalid params: the message says which.",
    -32603: "Internal error; for a failed upstream call `data.reason` says why (below).",
    -32001: "On the bundler endpoint (ERC-7677): a gas policy refused to sponsor the "
    "operation; the message names the rule.",
    -32002: "Resource unavailable (EIP-1474): the request was refused — `data.status` is the "
    "HTTP status it would have had (401, 403), `data.code` the REST error code — or what it "
    "needs is not available now (no node answered, sponsorship not configured); the message "
    "says which.",
    -32004: "Method not supported (EIP-1474): the key's allowlist does not include the method.",
    -32005: "Limit exceeded (EIP-1474): a rate limit, the day quota, an `eth_getLogs` range over "
    "the limit (the message states it), an answer too large, a busy server.",
}
LOW, HIGH = -32768, -32000


def _rpc_codes() -> dict[int, dict[str, set[str]]]:
    """code -> {"names": constant names, "notes": comments beside them}."""
    root = Path(chaingate.__file__).parent
    found: dict[int, dict[str, set[str]]] = defaultdict(lambda: {"names": set(), "notes": set()})
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            if not isinstance(target, ast.Name) or not target.id.isupper():
                continue
            number = _int(value)
            if number is None or not LOW <= number <= HIGH:
                continue
            entry = found[number]
            entry["names"].add(target.id)
            line = lines[node.lineno - 1]
            if "#" in line:
                entry["notes"].add(line.split("#", 1)[1].strip())
    return dict(found)


def _int(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return None


def _explicit_rest_codes() -> dict[str, int | None]:
    """REST error codes given by name in the source (``code="conflict"``), with the status of
    the call that gives them when it is a literal."""
    root = Path(chaingate.__file__).parent
    found: dict[str, int | None] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg == "code" and isinstance(keyword.value, ast.Constant):
                    name = keyword.value.value
                    if isinstance(name, str) and name.isidentifier():
                        status = _int(node.args[0]) if node.args else None
                        found.setdefault(name, status)
    return found


def _reasons() -> list[tuple[str, str]]:
    """The failure kinds of an upstream call (``data.reason``), with their comments."""
    source = inspect.getsource(upstream_errors)
    lines = source.splitlines()
    out = []
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            line = lines[node.lineno - 1]
            above = []
            index = node.lineno - 2
            while index >= 0 and lines[index].startswith("#"):
                above.insert(0, lines[index].lstrip("#").strip())
                index -= 1
            note = line.split("#", 1)[1].strip() if "#" in line else " ".join(above)
            out.append((node.value.value, note))
    return out


INTRO = """\
# Errors

## REST and HTTP {#rest}

Every error answer of the REST plane — and every HTTP-level refusal on any path — has one
shape; `error.status` equals the HTTP status, `error.message` says what is wrong (naming the
parameter where there is one; never a secret, never a traceback):

"""


def render() -> str:
    out = [GENERATED, INTRO]
    example = error_body(400, "invalid field 'chain': unknown chain")
    out.append(json_block(json.loads(example)))
    out.append(
        "\nRetry only `429` (after `Retry-After` seconds) and `5xx` (with exponential backoff; "
        "`503` carries `Retry-After` too); another 4xx will fail the same way again.\n\n"
    )
    statuses: list[tuple[int, str]] = sorted(ERROR_CODES.items())
    listed = set(ERROR_CODES.values())
    for name, status in _explicit_rest_codes().items():
        if name not in listed:
            if status is None:
                raise ValueError(f"error code {name!r} is given without a literal status")
            statuses.append((status, name))
    rows = [[str(s), code(c), REASONS.get(s, b"").decode()] for s, c in sorted(statuses)]
    out.append(table(["HTTP status", "`error.code`", "Meaning"], rows))
    out.append(
        "\n## JSON-RPC {#json-rpc}\n\n"
        "On `/v1/rpc/…`, `/v1/bundler/…` and WebSocket calls an error is a JSON-RPC error object "
        "with the call's `id`.  A refusal keeps its HTTP status too (401, 403, 429), so HTTP "
        "retry logic and JSON-RPC libraries both see it.  The codes chaingate answers with:\n\n"
    )
    rows = []
    for number, entry in sorted(_rpc_codes().items()):
        notes = "; ".join(sorted(entry["notes"]))
        meaning = STANDARD.get(number) or ""
        if not meaning and not notes:
            raise ValueError(
                f"JSON-RPC code {number} ({', '.join(sorted(entry['names']))}) has no meaning: "
                "comment it where it is defined, or add it to tests/docsgen/errors.py STANDARD"
            )
        if number not in STANDARD:
            meaning = notes
        rows.append([code(number), meaning])
    out.append(table(["Code", "Meaning"], rows))
    out.append(
        "\nThe bundler's `-325xx` codes are ERC-7769's; their message carries the EntryPoint's "
        "`AAxx` reason and, for a validation rule, the ERC-7562 rule "
        "(`-32502 account uses banned opcode: TIMESTAMP [OP-011]`).\n"
    )
    out.append(
        "\n### Why an upstream call failed: `data.reason` {#reasons}\n\n"
        "A `-32603` from a failed upstream call names its cause in `data.reason`.  A write "
        "that failed after it was sent is `outcome_unknown`: it may have been executed, so look "
        "it up (a transaction by its hash) before sending it again.\n\n"
    )
    out.append(table(["`data.reason`", "Meaning"], ([code(k), v] for k, v in _reasons())))
    return "".join(out)
