"""Lowerings of the ternary pointwise ops torch's optimizers call for every parameter: lerp, addcmul, addcdiv.

Each is one op instead of the 4-10 its torch decomposition records. The arithmetic is the
decomposition's, in the same order, so results match it bit for bit (half types compute in
float32 and round once, as torch does).
"""

from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, Operand, ScalarSlot, TensorValue
from ._promotion import Promotion
from ._table import lowers, pointwise

aten = torch.ops.aten


def _scale(em: Emitter, value: Operand, x: TensorValue) -> TensorValue:
    """``value * x``; a plain 1 (the default) multiplies by nothing."""
    if not isinstance(value, ScalarSlot) and value == 1:
        return x
    return em.mul(em.as_tensor(value, x.dtype, x.shape), x)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor, promotion=Promotion.COMPUTE)
def _lerp(em: Emitter, out: torch.Tensor, start: TensorValue, end: TensorValue, weight: Operand) -> TensorValue:
    """torch's stable form: ``|w| < 0.5 ? start + w * (end - start) : end + (w - 1) * (end - start)``.

    The weight is not broadcast first: a scalar weight's coefficient is computed once.
    """
    shape = tuple(out.shape)
    s, e = em.broadcast_to(start, shape), em.broadcast_to(end, shape)
    w = em.as_tensor(weight, s.dtype)
    mask = em.compare(em.unary(hlo.abs, w), em.constant(0.5, w.dtype, w.shape), "GE")
    coeff = em.select(mask, em.sub(w, em.constant(1, w.dtype, w.shape)), w)
    base = em.select(em.broadcast_to(mask, shape), e, s)
    return em.add(em.mul(em.broadcast_to(coeff, shape), em.sub(e, s)), base)


@pointwise(aten.addcmul.default)
def addcmul(em: Emitter, x: TensorValue, t1: TensorValue, t2: TensorValue, *, value: Operand = 1) -> TensorValue:
    """``x + value * t1 * t2``."""
    return em.add(x, em.mul(_scale(em, value, t1), t2))


@pointwise(aten.addcdiv.default)
def addcdiv(em: Emitter, x: TensorValue, t1: TensorValue, t2: TensorValue, *, value: Operand = 1) -> TensorValue:
    """``x + value * t1 / t2``."""
    return em.add(x, em.div(_scale(em, value, t1), t2))
