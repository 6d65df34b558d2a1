"""Output specs: the shapes and dtypes an op gives on these arguments, worked out on meta tensors (memoized),
and the refusals decided there (data-dependent shapes, complex numbers, results that are not tensors).

A spec is ``("T", shape, dtype)`` for a tensor, ``("L"|"U", (specs...))`` for a list or tuple of them,
``("N",)`` for an output the caller did not ask for, ``("X", type name)`` for anything else.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from ...errors import DataDependentShapeError, UnsupportedOpError
from ..lowering import COMPLEX_LOWERINGS, META_RULES, lowered_decomposition_outputs
from ..transport import TensorData
from ._op_info import OpInfo
from ._state import ENGINE

__all__ = [
    "COMPLEX_REFUSAL",
    "NotLowerable",
    "NotWhole",
    "computes_complex",
    "meta_kwargs",
    "only_tensors",
    "out_meta",
    "output_spec",
    "to_meta",
    "decomposition_output_spec",
]

aten = torch.ops.aten

COMPLEX_REFUSAL = ("computes with complex numbers, which the pjrt lowering does not support, and the CPU fallback "
                   "is off (xs.set_cpu_fallback(False)); turn it on, or compute it on the CPU (move the tensors with "
                   ".cpu())")
#: Ops that move complex elements without computing with them: lowered as for any other dtype.
_COMPLEX_MOVES = frozenset({aten.clone.default, aten.copy.default, aten.alias.default, aten.cat.default,
                            aten.stack.default, aten.slice_scatter.default, aten.select_scatter.default,
                            aten.diagonal_scatter.default, aten.as_strided_scatter.default})
_CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
#: Output specs kept per cache (entries beyond this are computed every time).
_META_CACHE_SIZE = 65536
_NOT_SEEN = object()


class NotLowerable(UnsupportedOpError):
    """An op the lowering would compute wrongly on these arguments (complex numbers): the CPU fallback runs it."""


class NotWhole(Exception):
    """The op's decomposition does not lower on these arguments: run it piece by piece instead."""


class _Unkeyable(Exception):
    """An argument that cannot be part of a cache key (the meta result is then computed afresh)."""


def to_meta(value: Any) -> Any:
    """An argument as it goes to a meta kernel: pjrt tensors, their data and CPU tensors as meta tensors."""
    data = getattr(value, "_pjrt_data", None)
    if data is not None and isinstance(value, torch.Tensor):
        return data.meta()
    if isinstance(value, TensorData):  # recorded by data (record_data)
        return value.meta()
    if isinstance(value, torch.Tensor):
        return torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    return value


def meta_kwargs(kwargs: dict) -> dict:
    out = {k: to_meta(v) for k, v in kwargs.items()}
    if "device" in out and out["device"] is not None:
        out["device"] = torch.device("meta")
    return out


def _arg_spec(value: Any, any_float: bool = False) -> Any:
    """A hashable description of an argument: tensors by shape and dtype, constants by value.

    ``any_float``: floats count by type only (for ops whose output shape and dtype do not
    depend on a float's value, see ``LIFTED_OPS``).
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


def out_meta(spec: Any) -> Any:
    """Meta tensors (or lists/tuples of them) with the shapes and dtypes of ``spec``."""
    kind = spec[0]
    if kind == "T":
        return torch.empty(spec[1], dtype=spec[2], device="meta")
    if kind in ("L", "U"):
        items = [out_meta(s) for s in spec[1]]
        return items if kind == "L" else tuple(items)
    return None


def only_tensors(spec: Any) -> bool:
    """A tensor, or a tuple/list of tensors and Nones (outputs an op was told not to compute)."""
    if spec[0] == "T":
        return True
    return spec[0] in ("L", "U") and all(s[0] == "N" or only_tensors(s) for s in spec[1])


def computes_complex(func: Any, args: tuple, kwargs: dict, meta_out: Any = None) -> bool:
    """True when a tensor argument or result of the op is complex (``meta_out``: its result on meta tensors,
    worked out here when not given)."""
    if any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in pytree.tree_leaves((args, kwargs, meta_out))):
        return True
    if meta_out is not None:
        return False
    try:
        meta_out = META_RULES.get(func, func)(*pytree.tree_map(to_meta, args), **meta_kwargs(kwargs))
    except Exception:  # noqa: BLE001 - no meta kernel: the caller's own path reports what is wrong
        return False
    return any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in pytree.tree_leaves(meta_out))


def _refuse_complex(info: OpInfo, args: tuple, kwargs: dict, meta_out: Any) -> None:
    """Raise :class:`NotLowerable` when a tensor argument or result of the op is complex (no lowering computes
    complex numbers right; views and copies only move them)."""
    if info.is_view or info.func in _COMPLEX_MOVES or info.func in COMPLEX_LOWERINGS:
        return
    if computes_complex(info.func, args, kwargs, meta_out if meta_out is not None else ()):
        raise NotLowerable(info.name, f"{info.name} {COMPLEX_REFUSAL}")


def output_spec(info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """The output spec of ``info.func`` on these arguments, from meta tensors (memoized); refuses non-tensor results."""
    func = info.func
    try:
        key: Any = (func, _arg_spec(args, info.lifts),
                    tuple(sorted((k, _arg_spec(v, info.lifts)) for k, v in kwargs.items())))
    except _Unkeyable:
        key = None
    cache = ENGINE.meta_cache
    spec = cache.get(key) if key is not None else None
    if spec is None:
        try:
            meta_out = META_RULES.get(func, func)(*pytree.tree_map(to_meta, args), **meta_kwargs(kwargs))
        except NotImplementedError as exc:
            # Meta kernels refuse ops whose output shape depends on the data (nonzero, boolean masks).
            raise DataDependentShapeError(info.name, f"{info.name} cannot run on the pjrt device: its output "
                                          f"shape is not known before running it ({exc}), and the CPU fallback is "
                                          "off. Use a fixed-shape form (torch.where, masked_fill) or compute it on "
                                          "the CPU.") from exc
        _refuse_complex(info, args, kwargs, meta_out)
        spec = _out_spec(meta_out)
        if key is not None and only_tensors(spec) and len(cache) < _META_CACHE_SIZE:
            cache[key] = spec
    if not only_tensors(spec):
        kind = spec[1] if spec[0] == "X" else "list with non-tensors"
        raise UnsupportedOpError(info.name, f"{info.name} returns a {kind}, which the pjrt device cannot give "
                                 "before running the graph")
    return spec


def decomposition_output_spec(info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """The output spec of ``info.func`` recorded whole: its decomposition's (which may differ from the meta
    kernel's, and is what running it piece by piece gives); raises :class:`NotWhole` where it does not lower."""
    try:
        key = (info.func, _arg_spec(args), tuple(sorted((k, _arg_spec(v)) for k, v in kwargs.items())))
    except _Unkeyable:
        raise NotWhole from None
    cache = ENGINE.decomposition_specs
    spec = cache.get(key, _NOT_SEEN)
    if spec is _NOT_SEEN:
        outputs = lowered_decomposition_outputs(info.func, pytree.tree_map(to_meta, args), meta_kwargs(kwargs))
        spec = _out_spec(outputs) if outputs is not None else None
        if spec is not None and (not only_tensors(spec) or computes_complex(info.func, args, kwargs, outputs)):
            spec = None  # complex numbers: dispatch sends the op to the fallback
        if len(cache) < _META_CACHE_SIZE:
            cache[key] = spec
    if spec is None:
        raise NotWhole
    return spec
