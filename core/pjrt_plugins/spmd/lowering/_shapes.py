"""Lowerings of view and layout ops: view/reshape, permute, expand, squeeze, slice, select, cat, pad, flip.

Views are values here: a view lowers to a reshape/transpose/slice of its base.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import LoweringError, UnsupportedOpError
from ._emitter import Emitter, Scalar, TensorValue
from ._indexing import gather_along, scatter_along
from ._mlir import tensor_type
from ._table import lowers, meta_rule

aten = torch.ops.aten
prims = torch.ops.prims


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
        aten._reshape_alias.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
        aten.unsqueeze.default, aten.squeeze_copy.dims, aten.unsqueeze_copy.default, aten.flatten.using_ints)
def _view(em: Emitter, out: torch.Tensor, x: TensorValue, *args: Any) -> TensorValue:
    return em.reshape(x, tuple(out.shape))


@lowers(aten.permute.default, aten.permute_copy.default)
def _permute(em: Emitter, out: torch.Tensor, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return em.transpose(x, [d % x.rank for d in dims] if x.rank else [])


@lowers(aten.t.default, aten.numpy_T.default)
def _t(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.transpose(x, list(reversed(range(x.rank))))


@lowers(aten.transpose.int)
def _transpose(em: Emitter, out: torch.Tensor, x: TensorValue, d0: int, d1: int) -> TensorValue:
    if x.rank == 0:
        return x
    perm = list(range(x.rank))
    d0, d1 = d0 % x.rank, d1 % x.rank
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.transpose(x, perm)


@lowers(aten.expand.default, aten.expand_copy.default)
def _expand(em: Emitter, out: torch.Tensor, x: TensorValue, size: Sequence[int], *, implicit: bool = False) -> TensorValue:
    return em.broadcast_to(x, tuple(out.shape))


def _slice_bounds(size: int, start: int | None, end: int | None, step: int) -> tuple[int, int]:
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int = 0, start: int | None = None,
           end: int | None = None, step: int = 1) -> TensorValue:
    d = dim % x.rank
    s, e = _slice_bounds(x.shape[d], start, end, step)
    starts, limits, strides = [0] * x.rank, list(x.shape), [1] * x.rank
    starts[d], limits[d], strides[d] = s, e, int(step)
    return em.slice(x, starts, limits, strides)


@lowers(aten.select.int, aten.select_copy.int)
def _select(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, index: int) -> TensorValue:
    d = dim % x.rank
    i = int(index) + (x.shape[d] if index < 0 else 0)
    starts, limits, strides = [0] * x.rank, list(x.shape), [1] * x.rank
    starts[d], limits[d] = i, i + 1
    return em.reshape(em.slice(x, starts, limits, strides), tuple(out.shape))


@lowers(aten.cat.default)
def _cat(em: Emitter, out: torch.Tensor, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    rank = len(out.shape)
    d = dim % rank if rank else 0
    # torch skips legacy empty 1-D tensors of shape (0,) in cat.
    parts = [em.convert(t, out.dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0 and rank != 1)]
    parts = [p for p in parts if p.shape[d] != 0] or parts[:1]
    if len(parts) == 1:
        return em.reshape(parts[0], tuple(out.shape))
    return em.concatenate(parts, d)


@lowers(aten.constant_pad_nd.default)
def _pad(em: Emitter, out: torch.Tensor, x: TensorValue, pad: Sequence[int], value: Scalar = 0) -> TensorValue:
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        low[d], high[d] = int(pad[2 * i]), int(pad[2 * i + 1])
    # Negative padding crops: pad with the non-negative part, then slice.
    pos_low, pos_high = [max(v, 0) for v in low], [max(v, 0) for v in high]
    shape = [s + lo + hi for s, lo, hi in zip(x.shape, pos_low, pos_high)]
    v = hlo.pad(x.value, em.constant(value, x.dtype).value, pos_low, pos_high, [0] * x.rank,
                results=[tensor_type(shape, x.dtype)])
    y = TensorValue(v, tuple(shape), x.dtype)
    if any(v < 0 for v in low + high):
        starts = [max(-v, 0) for v in low]
        limits = [s - max(-v, 0) for s, v in zip(shape, high)]
        y = em.slice(y, starts, limits, [1] * x.rank)
    return y


@lowers(aten.flip.default)
def _flip(em: Emitter, out: torch.Tensor, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    if not dims or x.rank == 0:
        return x
    return TensorValue(hlo.reverse(x.value, sorted(d % x.rank for d in dims)), x.shape, x.dtype)


def _scatter_slice(em: Emitter, x: TensorValue, src: TensorValue, d: int, start: int, end: int, step: int) -> TensorValue:
    """``x`` with ``x[..., start:end:step, ...] = src`` along dimension ``d`` (static positions)."""
    src = em.convert(src, x.dtype)
    if step == 1:
        idx = [em.constant(start if i == d else 0, torch.int64).value for i in range(x.rank)]
        return TensorValue(hlo.dynamic_update_slice(x.value, src.value, idx), x.shape, x.dtype)
    # Strided: interleave with a mask built from iota.
    n = x.shape[d]
    iota = em.iota(x.shape, d, torch.int64)
    rel = em.sub(iota, em.constant(start, torch.int64, x.shape))
    in_range = em.binary(hlo.and_, em.compare(iota, em.constant(start, torch.int64, x.shape), "GE"),
                         em.compare(iota, em.constant(end, torch.int64, x.shape), "LT"))
    on_step = em.compare(em.binary(hlo.remainder, rel, em.constant(step, torch.int64, x.shape)),
                         em.constant(0, torch.int64, x.shape), "EQ")
    mask = em.binary(hlo.and_, in_range, on_step)
    # Spread src along d to full size: pad with interior padding step-1.
    low = [0] * x.rank
    high = [0] * x.rank
    interior = [0] * x.rank
    low[d] = start
    interior[d] = step - 1
    m = src.shape[d]
    spread = start + (m - 1) * step + 1 if m else start
    high[d] = n - spread
    if high[d] < 0:
        raise LoweringError("internal: slice_scatter source does not fit")
    v = hlo.pad(src.value, em.constant(0, x.dtype).value, low, high, interior, results=[tensor_type(x.shape, x.dtype)])
    return em.select(mask, TensorValue(v, x.shape, x.dtype), x)


@lowers(aten.slice_scatter.default)
def _slice_scatter(em: Emitter, out: torch.Tensor, x: TensorValue, src: TensorValue, dim: int = 0,
                   start: int | None = None, end: int | None = None, step: int = 1) -> TensorValue:
    d = dim % x.rank
    s, e = _slice_bounds(x.shape[d], start, end, step)
    return _scatter_slice(em, x, src, d, s, e, int(step))


@lowers(aten.select_scatter.default)
def _select_scatter(em: Emitter, out: torch.Tensor, x: TensorValue, src: TensorValue, dim: int, index: int) -> TensorValue:
    d = dim % x.rank
    i = int(index) + (x.shape[d] if index < 0 else 0)
    shape = list(x.shape)
    shape[d] = 1
    return _scatter_slice(em, x, em.reshape(src, shape), d, i, i + 1, 1)


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(em: Emitter, out: Any, x: TensorValue, sizes: Sequence[int], dim: int = 0) -> tuple:
    d = dim % x.rank
    parts, start = [], 0
    for size in sizes:
        starts, limits = [0] * x.rank, list(x.shape)
        starts[d], limits[d] = start, start + int(size)
        parts.append(em.slice(x, starts, limits, [1] * x.rank))
        start += int(size)
    return tuple(parts)


@lowers(aten.split.Tensor)
def _split(em: Emitter, out: Any, x: TensorValue, split_size: int, dim: int = 0) -> tuple:
    d = dim % x.rank
    n = x.shape[d]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] or [0]
    return _split_with_sizes(em, out, x, sizes, d)


@lowers(aten.unbind.int)
def _unbind(em: Emitter, out: Any, x: TensorValue, dim: int = 0) -> tuple:
    d = dim % x.rank
    shape = [s for i, s in enumerate(x.shape) if i != d]
    return tuple(em.reshape(p, shape) for p in _split_with_sizes(em, out, x, [1] * x.shape[d], d))


@lowers(aten.stack.default)
def _stack(em: Emitter, out: torch.Tensor, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    rank = len(out.shape)
    d = dim % rank
    parts = []
    for t in tensors:
        shape = list(t.shape)
        shape.insert(d, 1)
        parts.append(em.reshape(em.convert(t, out.dtype), shape))
    return em.concatenate(parts, d) if len(parts) > 1 else parts[0]


@lowers(aten.repeat.default)
def _repeat(em: Emitter, out: torch.Tensor, x: TensorValue, repeats: Sequence[int]) -> TensorValue:
    reps = [int(r) for r in repeats]
    lead = len(reps) - x.rank
    shape = [1] * lead + list(x.shape)
    x = em.reshape(x, shape)
    # Broadcast to (r0, s0, r1, s1, ...) then merge pairs.
    bshape, dims = [], []
    for i, (r, s) in enumerate(zip(reps, shape)):
        bshape += [r, s]
        dims.append(2 * i + 1)
    b = em.broadcast_in_dim(x, bshape, dims)
    return em.reshape(b, tuple(out.shape))


def _strided_positions(em: Emitter, op: str, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None) -> TensorValue:
    """int64 [size]: the flat storage position of every element of a strided view of the op's first input.

    The strides refer to that input's storage, so it must be contiguous with no offset of its
    own (torch's decompositions of ``diagonal`` etc. give such inputs).
    """
    base = em.node.args[0].meta.get("val") if em.node is not None else None
    if not isinstance(base, torch.Tensor) or not base.is_contiguous() or base.storage_offset() != 0:
        raise UnsupportedOpError(op, f"{op} of a non-contiguous view is not supported on the pjrt device; call "
                                 ".contiguous() first")
    size = tuple(int(s) for s in size)
    index = em.constant(int(storage_offset or 0), torch.int64, size)
    for d, st in enumerate(stride):
        if size[d] > 1 and st != 0:
            index = em.add(index, em.mul(em.iota(size, d, torch.int64), em.constant(int(st), torch.int64, size)))
    return index


def _check_in_bounds(op: str, x: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                     storage_offset: int | None) -> None:
    """Refuse a strided view reaching past ``x``'s last element: the gather would clamp it to garbage.

    A pjrt tensor's storage is its own elements (contiguous, offset 0), so this is torch's storage
    bounds check for a tensor that owns its storage.
    """
    if any(int(s) == 0 for s in size):
        return
    last = int(storage_offset or 0) + sum((int(n) - 1) * int(st) for n, st in zip(size, stride))
    if last >= x.numel():
        raise RuntimeError(f"{op}: sizes {list(size)}, strides {list(stride)} and storage offset "
                           f"{int(storage_offset or 0)} reach element {last} of a pjrt tensor of {x.numel()} "
                           "elements. A pjrt tensor's storage is its own elements, also for a view of another "
                           "tensor: call as_strided on the tensor that owns the storage.")


@meta_rule(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided_meta(x: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                     storage_offset: int | None = None) -> torch.Tensor:
    _check_in_bounds("as_strided", x, size, stride, storage_offset)
    return torch.empty_strided(tuple(size), tuple(stride), dtype=x.dtype, device="meta")


@meta_rule(aten.as_strided_scatter.default)
def _as_strided_scatter_meta(x: torch.Tensor, src: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                             storage_offset: int | None = None) -> torch.Tensor:
    _check_in_bounds("as_strided_scatter", x, size, stride, storage_offset)
    return aten.as_strided_scatter.default(x, src, size, stride, storage_offset)


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(em: Emitter, out: torch.Tensor, x: TensorValue, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> TensorValue:
    """A strided view of a contiguous tensor: a gather from its flattened elements."""
    index = _strided_positions(em, "aten.as_strided.default", size, stride, storage_offset)
    if index.numel == 0 or x.numel == 0:
        return em.constant(0, x.dtype, tuple(out.shape))
    return em.reshape(gather_along(em, em.reshape(x, (x.numel,)), 0, index), tuple(out.shape))


@lowers(aten.as_strided_scatter.default, prims.as_strided_scatter.default)
def _as_strided_scatter(em: Emitter, out: torch.Tensor, x: TensorValue, src: TensorValue, size: Sequence[int],
                        stride: Sequence[int], storage_offset: int | None = None) -> TensorValue:
    """``x`` with the elements of its strided view replaced by ``src`` (as_strided's backward writes this)."""
    index = _strided_positions(em, "aten.as_strided_scatter.default", size, stride, storage_offset)
    if index.numel == 0 or x.numel == 0:
        return x
    flat = scatter_along(em, em.reshape(x, (x.numel,)), 0, index, em.convert(src, x.dtype), None)
    return em.reshape(flat, x.shape)


def _triangle(em: Emitter, x: TensorValue, diagonal: int, lower: bool) -> TensorValue:
    """Keep the lower (``tril``) or upper (``triu``) triangle of the last two dimensions."""
    rows, cols = x.shape[-2], x.shape[-1]
    r = em.iota((rows, cols), 0, torch.int64)
    c = em.iota((rows, cols), 1, torch.int64)
    shifted = em.add(r, em.constant(int(diagonal), torch.int64, (rows, cols)))
    keep = em.compare(c, shifted, "LE" if lower else "GE")
    return em.select(em.broadcast_to(keep, x.shape), x, em.constant(0, x.dtype, x.shape))


@lowers(aten.tril.default)
def _tril(em: Emitter, out: torch.Tensor, x: TensorValue, diagonal: int = 0) -> TensorValue:
    return _triangle(em, x, diagonal, lower=True)


@lowers(aten.triu.default)
def _triu(em: Emitter, out: torch.Tensor, x: TensorValue, diagonal: int = 0) -> TensorValue:
    return _triangle(em, x, diagonal, lower=False)


@lowers(aten.roll.default)
def _roll(em: Emitter, out: torch.Tensor, x: TensorValue, shifts: Sequence[int] | int,
          dims: Sequence[int] | int = ()) -> TensorValue:
    """Rotate along each of ``dims`` (or the flattened tensor when none are given) with two slices."""
    shifts = [int(shifts)] if isinstance(shifts, int) else [int(s) for s in shifts]
    dims = [int(dims)] if isinstance(dims, int) else [int(d) for d in dims]
    if not dims:
        flat = em.reshape(x, (x.numel,))
        return em.reshape(_roll(em, out, flat, shifts, [0]), x.shape)
    y = x
    for shift, dim in zip(shifts, dims):
        d = dim % y.rank
        n = y.shape[d]
        if n == 0 or shift % n == 0:
            continue
        k = shift % n
        starts, limits, strides = [0] * y.rank, list(y.shape), [1] * y.rank
        head_starts = list(starts)
        head_starts[d] = n - k
        tail_limits = list(limits)
        tail_limits[d] = n - k
        y = em.concatenate([em.slice(y, head_starts, limits, strides), em.slice(y, starts, tail_limits, strides)], d)
    return y


def _diagonal_geometry(x: TensorValue, offset: int, dim1: int, dim2: int) -> tuple[list[int], tuple[int, ...], list[int]]:
    """(permutation bringing dim1, dim2 last, the flattened shape [..., R*C], flat positions of the diagonal)."""
    d1, d2 = dim1 % x.rank, dim2 % x.rank
    perm = [i for i in range(x.rank) if i not in (d1, d2)] + [d1, d2]
    rows, cols = x.shape[d1], x.shape[d2]
    r0, c0 = max(-offset, 0), max(offset, 0)
    length = max(0, min(rows - r0, cols - c0))
    positions = [(k + r0) * cols + (k + c0) for k in range(length)]
    return perm, tuple(x.shape[i] for i in perm[:-2]) + (rows * cols,), positions


@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(em: Emitter, out: torch.Tensor, x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    perm, flat_shape, positions = _diagonal_geometry(x, int(offset), dim1, dim2)
    if not positions or x.numel == 0:
        return em.constant(0, x.dtype, tuple(out.shape))
    flat = em.reshape(em.transpose(x, perm), flat_shape)
    index = em.add(em.mul(em.iota((len(positions),), 0, torch.int64),
                          em.constant(positions[1] - positions[0] if len(positions) > 1 else 0, torch.int64,
                                      (len(positions),))),
                   em.constant(positions[0], torch.int64, (len(positions),)))
    return gather_along(em, flat, len(flat_shape) - 1, index)


@lowers(aten.diagonal_scatter.default)
def _diagonal_scatter(em: Emitter, out: torch.Tensor, x: TensorValue, src: TensorValue, offset: int = 0, dim1: int = 0,
                      dim2: int = 1) -> TensorValue:
    perm, flat_shape, positions = _diagonal_geometry(x, int(offset), dim1, dim2)
    if not positions or x.numel == 0:
        return x
    moved = em.transpose(x, perm)
    flat = em.reshape(moved, flat_shape)
    step = positions[1] - positions[0] if len(positions) > 1 else 0
    index = em.add(em.mul(em.iota((len(positions),), 0, torch.int64), em.constant(step, torch.int64, (len(positions),))),
                   em.constant(positions[0], torch.int64, (len(positions),)))
    written = em.reshape(scatter_along(em, flat, len(flat_shape) - 1, index, em.convert(src, x.dtype), None), moved.shape)
    inverse = [perm.index(i) for i in range(x.rank)]
    return em.transpose(written, inverse)
