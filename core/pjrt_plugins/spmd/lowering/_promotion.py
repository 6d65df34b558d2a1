"""Type promotion and broadcasting, done once for every rule that asks (inductor's ``transform_args``).

torch has already decided each node's result dtype; a rule registered with a :class:`Promotion`
gets its operands converted to the dtype that promotion names (and, for pointwise ops, broadcast to
the result's shape), and its results rounded once to the node's dtypes. It builds nothing else.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._emitter import Emitter, Operand, TensorValue

LoweringFn = Callable[..., Any]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype arithmetic runs in: float32 for the half types, else ``dtype`` (torch's CPU kernels)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


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


class Promotion(enum.Enum):
    """The dtype a rule's operands are converted to, given the node's result dtype."""

    #: Arithmetic: the result's dtype, float16 and bfloat16 computed in float32 and rounded once at the end.
    COMPUTE = "compute"
    #: As COMPUTE, with bool counted in int64: sums (a sum of bools is a count, and the sum's bool result "any").
    BOOL_TO_LONG = "bool_to_long"
    #: Exactly the result's dtype: bit operations and other ops with no arithmetic to widen.
    RESULT = "result"
    #: torch's result type of the operands: comparisons, whose result (bool) says nothing about them.
    OPERANDS = "operands"
    #: bool: the logical ops.
    BOOL = "bool"
    #: float64: series that lose digits in float32 (special functions), rounded once to the result's dtype.
    FLOAT64 = "float64"

    def dtype(self, result: torch.dtype, operands: Sequence[Operand]) -> torch.dtype:
        """The dtype ``operands`` are converted to for a node whose result has dtype ``result``."""
        if self is Promotion.COMPUTE:
            return compute_dtype(result)
        if self is Promotion.BOOL_TO_LONG:
            return torch.int64 if result == torch.bool else compute_dtype(result)
        if self is Promotion.RESULT:
            return result
        if self is Promotion.OPERANDS:
            return promoted_dtype(*operands)
        if self is Promotion.BOOL:
            return torch.bool
        return torch.float64


def is_number(x: Any) -> bool:
    """A Python number operand (a run-time :class:`ScalarSlot` is one too)."""
    return isinstance(x, (bool, int, float))


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    for o in out:
        if isinstance(o, torch.Tensor):
            return o
    raise TypeError(f"a promoting rule needs a tensor result, got {out!r}")


def round_results(em: Emitter, out: Any, result: Any) -> Any:
    """``result`` (a value, or a tuple or list of them) converted to the dtypes of the node's ``out``."""
    if isinstance(result, TensorValue):
        return em.convert(result, _first_tensor(out).dtype)
    rounded = [em.convert(r, o.dtype) if isinstance(r, TensorValue) and isinstance(o, torch.Tensor) else r
               for r, o in zip(result, out)]
    return type(result)(rounded)


def promoting(rule: LoweringFn, promotion: Promotion, *, broadcast: bool = False) -> LoweringFn:
    """``rule`` with its operands promoted before it runs and its results rounded to the node's dtypes after.

    The operands are the positional tensor arguments; with ``broadcast`` (a pointwise op, whose positional
    arguments are all operands) the Python numbers too, and all of them are broadcast to the result's shape.
    ``None`` (an optional operand left out) and keyword arguments (attributes: ``alpha``, ``rounding_mode``)
    pass through unchanged.
    """

    @functools.wraps(rule)
    def lower(em: Emitter, out: Any, *args: Any, **kwargs: Any) -> Any:
        result = _first_tensor(out)

        def is_operand(x: Any) -> bool:
            return isinstance(x, TensorValue) or (broadcast and is_number(x))

        dtype = promotion.dtype(result.dtype, [a for a in args if is_operand(a)])
        shape = tuple(result.shape) if broadcast else None
        promoted = [em.as_tensor(a, dtype, shape) if is_operand(a) else a for a in args]
        return round_results(em, out, rule(em, out, *promoted, **kwargs))

    return lower


def make_pointwise(fn: Callable[..., TensorValue]) -> LoweringFn:
    """The rule computing ``fn(em, *operands, **attributes)`` (inductor's ``make_pointwise``).

    Register it with a promotion and ``broadcast=True``, so ``fn`` gets operands of one dtype and shape.
    """

    def lower(em: Emitter, out: Any, *operands: Any, **attributes: Any) -> TensorValue:
        return fn(em, *operands, **attributes)

    lower.__name__ = getattr(fn, "__name__", "pointwise")
    lower.__qualname__ = f"make_pointwise({getattr(fn, '__qualname__', lower.__name__)})"
    lower.__module__ = getattr(fn, "__module__", __name__)
    return lower


__all__ = ["Promotion", "compute_dtype", "is_number", "make_pointwise", "promoted_dtype", "promoting",
           "round_results"]
