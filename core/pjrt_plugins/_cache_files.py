"""The compile cache directory as files: its entries, their size and last use, least-recently-used eviction.

Knows the entry layout (a magic line, the header's length, a JSON header, the executable)
but nothing of keys, plugins or torch, so ``pjrt-plugins cache`` works without loading
them. Never follows a link, never blocks on a FIFO, never reads more than an entry may hold.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from .errors import CompileCacheWarning

logger = logging.getLogger(__name__)

#: Environment variable naming the directory where compiled executables persist across processes.
CACHE_DIR_ENV = "PJRT_PLUGINS_CACHE_DIR"
#: Environment variable bounding the directory's total size (bytes, or with a unit: ``500M``, ``10G``, ``2GiB``).
MAX_SIZE_ENV = "PJRT_PLUGINS_CACHE_MAX_SIZE"
#: The bound when neither :data:`MAX_SIZE_ENV` nor ``set_cache_max_size`` says otherwise: 10 GiB.
DEFAULT_MAX_SIZE = 10 << 30
MAGIC = b"pjrt-plugins compile cache entry\n"
SUFFIX = ".pjrt-executable"
TMP_PREFIX = ".tmp-"
#: A header (key and metadata) is a few kB; anything claiming more is not one of ours.
MAX_HEADER_BYTES = 1 << 20
#: A temporary file this old was left by a writer that died: eviction and ``clear`` remove it.
STALE_TMP_S = 3600.0

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
_SIZE = re.compile(r"^\s*(?P<number>\d+(\.\d*)?|\.\d+)\s*(?P<unit>(k|m|g|t)i?)?b?\s*$", re.IGNORECASE)
_warned_settings: set[str] = set()


class EntryFileError(Exception):
    """An entry that cannot be used as it is (the message says why); the caller ignores it."""


class EntryFile(NamedTuple):
    """One entry on disk: ``last_used`` is its modification time, renewed by every load."""

    path: Path
    size: int
    last_used: float


def parse_size(value: int | str) -> int:
    """Bytes from ``value``: an int, or text such as ``1000000``, ``500M``, ``10G``, ``1.5GiB`` (k/M/G/T powers of 1000, Ki/Mi/Gi/Ti of 1024).

    Raises ValueError for anything that is not a size above zero.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"a cache size is a number of bytes or text like '10G', not {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"{value!r} is not a size: write bytes, or a number with k, M, G, T (or KiB, MiB, GiB, TiB)")
        scaled = float(match.group("number")) * _UNITS[(match.group("unit") or "").lower()]
        if not math.isfinite(scaled) or scaled >= 1 << 63:
            raise ValueError(f"{value!r} is too large a size")
        size = int(scaled)
    if size <= 0:
        raise ValueError(f"a cache size must be above zero, not {value!r}; to keep executables in memory only, set no cache directory")
    return size


