"""Recording: an op on pjrt tensors (or their data) becomes one entry of the pending trace, and its results
pending values (see ``_trace`` for what an entry is).

Returns tensor data (:class:`TensorData` in the LAZY state) or the trace's :class:`LazyValue`s, never tensors:
the frontend wraps them. The frontend registers its tensor class (:func:`register_tensor_type`) so that its
tensors are read by their data here.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ...errors import UnsupportedOpError, VirtualDeviceError
from ..devices import next_rng_key, virtual_device
from ..lowering import ScalarSlot
from ..sharding import OpSharding
from ..transport import TensorData, TensorState, check_current, upload
from ._op_info import SPECIAL_VALUES, OpInfo, op_info
from ._output_specs import decomposition_output_spec, output_spec
from ._state import ENGINE
from ._trace import GETITEM, INPUT, LazyValue, Step, Trace, TraceInput

__all__ = [
    "hold",
    "key_value",
    "on_mark_sharding",
    "pending_data",
    "pending_ops",
    "raise_stale",
    "record",
    "record_data",
    "record_values",
    "register_tensor_type",
    "spec_token",
]

aten = torch.ops.aten
_LAZY, _HOST, _DEVICE = TensorState.LAZY, TensorState.HOST, TensorState.DEVICE
_META = torch.device("meta")
_BARE_CONSTANTS = frozenset({str, torch.dtype, torch.device, torch.layout, torch.memory_format})
_INF = float("inf")
_EXACT = 2**53  # ints up to this size are exact in the float64 vector of run-time scalars



class _NoTensorType:
    """Stands for the frontend's tensor class until it registers (no value is of this type)."""


#: The frontend's tensor class (its instances carry ``_pjrt_data``); see :func:`register_tensor_type`.
_tensor_type: Any = _NoTensorType


def register_tensor_type(cls: type) -> None:
    """Read instances of ``cls`` (the frontend's tensor subclass) as their ``_pjrt_data`` in recorded ops."""
    global _tensor_type
    _tensor_type = cls


def pending_ops() -> int:
    """How many ops are recorded and not yet run."""
    with ENGINE.lock:
        trace = ENGINE.trace
        return trace.ops if trace is not None else 0


# -- argument keys ---------------------------------------------------------------------------


def spec_token(spec: OpSharding) -> int:
    """A small int standing for ``spec`` in keys (equal specs, one token)."""
    by_id = ENGINE.spec_tokens_by_id
    hit = by_id.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    tokens = ENGINE.spec_tokens
    token = tokens.get(spec)
    if token is None:
        token = tokens[spec] = len(tokens) + 1
    if len(by_id) > 4096:
        by_id.clear()
    by_id[id(spec)] = (spec, token)
    return token


class _Unique:
    """Tags a constant the tracer cannot key by value: its entry equals no other, so the step compiles anew."""

    __slots__ = ()


def _key(trace: Trace, value: Any, lift: bool, fill: bool = False) -> Any:
    """The key of one operator argument (see ``_trace``); registers inputs and run-time scalars. ``lift``: its
    floats become run-time scalars; ``fill``: a fill op's value, whose ints and bools do too (``_lift_exact``)."""
    kind = type(value)
    if kind is _tensor_type:
        return _ref(trace, value._pjrt_data)
    if kind is int:
        return _lift_exact(trace, value, int) if fill and value not in (0, 1) and -_EXACT <= value <= _EXACT \
            else (int, value)
    if kind is float:
        if lift and value not in SPECIAL_VALUES and value == value and value != _INF and value != -_INF:
            trace.scalars.append(value)
            return (ScalarSlot, len(trace.scalars) - 1)
        return (float, value) if value and value == value else (float, repr(value))  # -0.0 and nan by text
    if kind is list or kind is tuple:  # mostly ints (sizes) or tensors (a foreach op's lists): those inline
        return (kind, tuple([(int, v) if type(v) is int else _ref(trace, v._pjrt_data) if type(v) is _tensor_type
                             else _ref(trace, v) if type(v) is TensorData else _key(trace, v, lift) for v in value]))
    if kind is bool:
        return _lift_exact(trace, value, bool) if fill else (bool, value)
    if value is None or kind in _BARE_CONSTANTS:
        return value
    if isinstance(value, _tensor_type):
        return _ref(trace, value._pjrt_data)
    if isinstance(value, TensorData):
        return _ref(trace, value)
    if isinstance(value, torch.Tensor):
        return _cpu_ref(trace, value)
    if isinstance(value, (list, tuple)):  # torch.Size, named tuples
        return (tuple, tuple([_key(trace, v, lift) for v in value]))
    return (_Unique(), value)


