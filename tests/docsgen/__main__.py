"""``python -m tests.docsgen``: write the references that need no server.

``python -m tests.docsgen --live URL ADMIN_TOKEN`` also writes the ones read from a running
server (the REST API and the metrics), e.g. from a ``chaingate dev`` started with
``CHAINGATE_OBSERVABILITY__ADMIN_TOKEN`` set.  ``CHAINGATE_DOCS_UPDATE=1`` makes
tests/test_docs_snippets.py do the same from the ``chaingate dev`` it starts.
"""

from __future__ import annotations

import argparse

import httpx

from tests.docsgen import pages


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.docsgen")
    parser.add_argument("--live", nargs=2, metavar=("URL", "ADMIN_TOKEN"))
    args = parser.parse_args()
    generated = {name: render() for name, render in pages.STATIC.items()}
    if args.live:
        url, token = args.live
        openapi = httpx.get(f"{url}/v1/openapi.json").json()
        exposition = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
        generated |= pages.live_pages(openapi, exposition)
    changed = pages.stale(generated)
    pages.write(generated)
    print("written:", ", ".join(sorted(generated)), "| changed:", ", ".join(changed) or "none")


main()
