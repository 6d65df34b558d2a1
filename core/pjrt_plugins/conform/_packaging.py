"""Whether a plugin's PJRT library ships inside a pure-Python wheel (``py3-none-any``).

Such a wheel claims to run on every platform, so pip installs its one native library on
machines that cannot load it. Read from installed metadata only; nothing is opened.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

#: How the warning starts, in the report's notes and in the CLI's output.
WARNING_PREFIX = "warning:"


def _wheel_tags(dist: importlib.metadata.Distribution) -> tuple[bool, list[str]]:
    """(Root-Is-Purelib, tags) from the distribution's WHEEL file (absent for non-wheel installs)."""
    text = dist.read_text("WHEEL") or ""
    pure = any(line.lower().replace(" ", "") == "root-is-purelib:true" for line in text.splitlines())
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.lower().startswith("tag:")]
    return pure, tags


def pure_wheel_warning(distribution: str | None, library_path: str | os.PathLike[str] | None) -> str | None:
    """A warning when ``library_path`` is a file of ``distribution`` installed from a pure-Python wheel, else ``None``."""
    if not distribution or not library_path:
        return None
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    library = Path(library_path).resolve()
    owned = any(Path(str(dist.locate_file(f))).resolve() == library for f in dist.files or [])
    if not owned:
        return None  # the library comes from elsewhere (another wheel, the system, an editable checkout)
    pure, tags = _wheel_tags(dist)
    if not pure and not any(tag.endswith("-any") for tag in tags):
        return None
    return (
        f"{WARNING_PREFIX} the PJRT library {library.name} ships inside {distribution}'s pure-Python wheel "
        f"({', '.join(tags) or 'Root-Is-Purelib: true'}), which pip installs on every platform; build a "
        "platform wheel (py3-none-<platform>) as the plugin template's setup.py does, then `auditwheel repair` it"
    )