def _lift_exact(trace: Trace, value: int, kind: type) -> tuple:
    """An int or bool fill value as a run-time scalar: the key keeps its type, which the result's dtype may
    follow (``torch.full(size, True)`` is a bool tensor); the float64 scalar holds it exactly (``_EXACT``)."""
    trace.scalars.append(value)
    return (ScalarSlot, len(trace.scalars) - 1, kind)


def key_value(key: Any, nodes: Any, scalars: list[float], host: bool = False) -> Any:
    """The graph argument a key stands for (the inverse of ``_key``, tensors as ``nodes[index]``). ``host``: run-time
    scalars as their Python values (an int or bool fill as its own type), for replaying ops with torch on the CPU."""
    kind = type(key)
    if kind is int:
        return nodes[key]
    if kind is not tuple:
        return key
    tag = key[0]
    if tag is float:
        return key[1] if type(key[1]) is float else float(key[1])
    if tag is ScalarSlot:
        if host:
            return key[2](scalars[key[1]]) if len(key) > 2 else scalars[key[1]]
        return ScalarSlot(scalars[key[1]], key[1])
    if tag is list:
        return [key_value(k, nodes, scalars, host) for k in key[1]]
    if tag is tuple:
        return tuple(key_value(k, nodes, scalars, host) for k in key[1])
    return key[1]  # int, bool, _Unique


def _lifts_here(args: tuple, kwargs: dict) -> bool:
    """Whether a lifting op computes in floating point here (its floats become run-time scalars)."""
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return bool(dtype.is_floating_point)
    saw_tensor = False
    for a in args:
        if type(a) is list and a:
            a = a[0]
        if isinstance(a, (torch.Tensor, TensorData)):
            if a.dtype.is_floating_point:
                return True
            saw_tensor = True
    return not saw_tensor  # a factory (full) of a float: the default dtype


def _ref(trace: Trace, data: TensorData) -> int:
    """The entry index of ``data``'s value in ``trace``: its pending value, or a new input."""
    state = data.state
    if state is _LAZY:
        value: LazyValue = data.lazy
        if value.trace is trace:
            return value.index
        raise_stale(value)
    if state is _HOST:
        if data.uninitialized:
            return _zeros_for_unwritten(data)
        if data.recipe is not None:
            index = _recompute_from_recipe(trace, data)
            if index is not None:
                return index
        upload(data, data.annotation)
    if data.generation != virtual_device().generation:  # also for an input the trace has: the device may be new
        check_current(data)
    key = (data.id, data.version)
    index = trace.input_ids.get(key)
    if index is None:
        assert data.sharding is not None
        entry = (INPUT, data.shape, data.dtype, spec_token(data.sharding))
        index = _append(trace, entry, ("T", data.shape, data.dtype))
        trace.input_ids[key] = index
        trace.inputs.append(TraceInput(data))
    return index


def _append(trace: Trace, entry: tuple, out: Any) -> int:
    """Add an entry whose output spec is known without shape inference (an input)."""
    step = trace.cursor.next.get(entry)
    if step is None:
        step = trace.cursor.next[entry] = Step(out, entry)
        ENGINE.steps += 1
    trace.cursor = step
    trace.entries.append(step.entry)  # type: ignore[arg-type]
    trace.outs.append(step.out)
    return len(trace.entries) - 1


