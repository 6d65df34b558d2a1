"""Lowerings of the backward of interpolation (nearest, linear, bilinear, bicubic, trilinear, antialiased) and of
replication padding, and of the antialiased forward that torch has no decomposition for.

Each of these ops is a separable linear map: one matrix per spatial dimension. The matrix is
torch's own: the forward op run on the CPU over an identity matrix (sizes and scales are static),
so the coefficients are exactly the CPU kernel's. A forward applies the matrices, a backward
their transposes, each as one ``dot_general``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._mlir import dense_attr
from ._pooling import apply_along
from ._promotion import Promotion, compute_dtype
from ._table import lowers

aten = torch.ops.aten


@functools.lru_cache(maxsize=256)
def _matrix(forward: Any, n: int, k: int, in_size: int, out_size: int, extra: tuple, dtype: torch.dtype) -> torch.Tensor:
    """[out_size, in_size]: what ``forward`` does along spatial dim ``k`` of ``n``, read off an identity input.

    ``extra`` holds the op's arguments after the input, asking for size 2 (unscaled) in every other
    dimension, which leaves those alone; not size 1: torch 2.13's CPU antialiased kernels mix the
    rows up when a dimension has one element.
    """
    if in_size == 0 or out_size == 0:
        return torch.zeros(out_size, in_size, dtype=dtype)
    spatial = [_OTHER] * n
    spatial[k] = in_size
    identity = torch.eye(in_size, dtype=dtype).reshape(in_size, 1, *[in_size if i == k else 1 for i in range(n)])
    with torch.no_grad():
        result = forward(identity.expand(in_size, 1, *spatial).contiguous(), *extra)
    result = result[tuple([slice(None), 0, *[slice(None) if i == k else 0 for i in range(n)]])]  # Python 3.10 syntax
    return result.reshape(in_size, out_size).t().contiguous()


#: The size of the dimensions a matrix is not read for.
_OTHER = 2


def _apply(em: Emitter, x: TensorValue, matrices: Sequence[torch.Tensor], transpose: bool) -> TensorValue:
    """``x`` with matrix ``k`` applied along its ``k``-th spatial (trailing) dimension (transposed for a backward)."""
    lead = x.rank - len(matrices)
    for k, m in enumerate(matrices):
        matrix = TensorValue(hlo.constant(dense_attr(m)), tuple(m.shape), m.dtype)
        x = apply_along(em, x, lead + k, matrix, transpose)
    return x


# -- interpolation --------------------------------------------------------------------------------

#: backward op -> (forward op, spatial dims, whether it takes align_corners)
_UPSAMPLE_BACKWARD = {
    aten.upsample_nearest1d_backward.default: (aten.upsample_nearest1d.default, 1, False),
    aten.upsample_nearest2d_backward.default: (aten.upsample_nearest2d.default, 2, False),
    aten.upsample_nearest3d_backward.default: (aten.upsample_nearest3d.default, 3, False),
    aten._upsample_nearest_exact1d_backward.default: (aten._upsample_nearest_exact1d.default, 1, False),
    aten._upsample_nearest_exact2d_backward.default: (aten._upsample_nearest_exact2d.default, 2, False),
    aten._upsample_nearest_exact3d_backward.default: (aten._upsample_nearest_exact3d.default, 3, False),
    aten.upsample_linear1d_backward.default: (aten.upsample_linear1d.default, 1, True),
    aten.upsample_bilinear2d_backward.default: (aten.upsample_bilinear2d.default, 2, True),
    aten.upsample_bicubic2d_backward.default: (aten.upsample_bicubic2d.default, 2, True),
    aten.upsample_trilinear3d_backward.default: (aten.upsample_trilinear3d.default, 3, True),
    aten._upsample_bilinear2d_aa_backward.default: (aten._upsample_bilinear2d_aa.default, 2, True),
    aten._upsample_bicubic2d_aa_backward.default: (aten._upsample_bicubic2d_aa.default, 2, True),
}


def _upsample_matrices(forward: Any, n: int, takes_align: bool, in_sizes: Sequence[int], out_sizes: Sequence[int],
                       rest: Sequence[Any], dtype: torch.dtype) -> list[torch.Tensor]:
    """``rest``: the op's arguments after output_size (align_corners if it takes it, then one scale per dim)."""
    align = tuple(rest[:1]) if takes_align else ()
    scales = list(rest[len(align):]) + [None] * n
    matrices = []
    for k in range(n):
        sizes = [_OTHER] * n
        sizes[k] = int(out_sizes[k])
        only_k = [scales[k] if i == k else None for i in range(n)]
        extra = (tuple(sizes), *align, *only_k)
        matrices.append(_matrix(forward, n, k, int(in_sizes[k]), int(out_sizes[k]), extra, dtype))
    return matrices


def _upsample_backward(forward: Any, n: int, takes_align: bool) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, output_size: Sequence[int], input_size: Sequence[int],
              *rest: Any) -> TensorValue:
        matrices = _upsample_matrices(forward, n, takes_align, tuple(input_size)[-n:], output_size, rest, grad.dtype)
        return _apply(em, grad, matrices, transpose=True)

    return lower


for _backward, (_forward, _n, _align) in _UPSAMPLE_BACKWARD.items():
    lowers(_backward, promotion=Promotion.COMPUTE)(_upsample_backward(_forward, _n, _align))


def _upsample_aa(forward: Any) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, output_size: Sequence[int], *rest: Any) -> TensorValue:
        matrices = _upsample_matrices(forward, 2, True, x.shape[-2:], output_size, rest, x.dtype)
        return _apply(em, x, matrices, transpose=False)

    return lower


for _antialiased in (aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default):
    lowers(_antialiased, promotion=Promotion.COMPUTE)(_upsample_aa(_antialiased))


# -- replication padding -----------------------------------------------------------------------------

_REPLICATION_PAD = {
    aten.replication_pad1d_backward.default: (aten.replication_pad1d.default, 1),
    aten.replication_pad2d_backward.default: (aten.replication_pad2d.default, 2),
    aten.replication_pad3d_backward.default: (aten.replication_pad3d.default, 3),
}


def _replication_pad_backward(forward: Any, n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue, padding: Sequence[int]) -> TensorValue:
        cdt = compute_dtype(out.dtype)
        matrices = []
        for k in range(n):
            # torch's padding lists the last dimension first: (left, right, top, bottom, front, back).
            j = n - 1 - k
            pads = [0] * (2 * n)
            pads[2 * j], pads[2 * j + 1] = int(padding[2 * j]), int(padding[2 * j + 1])
            in_size = x.shape[x.rank - n + k]
            out_size = grad.shape[grad.rank - n + k]
            matrices.append(_matrix(forward, n, k, in_size, out_size, (tuple(pads),), cdt))
        return em.convert(_apply(em, em.convert(grad, cdt), matrices, transpose=True), out.dtype)

    return lower


for _backward, (_forward, _n) in _REPLICATION_PAD.items():
    lowers(_backward)(_replication_pad_backward(_forward, _n))
