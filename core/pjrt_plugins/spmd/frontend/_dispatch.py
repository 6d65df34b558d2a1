"""Where each ATen operator on pjrt tensors goes: recorded into the pending trace, decomposed by torch, or run
by the CPU fallback; and torch's in-place and view semantics on top of the trace.

``dispatch`` is called from ``XLAShardedTensor.__torch_dispatch__`` (through the engine). An in-place op
records its functional twin and the target takes the result; a write into a view is written back into its
base, and a write into a base reaches its live views, as torch's views see every write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch

from ...errors import DataDependentShapeError, UnsupportedOpError, VirtualDeviceError
from ..lowering import op_name, refuse_generator
from ..trace import (
    COMPLEX_REFUSAL,
    ENGINE,
    LazyValue,
    NotLowerable,
    NotWhole,
    OpInfo,
    computes_complex,
    data_dependent,
    functional_of_out,
    hold,
    op_info,
    pending_data,
    record,
    record_values,
    refuse_strided_view,
    with_defaults,
)
from ..transport import TensorData, TensorState
from . import _fallback
from ._kernel_dtypes import CHECKED, check_kernel_dtypes
from ._write_dtypes import check_inplace, check_out
from .tensor import XLAShardedTensor, wrap

__all__ = ["dispatch", "record_into", "refresh_views"]

aten = torch.ops.aten
_LAZY, _DEVICE = TensorState.LAZY, TensorState.DEVICE
#: The dispatch key of the foreach ops' kernels that loop over the per-tensor ops.
_COMPOSITE_EXPLICIT = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
#: ``id``s of the overloads in ``CHECKED`` (an OpOverload's ``__hash__`` is Python code; overloads live for good).
_CHECKED_IDS = frozenset(id(f) for f in CHECKED)


def _wrapped(result: Any) -> Any:
    """Recorded results (pending data, or a list/tuple of it with Nones) as pjrt tensors."""
    if type(result) is TensorData:
        return wrap(result)
    items = [wrap(d) if d is not None else None for d in result]
    return items if type(result) is list else tuple(items)


#: ``id(op)`` -> OpInfo of the ops :func:`dispatch` records as they are, with no other step (no in-place or
#: ``out=`` form, no mask, no strided view, no dtype check): most ops of a step, sent straight to the trace.
_PLAIN: dict[int, OpInfo] = {}


def dispatch(func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func(*args, **kwargs)`` on pjrt tensors: pjrt tensors holding pending values come back."""
    info = _PLAIN.get(id(func))
    if info is not None:  # the common case, as the general path below takes it
        if kwargs:
            refuse_generator(func, kwargs)
        else:
            kwargs = {}
        with ENGINE.lock:
            return _record_plain(func, info, args, kwargs)
    info = ENGINE.op_infos.get(id(func)) or op_info(func)
    if (info.recordable and not (info.inplace or info.maskable or info.strided or info.out_variant)
            and id(func) not in _CHECKED_IDS):
        _PLAIN[id(func)] = info  # overloads live for good: their ids stay theirs
    if id(func) in _CHECKED_IDS:
        check_kernel_dtypes(func, args, kwargs or {})
    if info.strided:
        refuse_strided_view(info, args)
    if kwargs:
        refuse_generator(func, kwargs)
    else:
        kwargs = {}
    with ENGINE.lock:
        if kwargs and info.out_variant:
            functional = functional_of_out(func)
            if functional is not None:
                return _run_out_variant(func, args, kwargs, functional)
            return _fallback.refuse_or_run(func, args, kwargs)
        if info.inplace:
            return _dispatch_inplace(info, args, kwargs)
        if info.maskable and data_dependent(func, args):
            return _fallback.refuse_or_run(func, args, kwargs, DataDependentShapeError(
                info.name, f"{info.name} with a boolean mask has a data-dependent result and the CPU "
                "fallback is off; use torch.where / masked_fill, or turn the fallback on"))
        if info.recordable:
            return _record_plain(func, info, args, kwargs)
        if func is aten.equal.default:
            return bool(torch.all(torch.eq(args[0], args[1])).item()) if args[0].shape == args[1].shape else False
        if info.foreach:  # no per-tensor twin to record whole: torch's kernel calls the per-tensor ops
            return func.redispatch(_COMPOSITE_EXPLICIT, *args, **kwargs)
        if info.whole:
            try:
                return _wrapped(record(info, args, kwargs, whole=True))
            except (NotWhole, DataDependentShapeError):
                pass  # piece by piece below
            except NotLowerable as exc:
                return _fallback.refuse_or_run(func, args, kwargs, exc)
        if info.decomposition is not None:
            if computes_complex(func, args, kwargs):  # torch's complex decompositions write through views
                return _fallback.refuse_or_run(func, args, kwargs,
                                               NotLowerable(info.name, f"{info.name} {COMPLEX_REFUSAL}"))
            return info.decomposition(*args, **kwargs)
        # Composite ops (aten.to, aten.linear, ...) reach us below autograd: run their torch kernel.
        result = func.decompose(*args, **kwargs) if info.is_overload else NotImplemented
        if result is not NotImplemented:
            return result
        return _fallback.refuse_or_run(func, args, kwargs)