def _cpu_ref(trace: Trace, tensor: torch.Tensor) -> int:
    """A CPU tensor used with pjrt tensors (an index, a scalar tensor): uploaded replicated as an input."""
    if tensor.device.type == "meta":
        raise VirtualDeviceError("a meta tensor cannot be combined with pjrt tensors")
    if tensor.device.type != "cpu":
        raise VirtualDeviceError(f"cannot combine a tensor on {tensor.device} with pjrt tensors; move it to the CPU "
                                 "or to pjrt first")
    return _ref(trace, TensorData.from_host(tensor.detach()))


def _zeros_for_unwritten(data: TensorData) -> int:
    """Contents nobody wrote (``torch.empty``) read by an op: zeros made on the devices, nothing uploaded.

    ``torch.randn(..., device="pjrt")`` is ``empty`` + ``normal_``, which overwrites them anyway. Factories are
    recorded on the meta device: the lowering makes them on every device whatever device they name.
    """
    value = record_values(op_info(aten.zeros.default), (list(data.shape),), {"dtype": data.dtype, "device": _META})
    return value.index


def _recompute_from_recipe(trace: Trace, data: TensorData) -> int | None:
    """HOST contents a factory made (``torch.ones``, a mask, an integer ``arange``) computed in the graph
    by the same op instead of uploaded every step; None when that op cannot be recorded as it is."""
    assert data.recipe is not None
    op, args, kwargs = data.recipe
    info = op_info(op)
    if not info.recordable or data.annotation is not None:
        return None
    value = record_values(info, args, {**kwargs, "device": _META})
    if trace.outs[value.index] != ("T", data.shape, data.dtype):
        raise VirtualDeviceError(f"internal: {info.name} does not remake a {data.dtype} tensor of shape "
                                 f"{list(data.shape)}")
    return int(value.index)


def raise_stale(value: LazyValue) -> None:
    """Raise for a pending value whose trace failed (or, never expected, already ran)."""
    error = value.trace.error
    if error is not None:
        raise VirtualDeviceError(f"this tensor's pending computation failed earlier: {error}") from error
    raise VirtualDeviceError("internal: a pending tensor belongs to a finished graph")


# -- recording -------------------------------------------------------------------------------


def record_values(info: OpInfo, args: tuple, kwargs: dict, whole: bool = False) -> Any:
    """Record ``info.func(*args, **kwargs)``: its pending results as :class:`LazyValue`s (one, or a list/tuple
    with None for outputs not asked for). ``whole``: an op lowered through its decomposition, recorded only
    where that lowers (else :class:`~._output_specs.NotWhole`). Call with ``ENGINE.lock`` held."""
    trace = ENGINE.trace
    if trace is None:
        trace = ENGINE.current_trace()
    tensor_type = _tensor_type
    lift: bool | None = None  # worked out at the first argument that is not a pjrt tensor (only _key reads it)
    fill = info.fills
    keys = []
    for a in args:  # _key, with its most common case (a tensor of this trace) inline
        if type(a) is tensor_type:
            data = a._pjrt_data
            value = data.lazy
            keys.append(value.index if value is not None and value.trace is trace and data.state is _LAZY
                        else _ref(trace, data))
        else:
            if lift is None:
                lift = info.lifts and _lifts_here(args, kwargs)
            keys.append(_key(trace, a, lift, fill))
    if info.is_view and not kwargs and (info.func is _SLICE or info.func is _SELECT) and type(keys[0]) is int:
        keys = _narrow_through_cat(trace, info.func is _SELECT, keys)
    if kwargs:
        if lift is None:
            lift = info.lifts and _lifts_here(args, kwargs)
        entry = (info.id, tuple(keys), tuple([(k, _key(trace, v, lift, fill)) for k, v in kwargs.items()]))
    else:
        entry = (info.id, tuple(keys), ())
    cursor = trace.cursor
    step = cursor.next.get(entry)
    if step is None:
        spec = decomposition_output_spec(info, args, kwargs) if whole else output_spec(info, args, kwargs)
        step = Step(spec, entry)
        cursor.next[entry] = step
        ENGINE.steps += 1
    trace.cursor = step
    entries, outs = trace.entries, trace.outs
    index = len(entries)
    out = step.out
    entries.append(step.entry)  # type: ignore[arg-type]
    outs.append(out)
    trace.ops += 1
    if info.random:  # its numbers are a function of the device RNG state now (what fork_rng/checkpoint restore)
        trace.rng.append(next_rng_key())
    views = None
    base_data: TensorData | None = None
    if info.is_view and args:
        base = args[0]
        base_data = base._pjrt_data if isinstance(base, tensor_type) else base if isinstance(base, TensorData) else None
        if base_data is not None:
            views = _view_links(step, info, args, kwargs)
    if out[0] == "T":
        value = LazyValue(trace, index)
        if views is not None and base_data is not None:
            value.base, value.view = weakref.ref(base_data), views
        return value
    items = step.items
    if items is None:
        items = step.items = [(GETITEM, index, i) for i in range(len(out[1]))]  # the step fixes index
    results: list[LazyValue | None] = []
    for i, item in enumerate(out[1]):
        if item[0] == "N":
            results.append(None)
            continue
        value = LazyValue(trace, len(entries))
        entries.append(items[i])
        outs.append(item)
        if views is not None and base_data is not None:
            value.base, value.view = weakref.ref(base_data), views[i]
        results.append(value)
    return results if out[0] == "L" else tuple(results)


