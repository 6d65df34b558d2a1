"""The checksum a build records next to the fast-path library, checked before the library is opened.

Opening a library runs its constructors, and calling it runs its code: a damaged file (flipped
bytes) or another file in its place (one whose constructor aborts) would end the process at
``import pjrt_plugins.runtime``. Its build writes ``<library>.crc32`` (the size and CRC-32 of
the file), and the runtime opens the library only when the file still matches: about 20 us for
the library's 24 KB, against the tens of milliseconds a child process would take to try it.
A check against damage, not against an attacker who can write the package's files.

Standard library only: the build (``_build_fastpath``) loads this file by path.
"""

from __future__ import annotations

import zlib
from pathlib import Path

SUFFIX = ".crc32"


def sidecar(library: Path) -> Path:
    """Where the checksum of ``library`` is kept."""
    return library.with_name(library.name + SUFFIX)


def describe(library: Path) -> str:
    """The checksum line of ``library`` as it is now: ``"size <bytes> crc32 <hex>"``."""
    data = library.read_bytes()
    return f"size {len(data)} crc32 {zlib.crc32(data):08x}"


def record(library: Path) -> Path:
    """Write the checksum of the freshly built ``library`` next to it; returns the checksum file."""
    path = sidecar(library)
    path.write_text(describe(library) + "\n", encoding="ascii")
    return path


def problem(library: Path) -> str | None:
    """Why ``library`` is not the file its build recorded, or ``None`` when it is."""
    recorded = sidecar(library)
    try:
        expected = recorded.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return f"its build recorded no checksum ({recorded.name} is missing or unreadable)"
    try:
        actual = describe(library)
    except OSError as exc:
        return f"it cannot be read ({exc})"
    if actual != expected:
        return f"it is damaged or was replaced: it has {actual}, its build recorded {expected}"
    return None