def _record_plain(func: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """Record ``func`` as it is and wrap its pending results (the CPU fallback decides when it cannot be recorded);
    the engine's lock is held. One pass from values to tensors: this is most ops of a step."""
    try:
        values = record_values(info, args, kwargs)
    except (DataDependentShapeError, NotLowerable) as exc:
        return _fallback.refuse_or_run(func, args, kwargs, exc)
    if type(values) is LazyValue:
        return wrap(pending_data(values))
    items = [wrap(pending_data(v)) if v is not None else None for v in values]
    return items if type(values) is list else tuple(items)


def _run_out_variant(func: Any, args: tuple, kwargs: dict, functional: Any) -> Any:
    """An ``out=`` overload: the functional op runs (on the device if it can), its results are copied into the
    written arguments (``out``, or ``max``/``max_values`` and the like).

    The out tensors keep their shape (a pjrt tensor cannot be resized): a result of another
    shape raises.
    """
    written = {a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None
               and a.alias_info.is_write}
    rest = {k: v for k, v in kwargs.items() if k not in written}
    out = kwargs.get("out")
    if rest.get("dtype") is None and isinstance(out, torch.Tensor) and any(
            a.name == "dtype" for a in func._schema.arguments):
        rest["dtype"] = out.dtype  # torch.sum(x, out=o) computes in o's dtype, as with dtype=o.dtype
    result = dispatch(functional, (), args, rest)
    outs: list[Any] = []
    for name in (a.name for a in func._schema.arguments if a.name in written):
        value = kwargs[name]
        outs += list(value) if isinstance(value, (list, tuple)) else [value]
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(outs) != len(results):
        raise UnsupportedOpError(op_name(func), f"{op_name(func)}: {len(results)} results for {len(outs)} out= tensors")
    check_out(func, args, kwargs, [r.dtype for r in results], [o.dtype for o in outs])  # before any write
    for target, value in zip(outs, results):
        _fallback.check_not_resized(func, target, value)
        if isinstance(target, XLAShardedTensor):
            target.copy_(value)
        else:
            target.copy_(value.cpu() if isinstance(value, XLAShardedTensor) else value)
    if "out" in written:
        return kwargs["out"]
    return tuple(outs) if len(outs) > 1 else outs[0]


# -- in-place operators -----------------------------------------------------------------------


def _dispatch_inplace(info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """``x.op_(...)``: record the functional op and make ``x`` (and the tensor it views) hold the result."""
    func = info.func
    if info.foreach:
        return _dispatch_foreach_inplace(info, args, kwargs)
    target = args[0]
    if isinstance(target, list):  # writes whole lists (_fused_sgd_, ...) and is not lowered
        return _fallback.refuse_or_run(func, args, kwargs)
    if not isinstance(target, XLAShardedTensor):
        raise VirtualDeviceError(f"{info.name} writes into a tensor on {target.device} from pjrt tensors; "
                                 "move the result with .cpu() instead")
    functional = info.functional
    if functional is None:
        return _fallback.refuse_or_run(func, args, kwargs, UnsupportedOpError(
            info.name, f"in-place operator {info.name} has no functional form the pjrt device can run, and "
            "the CPU fallback is off"))
    if info.defaults:
        args, kwargs = with_defaults(info, args, kwargs)
    finfo = op_info(functional)
    if info.inplace_view:  # squeeze_, t_, ...: the tensor itself becomes the view
        result = dispatch(functional, (), args, kwargs)
        if result._pjrt_data.state is not _LAZY:  # computed by the CPU fallback: a graph value of it
            result = wrap(record(op_info(aten.clone.default), (result,), {}))
        _restride_in_place(func, args, kwargs, result)
        return target
    value = result = None
    if finfo.recordable and not finfo.maskable:
        try:
            value = record_values(finfo, args, kwargs)
        except (DataDependentShapeError, NotLowerable):
            value = None  # dispatch below sends it to the fallback
        if value is not None and not isinstance(value, LazyValue):
            raise UnsupportedOpError(info.name, f"internal: {finfo.name} did not give one tensor")
    if value is None:
        result = dispatch(functional, (), args, kwargs)
        if not isinstance(result, XLAShardedTensor):
            raise UnsupportedOpError(info.name, f"internal: {finfo.name} did not give one tensor")
        if result._pjrt_data.state is not _LAZY:  # computed by the CPU fallback: a graph value of it
            result = wrap(record(op_info(aten.clone.default), (result,), {}))
        value = result._pjrt_data.lazy
    if value.spec[2] is not target.dtype:  # torch's casting rule (x /= 2 on ints), before the target changes
        check_inplace(func, (value.spec[2],), (target.dtype,))
    _assign_result(info, target._pjrt_data, value, fresh=result is None)
    return target


def _restride_in_place(func: Any, args: tuple, kwargs: dict, result: Any) -> None:
    """``x.squeeze_()``, ``x.t_()``, ...: ``x`` itself becomes the view (its shape changes, its aliases keep theirs).

    The wrapper's sizes change by running the op on its metadata alone (no dispatch), as torch's
    own tensor subclasses do; its value is the recorded view.
    """
    target = args[0]
    with no_dispatch():
        func(*args, **kwargs)
    target._pjrt_data = result._pjrt_data


def _dispatch_foreach_inplace(info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """``torch._foreach_op_(xs, ...)``: one recorded op for the whole list, its results assigned to ``xs``."""
    targets = args[0]
    finfo = op_info(info.functional) if info.functional is not None else None
    if finfo is None or not finfo.recordable or not _all_pjrt(targets):
        return info.func.redispatch(_COMPOSITE_EXPLICIT, *args, **kwargs)  # the per-tensor in-place ops
    _record_and_assign(finfo, args, kwargs, targets, info)
    return None


def _all_pjrt(tensors: Sequence[Any]) -> bool:
    for t in tensors:  # a loop: all() of a generator costs more for lists of a model's parameters
        if not isinstance(t, XLAShardedTensor):
            return False
    return True


def record_into(func: Any, args: tuple, targets: Sequence[Any]) -> None:
    """Record ``func(*args)``, an op returning one tensor per pjrt tensor of ``targets``, and make each target
    hold its result (a fused optimizer step: one op writing whole lists of tensors)."""
    with ENGINE.lock:
        _record_and_assign(op_info(func), args, {}, targets, None)


def _record_and_assign(info: OpInfo, args: tuple, kwargs: dict, targets: Sequence[Any],
                       written_by: OpInfo | None) -> None:
    """Record ``info``'s op, whose results are one per target, and make each target hold its result
    (``written_by``: the in-place op the user called, named in errors; default ``info``'s)."""
    values = record_values(info, args, kwargs)
    if type(values) is LazyValue:  # an op with one result
        values = [values]
    if written_by is not None:  # the user's op: torch's casting rule and the shapes, before any target changes
        check_inplace(written_by.func, [v.spec[2] for v in values], [t.dtype for t in targets])
        for target, value in zip(targets, values, strict=True):
            if value.spec[1] != target._pjrt_data.shape:
                raise RuntimeError(f"{written_by.name}: the result of shape {list(value.spec[1])} cannot be "
                                   f"written into a tensor of shape {list(target._pjrt_data.shape)}")
    for target, value in zip(targets, values, strict=True):
        _assign_result(written_by or info, target._pjrt_data, value, fresh=True)


def _assign_result(info: OpInfo, data: TensorData, value: LazyValue, fresh: bool = False) -> None:
    """An in-place op's result ``value`` becomes ``data``'s contents (cast to its dtype); ``fresh``: ``value``
    is just recorded, held by nothing else (see ``_assign``)."""
    _, shape, dtype = value.spec
    if shape != data.shape:
        raise RuntimeError(f"{info.name}: the result of shape {list(shape)} cannot be written into a tensor "
                           f"of shape {list(data.shape)}")
    if dtype != data.dtype:
        result = wrap(pending_data(value))
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
    new_value = value if fresh and value.base is None else LazyValue(value.trace, value.index)
    if old is not None:
        new_value.keep_sharding = old.keep_sharding
    elif data.state is _DEVICE:
        new_value.keep_sharding = data.sharding
    hold(data, new_value)
    if data.view_of is not None:  # a view (also one whose value was materialized since): write into its root
        root_ref, chain = data.view_of
        root = root_ref()
        if root is not None:
            _write_back(root, chain, value, data)
    elif data.views:
        refresh_views(data, written_view)


def refresh_views(root: TensorData, skip: TensorData | None = None) -> None:
    """``root`` has new contents: each live view of it (but ``skip``) becomes its chain of view ops of ``root``."""
    root_t = None
    for view in root.live_views():
        if view is skip or view.view_of is None or view.view_of[0]() is not root:
            continue
        t = root_t = root_t if root_t is not None else wrap(root)
        for op, args in view.view_of[1]:
            t = dispatch(op, (), (t, *args), {})
        _take_contents(view, t._pjrt_data)


def _take_contents(data: TensorData, source: TensorData) -> None:
    """``data`` (a view) holds what the fresh ``source`` holds, keeping its link to its root."""
    if source.state is _LAZY:
        hold(data, LazyValue(source.lazy.trace, source.lazy.index))
    elif source.state is _DEVICE:
        assert source.buffers is not None and source.sharding is not None
        data.set_device(source.buffers, source.sharding, source.generation)
    else:
        assert source.host is not None
        data.set_host(source.host, copy=False)  # source is ours alone (the fallback's fresh result)


def _write_back(root: TensorData, chain: tuple[tuple[Any, tuple], ...], new_view: LazyValue,
                view: TensorData) -> None:
    """``root`` becomes itself with the region ``view`` (``chain`` of view ops from it) replaced by ``new_view``."""
    bases = [wrap(root)]
    for op, args in chain[:-1]:
        bases.append(dispatch(op, (), (bases[-1], *args), {}))
    updated = wrap(pending_data(LazyValue(new_view.trace, new_view.index)))
    for base_t, (op, args) in zip(reversed(bases), reversed(chain)):
        updated = _scatter_view(base_t, op, args, updated)
    if updated._pjrt_data.state is not _LAZY:  # written on the CPU by the fallback: a graph value of it
        updated = wrap(record(op_info(aten.clone.default), (updated,), {}))
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
