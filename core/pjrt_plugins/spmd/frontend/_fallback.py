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

import os
import threading
import warnings
from typing import Any

import torch

from ...errors import CpuFallbackWarning, UnsupportedOpError
from ..devices import count_fallback
from ..lowering import op_name
from ..transport import TensorData
from .tensor import XLAShardedTensor, to_cpu, wrap

#: ``PJRT_CPU_FALLBACK=0`` starts the process strict.
FALLBACK_ENV = "PJRT_CPU_FALLBACK"

_enabled = os.environ.get(FALLBACK_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
_warned: set[str] = set()
_warned_lock = threading.Lock()
aten = torch.ops.aten


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
    global _enabled
    _enabled = bool(enabled)


def cpu_fallback_enabled() -> bool:
    """Whether ops without a lowering run on the CPU (:func:`set_cpu_fallback`)."""
    return _enabled


def refuse_or_run(func: Any, args: tuple, kwargs: dict, error: UnsupportedOpError | None = None) -> Any:
    """Run ``func`` through the fallback, or raise ``error`` (by default: no lowering) when it is off."""
    if not _enabled:
        raise error or UnsupportedOpError(op_name(func), f"operator {op_name(func)} has no lowering to StableHLO on "
                                          "the pjrt device and the CPU fallback is off (xs.set_cpu_fallback(False)); "
                                          "turn it on, or compute it on the CPU (move the tensors with .cpu())")
    return run(func, args, kwargs)


def _map(fn: Any, value: Any) -> Any:
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        mapped = [_map(fn, v) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    if isinstance(value, dict):
        return {k: _map(fn, v) for k, v in value.items()}
    return fn(value)


#: More to say about an op in its warning: what to use instead.
_HINTS = {
    "aten.nonzero.default": (
        ". Its result's shape follows the data, so the programs after it are compiled anew for each new count: "
        "in a training loop, most steps. Use torch.nonzero_static(x, size=...) (lowered, a fixed shape); a "
        "mixture-of-experts model that routes with nonzero (transformers' experts_implementation=\"eager\") has "
        "bounded paths: \"grouped_mm\" (the default), \"batched_mm\", or pjrt_plugins.spmd.moe.capacity_experts "
        "(docs/models.md, Mixture of experts)"),
}


def _warn_once(name: str) -> None:
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    warnings.warn(f"{name} has no lowering for the pjrt device; it runs on the CPU (counted in xs.metrics(); "
                  f"xs.set_cpu_fallback(False) refuses it instead){_HINTS.get(name, '')}", CpuFallbackWarning,
                  stacklevel=5)


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
    name = op_name(func)
    _warn_once(name)
    count_fallback(name)

    copies: dict[int, torch.Tensor] = {}

    def cpu_copy(v: Any) -> Any:
        if isinstance(v, XLAShardedTensor):
            copy = to_cpu(v)
            copies[id(copy)] = v
            return copy
        if isinstance(v, torch.device) and v.type == "pjrt":
            return torch.device("cpu")
        return v

    cpu_args = _map(cpu_copy, args)
    cpu_kwargs = _map(cpu_copy, kwargs)
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
                check_not_resized(func, target, cpu_t)
                target.copy_(cpu_t)
                written_ids[id(cpu_t)] = target

    def to_pjrt(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            target = written_ids.get(id(v))
            if target is not None:
                return target  # the result aliases a written argument (x.op_(), out=): return the pjrt tensor
            if v.device.type != "cpu":
                return v
            return wrap(TensorData.from_host(v.detach(), copy=v._base is not None or id(v) in copies))
        return v

    result = _map(to_pjrt, out)
    if getattr(func, "is_view", False) and isinstance(result, XLAShardedTensor) and args \
            and isinstance(args[0], XLAShardedTensor):
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
    name = op_name(view_op)
    if not _enabled:
        raise UnsupportedOpError(name, f"writing in place into the result of {name} (a view) needs the CPU fallback, "
                                 "which is off; clone the view first, or turn the fallback on")
    _warn_once(f"writing into a view made by {name}")
    count_fallback(name)
    host = to_cpu(base).clone()
    value = to_cpu(new_view)
    with torch._C._DisableTorchDispatch():
        view_op(host, *[_map(lambda v: to_cpu(v) if isinstance(v, XLAShardedTensor) else v, a)
                        for a in view_args]).copy_(value)
    return wrap(TensorData.from_host(host, copy=False))


def check_not_resized(func: Any, target: Any, value: Any) -> None:
    """Raise when an op's result cannot be written into ``target``, whose shape a pjrt tensor cannot change."""
    if tuple(target.shape) != tuple(value.shape):
        raise RuntimeError(f"{op_name(func)}: the result has shape {list(value.shape)} but the out= tensor has "
                           f"{list(target.shape)}, and a pjrt tensor cannot be resized; allocate out= with the "
                           "result's shape, or use the functional form")
