"""Lazy tracing: ATen ops on ``pjrt`` tensors are recorded into one pending graph and run at materialization.

``dispatch`` (called from ``XLAShardedTensor.__torch_dispatch__``) records an op, decomposing
non-lowered ops with torch's decompositions and computing output shapes on meta tensors;
``materialize`` / ``sync`` lower the pending graph, compile it (cached) and execute it, leaving
the results on the devices. Never moves bytes itself except through ``_transfer``.
"""

from __future__ import annotations

import collections
import logging
import operator
import re
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import DataDependentShapeError, UnsupportedOpError, VirtualDeviceError
from . import _executor, _fallback, _transfer
from ._data import TensorData, TensorState
from ._device import TORCH_DEVICE, virtual_device
from ._lowering import (
    ScalarSlot,
    decomposition_for,
    functional_variant,
    has_lowering,
    is_inplace,
    op_name,
    refuse_generator,
)
from ._sharding import ShardingSpec

logger = logging.getLogger(__name__)
aten = torch.ops.aten

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
# the pending graph
# =====================================================================================


@dataclass(eq=False)
class LazyValue:
    """What ``TensorData.lazy`` holds: a node of a pending trace, and the base if it is a view.

    ``view_op``/``view_args`` say how the value was derived from ``base`` so that an
    in-place op on the view can be written back into the base. ``keep_sharding`` is the
    layout a tensor updated in place had before: its new value is pinned to it, so state
    that lives across steps (parameters, optimizer buffers) keeps one layout and a
    repeated step compiles once.
    """

    trace: _Trace
    node: fx.Node
    base: weakref.ref[TensorData] | None = None
    view_op: Any = None
    view_args: tuple = ()
    keep_sharding: ShardingSpec | None = None


@dataclass(eq=False)
class _Input:
    """A graph input: the device buffers a placeholder stands for, fixed at record time."""

    node: fx.Node
    buffers: list[Any]
    generation: int


@dataclass(eq=False)
class _Trace:
    """One pending graph: its nodes, its inputs (fixed at record time) and the tensors it feeds."""

    graph: fx.Graph = field(default_factory=fx.Graph)
    inputs: dict[tuple[int, int], _Input] = field(default_factory=dict)
    #: One entry per node, in recording order: what the compile cache key is made of.
    signature: list[tuple] = field(default_factory=list)
    #: Values of the run-time scalars (ScalarSlot index -> value), passed as one float64 input.
    scalars: list[float] = field(default_factory=list)
    #: Weak references to every TensorData whose lazy value lives in this trace.
    values: list[weakref.ref[TensorData]] = field(default_factory=list)
    ops: int = 0
    error: BaseException | None = None
    done: bool = False


_lock = threading.RLock()
_trace: _Trace | None = None


def _current_trace() -> _Trace:
    global _trace
    if _trace is None:
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
# recording
# =====================================================================================


_tensor_mod: Any = None


def _tensor_module() -> Any:
    """``spmd.tensor`` (imported late: it imports this module); cached, the tracer asks on every op."""
    global _tensor_mod
    if _tensor_mod is None:
        from . import tensor

        _tensor_mod = tensor
    return _tensor_mod


def _map_args(fn: Any, value: Any) -> Any:
    """``pytree.tree_map(fn, value)`` for operator arguments, without its per-call cost on the hot path.

    Plain tuples, lists and dicts (all an ATen call passes) are walked here, in pytree's
    order; any other container pytree knows (torch.Size, named tuples, ...) goes to pytree.
    """
    kind = type(value)
    if kind is tuple:
        return tuple([_map_args(fn, v) for v in value])
    if kind is list:
        return [_map_args(fn, v) for v in value]
    if kind is dict:
        return {k: _map_args(fn, v) for k, v in value.items()}
    if isinstance(value, (tuple, list, dict, collections.deque)):
        return pytree.tree_map(fn, value)
    return fn(value)


