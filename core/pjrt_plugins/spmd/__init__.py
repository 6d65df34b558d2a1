"""Shard PyTorch tensors over a PJRT plugin's devices (``import pjrt_plugins.spmd as xs``).

Importing this registers the torch device ``pjrt`` (the virtual device standing for
all devices of the active plugin); no plugin is opened until data moves.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ShardingConflictError, ShardingError, SpmdDisabledError, VirtualDeviceError
from . import _device
from ._device import TORCH_DEVICE, VirtualDevice, is_spmd
from ._sharding import Shard, ShardingSpec, ShardingType, parse_sharding, parse_tuple_sharding
from ._transfer import TransferCounters, reset_transfer_counters, transfer_counters
from .mesh import Mesh, get_1d_mesh, get_global_mesh, set_global_mesh
from .tensor import XLAShard, XLAShardedTensor, clear_sharding, mark_sharding, to_device

if TYPE_CHECKING:  # served lazily by __getattr__ below (importing the engine loads jaxlib's MLIR)
    from ._disk_cache import set_cache_dir
    from ._executor import Metrics, clear_compile_cache, metrics, metrics_report, reset_metrics
    from ._lazy import set_cpu_fallback, sync

__all__ = [
    "Mesh",
    "Metrics",
    "Shard",
    "ShardingConflictError",
    "ShardingError",
    "ShardingSpec",
    "ShardingType",
    "SpmdDisabledError",
    "TransferCounters",
    "VirtualDevice",
    "VirtualDeviceError",
    "XLAShard",
    "XLAShardedTensor",
    "clear_compile_cache",
    "clear_sharding",
    "device",
    "get_1d_mesh",
    "get_global_mesh",
    "is_spmd",
    "mark_sharding",
    "metrics",
    "metrics_report",
    "parse_sharding",
    "parse_tuple_sharding",
    "reset_metrics",
    "reset_transfer_counters",
    "set_cache_dir",
    "set_cpu_fallback",
    "set_global_mesh",
    "set_plugin",
    "sync",
    "to_device",
    "transfer_counters",
    "use_spmd",
    "virtual_device",
]


def device() -> torch.device:
    """The virtual device, ``torch.device('pjrt', 0)`` (PyTorch/XLA's ``xm.xla_device()``)."""
    return TORCH_DEVICE


def use_spmd(auto: bool = False) -> None:
    """Turn SPMD mode on (PyTorch/XLA's ``xr.use_spmd()``); it is already on unless ``XLA_USE_SPMD=0``.

    In SPMD mode ``pjrt:0`` stands for every device of the plugin and tensors
    can be sharded with :func:`mark_sharding`; with SPMD off it is the first
    device alone. ``auto=True`` (automatic sharding) is not supported.

    Example (ported PyTorch/XLA code)::

        import pjrt_plugins.spmd as xs      # was: import torch_xla.runtime as xr
        xs.use_spmd()                       # was: xr.use_spmd()
    """
    if auto:
        raise NotImplementedError("automatic sharding (use_spmd(auto=True)) is not supported; mark tensors instead")
    _device.set_spmd(True)


def set_plugin(plugin: Any = None, *, options: dict[str, Any] | None = None) -> None:
    """Choose the plugin behind ``pjrt:0`` and its client options (default: ``pjrt_plugins.default_plugin()``).

    ``plugin`` is a registered name, a DevicePlugin, or ``None``. The client is
    created at the next transfer. Tensors already uploaded to a previous
    choice cannot be used afterwards (move them from a CPU copy again).

    Example::

        import pjrt_plugins.spmd as xs
        xs.set_plugin("cpu", options={"cpu_device_count": 8})
        xs.virtual_device().num_devices   # 8
    """
    _device.set_plugin(plugin, options)


def virtual_device() -> VirtualDevice:
    """The plugin, shared client and devices behind ``pjrt:0`` (creates the client on first call)."""
    return _device.virtual_device()


#: Names served by the execution engine's modules (name -> module), imported on first use so that
#: ``import pjrt_plugins.spmd`` stays light: the engine loads jaxlib's MLIR bindings.
_ENGINE_EXPORTS = {
    "sync": "._lazy",
    "set_cpu_fallback": "._lazy",
    "metrics": "._executor",
    "metrics_report": "._executor",
    "reset_metrics": "._executor",
    "Metrics": "._executor",
    "set_cache_dir": "._disk_cache",
    "clear_compile_cache": "._executor",
}


def __getattr__(name: str) -> Any:
    module = _ENGINE_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ENGINE_EXPORTS))
