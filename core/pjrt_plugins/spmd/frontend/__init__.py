"""Layer 7 of the SPMD engine: the torch frontend. The ``pjrt`` device (torch's PrivateUse1 backend), the
``XLAShardedTensor`` subclass, marking shardings, the operators' route into the trace, the CPU fallback,
fused optimizers, autocast and the ``torch.compile`` backend.

It may use every layer below; the layers below never import it (it registers its tensor class with the
trace instead). Its light half (this package's ``__init__``) is imported with ``pjrt_plugins.spmd``; the
engine half loads through ``_seam`` on the first operator. Not a public API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from . import _factories  # noqa: F401  (registers the device's factory and copy kernels)
from ._annotate import clear_sharding, to_device, unwrap_sharded_tensor, wrap_as_sharded_tensor, wrap_if_sharded
from ._constraints import MarkShardingFunction, apply_backward_optimization_barrier
from ._input_sharding import InputSharding, ShardingSpec, check_input_sharding, send_cpu_data_to_device
from ._seam import engine, loaded_engine
from ._torch_device import DEVICE_TYPE, TORCH_DEVICE, check_torch_device
from ._traceable import (
    annotate_custom_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    optimization_barrier_,
    shard_as,
)
from .tensor import XLAShard, XLAShardedTensor, to_cpu, unwrap, wrap

__all__ = [
    "DEVICE_TYPE",
    "InputSharding",
    "MarkShardingFunction",
    "ShardingSpec",
    "TORCH_DEVICE",
    "XLAShard",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "check_input_sharding",
    "check_torch_device",
    "clear_sharding",
    "engine",
    "loaded_engine",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "optimization_barrier_",
    "send_cpu_data_to_device",
    "shard_as",
    "to_cpu",
    "to_device",
    "unwrap",
    "wrap",
    "wrap_as_sharded_tensor",
    "unwrap_sharded_tensor",
    "wrap_if_sharded",
]
