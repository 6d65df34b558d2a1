"""Lowering of ``aten.nonzero_static``: the indices of the nonzero elements in a result of fixed size.

``torch.nonzero`` has a data-dependent shape (one row per nonzero element), so the pjrt device runs it through
the CPU fallback and every new count makes the programs around it new. ``torch.nonzero_static(x, size=n,
fill_value=f)`` fixes the rows at ``n``: the first ``n`` nonzero indices in row-major order, then rows of ``f``.
Lowered with static shapes: a stable sort brings the nonzero positions to the front in their order, the first
``n`` are kept and the rows past the count are filled (the counterpart of JAX's ``jnp.nonzero(size=, fill_value=)``).
"""

from __future__ import annotations

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._reductions import _sort
from ._table import COMPLEX_LOWERINGS, lowers, meta_rule

aten = torch.ops.aten

_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
#: The dtypes torch's CPU kernel counts (it refuses the wide unsigned and float8 types).
_COUNTED = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
            torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128}


@meta_rule(aten.nonzero_static.default)
def _nonzero_static_meta(x: torch.Tensor, *, size: int, fill_value: int = -1) -> torch.Tensor:
    """The CPU kernel's checks (torch's meta kernel skips them: a negative size fails there as a bad shape)."""
    if size < 0:
        raise RuntimeError(f"nonzero_static: 'size' must be a non-negative integer, got {size}")
    if x.dtype not in _COUNTED:
        raise RuntimeError(f"nonzero_static is not implemented for {x.dtype} (nor on the CPU); convert the input, "
                           "for example x != 0")
    return x.new_empty((size, x.dim()), dtype=torch.int64)


def _is_nonzero(em: Emitter, x: TensorValue) -> TensorValue:
    """bool: ``x != 0`` as torch reads it (NaN is nonzero, -0.0 is zero; a complex number is nonzero when its real
    or imaginary part is)."""
    if x.dtype == torch.bool:
        return x
    if x.dtype.is_complex:
        real_dtype = _REAL_OF[x.dtype]
        parts = [TensorValue(op(x.value), x.shape, real_dtype) for op in (hlo.real, hlo.imag)]
        zero = em.constant(0, real_dtype, x.shape)
        return em.binary(hlo.or_, em.compare(parts[0], zero, "NE"), em.compare(parts[1], zero, "NE"))
    return em.compare(x, em.constant(0, x.dtype, x.shape), "NE")


@lowers(aten.nonzero_static.default)
def _nonzero_static(em: Emitter, out: torch.Tensor, x: TensorValue, *, size: int,
                    fill_value: int = -1) -> TensorValue:
    """int64 ``[size, x.dim()]``: the row-major indices of the first ``size`` nonzero elements, then
    ``fill_value`` rows."""
    rows, rank = int(out.shape[0]), x.rank
    if rows == 0 or rank == 0 or x.numel == 0:
        # No element to list (an empty input), no coordinate per row (0-d) or no row: the shape says it all.
        return em.constant(fill_value, torch.int64, (rows, rank))
    n = x.numel
    nonzero = _is_nonzero(em, em.reshape(x, (n,)))
    # Stable sort on "is zero": the nonzero positions come first, in their order.
    _, positions = _sort(em, em.convert(em.unary(hlo.not_, nonzero), torch.int32), 0, descending=False)
    count = em.reduce_simple(em.convert(nonzero, torch.int64), [0], "sum")
    kept = em.slice(positions, [0], [min(rows, n)], [1])
    if rows > n:
        kept = em.concatenate([kept, em.constant(0, torch.int64, (rows - n,))], 0)
    coordinates = []
    stride = n
    for extent in x.shape:
        stride //= extent
        c = em.div(kept, em.constant(stride, torch.int64, (rows,))) if stride > 1 else kept
        coordinates.append(em.reshape(em.binary(hlo.remainder, c, em.constant(extent, torch.int64, (rows,))),
                                      (rows, 1)))
    indices = coordinates[0] if rank == 1 else em.concatenate(coordinates, 1)
    listed = em.compare(em.iota((rows, rank), 0, torch.int64), em.broadcast_to(count, (rows, rank)), "LT")
    return em.select(listed, indices, em.constant(fill_value, torch.int64, (rows, rank)))


COMPLEX_LOWERINGS.add(aten.nonzero_static.default)  # reads complex inputs, returns int64
