"""The state the checks share inside one check process: the plugin, its library, a client, a program.

Everything is created on first use, so a fresh process (after a plugin crashed
the previous one) rebuilds only what the remaining checks need.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pjrt_plugins

from ..runtime import Client, Executable, Library, load_library
from ._programs import ADD_F32
from ._target import Target

if TYPE_CHECKING:  # pragma: no cover
    from .._plugin import DevicePlugin


class Context:
    """Lazily built plugin, library, client and compiled program for the checks."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.has_python = target.mode == "plugin"
        self._plugin: DevicePlugin | None = None
        self._client: Client | None = None
        self._executable: Executable | None = None

    # -- plugin and library ---------------------------------------------------------------

    @property
    def plugin(self) -> DevicePlugin:
        if self._plugin is None:
            assert self.target.plugin is not None
            self._plugin = pjrt_plugins.get_plugin(self.target.plugin)
        return self._plugin

    @property
    def library_path(self) -> str:
        if self.has_python:
            return self.plugin.library_path()
        assert self.target.library_path is not None
        return self.target.library_path

    @property
    def library(self) -> Library:
        return load_library(self.library_path)  # opened once per process by the runtime

    def initialize(self) -> None:
        """Configure, run the preflight (plugin mode) and initialize the library within the time limit."""
        timeout = self.target.timeout
        if self.has_python:
            plugin = self.plugin
            if plugin.local_world_size() <= 1:
                plugin.configure_single_process()
            plugin.preflight()
            timeout = min(timeout, plugin.initialize_timeout())
        self.library.initialize(timeout=timeout)

    # -- client and program ---------------------------------------------------------------

    @property
    def client(self) -> Client:
        if self._client is None or self._client.closed:
            self._client = self.create_client()
        return self._client

    def create_client(self) -> Client:
        options = dict(self.target.options)
        if self.has_python:
            return self.plugin.create_client(options)
        self.initialize()
        return Client(self.library, options, plugin_name=os.path.basename(self.library_path))

    @property
    def executable(self) -> Executable:
        """The f32[4] add program, compiled once."""
        if self._executable is None:
            self._executable = self.client.compile(ADD_F32)
        return self._executable

    def close(self) -> None:
        if self._client is not None and not self._client.closed:
            self._client.close()


@contextlib.contextmanager
def preserved_environment() -> Iterator[None]:
    """Undo whatever a hook wrote to ``os.environ`` (configure hooks narrow devices for a rank)."""
    saved: dict[str, Any] = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
