"""Lowerings of the ternary pointwise ops torch's optimizers call for every parameter: lerp, addcmul, addcdiv.

Each is one op instead of the 4-10 its torch decomposition records. The arithmetic is the
decomposition's, in the same order, so results match it bit for bit (half types compute in
float32 and round once, as torch does).
"""

from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._elementwise import compute_dtype
from ._emitter import Emitter, Operand, ScalarSlot, TensorValue
from ._table import lowers

aten = torch.ops.aten


def _scale(em: Emitter, value: Operand, x: TensorValue) -> TensorValue:
    """``value * x``; a plain 1 (the default) multiplies by nothing."""
    if not isinstance(value, ScalarSlot) and value == 1:
        return x
    return em.mul(em.as_tensor(value, x.dtype, x.shape), x)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(em: Emitter, out: torch.Tensor, start: TensorValue, end: TensorValue, weight: Operand) -> TensorValue:
    """torch's stable form: ``|w| < 0.5 ? start + w * (end - start) : end + (w - 1) * (end - start)``."""
    cdt, shape = compute_dtype(out.dtype), tuple(out.shape)
    s, e = em.as_tensor(start, cdt, shape), em.as_tensor(end, cdt, shape)
    w = em.as_tensor(weight, cdt)
    mask = em.compare(em.unary(hlo.abs, w), em.constant(0.5, cdt, w.shape), "GE")
    coeff = em.select(mask, em.sub(w, em.constant(1, cdt, w.shape)), w)
    base = em.select(em.broadcast_to(mask, shape), e, s)
    result = em.add(em.mul(em.broadcast_to(coeff, shape), em.sub(e, s)), base)
    return em.convert(result, out.dtype)


@lowers(aten.addcmul.default)
def _addcmul(em: Emitter, out: torch.Tensor, x: TensorValue, t1: TensorValue, t2: TensorValue, *,
             value: Operand = 1) -> TensorValue:
    """``x + value * t1 * t2``."""
    cdt, shape = compute_dtype(out.dtype), tuple(out.shape)
    a, b, c = (em.as_tensor(v, cdt, shape) for v in (x, t1, t2))
    return em.convert(em.add(a, em.mul(_scale(em, value, b), c)), out.dtype)


@lowers(aten.addcdiv.default)
def _addcdiv(em: Emitter, out: torch.Tensor, x: TensorValue, t1: TensorValue, t2: TensorValue, *,
             value: Operand = 1) -> TensorValue:
    """``x + value * t1 / t2``."""
    cdt, shape = compute_dtype(out.dtype), tuple(out.shape)
    a, b, c = (em.as_tensor(v, cdt, shape) for v in (x, t1, t2))
    return em.convert(em.add(a, em.div(_scale(em, value, b), c)), out.dtype)
