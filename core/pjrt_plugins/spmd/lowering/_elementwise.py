"""Lowerings of elementwise ATen ops: arithmetic, unary math, comparisons, where, casts.

Type rules follow torch: the node's output dtype decides the arithmetic dtype (half
types compute in float32 and round once at the end, as torch does on the CPU).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxlib.mlir.dialects import chlo
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import LoweringError
from ._emitter import Emitter, Operand, TensorValue
from ._mlir import is_unsigned
from ._table import lowers

aten = torch.ops.aten
prims = torch.ops.prims


def _meta(x: Operand) -> torch.Tensor | bool | int | float:
    if isinstance(x, TensorValue):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def promoted_dtype(*xs: Operand) -> torch.dtype:
    """torch's result type of the operands (tensors and Python numbers)."""
    metas = [_meta(x) for x in xs]
    if len(metas) == 1:
        m = metas[0]
        return m.dtype if isinstance(m, torch.Tensor) else torch.result_type(torch.empty((), device="meta"), m)
    dtype = torch.result_type(metas[0], metas[1])
    for m in metas[2:]:
        dtype = torch.result_type(torch.empty((), dtype=dtype, device="meta"), m)
    return dtype


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: float32 for the half types, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _operands(em: Emitter, out: torch.Tensor, xs: tuple[Operand, ...], dtype: torch.dtype) -> list[TensorValue]:
    shape = tuple(out.shape)
    return [em.as_tensor(x, dtype, shape) for x in xs]


def _arith(em: Emitter, out: torch.Tensor, fn: Any, *xs: Operand) -> TensorValue:
    cdt = compute_dtype(out.dtype)
    ops = _operands(em, out, xs, cdt)
    result = fn(em, *ops)
    return em.convert(result, out.dtype)


# -- arithmetic --------------------------------------------------------------------------


