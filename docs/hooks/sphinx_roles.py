"""mkdocs hook: render the Sphinx roles of our docstrings (``:func:`name```) as code, not as literal text.

The docstrings keep the roles (they read well in ``help()`` and any Sphinx build) instead of
being rewritten across every module; this turns ``:role:`~pkg.mod.name``` into `` `name` ``,
``:role:`pkg.mod.name``` into `` `pkg.mod.name` `` and ``:role:`title <target>``` into `` `title` ``,
outside code blocks.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const|type):`(?P<target>[^`]+)`")


def render_role(match: re.Match[str]) -> str:
    target = match.group("target").strip()
    titled = re.fullmatch(r"(?P<title>.+?)\s*<[^>]+>", target)
    if titled:
        return f"`{titled.group('title')}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRoles(Preprocessor):
    """Replace Sphinx cross-reference roles by code spans, leaving fenced code alone."""

    def run(self, lines: list[str]) -> list[str]:
        out, in_fence = [], False
        for line in lines:
            if line.lstrip().startswith(("```", "~~~")):
                in_fence = not in_fence
            out.append(line if in_fence else _ROLE.sub(render_role, line))
        return out


class SphinxRolesExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 - Markdown's API name
        md.preprocessors.register(SphinxRoles(md), "sphinx_roles", 41)  # before the doctest blocks (40)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(SphinxRolesExtension())
    return config