#: Compared by identity: an OpOverload's ``__hash__`` is Python code, too slow for every view op.
_CAT, _SELECT, _SLICE = aten.cat.default, aten.select.int, aten.slice.Tensor


def _narrow_through_cat(trace: Trace, select: bool, keys: list[Any]) -> list[Any]:
    """The keys of ``slice``/``select`` of a pending ``cat`` made to read the one operand the range falls in.

    Why: ``generate`` appends each new token to ``input_ids`` with ``cat`` and reads back the last one
    (``input_ids[:, -1:]``); read through the ``cat``, the next step's program would take the whole growing
    tensor as an input and differ at every token. Read from the operand, it depends on the new token only.
    The op keeps its base for view semantics (the recorded entry only reads another pending value).
    """
    while True:
        source = keys[0]
        entry = trace.entries[source]
        if entry[0] <= 0 or entry[2] or ENGINE.ops_by_id[entry[0]].func is not _CAT:  # type: ignore[union-attr]
            return keys
        operands = entry[1][0]
        _, shape, dtype = trace.outs[source]
        rank = len(shape)
        cat_dim = entry[1][1] if len(entry[1]) > 1 else (int, 0)
        dim = keys[1] if len(keys) > 1 else (int, 0)
        if (type(operands) is not tuple or operands[0] not in (list, tuple) or not rank
                or type(cat_dim) is not tuple or cat_dim[0] is not int or type(dim) is not tuple or dim[0] is not int
                or cat_dim[1] % rank != dim[1] % rank):
            return keys
        axis = dim[1] % rank
        size = shape[axis]
        if select:
            if len(keys) != 3 or type(keys[2]) is not tuple or keys[2][0] is not int:
                return keys
            start = keys[2][1] + size if keys[2][1] < 0 else keys[2][1]
            end = start + 1
        else:
            bounds = [_slice_bound(keys[i] if len(keys) > i else None, default, size)
                      for i, default in ((2, 0), (3, size))]
            if None in bounds or (len(keys) > 4 and keys[4] != (int, 1)) or len(keys) > 5:
                return keys
            start, end = bounds  # type: ignore[misc]
        if not 0 <= start < end <= size:
            return keys
        offset = 0
        for ref in operands[1]:
            if type(ref) is not int:
                return keys
            _, part_shape, part_dtype = trace.outs[ref]
            if part_dtype != dtype or len(part_shape) != rank:
                return keys
            length = part_shape[axis]
            if offset <= start and end <= offset + length:
                break
            offset += length
        else:
            return keys
        if select:
            keys = [ref, keys[1], (int, start - offset)]
        else:
            keys = [ref, keys[1], (int, start - offset), (int, end - offset), *keys[4:]]


