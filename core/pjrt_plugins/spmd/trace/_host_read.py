"""Host reads without a program: a small pending value that only moves data of device values (``cat``, slices,
views), or computes exactly on integers and booleans (comparisons, ``isin``, ``any``, ``sum``, ``cumsum``, ...), is
read by gathering the small device values it reads and replaying its ops with torch on the CPU (``_host_compute``).

Why: ``generate`` returns ``input_ids``, the prompt with every new token appended by ``cat``. Read on the host
(``.cpu()``, ``.tolist()``), that ``cat`` of one more operand per token would be a new program for every answer
length. Before its loop, ``generate`` checks the prompt and its special tokens (``(input_ids < 0).any()``,
``torch.isin(eos, pad).any()``, ...): each such flag read on the host would be a program of its own, compiled in
hundreds of milliseconds, for a few integer operations that the CPU does in microseconds. The value read becomes
host data (uploaded again if a device op reads it later). Floating-point arithmetic, larger values and anything
else still run as a program (``_materialize``).
"""

from __future__ import annotations

import logging
import math

from ..transport import TensorData, TensorState
from ._host_compute import EXACT_OPS, HOST_READ_BYTES, MOVE_OPS, host_closure, replay
from ._materialize import live_outputs
from ._state import ENGINE
from ._trace import INPUT, LazyValue, Trace

logger = logging.getLogger(__name__)

__all__ = ["EXACT_OPS", "HOST_READ_BYTES", "MOVE_OPS", "read_on_host"]


def read_on_host(data: TensorData) -> bool:
    """Give pending ``data`` its value as host data, without a program, when it is small and only moves data of
    values already on the devices or computes exactly on integers and bools; False (nothing changed) otherwise."""
    if data.state is not TensorState.LAZY or data.view_of is not None:
        return False
    with ENGINE.lock:
        value: LazyValue = data.lazy
        trace = value.trace
        if (value.base is not None or trace.done or trace.error is not None
                or math.prod(data.shape) * data.dtype.itemsize > HOST_READ_BYTES):
            return False
        order = host_closure(trace, [value.index])
        if order is None or _has_views(trace, data):
            return False
        values = replay(trace, order)
        if values is None:
            return False
        inputs = sum(1 for i in order if trace.entries[i][0] == INPUT)
        if inputs:  # a value of the trace's ops alone (an arange's) is the same whenever they are (_replay)
            ENGINE.host_reads += 1
        data.set_host(values[value.index])  # a copy: the value may share memory with the inputs' host copies
        logger.debug("read a pending %s%s on the host from %d device values", data.dtype, list(data.shape), inputs)
        return True


def _has_views(trace: Trace, data: TensorData) -> bool:
    """Whether a live pending value of ``trace`` is a view of ``data`` (it would lose its base as host data)."""
    for held in live_outputs(trace).values():
        for other in held:
            base = other.lazy.base
            if base is not None and base() is data:
                return True
    return False
