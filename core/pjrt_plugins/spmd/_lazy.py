"""Lazy tracing: ATen ops on ``pjrt`` tensors are recorded into one pending graph and run at materialization.

``dispatch`` (called from ``XLAShardedTensor.__torch_dispatch__``) records an op as one compact
entry (decomposing non-lowered ops with torch's decompositions); ``materialize`` / ``sync`` look
the trace's program up in the compile cache, build its torch.fx graph only on a miss, and execute
it, leaving the results on the devices. Never moves bytes itself except through ``_transfer``.
"""

from __future__ import annotations

import logging
import operator
import re
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import DataDependentShapeError, UnsupportedOpError, VirtualDeviceError
from . import _executor, _fallback, _transfer
from ._data import TensorData, TensorState
from ._device import TORCH_DEVICE, next_rng_key, virtual_device
from .lowering import (
    COMPLEX_LOWERINGS,
    META_RULES,
    ScalarSlot,
    decomposition_for,
    foreach_plan,
    functional_variant,
    has_lowering,
    is_foreach,
    is_inplace,
    is_random,
    lowered_decomposition_outputs,
    op_name,
    refuse_generator,
)
from ._sharding import ShardingSpec

logger = logging.getLogger(__name__)
aten = torch.ops.aten
_LAZY, _HOST, _DEVICE = TensorState.LAZY, TensorState.HOST, TensorState.DEVICE

__all__ = [
    "LazyValue",
    "cpu_fallback_enabled",
    "dispatch",
    "manual_seed",
    "materialize",
    "pending_ops",
    "set_cpu_fallback",
    "sync",
]


# =====================================================================================
# the pending trace
# =====================================================================================
#
# Recording keeps, per op, one small hashable *entry*: ``(op id, argument keys, keyword keys)``
# where a tensor is the position of its value in the trace and a constant is tagged with its
# type (``1``, ``1.0`` and ``True`` are equal in Python, their keys are not). Inputs are
# ``(_INPUT, shape, dtype, sharding token)``. Consecutive entries walk a prefix tree of
# ``_Step``s that remember each op's output shapes, so an op seen before in the same place
# needs no shape inference, and the step a trace ends on names its whole sequence: with the
# live outputs, the sharding pins, the lowering options and the plugin, it is the key of the
# compiled program. The torch.fx graph is built from the entries only when that key misses.

_INPUT = 0  # entry kind of a graph input; operators are numbered from 1
_GETITEM = -1  # entry kind of one result of a multi-output operator: (_GETITEM, op position, i)


class LazyValue:
    """What ``TensorData.lazy`` holds: a value of a pending trace (``index``: its entry), and the base if it is a view.

    ``view`` says how a new view was derived from ``base``: a chain of one link ``((view op, its arguments
    after the tensor),)``; the TensorData made for it keeps that link (``TensorData.view_of``) so that an
    in-place op on the view can be written back into the base, and a write into the base reaches the view.
    ``keep_sharding`` is the layout a tensor updated in place had before: its new value is pinned to it,
    so state that lives across steps (parameters, optimizer buffers) keeps one layout and a repeated step
    compiles once.
    """

    __slots__ = ("trace", "index", "base", "view", "keep_sharding")

    def __init__(self, trace: _Trace, index: int) -> None:
        self.trace = trace
        self.index = index
        self.base: weakref.ref[TensorData] | None = None
        self.view: tuple[tuple[Any, tuple]] | None = None
        self.keep_sharding: ShardingSpec | None = None


class _Input:
    """A graph input: the device buffers its entry stands for, fixed at record time."""

    __slots__ = ("buffers", "generation", "sharding", "shape", "dtype")

    def __init__(self, data: TensorData) -> None:
        assert data.buffers is not None and data.sharding is not None
        self.buffers = data.buffers  # never changed in place: a state change replaces the list
        self.generation = data.generation
        self.sharding = data.sharding
        self.shape = data.shape
        self.dtype = data.dtype


class _Step:
    """A node of the prefix tree of recorded entries: the entry leading here and its output spec.

    What depends only on the entry and its place is made once, on the miss, and shared by every trace
    that passes here: the entry itself (a trace keeps the step's, so the equal tuples just built to find
    the step die at once and leave nothing for the cyclic GC), the entries of a multi-output op's results
    (``items``) and a view op's links to its base (``links``, see ``_view_links``).
    """

    __slots__ = ("next", "out", "entry", "items", "links")

    def __init__(self, out: Any, entry: tuple | None = None) -> None:
        self.next: dict[tuple, _Step] = {}
        self.out = out
        self.entry = entry
        self.items: list[tuple] | None = None
        self.links: Any = None


_root = _Step(None)
_steps = 0
#: Prefix-tree nodes kept before the tree starts over (a few hundred bytes each).
_MAX_STEPS = 250_000


class _Trace:
    """One pending trace: its entries (with output specs), inputs, run-time scalars and the tensors it feeds."""

    __slots__ = ("entries", "outs", "cursor", "inputs", "input_ids", "scalars", "rng", "values", "pins", "ops",
                 "error", "done")

    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.outs: list[Any] = []  # per entry: its output spec (see _out_spec)
        self.cursor = _root
        self.inputs: list[_Input] = []  # in entry order, which is the module's argument order
        self.input_ids: dict[tuple[int, int], int] = {}  # (data id, version) -> entry index
        #: Values of the run-time scalars (ScalarSlot index -> value), passed as one float64 input.
        self.scalars: list[float] = []
        #: The RNG key ``(seed, offset)`` of each random op, drawn when it was recorded (a run-time input).
        self.rng: list[tuple[int, int]] = []
        #: Weak references to every TensorData whose lazy value lives in this trace.
        self.values: list[weakref.ref[TensorData]] = []
        self.pins: dict[int, ShardingSpec] = {}  # entry index -> sharding constraint (mark_sharding)
        self.ops = 0
        self.error: BaseException | None = None
        self.done = False


_lock = threading.RLock()
_trace: _Trace | None = None


def _current_trace() -> _Trace:
    global _trace, _root, _steps
    if _trace is None:
        if _steps > _MAX_STEPS:
            _root, _steps = _Step(None), 0  # programs found through the old tree stay in the compile cache
        _trace = _Trace()
    return _trace


def pending_ops() -> int:
    """How many ops are recorded and not yet run."""
    with _lock:
        return _trace.ops if _trace is not None else 0