def _input_node(trace: _Trace, data: TensorData) -> fx.Node:
    """The placeholder for a HOST or DEVICE ``data`` (uploading HOST data now, with its annotation)."""
    if data.state is TensorState.HOST:
        _transfer.upload(data, data.annotation)
    _transfer.check_current(data)
    key = (data.id, data.version)
    entry = trace.inputs.get(key)
    if entry is None:
        assert data.buffers is not None and data.sharding is not None
        node = _placeholder(trace, data)
        entry = _Input(node, list(data.buffers), data.generation)
        trace.inputs[key] = entry
    return entry.node


def _placeholder(trace: _Trace, data: TensorData) -> fx.Node:
    node = trace.graph.placeholder(f"in{len(trace.inputs)}")
    node.meta["val"] = data.meta()
    node.meta["sharding"] = data.sharding
    return _new_node(trace, node, ("in", data.shape, str(data.dtype), data.sharding.to_hlo()))


def _cpu_input_node(trace: _Trace, tensor: torch.Tensor) -> fx.Node:
    """A CPU tensor used with pjrt tensors (an index, a scalar tensor): uploaded replicated as an input."""
    return _input_node(trace, TensorData.from_host(tensor.detach()))


def _node_of(trace: _Trace, tensor: torch.Tensor) -> fx.Node:
    tmod = _tensor_module()
    if isinstance(tensor, tmod.XLAShardedTensor):
        data = tensor._pjrt_data
        if data.state is TensorState.LAZY:
            value: LazyValue = data.lazy
            if value.trace is not trace:
                _raise_stale(value)
            return value.node
        if data.state is TensorState.HOST and data.uninitialized:
            return _unwritten_node(data)
        return _input_node(trace, data)
    if tensor.device.type == "meta":
        raise VirtualDeviceError("a meta tensor cannot be combined with pjrt tensors")
    if tensor.device.type != "cpu":
        raise VirtualDeviceError(f"cannot combine a tensor on {tensor.device} with pjrt tensors; move it to the CPU "
                                 "or to pjrt first")
    return _cpu_input_node(trace, tensor)


def _unwritten_node(data: TensorData) -> fx.Node:
    """Contents nobody wrote (``torch.empty``) read by an op: zeros made on the devices, nothing uploaded.

    ``torch.randn(..., device="pjrt")`` is ``empty`` + ``normal_``, which overwrites them anyway.
    """
    zeros = _record(aten.zeros.default, (list(data.shape),), {"dtype": data.dtype, "device": TORCH_DEVICE})
    return zeros._pjrt_data.lazy.node


def _raise_stale(value: LazyValue) -> None:
    error = value.trace.error
    if error is not None:
        raise VirtualDeviceError(f"this tensor's pending computation failed earlier: {error}") from error
    raise VirtualDeviceError("internal: a pending tensor belongs to a finished graph")


def _to_meta(value: Any) -> Any:
    tmod = _tensor_module()
    if isinstance(value, tmod.XLAShardedTensor):
        return value._pjrt_data.meta()
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
    kwargs = kwargs or {}
    refuse_generator(func, kwargs)
    with _lock:
        if kwargs and _fallback.is_out_variant(func):
            functional = _fallback.functional_of_out(func)
            if functional is not None:
                return _fallback.run_out_variant(func, args, kwargs, functional)
            return _fallback.refuse_or_run(func, args, kwargs)
        if is_inplace(func):
            return _dispatch_inplace(func, args, kwargs)
        if _fallback.data_dependent(func, args):
            return _fallback.refuse_or_run(func, args, kwargs, DataDependentShapeError(
                op_name(func), f"{op_name(func)} with a boolean mask has a data-dependent result and the CPU "
                "fallback is off; use torch.where / masked_fill, or turn the fallback on"))
        if has_lowering(func):
            try:
                return _record(func, args, kwargs)
            except DataDependentShapeError as exc:
                return _fallback.refuse_or_run(func, args, kwargs, exc)
        if func is aten.equal.default:
            return bool(torch.all(torch.eq(args[0], args[1])).item()) if args[0].shape == args[1].shape else False
        decomp = decomposition_for(func)
        if decomp is not None:
            return decomp(*args, **kwargs)
        # Composite ops (aten.to, aten.linear, ...) reach us below autograd: run their torch kernel.
        result = func.decompose(*args, **kwargs) if isinstance(func, torch._ops.OpOverload) else NotImplemented
        if result is not NotImplemented:
            return result
        return _fallback.refuse_or_run(func, args, kwargs)


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