def _slice_bound(key: Any, default: int, size: int) -> int | None:
    """A slice's start or end from its key, made non-negative and clamped to ``size``; None if not a constant."""
    if key is None:
        return default
    if type(key) is not tuple or key[0] is not int:
        return None
    value = key[1] + size if key[1] < 0 else key[1]
    return min(max(value, 0), size)


def record(info: OpInfo, args: tuple, kwargs: dict, whole: bool = False) -> Any:
    """:func:`record_values`, with each result as new pending :class:`TensorData` (the frontend wraps them)."""
    values = record_values(info, args, kwargs, whole)
    if type(values) is LazyValue:
        return pending_data(values)
    results = [pending_data(v) if v is not None else None for v in values]
    return results if type(values) is list else tuple(results)


def pending_data(value: LazyValue) -> TensorData:
    """New LAZY data holding ``value`` (known to its trace, which hands it its result when it runs)."""
    _, shape, dtype = value.trace.outs[value.index]
    data = TensorData.pending(shape, dtype, value)
    value.trace.values.append(weakref.ref(data))
    return data


def hold(data: TensorData, value: LazyValue) -> None:
    """Make existing ``data`` hold the pending ``value`` (an in-place write; the frontend handles its views)."""
    data.set_lazy(value)
    value.trace.values.append(weakref.ref(data))


def _view_links(step: Step, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """How the view op's result derives from ``args[0]``: ``((op, arguments after the tensor),)``; for an op
    returning several views, a list of those, one per piece. Kept in the op's step when no tensor is among
    those arguments (equal entries then mean equal arguments), so a cache hit builds none of it."""
    links = step.links
    if links is not None:
        return links
    out = step.out
    if out[0] == "T":
        links = ((info.func, tuple(args[1:])),)
    else:
        links = [(piece,) for piece in _piece_views(info, args, kwargs, out[1])]
    if not any(isinstance(a, (torch.Tensor, TensorData)) for a in pytree.tree_leaves((args[1:], kwargs))):
        step.links = links
    return links


def _piece_views(info: OpInfo, args: tuple, kwargs: dict, items: Sequence[Any]) -> list[tuple[Any, tuple]]:
    """For an op returning several views of its input (``split``, ``chunk``, ``unbind``, ...): each piece as the
    one view op that makes it (``select`` or ``slice`` along the op's dimension)."""
    schema = info.func._schema
    position = next((i for i, a in enumerate(schema.arguments) if a.name == "dim"), None)
    if position is None:
        raise UnsupportedOpError(info.name, f"internal: {info.name} returns views but has no dim argument")
    dim = args[position] if position < len(args) else kwargs.get("dim", schema.arguments[position].default_value)
    dim = dim % max(len(args[0].shape), 1)
    if info.func.overloadpacket.__name__ == "unbind":
        return [(aten.select.int, (dim, i)) for i in range(len(items))]
    pieces, start = [], 0
    for item in items:
        size = item[1][dim]
        pieces.append((aten.slice.Tensor, (dim, start, start + size, 1)))
        start += size
    return pieces


def record_data(func: Any, args: tuple) -> list[TensorData]:
    """Record ``func(*args)``, an op returning a list of tensors whose arguments may hold tensor data in lists,
    and return its results' data (a torch.compile region: the frontend hands torch meta tensors linked to it)."""
    with ENGINE.lock:
        return [pending_data(value) for value in record_values(op_info(func), args, {})]


def on_mark_sharding(data: TensorData) -> None:
    """``mark_sharding`` on a pending tensor: its value gets a sharding constraint in the graph."""
    value = data.lazy
    if isinstance(value, LazyValue) and data.annotation is not None:
        value.trace.pins[value.index] = data.annotation
