"""``python -m tests.docsgen``: write every generated reference page under docs/reference/."""

from __future__ import annotations

from tests.docsgen import pages

generated = {name: render() for name, render in pages.PAGES.items()}
changed = pages.stale(generated)
pages.write(generated)
print("changed:", ", ".join(changed) or "none")
