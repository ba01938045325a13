"""The generated references under docs/reference/ are what the code says, and say all of it.

Each page is regenerated from the code (tests/docsgen) and compared with the file: a setting,
a command, a method or an error code added without regenerating fails here.  Run
``python -m tests.docsgen`` (or this test with ``CHAINGATE_DOCS_UPDATE=1``) to rewrite them.
The pages read from a running server (REST, metrics) are checked by test_docs_snippets.py.
"""

from __future__ import annotations

import os
import re
import tomllib

import msgspec
import pytest

from chaingate import config
from tests.docsgen import cli, configuration, pages, tables

UPDATE = os.environ.get("CHAINGATE_DOCS_UPDATE") == "1"


@pytest.mark.parametrize("name", sorted(pages.PAGES))
def test_the_reference_page_is_what_the_code_says(name: str) -> None:
    generated = pages.PAGES[name]()
    if UPDATE:
        pages.write({name: generated})
    assert not pages.stale({name: generated}), (
        f"docs/reference/{name} differs from what the code says: run `python -m tests.docsgen`"
    )


def test_every_settings_class_and_key_is_in_the_configuration_reference() -> None:
    text = (pages.REFERENCE / "configuration.md").read_text()
    sections = list(configuration.sections())
    assert configuration.settings_classes() <= {s.cls for s in sections}, "a class none reaches"
    headers = [s.header for s in sections]
    for section in sections:
        block = text.split(f"## `{section.header}`", 1)[1].split("\n## ", 1)[0]
        for field in msgspec.structs.fields(section.cls):
            as_key = f"| `{field.name}` |" in block
            as_table = any(re.search(rf"[.\[]{field.name}[.\]]", h) for h in headers)
            assert as_key or as_table, f"{section.header} {field.name} is not in the reference"


def test_a_key_the_environment_cannot_set_shows_none() -> None:
    """The environment column is asked of the loader: keys below [chains] have none."""
    assert configuration.env_variable(("server", "port")) == "CHAINGATE_SERVER__PORT"
    assert configuration.env_variable(("chains", "<chain>", "<network>", "chain_id")) == ""
    overridden = config.from_mapping({}, environ={"CHAINGATE_SERVER__PORT": "9123"})
    assert overridden.server.port == 9123


def test_every_command_is_in_the_cli_reference() -> None:
    text = (pages.REFERENCE / "cli.md").read_text()
    for command in cli.commands():
        assert re.search(rf"^#+ `{re.escape(command)}`$", text, re.M), command


def test_every_method_of_the_method_table_is_in_the_methods_reference() -> None:
    text = (pages.REFERENCE / "methods.md").read_text()
    path = config.methods_path(tables.DEFAULTS)
    data = tomllib.loads(path.read_text())
    data.pop("passthrough", None)
    names = [name for methods in data.values() for name in methods]
    assert len(names) > 100
    missing = [name for name in names if f"| `{name}` |" not in text]
    assert not missing, missing
