"""The documentation's snippets: found in the Markdown, run as a reader would run them.

A page is read top to bottom like a terminal session: its ``bash``, ``python`` and ``js``
blocks run in order, in one working directory of its own, against the ``chaingate dev`` the
test started.  A shell variable, a shell function and the current directory carry over to the
next block (as in a terminal); Python and JavaScript blocks get the environment too.

What a block's fence and the line before it can say:

* ```` ```python title="receiver.py" ```` — a file the page writes (saved into the working
  directory, run by a later block); ``toml`` and ``json`` blocks with a title too (checked to
  parse first).  A block without a title runs.
* ```` ```text title="Output" ```` right after a block that runs — what it must print; ``...``
  stands for anything (a hash, an address, a number that changes).
* ``<!-- run: skip (why) -->`` on the line before a block — not run (a real mainnet URL, a
  second machine), only checked to parse.
* ``<!-- run: background, ready=TEXT -->`` — started and left running for the rest of the page
  (a receiver, a second server), once it printed TEXT.

The pages say ``127.0.0.1:8000`` (chaingate dev), ``127.0.0.1:8545`` (its anvil with
``--anvil-port 8545``) and other fixed ports; the runner's servers listen on free ports, so
those (``host:port``, and a TOML file's ``port = N``) are rewritten in every block before it
runs (``Ports``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Pages whose blocks are records or generated examples, not steps to follow.
NOT_RUN = ("decisions", "reference", "mkdocs")
RUNS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python",
        "js": "node", "javascript": "node"}  # fmt: skip
WRITES = {"python", "py", "js", "javascript", "toml", "json", "bash", "sh", "text"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*run:\s*(?P<what>.*?)\s*-->\s*$")
_TITLE = re.compile(r'title="([^"]+)"')
BLOCK_TIMEOUT = 180.0


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    title: str = ""
    directive: str = ""
    expected: str | None = None  # the Output block after it, if any

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def skipped(self) -> bool:
        return self.directive.startswith("skip")

    @property
    def background(self) -> bool:
        return self.directive.startswith("background")

    @property
    def ready(self) -> str:
        match = re.search(r"ready=(.+)$", self.directive)
        return match.group(1).strip() if match else ""


def pages() -> list[str]:
    """Every page with snippets to run, relative to docs/."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        relative = path.relative_to(DOCS).as_posix()
        if relative.split("/", 1)[0] not in NOT_RUN:
            found.append(relative)
    return found


def blocks(page: str) -> list[Block]:
    lines = (DOCS / page).read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match or not match.group("info").strip():
            index += 1
            continue
        info = match.group("info").strip()
        lang = info.split()[0].lower()
        title_match = _TITLE.search(info)
        title = title_match.group(1) if title_match else ""
        indent, fence = len(match.group("indent")), match.group("fence")
        body: list[str] = []
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            body.append(lines[end][indent:])
            end += 1
        before = lines[index - 1] if index > 0 else ""
        directive = _DIRECTIVE.match(before)
        block = Block(
            page, index + 1, lang, "\n".join(body) + "\n", title,
            directive.group("what") if directive else "",
        )  # fmt: skip
        if lang == "text" and title == "Output" and found and found[-1].expected is None:
            previous = found[-1]
            between = lines[previous.line : index]
            if previous.lang in RUNS and not previous.title and _adjacent(between):
                previous.expected = block.code
        found.append(block)
        index = end + 1
    return found


def _adjacent(between: list[str]) -> bool:
    """Only the previous block's own lines and blank lines stand between two blocks."""
    closed = False
    for line in between:
        if _FENCE.match(line) and not line.strip().strip("`"):
            closed = True
            continue
        if closed and line.strip():
            return False
    return True


def output_matches(expected: str, actual: str) -> bool:
    """The block printed what the page shows (``...`` matches anything, across lines)."""
    pattern = "\n".join(
        ".*?".join(re.escape(part) for part in line.rstrip().split("..."))
        for line in expected.strip("\n").splitlines()
    )
    cleaned = "\n".join(line.rstrip() for line in actual.strip("\n").splitlines())
    return re.fullmatch(pattern, cleaned, re.DOTALL) is not None


@dataclass
class Ports:
    """The fixed addresses the pages use, and where the runner's servers really are."""

    mapping: dict[int, int]

    def apply(self, text: str) -> str:
        if not self.mapping:
            return text

        def swap(match: re.Match[str]) -> str:
            return f"{match.group(1)}:{self.mapping[int(match.group(2))]}"

        def swap_setting(match: re.Match[str]) -> str:
            return f"{match.group(1)}{self.mapping[int(match.group(2))]}"

        wanted = "|".join(str(port) for port in self.mapping)
        text = re.sub(rf"(127\.0\.0\.1|localhost):({wanted})\b", swap, text)
        # A configuration file's `port = 8100` too.
        return re.sub(rf"^(\s*port\s*=\s*)({wanted})\b", swap_setting, text, flags=re.M)


