"""The configuration reference, from the settings Structs themselves.

Every section and key is found by walking ``chaingate.config.Settings`` (the root the loader
converts a TOML file into) through its fields' types; each key's description is the comment
written above it in the class, each section's the class docstring.  Which keys an environment
variable can set is asked of the loader's own ``apply_env``, never assumed.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import inspect as mi

from chaingate import config
from tests.docsgen.markdown import GENERATED, code, table

# How the placeholders of a table keyed by name read (``[chains.<chain>.<network>]``); a
# table this does not name reads ``<name>``.
PLACEHOLDERS = {"chains": ("chain", "network")}
_FIELD = re.compile(r"^    ([a-z_][a-z0-9_]*)\s*:")


@dataclass
class Key:
    name: str
    kind: str
    default: str
    env: str
    text: str


@dataclass
class Section:
    header: str  # the TOML table header, e.g. "[chains.<chain>.<network>.follower]"
    cls: type[msgspec.Struct]
    keys: list[Key]


def _comments(cls: type, share: bool = True) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it and one at the end of its line.
    A field with none shares the comment of the fields just above it when that comment names
    it (one comment written for a group of keys)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls)).splitlines()
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    above: list[str] = []
    group = ""
    for line in source:
        stripped = line.strip()
        if not stripped:
            group = ""
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match:
            name = match.group(1)
            trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            if above:
                group = " ".join(above)
                found[name] = " ".join(filter(None, [group, trailing]))
            else:
                shared = group if share and re.search(rf"\b{name}\b", group) else ""
                found[name] = " ".join(filter(None, [shared, trailing]))
        above = []
    return found


def comment_groups(cls: type) -> list[tuple[str, list[str]]]:
    """The fields in the groups their comments make: a field with no comment of its own
    belongs with the fields above it."""
    names = [f.name for f in msgspec.structs.fields(cls)]  # type: ignore[arg-type]
    own = _comments(cls, share=False)
    groups: list[tuple[str, list[str]]] = []
    for name in names:
        if own.get(name) or not groups:
            groups.append((own.get(name, ""), [name]))
        else:
            groups[-1][1].append(name)
    return groups


def _kind(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        parts = [_kind(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(parts)
    if isinstance(t, mi.LiteralType):
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in t.values)
    if isinstance(t, mi.BoolType):
        return "boolean"
    if isinstance(t, mi.IntType):
        return "integer"
    if isinstance(t, mi.FloatType):
        return "number"
    if isinstance(t, mi.StrType):
        return "string"
    if isinstance(t, mi.ListType):
        return f"list of {_kind(t.item_type)}"
    if isinstance(t, mi.TupleType):
        return "[" + ", ".join(_kind(x) for x in t.item_types) + "]"
    if isinstance(t, mi.VarTupleType):
        return f"list of {_kind(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"table of {_kind(t.value_type)}"
    if isinstance(t, mi.StructType):
        return "table"
    raise TypeError(f"no wording for the settings type {t!r}: add one to tests/docsgen")


def _toml(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return f"{value:g}" if value == int(value) and abs(value) < 1e15 else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML for the default {value!r}")


def _size(name: str, value: Any) -> str:
    """A byte count also in KiB/MiB, where the key counts bytes."""
    if "bytes" not in name and "buffer" not in name:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1024 or value % 1024:
        return ""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value % size == 0:
            return f" ({value // size} {unit})"
    return ""


def _default(field: mi.Field) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    if field.default is not msgspec.NODEFAULT:
        return field.default
    return msgspec.NODEFAULT


def env_variable(path: tuple[str, ...]) -> str:
    """The variable that sets this key, as the loader reads the environment; "" if none."""
    name = config.ENV_PREFIX + "__".join(path).upper()
    applied: Any = config.apply_env({}, {name: "1"})
    for part in path:
        if not isinstance(applied, dict) or part not in applied:
            return ""
        applied = applied[part]
    return name


def _struct_of(t: mi.Type) -> tuple[type[msgspec.Struct], list[str]] | None:
    """A Struct reached through tables keyed by name (their placeholders), or a list of them."""
    levels: list[str] = []
    while True:
        if isinstance(t, mi.StructType):
            return t.cls, levels
        if isinstance(t, mi.DictType):
            levels.append("name")
            t = t.value_type
        elif isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
            levels.append("[]")
            t = t.item_type
        else:
            return None


def sections(
    cls: type[msgspec.Struct] = config.Settings,
    path: tuple[str, ...] = (),
    header: str = "",
    env: bool = True,
) -> Iterator[Section]:
    """The sections of ``cls`` and of every table below it; ``env``: whether the environment
    can reach them (not below a table keyed by name)."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    comments = _comments(cls)
    keys: list[Key] = []
    nested: list[tuple[str, mi.Field, type[msgspec.Struct], list[str]]] = []
    for field in info.fields:
        reached = _struct_of(field.type)
        if reached is not None:
            nested.append((field.name, field, *reached))
            continue
        default = _default(field)
        shown = "(required)" if default is msgspec.NODEFAULT else _toml(default)
        keys.append(
            Key(
                field.name,
                _kind(field.type),
                shown + _size(field.name, default),
                env_variable((*path, field.name)) if env else "",
                comments.get(field.name, ""),
            )
        )
    yield Section(header or "(top level)", cls, keys)
    for name, _field, child, levels in nested:
        words = iter(PLACEHOLDERS.get(name, ()))
        parts = [*path, name]
        is_array = False
        for level in levels:
            if level == "[]":
                is_array = True
            else:
                parts.append(f"<{next(words, 'name')}>")
        dotted = ".".join(parts)
        child_header = f"[[{dotted}]]" if is_array else f"[{dotted}]"
        yield from sections(child, tuple(parts), child_header, env and not levels)