def _with_alpha(combine: Any) -> Any:
    """``combine(a, alpha * b)``, torch's add/sub."""

    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand, *, alpha: Any = 1) -> TensorValue:
        def fn(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
            if alpha != 1:
                b = em.mul(b, em.constant(alpha, b.dtype, b.shape))
            return combine(em, a, b)

        return _arith(em, out, fn, a, b)

    return lower


lowers(aten.add.Tensor, aten.add.Scalar)(_with_alpha(Emitter.add))
_sub = lowers(aten.sub.Tensor, aten.sub.Scalar)(_with_alpha(Emitter.sub))


@lowers(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(em: Emitter, out: torch.Tensor, a: Operand, b: Operand, *, alpha: Any = 1) -> TensorValue:
    return _sub(em, out, b, a, alpha=alpha)


@lowers(aten.mul.Tensor, aten.mul.Scalar)
def _mul(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    if out.dtype == torch.bool:
        ops = _operands(em, out, (a, b), torch.bool)
        return em.binary(hlo.and_, *ops)
    return _arith(em, out, Emitter.mul, a, b)


def floor_divide_int(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """Integer division rounding toward negative infinity (Python's ``//``)."""
    q = em.div(a, b)  # truncates toward zero
    r = em.binary(hlo.remainder, a, b)
    zero = em.constant(0, a.dtype, q.shape)
    inexact = em.compare(r, zero, "NE")
    signs_differ = em.compare(em.compare(a, zero, "LT"), em.compare(b, zero, "LT"), "NE")
    adjust = em.binary(hlo.and_, inexact, signs_differ)
    return em.select(adjust, em.sub(q, em.constant(1, a.dtype, q.shape)), q)


@lowers(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(em: Emitter, out: torch.Tensor, a: Operand, b: Operand, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return _arith(em, out, Emitter.div, a, b)
    cdt = compute_dtype(out.dtype)
    ta, tb = _operands(em, out, (a, b), cdt)
    if cdt.is_floating_point:
        q = em.div(ta, tb)
        q = em.floor(q) if rounding_mode == "floor" else em.trunc(q)
    elif rounding_mode == "trunc":
        q = em.div(ta, tb)
    elif rounding_mode == "floor":
        q = floor_divide_int(em, ta, tb)
    else:
        raise LoweringError(f"div: unknown rounding_mode {rounding_mode!r}")
    return em.convert(q, out.dtype)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    return _div(em, out, a, b, rounding_mode="floor")


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    """Python-style modulo: the result takes the sign of the divisor."""

    def fn(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
        r = em.binary(hlo.remainder, a, b)
        zero = em.constant(0, a.dtype, r.shape)
        nonzero = em.compare(r, zero, "NE")
        signs_differ = em.compare(em.compare(r, zero, "LT"), em.compare(b, zero, "LT"), "NE")
        fix = em.binary(hlo.and_, nonzero, signs_differ)
        return em.select(fix, em.add(r, b), r)

    return _arith(em, out, fn, a, b)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, TensorValue):
        cdt = compute_dtype(out.dtype)
        x = em.as_tensor(a, cdt, tuple(out.shape))
        if b == 1:
            return em.convert(x, out.dtype)
        if b == 2:
            return em.convert(em.mul(x, x), out.dtype)
        if b == 3:
            return em.convert(em.mul(em.mul(x, x), x), out.dtype)
        if b == 0.5 and cdt.is_floating_point:
            return em.convert(em.unary(hlo.sqrt, x), out.dtype)
        if b == -1 and cdt.is_floating_point:
            return em.convert(em.div(em.constant(1.0, cdt, x.shape), x), out.dtype)
    return _arith(em, out, lambda em, a, b: em.binary(hlo.power, a, b), a, b)


def _binary(fn: Any) -> Any:
    """``fn(em, a, b)`` in the compute dtype (see :func:`_arith`)."""

    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
        return _arith(em, out, fn, a, b)

    return lower


lowers(aten.maximum.default)(_binary(Emitter.maximum))
lowers(aten.minimum.default)(_binary(Emitter.minimum))
lowers(aten.atan2.default)(_binary(lambda em, a, b: em.binary(hlo.atan2, a, b)))
lowers(aten.fmod.Tensor, aten.fmod.Scalar)(_binary(lambda em, a, b: em.binary(hlo.remainder, a, b)))  # sign of a


def _bitwise(fn: Any) -> Any:
    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
        ops = _operands(em, out, (a, b), out.dtype)
        return em.binary(fn, *ops)

    return lower


lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)(_bitwise(hlo.and_))
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)(_bitwise(hlo.or_))
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)(_bitwise(hlo.xor))


def _shift(left: bool) -> Any:
    """Shifts by amounts outside [0, bits) give 0 (left) or the sign fill (right), in torch and StableHLO alike."""

    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
        ta, tb = _operands(em, out, (a, b), out.dtype)
        if left:
            fn = hlo.shift_left
        else:
            fn = hlo.shift_right_logical if is_unsigned(out.dtype) or out.dtype == torch.bool else hlo.shift_right_arithmetic
        return em.binary(fn, ta, tb)

    return lower


lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor,
       aten.__lshift__.Tensor, aten.__lshift__.Scalar, prims.shift_left.default)(_shift(True))
lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor,
       aten.__rshift__.Tensor, aten.__rshift__.Scalar, prims.shift_right_arithmetic.default)(_shift(False))


def _logical(fn: Any) -> Any:
    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
        ops = _operands(em, out, (a, b), torch.bool)
        return em.convert(em.binary(fn, *ops), out.dtype)

    return lower


lowers(aten.logical_and.default)(_logical(hlo.and_))
lowers(aten.logical_or.default)(_logical(hlo.or_))
lowers(aten.logical_xor.default)(_logical(hlo.xor))


@lowers(aten.logical_not.default)
def _logical_not(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.convert(em.unary(hlo.not_, em.convert(x, torch.bool)), out.dtype)


@lowers(aten.bitwise_not.default)
def _bitwise_not(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.unary(hlo.not_, x)


# -- comparisons ---------------------------------------------------------------------------

_COMPARISONS = {
    "eq": "EQ",
    "ne": "NE",
    "lt": "LT",
    "le": "LE",
    "gt": "GT",
    "ge": "GE",
}


def _comparison(direction: str) -> Any:
    def lower(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
        dtype = promoted_dtype(a, b)
        shape = tuple(out.shape)
        return em.compare(em.as_tensor(a, dtype, shape), em.as_tensor(b, dtype, shape), direction)

    return lower


for _name, _direction in _COMPARISONS.items():
    _packet = getattr(aten, _name)
    lowers(_packet.Tensor, _packet.Scalar)(_comparison(_direction))


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(em: Emitter, out: torch.Tensor, cond: TensorValue, a: Operand, b: Operand) -> TensorValue:
    shape = tuple(out.shape)
    pred = em.broadcast_to(em.convert(cond, torch.bool), shape)
    return em.select(pred, em.as_tensor(a, out.dtype, shape), em.as_tensor(b, out.dtype, shape))


@lowers(aten.clamp.default, aten.clamp.Tensor)
def _clamp(em: Emitter, out: torch.Tensor, x: TensorValue, min: Operand | None = None, max: Operand | None = None) -> TensorValue:
    cdt = compute_dtype(out.dtype)
    shape = tuple(out.shape)
    y = em.as_tensor(x, cdt, shape)
    if min is not None:
        y = em.maximum(y, em.as_tensor(min, cdt, shape))
    if max is not None:
        y = em.minimum(y, em.as_tensor(max, cdt, shape))
    return em.convert(y, out.dtype)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(em: Emitter, out: torch.Tensor, x: TensorValue, min: Operand) -> TensorValue:
    return _clamp(em, out, x, min, None)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(em: Emitter, out: torch.Tensor, x: TensorValue, max: Operand) -> TensorValue:
    return _clamp(em, out, x, None, max)


# -- unary math ----------------------------------------------------------------------------


def _float_unary(fn: Any) -> Any:
    """A float function; integer inputs are promoted to the output's float dtype first."""

    def lower(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
        cdt = compute_dtype(out.dtype)
        return em.convert(em.unary(fn, em.convert(x, cdt)), out.dtype)

    return lower


_FLOAT_UNARY = {
    aten.exp.default: hlo.exponential,
    aten.expm1.default: hlo.exponential_minus_one,
    aten.log.default: hlo.log,
    aten.log1p.default: hlo.log_plus_one,
    aten.sqrt.default: hlo.sqrt,
    aten.rsqrt.default: hlo.rsqrt,
    aten.sin.default: hlo.sine,
    aten.cos.default: hlo.cosine,
    aten.tan.default: hlo.tan,
    aten.tanh.default: hlo.tanh,
    aten.sigmoid.default: hlo.logistic,
    aten.erf.default: chlo.erf,
    aten.erfinv.default: chlo.erf_inv,
    aten.asin.default: chlo.asin,
    aten.acos.default: chlo.acos,
    aten.atan.default: chlo.atan,
    aten.sinh.default: chlo.sinh,
    aten.cosh.default: chlo.cosh,
    aten.asinh.default: chlo.asinh,
    aten.acosh.default: chlo.acosh,
    aten.atanh.default: chlo.atanh,
    aten.lgamma.default: chlo.lgamma,
    aten.ceil.default: hlo.ceil,
    aten.floor.default: hlo.floor,
    aten.round.default: hlo.round_nearest_even,
}
for _op, _fn in _FLOAT_UNARY.items():
    lowers(_op)(_float_unary(_fn))


def _log_base(base: float) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
        cdt = compute_dtype(out.dtype)
        y = em.unary(hlo.log, em.convert(x, cdt))
        return em.convert(em.div(y, em.constant(math.log(base), cdt, y.shape)), out.dtype)

    return lower


lowers(aten.log2.default)(_log_base(2.0))
lowers(aten.log10.default)(_log_base(10.0))


@lowers(aten.exp2.default)
def _exp2(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    cdt = compute_dtype(out.dtype)
    y = em.convert(x, cdt)
    return em.convert(em.binary(hlo.power, em.constant(2.0, cdt, y.shape), y), out.dtype)


@lowers(aten.trunc.default)
def _trunc(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return x if not x.dtype.is_floating_point else em.trunc(x)


@lowers(aten.reciprocal.default)
def _reciprocal(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    cdt = compute_dtype(out.dtype)
    y = em.convert(x, cdt)
    return em.convert(em.div(em.constant(1.0, cdt, y.shape), y), out.dtype)


@lowers(aten.neg.default)
def _neg(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.unary(hlo.negate, x)


@lowers(aten.abs.default)
def _abs(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    if x.dtype == torch.bool or not (x.dtype.is_signed or x.dtype.is_floating_point):
        return x
    return em.unary(hlo.abs, x)


@lowers(aten.sign.default, aten.sgn.default)
def _sign(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    if x.dtype == torch.bool:
        return x
    return em.unary(hlo.sign, x)


@lowers(aten.relu.default)
def _relu(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.maximum(x, em.constant(0, x.dtype, x.shape))


@lowers(aten.isnan.default)
def _isnan(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    if not x.dtype.is_floating_point:
        return em.constant(False, torch.bool, x.shape)
    return em.compare(x, x, "NE")


@lowers(aten.isinf.default)
def _isinf(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    if not x.dtype.is_floating_point:
        return em.constant(False, torch.bool, x.shape)
    return em.compare(em.unary(hlo.abs, x), em.constant(float("inf"), x.dtype, x.shape), "EQ")


@lowers(aten.isfinite.default)
def _isfinite(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    if not x.dtype.is_floating_point:
        return em.constant(True, torch.bool, x.shape)
    return TensorValue(hlo.is_finite(x.value), x.shape, torch.bool)


@lowers(aten.nan_to_num.default)
def _nan_to_num(em: Emitter, out: torch.Tensor, x: TensorValue, nan: float | None = None,
                posinf: float | None = None, neginf: float | None = None) -> TensorValue:
    if not x.dtype.is_floating_point:
        return x
    shape = x.shape
    y = em.select(em.compare(x, x, "NE"), em.constant(0.0 if nan is None else nan, x.dtype, shape), x)
    hi = float(torch.finfo(x.dtype).max) if posinf is None else posinf
    lo = float(torch.finfo(x.dtype).min) if neginf is None else neginf
    y = em.select(em.compare(y, em.constant(float("inf"), x.dtype, shape), "EQ"), em.constant(hi, x.dtype, shape), y)
    return em.select(em.compare(y, em.constant(float("-inf"), x.dtype, shape), "EQ"), em.constant(lo, x.dtype, shape), y)


# -- dtype conversion and copies ---------------------------------------------------------------


@lowers(aten._to_copy.default)
def _to_copy(em: Emitter, out: torch.Tensor, x: TensorValue, **kwargs: Any) -> TensorValue:
    return em.convert(x, out.dtype)


@lowers(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default,
        aten.lift_fresh.default, aten.contiguous.default)
def _identity(em: Emitter, out: torch.Tensor, x: TensorValue, *args: Any, **kwargs: Any) -> TensorValue:
    return x


@lowers(aten.copy.default)
def _copy(em: Emitter, out: torch.Tensor, dst: TensorValue, src: TensorValue, non_blocking: bool = False) -> TensorValue:
    return em.as_tensor(src, dst.dtype, dst.shape)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(em: Emitter, out: torch.Tensor, x: TensorValue, mask: TensorValue, value: Operand) -> TensorValue:
    shape = tuple(out.shape)
    return em.select(em.broadcast_to(mask, shape), em.as_tensor(value, out.dtype, shape), em.broadcast_to(x, shape))


__all__ = ["compute_dtype", "floor_divide_int", "promoted_dtype"]
