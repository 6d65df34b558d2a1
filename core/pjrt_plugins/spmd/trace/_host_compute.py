"""Computing pending values on the host: which recorded entries torch on the CPU gives bit for bit as a program
would, and replaying them there from the gathered device values they read.

Why: a program costs a compile (hundreds of milliseconds) for each new shape, and a few integer or boolean ops on
small values cost microseconds on the CPU. Moving data (``cat``, slices, views) computes nothing, and integer and
boolean arithmetic is exact, so both give the devices' values on the CPU; floating-point arithmetic may round
otherwise (the CPU plugin also flushes subnormals), so it is never replayed here. Used by host reads
(``_host_read``) and by partial runs (``_split``), which compute a growing value's fixed-size result here.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from ..devices import virtual_device
from ..lowering import ScalarSlot
from ..transport import gather_shards
from ._record import key_value
from ._state import ENGINE
from ._trace import GETITEM, INPUT, Trace

__all__ = ["EXACT_OPS", "HOST_READ_BYTES", "MOVE_OPS", "collect_keys", "host_closure", "host_entry", "replay"]

#: Ops that only move or select elements of their tensor arguments (their results equal on every backend).
MOVE_OPS = frozenset({
    "alias", "cat", "clone", "detach", "expand", "narrow", "permute", "reshape", "select", "slice", "squeeze",
    "t", "transpose", "unsqueeze", "view", "_unsafe_view", "lift_fresh_copy",
})
#: Ops replayed on the host when every tensor they read and make is an integer or bool tensor and their other
#: arguments are ints, bools, dtypes or devices: integer and boolean arithmetic is exact (wrapping alike on
#: overflow), so XLA's program and torch's CPU kernels agree bit for bit. Division and remainders are left out
#: (torch raises on an integer division by zero; a program gives a value), and so is indexing by a tensor (torch
#: raises on an index out of range; a program clamps it).
EXACT_OPS = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "isin", "any", "all", "sum", "cumsum", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_xor", "logical_not", "mul", "add", "sub",
    "neg", "abs", "where", "masked_fill", "maximum", "minimum", "amax", "amin", "max", "min", "clamp", "_to_copy",
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "new_ones", "new_zeros", "new_full", "arange",
    "scalar_tensor", "constant_pad_nd",
})
#: The ops of ``EXACT_OPS`` that fill with a value: an integral float value (``torch.ones`` is ``full`` of ``1.0``,
#: ``F.pad`` pads with ``0.0``) converts exactly into their integer or bool result.
_FILL_OPS = frozenset({"full", "full_like", "new_full", "scalar_tensor", "constant_pad_nd"})
#: The largest value computed this way, and the most bytes one computation may gather or make on the way (each):
#: above it, a program that gathers once is cheaper than many small gathers.
HOST_READ_BYTES = 1 << 20
#: The most device values one computation may gather (each is a transfer per device).
_MAX_GATHERS = 1024
#: The most computing ops one computation may replay (a few microseconds each on the CPU).
_MAX_COMPUTE_OPS = 256
_CPU = torch.device("cpu")

logger = logging.getLogger(__name__)


def collect_keys(key: Any, found: list[int]) -> None:
    """The entries one argument key reads (an int, or ints in a list or tuple key; see ``_record._key``)."""
    if type(key) is int:
        found.append(key)
    elif type(key) is tuple and key and (key[0] is list or key[0] is tuple):
        for k in key[1]:
            collect_keys(k, found)


def host_entry(trace: Trace, i: int) -> tuple[bool, bool, list[int]]:
    """Whether entry ``i`` alone may be computed on the host (a small input or value of an allowed op), whether it
    computes (an ``EXACT_OPS`` op, not a move), and the entries it reads."""
    out = trace.outs[i]
    if out[0] != "T" or math.prod(out[1]) * out[2].itemsize > HOST_READ_BYTES:
        return False, False, []
    entry = trace.entries[i]
    kind = entry[0]
    if kind == INPUT:
        return True, False, []
    if kind == GETITEM or kind < 0:
        return False, False, []
    info = ENGINE.ops_by_id[kind]
    packet = getattr(info.func, "overloadpacket", None) if info is not None else None
    if packet is None or info is None or info.random:
        return False, False, []
    name = packet.__name__
    found: list[int] = []
    keys = (*entry[1], *(k for _, k in entry[2]))
    for key in keys:
        collect_keys(key, found)
    if name in MOVE_OPS:
        return True, False, found
    outs = trace.outs
    fill = name in _FILL_OPS
    exact = (name in EXACT_OPS and not _inexact(out[2]) and not any(_inexact(outs[j][2]) for j in found)
             and all(_exact_argument(k, fill) for k in keys))
    return exact, True, found


def host_closure(trace: Trace, roots: list[int], stop: set[int] | None = None) -> list[int] | None:
    """The entries ``roots`` read, transitively (not past ``stop``), in trace order, when each may be computed on
    the host (:func:`host_entry`) and together they stay within the bounds on gathers and ops; else None."""
    seen: set[int] = set()
    todo = list(roots)
    gathers = computes = gathered = 0
    while todo:
        i = todo.pop()
        if i in seen or (stop is not None and i in stop):
            continue
        seen.add(i)
        ok, computing, found = host_entry(trace, i)
        if not ok:
            return None
        if trace.entries[i][0] == INPUT:
            out = trace.outs[i]
            gathers += 1
            gathered += math.prod(out[1]) * out[2].itemsize
            if gathers > _MAX_GATHERS or gathered > HOST_READ_BYTES:
                return None
        computes += computing
        if computes > _MAX_COMPUTE_OPS:
            return None
        todo.extend(found)
    return sorted(seen)


def replay(trace: Trace, order: list[int]) -> dict[int, Any] | None:
    """The CPU values of the entries ``order`` (a :func:`host_closure`): inputs gathered from their devices (each
    once: later replays reuse the copy), ops run by torch. The values may share memory with those copies: copy
    before writing. None when an input cannot be gathered (a replaced virtual device, a manual-sharding value,
    donated buffers) or torch refuses an op (the program path then decides)."""
    vd = virtual_device()
    ordinal = {i: n for n, i in enumerate(i for i, e in enumerate(trace.entries) if e[0] == INPUT)}
    values: dict[int, Any] = {}
    for i in order:
        entry = trace.entries[i]
        if entry[0] == INPUT:
            source = trace.inputs[ordinal[i]]
            if source.generation != vd.generation or source.sharding.is_manual or not source.buffers:
                return None
            if source.host is None:  # replays never write their inputs: the copy serves every later replay
                source.host = gather_shards(source.shape, source.dtype, source.sharding, source.buffers, vd.device_ids)
            values[i] = source.host
            continue
        info = ENGINE.ops_by_id[entry[0]]
        assert info is not None
        args = tuple(key_value(k, values, trace.scalars, host=True) for k in entry[1])
        kwargs = {name: _CPU if name == "device" else key_value(k, values, trace.scalars, host=True)
                  for name, k in entry[2]}
        try:
            values[i] = info.func(*args, **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:  # the program gives its own verdict
            logger.debug("%s refused on the host (%s): it runs in a program", info.name, exc)
            return None
    return values


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
    if tag is float:  # the key holds 0.0, -0.0 and nan as text (``_record._key``)
        value = float(key[1])
        return fill and value.is_integer() and abs(value) <= 1 << 24
    if tag is ScalarSlot:
        return len(key) > 2  # an int or bool fill value; a float one may be rounded into the dtype
    if tag is list or tag is tuple:
        return all(_exact_argument(k, fill) for k in key[1])
    return False
