"""Lowerings of pooling: avg_pool (1-3 d, ceil_mode, count_include_pad, divisor_override), adaptive average
and max pools of any sizes, the max-pool backward, and their gradients.

Fixed windows are ``stablehlo.reduce_window``; adaptive average pools are one small averaging
matrix per spatial dimension (windows of uneven length need no special case); adaptive max
pools gather each output's window and keep the first maximum, as torch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue, lowest
from ._indexing import gather_along, scatter_elements
from ._mlir import tensor_type
from ._promotion import Promotion, compute_dtype
from ._table import lowers

aten = torch.ops.aten


def _per_dim(values: Sequence[int] | int, n: int, default: Sequence[int] | None = None) -> list[int]:
    """torch's pooling argument convention: one value for every dimension, or one each; empty = ``default``."""
    if isinstance(values, int):
        return [values] * n
    values = [int(v) for v in values]
    if not values and default is not None:
        return list(default)
    return values * n if len(values) == 1 else values


# -- average pooling -----------------------------------------------------------------------------


class _AvgPool:
    """The window geometry of one avg_pool call over the last ``n`` dimensions of ``shape``."""

    def __init__(self, shape: Sequence[int], out_shape: Sequence[int], n: int, kernel: Any, stride: Any, padding: Any,
                 count_include_pad: bool, divisor_override: int | None):
        self.shape, self.rank, self.n = tuple(shape), len(shape), n
        self.kernel = _per_dim(kernel, n)
        self.stride = _per_dim(stride, n, self.kernel)
        self.pad = _per_dim(padding, n)
        lead = self.rank - n
        spatial_in, spatial_out = self.shape[lead:], tuple(out_shape)[lead:]
        # ceil_mode: the last window may overhang the padded input; that overhang counts for nothing.
        self.overhang = [max(0, (o - 1) * s + k - (i + 2 * p))
                         for i, o, s, k, p in zip(spatial_in, spatial_out, self.stride, self.kernel, self.pad)]
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def full(self, values: Sequence[int], fill: int) -> list[int]:
        return [fill] * (self.rank - self.n) + list(values)

    @property
    def window(self) -> list[int]:
        return self.full(self.kernel, 1)

    @property
    def strides(self) -> list[int]:
        return self.full(self.stride, 1)

    @property
    def padding(self) -> list[tuple[int, int]]:
        return [(0, 0)] * (self.rank - self.n) + [(p, p + e) for p, e in zip(self.pad, self.overhang)]

    def divisor(self, em: Emitter, dtype: torch.dtype) -> TensorValue:
        """How many elements each output averages (broadcastable to the output)."""
        n = self.n
        if self.divisor_override:
            return em.constant(float(self.divisor_override), dtype)
        spatial = self.shape[self.rank - n:]
        ones = em.constant(1.0, dtype, spatial)
        window, strides = self.kernel, self.stride
        if self.count_include_pad:
            # The explicit padding counts, the ceil_mode overhang does not.
            padded = tuple(s + 2 * p for s, p in zip(spatial, self.pad))
            ones = em.constant(1.0, dtype, padded)
            padding = [(0, e) for e in self.overhang]
        else:
            padding = [(p, p + e) for p, e in zip(self.pad, self.overhang)]
        return em.reduce_window(ones, "sum", window, strides=strides, padding=padding)

    def forward(self, em: Emitter, x: TensorValue) -> TensorValue:
        sums = em.reduce_window(x, "sum", self.window, strides=self.strides, padding=self.padding)
        return em.div(sums, em.broadcast_to(self.divisor(em, x.dtype), sums.shape))

    def backward(self, em: Emitter, grad: TensorValue) -> TensorValue:
        """Each input element receives grad / divisor of every window that contains it."""
        scaled = em.div(grad, em.broadcast_to(self.divisor(em, grad.dtype), grad.shape))
        return window_sum_transpose(em, scaled, self.shape, self.window, self.strides, self.padding)


def window_sum_transpose(em: Emitter, grad: TensorValue, in_shape: Sequence[int], window: Sequence[int],
                         strides: Sequence[int], padding: Sequence[tuple[int, int]]) -> TensorValue:
    """The adjoint of a windowed sum: spread ``grad`` back over the input positions each window covered."""
    low, high, interior = [], [], []
    for size, w, st, (lo, _hi), g in zip(in_shape, window, strides, padding, grad.shape):
        before = w - lo - 1
        dilated_out = 0 if g == 0 else (g - 1) * st + 1
        low.append(before)
        high.append(size + w - 1 - dilated_out - before)
        interior.append(st - 1)
    pos_low, pos_high = [max(v, 0) for v in low], [max(v, 0) for v in high]
    shape = [g_ + lo + hi + max(g_ - 1, 0) * it for g_, lo, hi, it in zip(grad.shape, pos_low, pos_high, interior)]
    padded = TensorValue(hlo.pad(grad.value, em.constant(0, grad.dtype).value, pos_low, pos_high, interior,
                                 results=[tensor_type(shape, grad.dtype)]), tuple(shape), grad.dtype)
    # Negative padding (a window that ends before the input does) crops.
    starts = [max(-v, 0) for v in low]
    limits = [s - max(-v, 0) for s, v in zip(shape, high)]
    if any(v < 0 for v in low + high):
        padded = em.slice(padded, starts, limits, [1] * len(shape))
    r = em.reduce_window(padded, "sum", window)
    return em.reshape(r, tuple(in_shape))