def settings_classes() -> set[type[msgspec.Struct]]:
    """Every settings Struct the configuration package defines (the coverage check)."""
    found = set()
    for value in vars(config).values():
        if (
            isinstance(value, type)
            and issubclass(value, msgspec.Struct)
            and value.__module__.startswith(config.__name__)
            and value.__name__.endswith("Settings")
        ):
            found.add(value)
    return found


INTRO = """\
# Configuration

`chaingate serve --config FILE` reads one TOML file; every key below has the default shown, so
a file holds only what differs.  `config/chaingate.example.toml` in the repository is a
commented starting point; `chaingate dev` runs on `config/dev.toml` (a devnet, keys on, debug
methods on).

Precedence: built-in defaults < the file < environment variables.  A key with a variable in the
**Environment** column can be set as `CHAINGATE_<SECTION>__<KEY>` (`CHAINGATE_SERVER__PORT=9000`);
its value is read as a TOML literal when it parses as one (numbers, booleans, quoted strings)
and as plain text otherwise — a text key is always taken as text.  Give secrets (the pepper, the
admin token, a store URL holding a password, the paymaster and bundler keys) this way rather
than in the file.  Keys under `[chains.<chain>.<network>]` are set in the file only.

An unknown key, a value of the wrong type or an impossible combination stops the start with a
message naming the key (`chaingate serve` prints it and exits with status 2).
"""


def render() -> str:
    out = [GENERATED, INTRO]
    all_sections = list(sections())
    out.append("\n## Sections\n\n")
    out.extend(f"* [{code(s.header)}](#{_anchor(s.header)})\n" for s in all_sections)
    for section in all_sections:
        out.append(f"\n## {code(section.header)} {{#{_anchor(section.header)}}}\n\n")
        doc = section.cls.__doc__  # its own, never msgspec.Struct's
        if doc:
            out.append(inspect.cleandoc(doc) + "\n\n")
        out.append(
            table(
                ["Key", "Type", "Default", "Environment", "Description"],
                (
                    [code(k.name), k.kind, code(k.default), code(k.env) if k.env else "—", k.text]
                    for k in section.keys
                ),
            )
        )
    return "".join(out)


def _anchor(header: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", header.lower()).strip("-")
    return words or "top-level"
