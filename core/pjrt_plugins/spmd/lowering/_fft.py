"""Lowerings of torch's FFT primitives (``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``) to stablehlo.fft.

Every ``torch.fft`` function reaches one of these three. Each transformed dimension is moved last
and transformed alone (a multi-dimensional DFT is separable). XLA's inverse transforms divide by
the length; torch's ``normalization`` (0: none, 1: 1/sqrt(n), 2: 1/n, n the signal's element count)
is applied to the unnormalized transform instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._mlir import tensor_type
from ._table import COMPLEX_LOWERINGS, lowers

aten = torch.ops.aten

_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX_OF = {v: k for k, v in _REAL_OF.items()}


def _fft_last(em: Emitter, x: TensorValue, dim: int, kind: str, length: int, dtype: torch.dtype) -> TensorValue:
    """A 1-D transform of ``kind`` (FFT, IFFT, RFFT, IRFFT) along ``dim``, giving ``dtype``."""
    perm = [d for d in range(x.rank) if d != dim] + [dim]
    moved = em.transpose(x, perm) if dim != x.rank - 1 else x
    shape = list(moved.shape)
    shape[-1] = length // 2 + 1 if kind == "RFFT" else length
    result = hlo.fft(moved.value, hlo.FftTypeAttr.get(kind), [length], results=[tensor_type(shape, dtype)])
    out = TensorValue(result, tuple(shape), dtype)
    if dim == x.rank - 1:
        return out
    inverse = [perm.index(d) for d in range(x.rank)]
    return em.transpose(out, inverse)


def _to_complex(em: Emitter, x: TensorValue) -> TensorValue:
    zero = em.constant(0.0, x.dtype, x.shape)
    dtype = _COMPLEX_OF[x.dtype]
    return TensorValue(hlo.complex(x.value, zero.value), x.shape, dtype)


def _scale(em: Emitter, x: TensorValue, factor: float) -> TensorValue:
    """``x`` times a real ``factor`` (complex constants are not emitted: the factor is made complex here)."""
    if factor == 1.0:
        return x
    if not x.dtype.is_complex:
        return em.mul(x, em.constant(factor, x.dtype, x.shape))
    return em.mul(x, _to_complex(em, em.constant(factor, _REAL_OF[x.dtype], x.shape)))


def _norm_factor(normalization: int, n: int) -> float:
    return {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[int(normalization)]


def _dims(x: TensorValue, dim: Sequence[int]) -> list[int]:
    return [int(d) % x.rank for d in dim]


@lowers(aten._fft_r2c.default)
def _fft_r2c(em: Emitter, out: torch.Tensor, x: TensorValue, dim: Sequence[int], normalization: int,
             onesided: bool) -> TensorValue:
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    x = em.convert(x, _REAL_OF[out.dtype])
    if onesided:
        y = _fft_last(em, x, dims[-1], "RFFT", x.shape[dims[-1]], out.dtype)
        rest = dims[:-1]
    else:
        y, rest = _to_complex(em, x), dims
    for d in rest:
        y = _fft_last(em, y, d, "FFT", y.shape[d], out.dtype)
    return _scale(em, y, _norm_factor(normalization, n))


@lowers(aten._fft_c2c.default)
def _fft_c2c(em: Emitter, out: torch.Tensor, x: TensorValue, dim: Sequence[int], normalization: int,
             forward: bool) -> TensorValue:
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    y = em.convert(x, out.dtype)
    for d in dims:
        y = _fft_last(em, y, d, "FFT" if forward else "IFFT", y.shape[d], out.dtype)
    factor = _norm_factor(normalization, n) * (1.0 if forward else n)  # IFFT divided by n already
    return _scale(em, y, factor)


@lowers(aten._fft_c2r.default)
def _fft_c2r(em: Emitter, out: torch.Tensor, x: TensorValue, dim: Sequence[int], normalization: int,
             last_dim_size: int) -> TensorValue:
    dims = _dims(x, dim)
    last = int(last_dim_size)
    y = x
    for d in dims[:-1]:
        y = _fft_last(em, y, d, "IFFT", y.shape[d], x.dtype)
    # IRFFT reads length // 2 + 1 input elements: torch's irfft gives exactly that many.
    y = _fft_last(em, y, dims[-1], "IRFFT", last, out.dtype)
    n = math.prod(x.shape[d] for d in dims[:-1]) * last
    return _scale(em, y, _norm_factor(normalization, n) * n)  # the inverses divided by n already


COMPLEX_LOWERINGS.update({aten._fft_r2c.default, aten._fft_c2c.default, aten._fft_c2r.default})
