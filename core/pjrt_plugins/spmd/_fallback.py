"""The CPU fallback: an op the pjrt device cannot run runs on CPU copies of its arguments, results come back.

On by default, as in PyTorch/XLA, so programs run; each op warns once
(:class:`~pjrt_plugins.errors.CpuFallbackWarning`) and every use is counted in
``xs.metrics().fallbacks`` / ``fallback_ops``. ``xs.set_cpu_fallback(False)`` (or
``PJRT_CPU_FALLBACK=0``) is the strict switch: such an op raises ``UnsupportedOpError`` instead.
Ops whose output shape depends on the data (``nonzero``, ``masked_select``, boolean indexing,
``unique``) always need it. Never records ops itself: results and written arguments go back
through the tensors' own ``copy_`` and deferred host data.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any

import torch

from ..errors import CpuFallbackWarning, UnsupportedOpError
from . import _executor
from ._data import TensorData
from .lowering import op_name

#: ``PJRT_CPU_FALLBACK=0`` starts the process strict.
FALLBACK_ENV = "PJRT_CPU_FALLBACK"

_enabled = os.environ.get(FALLBACK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
_warned: set[str] = set()
_warned_lock = threading.Lock()
aten = torch.ops.aten


def set_enabled(enabled: bool) -> None:
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    return _enabled


def refuse_or_run(func: Any, args: tuple, kwargs: dict, error: UnsupportedOpError | None = None) -> Any:
    """Run ``func`` through the fallback, or raise ``error`` (by default: no lowering) when it is off."""
    if not _enabled:
        raise error or UnsupportedOpError(op_name(func), f"operator {op_name(func)} has no lowering to StableHLO on "
                                          "the pjrt device and the CPU fallback is off (xs.set_cpu_fallback(False)); "
                                          "turn it on, or compute it on the CPU (move the tensors with .cpu())")
    return run(func, args, kwargs)


def _tensor_module() -> Any:
    from . import tensor

    return tensor


def _map(fn: Any, value: Any) -> Any:
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        mapped = [_map(fn, v) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    if isinstance(value, dict):
        return {k: _map(fn, v) for k, v in value.items()}
    return fn(value)


def _warn_once(name: str) -> None:
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    warnings.warn(f"{name} has no lowering for the pjrt device; it runs on the CPU (counted in xs.metrics(); "
                  "xs.set_cpu_fallback(False) refuses it instead)", CpuFallbackWarning, stacklevel=5)


def _written_arguments(func: Any, args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    """``(position or name, value)`` of every argument the op writes into (in-place targets and out= tensors)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    written = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            if arg.name in kwargs:
                written.append((arg.name, kwargs[arg.name]))
        else:
            written.append((i, args[i]))
    return written


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func`` on CPU copies of the pjrt arguments; written pjrt arguments get the new values, results come back
    as deferred pjrt data (non-tensor results as they are)."""
    tmod = _tensor_module()
    name = op_name(func)
    _warn_once(name)
    _executor.count_fallback(name)

    copies: dict[int, torch.Tensor] = {}

    def to_cpu(v: Any) -> Any:
        if isinstance(v, tmod.XLAShardedTensor):
            copy = tmod.to_cpu(v)
            copies[id(copy)] = v
            return copy
        if isinstance(v, torch.device) and v.type == "pjrt":
            return torch.device("cpu")
        return v

    cpu_args = _map(to_cpu, args)
    cpu_kwargs = _map(to_cpu, kwargs)
    if isinstance(cpu_kwargs.get("device"), str) and cpu_kwargs["device"].startswith("pjrt"):
        cpu_kwargs["device"] = torch.device("cpu")
    with torch._C._DisableTorchDispatch():  # no subclass below: plain CPU kernels
        out = func(*cpu_args, **cpu_kwargs)

    # Written arguments: the pjrt tensor takes the CPU copy's new value (a pending view writes into its base).
    written_ids: dict[int, Any] = {}
    for where, cpu_value in _written_arguments(func, cpu_args, cpu_kwargs):
        for cpu_t in (cpu_value if isinstance(cpu_value, (list, tuple)) else [cpu_value]):
            target = copies.get(id(cpu_t))
            if target is not None:
                _check_not_resized(func, target, cpu_t)
                target.copy_(cpu_t)
                written_ids[id(cpu_t)] = target

    def to_pjrt(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            target = written_ids.get(id(v))
            if target is not None:
                return target  # the result aliases a written argument (x.op_(), out=): return the pjrt tensor
            if v.device.type != "cpu":
                return v
            return tmod.wrap(TensorData.from_host(v.detach(), copy=v._base is not None or id(v) in copies))
        return v

    result = _map(to_pjrt, out)
    if getattr(func, "is_view", False) and isinstance(result, tmod.XLAShardedTensor) and args \
            and isinstance(args[0], tmod.XLAShardedTensor):
        # A view (view_as_real, unfold, ...): linked to its base both ways, as a torch view is.
        result._pjrt_data.make_view_of(args[0]._pjrt_data, ((func, tuple(_positional(func, args, kwargs)[1:])),))
    return result


def _positional(func: Any, args: tuple, kwargs: dict) -> tuple:
    """``args`` followed by the values of ``kwargs`` in schema order (a view op's arguments, to call it again)."""
    if not kwargs:
        return tuple(args)
    rest = []
    for arg in func._schema.arguments[len(args):]:
        if arg.kwarg_only:
            raise UnsupportedOpError(op_name(func), f"{op_name(func)}: keyword-only argument {arg.name} of a view "
                                     "op run by the CPU fallback; call it positionally")
        rest.append(kwargs[arg.name] if arg.name in kwargs else arg.default_value)
    return (*args, *rest)


def scatter_view(base: Any, view_op: Any, view_args: tuple, new_view: Any) -> Any:
    """``base`` with its view ``view_op(base, *view_args)`` replaced by ``new_view``, computed on the CPU.

    For views the devices cannot write back into (those the fallback made, ``expand``): torch
    raises for a view whose elements overlap, as on the CPU. Returns a new pjrt tensor.
    """
    tmod = _tensor_module()
    name = op_name(view_op)
    if not _enabled:
        raise UnsupportedOpError(name, f"writing in place into the result of {name} (a view) needs the CPU fallback, "
                                 "which is off; clone the view first, or turn the fallback on")
    _warn_once(f"writing into a view made by {name}")
    _executor.count_fallback(name)
    host = tmod.to_cpu(base).clone()
    value = tmod.to_cpu(new_view)
    with torch._C._DisableTorchDispatch():
        view_op(host, *[_map(lambda v: tmod.to_cpu(v) if isinstance(v, tmod.XLAShardedTensor) else v, a)
                        for a in view_args]).copy_(value)
    return tmod.wrap(TensorData.from_host(host, copy=False))


def _check_not_resized(func: Any, target: Any, value: Any) -> None:
    if tuple(target.shape) != tuple(value.shape):
        raise RuntimeError(f"{op_name(func)}: the result has shape {list(value.shape)} but the out= tensor has "
                           f"{list(target.shape)}, and a pjrt tensor cannot be resized; allocate out= with the "
                           "result's shape, or use the functional form")


def run_out_variant(func: Any, args: tuple, kwargs: dict, functional: Any) -> Any:
    """An ``out=`` overload: the functional op runs (on the device if it can), its results are copied into the
    written arguments (``out``, or ``max``/``max_values`` and the like).

    The out tensors keep their shape (a pjrt tensor cannot be resized): a result of another
    shape raises.
    """
    from ._lazy import dispatch

    written = {a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None
               and a.alias_info.is_write}
    rest = {k: v for k, v in kwargs.items() if k not in written}
    result = dispatch(functional, (), args, rest)
    outs: list[Any] = []
    for name in (a.name for a in func._schema.arguments if a.name in written):
        value = kwargs[name]
        outs += list(value) if isinstance(value, (list, tuple)) else [value]
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(outs) != len(results):
        raise UnsupportedOpError(op_name(func), f"{op_name(func)}: {len(results)} results for {len(outs)} out= tensors")
    tmod = _tensor_module()
    for target, value in zip(outs, results):
        _check_not_resized(func, target, value)
        if isinstance(target, tmod.XLAShardedTensor):
            target.copy_(value)
        else:
            target.copy_(value.cpu() if isinstance(value, tmod.XLAShardedTensor) else value)
    if "out" in written:
        return kwargs["out"]
    return tuple(outs) if len(outs) > 1 else outs[0]


def _writes_kwargs(schema: Any) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@functools.cache
def is_out_variant(func: Any) -> bool:
    """True for overloads that write their results into keyword arguments (``out=``, ``max=``/``max_values=``)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and _writes_kwargs(schema)


@functools.cache
def functional_of_out(func: Any) -> Any | None:
    """The overload of ``func``'s packet taking the same arguments without the written ones, or None."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not (a.kwarg_only and a.alias_info is not None
                                                                      and a.alias_info.is_write)]
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = candidate._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in args):
            continue
        if [(a.name, str(a.type)) for a in args] == wanted:
            return candidate
    return None


#: Index ops whose output shape (index) or meaning (index_put) depends on the data when an index is a mask.
_MASKABLE = {aten.index.Tensor, aten.index_put.default, aten._index_put_impl_.default, aten.index_put_.default,
             aten._unsafe_index_put.default}


def data_dependent(func: Any, args: tuple) -> bool:
    """True for indexing with a boolean mask (its result's shape or positions depend on the mask's values)."""
    if func not in _MASKABLE or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())