def max_size_from_environment() -> int:
    """``$PJRT_PLUGINS_CACHE_MAX_SIZE``, else :data:`DEFAULT_MAX_SIZE` (a bad value is warned about once and not used)."""
    raw = os.environ.get(MAX_SIZE_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(raw)
    except ValueError as exc:
        if raw not in _warned_settings:
            _warned_settings.add(raw)
            warnings.warn(
                f"{MAX_SIZE_ENV}={raw!r}: {exc}; the compile cache keeps its default bound of {format_size(DEFAULT_MAX_SIZE)}",
                CompileCacheWarning,
                stacklevel=3,
            )
        return DEFAULT_MAX_SIZE


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_entry(path: Path, limit: int) -> bytes:
    """The bytes of the entry at ``path``, at most ``limit`` of them.

    FileNotFoundError when there is none; :class:`EntryFileError` when it is a link, a
    FIFO, a directory or anything but a regular file, is not this user's private file, or
    is larger than ``limit``. Opened with ``O_NOFOLLOW | O_NONBLOCK``, checked on the open
    descriptor, never read past its size.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        try:
            kind = _kind(os.lstat(path).st_mode)
        except OSError:
            kind = "unreadable"
        raise EntryFileError(f"it is {kind} ({exc.strerror})" if kind != "unreadable" else str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EntryFileError(f"it is {_kind(st.st_mode)}, not a file this cache wrote")
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise EntryFileError("not a private file of this user")
        if st.st_size > limit:
            raise EntryFileError(f"it is {format_size(st.st_size)}, more than the cache may hold ({format_size(limit)})")
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def split_entry(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, executable bytes) of an entry; ValueError saying what is wrong with it."""
    if not data.startswith(MAGIC):
        raise ValueError("it is not an entry of this cache format")
    start = len(MAGIC) + 8
    size = int.from_bytes(data[len(MAGIC):start], "little")
    if len(data) < start or len(data) < start + size:
        raise ValueError("it is truncated")
    try:
        header = json.loads(data[start:start + size])
    except (ValueError, RecursionError):
        raise ValueError("its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header, data[start + size:]


def join_entry(header: bytes, executable: bytes) -> bytes:
    return MAGIC + len(header).to_bytes(8, "little") + header + executable


def read_header(path: Path) -> dict[str, Any] | None:
    """An entry's header alone (for ``cache list``), or None when it is not a readable entry."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, len(MAGIC) + 8)
        size = int.from_bytes(head[len(MAGIC):], "little")
        if not head.startswith(MAGIC) or size > MAX_HEADER_BYTES:
            return None
        data = head + os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return split_entry(data)[0]
    except ValueError:
        return None


def touch(path: Path) -> None:
    """Mark the entry used now (its modification time orders eviction); best effort."""
    try:
        os.utime(path, follow_symlinks=False)
    except OSError as exc:
        logger.debug("cannot mark %s used: %s", path, exc)


def entry_files(directory: Path) -> list[EntryFile]:
    """The regular files named like entries in ``directory``, oldest use first (none when it is unreadable)."""
    return [entry for entry, _ in _scan(directory)[0]]


def _scan(directory: Path) -> tuple[list[tuple[EntryFile, bool]], list[Path]]:
    """(entries with whether each is a temporary file, stale temporary files)."""
    found: list[tuple[EntryFile, bool]] = []
    stale: list[Path] = []
    now = time.time()
    try:
        listing = list(os.scandir(directory))
    except OSError:
        return [], []
    for item in listing:
        temporary = item.name.startswith(TMP_PREFIX)
        if not (item.name.endswith(SUFFIX) or temporary):
            continue  # not ours: never counted, never removed
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if temporary and now - st.st_mtime > STALE_TMP_S:
            stale.append(Path(item.path))
        found.append((EntryFile(Path(item.path), st.st_size, st.st_mtime), temporary))
    found.sort(key=lambda pair: (pair[0].last_used, pair[0].path.name))
    return found, stale


def total_size(directory: Path) -> int:
    """Bytes held by the entries (and temporary files being written) in ``directory``."""
    return sum(entry.size for entry, _ in _scan(directory)[0])


def evict(directory: Path, limit: int, keep: Path | None = None) -> list[EntryFile]:
    """Remove the least recently used entries until ``directory`` holds at most ``limit`` bytes; returns them.

    ``keep`` (the entry just written) is removed last of all. Safe beside other processes
    doing the same: a file another one removed first is skipped; a reader that has an entry
    open keeps reading it.
    """
    found, stale = _scan(directory)
    removed = [entry for entry, _ in found if entry.path in stale and _remove(entry.path)]
    total = sum(entry.size for entry, _ in found) - sum(entry.size for entry in removed)
    if total <= limit:
        return removed
    order = [entry for entry, temporary in found if not temporary and entry.path != keep]
    order += [entry for entry, _ in found if entry.path == keep]
    for entry in order:
        if total <= limit:
            break
        if _remove(entry.path):
            removed.append(entry)
            total -= entry.size
    if removed:
        logger.info("compile cache %s: removed %d least recently used entries to stay under %s",
                    directory, len(removed), format_size(limit))
    return removed


def clear(directory: Path) -> list[EntryFile]:
    """Remove every entry (and stale temporary file) of ``directory``; other files stay. Returns what was removed."""
    found, stale = _scan(directory)
    return [entry for entry, temporary in found if (not temporary or entry.path in stale) and _remove(entry.path)]


def _remove(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:  # another process removed it first
        return False
    except OSError as exc:
        logger.warning("cannot remove compile cache entry %s: %s", path, exc)
        return False