@dataclass
class Session:
    """One page's terminal: its working directory, its environment, what it left running."""

    workdir: Path
    env: dict[str, str]
    ports: Ports
    python: str = sys.executable  # what `python` blocks run with
    background: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    counter: int = 0

    def run(self, block: Block) -> str:
        """Run (or save, or check) one block; its output.  AssertionError when it fails."""
        text = self.ports.apply(block.code)
        if block.skipped:
            self._check_parses(block, text)
            return ""
        if block.title:
            self._check_parses(block, text)
            (self._cwd() / block.title).write_text(text)  # where the reader stands
            return ""
        if block.lang not in RUNS:
            return ""
        if block.background:
            return self._start(block, text)
        output = self._execute(block, text)
        if block.expected is not None:
            expected = self.ports.apply(block.expected)
            assert output_matches(expected, output), (
                f"{block.where}: the page shows\n{expected}\nbut the block printed\n{output}"
            )
        return output

    def _command(self, block: Block, text: str) -> list[str]:
        self.counter += 1
        kind = RUNS[block.lang]
        if kind == "python":
            script = self.workdir / f".snippet-{self.counter}.py"
            script.write_text(text)
            return [self.python, str(script)]
        if kind == "node":
            script = self.workdir / f".snippet-{self.counter}.mjs"
            script.write_text(text)
            return [_which("node"), str(script)]
        script = self.workdir / f".snippet-{self.counter}.sh"
        state = self.workdir / ".snippet-env"
        functions = self.workdir / ".snippet-functions"
        script.write_text(
            # A variable or a function defined in one block is there in the next, as in one
            # terminal.
            f'set -a -eo pipefail\n[ -f "{functions}" ] && source "{functions}"\n'
            + text
            + f'\nenv -0 > "{state}"\npwd > "{state}.cwd"\ndeclare -f > "{functions}"\n'
        )
        return [_which("bash"), str(script)]

    def _cwd(self) -> Path:
        saved = self.workdir / ".snippet-env.cwd"
        return Path(saved.read_text().strip()) if saved.exists() else self.workdir

    def _execute(self, block: Block, text: str) -> str:
        command = self._command(block, text)
        try:
            done = subprocess.run(
                command,
                cwd=self._cwd(),
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=BLOCK_TIMEOUT,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as exc:
            shown = (exc.output or b"").decode(errors="replace")
            raise AssertionError(
                f"{block.where}: no end after {BLOCK_TIMEOUT:g} s\n{shown}"
            ) from None
        output = done.stdout.decode(errors="replace")
        assert done.returncode == 0, (
            f"{block.where}: exit status {done.returncode}\n"
            f"--- block:\n{text}\n--- output:\n{output}"
        )
        if RUNS[block.lang] == "bash":
            self._keep_environment()
        return output

    def _keep_environment(self) -> None:
        state = self.workdir / ".snippet-env"
        if not state.exists():
            return
        kept = {}
        for entry in state.read_bytes().split(b"\0"):
            name, sep, value = entry.decode(errors="replace").partition("=")
            if sep and name not in ("PWD", "OLDPWD", "SHLVL", "_"):
                kept[name] = value
        self.env = kept

    def _start(self, block: Block, text: str) -> str:
        log = self.workdir / f".background-{block.line}.log"
        command = self._command(block, text)
        with open(log, "wb") as sink:
            process = subprocess.Popen(
                command,
                cwd=self._cwd(),
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((process, log))
        wanted = self.ports.apply(block.ready)
        deadline = time.monotonic() + 90
        while wanted and wanted not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{block.where}: never printed {wanted!r}\n{log.read_text(errors='replace')}"
                )
            time.sleep(0.1)
        return ""

    def background_output(self) -> str:
        return "\n".join(log.read_text(errors="replace") for _p, log in self.background)

    def close(self) -> None:
        """Stop what the page left running (its whole process group), newest first."""
        for process, _log in reversed(self.background):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()

    def _check_parses(self, block: Block, text: str) -> None:
        kind = RUNS.get(block.lang, block.lang)
        if kind == "python":
            compile(text, block.where, "exec")
        elif kind == "bash":
            done = subprocess.run([_which("bash"), "-n"], input=text.encode(), capture_output=True)
            assert done.returncode == 0, f"{block.where}: {done.stderr.decode()}"
        elif kind == "node":
            script = self.workdir / f".check-{block.line}.mjs"
            script.write_text(text)
            done = subprocess.run([_which("node"), "--check", str(script)], capture_output=True)
            assert done.returncode == 0, f"{block.where}: {done.stderr.decode()}"
        elif kind == "toml":
            tomllib.loads(text)
        elif kind == "json" and "…" not in text:
            json.loads(text)


def _which(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is needed to run the documentation's snippets"
    return found
