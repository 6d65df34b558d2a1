"""Lowerings of random ops (rand, randn, randint, random_, bernoulli, dropout, uniform, normal).

Every random op draws bits from ``stablehlo.rng_bit_generator`` with the active plugin's
``rng_default()`` algorithm, from its own row of the module's RNG keys (drawn
from the device RNG state when the op was recorded; see ``Emitter.random_bits``). Torch's
``generator=`` argument is refused before a lowering runs (``refuse_generator``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxlib.mlir.dialects import chlo

from ...errors import UnsupportedOpError
from ._emitter import Emitter, TensorValue
from ._table import lowers

aten = torch.ops.aten


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def uniform(em: Emitter, shape: Sequence[int], dtype: torch.dtype, low: float = 0.0, high: float = 1.0) -> TensorValue:
    fdt = _float_dtype(dtype)
    u = em.uniform(shape, fdt)
    if low != 0.0 or high != 1.0:
        u = em.add(em.mul(u, em.constant(high - low, fdt, u.shape)), em.constant(low, fdt, u.shape))
    return em.convert(u, dtype)


def normal(em: Emitter, shape: Sequence[int], dtype: torch.dtype, mean: float = 0.0, std: float = 1.0) -> TensorValue:
    """Standard normals by inverting the CDF: sqrt(2) * erfinv(u) with u uniform in (-1, 1)."""
    fdt = _float_dtype(dtype)
    u = em.uniform(shape, fdt)
    lo = float(np.nextafter(np.array(-1.0, dtype=np.float64 if fdt == torch.float64 else np.float32), 0))
    v = em.add(em.mul(u, em.constant(1.0 - lo, fdt, u.shape)), em.constant(lo, fdt, u.shape))
    v = em.maximum(v, em.constant(lo, fdt, u.shape))
    n = em.mul(em.unary(chlo.erf_inv, v), em.constant(math.sqrt(2.0), fdt, u.shape))
    if std != 1.0:
        n = em.mul(n, em.constant(std, fdt, n.shape))
    if mean != 0.0:
        n = em.add(n, em.constant(mean, fdt, n.shape))
    return em.convert(n, dtype)


@lowers(aten.rand.default, aten.rand_like.default, random=True)
def _rand(em: Emitter, out: torch.Tensor, *args: Any, **kwargs: Any) -> TensorValue:
    return uniform(em, tuple(out.shape), out.dtype)


@lowers(aten.randn.default, aten.randn_like.default, random=True)
def _randn(em: Emitter, out: torch.Tensor, *args: Any, **kwargs: Any) -> TensorValue:
    return normal(em, tuple(out.shape), out.dtype)


@lowers(aten.uniform.default, random=True)
def _uniform(em: Emitter, out: torch.Tensor, x: TensorValue, low: float = 0.0, high: float = 1.0,
             **kwargs: Any) -> TensorValue:
    return uniform(em, tuple(out.shape), out.dtype, float(low), float(high))


@lowers(aten.normal_functional.default, random=True)
def _normal(em: Emitter, out: torch.Tensor, x: TensorValue, mean: float = 0.0, std: float = 1.0,
            **kwargs: Any) -> TensorValue:
    return normal(em, tuple(out.shape), out.dtype, float(mean), float(std))


def _randint(em: Emitter, out: torch.Tensor, low: int, high: int) -> TensorValue:
    u = em.uniform(tuple(out.shape), torch.float64)
    span = em.constant(float(high - low), torch.float64, u.shape)
    r = em.floor(em.mul(u, span))
    r = em.add(em.convert(r, torch.int64), em.constant(int(low), torch.int64, u.shape))
    return em.convert(r, out.dtype)


@lowers(aten.randint.default, random=True)
def _randint_default(em: Emitter, out: torch.Tensor, high: int, size: Any, **kwargs: Any) -> TensorValue:
    return _randint(em, out, 0, high)


@lowers(aten.randint.low, random=True)
def _randint_low(em: Emitter, out: torch.Tensor, low: int, high: int, size: Any, **kwargs: Any) -> TensorValue:
    return _randint(em, out, low, high)


@lowers(getattr(aten.random, "from"), random=True)
def _random_from(em: Emitter, out: torch.Tensor, x: TensorValue, low: int, high: int | None = None,
                 **kwargs: Any) -> TensorValue:
    if high is None:
        raise UnsupportedOpError("aten.random.from", "random_(from, None) (up to the dtype's maximum) is not "
                                 "supported on the pjrt device; give an upper bound, as torch.randint does")
    return _randint(em, out, low, high)


@lowers(aten.random.to, random=True)
def _random_to(em: Emitter, out: torch.Tensor, x: TensorValue, high: int, **kwargs: Any) -> TensorValue:
    return _randint(em, out, 0, high)


def bernoulli_mask(em: Emitter, shape: Sequence[int], p: Any) -> TensorValue:
    """bool mask, true with probability ``p`` (a number or a tensor of probabilities)."""
    fdt = _float_dtype(p.dtype) if isinstance(p, TensorValue) else torch.float32
    u = em.uniform(shape, fdt)
    return em.compare(u, em.as_tensor(p, fdt, tuple(shape)), "LT")


@lowers(aten.bernoulli.p, random=True)
def _bernoulli_p(em: Emitter, out: torch.Tensor, x: TensorValue, p: float = 0.5, **kwargs: Any) -> TensorValue:
    return em.convert(bernoulli_mask(em, tuple(out.shape), p), out.dtype)


@lowers(aten.bernoulli.default, random=True)
def _bernoulli(em: Emitter, out: torch.Tensor, x: TensorValue, **kwargs: Any) -> TensorValue:
    return em.convert(bernoulli_mask(em, tuple(out.shape), x), out.dtype)


@lowers(aten.native_dropout.default, random=True)
def _native_dropout(em: Emitter, out: tuple, x: TensorValue, p: float, train: bool | None) -> tuple[TensorValue, TensorValue]:
    if train is False or p == 0:
        return x, em.constant(True, torch.bool, x.shape)
    keep = bernoulli_mask(em, x.shape, 1.0 - p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    y = em.select(keep, em.mul(x, em.constant(scale, x.dtype, x.shape)), em.constant(0, x.dtype, x.shape))
    return y, keep
