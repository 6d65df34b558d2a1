"""``pjrt-plugins cache size|list|clear``: what the persistent compile cache directory holds, and emptying it.

Loaded by :mod:`pjrt_plugins.cli` (``HELP``, ``add_arguments``, ``run``). Works on the
files alone (:mod:`pjrt_plugins._cache_files`): it imports neither torch nor a plugin.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from . import _cache_files
from ._cli_common import EXIT_OK, UsageError, print_json, table
from ._cache_files import CACHE_DIR_ENV, MAX_SIZE_ENV, format_size

HELP = "show or empty the persistent compile cache (PJRT_PLUGINS_CACHE_DIR): size, list, clear"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The persistent compile cache keeps executables compiled by pjrt_plugins.spmd for later processes, "
        f"in the directory {CACHE_DIR_ENV} (or xs.set_cache_dir()) names. It stays under {MAX_SIZE_ENV} "
        f"(default {format_size(_cache_files.DEFAULT_MAX_SIZE)}) by removing the least recently used entries."
    )
    parser.add_argument("action", choices=("size", "list", "clear"),
                        help="size: entries and bytes against the bound; list: each entry; clear: remove every entry")
    parser.add_argument("--dir", metavar="DIR", help=f"the cache directory (default: ${CACHE_DIR_ENV})")


def run(args: argparse.Namespace) -> int:
    raw = args.dir or os.environ.get(CACHE_DIR_ENV, "")
    if not raw.strip():
        raise UsageError(f"no compile cache directory: set {CACHE_DIR_ENV} or pass --dir DIR")
    directory = Path(raw).expanduser()
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    limit = _cache_files.max_size_from_environment()
    if args.action == "clear":
        removed = _cache_files.clear(directory)
        freed = sum(entry.size for entry in removed)
        if args.json:
            print_json({"directory": str(directory), "removed": len(removed), "bytes": freed})
        else:
            print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} ({format_size(freed)}) from {directory}")
        return EXIT_OK
    entries = _cache_files.entry_files(directory)
    total = sum(entry.size for entry in entries)
    summary = {"directory": str(directory), "exists": directory.is_dir(), "entries": len(entries), "bytes": total,
               "max_bytes": limit}
    if args.action == "size":
        if args.json:
            print_json(summary)
        elif not summary["exists"]:
            print(f"{directory} does not exist yet (nothing compiled with it so far)")
        else:
            print(f"{directory}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {format_size(total)} "
                  f"of at most {format_size(limit)} ({MAX_SIZE_ENV})")
        return EXIT_OK
    described = [_describe(entry) for entry in reversed(entries)]  # most recently used first
    if args.json:
        print_json({**summary, "list": described})
        return EXIT_OK
    print(table(
        ["ENTRY", "SIZE", "LAST USED", "PLUGIN", "PLATFORM"],
        [[d["name"][:16], format_size(d["bytes"]), d["last_used"], d["plugin"], d["platform"]] for d in described],
    ))
    print(f"\n{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {format_size(total)} of at most {format_size(limit)}")
    return EXIT_OK


def _describe(entry: _cache_files.EntryFile) -> dict[str, Any]:
    """One entry for ``list``: its file and what its header says it holds (``None`` where unreadable)."""
    header = _cache_files.read_header(entry.path) or {}
    key: dict[str, Any] = header["key"] if isinstance(header.get("key"), dict) else {}
    plugin: list[Any] = key["plugin"] if isinstance(key.get("plugin"), list) else []
    platform: list[Any] = key["platform"] if isinstance(key.get("platform"), list) else []
    return {
        "name": entry.path.name,
        "bytes": entry.size,
        "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_used)),
        "plugin": str(plugin[0]) if plugin else None,
        "platform": " ".join(dict.fromkeys(str(p) for p in platform)) or None,
        "program_sha256": key.get("program_sha256") if isinstance(key.get("program_sha256"), str) else None,
    }
