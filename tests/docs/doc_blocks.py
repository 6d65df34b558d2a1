"""Find the code blocks of the README and the docs, and read the ``docs-test`` marker before each.

A block in a runnable language (python, console, sh) runs in tests/docs/test_doc_blocks.py
unless an HTML comment on the line before its fence says why it cannot run here:
``<!-- docs-test: skip needs a GPU -->``. docs/contributing.md documents the marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The documents users read: the README, the site (not the developers' notes), each backend's README.
DOCUMENT_GLOBS = ("README.md", "docs/**/*.md", "plugins/*/README.md")
EXCLUDED_DIRS = ("docs/notes",)

PYTHON = frozenset({"python", "py", "python3"})
#: Blocks of shell commands after a ``$ `` prompt, with their output between them.
CONSOLE = frozenset({"console", "shell-session"})
#: Whole-block shell scripts.
SCRIPT = frozenset({"sh", "bash", "shell"})
RUNNABLE = PYTHON | CONSOLE | SCRIPT

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*\{?\s*\.?(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<directive>.*?)\s*-->\s*$")
#: Commands that would change the test's own environment: never run unmarked.
_INSTALLS = re.compile(r"\bpip\s+(install|uninstall)\b")


class MarkerError(ValueError):
    """A ``docs-test`` marker that cannot be read (unknown directive, missing reason, no block after it)."""


@dataclass(frozen=True)
class Block:
    path: Path  # relative to the repository
    line: int  # 1-based line of the opening fence
    language: str
    text: str  # the block's body, indentation removed
    skip: str | None  # the reason given by a ``docs-test: skip`` marker

    @property
    def id(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE

    def script(self) -> str:
        """The block as a program: Python as it is; for a console block, its ``$`` commands only."""
        if self.language not in CONSOLE:
            return self.text
        commands: list[str] = []
        continued = False
        for line in self.text.splitlines():
            if continued:
                commands.append(line)
            elif line.startswith("$ "):
                commands.append(line[2:])
            else:
                continue  # output
            continued = line.rstrip().endswith("\\")
        return "\n".join(commands) + "\n"

    def installs_packages(self) -> bool:
        return self.language in CONSOLE | SCRIPT and _INSTALLS.search(self.script()) is not None


def documents(root: Path = REPO) -> list[Path]:
    """Every Markdown file users read, relative to ``root``."""
    found: set[Path] = set()
    for pattern in DOCUMENT_GLOBS:
        for path in root.glob(pattern):
            relative = path.relative_to(root)
            if not any(relative.as_posix().startswith(d + "/") for d in EXCLUDED_DIRS):
                found.add(relative)
    return sorted(found)


def _parse_marker(directive: str, where: str) -> str:
    """The skip reason a marker gives (the only directive so far)."""
    verb, _, reason = directive.partition(" ")
    if verb.rstrip(":") != "skip":
        raise MarkerError(f"{where}: unknown docs-test directive {directive!r}; write 'docs-test: skip REASON'")
    reason = reason.strip()
    if not reason:
        raise MarkerError(f"{where}: 'docs-test: skip' needs a reason, e.g. 'docs-test: skip needs a GPU'")
    return reason


def blocks(path: Path, root: Path = REPO) -> list[Block]:
    """The fenced code blocks of one document, each with the skip reason of the marker before it."""
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: tuple[int, str] | None = None  # (line, reason) of a marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if marker:
            pending = (i + 1, _parse_marker(marker.group("directive"), f"{path}:{i + 1}"))
        elif fence:
            indent, closing = fence.group("indent"), fence.group("fence")
            body: list[str] = []
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(closing):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            language = fence.group("lang").lower()
            found.append(Block(path, i + 1, language, "\n".join(body) + "\n", pending[1] if pending else None))
            if pending and language not in RUNNABLE:
                raise MarkerError(f"{path}:{pending[0]}: a docs-test marker before a {language or 'plain'} block, which never runs")
            pending = None
            i = j
        elif line.strip() and pending:
            raise MarkerError(f"{path}:{pending[0]}: a docs-test marker must be on the line right before a code fence")
        i += 1
    if pending:
        raise MarkerError(f"{path}:{pending[0]}: a docs-test marker with no code block after it")
    return found


def all_blocks(root: Path = REPO) -> list[Block]:
    return [block for path in documents(root) for block in blocks(path, root)]
