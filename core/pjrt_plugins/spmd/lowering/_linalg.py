"""Lowerings of matrix products (mm, bmm, addmm, baddbmm, dot, mv) to stablehlo.dot_general.

``linear`` and ``matmul`` are composite in torch and reach us already reduced to these.
"""

from __future__ import annotations

from typing import Any

import torch

from ._elementwise import compute_dtype
from ._emitter import Emitter, TensorValue
from ._table import lowers

aten = torch.ops.aten


def _matmul(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue) -> TensorValue:
    """a @ b for 1-D/2-D/3-D operands with one leading batch dimension at most."""
    cdt = compute_dtype(out.dtype)
    a, b = em.convert(a, cdt), em.convert(b, cdt)
    if a.rank == 3 and b.rank == 3:
        r = em.batched_matmul(a, b)
    else:
        r = em.dot_general(a, b, ((a.rank - 1,), (0,)))
    return em.convert(r, out.dtype)


@lowers(aten.mm.default, aten.bmm.default, aten.dot.default, aten.mv.default)
def _mm(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue) -> TensorValue:
    return _matmul(em, out, a, b)


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
    return _scaled_sum(em, out, bias, _matmul(em, out, a, b), beta, alpha)


@lowers(aten.addbmm.default)
def _addbmm(em: Emitter, out: torch.Tensor, bias: TensorValue, a: TensorValue, b: TensorValue, *, beta: Any = 1,
            alpha: Any = 1) -> TensorValue:
    """bias + sum over the batch of a[i] @ b[i]: one dot_general contracting the batch and inner dims."""
    cdt = compute_dtype(out.dtype)
    product = em.convert(em.dot_general(em.convert(a, cdt), em.convert(b, cdt), ((0, 2), (0, 1))), out.dtype)
    return _scaled_sum(em, out, bias, product, beta, alpha)
