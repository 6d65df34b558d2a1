"""Layer 6 of the SPMD engine: the pending trace. Ops are recorded on tensor data and run when a value is needed.

May use every layer below (sharding, device, transport, lowering, execution); returns tensor data
(``TensorData``) or pending values, never torch tensors: the frontend makes those, and registers its
tensor class here (:func:`register_tensor_type`). All the engine's caches live in :data:`ENGINE`.
Not a public API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from ._closures import add_step_closure, run_step_closures, wait_async_closures
from ._donation import donation_enabled, set_donation
from ._host_read import read_on_host
from ._inspect import lower_pending
from ._manual import in_manual_region
from ._materialize import last_run_timings, materialize, sync
from ._op_info import (
    OpInfo,
    data_dependent,
    functional_of_out,
    is_out_variant,
    op_info,
    refuse_strided_view,
    with_defaults,
)
from ._output_specs import COMPLEX_REFUSAL, NotLowerable, NotWhole, computes_complex
from ._record import (
    hold,
    on_mark_sharding,
    pending_data,
    pending_ops,
    record,
    record_data,
    record_values,
    register_tensor_type,
)
from ._replay import NotReplayable, Recording, ReplayMiss, record_call, replay, watch_call
from ._state import ENGINE, EngineState
from ._trace import LazyValue

__all__ = [
    "NotReplayable",
    "Recording",
    "ReplayMiss",
    "record_call",
    "replay",
    "watch_call",
    "donation_enabled",
    "set_donation",
    "add_step_closure",
    "lower_pending",
    "run_step_closures",
    "wait_async_closures",
    "COMPLEX_REFUSAL",
    "ENGINE",
    "EngineState",
    "LazyValue",
    "NotLowerable",
    "NotWhole",
    "OpInfo",
    "computes_complex",
    "data_dependent",
    "functional_of_out",
    "hold",
    "in_manual_region",
    "is_out_variant",
    "last_run_timings",
    "materialize",
    "on_mark_sharding",
    "op_info",
    "pending_data",
    "pending_ops",
    "read_on_host",
    "record",
    "record_data",
    "record_values",
    "refuse_strided_view",
    "register_tensor_type",
    "sync",
    "with_defaults",
]
