"""Lowerings of elementwise ATen ops: arithmetic, unary math, comparisons, where, casts.

Type rules follow torch: the node's output dtype decides the arithmetic dtype (half types
compute in float32 and round once at the end, as torch does on the CPU). The promotion and
broadcasting are the table's (``_promotion``); a rule here says only what its op computes.
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
from ._promotion import Promotion, compute_dtype, is_number, make_pointwise, promoting
from ._table import lowers, pointwise

aten = torch.ops.aten
prims = torch.ops.prims


# -- arithmetic --------------------------------------------------------------------------


def _times_alpha(em: Emitter, b: TensorValue, alpha: Any) -> TensorValue:
    return b if alpha == 1 else em.mul(b, em.constant(alpha, b.dtype, b.shape))


@pointwise(aten.add.Tensor, aten.add.Scalar)
def add(em: Emitter, a: TensorValue, b: TensorValue, *, alpha: Any = 1) -> TensorValue:
    return em.add(a, _times_alpha(em, b, alpha))


@pointwise(aten.sub.Tensor, aten.sub.Scalar)
def sub(em: Emitter, a: TensorValue, b: TensorValue, *, alpha: Any = 1) -> TensorValue:
    return em.sub(a, _times_alpha(em, b, alpha))


@pointwise(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(em: Emitter, a: TensorValue, b: TensorValue, *, alpha: Any = 1) -> TensorValue:
    return sub(em, b, a, alpha=alpha)


@pointwise(aten.mul.Tensor, aten.mul.Scalar)
def mul(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    return em.binary(hlo.and_, a, b) if a.dtype == torch.bool else em.mul(a, b)


def floor_divide_int(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """Integer division rounding toward negative infinity (Python's ``//``)."""
    q = em.div(a, b)  # truncates toward zero
    r = em.binary(hlo.remainder, a, b)
    zero = em.constant(0, a.dtype, q.shape)
    inexact = em.compare(r, zero, "NE")
    signs_differ = em.compare(em.compare(a, zero, "LT"), em.compare(b, zero, "LT"), "NE")
    adjust = em.binary(hlo.and_, inexact, signs_differ)
    return em.select(adjust, em.sub(q, em.constant(1, a.dtype, q.shape)), q)


@pointwise(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(em: Emitter, a: TensorValue, b: TensorValue, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return em.div(a, b)
    if a.dtype.is_floating_point:
        q = em.div(a, b)
        return em.floor(q) if rounding_mode == "floor" else em.trunc(q)
    if rounding_mode == "trunc":
        return em.div(a, b)
    if rounding_mode == "floor":
        return floor_divide_int(em, a, b)
    raise LoweringError(f"div: unknown rounding_mode {rounding_mode!r}")


@pointwise(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    return div(em, a, b, rounding_mode="floor")


@pointwise(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """Python-style modulo: the result takes the sign of the divisor."""
    r = em.binary(hlo.remainder, a, b)
    zero = em.constant(0, a.dtype, r.shape)
    nonzero = em.compare(r, zero, "NE")
    signs_differ = em.compare(em.compare(r, zero, "LT"), em.compare(b, zero, "LT"), "NE")
    fix = em.binary(hlo.and_, nonzero, signs_differ)
    return em.select(fix, em.add(r, b), r)


def _binary(hlo_op: Any) -> Any:
    """``hlo_op`` on two operands of one dtype and shape."""

    def binary(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
        return em.binary(hlo_op, a, b)

    binary.__qualname__ = f"binary({hlo_op.__name__})"
    return binary


def _unary(hlo_op: Any) -> Any:
    def unary(em: Emitter, x: TensorValue) -> TensorValue:
        return em.unary(hlo_op, x)

    unary.__qualname__ = f"unary({hlo_op.__name__})"
    return unary


_power = promoting(make_pointwise(_binary(hlo.power)), Promotion.COMPUTE, broadcast=True)


def _power_shortcut(a: Operand, b: Operand, dtype: torch.dtype) -> Any:
    """``x -> x ** b`` without ``stablehlo.power`` for a number ``b`` of 1, 2 or 3 (products), or 0.5 or -1 in
    floating point (sqrt, reciprocal); None for other exponents."""
    if not isinstance(a, TensorValue) or not is_number(b) or isinstance(b, bool):
        return None
    if b == 1:
        return lambda em, x: x
    if b == 2:
        return lambda em, x: em.mul(x, x)
    if b == 3:
        return lambda em, x: em.mul(em.mul(x, x), x)
    if b == 0.5 and dtype.is_floating_point:
        return lambda em, x: em.unary(hlo.sqrt, x)
    if b == -1 and dtype.is_floating_point:
        return lambda em, x: em.div(em.constant(1.0, x.dtype, x.shape), x)
    return None


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    shortcut = _power_shortcut(a, b, compute_dtype(out.dtype))
    if shortcut is not None:
        return promoting(make_pointwise(shortcut), Promotion.COMPUTE, broadcast=True)(em, out, a)
    return _power(em, out, a, b)


pointwise(aten.maximum.default)(Emitter.maximum)
pointwise(aten.minimum.default)(Emitter.minimum)
pointwise(aten.atan2.default)(_binary(hlo.atan2))
pointwise(aten.fmod.Tensor, aten.fmod.Scalar)(_binary(hlo.remainder))  # the sign of a

# Bit operations: the result's dtype (integers or bool), nothing to widen.
for _ops, _hlo_op in [
    ((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), hlo.and_),
    ((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), hlo.or_),
    ((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), hlo.xor),
]:
    pointwise(*_ops, promotion=Promotion.RESULT)(_binary(_hlo_op))


@pointwise(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
           aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar,
           prims.shift_left.default, promotion=Promotion.RESULT)
def shift_left(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """Shifts by amounts outside [0, bits) give 0 (left) or the sign fill (right), in torch and StableHLO alike."""
    return em.binary(hlo.shift_left, a, b)


@pointwise(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
           aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar,
           prims.shift_right_arithmetic.default, promotion=Promotion.RESULT)
def shift_right(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    logical = is_unsigned(a.dtype) or a.dtype == torch.bool
    return em.binary(hlo.shift_right_logical if logical else hlo.shift_right_arithmetic, a, b)


pointwise(aten.logical_and.default, promotion=Promotion.BOOL)(_binary(hlo.and_))
pointwise(aten.logical_or.default, promotion=Promotion.BOOL)(_binary(hlo.or_))
pointwise(aten.logical_xor.default, promotion=Promotion.BOOL)(_binary(hlo.xor))
pointwise(aten.logical_not.default, promotion=Promotion.BOOL)(_unary(hlo.not_))


@lowers(aten.bitwise_not.default)
def _bitwise_not(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return em.unary(hlo.not_, x)


# -- comparisons ---------------------------------------------------------------------------


def _comparison(direction: str) -> Any:
    def compare(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
        return em.compare(a, b, direction)

    compare.__qualname__ = f"compare({direction})"
    return compare


for _name, _direction in {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}.items():
    _packet = getattr(aten, _name)
    pointwise(_packet.Tensor, _packet.Scalar, promotion=Promotion.OPERANDS)(_comparison(_direction))


@lowers(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(em: Emitter, out: torch.Tensor, cond: TensorValue, a: Operand, b: Operand) -> TensorValue:
    shape = tuple(out.shape)
    pred = em.broadcast_to(em.convert(cond, torch.bool), shape)
    return em.select(pred, em.as_tensor(a, out.dtype, shape), em.as_tensor(b, out.dtype, shape))


@pointwise(aten.clamp.default, aten.clamp.Tensor)
def clamp(em: Emitter, x: TensorValue, min: TensorValue | None = None, max: TensorValue | None = None) -> TensorValue:
    if min is not None:
        x = em.maximum(x, min)
    if max is not None:
        x = em.minimum(x, max)
    return x


@pointwise(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(em: Emitter, x: TensorValue, min: TensorValue) -> TensorValue:
    return clamp(em, x, min, None)


@pointwise(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(em: Emitter, x: TensorValue, max: TensorValue) -> TensorValue:
    return clamp(em, x, None, max)


# -- unary math ----------------------------------------------------------------------------

#: Float functions (integer inputs are promoted to the result's float dtype first).
for _op, _function in {
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
}.items():
    pointwise(_op)(_unary(_function))


def _rounding(function: Any) -> Any:
    """ceil, floor, round: torch keeps an integer tensor as it is (same dtype), and rounds floats."""
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
        return x if not x.dtype.is_floating_point else em.unary(function, x)

    return lower


for _op, _function in {
    aten.ceil.default: hlo.ceil,
    aten.floor.default: hlo.floor,
    aten.round.default: hlo.round_nearest_even,
}.items():
    lowers(_op)(_rounding(_function))


def _log_base(base: float) -> Any:
    def log(em: Emitter, x: TensorValue) -> TensorValue:
        return em.div(em.unary(hlo.log, x), em.constant(math.log(base), x.dtype, x.shape))

    return log


pointwise(aten.log2.default)(_log_base(2.0))
pointwise(aten.log10.default)(_log_base(10.0))


@pointwise(aten.exp2.default)
def exp2(em: Emitter, x: TensorValue) -> TensorValue:
    return em.binary(hlo.power, em.constant(2.0, x.dtype, x.shape), x)


@pointwise(aten.reciprocal.default)
def reciprocal(em: Emitter, x: TensorValue) -> TensorValue:
    return em.div(em.constant(1.0, x.dtype, x.shape), x)


@lowers(aten.trunc.default)
def _trunc(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    return x if not x.dtype.is_floating_point else em.trunc(x)


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


__all__ = ["add", "clamp", "div", "exp2", "floor_divide", "floor_divide_int", "mul", "reciprocal", "remainder", "rsub",
           "shift_left", "shift_right", "sub"]
