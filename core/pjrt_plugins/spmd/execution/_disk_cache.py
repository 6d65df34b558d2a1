"""The persistent compile cache: executables compiled by one process, loaded by the next.

An entry is deserialized only when it carries the exact key it was looked up by (the
fingerprint of the lowered program, the plugin and its library file, the compile options)
and its bytes are intact; the directory must be this user's and writable by nobody else,
and an entry a small regular file. Anything else is ignored with a log or a warning, and
the program is compiled. The directory is kept under a size bound by removing the least
recently used entries (the files themselves: ``pjrt_plugins._cache_files``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from ..._cache_files import (
    CACHE_DIR_ENV,
    MAGIC,
    MAX_SIZE_ENV,
    SUFFIX,
    TMP_PREFIX,
    EntryFileError,
    evict,
    format_size,
    join_entry,
    max_size_from_environment,
    parse_size,
    read_entry,
    split_entry,
    touch,
)
from ...errors import CompileCacheWarning
from ...runtime import CompileOptions

logger = logging.getLogger(__name__)

#: Bumped whenever the entry layout or the key changes: older entries are then never read.
ENTRY_FORMAT = 1
_MAGIC = MAGIC
_SUFFIX = SUFFIX

_cache_dir: Path | None = None
_cache_dir_set = False
_max_size: int | None = None  # set by set_cache_max_size(); None: the environment's, else the default
_refused: set[str] = set()  # directories already warned about (once per process)
_lock = threading.Lock()


def set_cache_dir(path: str | os.PathLike[str] | None) -> None:
    """Persist compiled executables in ``path`` (``None``: only in memory; default: ``$PJRT_PLUGINS_CACHE_DIR``).

    Another process compiling the same lowered program with the same plugin, library file
    and compile options loads the executable instead (``metrics().persistent_cache_hits``).
    The directory is created private (0700, entries 0600); one that other users can write
    is refused with a :class:`~pjrt_plugins.errors.CompileCacheWarning`.

    Example::

        xs.set_cache_dir("~/.cache/my-model-executables")   # or PJRT_PLUGINS_CACHE_DIR=...
        step(); xs.sync()          # the first process compiles and stores; later ones load
        xs.set_cache_dir(None)     # back to memory only
    """
    global _cache_dir, _cache_dir_set
    _cache_dir = Path(path).expanduser() if path is not None else None
    _cache_dir_set = True


def cache_dir() -> Path | None:
    """The directory set by :func:`set_cache_dir`, else ``$PJRT_PLUGINS_CACHE_DIR``, else None."""
    if _cache_dir_set:
        return _cache_dir
    raw = os.environ.get(CACHE_DIR_ENV)
    return Path(raw).expanduser() if raw else None


def set_cache_max_size(size: int | str | None) -> None:
    """Keep the cache directory under ``size`` bytes (``10G``, ``500M``, ``2GiB`` or an int; ``None``: the default).

    The default is ``$PJRT_PLUGINS_CACHE_MAX_SIZE``, else 10 GiB. After each store the
    least recently used entries (a load counts as a use) are removed until the directory
    fits; an executable larger than the bound is not stored, and an entry larger than it
    is not read. ``pjrt-plugins cache size`` shows what the directory holds.

    Example (``PJRT_PLUGINS_CACHE_MAX_SIZE=2G`` in the environment does the same)::

        from pjrt_plugins.spmd.execution import disk_cache
        disk_cache.set_cache_max_size("2G")
    """
    global _max_size
    _max_size = None if size is None else parse_size(size)


def cache_max_size() -> int:
    """The bound in bytes: :func:`set_cache_max_size`'s, else ``$PJRT_PLUGINS_CACHE_MAX_SIZE``'s, else 10 GiB."""
    return _max_size if _max_size is not None else max_size_from_environment()


def cache_key(program: bytes, compile_options: bytes, client: Any, plugin: tuple) -> dict[str, Any]:
    """Everything an executable depends on, as JSON-able values.

    ``program``: the lowered artifact given to the compiler; ``compile_options``: the
    serialized CompileOptionsProto; ``plugin``: the plugin's identity (name, distribution,
    version, platform, device assignment). The library file is named by path, size and
    modification time, so a reinstalled or rebuilt plugin never loads an older executable.
    """
    library = client.library
    try:
        st = os.stat(library.path)
        file = {"path": os.path.realpath(library.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        file = {"path": str(library.path), "size": None, "mtime_ns": None}
    return {
        "format": ENTRY_FORMAT,
        "program_sha256": hashlib.sha256(program).hexdigest(),
        "compile_options_sha256": hashlib.sha256(compile_options).hexdigest(),
        "plugin": json.loads(json.dumps(list(plugin), default=str)),
        "library": {**file, "api_version": list(library.api_version)},
        "platform": [client.platform_name, client.platform_version],
    }


def _entry_name(key: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(key)).hexdigest() + _SUFFIX


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _private_directory(directory: Path, *, create: bool) -> bool:
    """Whether ``directory`` may hold our executables: ours and writable by nobody else.

    Created 0700 when ``create`` and missing. A refused directory is warned about once.
    """
    try:
        if create and not directory.exists():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(directory)
    except OSError as exc:
        logger.info("compile cache directory %s is not usable: %s", directory, exc)
        return False
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to another user (uid {st.st_uid})"
    elif st.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return True
    with _lock:
        first = str(directory) not in _refused
        _refused.add(str(directory))
    if first:
        warnings.warn(
            f"not using the compile cache directory {directory}: it {problem}, so someone else could make this "
            f"process run their code. Use a directory only you can write (chmod 700 {directory}, or point "
            f"{CACHE_DIR_ENV} / set_cache_dir() elsewhere); programs are compiled meanwhile.",
            CompileCacheWarning,
            stacklevel=2,
        )
    return False


def load_executable(client: Any, program: bytes, options: CompileOptions, plugin: tuple) -> tuple[Any, list[str]] | None:
    """``(executable, output shardings)`` stored for this lowered ``program`` compiled with
    ``options`` by ``plugin``'s client, or None (no cache directory, no valid entry, or the
    plugin cannot load it: then the caller compiles)."""
    directory = cache_dir()
    if directory is None:
        return None
    key = cache_key(program, options.serialize(), client, plugin)
    found = load(directory, key)
    if found is None:
        return None
    blob, metadata = found
    shardings = metadata.get("output_shardings")
    if not isinstance(shardings, list) or not all(isinstance(s, str) for s in shardings):
        logger.warning("ignoring compile cache entry %s: its metadata is damaged; compiling instead", _entry_name(key))
        return None
    try:
        executable = client.deserialize_executable(blob)
    except Exception as exc:  # noqa: BLE001 - e.g. another build of the plugin: compile instead
        logger.warning("ignoring compile cache entry %s: the plugin cannot load it (%s); compiling instead",
                       _entry_name(key), exc)
        return None
    return executable, shardings


def store_executable(
    client: Any, program: bytes, options: CompileOptions, plugin: tuple, executable: Any, output_shardings: list[str]
) -> None:
    """Store ``executable`` (compiled from ``program`` with ``options``) for later processes (best effort)."""
    directory = cache_dir()
    if directory is None:
        return
    try:
        blob = executable.serialize()
    except Exception as exc:  # noqa: BLE001 - a plugin that cannot serialize just compiles every time
        logger.info("not persisting the compiled program (%s: %s)", type(exc).__name__, exc)
        return
    store(directory, cache_key(program, options.serialize(), client, plugin), blob, {"output_shardings": output_shardings})


def load(directory: Path, key: dict[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
    """The serialized executable and metadata stored under ``key``, or None.

    None (with a log saying why) when the directory is not private, the entry is missing,
    not a private regular file (a link, a FIFO, a directory), larger than the cache's bound,
    corrupt, or was stored under another key. A valid entry is marked used (LRU).
    """
    if not _private_directory(directory, create=False):
        return None
    path = directory / _entry_name(key)
    try:
        data = read_entry(path, cache_max_size())
    except FileNotFoundError:
        return None
    except (EntryFileError, OSError) as exc:
        logger.warning("ignoring compile cache entry %s: %s; compiling instead", path, exc)
        return None
    try:
        header, blob = _parse(data)
    except ValueError as exc:
        logger.warning("ignoring compile cache entry %s: %s; compiling instead", path, exc)
        return None
    stored = header.get("key")
    if stored != key:
        stored = stored if isinstance(stored, dict) else {}
        differ = sorted(k for k in set(key) | set(stored) if stored.get(k) != key.get(k))
        logger.warning(
            "ignoring compile cache entry %s: it was stored for another %s; compiling instead",
            path, ", ".join(differ) or "key",
        )
        return None
    if header.get("executable_sha256") != hashlib.sha256(blob).hexdigest():
        logger.warning("ignoring compile cache entry %s: its executable bytes are damaged; compiling instead", path)
        return None
    touch(path)
    metadata = header.get("metadata", {})
    return blob, metadata if isinstance(metadata, dict) else {}


def store(directory: Path, key: dict[str, Any], executable: bytes, metadata: dict[str, Any]) -> None:
    """Write the entry for ``key`` (0600, atomically: readers see the old entry or the new one), then
    remove the least recently used entries beyond the cache's bound."""
    if not _private_directory(directory, create=True):
        return
    header = {
        "key": key,
        "executable_sha256": hashlib.sha256(executable).hexdigest(),
        "metadata": metadata,
    }
    entry = join_entry(_canonical(header), executable)
    limit = cache_max_size()
    if len(entry) > limit:
        logger.warning(
            "not persisting a compiled program of %s: it is larger than the compile cache's bound of %s (%s)",
            format_size(len(entry)), format_size(limit), MAX_SIZE_ENV,
        )
        return
    target = directory / _entry_name(key)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=TMP_PREFIX)  # created 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(entry)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:  # a full disk, or a directory at the entry's name
        logger.warning("could not write a compile cache entry in %s: %s", directory, exc)
        return
    evict(directory, limit, keep=target)


def _parse(data: bytes) -> tuple[dict[str, Any], bytes]:
    return split_entry(data)
