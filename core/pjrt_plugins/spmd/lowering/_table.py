"""The op table: which ATen operator is lowered by which function.

A lowering is ``fn(em, out, *args, **kwargs)``: ``em`` the :class:`Emitter`, ``out`` the
node's output metadata (a meta tensor, or a tuple of them), tensor arguments as
:class:`TensorValue`; it returns a TensorValue or a tuple of them. An operator has one
lowering: registering a second raises at import instead of replacing the first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from ...errors import PjrtPluginsError, UnsupportedOpError
from ._promotion import LoweringFn, Promotion, make_pointwise, promoting

#: An em-level pointwise function: ``fn(em, *operands, **attributes) -> TensorValue``.
PointwiseFn = Callable[..., Any]

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

#: Where each entry of a table was registered, for the error about a second one: (id of the table, op) -> file:line.
_SITES: dict[tuple[int, Any], str] = {}


class DuplicateRegistrationError(PjrtPluginsError, RuntimeError):
    """A second rule was registered for an operator that already has one in the same table.

    Raised at import, as torch's ``register_decomposition`` does: a table of hundreds of rules stays
    trustworthy only if a second rule for an op is an error, not a silent overwrite.
    """


def _describe(fn: Any, site: str) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{getattr(fn, '__module__', '?')}.{name} (registered at {site})"


def caller_site(depth: int) -> str:
    """``file:line`` of the frame ``depth`` levels above the caller (where a decorator was written)."""
    frame = sys._getframe(depth + 1)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def register_unique(table: dict[Any, Any], ops: tuple[Any, ...], fn: Any, site: str, *, what: str = "lowering") -> None:
    """``table[op] = fn`` for each of ``ops``, refusing them all if the table already holds one of them.

    ``site`` says where the registration was written; the error shows it next to the earlier one's.
    """
    for i, op in enumerate(ops):
        if op in table:
            earlier = _describe(table[op], _SITES.get((id(table), op), "?"))
            raise DuplicateRegistrationError(
                f"{op_name(op)} has two {what}s: {earlier} and {_describe(fn, site)}; an operator has one "
                f"{what}, so remove one of them")
        if op in ops[:i]:
            raise DuplicateRegistrationError(f"{op_name(op)} is listed twice in the registration of "
                                             f"{_describe(fn, site)}; list it once")
    for op in ops:
        table[op] = fn
        _SITES[(id(table), op)] = site


def lowers(*ops: Any, random: bool = False, promotion: Promotion | None = None,
           broadcast: bool = False) -> Callable[[LoweringFn], LoweringFn]:
    """Register the decorated function as the lowering of ``ops`` (OpOverloads); returns the registered rule.

    With a ``promotion`` the rule gets its tensor operands in the dtype it names and its results are rounded
    to the node's dtypes; with ``broadcast`` as well (pointwise ops), Python number operands become tensors
    and every operand is broadcast to the result's shape (see :func:`promoting`). An op that already has a
    lowering raises :class:`DuplicateRegistrationError`.
    """
    for op in ops:
        if not isinstance(op, torch._ops.OpOverload):
            raise TypeError(f"register overloads, not {op!r}")
    if broadcast and promotion is None:
        raise TypeError("broadcast=True needs a promotion (the dtype the operands are converted to)")
    site = caller_site(1)

    def register(fn: LoweringFn) -> LoweringFn:
        rule = fn if promotion is None else promoting(fn, promotion, broadcast=broadcast)
        register_unique(LOWERINGS, ops, rule, site)
        if random:
            RANDOM_OPS.update(ops)
        return rule

    return register


def pointwise(*ops: Any, promotion: Promotion = Promotion.COMPUTE) -> Callable[[PointwiseFn], PointwiseFn]:
    """Register ``fn(em, *operands, **attributes)`` as the lowering of the pointwise ``ops``
    (inductor's ``register_pointwise``); returns ``fn`` itself, still usable as a building block.

    ``fn`` gets every operand in the ``promotion``'s dtype, broadcast to the result's shape, and its
    result is rounded once to the node's dtype.
    """
    for op in ops:
        if not isinstance(op, torch._ops.OpOverload):
            raise TypeError(f"register overloads, not {op!r}")
    site = caller_site(1)

    def register(fn: PointwiseFn) -> PointwiseFn:
        register_unique(LOWERINGS, ops, promoting(make_pointwise(fn), promotion, broadcast=True), site)
        return fn

    return register


def meta_rule(*ops: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Register the decorated function as the meta kernel (output shapes and dtypes) of ``ops``.

    An op that already has a meta rule raises :class:`DuplicateRegistrationError`.
    """
    site = caller_site(1)

    def register(fn: LoweringFn) -> LoweringFn:
        register_unique(META_RULES, ops, fn, site, what="meta rule")
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
