"""Lowerings of reductions: sum, mean, prod, amax/amin, argmax/argmin, max/min.dim, any/all, var, softmax,
scans, sorts and order statistics.

Half-precision inputs accumulate in float32, as torch does on the CPU (the table's promotion, ``_promotion``);
the plain reductions are one family, made by :func:`make_reduction`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue, highest, lowest
from ._indexing import take_along
from ._mlir import tensor_type
from ._promotion import Promotion
from ._table import lowers

aten = torch.ops.aten


def reduction_dims(rank: int, dim: int | Sequence[int] | None) -> list[int]:
    """Normalized reduced dimensions; ``None`` and ``[]`` mean all of them (torch's rule)."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return list(range(rank))
    return sorted({d % rank if rank else 0 for d in dim}) if rank else []


def keep_dims(em: Emitter, x: TensorValue, full_shape: Sequence[int], dims: Sequence[int]) -> TensorValue:
    shape = [1 if i in dims else s for i, s in enumerate(full_shape)]
    return em.reshape(x, shape)


def _finish(em: Emitter, out: torch.Tensor, r: TensorValue, x_shape: Sequence[int], dims: list[int], keepdim: bool) -> TensorValue:
    r = em.convert(r, out.dtype)
    if keepdim:
        r = keep_dims(em, r, x_shape, dims)
    return em.reshape(r, tuple(out.shape))


def make_reduction(kind: str, *, then: Callable[[Emitter, TensorValue, int], TensorValue] | None = None) -> Any:
    """The rule of a reduction with ``reduce_simple``'s ``kind`` over ``dim`` (None or [] = every dimension),
    with ``keepdim`` (inductor's ``make_reduction``); ``then(em, reduced, count)`` finishes it (mean divides
    by the count of reduced elements). Register it with the promotion its accumulator needs.
    """

    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, dim: Any = None, keepdim: bool = False, *,
              dtype: torch.dtype | None = None) -> TensorValue:
        dims = reduction_dims(x.rank, dim)
        r = em.reduce_simple(x, dims, kind)
        if then is not None:
            r = then(em, r, math.prod(x.shape[d] for d in dims))
        return _finish(em, out, r, x.shape, dims, keepdim)

    lower.__qualname__ = f"make_reduction({kind!r})"
    return lower


def _divide_by_count(em: Emitter, total: TensorValue, count: int) -> TensorValue:
    return em.div(total, em.constant(float(count), total.dtype, total.shape))


lowers(aten.sum.dim_IntList, aten.sum.default, promotion=Promotion.BOOL_TO_LONG)(make_reduction("sum"))
lowers(aten.prod.default, aten.prod.dim_int, promotion=Promotion.COMPUTE)(make_reduction("prod"))
lowers(aten.mean.dim, aten.mean.default, promotion=Promotion.COMPUTE)(make_reduction("sum", then=_divide_by_count))
# StableHLO's maximum/minimum propagate NaN, like torch; max(x) reduces every dimension.
lowers(aten.amax.default, aten.max.default, promotion=Promotion.RESULT)(make_reduction("max"))
lowers(aten.amin.default, aten.min.default, promotion=Promotion.RESULT)(make_reduction("min"))
lowers(aten.any.default, aten.any.dim, aten.any.dims, promotion=Promotion.BOOL)(make_reduction("or"))
lowers(aten.all.default, aten.all.dim, aten.all.dims, promotion=Promotion.BOOL)(make_reduction("and"))


