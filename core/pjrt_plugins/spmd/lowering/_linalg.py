"""Lowerings of matrix products (mm, bmm, addmm, baddbmm, dot, mv) to stablehlo.dot_general.

``linear`` and ``matmul`` are composite in torch and reach us already reduced to these.
"""

from __future__ import annotations

from typing import Any

import torch

from ._emitter import Emitter, TensorValue
from ._promotion import Promotion, promoting
from ._table import lowers

aten = torch.ops.aten


def _product(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """a @ b for 1-D/2-D/3-D operands with one leading batch dimension at most."""
    if a.rank == 3 and b.rank == 3:
        return em.dot_general(a, b, ((2,), (1,)), ((0,), (0,)))
    return em.dot_general(a, b, ((a.rank - 1,), (0,)))


@lowers(aten.mm.default, aten.bmm.default, aten.dot.default, aten.mv.default, promotion=Promotion.COMPUTE)
def _mm(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue) -> TensorValue:
    return _product(em, a, b)


def _scaled_sum(em: Emitter, out: torch.Tensor, bias: TensorValue, product: TensorValue, beta: Any, alpha: Any) -> TensorValue:
    shape = tuple(out.shape)
    p = product if alpha == 1 else em.mul(product, em.constant(alpha, product.dtype, product.shape))
    if beta == 0:
        return p
    bias = em.broadcast_to(em.convert(bias, out.dtype), shape)
    if beta != 1:
        bias = em.mul(bias, em.constant(beta, bias.dtype, shape))
    return em.add(bias, p)


@lowers(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(em: Emitter, out: torch.Tensor, bias: TensorValue, a: TensorValue, b: TensorValue, *,
           beta: Any = 1, alpha: Any = 1) -> TensorValue:
    """The product rounded to the result's dtype, then scaled and added to the bias in that dtype."""
    return _scaled_sum(em, out, bias, _mm(em, out, a, b), beta, alpha)


def _batch_summed(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue) -> TensorValue:
    """sum over the batch of a[i] @ b[i]: one dot_general contracting the batch and inner dims."""
    return em.dot_general(a, b, ((0, 2), (0, 1)))


_batch_summed_product = promoting(_batch_summed, Promotion.COMPUTE)


@lowers(aten.addbmm.default)
def _addbmm(em: Emitter, out: torch.Tensor, bias: TensorValue, a: TensorValue, b: TensorValue, *, beta: Any = 1,
            alpha: Any = 1) -> TensorValue:
    return _scaled_sum(em, out, bias, _batch_summed_product(em, out, a, b), beta, alpha)

