"""Host reads without a program: a small pending value that only moves data of device values (``cat``, slices,
views), or computes exactly on integers and booleans (comparisons, ``isin``, ``any``, ``sum``, ``cumsum``, ...), is
read by gathering the small device values it reads and replaying its ops with torch on the CPU.

Why: ``generate`` returns ``input_ids``, the prompt with every new token appended by ``cat``. Read on the host
(``.cpu()``, ``.tolist()``), that ``cat`` of one more operand per token would be a new program for every answer
length. Before its loop, ``generate`` checks the prompt and its special tokens (``(input_ids < 0).any()``,
``torch.isin(eos, pad).any()``, ...): each such flag read on the host would be a program of its own, compiled in
hundreds of milliseconds, for a few integer operations that the CPU does in microseconds. Moving data and integer
or boolean arithmetic are exact, so the CPU gives the same values bit for bit; the value read becomes host data
(uploaded again if a device op reads it later). Floating-point arithmetic, larger values and anything else still
run as a program (``_materialize``): XLA and the CPU may round differently, and the CPU plugin flushes subnormals.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..devices import virtual_device
from ..lowering import ScalarSlot
from ..transport import TensorData, TensorState, gather_shards
from ._materialize import live_outputs
from ._split import _collect
from ._state import ENGINE
from ._trace import GETITEM, INPUT, LazyValue, Trace

logger = logging.getLogger(__name__)

__all__ = ["EXACT_OPS", "HOST_READ_BYTES", "MOVE_OPS", "read_on_host"]

#: Ops that only move or select elements of their tensor arguments (their results equal on every backend).
MOVE_OPS = frozenset({
    "alias", "cat", "clone", "detach", "expand", "narrow", "permute", "reshape", "select", "slice", "squeeze",
    "t", "transpose", "unsqueeze", "view", "_unsafe_view", "lift_fresh_copy",
})
#: Ops replayed on the host when every tensor they read and make is an integer or bool tensor and their other
#: arguments are ints, bools, dtypes or devices: integer and boolean arithmetic is exact (wrapping alike on
#: overflow), so XLA's program and torch's CPU kernels agree bit for bit. Division and remainders are left out
#: (torch raises on an integer division by zero; a program gives a value).
EXACT_OPS = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "isin", "any", "all", "sum", "cumsum", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor", "logical_not", "mul", "add", "sub",
    "neg", "abs", "where", "masked_fill", "maximum", "minimum", "amax", "amin", "max", "min", "clamp", "_to_copy",
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "new_ones", "new_zeros", "new_full", "arange",
    "scalar_tensor",
})
#: The ops of ``EXACT_OPS`` that fill a tensor with a value: an integral float value (``torch.ones`` is ``full``
#: of ``1.0``) converts exactly into their integer or bool result.
_FILL_OPS = frozenset({"full", "full_like", "new_full", "scalar_tensor"})
#: The largest value read this way, and the most bytes one read may gather or make on the way (each): above it,
#: a program that gathers once is cheaper than many small gathers (and a value that big is rarely re-made with a
#: new shape each time).
HOST_READ_BYTES = 1 << 20
#: The most device values one read may gather (each is a transfer per device).
_MAX_GATHERS = 1024
#: The most computing ops one read may replay (a few microseconds each on the CPU).
_MAX_COMPUTE_OPS = 256
_CPU = torch.device("cpu")


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
        order = _host_closure(trace, value.index)
        if order is None or _has_views(trace, data):
            return False
        vd = virtual_device()
        ordinal = {i: n for n, i in enumerate(i for i, e in enumerate(trace.entries) if e[0] == INPUT)}
        values: dict[int, Any] = {}
        for i in order:
            entry = trace.entries[i]
            if entry[0] == INPUT:
                source = trace.inputs[ordinal[i]]
                if source.generation != vd.generation or source.sharding.is_manual or not source.buffers:
                    return False
                values[i] = gather_shards(source.shape, source.dtype, source.sharding, source.buffers, vd.device_ids)
                continue
            info = ENGINE.ops_by_id[entry[0]]
            assert info is not None
            args = tuple(_host_value(k, values, trace.scalars) for k in entry[1])
            kwargs = {name: _CPU if name == "device" else _host_value(k, values, trace.scalars)
                      for name, k in entry[2]}
            values[i] = info.func(*args, **kwargs)
        data.set_host(values[value.index], copy=False)  # copies only a result that is not contiguous
        logger.debug("read a pending %s%s on the host from %d device values", data.dtype, list(data.shape),
                     sum(1 for i in order if trace.entries[i][0] == INPUT))
        return True


def _host_value(key: Any, values: dict[int, Any], scalars: list[float]) -> Any:
    """The CPU argument a key stands for (``_record.key_value`` with run-time scalars as their Python values)."""
    kind = type(key)
    if kind is int:
        return values[key]
    if kind is not tuple:
        return key
    tag = key[0]
    if tag is float:
        return key[1] if type(key[1]) is float else float(key[1])
    if tag is ScalarSlot:
        return key[2](scalars[key[1]]) if len(key) > 2 else scalars[key[1]]
    if tag is list:
        return [_host_value(k, values, scalars) for k in key[1]]
    if tag is tuple:
        return tuple(_host_value(k, values, scalars) for k in key[1])
    return key[1]  # int, bool


def _host_closure(trace: Trace, root: int) -> list[int] | None:
    """The entries ``root`` reads, transitively, in trace order, when all are small inputs, ``MOVE_OPS`` or
    ``EXACT_OPS`` on integers and bools (see :data:`EXACT_OPS`); else None."""
    entries, outs = trace.entries, trace.outs
    seen: set[int] = set()
    todo = [root]
    gathers = computes = gathered = 0
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        out = outs[i]
        if out[0] != "T" or math.prod(out[1]) * out[2].itemsize > HOST_READ_BYTES:
            return None
        entry = entries[i]
        kind = entry[0]
        if kind == INPUT:
            gathers += 1
            gathered += math.prod(out[1]) * out[2].itemsize
            if gathers > _MAX_GATHERS or gathered > HOST_READ_BYTES:
                return None
            continue
        if kind == GETITEM or kind <= 0:
            return None
        info = ENGINE.ops_by_id[kind]
        packet = getattr(info.func, "overloadpacket", None) if info is not None else None
        if packet is None or info is None or info.random:
            return None
        name = packet.__name__
        found: list[int] = []
        for key in (*entry[1], *(k for _, k in entry[2])):
            _collect(key, found)
        if name not in MOVE_OPS:
            computes += 1
            if (name not in EXACT_OPS or computes > _MAX_COMPUTE_OPS or _inexact(out[2])
                    or any(_inexact(outs[j][2]) for j in found)
                    or not all(_exact_argument(k, name in _FILL_OPS) for k in (*entry[1], *(k for _, k in entry[2])))):
                return None
        todo.extend(found)
    return sorted(seen)


def _inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _exact_argument(key: Any, fill: bool) -> bool:
    """Whether an argument key of an exact op is a tensor, an int, a bool or a bare constant; no float, but the
    integral value of a fill op (``fill``) up to 2^24, which every float dtype and integer result holds."""
    kind = type(key)
    if kind is int or key is None or kind is not tuple:
        return True
    tag = key[0]
    if tag is int or tag is bool:
        return True
    if tag is float:
        return fill and type(key[1]) is float and key[1].is_integer() and abs(key[1]) <= 1 << 24
    if tag is ScalarSlot:
        return len(key) > 2  # an int or bool fill value; a float one may be rounded into the dtype
    if tag is list or tag is tuple:
        return all(_exact_argument(k, fill) for k in key[1])
    return False


def _has_views(trace: Trace, data: TensorData) -> bool:
    """Whether a live pending value of ``trace`` is a view of ``data`` (it would lose its base as host data)."""
    for held in live_outputs(trace).values():
        for other in held:
            base = other.lazy.base
            if base is not None and base() is data:
                return True
    return False
