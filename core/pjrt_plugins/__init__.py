"""pjrt-plugins: find PJRT device plugins, run programs on them, shard torch tensors over them.

Importing this package registers every installed backend (entry-point group
``torch_xla.plugins``, and JAX's plugin packages) from metadata alone: no plugin module
is imported until that plugin is asked for, no library is opened, and torch, numpy and
cffi are not imported. Set ``PJRT_PLUGINS_AUTOLOAD=0`` to skip that and call
:func:`discover_plugins` yourself.

The layer of the public names, above the hook contract and discovery: it may import those and
the foundation (errors, options, environment), but loads the runtime, pluggy and ``options``
only on first use (``__getattr__``), and never imports the tools, the integrations or ``spmd``.
Every layer and what it may import is in docs/architecture.md.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._env import env_bool, env_int, env_value
from ._library_lookup import find_library, installed_library
from ._plugin import DevicePlugin
from ._registry import (
    PluginRecord,
    canonical_name,
    create_client,
    default_plugin,
    get_plugin,
    plugin_records,
    register_plugin,
    registered_plugins,
)
from ._discovery import autoload_enabled, discover_plugins
from ._marker import hookimpl
from .errors import (
    ApiVersionError,
    BufferViewedError,
    CheckpointError,
    CheckpointMismatchError,
    ClientClosedError,
    CompileCacheWarning,
    CpuFallbackWarning,
    DataDependentShapeError,
    DistributedSetupError,
    ExecutionStuckError,
    HostViewUnavailableError,
    InputShardingError,
    LibraryLoadError,
    LoweringError,
    ManualShardingError,
    PjrtError,
    PjrtPluginsError,
    PlacementError,
    PluginConfigurationError,
    PluginInitializeTimeoutError,
    PluginLoadError,
    PluginNotFoundError,
    PluginTimeoutError,
    PluginUnavailableError,
    PluginWarning,
    ShardingConflictError,
    ShardingError,
    SpmdDisabledError,
    UnsupportedExtensionError,
    UnsupportedFunctionError,
    UnsupportedOpError,
    UnsupportedPlacementError,
    VirtualDeviceError,
)

__all__ = [
    "ApiVersionError",
    "BufferViewedError",
    "CheckpointError",
    "CheckpointMismatchError",
    "ClientClosedError",
    "CompileCacheWarning",
    "CpuFallbackWarning",
    "DataDependentShapeError",
    "DevicePlugin",
    "DistributedSetupError",
    "ExecutionStuckError",
    "HostViewUnavailableError",
    "InputShardingError",
    "LibraryLoadError",
    "LoweringError",
    "ManualShardingError",
    "OptionType",
    "PjrtError",
    "PjrtPluginsError",
    "PlacementError",
    "PluginConfigurationError",
    "PluginInitializeTimeoutError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginTimeoutError",
    "PluginRecord",
    "PluginUnavailableError",
    "PluginWarning",
    "ShardingConflictError",
    "ShardingError",
    "SpmdDisabledError",
    "UnsupportedExtensionError",
    "UnsupportedFunctionError",
    "UnsupportedOpError",
    "UnsupportedPlacementError",
    "VirtualDeviceError",
    "autoload_enabled",
    "canonical_name",
    "create_client",
    "create_client_for_plugin",
    "default_plugin",
    "discover_plugins",
    "env_bool",
    "env_int",
    "env_value",
    "find_library",
    "get_plugin",
    "hookimpl",
    "hookspec",
    "installed_library",
    "plugin_records",
    "register_plugin",
    "registered_plugins",
]



def __getattr__(name: str) -> object:
    # Loaded on first use, to keep `import pjrt_plugins` cheap: .options imports difflib and
    # dataclasses, .hookspecs imports pluggy (and inspect), ._plugin_client the runtime (cffi, numpy).
    if name == "create_client_for_plugin":
        from ._plugin_client import create_client_for_plugin

        return create_client_for_plugin
    if name == "OptionType":
        from .options import OptionType

        return OptionType
    if name == "hookspec":
        from .hookspecs import hookspec

        return hookspec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Last, so that plugin modules imported by discovery can already use everything above.
if autoload_enabled():
    discover_plugins()
