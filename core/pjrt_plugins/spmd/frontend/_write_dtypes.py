"""torch's dtype rule for ops that write into existing tensors (``x.div_(2)``, ``torch.add(a, b, out=o)``).

Why: the engine records an in-place op as its functional twin and casts the result into the target, which
would accept what torch refuses (``int_tensor /= 2``, ``bool_tensor += 1``, ``long_tensor *= float_tensor``)
and hand back wrong values. torch refuses to write a result into a tensor whose dtype the result's type cannot
be cast to (``torch.can_cast``): "result type Float can't be cast to the desired output type Long". The check
runs before any target changes, so a refused op leaves every tensor as it was.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

__all__ = ["check_inplace", "check_out"]

logger = logging.getLogger(__name__)

_META = torch.device("meta")


def check_inplace(func: Any, result_dtypes: Sequence[torch.dtype], target_dtypes: Sequence[torch.dtype]) -> None:
    """Raise torch's RuntimeError when an in-place op (``x.div_(2)``, ``torch._foreach_add_(xs, 1.5)``) would
    write a result into a target its dtype cannot be cast to."""
    for result, target in zip(result_dtypes, target_dtypes):
        if result is not target and not torch.can_cast(result, target):
            raise RuntimeError(_refusal(func, result, target))


#: (out= op, its arguments' dtypes) -> torch's message when it refuses the write, else None.
_out_verdicts: dict[tuple, str | None] = {}


def check_out(func: Any, args: tuple, kwargs: dict, result_dtypes: Sequence[torch.dtype],
              target_dtypes: Sequence[torch.dtype]) -> None:
    """Raise torch's error when an ``out=`` op would write a result into an out tensor its dtype cannot be cast
    to. Some ops compute in the out tensor's dtype instead (``torch.sum(x, out=long_tensor)``): where casting
    is refused, torch's own meta kernel of the op decides, once per op and dtypes."""
    refused = [(r, t) for r, t in zip(result_dtypes, target_dtypes) if r is not t and not torch.can_cast(r, t)]
    if not refused:
        return
    key = (func, _signature((args, kwargs)))
    if key not in _out_verdicts:
        _out_verdicts[key] = _meta_verdict(func, args, kwargs, _refusal(func, *refused[0]))
    message = _out_verdicts[key]
    if message is not None:
        raise RuntimeError(message)


def _meta_verdict(func: Any, args: tuple, kwargs: dict, refusal: str) -> str | None:
    """torch's message when its meta kernel of ``func`` refuses these dtypes; ``refusal`` when it has none."""
    meta_args, meta_kwargs = tree_map_only(torch.Tensor, _meta, (args, kwargs))
    try:
        func(*meta_args, **meta_kwargs)
    except NotImplementedError:  # no meta kernel: the casting rule alone
        return refusal
    except RuntimeError as exc:
        if _ABOUT_DTYPES.search(str(exc)):
            return f"{func}: {exc}"
        logger.debug("%s on meta tensors: %s (left to the op)", func, exc)
    return None


_ABOUT_DTYPES = re.compile(r"dtype|scalar type|result type|can't be cast")


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=_META)


def _signature(value: Any) -> Any:
    """What the dtype rules look at: each tensor's dtype and whether it is 0-d; each number's type."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim() == 0)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in value.items())
    if isinstance(value, (str, torch.dtype, type(None))):
        return value
    return type(value)


def _refusal(func: Any, result: torch.dtype, target: torch.dtype) -> str:
    return (f"{func}: result type {_name(result)} can't be cast to the desired output type {_name(target)} "
            "(torch refuses this write too: compute into a new tensor, x = x / 2, or give the target the "
            "result's dtype)")


def _name(dtype: torch.dtype) -> str:
    """torch's C++ name of ``dtype`` (Float, Long, ComplexFloat), as its messages give it."""
    return _NAMES.get(dtype, str(dtype).removeprefix("torch."))


_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
          torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
          torch.float64: "Double", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}