def set_cpu_fallback(enabled: bool) -> None:
    """Run ops that have no lowering on the CPU (on by default), or refuse them (``False``: strict).

    With the fallback on, such an op (and any op whose output shape depends on the data:
    ``nonzero``, ``masked_select``, boolean indexing, ``unique``) gathers its inputs to the
    CPU, runs there, and its results come back as deferred data; each op warns once with
    :class:`~pjrt_plugins.errors.CpuFallbackWarning` and every use is counted in
    ``metrics().fallbacks`` / ``fallback_ops``. Off, such an op raises
    :class:`~pjrt_plugins.errors.UnsupportedOpError` naming it. ``PJRT_CPU_FALLBACK=0`` starts
    a process strict. The fallback is slow (every use gathers and uploads): use the metrics to
    find what a model still needs.

    Example::

        idx = x.nonzero()           # data-dependent shape: runs on the CPU, warns once
        xs.metrics().fallback_ops   # {'aten.nonzero.default': 1}
        xs.set_cpu_fallback(False)  # strict: x.nonzero() now raises UnsupportedOpError
    """
    _fallback.set_enabled(enabled)


def cpu_fallback_enabled() -> bool:
    return _fallback.enabled()


def manual_seed(seed: int) -> None:
    """Restart the device RNG stream (``torch.manual_seed`` reaches this through the pjrt device)."""
    _executor.manual_seed(seed)


# =====================================================================================
# operators
# =====================================================================================

#: Ops whose Python float arguments are plain arithmetic operands: those become run-time scalars
#: (``ScalarSlot``), so a learning rate or an Adam bias correction that changes every step does not
#: change the program. Values some lowering special-cases stay constants.
_LIFTED_OPS = {"add", "sub", "rsub", "mul", "div", "pow", "clamp", "clamp_min", "clamp_max", "masked_fill", "where",
               "full", "full_like", "fill", "new_full", "lerp", "addcmul", "addcdiv", "adam_step",
               "sgd_step"}
_SPECIAL_VALUES = {0.0, 1.0, -1.0, 2.0, 3.0, 0.5, -0.5}
_FOREACH_PREFIX = "_foreach_"
#: The dispatch key of the foreach ops' kernels that loop over the per-tensor ops.
_COMPOSITE_EXPLICIT = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


class _OpInfo:
    """What the tracer needs to know about one operator, worked out once per process."""

    __slots__ = ("func", "id", "name", "node_name", "inplace", "functional", "recordable", "lifts", "is_view",
                 "foreach", "is_overload", "out_variant", "maskable", "inplace_view", "defaults", "random",
                 "decomposition", "whole", "strided")

    def __init__(self, func: Any, op_id: int) -> None:
        self.func = func
        self.id = op_id
        self.name = op_name(func)
        self.node_name = _CAMEL_HUMP.sub(r"_\1", getattr(func, "__name__", "op")).lower()
        self.is_overload = isinstance(func, torch._ops.OpOverload)
        self.inplace = is_inplace(func)
        self.functional = functional_variant(func) if self.inplace else None
        self.inplace_view = self.inplace and torch.Tag.inplace_view in func.tags
        self.defaults = _missing_defaults(func, self.functional) if self.functional is not None else ()
        self.foreach = is_foreach(func)
        self.random = is_random(func)
        packet = getattr(func, "overloadpacket", None)
        base = packet.__name__ if packet is not None else ""
        self.lifts = base.removeprefix(_FOREACH_PREFIX) in _LIFTED_OPS
        self.is_view = bool(getattr(func, "is_view", False))
        self.out_variant = _fallback.is_out_variant(func)
        # Indexing that a boolean mask makes data-dependent (the fallback's rule, asked once with a mask).
        self.maskable = _fallback.data_dependent(func, (None, [_MASK_PROBE]))
        plan = foreach_plan(func) if self.foreach else None
        # A foreach op is recorded whole when its per-tensor op is: one with run-time scalars
        # only when that op is lowered by hand (a traced decomposition would bake the values).
        self.recordable = has_lowering(func) or (
            plan is not None and (has_lowering(plan.element) or (not self.lifts and decomposition_for(plan.element))))
        self.decomposition = decomposition_for(func) if self.is_overload else None
        # An op with a decomposition is recorded whole where that decomposition lowers (checked once per
        # argument shapes): the decomposition then runs once, when its graph is lowered, not every step.
        # Not an op that writes an argument (native_batch_norm's running stats) or returns a view of one,
        # nor one whose floats would be run-time scalars (a decomposition cannot take those).
        self.whole = (self.decomposition is not None and not self.recordable and not self.foreach
                      and not self.lifts and not self.is_view and not _aliases_arguments(func))
        self.strided = func in _STRIDED_OPS


def _aliases_arguments(func: Any) -> bool:
    """Whether the op writes into one of its arguments or returns a view of one (per its schema)."""
    schema = getattr(func, "_schema", None)
    return schema is None or any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))


def _missing_defaults(func: Any, functional: Any) -> tuple[tuple[int, Any], ...]:
    """``(position, argument)`` of the in-place op's arguments with a default that its functional twin lacks
    (``bernoulli_()``'s ``p=0.5``, ``bernoulli.p``): a call that leaves them out must pass them to the twin."""
    twin = functional._schema.arguments
    return tuple((i, arg) for i, arg in enumerate(func._schema.arguments)
                 if arg.has_default_value() and not (i < len(twin) and twin[i].has_default_value()))


