"""mkdocs hook: render doctest examples (``>>>`` lines and their output) in docstrings as code.

Docstrings in this project use plain doctest blocks; Markdown would otherwise read
``[x][-2:]`` in them as reference links. Touches only runs of lines that start with ``>>>``.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_PROMPT = re.compile(r"^(\s*)>>> ")


class DoctestBlocks(Preprocessor):
    """Wrap each doctest block (prompt lines plus the output up to a blank line) in a pycon fence."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        in_fence = False
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith(("```", "~~~")):
                in_fence = not in_fence
            match = None if in_fence else _PROMPT.match(line)
            if match is None:
                out.append(line)
                i += 1
                continue
            indent = match.group(1)
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            if out and out[-1].strip():
                out.append("")
            out.extend([f"{indent}```pycon", *(indent + b for b in block), f"{indent}```", ""])
        return out


class DoctestBlocksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 - Markdown's API name
        # Before pymdownx.superfences (priority 32) turns the fences into code blocks.
        md.preprocessors.register(DoctestBlocks(md), "doctest_blocks", 40)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(DoctestBlocksExtension())
    return config
