"""Lowerings of gathers and scatters: index_select, embedding, index, gather, index_put, scatter(_add).

Gathers along one dimension follow the active plugin's dense-gather factor (its ``dense_gather_factor()`` hook):
dense one-hot/matmul form unless the gathered dimension exceeds ``factor * 10``, sparse
``stablehlo.gather`` otherwise (factor 0 = always sparse). The accumulating scatter that
autograd emits for an embedding's backward follows the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import UnsupportedOpError
from ._collectives import in_manual_region
from ._elementwise import floor_divide_int
from ._emitter import Emitter, Operand, TensorValue, highest, lowest
from ._mlir import tensor_type
from ._sdy import keep_unsplit
from ._table import lowers

aten = torch.ops.aten


def _index_values(em: Emitter, idx: TensorValue, size: int) -> TensorValue:
    """int64 indices with negative ones wrapped (torch allows ``-1`` for the last row)."""
    idx = em.convert(idx, torch.int64)
    negative = em.compare(idx, em.constant(0, torch.int64, idx.shape), "LT")
    return em.select(negative, em.add(idx, em.constant(size, torch.int64, idx.shape)), idx)


def _one_hot(em: Emitter, flat_idx: TensorValue, n: int) -> TensorValue:
    """bool [K, n]: row k is true at column flat_idx[k]."""
    k = flat_idx.shape[0]
    cols = em.iota((k, n), 1, torch.int64)
    return em.compare(cols, em.broadcast_in_dim(flat_idx, (k, n), [0]), "EQ")


def _arith_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype a dense (matmul) gather computes in: floats stay, bool and small ints widen."""
    if dtype.is_floating_point:
        return dtype
    return torch.int64 if dtype in (torch.int64, torch.uint64) else torch.int32


def gather_along(em: Emitter, table: TensorValue, d: int, idx: TensorValue) -> TensorValue:
    """``table`` indexed by ``idx`` along dimension ``d``: shape pre + idx.shape + post."""
    n = table.shape[d]
    out_shape = table.shape[:d] + idx.shape + table.shape[d + 1:]
    if n == 0:  # nothing to take (XLA refuses the gather): zeros, as an out-of-range index reads elsewhere here
        return em.constant(0, table.dtype, out_shape)
    k = max(idx.numel, 0)
    flat = em.reshape(_index_values(em, idx, n), (k,))
    if em.options.use_dense_gather(n):
        adt = _arith_dtype(table.dtype)
        onehot = em.convert(_one_hot(em, flat, n), adt)
        r = em.dot_general(onehot, em.convert(table, adt), ((1,), (d,)))  # [K, pre..., post...]
        perm = list(range(1, d + 1)) + [0] + list(range(d + 1, table.rank))
        r = em.transpose(r, perm)
        return em.reshape(em.convert(r, table.dtype), out_shape)
    starts = em.reshape(flat, (k, 1))
    offset_dims = [i for i in range(table.rank) if i != d]
    slice_sizes = [1 if i == d else s for i, s in enumerate(table.shape)]
    dnums = hlo.GatherDimensionNumbers.get(
        offset_dims=offset_dims,
        collapsed_slice_dims=[d],
        operand_batching_dims=[],
        start_indices_batching_dims=[],
        start_index_map=[d],
        index_vector_dim=1,
    )
    gathered_shape = table.shape[:d] + (k,) + table.shape[d + 1:]
    v = hlo.gather(table.value, starts.value, dnums, slice_sizes, indices_are_sorted=False,
                   results=[tensor_type(gathered_shape, table.dtype)])
    return em.reshape(TensorValue(v, gathered_shape, table.dtype), out_shape)


#: How a scatter combines an update with the value already there (None: the update replaces it).
SCATTER_REDUCTIONS = ("sum", "prod", "amax", "amin")


