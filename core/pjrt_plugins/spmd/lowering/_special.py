"""Lowerings of special functions (erfc, erfcx, ndtri, log_ndtr, modified Bessel I0/I1, zeta, polygamma,
nextafter, hypot, fmax/fmin, signbit, frexp, cbrt) and of the ``prims.*`` ops torch's reference
decompositions produce, most of which are an ATen op already lowered under another name.

Functions without a StableHLO/CHLO op are series evaluated in float64 (textbook expansions,
Abramowitz & Stegun 9.6.10 and 9.7.1 for the Bessel functions) and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from jaxlib.mlir.dialects import chlo
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, Operand, TensorValue
from ._promotion import Promotion
from ._table import LOWERINGS, lowers, pointwise

aten = torch.ops.aten
prims = torch.ops.prims


def _c(em: Emitter, value: float, like: TensorValue) -> TensorValue:
    return em.constant(value, like.dtype, like.shape)


def _isnan(em: Emitter, x: TensorValue) -> TensorValue:
    return em.compare(x, x, "NE")


# -- error functions ------------------------------------------------------------------------------


def erfc(em: Emitter, x: TensorValue) -> TensorValue:
    return em.unary(chlo.erfc, x)


def erfcx(em: Emitter, x: TensorValue) -> TensorValue:
    """exp(x^2) erfc(x) in float64: direct below 25, the asymptotic series above (erfc underflows there)."""
    direct = em.mul(em.unary(hlo.exponential, em.mul(x, x)), erfc(em, x))
    big = em.maximum(x, _c(em, 25.0, x))
    inv2 = em.div(_c(em, 1.0, x), em.mul(em.mul(big, big), _c(em, 2.0, x)))
    series, term = _c(em, 1.0, x), _c(em, 1.0, x)
    for k in range(1, 8):  # 1 - 1/(2x^2) + 3/(2x^2)^2 - 15/(2x^2)^3 ...
        term = em.mul(term, em.mul(inv2, _c(em, -(2 * k - 1), x)))
        series = em.add(series, term)
    asymptotic = em.div(series, em.mul(big, _c(em, math.sqrt(math.pi), x)))
    return em.select(em.compare(x, _c(em, 25.0, x), "LT"), direct, asymptotic)


def ndtri(em: Emitter, p: TensorValue) -> TensorValue:
    """The standard normal quantile: sqrt(2) erfinv(2p - 1) in float64."""
    return em.mul(em.unary(chlo.erf_inv, em.sub(em.mul(p, _c(em, 2.0, p)), _c(em, 1.0, p))), _c(em, math.sqrt(2.0), p))


def log_ndtr(em: Emitter, x: TensorValue) -> TensorValue:
    """log Phi(x): log(erfc(-x/sqrt 2)/2), through erfcx on the far left tail where erfc underflows."""
    t = em.mul(x, _c(em, -1.0 / math.sqrt(2.0), x))
    direct = em.unary(hlo.log, em.mul(erfc(em, t), _c(em, 0.5, x)))
    tail = em.sub(em.unary(hlo.log, em.mul(erfcx(em, t), _c(em, 0.5, x))), em.mul(t, t))
    return em.select(em.compare(x, _c(em, -5.0, x), "LT"), tail, direct)


# -- modified Bessel functions of order 0 and 1 -------------------------------------------------------


def _bessel_ie(em: Emitter, x: TensorValue, order: int) -> TensorValue:
    """exp(-|x|) I_order(x) in float64: the power series up to |x| = 20, the asymptotic series beyond."""
    ax = em.unary(hlo.abs, x)
    small = em.minimum(ax, _c(em, 20.0, x))
    q = em.mul(em.mul(small, small), _c(em, 0.25, x))
    term = em.mul(small, _c(em, 0.5, x)) if order == 1 else _c(em, 1.0, x)
    total = term
    for k in range(1, 70):  # sum (x/2)^(2k+order) / (k! (k+order)!)
        term = em.mul(term, em.div(q, _c(em, float(k * (k + order)), x)))
        total = em.add(total, term)
    series = em.mul(total, em.unary(hlo.exponential, em.unary(hlo.negate, small)))
    big = em.maximum(ax, _c(em, 20.0, x))
    inv = em.div(_c(em, 1.0, x), big)
    term, total = _c(em, 1.0, x), _c(em, 1.0, x)
    mu = 4.0 * order * order
    for k in range(1, 40):  # 1 - (mu-1)/(8x) + (mu-1)(mu-9)/(2!(8x)^2) - ...
        term = em.mul(term, em.mul(inv, _c(em, -(mu - (2 * k - 1) ** 2) / (8.0 * k), x)))
        total = em.add(total, term)
    asymptotic = em.div(total, em.unary(hlo.sqrt, em.mul(big, _c(em, 2.0 * math.pi, x))))
    r = em.select(em.compare(ax, _c(em, 20.0, x), "LE"), series, asymptotic)
    if order == 1:  # I1 is odd
        r = em.select(em.compare(x, _c(em, 0.0, x), "LT"), em.unary(hlo.negate, r), r)
    return em.select(_isnan(em, x), x, r)


def _scaled_back(em: Emitter, scaled: TensorValue, x: TensorValue) -> TensorValue:
    return em.mul(scaled, em.unary(hlo.exponential, em.unary(hlo.abs, x)))


def i0e(em: Emitter, x: TensorValue) -> TensorValue:
    return _bessel_ie(em, x, 0)


def i1e(em: Emitter, x: TensorValue) -> TensorValue:
    return _bessel_ie(em, x, 1)


def i0(em: Emitter, x: TensorValue) -> TensorValue:
    return _scaled_back(em, i0e(em, x), x)


def i1(em: Emitter, x: TensorValue) -> TensorValue:
    return _scaled_back(em, i1e(em, x), x)


def spherical_bessel_j0(em: Emitter, x: TensorValue) -> TensorValue:
    """sin(x)/x, with its Taylor series near 0 (where the quotient loses digits) and 1 at 0."""
    x2 = em.mul(x, x)
    taylor = em.add(_c(em, 1.0, x), em.mul(x2, em.add(_c(em, -1.0 / 6.0, x), em.mul(x2, _c(em, 1.0 / 120.0, x)))))
    safe = em.select(em.compare(x, _c(em, 0.0, x), "EQ"), _c(em, 1.0, x), x)
    quotient = em.div(em.unary(hlo.sine, safe), safe)
    r = em.select(em.compare(em.unary(hlo.abs, x), _c(em, 1e-3, x), "LT"), taylor, quotient)
    return em.select(em.compare(em.unary(hlo.abs, x), _c(em, float("inf"), x), "EQ"), _c(em, 0.0, x), r)


# -- binary functions -------------------------------------------------------------------------------


def hypot(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """sqrt(a^2 + b^2) without overflow: m sqrt(1 + (n/m)^2) with m = max(|a|, |b|); inf wins over NaN."""
    a, b = em.unary(hlo.abs, a), em.unary(hlo.abs, b)
    m, n = em.maximum(a, b), em.minimum(a, b)
    safe_m = em.select(em.compare(m, _c(em, 0.0, m), "EQ"), _c(em, 1.0, m), m)
    r = em.div(n, safe_m)
    h = em.mul(m, em.unary(hlo.sqrt, em.add(_c(em, 1.0, m), em.mul(r, r))))
    inf = _c(em, float("inf"), m)
    any_inf = em.binary(hlo.or_, em.compare(a, inf, "EQ"), em.compare(b, inf, "EQ"))
    return em.select(any_inf, inf, h)


@pointwise(aten.fmax.default, prims.fmax.default)
def fmax(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    """max ignoring NaN (NaN only when both are)."""
    if not a.dtype.is_floating_point:
        return em.maximum(a, b)
    r = em.maximum(a, b)
    return em.select(_isnan(em, a), b, em.select(_isnan(em, b), a, r))


@pointwise(aten.fmin.default, prims.fmin.default)
def fmin(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    if not a.dtype.is_floating_point:
        return em.minimum(a, b)
    r = em.minimum(a, b)
    return em.select(_isnan(em, a), b, em.select(_isnan(em, b), a, r))


@pointwise(aten.nextafter.default, prims.nextafter.default, promotion=Promotion.RESULT)
def nextafter(em: Emitter, a: TensorValue, b: TensorValue) -> TensorValue:
    return TensorValue(chlo.next_after(a.value, b.value), a.shape, a.dtype)


@lowers(aten.signbit.default, prims.signbit.default)
def _signbit(em: Emitter, out: torch.Tensor, x: TensorValue) -> TensorValue:
    """The sign bit itself: true for -0.0 and negative NaNs too (prims.signbit keeps the input's dtype)."""
    if not x.dtype.is_floating_point:
        if x.dtype == torch.bool or not x.dtype.is_signed:
            return em.constant(False, out.dtype, x.shape)
        return em.convert(em.compare(x, em.constant(0, x.dtype, x.shape), "LT"), out.dtype)
    bits = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[x.dtype]
    return em.convert(em.compare(em.bitcast(x, bits), em.constant(0, bits, x.shape), "LT"), out.dtype)


@lowers(aten.frexp.Tensor, prims.frexp.default)
def _frexp(em: Emitter, out: tuple, x: TensorValue) -> tuple[TensorValue, TensorValue]:
    """x = mantissa * 2**exponent with 0.5 <= |mantissa| < 1, computed on the bits alone: the CPU plugin
    flushes subnormal floats to zero in float arithmetic, so subnormals are normalized with integer ops."""
    mant_dtype, exp_dtype = out[0].dtype, out[1].dtype
    fdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    ibits, width, mbits, ebits = (torch.int64, 64, 52, 11) if fdt == torch.float64 else (torch.int32, 32, 23, 8)
    half = (1 << (ebits - 1)) - 2  # the exponent field of a number in [0.5, 1)
    shape = x.shape

    def const(value: int) -> TensorValue:
        return em.constant(value, ibits, shape)

    bits = em.bitcast(em.convert(x, fdt), ibits)
    sign = em.binary(hlo.and_, bits, const(-(1 << (width - 1))))
    field = em.binary(hlo.and_, em.binary(hlo.shift_right_logical, bits, const(mbits)), const((1 << ebits) - 1))
    fraction = em.binary(hlo.and_, bits, const((1 << mbits) - 1))
    # A subnormal's leading bit h (0-based) moves to the implicit position: shift by mbits - h.
    top = em.sub(const(width - 1), em.unary(hlo.count_leading_zeros, fraction))
    shift = em.sub(const(mbits), top)
    sub_fraction = em.binary(hlo.and_, em.binary(hlo.shift_left, fraction, shift), const((1 << mbits) - 1))
    subnormal = em.binary(hlo.and_, em.compare(field, const(0), "EQ"), em.compare(fraction, const(0), "NE"))
    fraction = em.select(subnormal, sub_fraction, fraction)
    exponent = em.select(subnormal, em.sub(top, const(half + mbits - 1)), em.sub(field, const(half)))
    mantissa = em.bitcast(em.binary(hlo.or_, em.binary(hlo.or_, sign, const(half << mbits)), fraction), fdt)
    zero = em.binary(hlo.and_, em.compare(field, const(0), "EQ"), em.compare(fraction, const(0), "EQ"))
    special = em.binary(hlo.or_, zero, em.compare(field, const((1 << ebits) - 1), "EQ"))  # 0, inf, NaN
    mantissa = em.select(special, em.convert(x, fdt), mantissa)
    exponent = em.select(special, const(0), exponent)
    return em.convert(mantissa, mant_dtype), em.convert(exponent, exp_dtype)


def _cot_pi_derivative(n: int) -> list[float]:
    """Coefficients, in powers of c = cot(pi x), of the n-th derivative of cot(pi x).

    d/dx cot(pi x) = -pi (1 + c^2), so each derivative maps P(c) to -pi (1 + c^2) P'(c).
    """
    poly = [0.0, 1.0]
    for _ in range(n):
        slope = [k * poly[k] for k in range(1, len(poly))]
        nxt = [0.0] * (len(slope) + 2)
        for k, a in enumerate(slope):
            nxt[k] -= math.pi * a
            nxt[k + 2] -= math.pi * a
        poly = nxt
    return poly


@pointwise(aten.digamma.default)
def digamma(em: Emitter, x: TensorValue) -> TensorValue:
    """CHLO's digamma, with torch's value at zero (copysign(inf, -x); CHLO gives NaN there)."""
    r = em.unary(chlo.digamma, x)
    negated_reciprocal = em.div(_c(em, -1.0, x), x)  # -inf at +0, +inf at -0
    return em.select(em.compare(x, _c(em, 0.0, x), "EQ"), negated_reciprocal, r)


def polygamma(em: Emitter, n: int, x: TensorValue) -> TensorValue:
    """The n-th derivative of digamma, n >= 1.

    CHLO's polygamma is (-1)^(n+1) n! zeta(n+1, x), whose zeta is wrong for x < 0; there the
    reflection psi_n(x) = (-1)^n psi_n(1 - x) - pi d^n/dx^n cot(pi x) gives torch's values.
    At the poles (x a non-positive integer) torch gives (-1)^(n+1) inf, except trigamma, whose
    reflection torch evaluates in floating point (inf here, a huge finite value there).
    """
    def chlo_polygamma(v: TensorValue) -> TensorValue:
        return TensorValue(chlo.polygamma(_c(em, float(n), v).value, v.value), v.shape, v.dtype)

    zero = _c(em, 0.0, x)
    negative = em.compare(x, zero, "LT")
    # Evaluate each branch where it is valid only, so neither produces spurious NaNs for the select.
    positive_x = em.select(negative, _c(em, 1.0, x), x)
    reflected_x = em.select(negative, x, _c(em, -0.5, x))
    direct = chlo_polygamma(positive_x)
    if n == 1:  # torch's trigamma is 0 at +inf; CHLO's gives NaN there
        direct = em.select(em.compare(x, _c(em, float("inf"), x), "EQ"), zero, direct)
    # cot(pi x) has period 1: reduce first so pi * x loses no precision.
    frac = em.sub(reflected_x, em.floor(em.add(reflected_x, _c(em, 0.5, x))))
    angle = em.mul(frac, _c(em, math.pi, x))
    cot = em.div(em.unary(hlo.cosine, angle), em.unary(hlo.sine, angle))
    coefficients = _cot_pi_derivative(n)
    derivative = _c(em, coefficients[-1], x)
    for a in reversed(coefficients[:-1]):
        derivative = em.add(em.mul(derivative, cot), _c(em, a, x))
    mirrored = chlo_polygamma(em.sub(_c(em, 1.0, x), reflected_x))
    if n % 2:
        mirrored = em.unary(hlo.negate, mirrored)
    reflected = em.sub(mirrored, em.mul(_c(em, math.pi, x), derivative))
    r = em.select(negative, reflected, direct)
    if n >= 2:
        pole = em.binary(hlo.and_, em.compare(x, zero, "LE"), em.compare(x, em.floor(x), "EQ"))
        r = em.select(pole, _c(em, float("inf") if n % 2 else float("-inf"), x), r)
    return r


@lowers(aten.polygamma.default, promotion=Promotion.FLOAT64)
def _polygamma(em: Emitter, out: torch.Tensor, n: int, x: TensorValue) -> TensorValue:
    return digamma(em, x) if n == 0 else polygamma(em, n, x)


def zeta(em: Emitter, x: TensorValue, q: TensorValue) -> TensorValue:
    return TensorValue(chlo.zeta(x.value, q.value), x.shape, x.dtype)


#: Special functions and the dtype each computes in: float64 for the series that lose digits in float32.
_SERIES: list[tuple[tuple[Any, ...], Callable[..., TensorValue], Promotion]] = [
    ((aten.erfc.default, prims.erfc.default), erfc, Promotion.COMPUTE),
    ((aten.special_erfcx.default, prims.erfcx.default), erfcx, Promotion.FLOAT64),
    ((aten.special_ndtri.default, prims.ndtri.default), ndtri, Promotion.FLOAT64),
    ((aten.special_log_ndtr.default,), log_ndtr, Promotion.FLOAT64),
    ((aten.i0.default, prims.bessel_i0.default, aten.special_modified_bessel_i0.default), i0, Promotion.FLOAT64),
    ((aten.special_i0e.default, prims.bessel_i0e.default), i0e, Promotion.FLOAT64),
    ((aten.special_i1.default, prims.bessel_i1.default, aten.special_modified_bessel_i1.default), i1,
     Promotion.FLOAT64),
    ((aten.special_i1e.default, prims.bessel_i1e.default), i1e, Promotion.FLOAT64),
    ((aten.special_spherical_bessel_j0.default, prims.spherical_bessel_j0.default), spherical_bessel_j0,
     Promotion.FLOAT64),
    ((aten.hypot.default, prims.hypot.default), hypot, Promotion.COMPUTE),
    ((aten.special_zeta.default, prims.zeta.default), zeta, Promotion.FLOAT64),
]
for _ops, _fn, _promotion in _SERIES:
    pointwise(*_ops, promotion=_promotion)(_fn)


@pointwise(prims.cbrt.default)
def cbrt(em: Emitter, x: TensorValue) -> TensorValue:
    return em.unary(hlo.cbrt, x)


# -- prims that are ATen ops under another name ------------------------------------------------------

#: prim -> the ATen overload with the same arguments and meaning.
_PRIM_ALIASES = {
    "abs": aten.abs.default, "acos": aten.acos.default, "acosh": aten.acosh.default, "asin": aten.asin.default,
    "asinh": aten.asinh.default, "atan": aten.atan.default, "atanh": aten.atanh.default, "ceil": aten.ceil.default,
    "cos": aten.cos.default, "cosh": aten.cosh.default, "digamma": aten.digamma.default, "erf": aten.erf.default,
    "erf_inv": aten.erfinv.default, "exp": aten.exp.default, "exp2": aten.exp2.default, "expm1": aten.expm1.default,
    "floor": aten.floor.default, "isfinite": aten.isfinite.default, "lgamma": aten.lgamma.default,
    "log": aten.log.default, "log10": aten.log10.default, "log1p": aten.log1p.default, "log2": aten.log2.default,
    "neg": aten.neg.default, "reciprocal": aten.reciprocal.default, "round": aten.round.default,
    "rsqrt": aten.rsqrt.default, "sign": aten.sign.default, "sin": aten.sin.default, "sinh": aten.sinh.default,
    "sqrt": aten.sqrt.default, "tan": aten.tan.default, "tanh": aten.tanh.default, "trunc": aten.trunc.default,
    "bitwise_not": aten.bitwise_not.default,
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "atan2": aten.atan2.default,
    "bitwise_and": aten.bitwise_and.Tensor, "bitwise_or": aten.bitwise_or.Tensor,
    "bitwise_xor": aten.bitwise_xor.Tensor, "eq": aten.eq.Tensor, "ne": aten.ne.Tensor, "lt": aten.lt.Tensor,
    "le": aten.le.Tensor, "gt": aten.gt.Tensor, "ge": aten.ge.Tensor, "fmod": aten.fmod.Tensor,
    "maximum": aten.maximum.default, "minimum": aten.minimum.default, "pow": aten.pow.Tensor_Tensor,
    "remainder": aten.remainder.Tensor, "where": aten.where.self, "clone": aten.clone.default,
    "cat": aten.cat.default, "fill": aten.fill.Scalar, "scalar_tensor": aten.scalar_tensor.default,
    "reshape": aten.view.default, "view_of": aten.alias.default, "collapse": aten.view.default,
    "collapse_view": aten.view.default, "split_dim": aten.view.default, "squeeze": aten.view.default,
    "transpose": aten.permute.default, "rev": aten.flip.default, "copy_strided": aten.clone.default,
}
for _prim, _aten_op in _PRIM_ALIASES.items():
    lowers(getattr(prims, _prim).default)(LOWERINGS[_aten_op])


@lowers(prims.div.default)
def _prim_div(em: Emitter, out: torch.Tensor, a: Operand, b: Operand) -> TensorValue:
    """prims.div: true division for floats, truncation toward zero for integers."""
    mode = None if out.dtype.is_floating_point or out.dtype.is_complex else "trunc"
    return LOWERINGS[aten.div.Tensor_mode](em, out, a, b, rounding_mode=mode)


@lowers(prims.convert_element_type.default)
def _prim_convert(em: Emitter, out: torch.Tensor, x: TensorValue, dtype: torch.dtype) -> TensorValue:
    return em.convert(x, out.dtype)


@lowers(prims.broadcast_in_dim.default)
def _prim_broadcast_in_dim(em: Emitter, out: torch.Tensor, x: TensorValue, shape: Any, dims: Any) -> TensorValue:
    return em.broadcast_in_dim(x, tuple(out.shape), [int(d) for d in dims])


def _prim_reduction(aten_op: Any) -> Any:
    def lower(em: Emitter, out: torch.Tensor, x: TensorValue, dims: Any, *args: Any,
              output_dtype: torch.dtype | None = None) -> TensorValue:
        dims = list(range(x.rank)) if dims is None else list(dims)
        if not dims:
            return em.convert(x, out.dtype)
        return LOWERINGS[aten_op](em, out, x, dims, *args)

    return lower


lowers(prims.sum.default)(_prim_reduction(aten.sum.dim_IntList))
lowers(prims.prod.default)(_prim_reduction(aten.prod.dim_int))
lowers(prims.amax.default)(_prim_reduction(aten.amax.default))
lowers(prims.amin.default)(_prim_reduction(aten.amin.default))


@lowers(prims.var.default)
def _prim_var(em: Emitter, out: torch.Tensor, x: TensorValue, dims: Any, correction: float = 1.0, *,
              output_dtype: torch.dtype | None = None) -> TensorValue:
    dims = list(range(x.rank)) if dims is None else list(dims)
    return LOWERINGS[aten.var.correction](em, out, x, dims, correction=correction)


@lowers(prims.iota.default)
def _prim_iota(em: Emitter, out: torch.Tensor, length: int, *, start: int, step: int, **kwargs: Any) -> TensorValue:
    return em.convert(em.add(em.mul(em.iota((int(length),), 0, torch.int64), em.constant(int(step), torch.int64, (int(length),))),
                             em.constant(int(start), torch.int64, (int(length),))), out.dtype)


@lowers(prims.full.default)
def _prim_full(em: Emitter, out: torch.Tensor, shape: Any, fill_value: Operand, **kwargs: Any) -> TensorValue:
    return em.as_tensor(fill_value, out.dtype, tuple(out.shape))


@lowers(prims.full_like.default)
def _prim_full_like(em: Emitter, out: torch.Tensor, x: TensorValue, fill_value: Operand, **kwargs: Any) -> TensorValue:
    return em.as_tensor(fill_value, out.dtype, tuple(out.shape))


@lowers(prims.empty_strided.default, prims.empty.default, prims.empty_permuted.default)
def _prim_empty(em: Emitter, out: torch.Tensor, *args: Any, **kwargs: Any) -> TensorValue:
    return em.constant(0, out.dtype, tuple(out.shape))


__all__ = ["erfc", "erfcx", "fmax", "fmin", "hypot", "i0", "i0e", "i1", "i1e", "log_ndtr", "ndtri"]
