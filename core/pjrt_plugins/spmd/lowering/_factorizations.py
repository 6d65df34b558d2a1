"""Lowerings of matrix factorizations and solves: Cholesky, triangular solves, QR, symmetric eigendecomposition,
LU with partial pivoting, and what torch builds on them (det, slogdet, solve, inv, lu_solve, lu_unpack).

Cholesky and triangular solves are StableHLO ops; QR and eigh are the ``Qr``,
``ProductOfElementaryHouseholderReflectors`` and ``Eigh`` custom calls that XLA's compiler expands
(Householder QR as LAPACK's, cyclic Jacobi eigh); LU is an unblocked partial-pivoting loop
(``stablehlo.while``) choosing the pivots LAPACK's getrf chooses. Batch dimensions lead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._indexing import gather_elements
from ._mlir import tensor_type
from ._promotion import Promotion, compute_dtype
from ._table import lowers, meta_rule

aten = torch.ops.aten


def _swap_last(em: Emitter, x: TensorValue) -> TensorValue:
    return em.transpose(x, list(range(x.rank - 2)) + [x.rank - 1, x.rank - 2])


def _eye(em: Emitter, n: int, dtype: torch.dtype, batch: Sequence[int] = ()) -> TensorValue:
    eye = em.convert(em.compare(em.iota((n, n), 0, torch.int64), em.iota((n, n), 1, torch.int64), "EQ"), dtype)
    return em.broadcast_to(eye, tuple(batch) + (n, n))


def _triangle(em: Emitter, x: TensorValue, lower: bool, diagonal: int = 0) -> TensorValue:
    rows, cols = x.shape[-2], x.shape[-1]
    r = em.iota((rows, cols), 0, torch.int64)
    c = em.add(em.iota((rows, cols), 1, torch.int64), em.constant(-int(diagonal), torch.int64, (rows, cols)))
    keep = em.compare(c, r, "LE" if lower else "GE")
    return em.select(em.broadcast_to(keep, x.shape), x, em.constant(0, x.dtype, x.shape))


def _diagonal(em: Emitter, x: TensorValue) -> TensorValue:
    """[..., n] diagonal of square [..., n, n] matrices."""
    n = x.shape[-1]
    on = em.broadcast_to(em.compare(em.iota((n, n), 0, torch.int64), em.iota((n, n), 1, torch.int64), "EQ"), x.shape)
    return em.reduce_simple(em.select(on, x, em.constant(0, x.dtype, x.shape)), [x.rank - 1], "sum")


def _broadcast_batches(em: Emitter, a: TensorValue, b: TensorValue) -> tuple[TensorValue, TensorValue]:
    """Both with the broadcast of their batch (all but the last two) dimensions."""
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return em.broadcast_to(a, batch + a.shape[-2:]), em.broadcast_to(b, batch + b.shape[-2:])


def triangular_solve(em: Emitter, a: TensorValue, b: TensorValue, *, lower: bool, left: bool = True,
                     unit_diagonal: bool = False, transpose: bool = False) -> TensorValue:
    """op(a) x = b (``left``) or x op(a) = b, with op = transpose when asked; a triangular."""
    a, b = _broadcast_batches(em, a, b)
    if b.numel == 0 or a.numel == 0:
        return em.constant(0, b.dtype, b.shape)
    mode = hlo.TransposeAttr.get("TRANSPOSE" if transpose else "NO_TRANSPOSE")
    v = hlo.triangular_solve(a.value, b.value, left, lower, unit_diagonal, mode, results=[tensor_type(b.shape, b.dtype)])
    return TensorValue(v, b.shape, b.dtype)


def _custom_call(target: str, operands: Sequence[TensorValue], results: Sequence[tuple[tuple[int, ...], torch.dtype]],
                 config: str | None = None) -> list[TensorValue]:
    op = hlo.CustomCallOp([tensor_type(s, d) for s, d in results], [o.value for o in operands], target,
                          backend_config=ir.StringAttr.get(config) if config is not None else None)
    return [TensorValue(op.results[i], tuple(s), d) for i, (s, d) in enumerate(results)]


# -- Cholesky ------------------------------------------------------------------------------------------


def cholesky(em: Emitter, a: TensorValue, upper: bool) -> tuple[TensorValue, TensorValue]:
    """(factor, info): info is 1 + the first column whose pivot is not positive (NaN in XLA's result), else 0."""
    if a.numel == 0:
        return a, em.constant(0, torch.int32, a.shape[:-2])
    v = hlo.cholesky(a.value, lower=not upper)
    factor = _triangle(em, TensorValue(v, a.shape, a.dtype), lower=not upper)
    diag = _diagonal(em, factor)
    n = a.shape[-1]
    bad = em.compare(diag, diag, "NE")
    position = em.select(bad, em.iota(diag.shape, diag.rank - 1, torch.int64), em.constant(n, torch.int64, diag.shape))
    first = em.reduce_simple(position, [diag.rank - 1], "min")
    info = em.select(em.compare(first, em.constant(n, torch.int64, first.shape), "LT"),
                     em.add(first, em.constant(1, torch.int64, first.shape)), em.constant(0, torch.int64, first.shape))
    return factor, em.convert(info, torch.int32)


@lowers(aten.linalg_cholesky_ex.default, promotion=Promotion.COMPUTE)
def _linalg_cholesky_ex(em: Emitter, out: tuple, a: TensorValue, *, upper: bool = False,
                        check_errors: bool = False) -> tuple[TensorValue, TensorValue]:
    return cholesky(em, a, upper)


@lowers(aten.cholesky.default, promotion=Promotion.COMPUTE)
def _cholesky(em: Emitter, out: torch.Tensor, a: TensorValue, upper: bool = False) -> TensorValue:
    return cholesky(em, a, upper)[0]


def _cholesky_solve(em: Emitter, b: TensorValue, factor: TensorValue, upper: bool) -> TensorValue:
    """A x = b with A = L L^T (or U^T U)."""
    y = triangular_solve(em, factor, b, lower=not upper, transpose=upper)
    return triangular_solve(em, factor, y, lower=not upper, transpose=not upper)


@lowers(aten.cholesky_solve.default, promotion=Promotion.COMPUTE)
def _cholesky_solve_op(em: Emitter, out: torch.Tensor, b: TensorValue, factor: TensorValue,
                       upper: bool = False) -> TensorValue:
    return _cholesky_solve(em, b, factor, upper)


@lowers(aten.cholesky_inverse.default, promotion=Promotion.COMPUTE)
def _cholesky_inverse(em: Emitter, out: torch.Tensor, factor: TensorValue, upper: bool = False) -> TensorValue:
    eye = _eye(em, factor.shape[-1], factor.dtype, factor.shape[:-2])
    return _cholesky_solve(em, eye, factor, upper)


# -- triangular solves -------------------------------------------------------------------------------


@lowers(aten.linalg_solve_triangular.default, promotion=Promotion.COMPUTE)
def _linalg_solve_triangular(em: Emitter, out: torch.Tensor, a: TensorValue, b: TensorValue, *, upper: bool,
                             left: bool = True, unitriangular: bool = False) -> TensorValue:
    return triangular_solve(em, a, b, lower=not upper, left=left, unit_diagonal=unitriangular)


@lowers(aten.triangular_solve.default)
def _triangular_solve(em: Emitter, out: tuple, b: TensorValue, a: TensorValue, upper: bool = True,
                      transpose: bool = False, unitriangular: bool = False) -> tuple[TensorValue, TensorValue]:
    cdt = compute_dtype(out[0].dtype)
    x = triangular_solve(em, em.convert(a, cdt), em.convert(b, cdt), lower=not upper, unit_diagonal=unitriangular,
                         transpose=transpose)
    return em.convert(x, out[0].dtype), em.broadcast_to(a, tuple(out[1].shape))


# -- QR ----------------------------------------------------------------------------------------------------


def geqrf(em: Emitter, a: TensorValue) -> tuple[TensorValue, TensorValue]:
    """LAPACK's packed QR: R on and above the diagonal, Householder vectors below, and their scales."""
    k = min(a.shape[-2], a.shape[-1])
    if a.numel == 0:
        return a, em.constant(0, a.dtype, a.shape[:-2] + (k,))
    packed, taus = _custom_call("Qr", [a], [(a.shape, a.dtype), (a.shape[:-2] + (k,), a.dtype)])
    return packed, taus


def householder_product(em: Emitter, vectors: TensorValue, taus: TensorValue) -> TensorValue:
    """The first columns of H_1 ... H_k (as many as ``vectors`` has): LAPACK's orgqr."""
    if vectors.numel == 0:
        return vectors
    (q,) = _custom_call("ProductOfElementaryHouseholderReflectors", [vectors, taus], [(vectors.shape, vectors.dtype)])
    return q


def _columns(em: Emitter, x: TensorValue, stop: int) -> TensorValue:
    return em.slice(x, [0] * x.rank, list(x.shape[:-1]) + [stop], [1] * x.rank)


def _rows(em: Emitter, x: TensorValue, stop: int) -> TensorValue:
    return em.slice(x, [0] * x.rank, list(x.shape[:-2]) + [stop, x.shape[-1]], [1] * x.rank)


def _pad_columns(em: Emitter, x: TensorValue, width: int) -> TensorValue:
    extra = width - x.shape[-1]
    if extra <= 0:
        return _columns(em, x, width)
    zeros = em.constant(0, x.dtype, x.shape[:-1] + (extra,))
    return em.concatenate([x, zeros], x.rank - 1)


def _pad_last(em: Emitter, x: TensorValue, width: int) -> TensorValue:
    extra = width - x.shape[-1]
    return x if extra <= 0 else em.concatenate([x, em.constant(0, x.dtype, x.shape[:-1] + (extra,))], x.rank - 1)


@lowers(aten.linalg_qr.default, promotion=Promotion.COMPUTE)
def _linalg_qr(em: Emitter, out: tuple, x: TensorValue, mode: str = "reduced") -> tuple[TensorValue, TensorValue]:
    m, n = x.shape[-2], x.shape[-1]
    k = min(m, n)
    packed, taus = geqrf(em, x)
    q: TensorValue | None
    if mode == "complete":
        r = _triangle(em, packed, lower=False)
        q = householder_product(em, _pad_columns(em, packed, m), _pad_last(em, taus, m)) if m else packed
    else:
        r = _triangle(em, _rows(em, packed, k), lower=False)
        q = householder_product(em, _columns(em, packed, k), taus) if mode == "reduced" else None
    return em.constant(0, out[0].dtype, tuple(out[0].shape)) if q is None else q, r


@meta_rule(aten.geqrf.default)
def _geqrf_meta(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = min(a.shape[-2], a.shape[-1])
    return torch.empty_like(a), a.new_empty(a.shape[:-2] + (k,))


@lowers(aten.geqrf.default, promotion=Promotion.COMPUTE)
def _geqrf(em: Emitter, out: tuple, a: TensorValue) -> tuple[TensorValue, TensorValue]:
    return geqrf(em, a)


@lowers(aten.linalg_householder_product.default, promotion=Promotion.COMPUTE)
def _householder_product(em: Emitter, out: torch.Tensor, vectors: TensorValue, taus: TensorValue) -> TensorValue:
    return householder_product(em, vectors, taus)


@lowers(aten.ormqr.default, promotion=Promotion.COMPUTE)
def _ormqr(em: Emitter, out: torch.Tensor, vectors: TensorValue, taus: TensorValue, other: TensorValue,
           left: bool = True, transpose: bool = False) -> TensorValue:
    """other multiplied by Q (m x m, from the reflectors) on the left or right, transposed if asked."""
    m = vectors.shape[-2]
    q = householder_product(em, _pad_columns(em, vectors, m), _pad_last(em, taus, m))
    if transpose:
        q = _swap_last(em, q)
    q, c = _broadcast_batches(em, q, other)
    batch = list(range(q.rank - 2))
    if left:
        return em.dot_general(q, c, ((q.rank - 1,), (c.rank - 2,)), (batch, batch))
    return em.dot_general(c, q, ((c.rank - 1,), (q.rank - 2,)), (batch, batch))


# -- symmetric eigendecomposition ------------------------------------------------------------------------


@lowers(aten._linalg_eigh.default, promotion=Promotion.COMPUTE)
def _linalg_eigh(em: Emitter, out: tuple, x: TensorValue, UPLO: str = "L",  # noqa: N803 - torch's name
                 compute_v: bool = True) -> tuple[TensorValue, TensorValue]:
    """Eigenvalues ascending, eigenvectors in columns (each unique up to sign, as from any solver)."""
    cdt = x.dtype
    n = x.shape[-1]
    if x.numel == 0:
        return em.constant(0, out[0].dtype, tuple(out[0].shape)), em.constant(0, out[1].dtype, tuple(out[1].shape))
    if UPLO.upper() == "U":
        # The upper triangle is the transpose's lower one. XLA caches one expansion of the Eigh call per
        # operand shape whatever its configuration, so every call here reads the lower triangle.
        x = _swap_last(em, x)
    tol = 1e-6 if cdt == torch.float32 else 1e-14
    vectors, values = _custom_call("Eigh", [x], [(x.shape, cdt), (x.shape[:-2] + (n,), cdt)], config=f"1,1,100,{tol}")
    return values, vectors if compute_v else em.constant(0, out[1].dtype, tuple(out[1].shape))


# -- LU ----------------------------------------------------------------------------------------------------


def lu_factor(em: Emitter, a: TensorValue, pivot: bool = True) -> tuple[TensorValue, TensorValue, TensorValue, TensorValue]:
    """(packed LU, int32 1-based pivots, int64 row permutation, int32 info) of [..., m, n] ``a``.

    Unblocked right-looking elimination; at step k the pivot is the first largest |a[r, k]|, r >= k
    (LAPACK's choice). A zero pivot leaves its column unscaled and sets info, as getrf does.
    """
    m, n = a.shape[-2], a.shape[-1]
    k_steps = min(m, n)
    batch = a.shape[:-2]
    pivots0 = em.constant(0, torch.int32, batch + (k_steps,))
    perm0 = em.broadcast_to(em.iota((m,), 0, torch.int64), batch + (m,))
    info0 = em.constant(0, torch.int32, batch)
    if a.numel == 0 or k_steps == 0:
        return a, pivots0, perm0, info0
    rows = em.iota(a.shape, a.rank - 2, torch.int64)
    cols = em.iota(a.shape, a.rank - 1, torch.int64)
    row_ids = em.iota(batch + (m,), len(batch), torch.int64)
    step_ids = em.iota(batch + (k_steps,), len(batch), torch.int64)
    last = a.rank - 1

    def pick_row(em: Emitter, x: TensorValue, r: TensorValue) -> TensorValue:
        """x[..., r[...], :] for a per-matrix row index r."""
        hit = em.compare(rows, em.broadcast_in_dim(r, x.shape, list(range(len(batch)))), "EQ")
        return em.reduce_simple(em.select(hit, x, em.constant(0, x.dtype, x.shape)), [x.rank - 2], "sum")

    def pick_col(em: Emitter, x: TensorValue, k: TensorValue) -> TensorValue:
        hit = em.compare(cols, em.broadcast_to(k, x.shape), "EQ")
        return em.reduce_simple(em.select(hit, x, em.constant(0, x.dtype, x.shape)), [last], "sum")

    def step(em: Emitter, k: TensorValue, state: list[TensorValue]) -> list[TensorValue]:
        x, pivots, perm, info = state
        kb = em.broadcast_to(k, batch)
        column = pick_col(em, x, k)  # [..., m]
        if pivot:
            below = em.compare(row_ids, em.broadcast_to(k, row_ids.shape), "GE")
            score = em.select(below, em.unary(hlo.abs, column), em.constant(-1.0, x.dtype, column.shape))
            best = em.reduce_simple(score, [len(batch)], "max")
            is_best = em.binary(hlo.and_, below, em.compare(score, em.broadcast_in_dim(best, score.shape,
                                                                                        list(range(len(batch)))), "EQ"))
            first = em.select(is_best, row_ids, em.constant(m, torch.int64, row_ids.shape))
            p = em.reduce_simple(first, [len(batch)], "min")
            p = em.select(em.compare(p, em.constant(m, torch.int64, p.shape), "EQ"), kb, p)  # NaN column: no swap
        else:
            p = kb
        # Swap rows k and p of the matrix and of the permutation.
        row_k, row_p = pick_row(em, x, kb), pick_row(em, x, p)
        bdims = list(range(len(batch))) + [x.rank - 1]
        is_k = em.compare(rows, em.broadcast_to(k, x.shape), "EQ")
        is_p = em.compare(rows, em.broadcast_in_dim(p, x.shape, list(range(len(batch)))), "EQ")
        x = em.select(is_k, em.broadcast_in_dim(row_p, x.shape, bdims),
                      em.select(is_p, em.broadcast_in_dim(row_k, x.shape, bdims), x))
        perm_k = em.reduce_simple(em.select(em.compare(row_ids, em.broadcast_to(k, row_ids.shape), "EQ"), perm,
                                            em.constant(0, torch.int64, perm.shape)), [len(batch)], "sum")
        perm_p = em.reduce_simple(em.select(em.compare(row_ids, em.broadcast_in_dim(p, row_ids.shape,
                                                                                     list(range(len(batch)))), "EQ"),
                                            perm, em.constant(0, torch.int64, perm.shape)), [len(batch)], "sum")
        perm = em.select(em.compare(row_ids, em.broadcast_to(k, row_ids.shape), "EQ"),
                         em.broadcast_in_dim(perm_p, perm.shape, list(range(len(batch)))),
                         em.select(em.compare(row_ids, em.broadcast_in_dim(p, row_ids.shape, list(range(len(batch)))),
                                              "EQ"), em.broadcast_in_dim(perm_k, perm.shape, list(range(len(batch)))),
                                   perm))
        pivots = em.select(em.compare(step_ids, em.broadcast_to(k, step_ids.shape), "EQ"),
                           em.broadcast_in_dim(em.convert(em.add(p, em.constant(1, torch.int64, p.shape)), torch.int32),
                                               pivots.shape, list(range(len(batch)))), pivots)
        # Eliminate below the pivot.
        column = pick_col(em, x, k)
        at_k = em.compare(row_ids, em.broadcast_to(k, row_ids.shape), "EQ")
        pivot_value = em.reduce_simple(em.select(at_k, column, em.constant(0, x.dtype, column.shape)), [len(batch)], "sum")
        zero_pivot = em.compare(pivot_value, em.constant(0, x.dtype, pivot_value.shape), "EQ")
        info = em.select(em.binary(hlo.and_, zero_pivot, em.compare(info, em.constant(0, torch.int32, info.shape), "EQ")),
                         em.convert(em.add(kb, em.constant(1, torch.int64, kb.shape)), torch.int32), info)
        divisor = em.select(zero_pivot, em.constant(1, x.dtype, pivot_value.shape), pivot_value)
        below_k = em.compare(row_ids, em.broadcast_to(k, row_ids.shape), "GT")
        factors = em.select(below_k, em.div(column, em.broadcast_in_dim(divisor, column.shape, list(range(len(batch))))),
                            em.constant(0, x.dtype, column.shape))
        pivot_row = pick_row(em, x, kb)  # [..., n]
        right_of_k = em.compare(cols, em.broadcast_to(k, x.shape), "GT")
        update = em.mul(em.broadcast_in_dim(factors, x.shape, list(range(len(batch))) + [x.rank - 2]),
                        em.broadcast_in_dim(pivot_row, x.shape, bdims))
        x = em.select(right_of_k, em.sub(x, update), x)
        in_column = em.binary(hlo.and_, em.compare(cols, em.broadcast_to(k, x.shape), "EQ"),
                              em.compare(rows, em.broadcast_to(k, x.shape), "GT"))
        x = em.select(in_column, em.broadcast_in_dim(factors, x.shape, list(range(len(batch))) + [x.rank - 2]), x)
        return [x, pivots, perm, info]

    lu, pivots, perm, info = em.fori_loop(k_steps, [a, pivots0, perm0, info0], step)
    return lu, pivots, perm, info


def _unit_lower(em: Emitter, lu: TensorValue) -> TensorValue:
    """L of a packed LU: strictly lower part plus ones on the diagonal ([..., m, min(m, n)])."""
    k = min(lu.shape[-2], lu.shape[-1])
    lower = _triangle(em, _columns(em, lu, k), lower=True, diagonal=-1)
    eye = em.convert(em.compare(em.iota(lower.shape[-2:], 0, torch.int64), em.iota(lower.shape[-2:], 1, torch.int64),
                                "EQ"), lu.dtype)
    return em.add(lower, em.broadcast_to(eye, lower.shape))


def _permute_rows(em: Emitter, b: TensorValue, perm: TensorValue) -> TensorValue:
    """b[..., perm[...][i], :] for every row i (P^T b for A = P L U)."""
    index = em.broadcast_in_dim(perm, b.shape, list(range(b.rank - 1)))
    return gather_elements(em, b, b.rank - 2, index)


def lu_solve(em: Emitter, lu: TensorValue, perm: TensorValue, b: TensorValue, adjoint: bool = False) -> TensorValue:
    """A x = b (A^T x = b when ``adjoint``) for A = P L U given packed ``lu`` and the row permutation."""
    batch = tuple(torch.broadcast_shapes(lu.shape[:-2], b.shape[:-2]))
    lu = em.broadcast_to(lu, batch + lu.shape[-2:])
    b = em.broadcast_to(b, batch + b.shape[-2:])
    perm = em.broadcast_to(perm, batch + perm.shape[-1:])
    if not adjoint:
        y = _permute_rows(em, b, perm)
        y = triangular_solve(em, lu, y, lower=True, unit_diagonal=True)
        return triangular_solve(em, lu, y, lower=False)
    y = triangular_solve(em, lu, b, lower=False, transpose=True)
    y = triangular_solve(em, lu, y, lower=True, unit_diagonal=True, transpose=True)
    return _scatter_rows(em, y, perm)


def _scatter_rows(em: Emitter, y: TensorValue, perm: TensorValue) -> TensorValue:
    """x with x[..., perm[i], :] = y[..., i, :] (P y)."""
    inverse = _inverse_permutation(em, perm)
    return _permute_rows(em, y, inverse)


def _inverse_permutation(em: Emitter, perm: TensorValue) -> TensorValue:
    n = perm.shape[-1]
    hits = em.compare(em.broadcast_in_dim(perm, perm.shape + (n,), list(range(perm.rank))),
                      em.iota(perm.shape + (n,), perm.rank, torch.int64), "EQ")  # [..., i, j]: perm[i] == j
    positions = em.iota(perm.shape + (n,), perm.rank - 1, torch.int64)
    return em.reduce_simple(em.select(hits, positions, em.constant(0, torch.int64, hits.shape)), [perm.rank - 1], "sum")


def _permutation_from_pivots(em: Emitter, pivots: TensorValue, m: int) -> TensorValue:
    """The row order LAPACK's 1-based ``pivots`` describe (row swaps k <-> pivots[k]-1, in order)."""
    batch = pivots.shape[:-1]
    ids = em.iota(batch + (m,), len(batch), torch.int64)
    steps = em.iota(pivots.shape, len(batch), torch.int64)
    bdims = list(range(len(batch)))

    def swap(em: Emitter, k: TensorValue, state: list[TensorValue]) -> list[TensorValue]:
        (perm,) = state
        target = em.sub(em.convert(pivots, torch.int64), em.constant(1, torch.int64, pivots.shape))
        p = em.reduce_simple(em.select(em.compare(steps, em.broadcast_to(k, steps.shape), "EQ"), target,
                                       em.constant(0, torch.int64, target.shape)), [len(batch)], "sum")
        at_k = em.compare(ids, em.broadcast_to(k, ids.shape), "EQ")
        at_p = em.compare(ids, em.broadcast_in_dim(p, ids.shape, bdims), "EQ")
        value_k = em.reduce_simple(em.select(at_k, perm, em.constant(0, torch.int64, perm.shape)), [len(batch)], "sum")
        value_p = em.reduce_simple(em.select(at_p, perm, em.constant(0, torch.int64, perm.shape)), [len(batch)], "sum")
        perm = em.select(at_k, em.broadcast_in_dim(value_p, perm.shape, bdims),
                         em.select(at_p, em.broadcast_in_dim(value_k, perm.shape, bdims), perm))
        return [perm]

    (perm,) = em.fori_loop(pivots.shape[-1], [ids], swap)
    return perm


def _permutation_matrix(em: Emitter, perm: TensorValue, dtype: torch.dtype) -> TensorValue:
    """P with P[perm[i], i] = 1, so that A = P L U."""
    m = perm.shape[-1]
    shape = perm.shape[:-1] + (m, m)
    rows = em.iota(shape, len(shape) - 2, torch.int64)
    return em.convert(em.compare(em.broadcast_in_dim(perm, shape, list(range(perm.rank - 1)) + [len(shape) - 1]),
                                 rows, "EQ"), dtype)


def _upper(em: Emitter, lu: TensorValue) -> TensorValue:
    k = min(lu.shape[-2], lu.shape[-1])
    return _triangle(em, _rows(em, lu, k), lower=False)


@lowers(aten.linalg_lu_factor_ex.default, promotion=Promotion.COMPUTE)
def _lu_factor_ex(em: Emitter, out: tuple, a: TensorValue, *, pivot: bool = True, check_errors: bool = False) -> tuple:
    lu, pivots, _, info = lu_factor(em, a, pivot)
    return lu, pivots, info


@lowers(aten.linalg_lu.default, promotion=Promotion.COMPUTE)
def _linalg_lu(em: Emitter, out: tuple, a: TensorValue, *, pivot: bool = True) -> tuple:
    lu, _, perm, _ = lu_factor(em, a, pivot)
    p = _permutation_matrix(em, perm, out[0].dtype) if pivot else em.constant(0, out[0].dtype, tuple(out[0].shape))
    return p, _unit_lower(em, lu), _upper(em, lu)


@lowers(aten.lu_unpack.default)
def _lu_unpack(em: Emitter, out: tuple, lu: TensorValue, pivots: TensorValue, unpack_data: bool = True,
               unpack_pivots: bool = True) -> tuple:
    results = []
    if unpack_pivots:
        results.append(_permutation_matrix(em, _permutation_from_pivots(em, pivots, lu.shape[-2]), out[0].dtype))
    else:
        results.append(em.constant(0, out[0].dtype, tuple(out[0].shape)))
    if unpack_data:
        results += [em.convert(_unit_lower(em, lu), out[1].dtype), em.convert(_upper(em, lu), out[2].dtype)]
    else:
        results += [em.constant(0, o.dtype, tuple(o.shape)) for o in out[1:]]
    return tuple(results)


def _solve_sided(em: Emitter, lu: TensorValue, perm: TensorValue, b: TensorValue, left: bool,
                 adjoint: bool = False) -> TensorValue:
    """A x = b (left) or x A = b, i.e. A^T x^T = b^T."""
    if left:
        return lu_solve(em, lu, perm, b, adjoint)
    return _swap_last(em, lu_solve(em, lu, perm, _swap_last(em, b), not adjoint))


@lowers(aten.linalg_lu_solve.default)
def _linalg_lu_solve(em: Emitter, out: torch.Tensor, lu: TensorValue, pivots: TensorValue, b: TensorValue, *,
                     left: bool = True, adjoint: bool = False) -> TensorValue:
    cdt = compute_dtype(out.dtype)
    perm = _permutation_from_pivots(em, pivots, lu.shape[-2])
    return em.convert(_solve_sided(em, em.convert(lu, cdt), perm, em.convert(b, cdt), left, adjoint), out.dtype)


def _det_parts(em: Emitter, lu: TensorValue, pivots: TensorValue) -> tuple[TensorValue, TensorValue]:
    """(product of U's diagonal, the permutation's sign)."""
    diag = _diagonal(em, lu)
    product = em.reduce_simple(diag, [diag.rank - 1], "prod")
    steps = em.iota(pivots.shape, pivots.rank - 1, torch.int32)
    swaps = em.reduce_simple(em.convert(em.compare(pivots, em.add(steps, em.constant(1, torch.int32, steps.shape)), "NE"),
                                        torch.int32), [pivots.rank - 1], "sum")
    odd = em.compare(em.binary(hlo.and_, swaps, em.constant(1, torch.int32, swaps.shape)),
                     em.constant(1, torch.int32, swaps.shape), "EQ")
    sign = em.select(odd, em.constant(-1.0, lu.dtype, odd.shape), em.constant(1.0, lu.dtype, odd.shape))
    return product, sign


# torch's _linalg_det/_linalg_slogdet factor A^T for a row-major (contiguous) A, as every pjrt tensor looks
# to torch, and their backward formulas solve with that LU accordingly; det(A^T) = det(A).


@lowers(aten._linalg_det.default, promotion=Promotion.COMPUTE)
def _linalg_det(em: Emitter, out: tuple, a: TensorValue) -> tuple:
    lu, pivots, _, _ = lu_factor(em, _swap_last(em, a))
    product, sign = _det_parts(em, lu, pivots)
    return em.mul(product, sign), lu, pivots


@lowers(aten._linalg_slogdet.default, promotion=Promotion.COMPUTE)
def _linalg_slogdet(em: Emitter, out: tuple, a: TensorValue) -> tuple:
    lu, pivots, _, _ = lu_factor(em, _swap_last(em, a))
    diag = _diagonal(em, lu)
    _, sign = _det_parts(em, lu, pivots)
    signs = em.reduce_simple(em.unary(hlo.sign, diag), [diag.rank - 1], "prod")
    logabs = em.reduce_simple(em.unary(hlo.log, em.unary(hlo.abs, diag)), [diag.rank - 1], "sum")
    return em.mul(signs, sign), logabs, lu, pivots


@lowers(aten._linalg_solve_ex.default, promotion=Promotion.COMPUTE)
def _linalg_solve_ex(em: Emitter, out: tuple, a: TensorValue, b: TensorValue, *, left: bool = True,
                     check_errors: bool = False) -> tuple:
    lu, pivots, perm, info = lu_factor(em, a)
    if len(out[0].shape) == a.rank - 1:  # torch's rule: b is a (batch of) vector(s)
        b = em.reshape(b, b.shape + (1,)) if left else em.reshape(b, b.shape[:-1] + (1, b.shape[-1]))
    result = _solve_sided(em, lu, perm, b, left)
    return em.reshape(result, tuple(out[0].shape)), lu, pivots, info


@lowers(aten.linalg_inv_ex.default, promotion=Promotion.COMPUTE)
def _linalg_inv_ex(em: Emitter, out: tuple, a: TensorValue, *, check_errors: bool = False) -> tuple:
    lu, _, perm, info = lu_factor(em, a)
    return lu_solve(em, lu, perm, _eye(em, a.shape[-1], a.dtype, a.shape[:-2])), info