def _arg_reduce(em: Emitter, x: TensorValue, dim: int, largest: bool) -> tuple[TensorValue, TensorValue]:
    """(values, int64 indices) of the first max (or min) along ``dim``; NaN counts as the extreme."""
    idx = em.iota(x.shape, dim, torch.int64)
    is_float = x.dtype.is_floating_point
    init_v = em.constant(lowest(x.dtype) if largest else highest(x.dtype), x.dtype)
    init_i = em.constant(0, torch.int64)

    def body(em: Emitter, acc: list[TensorValue], elem: list[TensorValue]) -> list[TensorValue]:
        av, ai = acc
        bv, bi = elem
        better = em.compare(av, bv, "GT" if largest else "LT")
        equal = em.compare(av, bv, "EQ")
        if is_float:
            a_nan = em.compare(av, av, "NE")
            b_nan = em.compare(bv, bv, "NE")
            better = em.binary(hlo.or_, better, em.binary(hlo.and_, a_nan, em.unary(hlo.not_, b_nan)))
            equal = em.binary(hlo.or_, equal, em.binary(hlo.and_, a_nan, b_nan))
        first = em.compare(ai, bi, "LT")
        take_a = em.binary(hlo.or_, better, em.binary(hlo.and_, equal, first))
        return [em.select(take_a, av, bv), em.select(take_a, ai, bi)]

    values, indices = em.reduce([x, idx], [init_v, init_i], [dim], body)
    return values, indices


def _arg(largest: bool) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
        if dim is None:
            flat = em.reshape(x, (max(x.numel, 1) if x.rank else 1,))
            _, idx = _arg_reduce(em, flat, 0, largest)
            return em.reshape(idx, tuple(out.shape))
        d = dim % x.rank if x.rank else 0
        if x.rank == 0:
            return em.constant(0, torch.int64)
        _, idx = _arg_reduce(em, x, d, largest)
        return _finish(em, out, idx, x.shape, [d], keepdim)

    return lower


lowers(aten.argmax.default)(_arg(True))
lowers(aten.argmin.default)(_arg(False))


