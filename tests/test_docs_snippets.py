"""Every snippet of the documentation runs, against a ``chaingate dev`` started for them.

One ``chaingate dev`` (its own data dir under a temporary home, its own ports) serves every
page; each page is one test that runs its blocks top to bottom, as a reader would
(tests/docsgen/snippets.py says how a page marks a file, an expected output, a block that
cannot run here, a process left running).  The same server checks that the generated REST and
metrics references are what a running server publishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chaingate.devnet.npm import npm_install
from tests.docsgen import pages, published, snippets
from tests.test_dev_lifecycle import Dev, dev_env

VIEM, PERMISSIONLESS, ETHERS = "2.57.20", "0.4.1", "6.17.0"
# The fixed ports the pages use besides chaingate dev's and its anvil's: two webhook receivers,
# a port where nothing listens, and the operator guide's own `chaingate serve`.
OTHER_PORTS = (9000, 9001, 9002, 8100)


def _node_modules() -> Path:
    root = npm_install(
        f"docs-snippets-viem{VIEM}-permissionless{PERMISSIONLESS}-ethers{ETHERS}",
        [f"viem@{VIEM}", f"permissionless@{PERMISSIONLESS}", f"ethers@{ETHERS}"],
        "node_modules/ethers/package.json",
        what="the documentation's JavaScript clients",
        announce=lambda _: None,
    )
    return root / "node_modules"


def _free_ports(count: int) -> list[int]:
    """Distinct free ports: each socket stays bound until all are picked (one at a time, the
    kernel may hand the same port out twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


class Docs:
    """The server the pages talk to, and how to give a page its own terminal."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        home = tmp / "home"
        data_dir = home / ".local" / "share" / "chaingate" / "dev"
        data_dir.mkdir(parents=True)
        anvil_port, *others = _free_ports(1 + len(OTHER_PORTS))
        self.dev = Dev(tmp, data_dir, anvil_port=anvil_port)
        self.node_modules = _node_modules()
        mapping = {8000: self.dev.port, 8545: self.dev.anvil_port}
        mapping |= dict(zip(OTHER_PORTS, others, strict=True))
        self.ports = snippets.Ports(mapping)
        self.env = dev_env(tmp)
        bin_dir = str(Path(sys.executable).parent)
        self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "")
        self.env.pop("VIRTUAL_ENV", None)

    def session(self, page: str) -> snippets.Session:
        workdir = self.tmp / "pages" / page.replace("/", "_").removesuffix(".md")
        workdir.mkdir(parents=True)
        (workdir / "node_modules").symlink_to(self.node_modules, target_is_directory=True)
        return snippets.Session(workdir, dict(self.env), self.ports)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docs]:
    served = Docs(tmp_path_factory.mktemp("docs"))
    try:
        served.dev.up()
        yield served
    finally:
        served.dev.kill()


@pytest.mark.parametrize("page", snippets.pages())
def test_the_page_can_be_followed(docs: Docs, page: str) -> None:
    session = docs.session(page)
    try:
        for block in snippets.blocks(page):
            session.run(block)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- left running:\n{session.background_output()[-4000:]}"
            f"\n--- chaingate dev said:\n{chr(10).join(docs.dev.said[-15:])}"
        ) from None
    finally:
        session.close()


def test_the_rest_reference_is_what_the_server_publishes(docs: Docs) -> None:
    served = httpx.get(f"{docs.dev.url}/v1/openapi.json").json()
    published = json.loads((pages.REFERENCE / "openapi.json").read_text())
    assert served == published, "docs/reference/openapi.json: run `python -m tests.docsgen`"
    text = (pages.REFERENCE / "rest.md").read_text()
    for path, operations in served["paths"].items():
        for method in operations:
            assert f"### {method.upper()} `{path}`" in text, (method, path)


def test_the_metrics_reference_has_every_family_the_server_exports(docs: Docs) -> None:
    token = docs.dev.wait_for(r"Bearer (dev-admin-[\w-]+)").group(1)
    exported = httpx.get(
        f"{docs.dev.url}/metrics", headers={"Authorization": f"Bearer {token}"}
    ).text
    served = {name for name, _kind, _help in published.families(exported)}
    text = (pages.REFERENCE / "metrics.md").read_text()
    missing = sorted(name for name in served if f"| `{name}` |" not in text)
    assert len(served) > 50
    assert not missing, missing
