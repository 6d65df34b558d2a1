"""The op table: which ATen operator is lowered by which function.

A lowering is ``fn(em, out, *args, **kwargs)``: ``em`` the :class:`Emitter`, ``out`` the
node's output metadata (a meta tensor, or a tuple of them), tensor arguments as
:class:`TensorValue`; it returns a TensorValue or a tuple of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...errors import UnsupportedOpError

LoweringFn = Callable[..., Any]

LOWERINGS: dict[Any, LoweringFn] = {}
#: Operators lowered as random number draws (each starts from its own row of the module's RNG keys).
RANDOM_OPS: set[Any] = set()
#: Operators whose lowering computes complex numbers (the others take the CPU fallback on complex tensors).
COMPLEX_LOWERINGS: set[Any] = set()
#: Output shapes of lowered operators torch has no meta kernel for: op -> fn(*meta args, **kwargs).
META_RULES: dict[Any, LoweringFn] = {}
#: Operators with no result whose lowering's value replaces their first argument for the nodes after them
#: (a sharding annotation made in place: ``pjrt::sharding_hint``).
REBINDING_OPS: set[Any] = set()


def lowers(*ops: Any, random: bool = False) -> Callable[[LoweringFn], LoweringFn]:
    """Register the decorated function as the lowering of ``ops`` (OpOverloads)."""

    def register(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            if not isinstance(op, torch._ops.OpOverload):
                raise TypeError(f"register overloads, not {op!r}")
            LOWERINGS[op] = fn
            if random:
                RANDOM_OPS.add(op)
        return fn

    return register


def meta_rule(*ops: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Register the decorated function as the meta kernel (output shapes and dtypes) of ``ops``."""

    def register(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            META_RULES[op] = fn
        return fn

    return register


def is_random(op: Any) -> bool:
    """Whether ``op`` draws random numbers: lowered as random, or tagged so by torch (``nondeterministic_seeded``).

    Each call of such an op takes its own key of the device RNG stream when it is recorded.
    """
    return op in RANDOM_OPS or (isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags)


def op_name(target: Any) -> str:
    """``aten.add.Tensor`` style name of an operator (or the repr of anything else)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", repr(target))


def refuse_generator(target: Any, kwargs: dict[str, Any]) -> None:
    """Raise :class:`UnsupportedOpError` for a call with an explicit ``generator=`` (checked when
    recording and when lowering): device random numbers come from a key seeded by ``torch.manual_seed``."""
    if kwargs.get("generator") is not None:
        name = op_name(target)
        raise UnsupportedOpError(name, f"{name} with an explicit torch.Generator is not supported on the pjrt "
                                 "device; seed with torch.manual_seed() instead (the device key is drawn from "
                                 "torch's default generator)")
