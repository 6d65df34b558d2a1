"""The PJRT C API runtime: load plugin libraries, move buffers, compile and run programs.

Everything goes through cffi in ABI mode against our own declarations (``_cdef``), with
every C function gated by the plugin's ``struct_size`` and version and every ``PJRT_Error``
turned into a :class:`~pjrt_plugins.PjrtError`. Importing this package opens no library.
"""

from __future__ import annotations

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
from ._buffer import HOST_ALIGNMENT, Buffer, aligned_empty
from ._cdef import HEADER_MINOR, MIN_SUPPORTED_MINOR
from ._client import Client, Device, Memory
from ._compile_options import CompileOptions
from ._executable import Executable
from ._kv import KeyValueStore
from ._library import Library, load_library, loaded_libraries, new_args
from ._memory import MemoryDescription, MemoryInfo
from ._partitioner import SHARDY_PROBE_PROGRAM, shardy_refusal
from ._plugin_client import create_client_for_plugin

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
    "create_client_for_plugin",
    "load_library",
    "loaded_libraries",
    "new_args",
    "shardy_refusal",
]