#: Ops whose Python float arguments are plain arithmetic operands: those become run-time scalars
#: (``ScalarSlot``), so a learning rate or an Adam bias correction that changes every step does not
#: change the program. Values some lowering special-cases stay constants.
_LIFTED_OPS = {"add", "sub", "rsub", "mul", "div", "pow", "clamp", "clamp_min", "clamp_max", "masked_fill", "where",
               "full", "full_like", "fill"}
_SPECIAL_VALUES = {0.0, 1.0, -1.0, 2.0, 3.0, 0.5, -0.5}


def _lifts_scalars(func: Any, meta_out: Any) -> bool:
    packet = getattr(func, "overloadpacket", None)
    return (packet is not None and packet.__name__ in _LIFTED_OPS and isinstance(meta_out, torch.Tensor)
            and meta_out.dtype.is_floating_point)


def _liftable(value: Any) -> bool:
    return type(value) is float and value not in _SPECIAL_VALUES and value == value and abs(value) != float("inf")


#: (op, argument specs) -> output spec: ops on the same shapes need their meta kernel run once.
_meta_cache: dict[Any, Any] = {}
_META_CACHE_SIZE = 65536


def _output_meta(func: Any, args: tuple, kwargs: dict) -> Any:
    """Output shapes and dtypes of ``func`` on these arguments, from meta tensors (memoized)."""
    packet = getattr(func, "overloadpacket", None)
    any_float = packet is not None and packet.__name__ in _LIFTED_OPS
    try:
        key = (func, _arg_spec(args, any_float), tuple(sorted((k, _arg_spec(v, any_float)) for k, v in kwargs.items())))
    except _Unkeyable:
        key = None
    if key is not None:
        spec = _meta_cache.get(key)
        if spec is not None:
            return _out_meta(spec)
    try:
        meta_out = func(*pytree.tree_map(_to_meta, args), **_meta_kwargs(kwargs))
    except NotImplementedError as exc:
        # Meta kernels refuse ops whose output shape depends on the data (nonzero, boolean masks).
        raise DataDependentShapeError(op_name(func), f"{op_name(func)} cannot run on the pjrt device: its output "
                                      f"shape is not known before running it ({exc}), and the CPU fallback is off. "
                                      "Use a fixed-shape form (torch.where, masked_fill) or compute it on the "
                                      "CPU.") from exc
    spec = _out_spec(meta_out)
    if not _only_tensors(spec):
        return meta_out  # the caller refuses it with a clear error
    if key is not None and len(_meta_cache) < _META_CACHE_SIZE:
        _meta_cache[key] = spec
    return _out_meta(spec)


def _only_tensors(spec: Any) -> bool:
    """A tensor, or a tuple/list of tensors and Nones (outputs an op was told not to compute)."""
    if spec[0] == "T":
        return True
    return spec[0] in ("L", "U") and all(s[0] == "N" or _only_tensors(s) for s in spec[1])


def _sig(value: Any) -> Any:
    """The signature of a recorded argument: nodes by their position in the trace, constants by value."""
    if isinstance(value, fx.Node):
        return value.meta["idx"]
    if isinstance(value, ScalarSlot):
        return ("slot", value.index)
    if isinstance(value, (list, tuple)):
        return tuple(_sig(v) for v in value)
    if isinstance(value, float):
        return ("f", repr(value))
    if isinstance(value, _CONSTANT_TYPES):
        return value if isinstance(value, (bool, int, str, type(None))) else str(value)
    return repr(value)


#: op -> the name fx would derive for its nodes (``add.Tensor`` -> ``add_tensor``): computed once per op.
_node_names: dict[Any, str] = {}
_CAMEL_HUMP = re.compile(r"(?<=[a-z])([A-Z])")