def _avg_pool(n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, kernel_size: Any, stride: Any = (), padding: Any = 0,
              ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None) -> TensorValue:
        pool = _AvgPool(x.shape, out.shape, n, kernel_size, stride, padding, count_include_pad, divisor_override)
        return pool.forward(em, x)

    return lower


def _avg_pool_backward(n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue, kernel_size: Any, stride: Any,
              padding: Any, ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> TensorValue:
        cdt = compute_dtype(out.dtype)
        pool = _AvgPool(x.shape, grad.shape, n, kernel_size, stride, padding, count_include_pad, divisor_override)
        return em.convert(pool.backward(em, em.convert(grad, cdt)), out.dtype)

    return lower


lowers(aten.avg_pool1d.default, promotion=Promotion.COMPUTE)(_avg_pool(1))
lowers(aten.avg_pool2d.default, promotion=Promotion.COMPUTE)(_avg_pool(2))
lowers(aten.avg_pool3d.default, promotion=Promotion.COMPUTE)(_avg_pool(3))
lowers(aten.avg_pool2d_backward.default)(_avg_pool_backward(2))
lowers(aten.avg_pool3d_backward.default)(_avg_pool_backward(3))


# -- adaptive pooling -----------------------------------------------------------------------------


def _adaptive_bounds(em: Emitter, size: int, out_size: int) -> tuple[TensorValue, TensorValue]:
    """int64 [out_size] window starts floor(i*size/out) and ends ceil((i+1)*size/out) (torch's rule)."""
    i = em.iota((out_size,), 0, torch.int64)
    start = em.div(em.mul(i, em.constant(size, torch.int64, (out_size,))), em.constant(out_size, torch.int64, (out_size,)))
    nxt = em.add(i, em.constant(1, torch.int64, (out_size,)))
    end = em.div(em.add(em.mul(nxt, em.constant(size, torch.int64, (out_size,))),
                        em.constant(out_size - 1, torch.int64, (out_size,))), em.constant(out_size, torch.int64, (out_size,)))
    return start, end


def _averaging_matrix(em: Emitter, size: int, out_size: int, dtype: torch.dtype) -> TensorValue:
    """[out_size, size]: row i averages input positions start_i <= j < end_i."""
    start, end = _adaptive_bounds(em, size, out_size)
    j = em.iota((out_size, size), 1, torch.int64)
    inside = em.binary(hlo.and_, em.compare(j, em.broadcast_in_dim(start, (out_size, size), [0]), "GE"),
                       em.compare(j, em.broadcast_in_dim(end, (out_size, size), [0]), "LT"))
    count = em.convert(em.sub(end, start), dtype)
    weights = em.div(em.constant(1.0, dtype, (out_size, size)), em.broadcast_in_dim(count, (out_size, size), [0]))
    return em.select(inside, weights, em.constant(0.0, dtype, (out_size, size)))


def apply_along(em: Emitter, x: TensorValue, d: int, matrix: TensorValue, transpose: bool) -> TensorValue:
    """``matrix @ x`` along dimension ``d`` (``matrix^T`` when ``transpose``), keeping the dimension order."""
    r = em.dot_general(matrix, x, ((0 if transpose else 1,), (d,)))  # [m, rest...]
    perm = list(range(1, d + 1)) + [0] + list(range(d + 1, x.rank))
    return em.transpose(r, perm)


def _adaptive_avg(em: Emitter, x: TensorValue, out_spatial: Sequence[int], backward_to: Sequence[int] | None) -> TensorValue:
    n = len(out_spatial)
    lead = x.rank - n
    for k in range(n):
        d = lead + k
        if backward_to is None:
            x = apply_along(em, x, d, _averaging_matrix(em, x.shape[d], out_spatial[k], x.dtype), False)
        else:
            x = apply_along(em, x, d, _averaging_matrix(em, backward_to[d], x.shape[d], x.dtype), True)
    return x


def _adaptive_avg_pool(em: Emitter, out: torch.Tensor, x: TensorValue, output_size: Sequence[int]) -> TensorValue:
    return _adaptive_avg(em, x, tuple(out.shape)[-len(output_size):], None)


def _adaptive_avg_pool_backward(n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue) -> TensorValue:
        cdt = compute_dtype(out.dtype)
        return em.convert(_adaptive_avg(em, em.convert(grad, cdt), grad.shape[-n:], x.shape), out.dtype)

    return lower


lowers(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default, aten.adaptive_avg_pool1d.default,
       promotion=Promotion.COMPUTE)(_adaptive_avg_pool)
lowers(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_pool_backward(2))
lowers(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_pool_backward(3))


def _first_max(em: Emitter, values: TensorValue, flat: TensorValue, dim: int) -> tuple[TensorValue, TensorValue]:
    """(max, its flat index) along ``dim``; ties go to the smallest flat index, NaN counts as the largest."""
    is_float = values.dtype.is_floating_point

    def body(em: Emitter, acc: list[TensorValue], elem: list[TensorValue]) -> list[TensorValue]:
        av, ai = acc
        bv, bi = elem
        better = em.compare(av, bv, "GT")
        equal = em.compare(av, bv, "EQ")
        if is_float:
            a_nan, b_nan = em.compare(av, av, "NE"), em.compare(bv, bv, "NE")
            better = em.binary(hlo.or_, better, em.binary(hlo.and_, a_nan, em.unary(hlo.not_, b_nan)))
            equal = em.binary(hlo.or_, equal, em.binary(hlo.and_, a_nan, b_nan))
        take_a = em.binary(hlo.or_, better, em.binary(hlo.and_, equal, em.compare(ai, bi, "LT")))
        return [em.select(take_a, av, bv), em.select(take_a, ai, bi)]

    init = [em.constant(lowest(values.dtype), values.dtype), em.constant(torch.iinfo(torch.int64).max, torch.int64)]
    v, i = em.reduce([values, flat], init, [dim], body)
    return v, i


def _adaptive_max(em: Emitter, x: TensorValue, out_spatial: Sequence[int]) -> tuple[TensorValue, TensorValue]:
    """Adaptive max pool over the last ``len(out_spatial)`` dims: values and flat indices into those dims."""
    n = len(out_spatial)
    lead = x.rank - n
    spatial = x.shape[lead:]
    # Flat index (over the pooled dims) of every element: ties resolve to torch's first in row-major order.
    flat = em.constant(0, torch.int64, x.shape)
    for k in range(n):
        step = math.prod(spatial[k + 1:])
        flat = em.add(flat, em.mul(em.iota(x.shape, lead + k, torch.int64), em.constant(step, torch.int64, x.shape)))
    values = x
    for k in range(n):
        d = lead + k
        size, out_size = values.shape[d], out_spatial[k]
        window = max(-(-((i + 1) * size) // out_size) - (i * size) // out_size for i in range(out_size))
        start, end = _adaptive_bounds(em, size, out_size)
        offs = em.iota((out_size, window), 1, torch.int64)
        pos = em.add(em.broadcast_in_dim(start, (out_size, window), [0]), offs)
        valid = em.compare(pos, em.broadcast_in_dim(end, (out_size, window), [0]), "LT")
        pos = em.select(valid, pos, em.broadcast_in_dim(start, (out_size, window), [0]))
        gv = gather_along(em, values, d, pos)  # [..., out, window, ...]
        gi = gather_along(em, flat, d, pos)
        mask = em.broadcast_in_dim(valid, gv.shape, [d, d + 1])
        gv = em.select(mask, gv, em.constant(lowest(x.dtype), x.dtype, gv.shape))
        gi = em.select(mask, gi, em.constant(torch.iinfo(torch.int64).max, torch.int64, gi.shape))
        values, flat = _first_max(em, gv, gi, d + 1)
    return values, flat


def _adaptive_max_pool(em: Emitter, out: tuple, x: TensorValue, output_size: Sequence[int]) -> tuple[TensorValue, TensorValue]:
    n = len(output_size)
    values, indices = _adaptive_max(em, x, tuple(out[0].shape)[-n:])
    return values, indices


lowers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)(_adaptive_max_pool)


def _max_pool_backward_from_indices(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue,
                                    indices: TensorValue, n: int) -> TensorValue:
    """Every output's gradient goes to the input element its flat index names (accumulating)."""
    lead = x.rank - n
    rows = math.prod(x.shape[:lead])
    flat_in = math.prod(x.shape[lead:])
    flat_out = math.prod(grad.shape[lead:])
    zeros = em.constant(0, compute_dtype(out.dtype), (rows, flat_in))
    g = em.reshape(em.convert(grad, zeros.dtype), (rows, flat_out))
    idx = em.reshape(indices, (rows, flat_out))
    r = scatter_elements(em, zeros, 1, idx, g, "sum")
    return em.convert(em.reshape(r, x.shape), out.dtype)


def _adaptive_max_pool_backward(n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue, indices: TensorValue) -> TensorValue:
        return _max_pool_backward_from_indices(em, out, grad, x, indices, n)

    return lower


lowers(aten.adaptive_max_pool2d_backward.default)(_adaptive_max_pool_backward(2))
lowers(aten.adaptive_max_pool3d_backward.default)(_adaptive_max_pool_backward(3))


def _max_pool_backward(n: int) -> Any:
    def lower(em: Emitter, out: torch.Tensor, grad: TensorValue, x: TensorValue, kernel_size: Any, stride: Any,
              padding: Any, dilation: Any, ceil_mode: bool, indices: TensorValue) -> TensorValue:
        return _max_pool_backward_from_indices(em, out, grad, x, indices, n)

    return lower


lowers(aten.max_pool2d_with_indices_backward.default)(_max_pool_backward(2))
lowers(aten.max_pool3d_with_indices_backward.default)(_max_pool_backward(3))
