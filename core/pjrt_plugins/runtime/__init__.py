"""The PJRT C API runtime: load plugin libraries, move buffers, compile and run programs.

Everything goes through cffi in ABI mode against our own declarations (``_cdef``), with
every C function gated by the plugin's ``struct_size`` and version, every answer checked
before it is used, and every ``PJRT_Error`` turned into a :class:`~pjrt_plugins.PjrtError`.
Importing this package opens no plugin library.

The bottom layer: it may import only the foundation (errors, options, environment, time
limits) and its own modules, each of which imports only those below it. It never sees a
plugin object, the registry or the tools; creating a client from a plugin's hooks lives
above it (:func:`pjrt_plugins.create_client_for_plugin`).
"""

from __future__ import annotations

import sys
import warnings

from ..errors import (
    ApiVersionError,
    BufferViewedError,
    ClientClosedError,
    ExecutionStuckError,
    HostViewUnavailableError,
    LibraryLoadError,
    PjrtError,
    PluginInitializeTimeoutError,
    PluginTimeoutError,
    UnsupportedExtensionError,
    UnsupportedFunctionError,
)
from ._args import new_args
from ._buffer import Buffer
from ._cdef import HEADER_MINOR, MIN_SUPPORTED_MINOR
from ._client import Client
from ._compile_options import CompileOptions
from ._devices import Device, Memory
from ._executable import Executable
from ._host_arrays import HOST_ALIGNMENT, aligned_empty
from ._kv import KeyValueStore
from ._library import Library, load_library, loaded_libraries
from ._memory import MemoryDescription, MemoryInfo
from ._partitioner import SHARDY_PROBE_PROGRAM, shardy_refusal

#: The PJRT C API versions this runtime talks to: (oldest, layout it follows).
SUPPORTED_API_VERSIONS = ((0, MIN_SUPPORTED_MINOR), (0, HEADER_MINOR))

__all__ = [
    "ApiVersionError",
    "Buffer",
    "BufferViewedError",
    "Client",
    "ClientClosedError",
    "ExecutionStuckError",
    "CompileOptions",
    "Device",
    "Executable",
    "HOST_ALIGNMENT",
    "HostViewUnavailableError",
    "KeyValueStore",
    "Library",
    "LibraryLoadError",
    "Memory",
    "MemoryDescription",
    "MemoryInfo",
    "PjrtError",
    "PluginInitializeTimeoutError",
    "PluginTimeoutError",
    "SHARDY_PROBE_PROGRAM",
    "SUPPORTED_API_VERSIONS",
    "UnsupportedExtensionError",
    "UnsupportedFunctionError",
    "aligned_empty",
    "load_library",
    "loaded_libraries",
    "new_args",
    "shardy_refusal",
]


def __getattr__(name: str) -> object:
    if name == "create_client_for_plugin":
        # Moved above the runtime, which never sees a plugin; this alias goes in 0.2. It reads the
        # package (always imported before its runtime) instead of importing upwards.
        warnings.warn(
            "pjrt_plugins.runtime.create_client_for_plugin moved: use pjrt_plugins.create_client_for_plugin, "
            "or plugin.create_client()",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules["pjrt_plugins"], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