def _scatter_region(op: Any, dtype: torch.dtype, reduce: str | None) -> None:
    block = op.regions[0].blocks.append(tensor_type((), dtype), tensor_type((), dtype))
    old, new = block.arguments[0], block.arguments[1]
    with ir.InsertionPoint(block):
        if reduce is None:
            r = new
        elif dtype == torch.bool:
            r = (hlo.or_ if reduce in ("sum", "amax") else hlo.and_)(old, new)
        elif reduce == "sum":
            r = hlo.add(old, new)
        elif reduce == "prod":
            r = hlo.multiply(old, new)
        else:
            r = (hlo.maximum if reduce == "amax" else hlo.minimum)(old, new)
            if dtype.is_floating_point:  # torch propagates NaN (XLA's CPU max/min may not)
                direction = hlo.ComparisonDirectionAttr.get("NE")
                float_cmp = hlo.ComparisonTypeAttr.get("FLOAT")
                r = hlo.select(hlo.compare(new, new, direction, compare_type=float_cmp), new, r)
                r = hlo.select(hlo.compare(old, old, direction, compare_type=float_cmp), old, r)
        hlo.return_([r])


def _replicated_if_uneven(em: Emitter, v: TensorValue) -> TensorValue:
    """``v`` with the dimensions that some sharding could split unevenly pinned unsplit.

    XLA's SPMD partitioner aborts the process (``spmd_partitioner_util.h:117 Check failed``)
    on a scatter whose operand, indices or updates are tiled unevenly. A dimension that the
    device count divides is split evenly by every tiling (a tile count divides the device count).
    With Shardy's annotations only the other dimensions are pinned (a partial constraint), so a
    scatter into a batch-sharded tensor keeps its batch split (a KV cache's update gathered the whole
    cache on every device when the whole operand was pinned); GSPMD's pin the whole value replicated.
    A value of a manual-sharding region (GSPMD) is left alone: it is one device's own, nothing partitions
    it, and XLA aborts on a replicated pin of a manual value (``hlo_sharding.cc Check failed: !IsManual()``).
    """
    n = em.options.num_partitions
    uneven = [d for d, size in enumerate(v.shape) if size % n] if n > 1 else []
    if not uneven:
        return v
    if em.sdy_plan is not None:
        return TensorValue(keep_unsplit(v.value, uneven), v.shape, v.dtype)
    if em.has_manual_regions and in_manual_region(v.value):
        return v
    return em.constrain(v, "{replicated}")


def _scatter_op(em: Emitter, x: TensorValue, starts: TensorValue, updates: TensorValue, dnums: Any) -> Any:
    """``stablehlo.scatter`` of ``updates`` into ``x`` at ``starts`` (its region is added by the caller)."""
    x, starts, updates = (_replicated_if_uneven(em, v) for v in (x, starts, updates))
    return hlo.ScatterOp([tensor_type(x.shape, x.dtype)], [x.value], starts.value, [updates.value], dnums,
                         indices_are_sorted=False, unique_indices=False)


def scatter_along(em: Emitter, x: TensorValue, d: int, idx: TensorValue, values: TensorValue,
                  reduce: str | None) -> TensorValue:
    """``x`` with ``x[pre, idx, post] = values`` along dimension ``d``, or combined with ``reduce`` (``"sum"``, ...)."""
    n = x.shape[d]
    k = idx.numel
    flat = em.reshape(_index_values(em, idx, n), (k,))
    upd_shape = x.shape[:d] + idx.shape + x.shape[d + 1:]
    values = em.broadcast_to(em.convert(values, x.dtype), upd_shape)
    upd = em.reshape(values, x.shape[:d] + (k,) + x.shape[d + 1:])
    if reduce == "sum" and em.options.use_dense_gather(n):
        adt = _arith_dtype(x.dtype)
        onehot = em.convert(_one_hot(em, flat, n), adt)
        r = em.dot_general(onehot, em.convert(upd, adt), ((0,), (d,)))  # [n, pre..., post...]
        perm = list(range(1, d + 1)) + [0] + list(range(d + 1, x.rank))
        r = em.convert(em.transpose(r, perm), x.dtype)
        return em.add(x, r) if x.dtype != torch.bool else em.binary(hlo.or_, x, r)
    dnums = hlo.ScatterDimensionNumbers.get(
        update_window_dims=[i for i in range(x.rank) if i != d],
        inserted_window_dims=[d],
        input_batching_dims=[],
        scatter_indices_batching_dims=[],
        scattered_dims_to_operand_dims=[d],
        index_vector_dim=1,  # implicit: _scatter_op would pin the size-1 dimension of a [k, 1] index (1 < devices)
    )
    op = _scatter_op(em, x, flat, upd, dnums)
    _scatter_region(op, x.dtype, reduce)
    return TensorValue(op.results[0], x.shape, x.dtype)


