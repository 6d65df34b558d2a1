"""mkdocs hook: replace ``<!-- conform-checks -->`` with the table of conformance checks, read from the code.

So the documented list is always the list ``pjrt-plugins conform`` runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- conform-checks -->"


#: The core's sources, importable without installing the package (docs/requirements.txt has its dependencies).
CORE = Path(__file__).resolve().parents[2] / "core"


def checks_table() -> str:
    os.environ.setdefault("PJRT_PLUGINS_AUTOLOAD", "0")  # the table needs no plugin
    if str(CORE) not in sys.path:
        sys.path.insert(0, str(CORE))
    from pjrt_plugins.conform import check_plan
    from pjrt_plugins.conform._runner import EXIT_CHECK

    rows = ["| check | what it proves |", "|---|---|"]
    dtypes = []
    for check_id, title in [*check_plan(), EXIT_CHECK]:
        if check_id.startswith("buffers.") and title.endswith("buffers round-trip bit-exact"):
            if not dtypes:
                rows.append("| `buffers.<dtype>` | DTYPES |")
            dtypes.append(check_id.removeprefix("buffers."))
            continue
        rows.append(f"| `{check_id}` | {title} |")
    listing = "a buffer of each dtype round-trips bit-exact, and the plugin reports its shape, type and device: " + ", ".join(
        f"`{d}`" for d in dtypes
    )
    return "\n".join(rows).replace("DTYPES", listing)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, checks_table())
    return markdown
