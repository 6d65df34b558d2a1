"""Lowerings of matrix products (mm, bmm, addmm, baddbmm, dot, mv, and the grouped products of
mixture-of-experts layers) to stablehlo.dot_general.

``linear`` and ``matmul`` are composite in torch and reach us already reduced to these.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._promotion import Promotion, compute_dtype, promoting
from ._table import lowers, meta_rule

aten = torch.ops.aten


def _product(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """a @ b for 1-D/2-D/3-D operands with one leading batch dimension at most."""
    if a.rank == 3 and b.rank == 3:
        return em.batched_matmul(a, b)
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


# -- grouped matrix products (mixture-of-experts layers) ------------------------------------------

_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@meta_rule(aten._grouped_mm.default)
def _grouped_mm_meta(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch's checks of the CPU kernel (its meta kernel is CUDA's: bfloat16 only), without its alignment rules."""
    for name, m in (("mat_a", a), ("mat_b", b)):
        if m.dtype not in _GROUPED_MM_DTYPES:
            raise RuntimeError(f"_grouped_mm: expected {name} to be float32, bfloat16 or float16, got {m.dtype}")
        if m.dim() not in (2, 3):
            raise RuntimeError(f"_grouped_mm: {name} has to be 2d or 3d, got {m.dim()}d")
    if a.dtype != b.dtype:
        raise RuntimeError(f"_grouped_mm: mat_a and mat_b must have one dtype, got {a.dtype} and {b.dtype}")
    if (out_dtype or a.dtype) != a.dtype:
        raise RuntimeError(f"_grouped_mm: the output dtype must be mat_a's ({a.dtype}), got {out_dtype}")
    if bias is not None:
        raise RuntimeError("_grouped_mm: bias is not supported (torch's kernels have none either); add it after")
    if (a.dim() == 3 or b.dim() == 3) and a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"_grouped_mm: contraction dimension of mat_a {tuple(a.shape)} and mat_b "
                           f"{tuple(b.shape)} must match")
    grouped = a.dim() == 2 or b.dim() == 2
    if grouped != (offs is not None):
        raise RuntimeError("_grouped_mm: give offs (the cumulative group ends, int32) when a matrix is 2d, and none "
                           "when both are 3d")
    if offs is None:
        if a.shape[0] != b.shape[0]:
            raise RuntimeError(f"_grouped_mm: batch sizes {a.shape[0]} and {b.shape[0]} must match")
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
    if offs.dim() != 1 or offs.dtype != torch.int32:
        raise RuntimeError(f"_grouped_mm: offs has to be a 1d int32 tensor, got {offs.dim()}d {offs.dtype}")
    groups = offs.shape[0]
    if a.dim() == 2 and b.dim() == 2:
        return a.new_empty((groups, a.shape[0], b.shape[1]))
    if (b if a.dim() == 2 else a).shape[0] != groups:
        raise RuntimeError(f"_grouped_mm: {groups} offsets for {(b if a.dim() == 2 else a).shape[0]} matrices")
    return a.new_empty((a.shape[0], b.shape[2]) if a.dim() == 2 else (a.shape[1], b.shape[1]))


def _group_masks(em: Emitter, offs: TensorValue, size: int) -> TensorValue:
    """bool ``[groups, size]``: position ``i`` is in group ``g`` when ``offs[g - 1] <= i < offs[g]`` (``offs[-1]``
    read as 0), torch's cumulative group ends. Positions past the last end are in no group."""
    groups = offs.shape[0]
    ends = em.convert(offs, torch.int64)
    starts = em.concatenate([em.constant(0, torch.int64, (1,)), em.slice(ends, [0], [groups - 1], [1])], 0)
    i = em.iota((groups, size), 1, torch.int64)
    after_start = em.compare(i, em.broadcast_in_dim(starts, (groups, size), [0]), "GE")
    before_end = em.compare(i, em.broadcast_in_dim(ends, (groups, size), [0]), "LT")
    return em.binary(hlo.and_, after_start, before_end)


def _pick_group(em: Emitter, products: TensorValue, masks: TensorValue, group_dim: int,
                mask_dims: list[int]) -> TensorValue:
    """``products`` (one product per group along ``group_dim``) reduced to the product of each position's group
    (zero in none): a select, so another group's inf or NaN never reaches a position."""
    keep = em.broadcast_in_dim(masks, products.shape, mask_dims)
    picked = em.select(keep, products, em.constant(0, products.dtype, products.shape))
    return em.reduce_simple(picked, [group_dim], "sum")


@lowers(aten._grouped_mm.default)
def _grouped_mm(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue, offs: TensorValue | None = None,
                bias: TensorValue | None = None, out_dtype: torch.dtype | None = None) -> TensorValue:
    """Each group's product with static shapes: every group's product is computed and each position keeps its own
    (the groups' sizes are run-time data), so the FLOPs are ``groups`` times a dense product's. Partitions like a
    dot_general: rows (data parallel), columns (tensor parallel) or the groups (expert parallel).

    - 2d x 3d (``offs`` over a's rows, the experts' forward): ``out[m] = a[m] @ b[group of m]``;
    - 3d x 2d (``offs`` over b's columns): ``out[:, n] = a[group of n] @ b[:, n]``;
    - 2d x 2d (``offs`` over the contraction, the experts' weight gradient): ``out[g] = a[:, K_g] @ b[K_g, :]``;
    - 3d x 3d: ``bmm``.
    """
    cdt = compute_dtype(out.dtype)
    a, b = em.convert(a, cdt), em.convert(b, cdt)
    if offs is None:
        r = em.dot_general(a, b, ((2,), (1,)), ((0,), (0,)))
    elif offs.shape[0] == 0:
        r = em.constant(0, cdt, tuple(out.shape))
    elif a.rank == 2 and b.rank == 3:
        products = em.dot_general(a, b, ((1,), (1,)))  # [M, G, N]
        r = _pick_group(em, products, _group_masks(em, offs, a.shape[0]), 1, [1, 0])
    elif a.rank == 3 and b.rank == 2:
        products = em.dot_general(a, b, ((2,), (0,)))  # [G, M, N]
        r = _pick_group(em, products, _group_masks(em, offs, b.shape[1]), 0, [0, 2])
    else:
        # Both operands masked, so a group's sum never meets another group's inf or NaN (0 * inf).
        masks = _group_masks(em, offs, a.shape[1])  # [G, K]
        groups, (m, k), n = offs.shape[0], a.shape, b.shape[1]
        zero = em.constant(0, cdt)
        a_groups = em.select(em.broadcast_in_dim(masks, (groups, m, k), [0, 2]),
                             em.broadcast_in_dim(a, (groups, m, k), [1, 2]), em.broadcast_to(zero, (groups, m, k)))
        b_groups = em.select(em.broadcast_in_dim(masks, (groups, k, n), [0, 1]),
                             em.broadcast_in_dim(b, (groups, k, n), [1, 2]), em.broadcast_to(zero, (groups, k, n)))
        r = em.dot_general(a_groups, b_groups, ((2,), (1,)), ((0,), (0,)))
    return em.convert(r, out.dtype)
