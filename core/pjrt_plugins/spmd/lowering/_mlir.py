"""MLIR plumbing for the lowering: the context with StableHLO loaded, torch dtypes as MLIR types.

Built only with jaxlib's MLIR Python bindings; nothing here emits text by hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import chlo, sdy, stablehlo

from ...errors import LoweringError

logger = logging.getLogger(__name__)

_local = threading.local()
_passes_registered = False
_passes_lock = threading.Lock()


def make_context() -> ir.Context:
    """A fresh MLIR context with func, StableHLO, CHLO and Shardy loaded (one lowering uses one context)."""
    global _passes_registered
    ctx = ir.Context()
    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    stablehlo.register_dialect(ctx)
    chlo.register_dialect(ctx)
    sdy.register_dialect(ctx)
    with _passes_lock:
        if not _passes_registered:
            stablehlo.register_stablehlo_passes()
            _passes_registered = True
    return ctx


def element_type(dtype: torch.dtype) -> ir.Type:
    """The MLIR element type of a torch dtype (inside an active context)."""
    if dtype == torch.float32:
        return ir.F32Type.get()
    if dtype == torch.float64:
        return ir.F64Type.get()
    if dtype == torch.float16:
        return ir.F16Type.get()
    if dtype == torch.bfloat16:
        return ir.BF16Type.get()
    if dtype == torch.bool:
        return ir.IntegerType.get_signless(1)
    if dtype in _SIGNED_BITS:
        return ir.IntegerType.get_signless(_SIGNED_BITS[dtype])
    if dtype in _UNSIGNED_BITS:
        return ir.IntegerType.get_unsigned(_UNSIGNED_BITS[dtype])
    if dtype == torch.complex64:
        return ir.ComplexType.get(ir.F32Type.get())
    if dtype == torch.complex128:
        return ir.ComplexType.get(ir.F64Type.get())
    raise LoweringError(f"dtype {dtype} has no StableHLO element type on the pjrt device")


_SIGNED_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
_UNSIGNED_BITS = {torch.uint8: 8, torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}


def tensor_type(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), element_type(dtype))


def is_unsigned(dtype: torch.dtype) -> bool:
    return dtype in _UNSIGNED_BITS


def bit_width(dtype: torch.dtype) -> int:
    return 1 if dtype == torch.bool else dtype.itemsize * 8


def scalar_attr(value: bool | int | float, dtype: torch.dtype) -> ir.Attribute:
    """An attribute holding ``value`` as one element of ``dtype``."""
    etype = element_type(dtype)
    if dtype.is_floating_point:
        return ir.FloatAttr.get(etype, float(value))
    if dtype == torch.bool:
        return ir.IntegerAttr.get(etype, 1 if value else 0)
    if dtype.is_complex:
        raise LoweringError("complex constants are not supported by the pjrt lowering")
    value = int(value)
    bits = bit_width(dtype)
    if is_unsigned(dtype):
        value &= (1 << bits) - 1
    else:
        # MLIR wants the two's complement value inside the signless width.
        value = ((value + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
    return ir.IntegerAttr.get(etype, value)


def splat_attr(value: bool | int | float, shape: tuple[int, ...], dtype: torch.dtype) -> ir.DenseElementsAttr:
    return ir.DenseElementsAttr.get_splat(tensor_type(shape, dtype), scalar_attr(value, dtype))


def dense_attr(tensor: torch.Tensor) -> ir.DenseElementsAttr:
    """A dense constant holding a (small) CPU tensor's values."""
    t = tensor.detach().contiguous()
    if t.dtype == torch.bool:
        bits = np.packbits(t.to(torch.uint8).numpy().reshape(-1), bitorder="little")
        return array_attr(bits, element_type(torch.bool), tensor.shape)
    arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return array_attr(arr, element_type(tensor.dtype), tensor.shape)


def array_attr(array: np.ndarray, etype: ir.Type, shape: Sequence[int] | None = None) -> ir.DenseElementsAttr:
    """A dense attribute holding ``array``'s bytes as ``etype`` elements, of ``shape`` (else the array's)."""
    buffer: Any = array  # a numpy array is a buffer; jaxlib's type stubs do not say so
    if shape is None:
        return ir.DenseElementsAttr.get(buffer, type=etype)
    return ir.DenseElementsAttr.get(buffer, type=etype, shape=list(shape))


def padding_attr(pairs: Any) -> ir.DenseElementsAttr:
    """The ``[n, 2]`` int64 attribute of (low, high) pairs that reduce_window and convolution take."""
    return array_attr(np.asarray(pairs, dtype=np.int64).reshape(-1, 2), ir.IntegerType.get_signless(64))
