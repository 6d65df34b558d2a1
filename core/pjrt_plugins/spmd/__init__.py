"""Shard PyTorch tensors over a PJRT plugin's devices (``import pjrt_plugins.spmd as xs``).

Importing this registers the torch device ``pjrt`` (the virtual device standing for
all devices of the active plugin); no plugin is opened until data moves.

The package is built in layers, each importing only those below it (docs/architecture.md):
``sharding`` (pure data model) < ``device`` (virtual device, RNG, counters) < ``transport``
(tensor data, upload/gather) < ``lowering`` (StableHLO) < ``execution`` (compile cache, run)
< ``trace`` (record, materialize) < ``frontend`` (torch). This module is the public API.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

import torch

from ..errors import (
    InputShardingError,
    ManualShardingError,
    ShardingConflictError,
    ShardingError,
    SpmdDisabledError,
    VirtualDeviceError,
)
from . import devices as _devices
from .collectives import disable_manual_sharding, enable_manual_sharding
from .einsum_linear import EinsumLinear, XLAPatchedLinear, apply_xla_patch_to_nn_linear, xla_patched_nn_linear_forward
from .devices import (
    HybridMesh,
    Mesh,
    Metrics,
    TransferCounters,
    VirtualDevice,
    get_1d_mesh,
    get_global_mesh,
    is_spmd,
    metrics,
    metrics_report,
    reset_metrics,
    reset_transfer_counters,
    set_global_mesh,
    transfer_counters,
)
from .frontend import (
    TORCH_DEVICE,
    MarkShardingFunction,
    ShardingSpec,
    XLAShard,
    XLAShardedTensor,
    annotate_custom_sharding,
    apply_backward_optimization_barrier,
    clear_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    shard_as,
    to_device,
    unwrap_sharded_tensor,
    wrap_as_sharded_tensor,
    wrap_if_sharded,
)
from .frontend import engine as _engine
from .sharding import OpSharding, Shard, ShardingType, parse_sharding, parse_tuple_sharding

if TYPE_CHECKING:  # served by __getattr__ below, through the engine's one lazy seam (it loads jaxlib)
    from .execution import clear_compile_cache, get_partitioner, set_cache_dir, set_partitioner
    from .frontend._capture import CapturedStep, capture_step
    from .frontend._fallback import set_cpu_fallback
    from .trace import set_donation, sync
    from .dtensor import (
        auto_policy,
        convert_to_dtensor_placements,
        convert_to_xla_mesh,
        convert_to_xla_partition_spec,
        init_device_mesh,
        xla_distribute_module,
        xla_distribute_tensor,
    )

__all__ = [
    "CapturedStep",
    "EinsumLinear",
    "HybridMesh",
    "InputShardingError",
    "MarkShardingFunction",
    "ManualShardingError",
    "Mesh",
    "Metrics",
    "OpSharding",
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
    "XLAPatchedLinear",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "apply_xla_patch_to_nn_linear",
    "auto_policy",
    "capture_step",
    "clear_compile_cache",
    "clear_sharding",
    "convert_to_dtensor_placements",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "device",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "get_partitioner",
    "init_device_mesh",
    "is_spmd",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "metrics",
    "metrics_report",
    "parse_sharding",
    "parse_tuple_sharding",
    "reset_metrics",
    "reset_transfer_counters",
    "set_cache_dir",
    "set_partitioner",
    "set_cpu_fallback",
    "set_donation",
    "set_global_mesh",
    "set_plugin",
    "shard_as",
    "sync",
    "to_device",
    "transfer_counters",
    "unwrap_sharded_tensor",
    "use_spmd",
    "virtual_device",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
    "xla_distribute_module",
    "xla_distribute_tensor",
    "xla_patched_nn_linear_forward",
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
    os.environ[_devices.USE_SPMD_ENV] = "1"  # as PyTorch/XLA does: is_spmd() and child processes read it
    _devices.set_spmd(True)


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
    _devices.set_plugin(plugin, options)


def virtual_device() -> VirtualDevice:
    """The plugin, shared client and devices behind ``pjrt:0`` (creates the client on first call)."""
    return _devices.virtual_device()


#: Names the engine serves (through ``frontend._seam``, on first use, so that ``import pjrt_plugins.spmd``
#: stays light: the engine loads jaxlib's MLIR bindings).
_ENGINE_EXPORTS = frozenset({
    "sync", "capture_step", "CapturedStep", "set_cpu_fallback", "set_donation", "set_cache_dir", "clear_compile_cache",
    "set_partitioner", "get_partitioner",
})


#: Names the DTensor bridge serves (``pjrt_plugins.spmd.dtensor``, on first use: it imports torch.distributed.tensor,
#: which costs seconds). Importing it also routes torch's own DTensor functions to it for ``pjrt`` meshes.
_DTENSOR_EXPORTS = frozenset({
    "auto_policy", "convert_to_dtensor_placements", "convert_to_xla_mesh", "convert_to_xla_partition_spec",
    "init_device_mesh", "xla_distribute_module", "xla_distribute_tensor",
})
_DTENSOR_MODULE = f"{__name__}.dtensor"


def __getattr__(name: str) -> Any:
    if name in _ENGINE_EXPORTS:
        value = getattr(_engine(), name)
    elif name in _DTENSOR_EXPORTS:
        value = getattr(importlib.import_module(_DTENSOR_MODULE), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _ENGINE_EXPORTS | _DTENSOR_EXPORTS)


if "torch.distributed.tensor" in sys.modules:  # already paid for: route torch's DTensor functions from the start
    importlib.import_module(_DTENSOR_MODULE)
