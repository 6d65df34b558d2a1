"""Host reads without a program: a small pending value that only moves data of device values (``cat``, slices,
views) is read by gathering those values and doing the moves with torch on the CPU.

Why: ``generate`` returns ``input_ids``, the prompt with every new token appended by ``cat``. Read on the host
(``.cpu()``, ``.tolist()``), that ``cat`` of one more operand per token would be a new program for every answer
length. Moving data computes nothing, so the CPU gives the same values bit for bit; the value read becomes host
data (uploaded again if a device op reads it later). Larger values and anything that computes still run as a
program (``_materialize``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..devices import virtual_device
from ..transport import TensorData, TensorState, gather_shards
from ._materialize import live_outputs
from ._record import key_value
from ._split import _collect
from ._state import ENGINE
from ._trace import GETITEM, INPUT, LazyValue, Trace

logger = logging.getLogger(__name__)

__all__ = ["HOST_READ_BYTES", "MOVE_OPS", "read_on_host"]

#: Ops that only move or select elements of their tensor arguments (their results equal on every backend).
MOVE_OPS = frozenset({
    "alias", "cat", "clone", "detach", "expand", "narrow", "permute", "reshape", "select", "slice", "squeeze",
    "t", "transpose", "unsqueeze", "view", "_unsafe_view", "lift_fresh_copy",
})
#: The largest value read this way (bytes): above it, a program that gathers once is cheaper than many small
#: gathers (and a value that big is rarely re-made with a new shape each time).
HOST_READ_BYTES = 1 << 20
#: The most device values one read may gather (each is a transfer per device).
_MAX_GATHERS = 1024


def read_on_host(data: TensorData) -> bool:
    """Give pending ``data`` its value as host data, without a program, when it is small and only moves data of
    values already on the devices; False (nothing changed) otherwise."""
    if data.state is not TensorState.LAZY or data.view_of is not None:
        return False
    with ENGINE.lock:
        value: LazyValue = data.lazy
        trace = value.trace
        if (value.base is not None or trace.done or trace.error is not None
                or math.prod(data.shape) * data.dtype.itemsize > HOST_READ_BYTES):
            return False
        order = _move_closure(trace, value.index)
        if order is None or _has_views(trace, data):
            return False
        vd = virtual_device()
        ordinal = {i: n for n, i in enumerate(i for i, e in enumerate(trace.entries) if e[0] == INPUT)}
        values: dict[int, Any] = {}
        for i in order:
            entry = trace.entries[i]
            if entry[0] == INPUT:
                source = trace.inputs[ordinal[i]]
                if source.generation != vd.generation:
                    return False
                values[i] = gather_shards(source.shape, source.dtype, source.sharding, source.buffers, vd.device_ids)
                continue
            info = ENGINE.ops_by_id[entry[0]]
            assert info is not None
            args = tuple(key_value(k, values, trace.scalars) for k in entry[1])  # type: ignore[arg-type]
            kwargs = {name: key_value(k, values, trace.scalars) for name, k in entry[2]}  # type: ignore[arg-type]
            values[i] = info.func(*args, **kwargs)
        data.set_host(values[value.index], copy=False)  # copies only a result that is not contiguous
        logger.debug("read a pending %s%s on the host from %d device values", data.dtype, list(data.shape),
                     sum(1 for i in order if trace.entries[i][0] == INPUT))
        return True


def _move_closure(trace: Trace, root: int) -> list[int] | None:
    """The entries ``root`` reads, transitively, in trace order, when all are inputs or ``MOVE_OPS``; else None."""
    entries = trace.entries
    seen: set[int] = set()
    todo = [root]
    gathers = 0
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        entry = entries[i]
        kind = entry[0]
        if kind == INPUT:
            gathers += 1
            if gathers > _MAX_GATHERS:
                return None
            continue
        if kind == GETITEM or kind <= 0:
            return None
        info = ENGINE.ops_by_id[kind]
        packet = getattr(info.func, "overloadpacket", None) if info is not None else None
        if packet is None or packet.__name__ not in MOVE_OPS or trace.outs[i][0] != "T":
            return None
        for key in (*entry[1], *(k for _, k in entry[2])):
            _collect(key, todo)
    return sorted(seen)


def _has_views(trace: Trace, data: TensorData) -> bool:
    """Whether a live pending value of ``trace`` is a view of ``data`` (it would lose its base as host data)."""
    for held in live_outputs(trace).values():
        for other in held:
            base = other.lazy.base
            if base is not None and base() is data:
                return True
    return False
