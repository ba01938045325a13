"""The imports of ``src/chaingate`` hold no circle, and the few rules the issue names hold.

The layers themselves are import-linter's contracts (pyproject.toml, run by ``.ci/run``); this
walks the source itself, so a circle shows in the test suite too — every import counts,
including those under ``TYPE_CHECKING`` and inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import chaingate

ROOT = Path(chaingate.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ["chaingate", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module ``name`` is, or is in (``pkg.mod.Name`` is ``pkg.mod``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _known(name)
            if target is not None and target != module:
                yield target


GRAPH = {module: set(_imported(module, path)) for module, path in MODULES.items()}


def _circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_walk_sees_the_imports() -> None:
    assert "chaingate.store.base" in GRAPH["chaingate.store.rows"]
    assert "chaingate.gateway" in GRAPH["chaingate.cli"]


def test_no_import_circles() -> None:
    assert _circles() == []


def test_the_store_engine_imports_no_subsystem() -> None:
    wrong = {
        (module, target)
        for module, targets in GRAPH.items()
        if _in(module, "chaingate.store")
        for target in targets
        if not _in(target, "chaingate.store")
    }
    assert wrong == set()


def test_the_proxy_imports_nothing_from_auth() -> None:
    wrong = {
        (module, target)
        for module, targets in GRAPH.items()
        if _in(module, "chaingate.rpc")
        for target in targets
        if _in(target, "chaingate.auth")
    }
    assert wrong == set()


def test_only_the_cli_imports_the_devnet() -> None:
    importers = {
        module
        for module, targets in GRAPH.items()
        if not _in(module, "chaingate.devnet")
        and any(_in(target, "chaingate.devnet") for target in targets)
    }
    assert importers == {"chaingate.cli"}
