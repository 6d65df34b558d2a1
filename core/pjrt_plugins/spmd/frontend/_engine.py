"""The engine as the light half of the frontend sees it (through ``_seam``): the operators' route, the trace's
materialization, the compile cache, the CPU fallback switch and the fused optimizer steps.

Importing it loads the trace, execution and lowering layers (and jaxlib), and registers the frontend's
tensor class with the trace, so that recorded ops read pjrt tensors by their data.
"""

from __future__ import annotations

from ..execution import clear_compile_cache, get_partitioner, set_cache_dir, set_partitioner
from ..trace import (
    add_step_closure,
    in_manual_region,
    last_run_timings,
    lower_pending,
    materialize,
    on_mark_sharding,
    pending_ops,
    read_on_host,
    register_tensor_type,
    set_donation,
    sync,
    wait_async_closures,
)
from ._capture import CapturedStep, capture_step
from ._dispatch import dispatch, record_into, refresh_views
from ._fallback import cpu_fallback_enabled, set_cpu_fallback
from ._fused_optim import fused_step
from .tensor import XLAShardedTensor

__all__ = [
    "CapturedStep",
    "add_step_closure",
    "capture_step",
    "clear_compile_cache",
    "cpu_fallback_enabled",
    "dispatch",
    "fused_step",
    "get_partitioner",
    "in_manual_region",
    "last_run_timings",
    "lower_pending",
    "materialize",
    "on_mark_sharding",
    "pending_ops",
    "read_on_host",
    "record_into",
    "refresh_views",
    "set_cache_dir",
    "set_cpu_fallback",
    "set_donation",
    "set_partitioner",
    "sync",
    "wait_async_closures",
]

register_tensor_type(XLAShardedTensor)
