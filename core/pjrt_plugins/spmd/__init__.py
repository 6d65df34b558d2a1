"""Shard PyTorch tensors over a PJRT plugin's devices (``import pjrt_plugins.spmd as xs``).

Importing this registers the torch device ``pjrt`` (the virtual device standing for
all devices of the active plugin); no plugin is opened until data moves.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ..errors import ShardingConflictError, ShardingError, SpmdDisabledError, VirtualDeviceError
from . import _device
from ._device import TORCH_DEVICE, VirtualDevice, is_spmd
from ._sharding import Shard, ShardingSpec, ShardingType, parse_sharding, parse_tuple_sharding
from ._transfer import TransferCounters, reset_transfer_counters, transfer_counters
from .mesh import Mesh, get_1d_mesh, get_global_mesh, set_global_mesh
from .tensor import XLAShard, XLAShardedTensor, clear_sharding, mark_sharding, to_device


__all__ = [
    "Mesh",
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
    "clear_sharding",
    "device",
    "get_1d_mesh",
    "get_global_mesh",
    "is_spmd",
    "mark_sharding",
    "parse_sharding",
    "parse_tuple_sharding",
    "reset_transfer_counters",
    "set_global_mesh",
    "set_plugin",
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


#: Names served by the execution engine's modules once they exist (issue 6): name -> module.
_ENGINE_EXPORTS = {
    "sync": "._lazy",
}


def __getattr__(name: str) -> Any:
    module = _ENGINE_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as exc:
        raise AttributeError(
            f"pjrt_plugins.spmd.{name} needs the execution engine ({module.lstrip('.')}), which this build lacks"
        ) from exc
