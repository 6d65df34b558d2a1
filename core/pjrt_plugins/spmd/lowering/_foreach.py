"""Foreach operators (``_foreach_add``, ``_foreach_lerp``, ...): one op for a whole list of tensors.

torch's optimizers update every parameter with a handful of them. The tracer records a
functional foreach overload as a single op; :func:`split_foreach` turns it into one call of
the per-tensor overload per list element when the graph is expanded for lowering. The
per-tensor overload is found from the schemas: the same name without ``_foreach_``, whose
arguments take, position by position, one element of each list argument (``Tensor[]`` ->
``Tensor``, ``Scalar[]`` -> ``Scalar``) and every other argument as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

PREFIX = "_foreach_"


@dataclass(frozen=True)
class ForeachPlan:
    """How one functional foreach overload calls its per-tensor overload.

    ``positional[k]`` is, for the foreach op's k-th positional argument, the element
    argument's name, whether the element takes it by keyword only, and whether the foreach
    argument is a list (one element per tensor).
    """

    element: Any
    positional: tuple[tuple[str, bool, bool], ...]


#: Foreach argument types that hold one element per tensor (``Tensor[]``, ``Scalar[]``), as the schema prints them.
_PER_TENSOR_LISTS = {"List[Tensor]": "Tensor", "List[number]": "number"}


def _element_type(foreach_type: str) -> tuple[str, bool]:
    """The per-tensor type of a foreach argument type, and whether it is a list."""
    element = _PER_TENSOR_LISTS.get(foreach_type)
    return (element, True) if element is not None else (foreach_type, False)


def _plan_for(op: Any, element: Any) -> ForeachPlan | None:
    fargs = op._schema.arguments
    eargs = element._schema.arguments
    if len(element._schema.returns) != 1 or str(element._schema.returns[0].type) != "Tensor":
        return None
    positional = [a for a in fargs if not a.kwarg_only]
    if len(positional) > len(eargs):
        return None
    plan = []
    for fa, ea in zip(positional, eargs):
        etype, is_list = _element_type(str(fa.type))
        if etype != str(ea.type):
            return None
        plan.append((ea.name, ea.kwarg_only, is_list))
    covered = {name for name, _, _ in plan}
    by_name = {a.name: a for a in eargs}
    for fa in fargs:
        if fa.kwarg_only:
            ea = by_name.get(fa.name)
            if ea is None or str(ea.type) != str(fa.type):
                return None
            covered.add(fa.name)
    if any(a.name not in covered and not a.has_default_value() for a in eargs):
        return None
    return ForeachPlan(element, tuple(plan))


@functools.cache
def foreach_plan(op: Any) -> ForeachPlan | None:
    """The plan of a functional ``aten._foreach_*`` overload, or None (not foreach, or no per-tensor twin)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name = op._opname
    if not name.startswith(PREFIX) or name.endswith("_") or op._overloadname == "out":
        return None
    packet = getattr(torch.ops.aten, name[len(PREFIX):], None)
    if packet is None:
        return None
    for overload in packet.overloads():
        if overload == "out" or overload.endswith("_out"):
            continue
        plan = _plan_for(op, getattr(packet, overload))
        if plan is not None:
            return plan
    return None


def is_foreach(op: Any) -> bool:
    """True for every ``aten._foreach_*`` overload (functional, in place or out=)."""
    return isinstance(op, torch._ops.OpOverload) and op._opname.startswith(PREFIX)


def split_foreach(plan: ForeachPlan, args: tuple, kwargs: dict[str, Any]) -> list[tuple[tuple, dict[str, Any]]]:
    """``(args, kwargs)`` of the per-tensor call for each list element."""
    lengths = {len(a) for a, (_, _, is_list) in zip(args, plan.positional) if is_list}
    if len(lengths) != 1:
        raise ValueError(f"foreach lists of different lengths: {sorted(lengths)}")
    calls = []
    for i in range(lengths.pop()):
        call_args: list[Any] = []
        call_kwargs = dict(kwargs)
        for value, (name, kwarg_only, is_list) in zip(args, plan.positional):
            item = value[i] if is_list else value
            if kwarg_only:
                call_kwargs[name] = item
            else:
                call_args.append(item)
        calls.append((tuple(call_args), call_kwargs))
    return calls