def _with_defaults(info: _OpInfo, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with the arguments of ``info.defaults`` that torch left out because they had their default."""
    args, kwargs = list(args), dict(kwargs)
    for i, arg in info.defaults:
        if i < len(args) or arg.name in kwargs:
            continue
        if arg.kwarg_only:
            kwargs[arg.name] = arg.default_value
        elif i == len(args):
            args.append(arg.default_value)
    return tuple(args), kwargs


_CAMEL_HUMP = re.compile(r"(?<=[a-z])([A-Z])")
_MASK_PROBE = torch.empty(0, dtype=torch.bool)
#: id(operator) -> its info (the info keeps the operator alive, so ids are never reused).
_op_infos: dict[int, _OpInfo] = {}
_ops_by_id: list[_OpInfo | None] = [None]


def _op_info(func: Any) -> _OpInfo:
    info = _op_infos.get(id(func))
    if info is None:
        with _lock:
            info = _op_infos.get(id(func))
            if info is None:
                info = _OpInfo(func, len(_ops_by_id))
                _ops_by_id.append(info)
                _op_infos[id(func)] = info
    return info


# Sharding tokens: small ints standing for ShardingSpec values in keys (equal specs, one token).
_spec_tokens: dict[ShardingSpec, int] = {}
_spec_tokens_by_id: dict[int, tuple[ShardingSpec, int]] = {}


def _spec_token(spec: ShardingSpec) -> int:
    hit = _spec_tokens_by_id.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    token = _spec_tokens.get(spec)
    if token is None:
        token = _spec_tokens[spec] = len(_spec_tokens) + 1
    if len(_spec_tokens_by_id) > 4096:
        _spec_tokens_by_id.clear()
    _spec_tokens_by_id[id(spec)] = (spec, token)
    return token


# =====================================================================================
# recording
# =====================================================================================


_tensor_mod: Any = None
_XST: Any = None  # the XLAShardedTensor class
_wrap: Any = None  # tensor.wrap


def _tensor_module() -> Any:
    """``spmd.tensor`` (imported late: it imports this module); cached, the tracer asks on every op."""
    global _tensor_mod, _XST, _wrap
    if _tensor_mod is None:
        from . import tensor

        _XST, _wrap = tensor.XLAShardedTensor, tensor.wrap
        _tensor_mod = tensor
    return _tensor_mod


class _Unique:
    """Tags a constant the tracer cannot key by value: its entry equals no other, so the step compiles anew."""

    __slots__ = ()


_BARE_CONSTANTS = frozenset({str, torch.dtype, torch.device, torch.layout, torch.memory_format})
_INF = float("inf")


def _key(trace: _Trace, value: Any, lift: bool) -> Any:
    """The key of one operator argument (see the note at the top); registers inputs and run-time scalars."""
    kind = type(value)
    if kind is _XST:
        return _ref(trace, value._pjrt_data)
    if kind is int:
        return (int, value)
    if kind is float:
        if lift and value not in _SPECIAL_VALUES and value == value and value != _INF and value != -_INF:
            trace.scalars.append(value)
            return (ScalarSlot, len(trace.scalars) - 1)
        return (float, value) if value and value == value else (float, repr(value))  # -0.0 and nan by text
    if kind is list or kind is tuple:  # mostly ints (sizes) or tensors (a foreach op's lists): those inline
        return (kind, tuple([(int, v) if type(v) is int else _ref(trace, v._pjrt_data) if type(v) is _XST
                             else _ref(trace, v) if type(v) is TensorData else _key(trace, v, lift) for v in value]))
    if kind is bool:
        return (bool, value)
    if value is None or kind in _BARE_CONSTANTS:
        return value
    if isinstance(value, _XST):
        return _ref(trace, value._pjrt_data)
    if isinstance(value, torch.Tensor):
        return _cpu_ref(trace, value)
    if isinstance(value, (list, tuple)):  # torch.Size, named tuples
        return (tuple, tuple([_key(trace, v, lift) for v in value]))
    return (_Unique(), value)


def _value_of(key: Any, nodes: list[fx.Node], scalars: list[float]) -> Any:
    """The graph argument a key stands for (the inverse of ``_key``, tensors as their nodes)."""
    kind = type(key)
    if kind is int:
        return nodes[key]
    if kind is not tuple:
        return key
    tag = key[0]
    if tag is float:
        return key[1] if type(key[1]) is float else float(key[1])
    if tag is ScalarSlot:
        return ScalarSlot(scalars[key[1]], key[1])
    if tag is list:
        return [_value_of(k, nodes, scalars) for k in key[1]]
    if tag is tuple:
        return tuple(_value_of(k, nodes, scalars) for k in key[1])
    return key[1]  # int, bool, _Unique


def _lifts_here(args: tuple, kwargs: dict) -> bool:
    """Whether a lifting op computes in floating point here (its floats become run-time scalars)."""
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return dtype.is_floating_point
    saw_tensor = False
    for a in args:
        if type(a) is list and a:
            a = a[0]
        if isinstance(a, torch.Tensor):
            if a.dtype.is_floating_point:
                return True
            saw_tensor = True
    return not saw_tensor  # a factory (full) of a float: the default dtype


def _ref(trace: _Trace, data: TensorData) -> int:
    """The entry index of ``data``'s value in ``trace``: its pending value, or a new input."""
    state = data.state
    if state is _LAZY:
        value: LazyValue = data.lazy
        if value.trace is trace:
            return value.index
        _raise_stale(value)
    if state is _HOST:
        if data.uninitialized:
            return _unwritten(trace, data)
        if data.recipe is not None:
            index = _remade(trace, data)
            if index is not None:
                return index
        _transfer.upload(data, data.annotation)
    if data.generation != virtual_device().generation:  # also for an input the trace has: the device may be new
        _transfer.check_current(data)
    key = (data.id, data.version)
    index = trace.input_ids.get(key)
    if index is None:
        entry = (_INPUT, data.shape, data.dtype, _spec_token(data.sharding))
        index = _append(trace, entry, ("T", data.shape, data.dtype))
        trace.input_ids[key] = index
        trace.inputs.append(_Input(data))
    return index


def _append(trace: _Trace, entry: tuple, out: Any) -> int:
    """Add an entry whose output spec is known without shape inference (an input)."""
    global _steps
    step = trace.cursor.next.get(entry)
    if step is None:
        step = trace.cursor.next[entry] = _Step(out, entry)
        _steps += 1
    trace.cursor = step
    trace.entries.append(step.entry)
    trace.outs.append(step.out)
    return len(trace.entries) - 1


def _cpu_ref(trace: _Trace, tensor: torch.Tensor) -> int:
    """A CPU tensor used with pjrt tensors (an index, a scalar tensor): uploaded replicated as an input."""
    if tensor.device.type == "meta":
        raise VirtualDeviceError("a meta tensor cannot be combined with pjrt tensors")
    if tensor.device.type != "cpu":
        raise VirtualDeviceError(f"cannot combine a tensor on {tensor.device} with pjrt tensors; move it to the CPU "
                                 "or to pjrt first")
    return _ref(trace, TensorData.from_host(tensor.detach()))


def _unwritten(trace: _Trace, data: TensorData) -> int:
    """Contents nobody wrote (``torch.empty``) read by an op: zeros made on the devices, nothing uploaded.

    ``torch.randn(..., device="pjrt")`` is ``empty`` + ``normal_``, which overwrites them anyway.
    """
    value = _record(_op_info(aten.zeros.default), (list(data.shape),),
                    {"dtype": data.dtype, "device": TORCH_DEVICE}, wrap=False)
    return value.index


def _remade(trace: _Trace, data: TensorData) -> int | None:
    """HOST contents a factory made (``torch.ones``, a mask, an integer ``arange``) computed in the graph
    by the same op instead of uploaded every step; None when that op cannot be recorded as it is."""
    op, args, kwargs = data.recipe
    info = _op_info(op)
    if not info.recordable or data.annotation is not None:
        return None
    value = _record(info, args, {**kwargs, "device": TORCH_DEVICE}, wrap=False)
    if trace.outs[value.index] != ("T", data.shape, data.dtype):
        raise VirtualDeviceError(f"internal: {info.name} does not remake a {data.dtype} tensor of shape "
                                 f"{list(data.shape)}")
    return value.index


def _raise_stale(value: LazyValue) -> None:
    error = value.trace.error
    if error is not None:
        raise VirtualDeviceError(f"this tensor's pending computation failed earlier: {error}") from error
    raise VirtualDeviceError("internal: a pending tensor belongs to a finished graph")


def _to_meta(value: Any) -> Any:
    tmod = _tensor_module()
    if isinstance(value, tmod.XLAShardedTensor):
        return value._pjrt_data.meta()
    if isinstance(value, TensorData):  # recorded by data (record_data)
        return value.meta()
    if isinstance(value, torch.Tensor):
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    return value


def _meta_kwargs(kwargs: dict) -> dict:
    out = {k: _to_meta(v) for k, v in kwargs.items()}
    if "device" in out and out["device"] is not None:
        out["device"] = torch.device("meta")
    return out


def dispatch(func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``func(*args, **kwargs)`` on pjrt tensors; returns pjrt tensors holding pending values."""
    info = _op_infos.get(id(func)) or _op_info(func)
    if info.strided:
        _refuse_strided_view(info, args)
    if kwargs:
        refuse_generator(func, kwargs)
    else:
        kwargs = {}
    with _lock:
        if kwargs and info.out_variant:
            functional = _fallback.functional_of_out(func)
            if functional is not None:
                return _fallback.run_out_variant(func, args, kwargs, functional)
            return _fallback.refuse_or_run(func, args, kwargs)
        if info.inplace:
            return _dispatch_inplace(info, args, kwargs)
        if info.maskable and _fallback.data_dependent(func, args):
            return _fallback.refuse_or_run(func, args, kwargs, DataDependentShapeError(
                info.name, f"{info.name} with a boolean mask has a data-dependent result and the CPU "
                "fallback is off; use torch.where / masked_fill, or turn the fallback on"))
        if info.recordable:
            try:
                return _record(info, args, kwargs)
            except (DataDependentShapeError, _NotLowerable) as exc:
                return _fallback.refuse_or_run(func, args, kwargs, exc)
        if func is aten.equal.default:
            return bool(torch.all(torch.eq(args[0], args[1])).item()) if args[0].shape == args[1].shape else False
        if info.foreach:  # no per-tensor twin to record whole: torch's kernel calls the per-tensor ops
            return func.redispatch(_COMPOSITE_EXPLICIT, *args, **kwargs)
        if info.whole:
            try:
                return _record(info, args, kwargs, whole=True)
            except (_NotWhole, DataDependentShapeError):
                pass  # piece by piece below
            except _NotLowerable as exc:
                return _fallback.refuse_or_run(func, args, kwargs, exc)
        if info.decomposition is not None:
            if _computes_complex(func, args, kwargs):  # torch's complex decompositions write through views
                return _fallback.refuse_or_run(func, args, kwargs,
                                               _NotLowerable(info.name, f"{info.name} {_COMPLEX_REFUSAL}"))
            return info.decomposition(*args, **kwargs)
        # Composite ops (aten.to, aten.linear, ...) reach us below autograd: run their torch kernel.
        result = func.decompose(*args, **kwargs) if info.is_overload else NotImplemented
        if result is not NotImplemented:
            return result
        return _fallback.refuse_or_run(func, args, kwargs)


_COMPLEX_REFUSAL = ("computes with complex numbers, which the pjrt lowering does not support, and the CPU fallback "
                    "is off (xs.set_cpu_fallback(False)); turn it on, or compute it on the CPU (move the tensors with "
                    ".cpu())")


class _NotLowerable(UnsupportedOpError):
    """An op the lowering would compute wrongly on these arguments (complex numbers): the CPU fallback runs it."""


def _computes_complex(func: Any, args: tuple, kwargs: dict, meta_out: Any = None) -> bool:
    """True when a tensor argument or result of the op is complex (``meta_out``: its result on meta tensors,
    worked out here when not given)."""
    if any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in pytree.tree_leaves((args, kwargs, meta_out))):
        return True
    if meta_out is not None:
        return False
    try:
        meta_out = META_RULES.get(func, func)(*pytree.tree_map(_to_meta, args), **_meta_kwargs(kwargs))
    except Exception:  # noqa: BLE001 - no meta kernel: the caller's own path reports what is wrong
        return False
    return any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in pytree.tree_leaves(meta_out))


#: Ops that move complex elements without computing with them: lowered as for any other dtype.
_COMPLEX_MOVES = frozenset({aten.clone.default, aten.copy.default, aten.alias.default, aten.cat.default,
                            aten.stack.default, aten.slice_scatter.default, aten.select_scatter.default,
                            aten.diagonal_scatter.default, aten.as_strided_scatter.default})


def _refuse_complex(info: _OpInfo, args: tuple, kwargs: dict, meta_out: Any) -> None:
    """Raise :class:`_NotLowerable` when a tensor argument or result of the op is complex (no lowering computes
    complex numbers right; views and copies only move them)."""
    if info.is_view or info.func in _COMPLEX_MOVES or info.func in COMPLEX_LOWERINGS:
        return
    if _computes_complex(info.func, args, kwargs, meta_out if meta_out is not None else ()):
        raise _NotLowerable(info.name, f"{info.name} {_COMPLEX_REFUSAL}")


#: Ops whose strides and storage offset index the storage of their first argument.
_STRIDED_OPS = frozenset({aten.as_strided.default, aten.as_strided_copy.default, aten.as_strided_.default,
                          aten.as_strided_scatter.default})
#: View ops whose result, from a tensor that owns its storage, is contiguous at offset 0 on the CPU too.
_CONTIGUOUS_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "alias", "flatten", "view_as", "squeeze",
                               "unsqueeze"})


def _refuse_strided_view(info: _OpInfo, args: tuple) -> None:
    """``as_strided`` of a view indexes the viewed tensor's storage on the CPU; a pjrt view reports contiguous
    strides and offset 0 and has no such storage, so the same call would read other elements: refuse it
    (the CPU fallback would copy the view alone and give the same wrong values)."""
    data = getattr(args[0], "_pjrt_data", None) if args else None
    if data is None or data.view_of is None:
        return
    _, chain = data.view_of
    for view_op, _ in chain:
        if view_op is None or view_op.overloadpacket.__name__ not in _CONTIGUOUS_VIEWS:
            raise UnsupportedOpError(info.name, f"{info.name} of a view ({op_name(view_op)} of another tensor) is "
                                     "not supported on the pjrt device: pjrt tensors report contiguous strides and "
                                     "no storage offset, so its strides would index other elements than on the "
                                     "CPU. Call it on the tensor that owns the storage, or on a .clone() of the "
                                     "view.")


class _Unkeyable(Exception):
    """An argument that cannot be part of a cache key (the meta result is then computed afresh)."""


_CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _arg_spec(value: Any, any_float: bool = False) -> Any:
    """A hashable description of an argument: tensors by shape and dtype, constants by value.

    ``any_float``: floats count by type only (for ops whose output shape and dtype do not
    depend on a float's value, see ``_LIFTED_OPS``).
    """
    if any_float and type(value) is float:
        return ("float",)
    if isinstance(value, torch.Tensor):
        data = getattr(value, "_pjrt_data", None)
        if data is not None:
            return ("T", data.shape, data.dtype)
        return ("C", tuple(value.shape), value.dtype)
    if isinstance(value, TensorData):
        return ("T", value.shape, value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_arg_spec(v, any_float) for v in value))
    if isinstance(value, _CONSTANT_TYPES):
        return (type(value).__name__, value)
    raise _Unkeyable


def _out_spec(meta: Any) -> Any:
    if isinstance(meta, torch.Tensor):
        return ("T", tuple(meta.shape), meta.dtype)
    if meta is None:
        return ("N",)  # an output the caller did not ask for (convolution_backward's output_mask)
    if isinstance(meta, (tuple, list)):
        return ("L" if isinstance(meta, list) else "U", tuple(_out_spec(m) for m in meta))
    return ("X", type(meta).__name__)


def _out_meta(spec: Any) -> Any:
    kind = spec[0]
    if kind == "T":
        return torch.empty(spec[1], dtype=spec[2], device="meta")
    if kind in ("L", "U"):
        items = [_out_meta(s) for s in spec[1]]
        return items if kind == "L" else tuple(items)
    return None


#: (op, argument specs) -> output spec: ops on the same shapes need their meta kernel run once.
_meta_cache: dict[Any, Any] = {}
_META_CACHE_SIZE = 65536


def _output_spec(info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    """The output spec of ``info.func`` on these arguments, from meta tensors (memoized); refuses non-tensor results."""
    func = info.func
    try:
        key = (func, _arg_spec(args, info.lifts), tuple(sorted((k, _arg_spec(v, info.lifts)) for k, v in kwargs.items())))
    except _Unkeyable:
        key = None
    spec = _meta_cache.get(key) if key is not None else None
    if spec is None:
        try:
            meta_out = META_RULES.get(func, func)(*pytree.tree_map(_to_meta, args), **_meta_kwargs(kwargs))
        except NotImplementedError as exc:
            # Meta kernels refuse ops whose output shape depends on the data (nonzero, boolean masks).
            raise DataDependentShapeError(info.name, f"{info.name} cannot run on the pjrt device: its output "
                                          f"shape is not known before running it ({exc}), and the CPU fallback is "
                                          "off. Use a fixed-shape form (torch.where, masked_fill) or compute it on "
                                          "the CPU.") from exc
        _refuse_complex(info, args, kwargs, meta_out)
        spec = _out_spec(meta_out)
        if key is not None and _only_tensors(spec) and len(_meta_cache) < _META_CACHE_SIZE:
            _meta_cache[key] = spec
    if not _only_tensors(spec):
        kind = spec[1] if spec[0] == "X" else "list with non-tensors"
        raise UnsupportedOpError(info.name, f"{info.name} returns a {kind}, which the pjrt device cannot give "
                                 "before running the graph")
    return spec


def _only_tensors(spec: Any) -> bool:
    """A tensor, or a tuple/list of tensors and Nones (outputs an op was told not to compute)."""
    if spec[0] == "T":
        return True
    return spec[0] in ("L", "U") and all(s[0] == "N" or _only_tensors(s) for s in spec[1])


class _NotWhole(Exception):
    """The op's decomposition does not lower on these arguments: run it piece by piece instead."""


#: (op, argument specs) -> the output spec of its decomposition, or None where that does not lower.
_whole_specs: dict[Any, Any] = {}


def _whole_spec(info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    """The output spec of ``info.func`` recorded whole: its decomposition's (which may differ from the meta
    kernel's, and is what running it piece by piece gives); raises :class:`_NotWhole` where it does not lower."""
    try:
        key = (info.func, _arg_spec(args), tuple(sorted((k, _arg_spec(v)) for k, v in kwargs.items())))
    except _Unkeyable:
        raise _NotWhole from None
    spec = _whole_specs.get(key, _NOT_SEEN)
    if spec is _NOT_SEEN:
        outputs = lowered_decomposition_outputs(info.func, pytree.tree_map(_to_meta, args), _meta_kwargs(kwargs))
        spec = _out_spec(outputs) if outputs is not None else None
        if spec is not None and (not _only_tensors(spec) or _computes_complex(info.func, args, kwargs, outputs)):
            spec = None  # complex numbers: dispatch sends the op to the fallback
        if len(_whole_specs) < _META_CACHE_SIZE:
            _whole_specs[key] = spec
    if spec is None:
        raise _NotWhole
    return spec


_NOT_SEEN = object()


def _record(info: _OpInfo, args: tuple, kwargs: dict, wrap: bool = True, whole: bool = False) -> Any:
    """Record ``info.func(*args, **kwargs)``: pjrt tensors holding its pending results (``wrap=False``: the
    LazyValues only, for a caller that assigns them to existing tensors). ``whole``: an op lowered through its
    decomposition, recorded only where that lowers (else :class:`_NotWhole`)."""
    global _steps
    trace = _trace if _trace is not None else _current_trace()
    if _XST is None:
        _tensor_module()
    lift = info.lifts and _lifts_here(args, kwargs)
    keys = []
    for a in args:  # _key, with its most common case (a tensor of this trace) inline
        if type(a) is _XST:
            data = a._pjrt_data
            value = data.lazy
            keys.append(value.index if value is not None and value.trace is trace and data.state is _LAZY
                        else _ref(trace, data))
        else:
            keys.append(_key(trace, a, lift))
    entry = (info.id, tuple(keys), tuple([(k, _key(trace, v, lift)) for k, v in kwargs.items()]) if kwargs else ())
    cursor = trace.cursor
    step = cursor.next.get(entry)
    if step is None:
        step = _Step(_whole_spec(info, args, kwargs) if whole else _output_spec(info, args, kwargs), entry)
        cursor.next[entry] = step
        _steps += 1
    trace.cursor = step
    entries, outs = trace.entries, trace.outs
    index = len(entries)
    out = step.out
    entries.append(step.entry)
    outs.append(out)
    trace.ops += 1
    if info.random:  # its numbers are a function of the device RNG state now (what fork_rng/checkpoint restore)
        trace.rng.append(next_rng_key())
    views = _view_links(step, info, args, kwargs) if info.is_view and args and isinstance(args[0], _XST) else None
    if out[0] == "T":
        value = LazyValue(trace, index)
        if views is not None:
            value.base, value.view = weakref.ref(args[0]._pjrt_data), views
        return _wrap_value(trace, value, out) if wrap else value
    items = step.items
    if items is None:
        items = step.items = [(_GETITEM, index, i) for i in range(len(out[1]))]  # the step fixes index
    results = []
    for i, item in enumerate(out[1]):
        if item[0] == "N":
            results.append(None)
            continue
        value = LazyValue(trace, len(entries))
        entries.append(items[i])
        outs.append(item)
        if views is not None:
            value.base, value.view = weakref.ref(args[0]._pjrt_data), views[i]
        results.append(_wrap_value(trace, value, item) if wrap else value)
    return results if out[0] == "L" else tuple(results)


def _view_links(step: _Step, info: _OpInfo, args: tuple, kwargs: dict) -> Any:
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
    if not any(isinstance(a, torch.Tensor) for a in pytree.tree_leaves((args[1:], kwargs))):
        step.links = links
    return links


def _piece_views(info: _OpInfo, args: tuple, kwargs: dict, items: Sequence[Any]) -> list[tuple[Any, tuple]]:
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


def _wrap_value(trace: _Trace, value: LazyValue, out: Any) -> Any:
    data = TensorData.pending(out[1], out[2], value)
    trace.values.append(weakref.ref(data))
    return _wrap(data)


def _dispatch_inplace(info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    """``x.op_(...)``: record the functional op and make ``x`` (and the tensor it views) hold the result."""
    func = info.func
    if _XST is None:
        _tensor_module()
    if info.foreach:
        return _dispatch_foreach_inplace(info, args, kwargs)
    target = args[0]
    if isinstance(target, list):  # writes whole lists (_fused_sgd_, ...) and is not lowered
        return _fallback.refuse_or_run(func, args, kwargs)
    if not isinstance(target, _XST):
        raise VirtualDeviceError(f"{info.name} writes into a tensor on {target.device} from pjrt tensors; "
                                 "move the result with .cpu() instead")
    functional = info.functional
    if functional is None:
        return _fallback.refuse_or_run(func, args, kwargs, UnsupportedOpError(
            info.name, f"in-place operator {info.name} has no functional form the pjrt device can run, and "
            "the CPU fallback is off"))
    if info.defaults:
        args, kwargs = _with_defaults(info, args, kwargs)
    finfo = _op_info(functional)
    if info.inplace_view:  # squeeze_, t_, ...: the tensor itself becomes the view
        result = dispatch(functional, (), args, kwargs)
        if result._pjrt_data.state is not _LAZY:  # computed by the CPU fallback: a graph value of it
            result = _record(_op_info(aten.clone.default), (result,), {})
        _restride_in_place(func, args, kwargs, result)
        return target
    value = result = None
    if finfo.recordable and not finfo.maskable:
        try:
            value = _record(finfo, args, kwargs, wrap=False)
        except (DataDependentShapeError, _NotLowerable):
            value = None  # dispatch below sends it to the fallback
        if value is not None and not isinstance(value, LazyValue):
            raise UnsupportedOpError(info.name, f"internal: {finfo.name} did not give one tensor")
    if value is None:
        result = dispatch(functional, (), args, kwargs)
        if not isinstance(result, _XST):
            raise UnsupportedOpError(info.name, f"internal: {finfo.name} did not give one tensor")
        if result._pjrt_data.state is not _LAZY:  # computed by the CPU fallback: a graph value of it
            result = _record(_op_info(aten.clone.default), (result,), {})
        value = result._pjrt_data.lazy
    _assign_result(info, target._pjrt_data, value, fresh=result is None)
    return target


def _restride_in_place(func: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """``x.squeeze_()``, ``x.t_()``, ...: ``x`` itself becomes the view (its shape changes, its aliases keep theirs).

    The wrapper's sizes change by running the op on its metadata alone (no dispatch), as torch's
    own tensor subclasses do; its value is the recorded view.
    """
    from torch.utils._mode_utils import no_dispatch

    target = args[0]
    with no_dispatch():
        func(*args, **kwargs)
    target._pjrt_data = result._pjrt_data


def _dispatch_foreach_inplace(info: _OpInfo, args: tuple, kwargs: dict) -> Any:
    """``torch._foreach_op_(xs, ...)``: one recorded op for the whole list, its results assigned to ``xs``."""
    targets = args[0]
    finfo = _op_info(info.functional) if info.functional is not None else None
    if finfo is None or not finfo.recordable or not _all_pjrt(targets):
        return info.func.redispatch(_COMPOSITE_EXPLICIT, *args, **kwargs)  # the per-tensor in-place ops
    _record_and_assign(finfo, args, kwargs, targets, info)
    return None


def _all_pjrt(tensors: Sequence[Any]) -> bool:
    for t in tensors:  # a loop: all() of a generator costs more for lists of a model's parameters
        if not isinstance(t, _XST):
            return False
    return True


def record_data(func: Any, args: tuple) -> list[TensorData]:
    """Record ``func(*args)``, an op returning a list of tensors whose arguments may hold the data of pjrt
    tensors in lists, and return its results' data without making tensors for them (a torch.compile region:
    ``_compile`` hands torch meta tensors linked to the data)."""
    with _lock:
        results = []
        for value in _record(_op_info(func), args, {}, wrap=False):
            trace = value.trace
            _, shape, dtype = trace.outs[value.index]
            data = TensorData.pending(shape, dtype, value)
            trace.values.append(weakref.ref(data))
            results.append(data)
        return results


def record_into(func: Any, args: tuple, targets: Sequence[Any]) -> None:
    """Record ``func(*args)``, an op returning one tensor per pjrt tensor of ``targets``, and make each target
    hold its result (a fused optimizer step: one op writing whole lists of tensors)."""
    with _lock:
        _record_and_assign(_op_info(func), args, {}, targets, None)


def _record_and_assign(info: _OpInfo, args: tuple, kwargs: dict, targets: Sequence[Any],
                       written_by: _OpInfo | None) -> None:
    """Record ``info``'s op, whose results are one per target, and make each target hold its result
    (``written_by``: the in-place op the user called, named in errors; default ``info``'s)."""
    values = _record(info, args, kwargs, wrap=False)
    for target, value in zip(targets, values, strict=True):
        _assign_result(written_by or info, target._pjrt_data, value, fresh=True)


def _assign_result(info: _OpInfo, data: TensorData, value: LazyValue, fresh: bool = False) -> None:
    """An in-place op's result ``value`` becomes ``data``'s contents (cast to its dtype); ``fresh``: ``value``
    is ``_record``'s, held by nothing else (see ``_assign``)."""
    trace = value.trace
    _, shape, dtype = trace.outs[value.index]
    if shape != data.shape:
        raise RuntimeError(f"{info.name}: the result of shape {list(shape)} cannot be written into a tensor "
                           f"of shape {list(data.shape)}")
    if dtype != data.dtype:
        result = _wrap_value(trace, value, trace.outs[value.index])
        value = dispatch(aten._to_copy.default, (), (result,), {"dtype": data.dtype})._pjrt_data.lazy
        fresh = False
    _assign(data, value, fresh=fresh)


def _assign(data: TensorData, value: LazyValue, written_view: TensorData | None = None, fresh: bool = False) -> None:
    """Make ``data`` hold ``value``; if ``data`` is a view, write the new contents back into its root.

    Then the live views of the root (but the one this write came through) are derived again
    from it, since a torch view sees every later write into its base. ``fresh``: ``value`` is held by
    nothing else, so ``data`` may keep it instead of a copy (unless it links a view to its base).
    """
    old = data.lazy if data.state is _LAZY else None
    trace = value.trace
    new_value = value if fresh and value.base is None else LazyValue(trace, value.index)
    if old is not None:
        new_value.keep_sharding = old.keep_sharding
    elif data.state is _DEVICE:
        new_value.keep_sharding = data.sharding
    data.set_lazy(new_value)
    trace.values.append(weakref.ref(data))
    if data.view_of is not None:  # a view (also one whose value was materialized since): write into its root
        root_ref, chain = data.view_of
        root = root_ref()
        if root is not None:
            _write_back(root, chain, value, data)
    elif data.views:
        refresh_views(data, written_view)


def refresh_views(root: TensorData, skip: TensorData | None = None) -> None:
    """``root`` has new contents: each live view of it (but ``skip``) becomes its chain of view ops of ``root``."""
    tmod = _tensor_module()
    root_t = None
    for view in root.live_views():
        if view is skip or view.view_of is None or view.view_of[0]() is not root:
            continue
        t = root_t = root_t if root_t is not None else tmod.wrap(root)
        for op, args in view.view_of[1]:
            t = dispatch(op, (), (t, *args), {})
        _take(view, t._pjrt_data)


def _take(data: TensorData, source: TensorData) -> None:
    """``data`` (a view) holds what the fresh ``source`` holds, keeping its link to its root."""
    if source.state is _LAZY:
        value = LazyValue(source.lazy.trace, source.lazy.index)
        data.set_lazy(value)
        value.trace.values.append(weakref.ref(data))
    elif source.state is _DEVICE:
        data.set_device(source.buffers, source.sharding, source.generation)
    else:
        data.set_host(source.host, copy=False)  # source is ours alone (the fallback's fresh result)


def _write_back(root: TensorData, chain: tuple[tuple[Any, tuple], ...], new_view: LazyValue,
                view: TensorData) -> None:
    """``root`` becomes itself with the region ``view`` (``chain`` of view ops from it) replaced by ``new_view``."""
    tmod = _tensor_module()
    bases = [tmod.wrap(root)]
    for op, args in chain[:-1]:
        bases.append(dispatch(op, (), (bases[-1], *args), {}))
    trace = new_view.trace
    updated = _wrap_value(trace, LazyValue(trace, new_view.index), trace.outs[new_view.index])
    for base_t, (op, args) in zip(reversed(bases), reversed(chain)):
        updated = _scatter_view(base_t, op, args, updated)
    if updated._pjrt_data.state is not _LAZY:  # written on the CPU by the fallback: a graph value of it
        updated = _record(_op_info(aten.clone.default), (updated,), {})
    _assign(root, updated._pjrt_data.lazy, view)


def _scatter_view(base_t: Any, view_op: Any, view_args: tuple, view_t: Any) -> Any:
    """``base_t`` with its view ``view_op(base_t, *view_args)`` replaced by ``view_t`` (a new tensor)."""
    name = view_op.overloadpacket.__name__
    if name in ("view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "alias", "flatten", "view_as"):
        return dispatch(aten.view.default, (), (view_t, list(base_t.shape)), {})
    if name == "slice":
        return dispatch(aten.slice_scatter.default, (), (base_t, view_t, *view_args), {})
    if name == "select":
        return dispatch(aten.select_scatter.default, (), (base_t, view_t, *view_args), {})
    if name == "permute":
        dims = [d % len(base_t.shape) for d in view_args[0]]
        inverse = [dims.index(i) for i in range(len(dims))]
        return dispatch(aten.permute.default, (), (view_t, inverse), {})
    if name in ("transpose", "t"):
        return dispatch(view_op, (), (view_t, *view_args), {})
    if name == "diagonal":
        return dispatch(aten.diagonal_scatter.default, (), (base_t, view_t, *view_args), {})
    if name == "as_strided":
        return dispatch(aten.as_strided_scatter.default, (), (base_t, view_t, *view_args), {})
    # A view the CPU fallback made (view_as_real, unfold, ...), or expand: written on the CPU.
    return _fallback.scatter_view(base_t, view_op, view_args, view_t)


def on_mark_sharding(data: TensorData) -> None:
    """``mark_sharding`` on a pending tensor: its value gets a sharding constraint in the graph."""
    value = data.lazy
    if isinstance(value, LazyValue) and data.annotation is not None:
        value.trace.pins[value.index] = data.annotation


# =====================================================================================
# materialization
# =====================================================================================


def sync(wait: bool = True) -> None:
    """Run everything recorded so far (PyTorch/XLA's ``mark_step``); results stay on the devices.

    Call it once per training step: the step's operators become one program, compiled on
    the first step and taken from the cache afterwards. Every pending tensor becomes device
    data laid out as the partitioner chose (see its ``sharding_spec``). ``.cpu()``,
    ``.item()``, printing and ``local_shards`` run pending work too. ``wait`` is accepted
    for PyTorch/XLA compatibility; execution is synchronous.

    Example::

        loss = F.mse_loss(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        xs.sync()                       # was: xm.mark_step()
        model[0].weight.sharding_spec   # the layout it keeps across steps
    """
    with _lock:
        trace = _trace
        if trace is None or trace.ops == 0:
            return
        _run(trace)


def materialize(datas: Sequence[TensorData]) -> None:
    """Bring pending ``datas`` to the DEVICE state (runs the whole pending graph once)."""
    with _lock:
        for data in datas:
            if data.state is not _LAZY:
                continue
            value: LazyValue = data.lazy
            if value.trace.done or value.trace.error is not None:
                _raise_stale(value)
            _run(value.trace)


def _run(trace: _Trace) -> None:
    global _trace
    if _trace is trace:
        _trace = None  # ops recorded from here on go to a new trace
    trace.done = True
    _executor.count("ops_recorded", trace.ops)
    try:
        _execute(trace)
    except BaseException as exc:
        trace.error = exc
        raise


#: The last run-time scalar values, the virtual device generation and their replicated buffers.
_last_scalars: tuple[tuple[float, ...], int, list[Any]] | None = None


def _scalar_buffers(values: list[float], vd: Any) -> list[Any]:
    """The replicated float64 buffers holding ``values``; a step whose scalars did not change (a constant
    learning rate) reuses the last ones, since programs never write their inputs."""
    global _last_scalars
    key = tuple(values)
    last = _last_scalars
    if last is not None and last[0] == key and last[1] == vd.generation:
        return last[2]
    buffers = _transfer.upload_host_tensor(torch.tensor(key, dtype=torch.float64), None, vd)
    _last_scalars = (key, vd.generation, buffers)
    return buffers


def _live_outputs(trace: _Trace) -> dict[int, list[TensorData]]:
    """The entries some live tensor still holds, with those tensors."""
    holders: dict[int, list[TensorData]] = {}
    for ref in trace.values:
        data = ref()
        if data is None or data.state is not _LAZY:
            continue
        value = data.lazy
        if value.trace is not trace:
            continue
        held = holders.get(value.index)
        if held is None:
            holders[value.index] = [data]
        elif all(d is not data for d in held):
            held.append(data)
    return holders


def _build_graph(trace: _Trace, outputs: list[int], pins: dict[int, ShardingSpec]) -> fx.Graph:
    """The torch.fx graph of ``trace``'s entries (on a compile-cache miss only): inputs are its placeholders,
    ``outputs`` its results, ``pins`` its sharding constraints."""
    graph = fx.Graph()
    nodes: list[fx.Node] = []
    inputs = iter(trace.inputs)
    scalars = trace.scalars
    rng_rows = 0
    for entry, out in zip(trace.entries, trace.outs):
        kind = entry[0]
        if kind == _INPUT:
            source = next(inputs)
            node = graph.placeholder(f"in{len(nodes)}")
            node.meta["sharding"] = source.sharding
        elif kind == _GETITEM:
            node = graph.call_function(operator.getitem, (nodes[entry[1]], entry[2]), name="getitem")
        else:
            info = _ops_by_id[kind]
            args = tuple(_value_of(k, nodes, scalars) for k in entry[1])
            kwargs = {name: _value_of(k, nodes, scalars) for name, k in entry[2]}
            node = graph.call_function(info.func, args, kwargs, name=info.node_name)
            if info.random:
                node.meta["rng_key"] = rng_rows
                rng_rows += 1
        meta = _out_meta(out)
        node.meta["val"] = tuple(meta) if isinstance(meta, list) else meta
        nodes.append(node)
    for index, spec in pins.items():
        nodes[index].meta["sharding"] = spec
    if scalars:
        pool = graph.placeholder("scalars")
        pool.meta.update(val=torch.empty(len(scalars), dtype=torch.float64, device="meta"),
                         sharding=ShardingSpec.replicated(), scalar_pool=True)
    if rng_rows:
        keys = graph.placeholder("rng_keys")
        keys.meta.update(val=torch.empty(rng_rows, 2, dtype=torch.uint64, device="meta"),
                         sharding=ShardingSpec.replicated(), rng_keys=True)
    graph.output(tuple(nodes[i] for i in outputs))
    return graph


#: program key -> positions of the inputs its compiled form wants laid out otherwise (usually none).
_realign_positions: dict[str, list[int]] = {}


def _realign_inputs(program: Any, trace: _Trace, columns: list[Any], vd: Any) -> None:
    """Lay out again the inputs the compiled program wants in another sharding than the one they have."""
    positions = _realign_positions.get(program.key)
    if positions == []:
        return
    inputs = trace.inputs
    wanted = _executor.parameter_shardings(program)
    if positions is None:
        positions = [] if wanted is None else [i for i, source in enumerate(inputs)
                                               if i < len(wanted) and wanted[i] != source.sharding]
        _realign_positions[program.key] = positions
    for i in positions:
        source = inputs[i]
        columns[i] = _transfer.reshard_buffers(columns[i], source.shape, source.dtype, source.sharding, wanted[i], vd)


#: Seconds the last run spent finding its program ("key"), executing it and storing its results ("after").
_last_timings: dict[str, float] = {"key": 0.0, "execute": 0.0, "after": 0.0}


def last_run_timings() -> dict[str, float]:
    """Where the last materialization's time went: ``key``, ``execute`` and ``after`` (seconds)."""
    return dict(_last_timings)


def _execute(trace: _Trace) -> None:
    t0 = time.perf_counter()
    holders = _live_outputs(trace)
    if not holders:
        return
    outputs = sorted(holders)
    pins = dict(trace.pins)
    for index in outputs:
        if index not in pins:
            for data in holders[index]:
                kept = data.lazy.keep_sharding
                if kept is not None:
                    pins[index] = kept
                    break
    vd = virtual_device()
    columns = []
    for source in trace.inputs:
        if source.generation != vd.generation:
            raise VirtualDeviceError("an input of the pending graph lives on a virtual device that was replaced; "
                                     "move it to pjrt again from a CPU copy")
        columns.append(source.buffers)
    if trace.scalars:
        columns.append(_scalar_buffers(trace.scalars, vd))
    if trace.rng:
        columns.append(_transfer.upload_host_tensor(_executor.rng_keys_tensor(trace.rng), None, vd))
    options = _executor.lowering_options(vd)
    # The step the trace ended on stands for its whole sequence of entries (see the note on recording).
    key = (trace.cursor, tuple(outputs), tuple(sorted((i, _spec_token(s)) for i, s in pins.items())), options,
           _executor.plugin_identity(vd))
    program = _executor.program_for(key, lambda: _build_graph(trace, outputs, pins), vd, options)
    _realign_inputs(program, trace, columns, vd)
    t1 = time.perf_counter()
    results = _executor.execute_program(program, columns, vd)
    t2 = time.perf_counter()
    generation = vd.generation
    for j, index in enumerate(outputs):
        spec = program.output_shardings[j]
        buffers = results[j]
        for data in holders[index]:
            data.set_device(buffers, spec, generation)
            if data.annotation is None:
                data.annotation = spec
    _last_timings.update(key=t1 - t0, execute=t2 - t1, after=time.perf_counter() - t2)
    logger.debug("ran %d ops with %d inputs and %d outputs", trace.ops, len(columns), len(outputs))
