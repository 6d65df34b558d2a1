"""Profile what a plugin does during a block: ``with pjrt_plugins.profiler.trace("/tmp/profile"): step()``.

The plugin's own profiler (its PJRT Profiler extension) records the block; the result is written
where TensorBoard's profile plugin (XProf) looks for it, ``LOG_DIR/plugins/profile/RUN/HOST.xplane.pb``,
and as a Chrome trace that Perfetto (ui.perfetto.dev) opens, ``perfetto_trace.json.gz`` beside it.
A plugin without a profiler raises :class:`~pjrt_plugins.UnsupportedExtensionError` before the block runs.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pjrt_plugins

from .runtime._library import Library, load_library
from .runtime._profiler import PluginProfiler, has_profiler
from .runtime._xspace import chrome_trace, hostnames

__all__ = ["Trace", "has_profiler", "plugin_library", "trace"]


@dataclass
class Trace:
    """Where :func:`trace` wrote the profile (filled in when the block ends)."""

    log_dir: Path
    run_dir: Path | None = None
    xplane_path: Path | None = None
    perfetto_path: Path | None = None
    #: Timed events in the profile (0: the plugin recorded nothing).
    events: int = 0


def plugin_library(plugin: Any = None) -> Library:
    """The library to profile: the default plugin's for None; a plugin name, a plugin, a client (or
    anything with ``.library`` or ``.client``, such as ``pjrt_plugins.spmd.virtual_device()``), a
    :class:`~pjrt_plugins.runtime.Library` or a library path (a string with a ``/``, or a ``Path``)."""
    if isinstance(plugin, Library):
        return plugin
    if isinstance(plugin, str) and os.sep in plugin:  # a path, not a plugin name
        return load_library(plugin)
    if plugin is None or isinstance(plugin, str):
        found = pjrt_plugins.default_plugin() if plugin is None else pjrt_plugins.get_plugin(plugin)
        return load_library(found.library_path(), timeout=found.initialize_timeout())
    if isinstance(plugin, os.PathLike):
        return load_library(plugin)
    for attribute in ("library", "client"):
        inner = getattr(plugin, attribute, None)
        if inner is not None and not callable(inner):
            return plugin_library(inner)
    if callable(getattr(plugin, "library_path", None)):
        return load_library(plugin.library_path())
    raise TypeError(
        f"cannot profile {type(plugin).__name__}: pass a plugin name, a plugin, a client, a Library or a library path"
    )


@contextmanager
def trace(
    log_dir: str | os.PathLike[str], plugin: Any = None, *, create_perfetto_trace: bool = True, options: bytes = b""
) -> Iterator[Trace]:
    """Profile the plugin while the block runs, then write its profile under ``log_dir``.

    ``plugin``: see :func:`plugin_library` (default: the default plugin). ``options``: serialized
    ``tensorflow.ProfileOptions`` for the plugin's profiler (empty: its defaults). The profile is
    written even when the block raises. Open ``log_dir`` with TensorBoard (``tensorboard --logdir``,
    Profile tab) or XProf, or ``perfetto_trace.json.gz`` at https://ui.perfetto.dev. Errors of the
    plugin's profiler are :class:`~pjrt_plugins.PjrtError`.
    """
    library = plugin_library(plugin)
    profiler = PluginProfiler(library, options)
    result = Trace(Path(log_dir))
    try:
        profiler.start()
        try:
            yield result
        finally:
            profiler.stop()
            _write(result, profiler.collect(), create_perfetto_trace)
    finally:
        profiler.close()


def _write(result: Trace, xspace: bytes, create_perfetto_trace: bool) -> None:
    host = next(iter(hostnames(xspace)), "") or socket.gethostname() or "localhost"
    base = result.log_dir / "plugins" / "profile"
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S")
    run_dir, suffix = base / stamp, 1
    while run_dir.exists():  # two traces within a second: keep both
        suffix += 1
        run_dir = base / f"{stamp}_{suffix}"
    run_dir.mkdir(parents=True)
    result.run_dir = run_dir
    result.xplane_path = run_dir / f"{host}.xplane.pb"
    result.xplane_path.write_bytes(xspace)
    events = chrome_trace(xspace)
    result.events = sum(1 for event in events["traceEvents"] if event["ph"] == "X")
    if create_perfetto_trace:
        result.perfetto_path = run_dir / "perfetto_trace.json.gz"
        with gzip.open(result.perfetto_path, "wt", encoding="utf-8") as out:
            json.dump(events, out)
