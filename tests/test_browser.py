"""A browser dApp on chaingate: headless Chromium (Debian's ``chromium``) driven by Playwright.

A page served from loopback calls chaingate with viem — over HTTP (a CORS preflight, then the
POST with ``X-API-Key``) and over a WebSocket (``?apiKey=``) — with a key whose origin
allowlist names the page's origin.  From that origin the page shows the block number both ways;
the same page from another origin (``localhost`` instead of ``127.0.0.1``: another origin to a
browser) is refused both ways.

viem is bundled for the browser by esbuild; playwright-core, esbuild and viem are pinned npm
packages installed once into chaingate's cache (``chaingate.devnet.npm``), as the other Node
clients are.  Nothing here is stubbed: a real browser, a real gateway, real anvil.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from chaingate.auth import admin
from chaingate.auth.store import AuthRows
from chaingate.devnet.anvil import AnvilProcess, rpc_call
from chaingate.devnet.npm import npm_install
from chaingate.twins import Impl
from tests.test_auth import auth_settings, start_auth

PLAYWRIGHT = "1.65.1"
ESBUILD = "0.28.2"
VIEM = "2.57.20"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = Path(__file__).parent / "node" / "browser"
DRIVER = Path(__file__).parent / "node" / "browser_page.mjs"

# Skipped loudly where chromium or Node.js is absent, except under CI=true, where their
# absence is a failure (.ci/run installs them).
pytestmark = pytest.mark.skipif(
    (not Path(CHROMIUM).exists() or shutil.which("node") is None)
    and os.environ.get("CI") != "true",
    reason="needs Debian's chromium and Node.js (apt-get install -y chromium nodejs npm)",
)


def node_modules() -> Path:
    root = npm_install(
        f"browser-tests-playwright-core{PLAYWRIGHT}-esbuild{ESBUILD}-viem{VIEM}",
        [f"playwright-core@{PLAYWRIGHT}", f"esbuild@{ESBUILD}", f"viem@{VIEM}"],
        "node_modules/playwright-core/package.json",
        what=f"playwright-core {PLAYWRIGHT}, esbuild {ESBUILD} and viem {VIEM}",
        announce=lambda _: None,
    )
    return root / "node_modules"


def build_site(workdir: Path) -> Path:
    """The page and viem bundled for the browser, in ``workdir/site``; node_modules beside."""
    (workdir / "node_modules").symlink_to(node_modules(), target_is_directory=True)
    site = workdir / "site"
    site.mkdir()
    shutil.copyfile(PAGES / "index.html", site / "index.html")
    shutil.copyfile(PAGES / "viem-entry.mjs", workdir / "viem-entry.mjs")
    subprocess.run(
        [
            shutil.which("node") or "node",
            "node_modules/esbuild/bin/esbuild",
            "viem-entry.mjs",
            "--bundle",
            "--format=esm",
            "--platform=browser",
            "--minify",
            f"--outfile={site / 'viem.js'}",
        ],
        cwd=workdir,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return site


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def site_port(tmp_path: Path) -> Iterator[int]:
    """A static file server on loopback serving the page (both 127.0.0.1 and localhost)."""
    site = build_site(tmp_path)
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run_browser(workdir: Path, urls: list[str]) -> dict[str, dict[str, Any]]:
    script = workdir / DRIVER.name
    shutil.copyfile(DRIVER, script)
    done = subprocess.run(
        [shutil.which("node") or "node", str(script), CHROMIUM, *urls],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (
        f"browser run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def test_browser_page_on_an_allowed_origin_works_and_another_is_refused(
    nursery: trio.Nursery, impl: Impl, anvil: AnvilProcess, tmp_path: Path, site_port: int
) -> None:
    stack = await start_auth(
        nursery, impl, auth_settings(anvil, f"sqlite://{tmp_path}/store.db", tmp_path)
    )
    key, key_id = await stack.key()
    allowed = f"http://127.0.0.1:{site_port}"
    await admin.update_allowlists(AuthRows(stack.store), key_id, {"origins": [allowed]}, set())
    await stack.handle.gateway.keys.refresh()  # type: ignore[union-attr]
    gateway = stack.handle.base  # http://127.0.0.1:<port>: a cross-origin call from the page
    query = f"/index.html?key={key}&gateway={gateway}"
    pages = [allowed + query, f"http://localhost:{site_port}" + query]
    head = int(str(rpc_call(anvil.url, "eth_blockNumber")), 16)
    results = await trio.to_thread.run_sync(run_browser, tmp_path, pages)
    good, bad = results[pages[0]], results[pages[1]]
    assert good["http"] == str(head), good
    assert good["ws"] == str(head), good
    assert bad["http"].startswith("error:"), bad
    assert bad["ws"].startswith("error:"), bad
    # The gateway refused the second origin itself (not a browser quirk): 403 for the POST and
    # for the WebSocket handshake, both named in the access log.
    refusals = [line for line in stack.handle.log_lines() if line.get("status") == 403]
    assert len(refusals) >= 2, stack.handle.log_lines()
    assert stack.handle.gateway.gate.refusals[(403, "allowlist")] >= 2  # type: ignore[attr-defined]