def _minmax_dim(largest: bool) -> Any:
    def lower(em: Emitter, out: tuple, x: TensorValue, dim: int, keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
        if x.rank == 0:
            return x, em.constant(0, torch.int64)
        d = dim % x.rank
        values, idx = _arg_reduce(em, x, d, largest)
        return (_finish(em, out[0], values, x.shape, [d], keepdim), _finish(em, out[1], idx, x.shape, [d], keepdim))

    return lower


lowers(aten.max.dim)(_minmax_dim(True))
lowers(aten.min.dim)(_minmax_dim(False))


def _variance(em: Emitter, x: TensorValue, dims: list[int], correction: float) -> tuple[TensorValue, TensorValue]:
    """(variance, mean) over ``dims`` with the reduced dims kept, in ``x``'s dtype."""
    acc = x.dtype
    count = math.prod(x.shape[d] for d in dims)
    total = keep_dims(em, em.reduce_simple(x, dims, "sum"), x.shape, dims)
    mean = em.div(total, em.constant(float(count), acc, total.shape))
    d = em.sub(x, em.broadcast_to(mean, x.shape))
    sq = keep_dims(em, em.reduce_simple(em.mul(d, d), dims, "sum"), x.shape, dims)
    denom = max(count - correction, 0)
    var = em.div(sq, em.constant(float(denom), acc, sq.shape))
    return var, mean


@lowers(aten.var.correction, promotion=Promotion.COMPUTE)
def _var(em: Emitter, out: torch.Tensor, x: TensorValue, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> TensorValue:
    var, _ = _variance(em, x, reduction_dims(x.rank, dim), 1 if correction is None else correction)
    return em.reshape(var, tuple(out.shape))


@lowers(aten.var_mean.correction, promotion=Promotion.COMPUTE)
def _var_mean(em: Emitter, out: tuple, x: TensorValue, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
    var, mean = _variance(em, x, reduction_dims(x.rank, dim), 1 if correction is None else correction)
    return em.reshape(var, tuple(out[0].shape)), em.reshape(mean, tuple(out[1].shape))


def _softmax_parts(em: Emitter, x: TensorValue, dim: int) -> tuple[TensorValue, TensorValue]:
    """(x - max, sum(exp(x - max))) along ``dim``, both broadcast back to x's shape."""
    m = keep_dims(em, em.reduce_simple(x, [dim], "max", nan_propagate=False), x.shape, [dim])
    shifted = em.sub(x, em.broadcast_to(m, x.shape))
    e = em.unary(hlo.exponential, shifted)
    s = keep_dims(em, em.reduce_simple(e, [dim], "sum"), x.shape, [dim])
    return shifted, em.broadcast_to(s, x.shape)


@lowers(aten._softmax.default, promotion=Promotion.COMPUTE)
def _softmax(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    if x.rank == 0:
        return em.constant(1.0, out.dtype)
    shifted, s = _softmax_parts(em, x, dim % x.rank)
    return em.div(em.unary(hlo.exponential, shifted), s)


@lowers(aten._log_softmax.default, promotion=Promotion.COMPUTE)
def _log_softmax(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    if x.rank == 0:
        return em.constant(0.0, out.dtype)
    shifted, s = _softmax_parts(em, x, dim % x.rank)
    return em.sub(shifted, em.unary(hlo.log, s))


#: Longest dimension scanned by one reduce_window as long as the dimension: XLA's CPU backend runs that in O(n^2)
#: (a cumsum of 32,768 rows took seconds); longer ones take log2(n) shifted sums (O(n log n), what jax's cumsum
#: does off TPU).
WINDOW_SCAN_MAX = 256


def _shifted_scan(em: Emitter, x: TensorValue, d: int, kind: str) -> TensorValue:
    """Inclusive prefix sum / product along ``d``: ``x op= x shifted by 1, 2, 4, ...`` (Hillis and Steele)."""
    n = x.shape[d]
    combine, identity = (em.add, 0) if kind == "sum" else (em.mul, 1)
    shift = 1
    while shift < n:
        head_shape = [shift if i == d else s for i, s in enumerate(x.shape)]
        limits = [n - shift if i == d else s for i, s in enumerate(x.shape)]
        kept = em.slice(x, [0] * x.rank, limits, [1] * x.rank)
        x = combine(x, em.concatenate([em.constant(identity, x.dtype, head_shape), kept], d))
        shift *= 2
    return x


def _scan(kind: str) -> Any:
    """Inclusive prefix sum / product: a reduce_window over a window the length of the dimension, or shifted sums
    for a dimension longer than :data:`WINDOW_SCAN_MAX`."""

    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, *, dtype: torch.dtype | None = None) -> TensorValue:
        if x.rank == 0:
            return x
        d = dim % x.rank
        n = x.shape[d]
        if n > WINDOW_SCAN_MAX:
            return _shifted_scan(em, x, d, kind)
        window = [n if i == d else 1 for i in range(x.rank)]
        padding = [(n - 1, 0) if i == d else (0, 0) for i in range(x.rank)]
        return em.reduce_window(x, kind, window, padding=padding)

    lower.__qualname__ = f"scan({kind!r})"
    return lower


lowers(aten.cumsum.default, promotion=Promotion.BOOL_TO_LONG)(_scan("sum"))
lowers(aten.cumprod.default, promotion=Promotion.BOOL_TO_LONG)(_scan("prod"))


def _sort(em: Emitter, x: TensorValue, dim: int, descending: bool) -> tuple[TensorValue, TensorValue]:
    """Stable sort along ``dim`` with int64 indices; NaN sorts as the largest value (torch's order)."""
    idx = em.iota(x.shape, dim, torch.int64)
    scalar_types = [tensor_type((), x.dtype), tensor_type((), x.dtype), tensor_type((), torch.int64),
                    tensor_type((), torch.int64)]
    op = hlo.SortOp([tensor_type(x.shape, x.dtype), tensor_type(x.shape, torch.int64)], [x.value, idx.value],
                    dimension=dim, is_stable=True)
    block = op.regions[0].blocks.append(*scalar_types)
    with ir.InsertionPoint(block):
        a, b = block.arguments[0], block.arguments[1]
        kind = "TOTALORDER" if x.dtype.is_floating_point else ("UNSIGNED" if x.dtype == torch.bool or
                                                                not x.dtype.is_signed else "SIGNED")
        direction = "GT" if descending else "LT"
        less = hlo.compare(a, b, hlo.ComparisonDirectionAttr.get(direction), compare_type=hlo.ComparisonTypeAttr.get(kind))
        hlo.return_([less])
    return TensorValue(op.results[0], x.shape, x.dtype), TensorValue(op.results[1], x.shape, torch.int64)


@lowers(aten.sort.default)
def _sort_default(em: Emitter, out: tuple, x: TensorValue, dim: int = -1, descending: bool = False) -> tuple:
    if x.rank == 0:
        return x, em.constant(0, torch.int64)
    return _sort(em, x, dim % x.rank, descending)


@lowers(aten.sort.stable)
def _sort_stable(em: Emitter, out: tuple, x: TensorValue, *, stable: bool | None = None, dim: int = -1,
                 descending: bool = False) -> tuple:
    return _sort_default(em, out, x, dim, descending)


@lowers(aten.topk.default)
def _topk(em: Emitter, out: tuple, x: TensorValue, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple:
    if x.rank == 0:
        return x, em.constant(0, torch.int64)
    d = dim % x.rank
    values, indices = _sort(em, x, d, descending=largest)
    limits = list(x.shape)
    limits[d] = int(k)
    starts, strides = [0] * x.rank, [1] * x.rank
    return em.slice(values, starts, limits, strides), em.slice(indices, starts, limits, strides)


def _nan_first_preference(em: Emitter, av: TensorValue, bv: TensorValue, largest: bool) -> tuple[TensorValue, TensorValue]:
    """(a strictly preferred, a and b equally preferred) for a running max/min where NaN beats every number."""
    a_nan, b_nan = em.compare(av, av, "NE"), em.compare(bv, bv, "NE")
    better = em.compare(av, bv, "GT" if largest else "LT")
    equal = em.compare(av, bv, "EQ")
    if av.dtype.is_floating_point:
        better = em.binary(hlo.or_, em.binary(hlo.and_, better, em.unary(hlo.not_, b_nan)),
                           em.binary(hlo.and_, a_nan, em.unary(hlo.not_, b_nan)))
        equal = em.binary(hlo.or_, equal, em.binary(hlo.and_, a_nan, b_nan))
    return better, equal


def _cumulative_extreme(largest: bool) -> Any:
    """cummax/cummin: the running extreme and the index of its last occurrence (NaN sticks, as in torch)."""

    def lower(em: Emitter, out: tuple, x: TensorValue, dim: int) -> tuple[TensorValue, TensorValue]:
        if x.rank == 0:
            return x, em.constant(0, torch.int64)
        d = dim % x.rank
        idx = em.iota(x.shape, d, torch.int64)

        def body(em: Emitter, acc: list[TensorValue], elem: list[TensorValue]) -> list[TensorValue]:
            (av, ai), (bv, bi) = acc, elem
            better, equal = _nan_first_preference(em, av, bv, largest)
            take_a = em.binary(hlo.or_, better, em.binary(hlo.and_, equal, em.compare(ai, bi, "GT")))
            return [em.select(take_a, av, bv), em.select(take_a, ai, bi)]

        init = [em.constant(lowest(x.dtype) if largest else highest(x.dtype), x.dtype), em.constant(-1, torch.int64)]
        values, indices = em.scan([x, idx], init, d, body)
        return values, indices

    return lower


lowers(aten.cummax.default)(_cumulative_extreme(True))
lowers(aten.cummin.default)(_cumulative_extreme(False))


@lowers(aten.logcumsumexp.default, promotion=Promotion.COMPUTE)
def _logcumsumexp(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int) -> TensorValue:
    """A scan of logaddexp: max + log1p(exp(-|a - b|)), exact for -inf and equal infinities."""
    if x.rank == 0:
        return x

    def body(em: Emitter, acc: list[TensorValue], elem: list[TensorValue]) -> list[TensorValue]:
        a, b = acc[0], elem[0]
        hi, lo = em.maximum(a, b), em.minimum(a, b)
        r = em.add(hi, em.unary(hlo.log_plus_one, em.unary(hlo.exponential, em.sub(lo, hi))))
        finite = TensorValue(hlo.is_finite(a.value), (), torch.bool)
        same_inf = em.binary(hlo.and_, em.compare(a, b, "EQ"), em.unary(hlo.not_, finite))
        return [em.select(same_inf, a, r)]

    (r,) = em.scan([x], [em.constant(float("-inf"), x.dtype)], dim % x.rank, body)
    return r


def _order_statistic(em: Emitter, x: TensorValue, d: int, k: TensorValue, keepdim: bool,
                     out: tuple) -> tuple[TensorValue, TensorValue]:
    """The k-th smallest (0-based ``k``, one per slice) along ``d`` and its index."""
    values, indices = _sort(em, x, d, descending=False)  # NaN sorts last
    v, i = take_along(em, values, d, k), take_along(em, indices, d, k)
    return (_finish(em, out[0], v, x.shape, [d], keepdim), _finish(em, out[1], i, x.shape, [d], keepdim))


def _slice_shape(x: TensorValue, d: int) -> tuple[int, ...]:
    return tuple(s for i, s in enumerate(x.shape) if i != d)


@lowers(aten.kthvalue.default)
def _kthvalue(em: Emitter, out: tuple, x: TensorValue, k: int, dim: int = -1, keepdim: bool = False) -> tuple:
    if x.rank == 0:
        return x, em.constant(0, torch.int64)
    d = dim % x.rank
    return _order_statistic(em, x, d, em.constant(int(k) - 1, torch.int64, _slice_shape(x, d)), keepdim, out)


def _median_dim(ignore_nan: bool) -> Any:
    """The lower median; ``median`` gives NaN (and the first NaN's index) if a slice has one, ``nanmedian`` skips them."""

    def lower(em: Emitter, out: tuple, x: TensorValue, dim: int = 0, keepdim: bool = False) -> tuple:
        if x.rank == 0:
            return x, em.constant(0, torch.int64)
        d = dim % x.rank
        n = x.shape[d]
        if not x.dtype.is_floating_point or not ignore_nan:
            k = em.constant((n - 1) // 2, torch.int64, _slice_shape(x, d))
        else:
            count = em.reduce_simple(em.convert(em.compare(x, x, "EQ"), torch.int64), [d], "sum")
            k = em.div(em.sub(em.maximum(count, em.constant(1, torch.int64, count.shape)),
                              em.constant(1, torch.int64, count.shape)), em.constant(2, torch.int64, count.shape))
        values, indices = _order_statistic(em, x, d, k, True, (out[0], out[1]))
        values = em.reshape(values, _slice_shape(x, d))
        indices = em.reshape(indices, _slice_shape(x, d))
        if x.dtype.is_floating_point and not ignore_nan:
            nan = em.compare(x, x, "NE")
            has_nan = em.reduce_simple(nan, [d], "or")
            first_nan = _arg_reduce(em, em.convert(nan, torch.int32), d, True)[1]
            values = em.select(has_nan, em.constant(float("nan"), x.dtype, values.shape), values)
            indices = em.select(has_nan, first_nan, indices)
        return (_finish(em, out[0], values, x.shape, [d], keepdim), _finish(em, out[1], indices, x.shape, [d], keepdim))

    return lower


lowers(aten.median.dim)(_median_dim(False))
lowers(aten.nanmedian.dim)(_median_dim(True))


def _median_all(ignore_nan: bool) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
        flat = em.reshape(x, (x.numel,))
        if x.numel == 0:
            return em.constant(float("nan"), out.dtype, ())
        values, _ = _median_dim(ignore_nan)(em, (out, torch.empty((), dtype=torch.int64)), flat, 0, False)
        return em.reshape(values, ())

    return lower


lowers(aten.median.default)(_median_all(False))
lowers(aten.nanmedian.default)(_median_all(True))