def _node_name(func: Any) -> str:
    name = _node_names.get(func)
    if name is None:
        name = _node_names[func] = _CAMEL_HUMP.sub(r"_\1", func.__name__).lower()
    return name


def _new_node(trace: _Trace, node: fx.Node, entry: tuple) -> fx.Node:
    node.meta["idx"] = len(trace.signature)
    trace.signature.append(entry)
    return node


def _record(func: Any, args: tuple, kwargs: dict) -> Any:
    trace = _current_trace()
    meta_out = _output_meta(func, args, kwargs)
    tmod = _tensor_module()

    lift = _lifts_scalars(func, meta_out)

    def to_node(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return _node_of(trace, v)
        if lift and _liftable(v):
            trace.scalars.append(v)
            return ScalarSlot(v, len(trace.scalars) - 1)
        return v

    node_args = tuple(_map_args(to_node, args))
    node_kwargs = dict(_map_args(to_node, kwargs))
    node = trace.graph.call_function(func, node_args, node_kwargs, name=_node_name(func))
    name = op_name(func)
    _new_node(trace, node, (name, _sig(node_args), tuple(sorted((k, _sig(v)) for k, v in node_kwargs.items())),
                            _out_spec(meta_out)))
    trace.ops += 1
    _executor.count("ops_recorded")
    base_info = None
    if getattr(func, "is_view", False) and args and isinstance(args[0], tmod.XLAShardedTensor):
        base_info = (weakref.ref(args[0]._pjrt_data), func, tuple(args[1:]))

    def wrap_output(meta: Any, out_node: fx.Node) -> Any:
        if not isinstance(meta, torch.Tensor):
            raise UnsupportedOpError(name, f"{name} returns a {type(meta).__name__}, which the pjrt device cannot "
                                     "give before running the graph")
        out_node.meta["val"] = meta
        value = LazyValue(trace, out_node)
        if base_info is not None:
            value.base, value.view_op, value.view_args = base_info
        data = TensorData.from_lazy(tuple(meta.shape), meta.dtype, value)
        trace.values.append(weakref.ref(data))
        return tmod.wrap(data)

    if isinstance(meta_out, torch.Tensor):
        return wrap_output(meta_out, node)
    if isinstance(meta_out, (tuple, list)):
        node.meta["val"] = tuple(meta_out)
        outs = []
        for i, m in enumerate(meta_out):
            if m is None:
                outs.append(None)
                continue
            item = trace.graph.call_function(operator.getitem, (node, i), name="getitem")
            _new_node(trace, item, ("getitem", node.meta["idx"], i))
            outs.append(wrap_output(m, item))
        return type(meta_out)(outs) if isinstance(meta_out, tuple) else outs
    raise UnsupportedOpError(name, f"{name} returns a {type(meta_out).__name__}, which the pjrt device cannot give "
                             "before running the graph")


def _dispatch_inplace(func: Any, args: tuple, kwargs: dict) -> Any:
    """``x.op_(...)``: record the functional op and make ``x`` (and the tensor it views) hold the result."""
    tmod = _tensor_module()
    target = args[0]
    if not isinstance(target, tmod.XLAShardedTensor):
        raise VirtualDeviceError(f"{op_name(func)} writes into a tensor on {target.device} from pjrt tensors; "
                                 "move the result with .cpu() instead")
    functional = functional_variant(func)
    if functional is None:
        return _fallback.refuse_or_run(func, args, kwargs, UnsupportedOpError(
            op_name(func), f"in-place operator {op_name(func)} has no functional form the pjrt device can run, and "
            "the CPU fallback is off"))
    result = dispatch(functional, (), *_with_defaults(func, functional, args, kwargs))
    if not isinstance(result, tmod.XLAShardedTensor):
        raise UnsupportedOpError(op_name(func), f"internal: {op_name(functional)} did not give one tensor")
    if result._pjrt_data.state is not TensorState.LAZY:  # computed by the CPU fallback: a graph value of it
        result = _record(aten.clone.default, (result,), {})
    data = target._pjrt_data
    new = result._pjrt_data
    if torch.Tag.inplace_view in func.tags:
        _restride_in_place(func, args, kwargs, result)
        return target
    if tuple(new.shape) != data.shape:
        raise RuntimeError(f"{op_name(func)}: the result of shape {list(new.shape)} cannot be written into a tensor "
                           f"of shape {list(data.shape)}")
    if new.dtype != data.dtype:
        result = dispatch(aten._to_copy.default, (), (result,), {"dtype": data.dtype})
        new = result._pjrt_data
    _assign(data, new.lazy)
    return target


def _with_defaults(func: Any, functional: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with the arguments torch left out because they had their default (``bernoulli_()``'s
    ``p=0.5``) where the functional twin has no default for them (``bernoulli.p``)."""
    args, kwargs = list(args), dict(kwargs)
    twin = functional._schema.arguments
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) or arg.name in kwargs or not arg.has_default_value():
            continue
        if i < len(twin) and twin[i].has_default_value():
            continue
        if arg.kwarg_only:
            kwargs[arg.name] = arg.default_value
        elif i == len(args):
            args.append(arg.default_value)
    return tuple(args), kwargs


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


def _assign(data: TensorData, value: LazyValue) -> None:
    """Make ``data`` hold ``value``; if ``data`` is a view, write the new contents back into its base."""
    old = data.lazy if data.state is TensorState.LAZY else None
    trace = value.trace
    new_value = LazyValue(trace, value.node)
    if old is not None:
        new_value.keep_sharding = old.keep_sharding
    elif data.state is TensorState.DEVICE:
        new_value.keep_sharding = data.sharding
    if data.view_of is not None:  # a view (also one whose value was materialized since): write into its base
        new_value.base, new_value.view_op, new_value.view_args = data.view_of
        base = data.view_of[0]()
        if base is not None:
            _write_back(base, new_value.view_op, new_value.view_args, value.node)
    data.set_lazy(new_value)
    trace.values.append(weakref.ref(data))


def _write_back(base: TensorData, view_op: Any, view_args: tuple, new_view: fx.Node) -> None:
    """``base`` becomes itself with the viewed region replaced by ``new_view``."""
    tmod = _tensor_module()
    base_t = tmod.wrap(base)
    view_t = tmod.wrap(TensorData.from_lazy(tuple(new_view.meta["val"].shape), new_view.meta["val"].dtype,
                                            LazyValue(_current_trace(), new_view)))
    name = view_op.overloadpacket.__name__ if view_op is not None else ""
    if name in ("view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "alias", "flatten", "view_as"):
        updated = dispatch(aten.view.default, (), (view_t, list(base.shape)), {})
    elif name == "slice":
        updated = dispatch(aten.slice_scatter.default, (), (base_t, view_t, *view_args), {})
    elif name == "select":
        updated = dispatch(aten.select_scatter.default, (), (base_t, view_t, *view_args), {})
    elif name == "permute":
        dims = [d % len(base.shape) for d in view_args[0]]
        inverse = [dims.index(i) for i in range(len(dims))]
        updated = dispatch(aten.permute.default, (), (view_t, inverse), {})
    elif name in ("transpose", "t"):
        updated = dispatch(view_op, (), (view_t, *view_args), {})
    elif name == "diagonal":
        updated = dispatch(aten.diagonal_scatter.default, (), (base_t, view_t, *view_args), {})
    elif name == "as_strided":
        updated = dispatch(aten.as_strided_scatter.default, (), (base_t, view_t, *view_args), {})
    else:
        raise UnsupportedOpError(op_name(view_op), f"writing in place into the result of {op_name(view_op)} (a view) "
                                 "is not supported on the pjrt device; clone it first")
    _assign(base, updated._pjrt_data.lazy)


def on_mark_sharding(data: TensorData) -> None:
    """``mark_sharding`` on a pending tensor: its value gets a sharding constraint in the graph."""
    value = data.lazy
    if isinstance(value, LazyValue):
        value.node.meta["sharding"] = data.annotation


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
            if data.state is not TensorState.LAZY:
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


def _live_outputs(trace: _Trace) -> tuple[list[fx.Node], dict[fx.Node, list[TensorData]]]:
    """The nodes some live tensor still holds, in graph order, with those tensors."""
    holders: dict[fx.Node, list[TensorData]] = {}
    for ref in trace.values:
        data = ref()
        if data is None or data.state is not TensorState.LAZY:
            continue
        value = data.lazy
        if not isinstance(value, LazyValue) or value.trace is not trace:
            continue
        lst = holders.setdefault(value.node, [])
        if all(d is not data for d in lst):
            lst.append(data)
    order = {n: i for i, n in enumerate(trace.graph.nodes)}
    nodes = sorted(holders, key=order.__getitem__)
    return nodes, holders


#: program key -> positions of the inputs its compiled form wants laid out otherwise (usually none).
_realign_positions: dict[str, list[int]] = {}


def _realign_inputs(program: Any, trace: _Trace, columns: list[Any], vd: Any) -> None:
    """Lay out again the inputs the compiled program wants in another sharding than the one they have."""
    positions = _realign_positions.get(program.key)
    entries = list(trace.inputs.values())
    wanted = _executor.parameter_shardings(program) if positions is None or positions else None
    if positions is None:
        positions = [] if wanted is None else [i for i, e in enumerate(entries)
                                               if i < len(wanted) and wanted[i] != e.node.meta["sharding"]]
        _realign_positions[program.key] = positions
    for i in positions:
        meta, have = entries[i].node.meta["val"], entries[i].node.meta["sharding"]
        columns[i] = _transfer.reshard_buffers(columns[i], meta.shape, meta.dtype, have, wanted[i], vd)


#: Seconds the last run spent finding its program ("key"), executing it and storing its results ("after").
_last_timings: dict[str, float] = {"key": 0.0, "execute": 0.0, "after": 0.0}


def last_run_timings() -> dict[str, float]:
    """Where the last materialization's time went: ``key``, ``execute`` and ``after`` (seconds)."""
    return dict(_last_timings)


def _execute(trace: _Trace) -> None:
    t0 = time.perf_counter()
    nodes, holders = _live_outputs(trace)
    if not nodes:
        return
    for node in nodes:
        if node.meta.get("sharding") is None:
            kept = [d.lazy.keep_sharding for d in holders[node] if d.lazy.keep_sharding is not None]
            if kept:
                node.meta["sharding"] = kept[0]
    graph = trace.graph
    constraints = tuple(sorted((n.meta["idx"], n.meta["sharding"].to_hlo()) for n in graph.nodes
                               if n.op != "placeholder" and n.meta.get("sharding") is not None))
    signature = (tuple(trace.signature), tuple(n.meta["idx"] for n in nodes), constraints, len(trace.scalars))
    vd = virtual_device()
    columns = []
    # Placeholders were created in this order, which is the graph's (and the module's) argument order.
    for entry in trace.inputs.values():
        if entry.generation != vd.generation:
            raise VirtualDeviceError("an input of the pending graph lives on a virtual device that was replaced; "
                                     "move it to pjrt again from a CPU copy")
        columns.append(entry.buffers)
    if trace.scalars:
        pool = graph.placeholder("scalars")
        pool.meta.update(val=torch.empty(len(trace.scalars), dtype=torch.float64, device="meta"),
                         sharding=ShardingSpec.replicated(), scalar_pool=True)
        columns.append(_scalar_buffers(trace.scalars, vd))
    graph.output(tuple(nodes))
    program = _executor.compile_graph(graph, vd, signature=signature)
    _realign_inputs(program, trace, columns, vd)
    t1 = time.perf_counter()
    outputs = _executor.execute_program(program, columns, vd)
    t2 = time.perf_counter()
    for j, node in enumerate(nodes):
        spec = program.output_shardings[j]
        for data in holders[node]:
            data.set_device(outputs[j], spec, vd.generation)
            if data.annotation is None:
                data.annotation = spec
    _last_timings.update(key=t1 - t0, execute=t2 - t1, after=time.perf_counter() - t2)
    logger.debug("ran %d ops with %d inputs and %d outputs", trace.ops, len(columns), len(nodes))
