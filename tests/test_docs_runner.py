"""The snippet runner reads the marks a page makes, and its checks can fail.

tests/test_docs_snippets.py trusts it to find every block, to tie an Output block to the block
before it, and to compare what a block printed with what the page shows; these tests hold it
to that without a server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docsgen import snippets

PAGE = """\
# A page

```bash
echo one
```

```text title="Output"
one
```

Some prose, then a block whose output is not shown:

```bash
echo two
```

Prose between a block and an Output block: that Output belongs to no block.

```text title="Output"
three
```

<!-- run: skip (a second machine) -->
```bash
ssh elsewhere
```

```python title="hello.py"
print("hello")
```

<!-- run: background, ready=listening -->
```bash
python hello.py
```

  ```js
  console.log("indented, in a list")
  ```
"""


@pytest.fixture
def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(snippets, "DOCS", tmp_path)
    (tmp_path / "guide.md").write_text(PAGE)
    return "guide.md"


def test_every_block_is_found_with_its_marks(page: str) -> None:
    found = snippets.blocks(page)
    assert [(b.lang, b.title) for b in found] == [
        ("bash", ""),
        ("text", "Output"),
        ("bash", ""),
        ("text", "Output"),
        ("bash", ""),
        ("python", "hello.py"),
        ("bash", ""),
        ("js", ""),
    ]
    first, _, second, _, skipped, saved, background, indented = found
    assert first.expected == "one\n"
    assert second.expected is None, "an Output block after prose belongs to no block"
    assert skipped.skipped and not skipped.background
    assert background.background and background.ready == "listening"
    assert saved.title == "hello.py" and saved.code == 'print("hello")\n'
    assert indented.code == 'console.log("indented, in a list")\n'


@pytest.mark.parametrize(
    ("expected", "printed", "matches"),
    [
        ("one\n", "one\n", True),
        ("one\n", "one\ntwo\n", False),  # all of it, not a prefix
        ("0x...\n", "0x7a69\n", True),
        ('{"id":1,"result":"..."}', '{"id":1,"result":"0x1"}', True),
        ('{"id":1,"result":"..."}', '{"id":2,"result":"0x1"}', False),
        ("a\n...\nz\n", "a\nb\nc\nz\n", True),  # ... spans lines
        ("status 1\n", "status 0\n", False),
        ("trailing  \n", "trailing\n", True),  # trailing spaces do not count
    ],
)
def test_output_is_compared_whole_with_ellipses(expected: str, printed: str, matches: bool) -> None:
    assert snippets.output_matches(expected, printed) is matches


def test_fixed_ports_are_rewritten_to_the_runner_s() -> None:
    ports = snippets.Ports({8000: 41000, 9000: 41001})
    assert ports.apply("curl http://127.0.0.1:8000/v1 localhost:9000 127.0.0.1:80001") == (
        "curl http://127.0.0.1:41000/v1 localhost:41001 127.0.0.1:80001"
    )
    assert ports.apply("[server]\nport = 8000\nbacklog = 8000\n") == (
        "[server]\nport = 41000\nbacklog = 8000\n"
    )


def test_a_block_that_prints_something_else_fails(page: str, tmp_path: Path) -> None:
    session = snippets.Session(tmp_path, {"PATH": "/usr/bin:/bin"}, snippets.Ports({}))
    block = snippets.Block(page, 1, "bash", "echo two\n", expected="one\n")
    with pytest.raises(AssertionError, match="the page shows"):
        session.run(block)
    failing = snippets.Block(page, 1, "bash", "false\n")
    with pytest.raises(AssertionError, match="exit status 1"):
        session.run(failing)


def test_a_shell_variable_function_and_directory_carry_to_the_next_block(tmp_path: Path) -> None:
    session = snippets.Session(tmp_path, {"PATH": "/usr/bin:/bin"}, snippets.Ports({}))
    first = 'mkdir -p sub && cd sub\nNAME=kept\nsay() { echo "$1 in $(basename $PWD)"; }\n'
    session.run(snippets.Block("p.md", 1, "bash", first))
    printed = session.run(snippets.Block("p.md", 2, "bash", 'say "$NAME"\n'))
    assert printed == "kept in sub\n"


def test_a_skipped_block_must_still_parse(page: str, tmp_path: Path) -> None:
    session = snippets.Session(tmp_path, {"PATH": "/usr/bin:/bin"}, snippets.Ports({}))
    broken = snippets.Block(page, 1, "python", "def (:\n", directive="skip (elsewhere)")
    with pytest.raises(SyntaxError):
        session.run(broken)
