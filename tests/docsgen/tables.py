"""The JSON-RPC method table, the in-process methods' prices and the plans, from the files the
server loads them from (``config/methods.toml``, ``config/bundler.toml``,
``config/plans.toml``), read by the server's own loaders."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from chaingate import config
from chaingate.auth.gate import SCOPES
from chaingate.auth.plans import Limits, Plans
from chaingate.rpc.local import load_costs
from chaingate.rpc.methods import MethodSpec, MethodTable
from tests.docsgen.configuration import comment_groups
from tests.docsgen.markdown import GENERATED, code, table

DEFAULTS = config.from_mapping({}, environ={})
FAMILY_TITLES = {"evm": "EVM chains", "solana": "Solana"}


def _header_comment(path: Path) -> list[str]:
    """The comment a file opens with, as lines (its own documentation)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" "))
    return lines


def _groups(path: Path) -> list[tuple[str, list[str]]]:
    """A flat TOML file's keys in the groups its comments make: (comment, keys)."""
    groups: list[tuple[str, list[str]]] = []
    comment: list[str] = []
    keys: list[str] = []
    started = False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if keys:
                groups.append((" ".join(comment), keys))
                comment, keys = [], []
            if started:
                comment.append(stripped.lstrip("#").strip())
        elif "=" in stripped:
            keys.append(stripped.split("=", 1)[0].strip())
        elif not stripped:
            started = True
            if keys:
                groups.append((" ".join(comment), keys))
                comment, keys = [], []
    if keys:
        groups.append((" ".join(comment), keys))
    return groups


def _row(spec: MethodSpec) -> list[str]:
    historical = str(spec.cu_historical) if spec.cu_historical is not None else ""
    tcu = str(spec.tcu) if spec.tcu != spec.cu else ""
    block = str(spec.block_param) if spec.block_param is not None else ""
    return [
        code(spec.name),
        code(spec.scope),
        str(spec.cu),
        historical,
        tcu,
        spec.cache if spec.cache != "none" else "",
        "yes" if spec.retry else "no",
        block,
    ]


def _rules(spec: MethodSpec) -> str:
    """The row's rules of its own, in words (a family without any has no such column)."""
    rules = []
    if spec.local:
        rules.append("answered by chaingate")
    if spec.testnet_only:
        rules.append("test networks only")
    if spec.broadcast:
        rules.append("sent to every upstream at once")
    if spec.cu_per_kib:
        rules.append(f"+{spec.cu_per_kib} CU per KiB answered")
    if spec.max_bytes:
        size = spec.max_bytes
        shown = f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size} bytes"
        rules.append(f"answers up to {shown}")
    return "; ".join(rules)


HEADERS = [
    "Method",
    "Scope",
    "CU",
    "CU (historical)",
    "Throughput CU",
    "Cache",
    "Retried",
    "Block param",
]

METHODS_INTRO = """\
# JSON-RPC methods

Every method the proxy (`POST /v1/rpc/{chain}/{network}`, and calls over
`/v1/ws/{chain}/{network}`) forwards, with what it costs and how it is treated, exactly as the
server reads them from its method table (`[rpc] methods_file`, `config/methods.toml` by
default).  The table's own explanation of its fields:

"""


def methods() -> str:
    path = config.methods_path(DEFAULTS)
    methods_table = MethodTable.load(path)
    families = [name for name in tomllib.loads(path.read_text()) if name != "passthrough"]
    out = [GENERATED, METHODS_INTRO]
    out.append("```text\n" + "\n".join(_header_comment(path)).strip() + "\n```\n\n")
    out.append(
        "Columns: **CU** compute units billed per call; **CU (historical)** billed instead "
        "when the block parameter names an old block; **Throughput CU** counted against the "
        "key's compute units per second when it differs from CU; **Cache** `static` (cached "
        "for good) or `finalized` (cached once final); **Retried** sent to another upstream "
        "after a failure; **Block param** the position of the block parameter (a slot on "
        "Solana); **Rules** what else the table says of the method.\n\n"
    )
    for family in families:
        specs = methods_table.family(family)
        title = FAMILY_TITLES.get(family, family)
        out.append(f"## {title} ({len(specs)} methods) {{#{family}}}\n\n")
        rows = [_row(spec) for spec in specs.values()]
        rules = [_rules(spec) for spec in specs.values()]
        if any(rule for rule in rules if rule != "answered by chaingate"):
            headers = [*HEADERS, "Rules"]
            rows = [[*row, rule] for row, rule in zip(rows, rules, strict=True)]
        else:
            headers = HEADERS
        out.append(table(headers, rows) + "\n")
    out.append("## Methods not in the table {#passthrough}\n\n")
    out.append(
        "A method missing from the table is answered `-32601` without reaching a node, unless "
        "the network sets `passthrough = true`; it is then forwarded as this entry says:\n\n"
    )
    passthrough = msgspec.structs.replace(methods_table.passthrough, name="(any other method)")
    out.append(table(HEADERS, [_row(passthrough)]) + "\n")
    bundler = config.config_file(DEFAULTS, "bundler.toml")
    costs = load_costs(bundler)
    out.append("## Answered by chaingate: the bundler endpoint {#bundler}\n\n")
    out.append(
        "`POST /v1/bundler/{chain}/{network}` answers these itself (the key needs "
        "`bundler:send`); their compute units come from `config/bundler.toml`.  One call "
        "counts as one request against the key's requests per second and day quota.\n\n"
    )
    for comment, keys in _groups(bundler):
        if comment:
            out.append(comment + "\n\n")
        out.append(table(["Method", "CU"], ([code(k), str(costs[k])] for k in keys)) + "\n")
    return "".join(out)


PLANS_INTRO = """\
# Scopes, plans and limits

## Scopes {#scopes}

A key carries scopes; a request outside them is refused with 403 (on JSON-RPC paths, a
JSON-RPC error `-32002` with the status in `data`).  `chaingate keys create --scopes` takes
them space-separated; without it a key has every scope.

"""


def plans() -> str:
    out = [GENERATED, PLANS_INTRO]
    out.extend(f"* {code(scope)}\n" for scope in SCOPES)
    path = config.config_file(DEFAULTS, DEFAULTS.auth.plans_file)
    loaded = Plans.load(path)
    out.append("\n## Plans {#plans}\n\n")
    out.append(
        "Each account has a plan (`chaingate keys create --plan`, `chaingate keys plan`); an "
        "account may carry its own values, which replace the plan's (`--limits`).  `0` means "
        f"unlimited.  From `{DEFAULTS.auth.plans_file}` (`[auth] plans_file`):\n\n"
    )
    names = loaded.names
    fields = list(Limits.__struct_fields__)
    limits = {name: loaded.limits(name) for name in names}
    out.append(
        table(
            ["Limit", *(code(n) for n in names)],
            ([code(f), *(f"{getattr(limits[n], f):,}" for n in names)] for f in fields),
        )
    )
    out.append("\n## What each limit means {#limits}\n\n")
    out.append(
        table(
            ["Limits", "Meaning"],
            ((", ".join(code(f) for f in group), text) for text, group in comment_groups(Limits)),
        )
    )
    out.append("\nThe file's own notes:\n\n")
    out.append("```text\n" + "\n".join(_header_comment(path)).strip() + "\n```\n")
    return "".join(out)