@lowers(aten.index_select.default)
def _index_select(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    if x.rank == 0:
        return em.reshape(x, tuple(out.shape))
    r = gather_along(em, x, dim % x.rank, index)
    return em.reshape(r, tuple(out.shape))


@lowers(aten.embedding.default)
def _embedding(em: Emitter, out: torch.Tensor, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> TensorValue:
    return gather_along(em, weight, 0, indices)


def _indexed_positions(op: str, indices: Sequence[TensorValue | None], mask_hint: str) -> dict[int, TensorValue]:
    """The index tensors by the dimension they index; a boolean mask (a data-dependent shape) is refused with
    ``mask_hint``."""
    present = {i: t for i, t in enumerate(indices) if t is not None}
    if any(t.dtype == torch.bool for t in present.values()):
        raise UnsupportedOpError(op, mask_hint)
    return present


def _advanced_index(em: Emitter, x: TensorValue, indices: dict[int, TensorValue]
                    ) -> tuple[TensorValue, tuple[int, ...], list[int]]:
    """Gather/scatter geometry of ``x[indices]`` with several index tensors, numpy's rule.

    Returns the start indices (``[*broadcast shape, len(positions)]``), the shape of the
    indexed result and its window (non-indexed) dimensions: the broadcast index dimensions
    replace adjacent indexed dimensions in place, and go first when those are apart.
    """
    positions = list(indices)
    bshape = tuple(torch.broadcast_shapes(*(t.shape for t in indices.values())))
    comps = [em.reshape(em.broadcast_to(_index_values(em, indices[i], x.shape[i]), bshape), bshape + (1,))
             for i in positions]
    starts = em.concatenate(comps, len(bshape))
    rest = [i for i in range(x.rank) if i not in positions]
    first = positions[0]
    if positions == list(range(first, first + len(positions))):
        shape = x.shape[:first] + bshape + tuple(x.shape[i] for i in rest if i > first)
        window = list(range(first)) + list(range(first + len(bshape), len(shape)))
    else:
        shape = bshape + tuple(x.shape[i] for i in rest)
        window = list(range(len(bshape), len(shape)))
    return starts, shape, window


@lowers(aten.index.Tensor)
def _index(em: Emitter, out: torch.Tensor, x: TensorValue, indices: Sequence[TensorValue | None]) -> TensorValue:
    """Advanced indexing with integer index tensors (boolean masks have data-dependent shapes)."""
    present = _indexed_positions("aten.index.Tensor", indices, "indexing with a boolean mask gives a "
                                   "data-dependent shape, which the pjrt device cannot compile; use torch.where or "
                                   "masked_fill instead")
    positions = list(present)
    if len(positions) == 1:
        d = positions[0]
        return em.reshape(gather_along(em, x, d, present[d]), tuple(out.shape))
    starts, out_shape, offset_dims = _advanced_index(em, x, present)
    dnums = hlo.GatherDimensionNumbers.get(
        offset_dims=offset_dims,
        collapsed_slice_dims=positions,
        operand_batching_dims=[],
        start_indices_batching_dims=[],
        start_index_map=positions,
        index_vector_dim=starts.rank - 1,
    )
    slice_sizes = [1 if i in positions else s for i, s in enumerate(x.shape)]
    v = hlo.gather(x.value, starts.value, dnums, slice_sizes, indices_are_sorted=False,
                   results=[tensor_type(out_shape, x.dtype)])
    return em.reshape(TensorValue(v, tuple(out_shape), x.dtype), tuple(out.shape))


@lowers(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(em: Emitter, out: torch.Tensor, x: TensorValue, indices: Sequence[TensorValue | None],
               values: Operand, accumulate: bool = False) -> TensorValue:
    present = _indexed_positions("aten.index_put.default", indices, "index_put with a boolean mask is not "
                                   "supported on the pjrt device; use torch.where instead")
    if not isinstance(values, TensorValue):
        values = em.constant(values, x.dtype)
    positions = list(present)
    if len(positions) == 1:
        d = positions[0]
        return scatter_along(em, x, d, present[d], values, "sum" if accumulate else None)
    starts, upd_shape, window = _advanced_index(em, x, present)
    upd = em.broadcast_to(em.convert(values, x.dtype), upd_shape)
    dnums = hlo.ScatterDimensionNumbers.get(
        update_window_dims=window,
        inserted_window_dims=positions,
        input_batching_dims=[],
        scatter_indices_batching_dims=[],
        scattered_dims_to_operand_dims=positions,
        index_vector_dim=starts.rank - 1,
    )
    op = _scatter_op(em, x, starts, upd, dnums)
    _scatter_region(op, x.dtype, "sum" if accumulate else None)
    return TensorValue(op.results[0], x.shape, x.dtype)


def _full_index(em: Emitter, index: TensorValue, d: int, size: int) -> TensorValue:
    """[*index.shape, rank] coordinates: ``index`` along ``d``, the position elsewhere (torch.gather/scatter)."""
    rank = index.rank
    comps = []
    for i in range(rank):
        c = _index_values(em, index, size) if i == d else em.iota(index.shape, i, torch.int64)
        comps.append(em.reshape(c, index.shape + (1,)))
    return em.concatenate(comps, rank) if rank > 1 else comps[0]


@lowers(aten.gather.default)
def _gather(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, sparse_grad: bool = False) -> TensorValue:
    if x.rank == 0:
        return em.reshape(x, tuple(out.shape))
    d = dim % x.rank
    n = x.shape[d]
    if em.options.use_dense_gather(n):
        # Dense: compare against every position along d and sum the one match (select, so no 0*inf).
        xs = em.slice(x, [0] * x.rank, [n if i == d else index.shape[i] for i in range(x.rank)], [1] * x.rank)
        ishape = index.shape
        full = ishape + (n,)
        hits = em.compare(em.iota(full, x.rank, torch.int64),
                          em.broadcast_in_dim(_index_values(em, index, n), full, list(range(x.rank))), "EQ")
        perm_dims = [i for i in range(x.rank) if i != d]
        # xs has shape ishape with n at d; bring d last and broadcast over ishape[d].
        xt = em.transpose(xs, perm_dims + [d])  # [other..., n]
        bdims = [i for i in range(x.rank) if i != d] + [x.rank]
        xb = em.broadcast_in_dim(xt, full, bdims)
        picked = em.select(hits, xb, em.constant(0, x.dtype, full))
        r = em.reduce_simple(picked, [x.rank], "sum" if x.dtype != torch.bool else "or")
        return em.reshape(r, tuple(out.shape))
    return em.reshape(gather_elements(em, x, d, index), tuple(out.shape))


def _as_1d(em: Emitter, t: TensorValue) -> TensorValue:
    return em.reshape(t, (1,)) if t.rank == 0 else t


def gather_elements(em: Emitter, x: TensorValue, d: int, index: TensorValue) -> TensorValue:
    """torch.gather: ``out[..., i, ...] = x[..., index[..., i, ...], ...]`` along ``d`` (a sparse gather).

    Every dimension but ``d`` is a batching dimension of the gather (``x`` cut to ``index``'s extent there, which
    is all torch reads), so the partitioner keeps a sharded batch where it is; as a gather at full coordinates
    (an iota per dimension beside the index) it gathered the coordinates on every device and all-reduced the
    result."""
    if x.rank == 0:  # torch takes a 0-d tensor as one element along dim 0
        return em.reshape(gather_elements(em, _as_1d(em, x), 0, _as_1d(em, index)), index.shape)
    if index.numel == 0:  # nothing to gather, and stablehlo.gather refuses slices of a zero-size dimension
        return em.constant(0, x.dtype, index.shape)
    extent = [x.shape[i] if i == d else index.shape[i] for i in range(x.rank)]
    if list(x.shape) != extent:
        x = em.slice(x, [0] * x.rank, extent, [1] * x.rank)
    batch = [i for i in range(x.rank) if i != d]
    dnums = hlo.GatherDimensionNumbers.get(
        offset_dims=[],
        collapsed_slice_dims=[d],
        operand_batching_dims=batch,
        start_indices_batching_dims=batch,
        start_index_map=[d],
        index_vector_dim=index.rank,  # one coordinate per element: the implicit trailing dimension
    )
    starts = _index_values(em, index, x.shape[d])
    v = hlo.gather(x.value, starts.value, dnums, [1] * x.rank, indices_are_sorted=False,
                   results=[tensor_type(index.shape, x.dtype)])
    return TensorValue(v, index.shape, x.dtype)


def take_along(em: Emitter, x: TensorValue, d: int, position: TensorValue) -> TensorValue:
    """``x[..., position[...], ...]`` along ``d``: ``position`` has x's shape without ``d``, one index per slice."""
    index = em.reshape(position, tuple(1 if i == d else s for i, s in enumerate(x.shape)))
    return em.reshape(gather_elements(em, x, d, index), position.shape)


def scatter_elements(em: Emitter, x: TensorValue, d: int, index: TensorValue, src: TensorValue,
                     reduce: str | None) -> TensorValue:
    """torch.scatter: ``x[..., index[i, j], ...] = src[i, j]`` along ``d``, or combined with ``reduce``.

    Where ``index`` spans ``x`` on every other dimension (the backward of a gather along the classes), those are
    batching dimensions of the scatter, which the partitioner keeps sharded, as in :func:`gather_elements`."""
    if x.rank == 0:  # torch takes a 0-d tensor as one element along dim 0 (max/median/cummax's backward)
        r = scatter_elements(em, _as_1d(em, x), 0, _as_1d(em, index), _as_1d(em, src), reduce)
        return em.reshape(r, ())
    # src may be larger than index: only its leading index.shape block is used.
    if src.shape != index.shape:
        src = em.slice(src, [0] * src.rank, list(index.shape), [1] * src.rank)
    others = [i for i in range(x.rank) if i != d]
    if all(index.shape[i] == x.shape[i] for i in others):
        starts = _index_values(em, index, x.shape[d])
        squeeze = index.shape[d] == 1 and x.rank > 1
        if squeeze:  # one index per slice: d dropped, so no size-1 dimension pins it replicated
            kept = tuple(index.shape[i] for i in others)
            starts, src = em.reshape(starts, kept), em.reshape(src, kept)
        dnums = hlo.ScatterDimensionNumbers.get(
            update_window_dims=[],
            inserted_window_dims=[d],
            input_batching_dims=others,
            scatter_indices_batching_dims=list(range(x.rank - 1)) if squeeze else others,
            scattered_dims_to_operand_dims=[d],
            index_vector_dim=starts.rank,
        )
    else:  # a smaller index block: full coordinates (an iota per dimension beside the index)
        starts = _full_index(em, index, d, x.shape[d])
        dnums = hlo.ScatterDimensionNumbers.get(
            update_window_dims=[],
            inserted_window_dims=list(range(x.rank)),
            input_batching_dims=[],
            scatter_indices_batching_dims=[],
            scattered_dims_to_operand_dims=list(range(x.rank)),
            index_vector_dim=index.rank,
        )
    op = _scatter_op(em, x, starts, em.convert(src, x.dtype), dnums)
    _scatter_region(op, x.dtype, reduce)
    return TensorValue(op.results[0], x.shape, x.dtype)


@lowers(aten.scatter_add.default)
def _scatter_add(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    return scatter_elements(em, x, dim % max(x.rank, 1), index, src, "sum")


@lowers(aten.scatter.src)
def _scatter_src(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    return scatter_elements(em, x, dim % max(x.rank, 1), index, src, None)


@lowers(aten.scatter.value)
def _scatter_value(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, value: Any) -> TensorValue:
    src = em.constant(value, x.dtype, index.shape)
    return scatter_elements(em, x, dim % max(x.rank, 1), index, src, None)


_SCATTER_REDUCE_NAMES = {"add": "sum", "multiply": "prod"}


@lowers(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, src: Operand,
                           *, reduce: str) -> TensorValue:
    """``scatter(..., reduce="add" | "multiply")``."""
    if reduce not in _SCATTER_REDUCE_NAMES:
        raise UnsupportedOpError("aten.scatter.reduce", f"scatter reduce={reduce!r}: torch accepts 'add' and 'multiply'")
    if not isinstance(src, TensorValue):
        src = em.constant(src, x.dtype, index.shape)
    return scatter_elements(em, x, dim % max(x.rank, 1), index, src, _SCATTER_REDUCE_NAMES[reduce])


def _identity_of(reduce: str, dtype: torch.dtype) -> Any:
    return {"sum": 0, "mean": 0, "prod": 1, "amax": lowest(dtype), "amin": highest(dtype)}[reduce]


def _reduce_into(em: Emitter, x: TensorValue, reduce: str, include_self: bool,
                 scatter: Callable[[TensorValue, TensorValue, str | None], TensorValue], src: TensorValue) -> TensorValue:
    """Shared by scatter_reduce and index_reduce: ``scatter(base, values, kind)`` places values.

    Without ``include_self`` the scattered-to positions start from the reduction's identity;
    ``mean`` divides the sum by how many values (and ``x`` itself, if included) each position got.
    """
    kind = "sum" if reduce == "mean" else reduce
    base = x
    if not include_self:
        base = scatter(x, em.constant(_identity_of(reduce, x.dtype), x.dtype, src.shape), None)
    r = scatter(base, src, kind)
    if reduce != "mean":
        return r
    counts = scatter(em.constant(1 if include_self else 0, x.dtype, x.shape), em.constant(1, x.dtype, src.shape), "sum")
    counts = em.select(em.compare(counts, em.constant(0, x.dtype, x.shape), "EQ"), em.constant(1, x.dtype, x.shape),
                       counts)
    return em.div(r, counts) if x.dtype.is_floating_point else floor_divide_int(em, r, counts)


@lowers(aten.scatter_reduce.two)
def _scatter_reduce(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, src: TensorValue,
                    reduce: str, *, include_self: bool = True) -> TensorValue:
    d = dim % max(x.rank, 1)
    if index.numel == 0:
        return x
    src = em.convert(src, x.dtype)
    if src.shape != index.shape:
        src = em.slice(src, [0] * src.rank, list(index.shape), [1] * src.rank)
    return _reduce_into(em, x, reduce, include_self,
                        lambda base, values, kind: scatter_elements(em, base, d, index, values, kind), src)


@lowers(aten.index_reduce.default)
def _index_reduce(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: TensorValue, source: TensorValue,
                  reduce: str, *, include_self: bool = True) -> TensorValue:
    if x.rank == 0:
        x1 = em.reshape(x, (1,))
        r = _index_reduce(em, out, x1, 0, em.reshape(index, (index.numel,)), em.reshape(source, (source.numel,)),
                          reduce, include_self=include_self)
        return em.reshape(r, ())
    d = dim % x.rank
    idx = em.reshape(index, (index.numel,))
    src = em.convert(source, x.dtype)
    return _reduce_into(em, x, reduce, include_self,
                        lambda base, values, kind: scatter_along(em, base, d, idx, values, kind), src)


__all__ = ["SCATTER_REDUCTIONS", "gather_along", "gather_elements", "scatter_along", "scatter_elements", "take_along"]
